/* Test-only stand-in for libcupti's two external-correlation functions: a per-thread stack and
 * a log of every push/pop (kind, id), so tests can check what the stage core pushed. */
#include <stdint.h>
#include <pthread.h>

#define MAXLOG 65536
static int64_t log_id[MAXLOG];
static int log_op[MAXLOG]; /* +kind push, -kind pop */
static int nlog = 0;
static __thread uint64_t stack_[256];
static __thread int kinds_[256];
static __thread int depth_ = 0;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

int cuptiActivityPushExternalCorrelationId(int kind, uint64_t id) {
  if (depth_ >= 256) return 1;
  kinds_[depth_] = kind;
  stack_[depth_++] = id;
  pthread_mutex_lock(&mu);
  if (nlog < MAXLOG) { log_op[nlog] = kind; log_id[nlog++] = (int64_t)id; }
  pthread_mutex_unlock(&mu);
  return 0;
}

int cuptiActivityPopExternalCorrelationId(int kind, uint64_t* last) {
  if (depth_ == 0) return 29; /* CUPTI_ERROR_QUEUE_EMPTY-like */
  uint64_t id = stack_[--depth_];
  if (last) *last = id;
  pthread_mutex_lock(&mu);
  if (nlog < MAXLOG) { log_op[nlog] = -kind; log_id[nlog++] = (int64_t)id; }
  pthread_mutex_unlock(&mu);
  return 0;
}

int fake_cupti_log(int i, int64_t* id) { if (i >= nlog) return 0; *id = log_id[i]; return log_op[i]; }
int fake_cupti_count(void) { return nlog; }
int fake_cupti_depth(void) { return depth_; }
/* The innermost pushed (kind, id) of the calling thread: what CUPTI would put in the external-
 * correlation record of an API call made now. Returns the kind, 0 when nothing is pushed. */
int fake_cupti_top(uint64_t* id) { if (depth_ == 0) return 0; *id = stack_[depth_ - 1]; return kinds_[depth_ - 1]; }
