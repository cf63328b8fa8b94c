// What every unit of the stage core uses. `namespace maxinstr MAXINSTR_HIDDEN`: hidden visibility
// on the declarations themselves (-fvisibility=hidden covers only definitions) lets a unit reach
// another's globals and functions PC-relative: no GOT load, no PLT call. The module's one export
// is PyInit__native (tests/core/test_build.py).
#pragma once

// Python.h first: it sets feature macros the C library reads.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <strings.h>
#include <time.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__GNUC__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MAXINSTR_HIDDEN __attribute__((visibility("hidden")))
#else
#define LIKELY(x) (x)
#define UNLIKELY(x) (x)
#define MAXINSTR_HIDDEN
#endif

namespace maxinstr MAXINSTR_HIDDEN {

inline int64_t now_ns() {  // the host clock of every record and sample
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Every read of the environment in the core, with src/maxinstr/config.py's rules (unset or blank:
// the default; a bad value: one line on stderr and the default); tests/test_config.py holds them equal.

inline bool env_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// A variable's value, or nullptr when unset, empty or only blanks.
inline const char* env(const char* k) {
  const char* v = getenv(k);
  if (!v) return nullptr;
  for (const char* p = v; *p; ++p)
    if (!env_blank(*p)) return v;
  return nullptr;
}

// The truth rule on one value: 1 (a true word), 0 (a false word), -1 (anything else).
inline int parse_flag(const char* v) {
  while (env_blank(*v)) ++v;
  size_t n = strlen(v);
  while (n && env_blank(v[n - 1])) --n;
  static const char* const words[] = {"0", "false", "no", "off", "1", "true", "yes", "on"};
  for (int i = 0; i < 8; i++)
    if (strlen(words[i]) == n && strncasecmp(v, words[i], n) == 0) return i >= 4;
  return -1;
}

inline void env_warn(const char* k, const char* v, const char* expected, const char* dflt) {
  fprintf(stderr, "maxinstr: %s='%s' is not %s; the default (%s) is used\n", k, v, expected, dflt);
}

inline bool env_flag(const char* k, bool dflt) {
  const char* v = env(k);
  if (!v) return dflt;
  int f = parse_flag(v);
  if (f < 0) {
    env_warn(k, v, "one of 1/true/yes/on or 0/false/no/off", dflt ? "on" : "off");
    return dflt;
  }
  return f == 1;
}

// A whole number (the whole value, blanks around it aside) >= lo, else dflt (said when set).
inline long long env_int(const char* k, long long dflt, long long lo) {
  const char* v = env(k);
  if (!v) return dflt;
  char* end = nullptr;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  while (end && env_blank(*end)) ++end;
  if (end == v || *end || errno || n < lo) {
    char d[32], what[48];
    snprintf(d, sizeof d, "%lld", dflt);
    snprintf(what, sizeof what, "a whole number >= %lld", lo);
    env_warn(k, v, what, d);
    return dflt;
  }
  return n;
}

// A finite number >= 0, else dflt (said when set).
inline double env_double(const char* k, double dflt) {
  const char* v = env(k);
  if (!v) return dflt;
  char* end = nullptr;
  double x = strtod(v, &end);
  while (end && env_blank(*end)) ++end;
  if (end == v || *end || !(x >= 0) || x > 1e300) {
    char d[32];
    snprintf(d, sizeof d, "%g", dflt);
    env_warn(k, v, "a number >= 0", d);
    return dflt;
  }
  return x;
}

}  // namespace maxinstr
