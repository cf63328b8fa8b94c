/* Test-only stand-in for libcuda.so.1 (and libamdhip64.so): exactly the driver functions the
 * stage core dlsyms, over a fake GPU timeline the test controls through fake_* functions.
 *
 * Each event record takes the next timestamp (next_ts, then next_ts += tick). An event is complete
 * when its timestamp <= gpu_now; the test moves gpu_now (fake_set_gpu_now / fake_complete_all).
 * Synchronize completes the event. fake_fail(name, code, count) makes the next `count` calls of
 * that function return `code`. Counters: fake_count(name). */
#define _GNU_SOURCE  /* RTLD_DEFAULT */
#include <dlfcn.h>
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
                              "cuProfilerStop", "cuStreamIsCapturing", "cuThreadExchangeStreamCaptureMode",
                              "cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel", "cuStreamCreate",
                              "cuStreamDestroy", "cuModuleUnload", "cuDevicePrimaryCtxRetain",
                              "cuDevicePrimaryCtxRelease", "cuCtxPushCurrent", "cuCtxPopCurrent", 0};
enum { CREATE, RECORD, QUERY, ELAPSED, SYNC, DESTROY, CTX, PSTART, PSTOP, ISCAP, EXCH, MODLOAD, MODFUNC, LAUNCH,
       SCREATE, SDESTROY, MODUNLOAD, PRETAIN, PRELEASE, PUSH, POP, NFUN };

/* The current context is per thread, as in CUDA: a thread that never set one sees the process
 * default (fake_set_context), unless fake_set_thread_context gave it its own (0 = none). */
static __thread int has_own_ctx = 0;
static __thread void* own_ctx = 0;
static void* current(void) { return has_own_ctx ? own_ctx : cur_ctx; }
static void* const primary_ctx = (void*)0x1000; /* device 0's primary context */
static int primary_active = 1, primary_refs = 0;
static void* profiler_ctx = (void*)-1;           /* context current at the last cuProfilerStart */
/* Kernels (the floor calibration): a launch of maxinstr_spin(ns) occupies the fake GPU for
 * ns + launch_ns, where launch_ns stands for the fixed front-end cost around any kernel. */
