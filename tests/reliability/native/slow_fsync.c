/* LD_PRELOAD shim for tests/reliability/test_kill_bound.py: fsync and fdatasync take
 * SLOW_FSYNC_MS milliseconds longer (a slow or busy disk), and the file SLOW_FSYNC_FLAG exists
 * while one is in progress, so the test can kill the process in the middle of an fsync. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void slow_down(void) {
  const char* ms = getenv("SLOW_FSYNC_MS");
  const char* flag = getenv("SLOW_FSYNC_FLAG");
  long v = ms ? atol(ms) : 1000;
  if (flag) {
    int fd = open(flag, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
  }
  struct timespec ts = {v / 1000, (v % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
  if (flag) unlink(flag);
}

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  slow_down();
  return real(fd);
}

int fdatasync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  slow_down();
  return real(fd);
}
