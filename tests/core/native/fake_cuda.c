/* Test-only stand-in for libcuda.so.1 (and libamdhip64.so): exactly the driver functions the
 * stage core dlsyms, over a fake GPU timeline the test controls through fake_* functions.
 *
 * Each event record takes the next timestamp (next_ts, then next_ts += tick). An event is complete
 * when its timestamp <= gpu_now; the test moves gpu_now (fake_set_gpu_now / fake_complete_all).
 * Synchronize completes the event. fake_fail(name, code, count) makes the next `count` calls of
 * that function return `code`. Counters: fake_count(name). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int id;
  int recorded;
  long long ts;
  unsigned long long stream;
} Ev;

static long long gpu_now = 0, next_ts = 1000000, tick = 1000;
static void* cur_ctx = (void*)0x1000;
static int device = 0;
static const char* names[] = {"cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventElapsedTime",
                              "cuEventSynchronize", "cuEventDestroy", "cuCtxGetCurrent", "cuProfilerStart",
                              "cuProfilerStop", "cuStreamIsCapturing", "cuThreadExchangeStreamCaptureMode", 0};
enum { CREATE, RECORD, QUERY, ELAPSED, SYNC, DESTROY, CTX, PSTART, PSTOP, ISCAP, EXCH, NFUN };

/* Stream capture, emulated after the CUDA rules: while a stream captures in global mode, an
 * "unsafe" call (query, synchronize) from a thread in global mode invalidates the capture and
 * fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900); an event recorded into the capturing
 * stream becomes part of the graph (no timestamp); the legacy stream reports
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (906) while a blocking stream captures. */
static int capturing = 0, capture_blocking = 0, capture_invalidated = 0, recorded_into_capture = 0;
static unsigned long long capture_stream = 0;
static __thread int thread_mode = 0; /* 0 global, 1 thread-local, 2 relaxed */
static int unsafe_call(void) {
  if (capturing && thread_mode == 0) {
    capture_invalidated = 1;
    return 900;
  }
  return 0;
}
static long long counts[NFUN];
static int fail_code[NFUN], fail_left[NFUN];
#define MAXREC 100000
static unsigned long long rec_stream[MAXREC];
static int rec_event[MAXREC];
static int nrec;

static int idx(const char* n) {
  for (int i = 0; names[i]; i++)
    if (!strcmp(names[i], n)) return i;
  return -1;
}
static int check(int f) {
  counts[f]++;
  if (fail_left[f] > 0) {
    fail_left[f]--;
    return fail_code[f];
  }
  return 0;
}

/* ---- controls ---- */
void fake_begin_capture(unsigned long long stream, int blocking) {
  capturing = 1;
  capture_stream = stream;
  capture_blocking = blocking;
  capture_invalidated = 0;
  recorded_into_capture = 0;
}
void fake_end_capture(void) { capturing = 0; }
int fake_capture_invalidated(void) { return capture_invalidated; }
int fake_recorded_into_capture(void) { return recorded_into_capture; }
int fake_thread_mode(void) { return thread_mode; }
void fake_set_context(long long ctx) { cur_ctx = (void*)(intptr_t)ctx; }
void fake_set_gpu_now(long long t) { gpu_now = t; }
void fake_complete_all(void) { gpu_now = next_ts; }
long long fake_next_ts(void) { return next_ts; }
void fake_set_next_ts(long long t) { next_ts = t; }
void fake_set_tick(long long t) { tick = t; }
long long fake_count(const char* n) { int i = idx(n); return i < 0 ? -1 : counts[i]; }
void fake_fail(const char* n, int code, int count) {
  int i = idx(n);
  if (i >= 0) {
    fail_code[i] = code;
    fail_left[i] = count;
  }
}
int fake_nrecords(void) { return nrec; }
unsigned long long fake_record_stream(int i) { return rec_stream[i]; }
int fake_record_event(int i) { return rec_event[i]; }

