/* Test-only stand-in for librocprofiler-sdk-roctx: logs each call to $MAXINSTR_TEST_ROCTX_LOG as
 *   push <tid> <message> | pop <tid> | mark <tid> <message> | pause <tid-arg> | resume <tid-arg> */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static FILE* out;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int depth;

static FILE* f(void) {
  if (!out) {
    const char* p = getenv("MAXINSTR_TEST_ROCTX_LOG");
    out = p ? fopen(p, "a") : stderr;
  }
  return out;
}
static long tid(void) { return (long)syscall(SYS_gettid); }

int roctxRangePushA(const char* m) {
  pthread_mutex_lock(&mu);
  fprintf(f(), "push %ld %s\n", tid(), m);
  fflush(out);
  pthread_mutex_unlock(&mu);
  return depth++;
}
int roctxRangePop(void) {
  pthread_mutex_lock(&mu);
  fprintf(f(), "pop %ld\n", tid());
  fflush(out);
  pthread_mutex_unlock(&mu);
  return --depth;
}
void roctxMarkA(const char* m) {
  pthread_mutex_lock(&mu);
  fprintf(f(), "mark %ld %s\n", tid(), m);
  fflush(out);
  pthread_mutex_unlock(&mu);
}
int roctxProfilerPause(uint64_t t) {
  fprintf(f(), "pause %llu\n", (unsigned long long)t);
  fflush(out);
  return 0;
}
int roctxProfilerResume(uint64_t t) {
  fprintf(f(), "resume %llu\n", (unsigned long long)t);
  fflush(out);
  return 0;
}
