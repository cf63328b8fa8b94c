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

#ifndef FAKE_NO_BUFFERS
/* Activity buffers, as libcupti hands them to callbacks registered with
 * cuptiActivityRegisterCallbacks (tests/kernels/: the native buffer path). The stand-in
 * cupti-python queues each record's bytes here (fake_cupti_queue); cuptiActivityFlushAll asks
 * the registered callback for a buffer, fills it and completes it; cuptiActivityGetNextRecord
 * walks it by the record sizes the stand-in declared (fake_cupti_set_size). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef void (*req_fn)(uint8_t**, size_t*, size_t*);
typedef void (*done_fn)(void*, uint32_t, uint8_t*, size_t, size_t);
static req_fn req_cb = 0;
static done_fn done_cb = 0;
static size_t rec_size[64];
static uint8_t* pend = 0;
static size_t pend_len = 0, pend_cap = 0;
static int buffers_done = 0;
static pthread_mutex_t amu = PTHREAD_MUTEX_INITIALIZER;

int cuptiActivityRegisterCallbacks(req_fn r, done_fn d) { req_cb = r; done_cb = d; return 0; }
int fake_cupti_native_registered(void) { return req_cb != 0; }
void fake_cupti_set_size(int kind, size_t size) { if (kind >= 0 && kind < 64) rec_size[kind] = size; }
int fake_cupti_buffers(void) { return buffers_done; }

void fake_cupti_queue(const uint8_t* rec, size_t n) {
  pthread_mutex_lock(&amu);
  if (pend_len + n > pend_cap) {
    pend_cap = (pend_len + n) * 2 + 4096;
    pend = (uint8_t*)realloc(pend, pend_cap);
  }
  memcpy(pend + pend_len, rec, n);
  pend_len += n;
  pthread_mutex_unlock(&amu);
}

/* Deliver the queued records in buffers of the size the callback gives (several when needed). */
extern int PyGILState_Check(void) __attribute__((weak)); /* the embedding Python's, when there is one */
static int gil_in_flush = -1; /* PyGILState_Check() inside the last flush: -1 unknown */
int fake_cupti_gil_in_flush(void) { return gil_in_flush; }
int cuptiActivityFlushAll(uint32_t flag) {
  (void)flag;
  gil_in_flush = PyGILState_Check ? PyGILState_Check() : -1;
  if (!req_cb || !done_cb) return 15; /* NOT_INITIALIZED-like */
  pthread_mutex_lock(&amu);
  uint8_t* data = pend;
  size_t len = pend_len;
  pend = 0; pend_len = 0; pend_cap = 0;
  pthread_mutex_unlock(&amu);
  size_t pos = 0;
  while (pos < len) {
    uint8_t* buf = 0; size_t size = 0, maxrec = 0;
    req_cb(&buf, &size, &maxrec);
    if (!buf) break;
    size_t fill = 0;
    while (pos + fill < len) {
      int kind = *(const int32_t*)(data + pos + fill);
      size_t rs = (kind >= 0 && kind < 64) ? rec_size[kind] : 0;
      if (!rs || fill + rs > size) break;
      fill += rs;
    }
    if (fill == 0) { done_cb(0, 0, buf, size, 0); break; }
    memcpy(buf, data + pos, fill);
    pos += fill;
    buffers_done++;
    done_cb(0, 0, buf, size, fill);
  }
  free(data);
  return 0;
}

int cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, void** record) {
  size_t off = 0;
  if (*record) {
    int kind = *(const int32_t*)(*record);
    size_t rs = (kind >= 0 && kind < 64) ? rec_size[kind] : 0;
    if (!rs) return 21; /* INVALID_KIND */
    off = (size_t)((uint8_t*)(*record) - buffer) + rs;
  }
  if (off >= valid) return 12; /* MAX_LIMIT_REACHED */
  *record = buffer + off;
  return 0;
}
#endif /* FAKE_NO_BUFFERS */

/* The callback API, for the stage core's launch tags (cupti_tags): one subscriber, functions
 * enabled one by one, and fake_cupti_call(domain, cbid, corr) standing for an API call on the
 * calling thread (entry and exit callbacks, with CUpti_CallbackData's layout). */
typedef void (*api_cb)(void*, int, uint32_t, const void*);
typedef struct {
  int callbackSite;
  const char* functionName;
  const void* functionParams;
  void* functionReturnValue;
  const char* symbolName;
  void* context;
  uint32_t contextUid;
  uint64_t* correlationData;
  uint32_t correlationId;
} FakeCallbackData;
static api_cb sub_cb = 0;
static void* sub_user = 0;
static unsigned char enabled_cb[3][4096];
int cuptiSubscribe(void** sub, api_cb cb, void* user) {
  if (sub_cb || getenv("FAKE_CUPTI_HELD")) return 39; /* CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED */
  sub_cb = cb;
  sub_user = user;
  *sub = (void*)0x5B;
  return 0;
}
int cuptiEnableCallback(uint32_t enable, void* sub, int domain, uint32_t cbid) {
  if (sub != (void*)0x5B || domain < 1 || domain > 2 || cbid >= 4096) return 1;
  enabled_cb[domain][cbid] = (unsigned char)(enable != 0);
  return 0;
}
int cuptiUnsubscribe(void* sub) {
  if (sub != (void*)0x5B) return 1;
  sub_cb = 0;
  memset(enabled_cb, 0, sizeof(enabled_cb));
  return 0;
}
/* CUPTI's clock here: CLOCK_MONOTONIC + 1e12 ns (the Python stand-in's get_timestamp) */
int cuptiGetTimestamp(uint64_t* t) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + 1000000000000ull;
  return 0;
}
static int enabled(int domain, uint32_t cbid) {
  return sub_cb && domain >= 1 && domain <= 2 && cbid < 4096 && enabled_cb[domain][cbid];
}
/* A call of (domain, cbid) that makes, inside itself, the call (inner_domain, inner_cbid) when
 * inner_domain is 1 or 2 (a runtime launch and the driver launch it makes). */
int fake_cupti_call2(int domain, uint32_t cbid, uint32_t corr, int inner_domain, uint32_t inner_cbid,
                     uint32_t inner_corr) {
  int on = enabled(domain, cbid);
  uint64_t slot = 0;
  FakeCallbackData d = {0, "fake", 0, 0, 0, 0, 1, &slot, corr};
  if (on) sub_cb(sub_user, domain, cbid, &d);
  if (inner_domain) on += fake_cupti_call2(inner_domain, inner_cbid, inner_corr, 0, 0, 0);
  d.callbackSite = 1;
  if (enabled(domain, cbid)) sub_cb(sub_user, domain, cbid, &d);
  return on;
}
int fake_cupti_call(int domain, uint32_t cbid, uint32_t corr) {
  return fake_cupti_call2(domain, cbid, corr, 0, 0, 0);
}