static long long launch_ns = 0;
static char module_image[4096];
static int module_loaded = 0;

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
void fake_set_thread_context(long long ctx) {
  has_own_ctx = 1;
  own_ctx = (void*)(intptr_t)ctx;
}
long long fake_current_context(void) { return (long long)(intptr_t)current(); }
long long fake_profiler_context(void) { return (long long)(intptr_t)profiler_ctx; }
void fake_set_primary_active(int a) { primary_active = a; }
int fake_primary_refs(void) { return primary_refs; }
void fake_set_launch_ns(long long ns) { launch_ns = ns; }
const char* fake_module_image(void) { return module_image; }
void fake_advance(long long ns) { next_ts += ns; } /* stand-in for a kernel of ns on the stream */
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
  *c = current();
  return 0;
}
int cuCtxGetDevice(int* d) {
  if (!current()) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  *d = device;
  return 0;
}
int cuDeviceGetCount(int* n) {
  *n = 1;
  return 0;
}
int cuDeviceGet(int* d, int ordinal) {
  if (ordinal != 0) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *d = 0;
  return 0;
}
int cuDevicePrimaryCtxGetState(int dev, unsigned* flags, int* active) {
  if (dev != 0) return 101;
  *flags = 0;
  *active = primary_active;
  return 0;
}
int cuDevicePrimaryCtxRetain(void** c, int dev) {
  int rc = check(PRETAIN);
  if (rc) return rc;
  if (dev != 0) return 101;
  primary_refs++;
  *c = primary_ctx;
  return 0;
}
int cuDevicePrimaryCtxRelease_v2(int dev) {
  check(PRELEASE);
  if (dev != 0) return 101;
  primary_refs--;
  return 0;
}
/* a one-deep context stack per thread is all the core uses */
static __thread int pushed = 0, saved_has = 0;
static __thread void* saved_ctx = 0;
int cuCtxPushCurrent_v2(void* c) {
  int rc = check(PUSH);
  if (rc) return rc;
  if (pushed) return 999;
  pushed = 1;
  saved_has = has_own_ctx;
  saved_ctx = own_ctx;
  has_own_ctx = 1;
  own_ctx = c;
  return 0;
}
int cuCtxPopCurrent_v2(void** c) {
  check(POP);
  if (!pushed) return 201;
  if (c) *c = own_ctx;
  pushed = 0;
  has_own_ctx = saved_has;
  own_ctx = saved_ctx;
  return 0;
}
int cuModuleLoadData(void** mod, const void* image) {
  int rc = check(MODLOAD);
  if (rc) return rc;
  if (!current()) return 201;
  strncpy(module_image, (const char*)image, sizeof(module_image) - 1);
  module_loaded = 1;
  *mod = (void*)0xD0D0;
  return 0;
}
int cuModuleUnload(void* mod) {
  check(MODUNLOAD);
  module_loaded = 0;
  return mod == (void*)0xD0D0 ? 0 : 400;
}
int cuModuleGetFunction(void** fn, void* mod, const char* name) {
  int rc = check(MODFUNC);
  if (rc) return rc;
  if (mod != (void*)0xD0D0 || !module_loaded) return 400;
  if (strcmp(name, "maxinstr_spin") != 0 || !strstr(module_image, ".entry maxinstr_spin")) return 500; /* NOT_FOUND */
  *fn = (void*)0xF00D;
  return 0;
}
int cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void* stream, void** params, void** extra) {
  (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)stream; (void)extra;
  int rc = check(LAUNCH);
  if (rc) return rc;
  if (fn != (void*)0xF00D || !params) return 400;
  next_ts += (long long)*(unsigned long long*)params[0] + launch_ns;
  /* the stand-in libcupti, when loaded: the callback a CUPTI subscriber would get (driver
   * domain, cuLaunchKernel-like id 307) */
  static unsigned corr = 1000000;
  int (*cupti_call)(int, unsigned, unsigned) = (int (*)(int, unsigned, unsigned))dlsym(RTLD_DEFAULT, "fake_cupti_call");
  if (cupti_call) cupti_call(1, 307, ++corr);
  return 0;
}
int cuStreamCreate(void** s, unsigned flags) {
  int rc = check(SCREATE);
  if (rc) return rc;
  *s = (void*)(uintptr_t)(0x5000 + flags);
  return 0;
}
int cuStreamDestroy_v2(void* s) {
  check(SDESTROY);
  (void)s;
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
int cuProfilerStart(void) {
  int rc = check(PSTART);
  if (rc) return rc;
  if (!current()) return 201; /* acts on the current context */
  profiler_ctx = current();
  return 0;
}
int cuProfilerStop(void) {
  int rc = check(PSTOP);
  if (rc) return rc;
  return current() ? 0 : 201;
}

/* ---- HIP runtime subset, same timeline ---- */
int hipGetDevice(int* d) {
  int rc = check(CTX);
  if (rc) return rc;
  if (!current()) return 100; /* hipErrorNoDevice */
  *d = device;
  return 0;
}
int hipEventCreateWithFlags(void** e, unsigned f) { return cuEventCreate(e, f); }
int hipEventRecord(void* e, void* s) { return cuEventRecord(e, s); }
int hipEventQuery(void* e) { return cuEventQuery(e); }
int hipEventSynchronize(void* e) { return cuEventSynchronize(e); }
int hipEventElapsedTime(float* ms, void* a, void* b) { return cuEventElapsedTime(ms, a, b); }
int hipEventDestroy(void* e) { return cuEventDestroy_v2(e); }
int hipProfilerStart(void) { return check(PSTART); }
int hipStreamIsCapturing(void* s, int* st) { return cuStreamIsCapturing(s, st); }
int hipThreadExchangeStreamCaptureMode(int* m) { return cuThreadExchangeStreamCaptureMode(m); }
int hipProfilerStop(void) { return check(PSTOP); }
