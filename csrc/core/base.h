// What every unit of the stage core uses: Python.h, branch hints, the namespace, the host clock,
// env().
//
// Every unit declares its names inside `namespace maxinstr MAXINSTR_HIDDEN`: hidden visibility on
// the declarations themselves (not only on definitions, which -fvisibility=hidden covers) lets the
// compiler reach another unit's globals and functions directly, PC-relative, as it did when the
// whole core was one file with an anonymous namespace: no GOT load, no PLT call. The module's one
// export is PyInit__native (tests/core/test_build.py).
#pragma once

// Python.h first, as its documentation asks (it sets feature macros the C library reads).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <time.h>

#include <cstdint>
#include <cstdlib>

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

// The host clock of every record and sample: CLOCK_MONOTONIC in ns.
inline int64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// An environment variable, or nullptr when unset or empty.
inline const char* env(const char* k) {
  const char* v = getenv(k);
  return (v && *v) ? v : nullptr;
}

}  // namespace maxinstr