/* ---- CUDA driver API subset ---- */
int cuCtxGetCurrent(void** c) {
  int rc = check(CTX);
  if (rc) return rc;
  *c = cur_ctx;
  return 0;
}
int cuEventCreate(void** e, unsigned flags) {
  (void)flags;
  int rc = check(CREATE);
  if (rc) return rc;
  Ev* ev = (Ev*)calloc(1, sizeof(Ev));
  ev->id = (int)counts[CREATE];
  *e = ev;
  return 0;
}
int cuEventRecord(void* e, void* stream) {
  int rc = check(RECORD);
  if (rc) return rc;
  Ev* ev = (Ev*)e;
  if (capturing && (unsigned long long)(uintptr_t)stream == capture_stream) {
    recorded_into_capture++;
    return 0;
  }
  ev->recorded = 1;
  ev->ts = next_ts;
  next_ts += tick;
  ev->stream = (unsigned long long)(uintptr_t)stream;
  if (nrec < MAXREC) {
    rec_stream[nrec] = ev->stream;
    rec_event[nrec] = ev->id;
    nrec++;
  }
  return 0;
}
int cuEventQuery(void* e) {
  int rc = check(QUERY);
  if (rc || (rc = unsafe_call())) return rc;
  Ev* ev = (Ev*)e;
  return (!ev->recorded || ev->ts <= gpu_now) ? 0 : 600;
}
int cuEventSynchronize(void* e) {
  int rc = check(SYNC);
  if (rc || (rc = unsafe_call())) return rc;
  Ev* ev = (Ev*)e;
  if (ev->recorded && ev->ts > gpu_now) gpu_now = ev->ts;
  return 0;
}
int cuEventElapsedTime(float* ms, void* a, void* b) {
  int rc = check(ELAPSED);
  if (rc) return rc;
  Ev *x = (Ev*)a, *y = (Ev*)b;
  if (!x->recorded || !y->recorded) return 400; /* CUDA_ERROR_INVALID_HANDLE */
  if (x->ts > gpu_now || y->ts > gpu_now) return 600;
  *ms = (float)((double)(y->ts - x->ts) / 1e6);
  return 0;
}
int cuEventDestroy_v2(void* e) {
  check(DESTROY);
  free(e);
  return 0;
}
int cuStreamIsCapturing(void* stream, int* status) {
  int rc = check(ISCAP);
  if (rc) return rc;
  unsigned long long s = (unsigned long long)(uintptr_t)stream;
  if (capturing && s == 0 && capture_blocking && capture_stream != 0) return 906;
  *status = (capturing && s == capture_stream) ? 1 : 0;
  return 0;
}
int cuThreadExchangeStreamCaptureMode(int* mode) {
  int rc = check(EXCH);
  if (rc) return rc;
  int old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return 0;
}
int cuProfilerStart(void) { return check(PSTART); }
int cuProfilerStop(void) { return check(PSTOP); }

/* ---- HIP runtime subset, same timeline ---- */
int hipGetDevice(int* d) {
  int rc = check(CTX);
  if (rc) return rc;
  if (!cur_ctx) return 100; /* hipErrorNoDevice */
  *d = device;
  return 0;
}
int hipEventCreateWithFlags(void** e, unsigned f) { return cuEventCreate(e, f); }
int hipEventRecord(void* e, void* s) { return cuEventRecord(e, s); }
int hipEventQuery(void* e) { return cuEventQuery(e); }
int hipEventSynchronize(void* e) { return cuEventSynchronize(e); }
int hipEventElapsedTime(float* ms, void* a, void* b) { return cuEventElapsedTime(ms, a, b); }
int hipEventDestroy(void* e) { return cuEventDestroy_v2(e); }
int hipProfilerStart(void) { return cuProfilerStart(); }
int hipStreamIsCapturing(void* s, int* st) { return cuStreamIsCapturing(s, st); }
int hipThreadExchangeStreamCaptureMode(int* m) { return cuThreadExchangeStreamCaptureMode(m); }
int hipProfilerStop(void) { return cuProfilerStop(); }
