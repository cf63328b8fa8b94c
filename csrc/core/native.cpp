// maxinstr._native: the stage core.
//
// What lives here (see docs/stage-core.md for the user-facing story):
//   * the host clock (CLOCK_MONOTONIC ns) of every record and sample;
//   * the Stage type: a raw CPython type, because the hot path (`with stage("x"): ...`) must cost
//     a few hundred ns at most and an empty *Python* context manager already costs ~230 ns;
//   * per-OS-thread stacks of open stages (depth/parent), completed records waiting for drain();
//   * markers: NVTX3 (header-only, domain "maxinstr", registered strings, int64 payload = record
//     id) or roctx (dlopened; no payload);
//   * GPU events: libcuda / libamdhip64 dlopened, a bounded pool of events created once and reused,
//     one event per stage boundary (siblings and parent/child boundaries share one event when no
//     work can have been submitted between them), lazy non-blocking resolution, GPU times mapped
//     onto the host clock through a reference event.
//
// Concurrency: every entry point is called from Python with the GIL held, and this module does not
// release it, so the GIL is the lock of all shared state here (the module declares no free-threading
// support, so a free-threaded interpreter re-enables the GIL on import). Code that runs without
// the GIL: the thread-exit hook, which only stores an atomic flag; the native writer thread
// (native_writer.h), which shares only the completed-record buffer, under its own mutex, taken by
// push_done and drain() only while that thread runs; and the CUPTI buffer callbacks (cuptibuf).

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include <nvtx3/nvToolsExt.h>

#if defined(__GNUC__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define LIKELY(x) (x)
#define UNLIKELY(x) (x)
#endif

namespace {

// ---------------------------------------------------------------------------------------------
// Record layout: maxinstr.rundir.format.STAGE_DTYPE (docs/formats.md), 72 little-endian bytes.
// ---------------------------------------------------------------------------------------------
struct Record {
  int64_t id;
  int64_t parent_id;
  int64_t tid;
  int64_t host_start_ns;
  int64_t host_end_ns;
  int64_t gpu_start_ns;
  int64_t gpu_end_ns;
  int64_t step;
  int32_t name_id;
  int16_t depth;
  uint16_t flags;
};
static_assert(sizeof(Record) == 72, "Record must match STAGE_DTYPE (72 bytes)");

enum : uint16_t {
  F_EXCEPTION = 1u << 0,
  F_GPU_TIMED = 1u << 1,
  F_MARK = 1u << 2,
  F_GPU_DROPPED = 1u << 3,
  F_UNCLOSED = 1u << 4,
  F_GPU_SAMPLED_OUT = 1u << 5,  // left without GPU events by the timing budget (see budget_skips)
};

inline int64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------------
// Process-wide state (protected by the GIL, see the header comment).
// ---------------------------------------------------------------------------------------------
struct StageObject;

struct Boundary {  // the last event this thread recorded on one stream (for boundary sharing)
  uint64_t stream;
  int ctx;
  int slot;  // -1: empty
  int64_t t_ns;
};
constexpr int kBoundaries = 4;

struct ThreadState {
  int64_t tid = 0;
  std::vector<StageObject*> stack;  // strong references; open stages and "zombies" (see exit)
  std::atomic<bool> alive{true};
  Boundary bnd[kBoundaries];
  int bnd_next = 0;
  bool gpu_skip = false;  // the budget left this thread's current top-level stage (and its children) untimed
  ThreadState() {
    for (auto& b : bnd) b = Boundary{0, -1, -1, 0};
  }
};

struct NameEntry {
  PyObject* str;  // strong ref
  std::string utf8;
  nvtxStringHandle_t nvtx;
};

struct AttrEntry {
  uint64_t done_index;  // position of the record in the completed stream
  int64_t id;
  PyObject* attrs;  // strong ref
};

struct Pending {  // a completed stage waiting for its GPU events
  Record rec;
  int ev0, ev1, ctx;
  uint64_t stream;
  PyObject* attrs;  // strong ref or NULL
};

enum Markers { MK_NONE = 0, MK_NVTX = 1, MK_ROCTX = 2 };
enum Backend { BK_NONE = 0, BK_CUDA = 1, BK_HIP = 2 };

struct GpuApi {
  int backend = BK_NONE;
  void* lib = nullptr;
  std::string lib_name;
  // CUDA driver and HIP runtime share these shapes: status int (0 = success, 600 = not ready),
  // opaque handles.
  int (*ev_create)(void**, unsigned) = nullptr;
  int (*ev_record)(void*, void*) = nullptr;
  int (*ev_query)(void*) = nullptr;
  int (*ev_elapsed)(float*, void*, void*) = nullptr;
  int (*ev_sync)(void*) = nullptr;
  int (*ev_destroy)(void*) = nullptr;
  int (*ctx_current)(void**) = nullptr;  // CUDA: cuCtxGetCurrent
  int (*get_device)(int*) = nullptr;     // HIP: hipGetDevice
  int (*prof_start)() = nullptr;
  int (*prof_stop)() = nullptr;
  // Optional (stream capture, CUDA 10+/HIP 5+): see RelaxedCapture and gpu_point.
  int (*is_capturing)(void*, int*) = nullptr;
  int (*exch_mode)(int*) = nullptr;
  // Optional (CUDA only), for the floor calibration (ctx_calibrate): a tiny PTX kernel on a
  // private non-blocking stream.
  int (*mod_load)(void**, const void*) = nullptr;         // cuModuleLoadData
  int (*mod_unload)(void*) = nullptr;                     // cuModuleUnload
  int (*mod_func)(void**, void*, const char*) = nullptr;  // cuModuleGetFunction
  int (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                void**) = nullptr;                        // cuLaunchKernel
  int (*stream_create)(void**, unsigned) = nullptr;       // cuStreamCreate
  int (*stream_destroy)(void*) = nullptr;                 // cuStreamDestroy_v2
  // Optional (CUDA only), for profiler_start/stop on a thread with no current context.
  int (*ctx_device)(int*) = nullptr;                      // cuCtxGetDevice
  int (*dev_count)(int*) = nullptr;                       // cuDeviceGetCount
  int (*dev_get)(int*, int) = nullptr;                    // cuDeviceGet
  int (*primary_state)(int, unsigned*, int*) = nullptr;   // cuDevicePrimaryCtxGetState
  int (*primary_retain)(void**, int) = nullptr;           // cuDevicePrimaryCtxRetain
  int (*primary_release)(int) = nullptr;                  // cuDevicePrimaryCtxRelease_v2
  int (*ctx_push)(void*) = nullptr;                       // cuCtxPushCurrent_v2
  int (*ctx_pop)(void**) = nullptr;                       // cuCtxPopCurrent_v2
};

struct Slot {
  void* ev;
  int ctx;
  int ref;
  uint64_t rec_seq;  // g.record_seq when this event was last recorded (stream order, see resolve)
  int64_t host_ns;   // its time on the host clock once placed (kUnplaced before)
  uint8_t placing = 0;  // handed to the placer thread (placer.h), not placed yet
};
constexpr int64_t kUnplaced = INT64_MIN;

struct Ctx {
  void* key;              // CUcontext, or (device + 1) for HIP
  bool ok = false;        // reference pairing succeeded
  std::vector<int> free;  // free slots of this context
  int anchor = -1;        // slot of the newest resolved event (its host time is anchor_ns)
  int64_t anchor_ns = 0;
  int64_t retry_ns = 0;   // a failed reference pairing is retried after this host time
  int device = -1;        // CUDA device ordinal of the context (cuCtxGetDevice), -1 unknown
  int64_t floor_ns = 0;   // calibrated event->kernel->event floor, taken out of GPU times
  int floor_state = 0;    // 0 not calibrated, 1 calibrated, 2 fixed by MAXINSTR_GPU_FLOOR_NS, -1 failed
};

struct Globals {
  bool enabled = true;
  int64_t pid = 0;
  uint32_t seq = 0;
  uint32_t fork_gen = 0;

  // completed records, FIFO: done[done_head:] are undrained
  std::vector<Record> done;
  size_t done_head = 0;
  uint64_t done_pushed = 0;   // records ever pushed (index of the next one)
  uint64_t done_drained = 0;  // records ever drained
  std::vector<AttrEntry> attrs;
  size_t attrs_head = 0;
  size_t capacity = 1000000;
  uint64_t records = 0;
  uint64_t dropped_records = 0;

  PyObject* name_dict = nullptr;  // str -> int name_id
  std::vector<NameEntry> names;
  size_t names_reported = 0;

  std::vector<ThreadState*> threads;

  std::vector<std::string> errors;
  uint64_t errors_dropped = 0;

  // markers
  int markers = MK_NONE;
  nvtxDomainHandle_t domain = nullptr;
  void* roctx_lib = nullptr;
  int (*roctx_push)(const char*) = nullptr;
  int (*roctx_pop)() = nullptr;
  void (*roctx_mark)(const char*) = nullptr;
  int (*roctx_pause)(uint64_t) = nullptr;
  int (*roctx_resume)(uint64_t) = nullptr;

  // GPU
  GpuApi gpu;
  bool gpu_tried = false;
  uint32_t gpu_retry = 0;  // HIP: retries of "is the HIP runtime loaded yet"
  bool gpu_off_after_fork = false;
  std::vector<Slot> slots;
  std::vector<Ctx> ctxs;
  int last_ctx = -1;
  int pool_max = 4096;
  int pool_total = 0;
  int64_t share_ns = 1000;  // see gpu_point(): boundaries closer than this share one event
  std::deque<Pending> pending;  // in exit order
  uint64_t gpu_exits = 0;
  uint64_t events_recorded = 0;
  uint64_t events_shared = 0;
  uint64_t events_dropped = 0;
  uint64_t events_capture = 0;  // boundaries skipped because the stream was capturing a graph
  uint64_t record_seq = 0;      // event records ever made (orders records on one stream)
  uint64_t event_queries = 0;   // cuEventQuery/Synchronize calls made to resolve records
  uint64_t event_elapsed = 0;   // cuEventElapsedTime calls made to resolve records
  bool warned_no_ctx = false;
  // MAXINSTR_TIME_DRIVER=1 (benchmarks): host ns spent inside each driver call of the hot path and
  // inside opportunistic resolution, so a benchmark can split a GPU-timed stage's cost into the
  // driver's and ours. Off by default: two clock reads per call.
  bool time_driver = false;
  // The GPU-timing budget (docs/stage-core.md): recording and resolving events costs the program's
  // threads host time (1.5-2 us per event on a busy H200 with the placer, ~5 us inline), which a launch-bound loop of short
  // stages feels. Stages with gpu=None are GPU-timed while that cost stays within `gpu_budget` of
  // the wall time since the first GPU event (plus a starting credit); beyond it, whole top-level
  // stages (with their children) are left untimed until the cost is back under budget. 0: every
  // stage is timed. gpu=True stages are always timed.
  double gpu_budget = 0.0025;
  int64_t gpu_cost_ns = 0;      // host ns spent recording and resolving events on the program's threads
  int64_t gpu_budget_t0 = 0;    // host time of the first GPU event
  uint64_t gpu_sampled_out = 0; // stages left untimed by the budget
  bool place_async = false;     // slot_place() hands events to the placer thread (placer.h)
  uint64_t drv_ns[5] = {0, 0, 0, 0, 0};  // record, query/sync, elapsed, is_capturing, resolve_front


  // CUPTI external correlation (session kernels=True): libcupti is loaded by the Python side
  // (cupti-python); cupti_link() dlopens that same library (RTLD_NOLOAD) and takes these two.
  int (*cupti_push)(int, uint64_t) = nullptr;   // cuptiActivityPushExternalCorrelationId
  int (*cupti_pop)(int, uint64_t*) = nullptr;   // cuptiActivityPopExternalCorrelationId
  int cupti_kind = 0;                           // CUpti_ExternalCorrelationKind
  bool cupti_on = false;
  uint64_t cupti_pushes = 0;
  uint64_t cupti_errors = 0;
  int64_t floor_fixed = -1;     // MAXINSTR_GPU_FLOOR_NS: >= 0 fixes the floor (0 = raw event times)

  // Attrs are data, not references (maxinstr/record/attrs.py): attrs holding anything but
  // str/int/float/bool/None are replaced at stage exit by this hook's plain-data copy.
  PyObject* attrs_hook = nullptr;
  uint64_t attrs_unconverted = 0;  // the hook failed: those attrs were not kept (counted)
};

Globals g;

thread_local ThreadState* tls_ts = nullptr;
// > 0 while this thread launches the core's own GPU work (the floor calibration): the launch
// tags (cupti_tags.h) then name no stage, as the NVTX ranges do not hold that work either.
thread_local int tls_core_gpu_work = 0;
struct TlsGuard {  // runs at thread exit, without the GIL: only flips an atomic
  ThreadState* ts = nullptr;
  ~TlsGuard() {
    if (ts) ts->alive.store(false, std::memory_order_release);
  }
};
thread_local TlsGuard tls_guard;

#include "native_writer.h"  // the native writer thread (w): takes g.done while a session is open

void add_error(const std::string& msg) {
  for (auto& e : g.errors)
    if (e == msg) return;
  if (g.errors.size() >= 64) {
    g.errors_dropped++;
    return;
  }
  g.errors.push_back(msg);
}

inline int64_t next_id() { return (g.pid << 32) | (int64_t)(++g.seq); }

inline ThreadState* get_ts() {
  ThreadState* ts = tls_ts;
  if (LIKELY(ts != nullptr)) return ts;
  ts = new ThreadState();
  ts->tid = (int64_t)syscall(SYS_gettid);
  g.threads.push_back(ts);
  tls_ts = ts;
  tls_guard.ts = ts;
  return ts;
}

// ---------------------------------------------------------------------------------------------
// Completed records
// ---------------------------------------------------------------------------------------------
inline size_t done_count() { return g.done.size() - g.done_head; }

void push_done(const Record& r, PyObject* attrs) {
  g.records++;
  const bool locked = w.running;  // the native writer takes g.done concurrently (native_writer.h)
  if (locked) pthread_mutex_lock(&w.mu);
  if (UNLIKELY(done_count() >= g.capacity)) {
    g.dropped_records++;
    if (locked) pthread_mutex_unlock(&w.mu);
    return;
  }
  if (attrs && PyDict_GET_SIZE(attrs) > 0) {
    if (UNLIKELY(locked && g.attrs.size() - g.attrs_head >= g.capacity)) {
      w.dropped_attrs++;  // the Python flusher has not taken attrs for a whole buffer's worth
    } else {
      Py_INCREF(attrs);
      g.attrs.push_back(AttrEntry{g.done_pushed, r.id, attrs});
    }
  }
  g.done.push_back(r);
  g.done_pushed++;
  if (locked) {
    writer_after_push();
    pthread_mutex_unlock(&w.mu);
  }
}

// ---------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------
int32_t intern_name(PyObject* name) {
  PyObject* v = PyDict_GetItemWithError(g.name_dict, name);
  if (LIKELY(v != nullptr)) return (int32_t)PyLong_AS_LONG(v);
  if (PyErr_Occurred()) return -1;
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "stage name must be str, not %.80s", Py_TYPE(name)->tp_name);
    return -1;
  }
  Py_ssize_t n = 0;
  const char* u = PyUnicode_AsUTF8AndSize(name, &n);
  PyObject* shown = name;  // the name as recorded
  PyObject* escaped = nullptr;
  if (!u) {
    // A lone surrogate (os.fsdecode of a non-UTF-8 file name) has no UTF-8: record the name
    // with it escaped as \udcff, as the readers show it (maxinstr/_text.py safe_name).
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
    PyErr_Clear();
    PyObject* b = PyUnicode_AsEncodedString(name, "utf-8", "backslashreplace");
    if (!b) return -1;
    escaped = PyUnicode_FromEncodedObject(b, "utf-8", "strict");
    Py_DECREF(b);
    if (!escaped) return -1;
    u = PyUnicode_AsUTF8AndSize(escaped, &n);
    if (!u) {
      Py_DECREF(escaped);
      return -1;
    }
    shown = escaped;
  }
  int32_t id = (int32_t)g.names.size();
  PyObject* idobj = PyLong_FromLong(id);
  if (!idobj) {
    Py_XDECREF(escaped);
    return -1;
  }
  if (PyDict_SetItem(g.name_dict, name, idobj) < 0) {
    Py_DECREF(idobj);
    Py_XDECREF(escaped);
    return -1;
  }
  Py_DECREF(idobj);
  NameEntry e;
  e.str = shown;
  if (!escaped) Py_INCREF(shown);  // (escaped: its reference moves into the entry)
  e.utf8.assign(u, (size_t)n);
  e.nvtx = (g.markers == MK_NVTX) ? nvtxDomainRegisterStringA(g.domain, e.utf8.c_str()) : nullptr;
  writer_add_name(e.utf8);
  g.names.push_back(std::move(e));
  return id;
}

// ---------------------------------------------------------------------------------------------
// Markers
// ---------------------------------------------------------------------------------------------
inline void marker_push(int32_t name_id, int64_t id) {
  if (g.markers == MK_NVTX) {
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof(a));
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = g.names[name_id].nvtx;
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = id;
    nvtxDomainRangePushEx(g.domain, &a);
  } else if (g.markers == MK_ROCTX) {
    g.roctx_push(g.names[name_id].utf8.c_str());
  }
}

inline void marker_pop() {
  if (g.markers == MK_NVTX)
    nvtxDomainRangePop(g.domain);
  else if (g.markers == MK_ROCTX)
    g.roctx_pop();
}

inline void marker_mark(int32_t name_id, int64_t id) {
  if (g.markers == MK_NVTX) {
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof(a));
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = g.names[name_id].nvtx;
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = id;
    nvtxDomainMarkEx(g.domain, &a);
  } else if (g.markers == MK_ROCTX && g.roctx_mark) {
    g.roctx_mark(g.names[name_id].utf8.c_str());
  }
}

const char* env(const char* k) {
  const char* v = getenv(k);
  return (v && *v) ? v : nullptr;
}

bool load_roctx(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return false;
  auto push = (int (*)(const char*))dlsym(h, "roctxRangePushA");
  auto pop = (int (*)())dlsym(h, "roctxRangePop");
  if (!push || !pop) {
    add_error(std::string("roctx: ") + path + " lacks roctxRangePushA/roctxRangePop");
    dlclose(h);
    return false;
  }
  g.roctx_lib = h;
  g.roctx_push = push;
  g.roctx_pop = pop;
  g.roctx_mark = (void (*)(const char*))dlsym(h, "roctxMarkA");
  g.roctx_pause = (int (*)(uint64_t))dlsym(h, "roctxProfilerPause");
  g.roctx_resume = (int (*)(uint64_t))dlsym(h, "roctxProfilerResume");
  return true;
}

// MAXINSTR_MARKERS = nvtx | roctx | none | (unset: roctx when a roctx library loads, else nvtx).
void init_markers() {
  const char* want = env("MAXINSTR_MARKERS");
  std::string w = want ? want : "auto";
  if (w == "none") {
    g.markers = MK_NONE;
    return;
  }
  if (w == "roctx" || w == "auto") {
    const char* path = env("MAXINSTR_ROCTX_LIBRARY");
    bool ok = false;
    if (path)
      ok = load_roctx(path);
    else
      ok = load_roctx("librocprofiler-sdk-roctx.so") || load_roctx("librocprofiler-sdk-roctx.so.1") ||
           load_roctx("libroctx64.so") || load_roctx("libroctx64.so.4");
    if (ok) {
      g.markers = MK_ROCTX;
      return;
    }
    if (w == "roctx" || path) add_error("roctx requested but no roctx library could be loaded");
  }
  g.markers = MK_NVTX;
  g.domain = nvtxDomainCreateA("maxinstr");
}

// ---------------------------------------------------------------------------------------------
// GPU backend: dlopen + dlsym of the few functions used.
// ---------------------------------------------------------------------------------------------
void* sym(void* h, const char* a, const char* b = nullptr) {
  void* p = dlsym(h, a);
  if (!p && b) p = dlsym(h, b);
  return p;
}

bool load_cuda(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return false;
  GpuApi a;
  a.lib = h;
  a.lib_name = path;
  a.ev_create = (int (*)(void**, unsigned))sym(h, "cuEventCreate");
  a.ev_record = (int (*)(void*, void*))sym(h, "cuEventRecord");
  a.ev_query = (int (*)(void*))sym(h, "cuEventQuery");
  a.ev_elapsed = (int (*)(float*, void*, void*))sym(h, "cuEventElapsedTime");
  a.ev_sync = (int (*)(void*))sym(h, "cuEventSynchronize");
  a.ev_destroy = (int (*)(void*))sym(h, "cuEventDestroy_v2", "cuEventDestroy");
  a.ctx_current = (int (*)(void**))sym(h, "cuCtxGetCurrent");
  a.prof_start = (int (*)())sym(h, "cuProfilerStart");
  a.prof_stop = (int (*)())sym(h, "cuProfilerStop");
  a.is_capturing = (int (*)(void*, int*))sym(h, "cuStreamIsCapturing");
  a.exch_mode = (int (*)(int*))sym(h, "cuThreadExchangeStreamCaptureMode");
  a.mod_load = (int (*)(void**, const void*))sym(h, "cuModuleLoadData");
  a.mod_unload = (int (*)(void*))sym(h, "cuModuleUnload");
  a.mod_func = (int (*)(void**, void*, const char*))sym(h, "cuModuleGetFunction");
  a.launch = (int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                      void**))sym(h, "cuLaunchKernel");
  a.stream_create = (int (*)(void**, unsigned))sym(h, "cuStreamCreate");
  a.stream_destroy = (int (*)(void*))sym(h, "cuStreamDestroy_v2", "cuStreamDestroy");
  a.ctx_device = (int (*)(int*))sym(h, "cuCtxGetDevice");
  a.dev_count = (int (*)(int*))sym(h, "cuDeviceGetCount");
  a.dev_get = (int (*)(int*, int))sym(h, "cuDeviceGet");
  a.primary_state = (int (*)(int, unsigned*, int*))sym(h, "cuDevicePrimaryCtxGetState");
  a.primary_retain = (int (*)(void**, int))sym(h, "cuDevicePrimaryCtxRetain");
  a.primary_release = (int (*)(int))sym(h, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
  a.ctx_push = (int (*)(void*))sym(h, "cuCtxPushCurrent_v2", "cuCtxPushCurrent");
  a.ctx_pop = (int (*)(void**))sym(h, "cuCtxPopCurrent_v2", "cuCtxPopCurrent");
  if (!a.ev_create || !a.ev_record || !a.ev_query || !a.ev_elapsed || !a.ev_sync || !a.ctx_current) {
    add_error(std::string("cuda: ") + path + " lacks a needed cuEvent*/cuCtxGetCurrent function");
    dlclose(h);
    return false;
  }
  a.backend = BK_CUDA;
  g.gpu = a;
  return true;
}

bool load_hip(const char* path, bool only_if_loaded) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | (only_if_loaded ? RTLD_NOLOAD : 0));
  if (!h) return false;
  GpuApi a;
  a.lib = h;
  a.lib_name = path;
  a.ev_create = (int (*)(void**, unsigned))sym(h, "hipEventCreateWithFlags");
  a.ev_record = (int (*)(void*, void*))sym(h, "hipEventRecord");
  a.ev_query = (int (*)(void*))sym(h, "hipEventQuery");
  a.ev_elapsed = (int (*)(float*, void*, void*))sym(h, "hipEventElapsedTime");
  a.ev_sync = (int (*)(void*))sym(h, "hipEventSynchronize");
  a.ev_destroy = (int (*)(void*))sym(h, "hipEventDestroy");
  a.get_device = (int (*)(int*))sym(h, "hipGetDevice");
  a.prof_start = (int (*)())sym(h, "hipProfilerStart");
  a.prof_stop = (int (*)())sym(h, "hipProfilerStop");
  a.is_capturing = (int (*)(void*, int*))sym(h, "hipStreamIsCapturing");
  a.exch_mode = (int (*)(int*))sym(h, "hipThreadExchangeStreamCaptureMode");
  if (!a.ev_create || !a.ev_record || !a.ev_query || !a.ev_elapsed || !a.ev_sync || !a.get_device) {
    add_error(std::string("hip: ") + path + " lacks a needed hipEvent*/hipGetDevice function");
    dlclose(h);
    return false;
  }
  a.backend = BK_HIP;
  g.gpu = a;
  return true;
}

// Loads the driver once. CUDA: libcuda.so.1 (MAXINSTR_CUDA_LIBRARY overrides). HIP: only a HIP
// runtime the process has already loaded (so we never initialise a runtime the program does not
// use), or MAXINSTR_HIP_LIBRARY. Loading is not initialising: no context is ever created here.
void gpu_try_load() {
  if (g.gpu.backend != BK_NONE) return;
  if (g.gpu_tried) {
    // HIP may be loaded by the framework after our first stage: look again now and then.
    if ((++g.gpu_retry & 4095) != 0) return;
    if (!env("MAXINSTR_CUDA_LIBRARY"))
      load_hip("libamdhip64.so", true) || load_hip("libamdhip64.so.7", true) ||
          load_hip("libamdhip64.so.6", true);
    return;
  }
  g.gpu_tried = true;
  if (const char* p = env("MAXINSTR_CUDA_LIBRARY")) {
    if (!load_cuda(p)) add_error(std::string("MAXINSTR_CUDA_LIBRARY=") + p + " could not be loaded");
    return;
  }
  if (const char* p = env("MAXINSTR_HIP_LIBRARY")) {
    if (!load_hip(p, false)) add_error(std::string("MAXINSTR_HIP_LIBRARY=") + p + " could not be loaded");
    return;
  }
  if (load_cuda("libcuda.so.1")) return;
  load_hip("libamdhip64.so", true) || load_hip("libamdhip64.so.7", true) || load_hip("libamdhip64.so.6", true);
}

inline void* gpu_current_key() {
  if (g.gpu.backend == BK_CUDA) {
    void* c = nullptr;
    if (g.gpu.ctx_current(&c) != 0) return nullptr;
    return c;
  }
  if (g.gpu.backend == BK_HIP) {
    int d = -1;
    if (g.gpu.get_device(&d) != 0 || d < 0) return nullptr;
    return (void*)(intptr_t)(d + 1);
  }
  return nullptr;
}

enum { DRV_RECORD, DRV_QUERY, DRV_ELAPSED, DRV_CAPTURING, DRV_RESOLVE };
struct DrvTime {
  int which;
  int64_t t0;
  explicit DrvTime(int w) : which(g.time_driver ? w : -1), t0(which >= 0 ? now_ns() : 0) {}
  ~DrvTime() {
    if (UNLIKELY(which >= 0)) g.drv_ns[which] += (uint64_t)(now_ns() - t0);
  }
};

// While some stream captures a CUDA graph in the default "global" mode, calls such as
// cuEventQuery/cuEventSynchronize from any thread are illegal and invalidate that capture. Our
// queries (resolve(), opportunistic resolution, the reference pairing) run with this thread in
// "relaxed" capture mode, the documented opt-out for exactly this kind of bookkeeping, and
// restore the thread's mode afterwards.
struct RelaxedCapture {
  int old = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED == hipStreamCaptureModeRelaxed == 2
  bool on = false;
  RelaxedCapture() {
    if (g.gpu.exch_mode) on = g.gpu.exch_mode(&old) == 0;
  }
  ~RelaxedCapture() {
    if (on) g.gpu.exch_mode(&old);
  }
};

void slot_release(int s) {
  if (s < 0) return;
  Slot& sl = g.slots[(size_t)s];
  if (--sl.ref == 0) g.ctxs[(size_t)sl.ctx].free.push_back(s);
}

// Creates up to 64 events in the current context. Only called where ctx is current.
bool pool_grow(int c) {
  int room = g.pool_max - g.pool_total;
  if (room <= 0) return false;
  int n = room < 64 ? room : 64;
  for (int i = 0; i < n; i++) {
    void* ev = nullptr;
    int rc = g.gpu.ev_create(&ev, 0);
    if (rc != 0) {
      add_error("event create failed (status " + std::to_string(rc) + ")");
      return i > 0;
    }
    g.slots.push_back(Slot{ev, c, 0, 0, kUnplaced});
    g.ctxs[(size_t)c].free.push_back((int)g.slots.size() - 1);
    g.pool_total++;
  }
  return true;
}

size_t resolve_front(size_t n, bool async = false);

inline void* gpu_current_key();

// A free slot of context c with ref = 1, or -1 when the pool is exhausted. may_create: 1 = c is
// current (new events may be created in it), 2 = find out only if events are needed.
int slot_alloc(int c, int may_create) {
  Ctx& cx = g.ctxs[(size_t)c];
  if (cx.free.empty()) {
    if (may_create == 2) may_create = gpu_current_key() == cx.key;
    if (!(may_create && pool_grow(c))) {
      resolve_front(8);  // the GPU fell behind, or nobody resolves: try to get events back
      if (g.ctxs[(size_t)c].free.empty()) return -1;
    }
  }
  Ctx& cy = g.ctxs[(size_t)c];
  int s = cy.free.back();
  cy.free.pop_back();
  g.slots[(size_t)s].ref = 1;
  return s;
}

// The reference pair: record an event on the legacy default stream, wait for it, and take the
// midpoint of the host clock around record+wait as its host time (best of three, i.e. the
// narrowest window). Once per context, at its first GPU stage: the only synchronisation outside
// resolve(block=True).
bool ctx_pair_reference(int c) {
  RelaxedCapture relaxed;
  if (g.gpu.is_capturing) {  // the legacy stream must not be touched while a graph is captured
    int status = 0;
    if (g.gpu.is_capturing(nullptr, &status) != 0 || status != 0) return false;
  }
  int best = -1;
  int64_t best_w = INT64_MAX, best_t = 0;
  for (int i = 0; i < 3; i++) {
    int s = slot_alloc(c, 1);
    if (s < 0) break;
    int64_t t0 = now_ns();
    int rc = g.gpu.ev_record(g.slots[(size_t)s].ev, nullptr);
    if (rc == 0) rc = g.gpu.ev_sync(g.slots[(size_t)s].ev);
    int64_t t1 = now_ns();
    if (rc != 0) {
      add_error("reference event failed (status " + std::to_string(rc) + "): GPU times off for this context");
      slot_release(s);
      break;
    }
    if (t1 - t0 < best_w) {
      if (best >= 0) slot_release(best);
      best = s;
      best_w = t1 - t0;
      best_t = t0 + (t1 - t0) / 2;
    } else {
      slot_release(s);
    }
  }
  if (best < 0) return false;
  g.ctxs[(size_t)c].anchor = best;
  g.ctxs[(size_t)c].anchor_ns = best_t;
  g.slots[(size_t)best].host_ns = best_t;
  return true;
}

// The GPU-time floor. Events around a kernel do not read the kernel's own time: between an event
// and the first instruction of the next kernel, and between the kernel's last instruction and the
// next event, the GPU front end spends a fixed time (about 2.9 us on an H200, even with everything
// queued back to back). So a stage around one 200 us kernel read 202.9 us. Once per context, right
// after the reference pairing (so at the same moment, the first GPU stage), we measure that floor:
// on a private non-blocking stream (the user's streams are never touched or waited for), a busy
// kernel keeps the stream occupied so that [event, empty kernel, event] are queued back to back,
// seven times; the floor is the shortest of those event pairs. resolve_known() then moves each stage's
// enter time later and its exit time earlier by half the floor, so a stage reads the span of its
// work (first kernel start to last kernel end, approximately), the way a profiler reads kernels.
// CUDA only (the kernel is PTX, JIT-compiled by the driver); HIP: floor 0 (raw event times).
// Two headers: the first JITs on any GPU since Maxwell; should a future driver refuse that old
// target, the second (PTX ISA 8.0, sm_90) is tried.
const char* const kSpinPtxHeads[] = {".version 6.0\n.target sm_50\n", ".version 8.0\n.target sm_90\n"};
const char kSpinPtx[] =
    ".address_size 64\n"
    ".visible .entry maxinstr_spin(.param .u64 maxinstr_spin_ns)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [maxinstr_spin_ns];\n"
    "  mov.u64 %rd2, %globaltimer;\n"
    "$L_spin:\n"
    "  mov.u64 %rd3, %globaltimer;\n"
    "  sub.s64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p1, %rd4, %rd1;\n"
    "  @%p1 bra $L_spin;\n"
    "  ret;\n"
    "}\n";

constexpr int kFloorRuns = 7;
constexpr int64_t kFloorMaxNs = 50000;  // a floor above this is not the front end: not used

// Returns the floor in ns, or -1 (one line in errors()) when it could not be measured. Uses its
// own 14 events (created and destroyed here, never from the pool) and its own stream. The
// minimum of the 7 pairs is taken: other work can only make a pair longer (e.g. kernels of a
// user's non-blocking stream holding every SM), never shorter.
int64_t ctx_measure_floor() {
  GpuApi& a = g.gpu;
  if (a.backend != BK_CUDA || !a.mod_load || !a.mod_func || !a.launch || !a.stream_create) return -1;
  RelaxedCapture relaxed;
  void* mod = nullptr;
  void* fn = nullptr;
  void* st = nullptr;
  void* ev[2 * kFloorRuns];
  int nev = 0;
  int64_t result = -1;
  std::string why;
  int rc = -1;
  for (const char* head : kSpinPtxHeads) {
    std::string ptx = std::string(head) + kSpinPtx;
    rc = a.mod_load(&mod, ptx.c_str());
    if (rc == 0) break;
    mod = nullptr;
  }
  if (rc == 0) rc = a.mod_func(&fn, mod, "maxinstr_spin");
  if (rc == 0) rc = a.stream_create(&st, 1 /* CU_STREAM_NON_BLOCKING */);
  if (rc != 0) why = "kernel setup";
  for (int i = 0; rc == 0 && i < 2 * kFloorRuns; i++) {
    rc = a.ev_create(&ev[i], 0);
    if (rc != 0)
      why = "event create";
    else
      nev++;
  }
  int launched = 0;
  for (int i = 0; rc == 0 && i < kFloorRuns; i++) {
    unsigned long long busy = 40000, none = 0;  // ns: 40 us covers the host cost of the next 3 calls
    void* pb[] = {&busy};
    void* pn[] = {&none};
    rc = a.launch(fn, 1, 1, 1, 1, 1, 1, 0, st, pb, nullptr);
    if (rc == 0) rc = a.ev_record(ev[2 * i], st);
    if (rc == 0) rc = a.launch(fn, 1, 1, 1, 1, 1, 1, 0, st, pn, nullptr);
    if (rc == 0) rc = a.ev_record(ev[2 * i + 1], st);
    if (rc != 0)
      why = "launch/record";
    else
      launched++;
  }
  if (launched > 0) {  // wait for what was queued (also before destroying anything on failure)
    int r = a.ev_sync(ev[2 * launched - 1]);
    if (rc == 0 && r != 0) {
      rc = r;
      why = "synchronize";
    }
  }
  if (rc == 0) {
    int64_t best = INT64_MAX;
    for (int i = 0; i < kFloorRuns; i++) {
      float ms = 0.f;
      int r = a.ev_elapsed(&ms, ev[2 * i], ev[2 * i + 1]);
      if (r != 0) {
        rc = r;
        why = "elapsed time";
        break;
      }
      int64_t v = (int64_t)llround((double)ms * 1e6);
      if (v < best) best = v;
    }
    if (rc == 0) {
      if (best > kFloorMaxNs) {
        why = "implausible floor " + std::to_string(best) + " ns";
      } else {
        result = best < 0 ? 0 : best;
      }
    }
  }
  if (result < 0)
    add_error("GPU floor calibration failed (" + why + ", status " + std::to_string(rc) +
              "): GPU times are raw event pairs for this context");
  if (a.ev_destroy)
    for (int i = 0; i < nev; i++) a.ev_destroy(ev[i]);
  if (st && a.stream_destroy) a.stream_destroy(st);
  if (mod && a.mod_unload) a.mod_unload(mod);
  return result;
}

void ctx_calibrate(int c) {
  Ctx& cx = g.ctxs[(size_t)c];
  if (g.gpu.backend == BK_CUDA && g.gpu.ctx_device) {
    int d = -1;
    if (g.gpu.ctx_device(&d) == 0) g.ctxs[(size_t)c].device = d;
  }
  if (cx.floor_state != 0) return;
  if (g.floor_fixed >= 0) {
    cx.floor_ns = g.floor_fixed;
    cx.floor_state = 2;
    return;
  }
  if (g.gpu.backend != BK_CUDA) return;  // HIP: not calibrated (state "none"), raw event pairs
  tls_core_gpu_work++;
  int64_t f = ctx_measure_floor();
  tls_core_gpu_work--;
  Ctx& cy = g.ctxs[(size_t)c];
  cy.floor_ns = f < 0 ? 0 : f;
  cy.floor_state = f < 0 ? -1 : 1;
}

// Index of the context state for key (the current context), creating it on first use; -1 when
// its reference pairing failed.
int ctx_index(void* key) {
  int found = -1;
  if (g.last_ctx >= 0 && g.ctxs[(size_t)g.last_ctx].key == key) {
    found = g.last_ctx;
  } else {
    for (size_t i = 0; i < g.ctxs.size(); i++)
      if (g.ctxs[i].key == key) found = (int)i;
  }
  if (found >= 0) {
    g.last_ctx = found;
    Ctx& cx = g.ctxs[(size_t)found];
    if (LIKELY(cx.ok)) return found;
    // The pairing failed (e.g. a graph capture was running): try again at most once a second.
    int64_t t = now_ns();
    if (t < cx.retry_ns) return -1;
    cx.ok = ctx_pair_reference(found);
    if (!cx.ok) g.ctxs[(size_t)found].retry_ns = t + 1000000000LL;
    else ctx_calibrate(found);
    return g.ctxs[(size_t)found].ok ? found : -1;
  }
  Ctx cx;
  cx.key = key;
  g.ctxs.push_back(cx);
  int c = (int)g.ctxs.size() - 1;
  g.last_ctx = c;
  g.ctxs[(size_t)c].ok = ctx_pair_reference(c);
  if (!g.ctxs[(size_t)c].ok) g.ctxs[(size_t)c].retry_ns = now_ns() + 1000000000LL;
  else ctx_calibrate(c);
  return g.ctxs[(size_t)c].ok ? c : -1;
}

constexpr int64_t kBudgetCreditNs = 250000;  // the first 0.25 ms of event work (~150 events) are always spent

// Whether the budget leaves a new top-level stage untimed (at host time t).
inline bool budget_skips(int64_t t) {
  if (g.gpu_budget <= 0 || g.gpu_budget_t0 == 0) return false;
  double allowed = g.gpu_budget * (double)(t - g.gpu_budget_t0) + (double)kBudgetCreditNs;
  return (double)g.gpu_cost_ns > allowed;
}

// One stage boundary (enter or exit) on `stream`: returns a slot holding one reference for the
// caller, or -1 (no event: pool exhausted or driver error).
//
// Boundary sharing: if this thread's previous boundary on the same stream and context was less
// than share_ns ago (host clock), its event is reused instead of recording a new one. Submitting
// GPU work (a kernel launch, a copy, an event record) costs the host more than ~1 us, so no work
// of this thread can sit between two boundaries that close: the stream position is the same, and
// one event stands for both. This turns the exit of a stage and the enter of its next sibling (or
// a parent's enter and its first child's enter) into one event. Work submitted to the same stream
// by *another* thread inside that window would be missed; see docs/stage-core.md.
int gpu_point(ThreadState* ts, int c, uint64_t stream, int64_t t_now, int may_create) {
  Boundary* b = nullptr;
  for (auto& x : ts->bnd)
    if (x.slot >= 0 && x.stream == stream && x.ctx == c) {
      b = &x;
      break;
    }
  if (b && t_now - b->t_ns < g.share_ns) {
    g.slots[(size_t)b->slot].ref++;
    b->t_ns = t_now;
    g.events_shared++;
    return b->slot;
  }
  if (g.gpu.is_capturing) {
    // A stream capturing a graph would take our event record into the graph (no timestamp),
    // and the legacy stream cannot be used while a blocking stream captures: no GPU time then.
    int status = 0;
    int rc;
    {
      DrvTime dt(DRV_CAPTURING);
      rc = g.gpu.is_capturing((void*)(uintptr_t)stream, &status);
    }
    if (rc != 0 || status != 0) {
      g.events_capture++;
      return -1;
    }
  }
  int s = slot_alloc(c, may_create);
  if (s < 0) {
    g.events_dropped++;
    return -1;
  }
  int rc;
  {
    DrvTime dt(DRV_RECORD);
    rc = g.gpu.ev_record(g.slots[(size_t)s].ev, (void*)(uintptr_t)stream);
  }
  if (rc != 0) {
    add_error("event record failed (status " + std::to_string(rc) + "): stage keeps host times only");
    slot_release(s);
    g.events_dropped++;
    return -1;
  }
  g.events_recorded++;
  g.slots[(size_t)s].rec_seq = ++g.record_seq;
  g.slots[(size_t)s].host_ns = kUnplaced;
  if (!b) {
    b = &ts->bnd[ts->bnd_next];
    ts->bnd_next = (ts->bnd_next + 1) % kBoundaries;
  }
  slot_release(b->slot);
  g.slots[(size_t)s].ref++;
  int64_t t_after = now_ns();
  if (UNLIKELY(g.gpu_budget_t0 == 0)) g.gpu_budget_t0 = t_now;
  g.gpu_cost_ns += t_after - t_now;
  *b = Boundary{stream, c, s, t_after};
  return s;
}

#include "placer.h"  // cuEventElapsedTime off the program's threads

// Host-clock time of a completed event: computed once per recording (cached in the slot) as
// anchor + elapsed(anchor, event). With sibling boundaries shared, a stage's enter event is the
// previous stage's exit event, already placed: one cuEventElapsedTime per event, not two per
// stage. The anchor is the newest placed event of the context, so the float milliseconds stay
// small and keep ~ns precision. Returns the driver status (0 ok, 600 not ready).
int slot_place(Ctx& cx, int s, int64_t* out) {
  Slot& sl = g.slots[(size_t)s];
  if (sl.host_ns != kUnplaced) {
    *out = sl.host_ns;
    return 0;
  }
  if (g.place_async && placer::stage(cx, s)) return placer::kDeferred;
  float ms = 0.f;
  g.event_elapsed++;
  DrvTime dt(DRV_ELAPSED);
  int rc = g.gpu.ev_elapsed(&ms, g.slots[(size_t)cx.anchor].ev, sl.ev);
  if (rc != 0) return rc;
  sl.host_ns = cx.anchor_ns + (int64_t)llround((double)ms * 1e6);
  *out = sl.host_ns;
  return 0;
}

// Releases p's events and hands its record (and attrs) to the done queue. Always 1: resolved.
int finish_pending(Pending& p) {
  slot_release(p.ev0);
  slot_release(p.ev1);
  push_done(p.rec, p.attrs);
  Py_XDECREF(p.attrs);
  p.attrs = nullptr;
  return 1;
}

// Resolves p whose exit event is known complete (queried by the caller, or implied by a later
// event of the same stream). 1: resolved (record moved to done, events released); 0: not ready.
int resolve_known(Pending& p) {
  Ctx& cx = g.ctxs[(size_t)p.ctx];
  int64_t t0 = 0, t1 = 0;
  int rc0 = slot_place(cx, p.ev0, &t0);
  int rc1 = (rc0 == 0 || rc0 == placer::kDeferred) ? slot_place(cx, p.ev1, &t1) : rc0;
  if (rc0 == placer::kDeferred || rc1 == placer::kDeferred) return 0;  // placed at a later pass
  int rc = rc0 ? rc0 : rc1;
  if (rc == 600) return 0;  // not complete after all (another thread's event on the stream)
  if (rc == 0) {
    // Take out the floor (ctx_calibrate): enter later and exit earlier by half of it each, so
    // shared boundaries map to the same points and nesting is kept. A stage shorter than the
    // floor (no kernel in it) reads 0 at the middle of its events.
    int64_t f = cx.floor_ns;
    if (t1 - t0 >= f) {
      p.rec.gpu_start_ns = t0 + f / 2;
      p.rec.gpu_end_ns = t1 - (f - f / 2);
    } else {
      p.rec.gpu_start_ns = p.rec.gpu_end_ns = t0 + (t1 - t0) / 2;
    }
    p.rec.flags |= F_GPU_TIMED;
    if (t1 >= cx.anchor_ns) {  // the newest placed event becomes the anchor
      g.slots[(size_t)p.ev1].ref++;
      slot_release(cx.anchor);
      cx.anchor = p.ev1;
      cx.anchor_ns = t1;
    }
  } else {
    add_error("event elapsed-time failed (status " + std::to_string(rc) + ")");
    p.rec.flags |= F_GPU_DROPPED;
    g.events_dropped++;
  }
  return finish_pending(p);
}

// p's exit event failed to query with status rc: the record keeps its host times only.
int resolve_failed(Pending& p, int rc) {
  add_error("event query failed (status " + std::to_string(rc) + ")");
  p.rec.flags |= F_GPU_DROPPED;
  g.events_dropped++;
  return finish_pending(p);
}

inline size_t pending_count() { return g.pending.size(); }

// Work on one stream completes in order: once an exit event of a (context, stream) is complete,
// every record of that stream recorded no later (rec_seq) is complete too, and needs no query of
// its own. A pass finds, per stream, the newest complete exit among the records it looks at: one
// query of the newest (enough when the GPU has caught up), else a binary search over the older
// ones (about log2(n) queries). Under load a query costs far more than on an idle GPU (1.3 us
// against 0.3 us on an H200 busy with launches), and asking each record in turn made it ~1 query
// per stage.
struct StreamDone {
  int ctx;
  uint64_t stream;
  std::vector<size_t> idx;  // positions in g.pending of this stream's records, in queue order
  uint64_t done_seq;        // records with exit rec_seq <= done_seq are complete
  int err;                  // a query of err_slot failed with this status (that record is dropped)
  int err_slot;
};

inline int query_exit(size_t i, bool block) {
  g.event_queries++;
  DrvTime dt(DRV_QUERY);
  void* ev = g.slots[(size_t)g.pending[i].ev1].ev;
  return block ? g.gpu.ev_sync(ev) : g.gpu.ev_query(ev);
}

inline uint64_t exit_seq(size_t i) { return g.slots[(size_t)g.pending[i].ev1].rec_seq; }

void scan_streams(std::vector<StreamDone>& sd, size_t m, bool block) {
  for (size_t i = 0; i < m; i++) {
    Pending& p = g.pending[i];
    StreamDone* d = nullptr;
    for (auto& x : sd)
      if (x.ctx == p.ctx && x.stream == p.stream) {
        d = &x;
        break;
      }
    if (!d) {
      sd.push_back(StreamDone{p.ctx, p.stream, {}, 0, 0, -1});
      d = &sd.back();
    }
    d->idx.push_back(i);
  }
  for (auto& d : sd) {
    // exit events of one stream were recorded in queue order: rec_seq grows along idx
    size_t last = d.idx.back();
    int rc = query_exit(last, block);
    if (rc == 0) {
      d.done_seq = exit_seq(last);
      continue;
    }
    if (rc != 600) {  // that record is dropped; the older ones are searched below
      d.err = rc;
      d.err_slot = g.pending[last].ev1;
    }
    // largest k in [0, n-2] whose exit is complete (lo = -1: none); the oldest first, so a
    // pass with nothing complete costs two queries, not a whole search
    long lo = -1, hi = (long)d.idx.size() - 2;
    if (hi >= 0) {
      int r = query_exit(d.idx[0], false);
      if (r == 0) {
        lo = 0;
      } else {
        if (r != 600 && !d.err) {
          d.err = r;
          d.err_slot = g.pending[d.idx[0]].ev1;
        }
        hi = -1;
      }
    }
    while (lo < hi) {
      long mid = (lo + hi + 1) / 2;
      int r = query_exit(d.idx[(size_t)mid], false);
      if (r == 0) {
        lo = mid;
      } else {
        if (r != 600 && !d.err) {
          d.err = r;
          d.err_slot = g.pending[d.idx[(size_t)mid]].ev1;
        }
        hi = mid - 1;
      }
    }
    d.done_seq = lo >= 0 ? exit_seq(d.idx[(size_t)lo]) : 0;
  }
}

// 1: p resolved (known complete, or its query failed in the scan); 0: not ready.
inline int resolve_scanned(StreamDone* d, Pending& p) {
  if (!d) return 0;
  if (d->err && p.ev1 == d->err_slot) {
    int rc = d->err;
    d->err = 0;
    return resolve_failed(p, rc);
  }
  if (g.slots[(size_t)p.ev1].rec_seq <= d->done_seq) return resolve_known(p);
  return 0;
}

inline StreamDone* find_stream(std::vector<StreamDone>& sd, const Pending& p) {
  for (auto& x : sd)
    if (x.ctx == p.ctx && x.stream == p.stream) return &x;
  return nullptr;
}

// Resolves up to n records from the front of the queue, stopping at the first not ready.
// Hands the events of the complete records among pending[from, to) to the placer.
void stage_complete(std::vector<StreamDone>& sd, size_t from, size_t to) {
  int64_t t = 0;
  for (size_t i = from; i < to && i < g.pending.size(); i++) {
    Pending& p = g.pending[i];
    StreamDone* d = find_stream(sd, p);
    if (!d || g.slots[(size_t)p.ev1].rec_seq > d->done_seq) continue;
    Ctx& cx = g.ctxs[(size_t)p.ctx];
    slot_place(cx, p.ev0, &t);
    slot_place(cx, p.ev1, &t);
  }
}

// Resolves up to n records from the front of the queue, stopping at the first not ready. With
// `async` (and the placer usable), events not placed yet go to the placer (this and the
// following complete records) and their records wait for a later pass; without, they are placed
// here (the pool needs its events back now).
size_t resolve_front(size_t n, bool async) {
  if (g.pending.empty()) return 0;
  DrvTime dt(DRV_RESOLVE);
  RelaxedCapture relaxed;
  if (async) placer::consume();
  else placer::wait_idle();  // the pool needs events back: nothing measured twice meanwhile
  g.place_async = async && placer::usable();
  size_t m = n < g.pending.size() ? n : g.pending.size();
  std::vector<StreamDone> sd;
  scan_streams(sd, m, false);
  size_t k = 0;
  while (k < m && !g.pending.empty()) {
    Pending& p = g.pending.front();
    if (!resolve_scanned(find_stream(sd, p), p)) break;
    g.pending.pop_front();
    k++;
  }
  if (g.place_async) {
    stage_complete(sd, 0, m - k);
    g.place_async = false;
    placer::submit();
  }
  return k;
}

// Resolves every finished record (block: waits for all). Records not complete, or (defer)
// waiting for the placer, stay queued in their order; the others are finished in this pass.
size_t resolve_all(bool block, bool defer = false) {
  RelaxedCapture relaxed;
  size_t k = 0;
  if (defer && !block && placer::usable()) {
    placer::consume();
    g.place_async = true;
  } else {
    placer::wait_idle();  // inline placement: nothing of ours in flight meanwhile
  }
  std::vector<StreamDone> sd;
  scan_streams(sd, g.pending.size(), block);
  std::deque<Pending> keep;
  for (Pending& p : g.pending) {
    if (resolve_scanned(find_stream(sd, p), p)) {
      k++;
      continue;
    }
    keep.push_back(p);
  }
  g.pending.swap(keep);
  if (g.place_async) {
    g.place_async = false;
    placer::submit();
  }
  return k;
}

// ---------------------------------------------------------------------------------------------
// The Stage type
// ---------------------------------------------------------------------------------------------
enum : uint8_t { ST_IDLE = 0, ST_OPEN = 1, ST_ZOMBIE = 2 };

// A bound __enter__/__exit__ embedded in its Stage (see BoundDescr below).
struct BoundObject {
  PyObject_HEAD
  PyObject* owner;
  vectorcallfunc vc;
};

struct StageObject {
  PyObject_HEAD
  BoundObject b_enter;
  BoundObject b_exit;
  PyObject* name;   // str
  PyObject* attrs;  // dict or NULL
  int64_t step_arg;  // -1: inherit
  uint64_t stream;
  int8_t gpu_mode;  // -1 auto, 0 off, 1 on
  uint8_t state;
  int32_t gpu_ctx;  // -1: no GPU timing for the open record
  int32_t ev0;
  uint32_t gen;
  uint8_t cupti_pushed;  // this stage pushed its id on CUPTI's external-correlation stack
  ThreadState* ts;
  Record rec;
};

PyTypeObject StageType;
PyTypeObject NoopType;
PyTypeObject BoundType;
PyTypeObject BoundDescrType;
PyObject* g_noop = nullptr;
PyObject* g_wrap = nullptr;  // maxinstr.record.stage.wrap, imported on first decorator use
PyObject *s_stream, *s_gpu, *s_step;

constexpr int kFreeMax = 256;
StageObject* g_free[kFreeMax];
int g_nfree = 0;

PyObject* bound_enter_vc(PyObject* b, PyObject* const* args, size_t nargsf, PyObject* kw);
PyObject* bound_exit_vc(PyObject* b, PyObject* const* args, size_t nargsf, PyObject* kw);

StageObject* stage_alloc() {
  StageObject* s;
  if (LIKELY(g_nfree > 0)) {
    s = g_free[--g_nfree];
    PyObject_Init((PyObject*)s, &StageType);
  } else {
    s = PyObject_New(StageObject, &StageType);
    if (!s) return nullptr;
  }
  // Zero the embedded objects' headers first. Not Py_SET_REFCNT(b, 0): on Python >= 3.12 it does
  // nothing when the refcount already reads as immortal, and fresh memory holds whatever was
  // there before. Such a bound object then took no reference on its Stage (descr_get saw a
  // nonzero count), so `with stage("x"):` freed the Stage while it was open; with several threads
  // it was handed out again and freed twice (SIGSEGV on the H200, tests/core/test_stage_lifetime.py).
  memset((void*)&s->b_enter, 0, sizeof(BoundObject));
  memset((void*)&s->b_exit, 0, sizeof(BoundObject));
  PyTypeObject* bt = &BoundType;
  Py_SET_TYPE((PyObject*)&s->b_enter, bt);
  s->b_enter.owner = (PyObject*)s;
  s->b_enter.vc = bound_enter_vc;
  Py_SET_TYPE((PyObject*)&s->b_exit, bt);
  s->b_exit.owner = (PyObject*)s;
  s->b_exit.vc = bound_exit_vc;
  s->name = nullptr;
  s->attrs = nullptr;
  s->step_arg = -1;
  s->stream = 0;
  s->gpu_mode = -1;
  s->state = ST_IDLE;
  s->gpu_ctx = -1;
  s->ev0 = -1;
  s->gen = g.fork_gen;
  s->cupti_pushed = 0;
  s->ts = nullptr;
  s->rec.id = 0;
  s->rec.name_id = -1;
  return s;
}

void stage_dealloc(PyObject* o) {
  StageObject* s = (StageObject*)o;
  Py_CLEAR(s->name);
  Py_CLEAR(s->attrs);
  if (g_nfree < kFreeMax)
    g_free[g_nfree++] = s;
  else
    PyObject_Free(o);
}

// CUPTI external correlation: every CUDA API call made while the stage is the innermost one on
// its thread is tagged with the stage's record id (one push at enter, one pop at exit).
inline void cupti_enter(StageObject* s, int64_t id) {
  if (g.cupti_on) {
    if (LIKELY(g.cupti_push(g.cupti_kind, (uint64_t)id) == 0)) {
      s->cupti_pushed = 1;
      g.cupti_pushes++;
    } else {
      g.cupti_errors++;
    }
  }
}

inline void cupti_exit(StageObject* s) {
  if (s->cupti_pushed) {
    uint64_t last = 0;
    if (UNLIKELY(g.cupti_pop(g.cupti_kind, &last) != 0)) g.cupti_errors++;
    s->cupti_pushed = 0;
  }
}

inline StageObject* innermost_open(ThreadState* ts) {
  for (size_t i = ts->stack.size(); i > 0; i--) {
    StageObject* s = ts->stack[i - 1];
    if (s->state == ST_OPEN) return s;
  }
  return nullptr;
}

// Pops closed-but-still-pushed stages ("zombies") off the top of this thread's stack, ending
// their marker ranges. Only ever called on the stack's own thread (markers are per thread).
inline void pop_zombies(ThreadState* ts) {
  while (!ts->stack.empty() && ts->stack.back()->state == ST_ZOMBIE) {
    StageObject* z = ts->stack.back();
    ts->stack.pop_back();
    cupti_exit(z);
    marker_pop();
    z->state = ST_IDLE;
    Py_DECREF(z);
  }
}

PyObject* stage_enter(PyObject* o, PyObject*) {
  StageObject* s = (StageObject*)o;
  if (UNLIKELY(s->state != ST_IDLE && s->gen == g.fork_gen)) {
    PyErr_SetString(PyExc_RuntimeError, "this stage is already entered; create a new one with maxinstr.stage()");
    return nullptr;
  }
  ThreadState* ts = get_ts();
  if (UNLIKELY(!ts->stack.empty() && ts->stack.back()->state == ST_ZOMBIE)) pop_zombies(ts);
  StageObject* parent = innermost_open(ts);
  Record& r = s->rec;
  r.id = next_id();
  r.tid = ts->tid;
  r.gpu_start_ns = -1;
  r.gpu_end_ns = -1;
  r.flags = 0;
  if (parent) {
    r.parent_id = parent->rec.id;
    r.depth = (int16_t)(parent->rec.depth + 1);
    r.step = s->step_arg >= 0 ? s->step_arg : parent->rec.step;
  } else {
    r.parent_id = -1;
    r.depth = 0;
    r.step = s->step_arg;
  }
  s->state = ST_OPEN;
  s->gen = g.fork_gen;
  s->ts = ts;
  s->gpu_ctx = -1;
  s->ev0 = -1;
  Py_INCREF(o);
  ts->stack.push_back(s);
  // The context is looked up (and, the first time, paired and calibrated) before the range is
  // pushed, so the calibration kernels never sit inside a stage's range in a trace.
  void* key = nullptr;
  int c = -1;
  // The budget decides once per top-level stage; its children follow it (a step is timed whole).
  if (!parent) ts->gpu_skip = g.gpu_budget_t0 != 0 && g.gpu_budget > 0 && budget_skips(now_ns());
  bool timed = s->gpu_mode == 1 || (s->gpu_mode == -1 && !ts->gpu_skip);
  if (s->gpu_mode == -1 && !timed) {
    r.flags |= F_GPU_SAMPLED_OUT;
    g.gpu_sampled_out++;
  }
  if (timed && !g.gpu_off_after_fork) {
    gpu_try_load();
    key = g.gpu.backend ? gpu_current_key() : nullptr;
    if (key) c = ctx_index(key);
  }
  marker_push(r.name_id, r.id);
  cupti_enter(s, r.id);
  if (timed && !g.gpu_off_after_fork) {
    if (key) {
      if (c >= 0) {
        int64_t t = now_ns();
        int ev = gpu_point(ts, c, s->stream, t, 1);
        if (ev >= 0) {
          s->ev0 = ev;
          s->gpu_ctx = c;
        } else {
          r.flags |= F_GPU_DROPPED;
        }
      }
    } else if (s->gpu_mode == 1 && !g.warned_no_ctx) {
      g.warned_no_ctx = true;
      add_error(g.gpu.backend ? "gpu=True but no GPU context is current on this thread: host times only"
                              : "gpu=True but no CUDA/HIP driver could be loaded: host times only");
    }
  }
  r.host_start_ns = now_ns();
  Py_INCREF(o);
  return o;
}

inline bool json_scalar(PyObject* v) {
  return v == Py_None || PyUnicode_CheckExact(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v) || PyBool_Check(v);
}

// What a record keeps of `attrs` (a new reference, or NULL for nothing): the dict itself when
// every value is what JSON holds as is, else the hook's plain-data copy, so the record holds no
// reference to the caller's objects (a 50 MB array passed as an attr is not kept alive). Runs
// Python only for attrs with other values. Never leaves an exception set: a failing hook means
// the attrs are not kept, and counted.
PyObject* record_attrs(PyObject* attrs) {
  if (!attrs || PyDict_GET_SIZE(attrs) == 0) return nullptr;
  Py_ssize_t pos = 0;
  PyObject *k, *v;
  bool simple = true;
  while (PyDict_Next(attrs, &pos, &k, &v))
    if (!json_scalar(v)) {
      simple = false;
      break;
    }
  if (simple || !g.attrs_hook) {
    Py_INCREF(attrs);
    return attrs;
  }
  PyObject* out = PyObject_CallOneArg(g.attrs_hook, attrs);
  if (!out || !PyDict_Check(out)) {
    Py_XDECREF(out);
    PyErr_Clear();
    g.attrs_unconverted++;
    return nullptr;
  }
  return out;
}

// Finishes s's record at host time t (GPU exit event, then pending or done). Stack untouched.
void stage_finish(StageObject* s, int64_t t, uint16_t flags, PyObject* attrs_override) {
  Record& r = s->rec;
  r.host_end_ns = t;
  r.flags |= flags;
  PyObject* attrs = attrs_override ? attrs_override : s->attrs;
  if (s->gpu_ctx >= 0 && s->ev0 >= 0) {
    int ev1 = -1;
    if (!(flags & F_UNCLOSED)) ev1 = gpu_point(s->ts == tls_ts ? s->ts : get_ts(), s->gpu_ctx, s->stream, t, 2);
    if (ev1 >= 0) {
      Py_XINCREF(attrs);
      g.pending.push_back(Pending{r, s->ev0, ev1, s->gpu_ctx, s->stream, attrs});
      s->ev0 = -1;
      s->gpu_ctx = -1;
      // Opportunistic, small and non-blocking: most resolution happens in resolve(), called
      // by the session's drain loop.
      // One scan query per stream resolves a whole batch (resolve_front), so batches are large
      // and rare: every 32nd GPU exit, or every 8th while more than a quarter of the pool waits.
      uint64_t x = ++g.gpu_exits;
      if ((x & 31) == 0 || ((x & 7) == 0 && (int)pending_count() * 4 > g.pool_max)) {
        int64_t t0 = now_ns();
        resolve_front(64, (int)pending_count() * 4 <= g.pool_max);  // under pool pressure: inline
        g.gpu_cost_ns += now_ns() - t0;
      }
      return;
    }
    slot_release(s->ev0);
    s->ev0 = -1;
    s->gpu_ctx = -1;
    if (!(flags & F_UNCLOSED)) r.flags |= F_GPU_DROPPED;
  }
  push_done(r, attrs);
}

PyObject* stage_exit(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  int64_t t = now_ns();
  StageObject* s = (StageObject*)o;
  if (UNLIKELY(s->state != ST_OPEN || s->gen != g.fork_gen)) Py_RETURN_FALSE;  // closed by close_open / fork
  if (s->attrs) {
    PyObject* kept = record_attrs(s->attrs);
    Py_SETREF(s->attrs, kept);
    // the hook ran Python (a user's __str__, a signal handler): the stage may be closed by now
    if (UNLIKELY(s->state != ST_OPEN || s->gen != g.fork_gen)) Py_RETURN_FALSE;
  }
  uint16_t flags = (nargs > 0 && args[0] != Py_None) ? F_EXCEPTION : 0;
  stage_finish(s, t, flags, nullptr);
  ThreadState* ts = s->ts;
  if (LIKELY(ts == tls_ts && ts->stack.back() == s)) {
    ts->stack.pop_back();
    cupti_exit(s);
    marker_pop();
    s->state = ST_IDLE;
    if (UNLIKELY(!ts->stack.empty() && ts->stack.back()->state == ST_ZOMBIE)) pop_zombies(ts);
    Py_DECREF(o);  // the caller still holds a reference
  } else {
    // Exited out of order (an outer stage closed before an inner one, interleaved tasks) or on
    // another thread than it entered: the record is complete now, but its marker range stays
    // pushed on the entering thread until everything above it there is popped (markers are
    // per-thread LIFO stacks; popping now would end someone else's range).
    s->state = ST_ZOMBIE;
  }
  Py_RETURN_FALSE;
}

PyObject* stage_call(PyObject* o, PyObject* args, PyObject* kwargs) {
  // Decorator use: @stage("name") -> maxinstr.record.stage.wrap(stage, func)
  if (!g_wrap) {
    PyObject* m = PyImport_ImportModule("maxinstr.record.stage");
    if (!m) return nullptr;
    g_wrap = PyObject_GetAttrString(m, "wrap");
    Py_DECREF(m);
    if (!g_wrap) return nullptr;
  }
  if (kwargs && PyDict_GET_SIZE(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "a stage used as a decorator takes the function only");
    return nullptr;
  }
  if (PyTuple_GET_SIZE(args) != 1 || !PyCallable_Check(PyTuple_GET_ITEM(args, 0))) {
    PyErr_SetString(PyExc_TypeError, "a stage used as a decorator takes one callable");
    return nullptr;
  }
  return PyObject_CallFunctionObjArgs(g_wrap, o, PyTuple_GET_ITEM(args, 0), nullptr);
}

PyObject* stage_spec(PyObject* o, PyObject*) {
  // (name, kwargs) that recreate this stage: the decorator makes a fresh stage per call.
  StageObject* s = (StageObject*)o;
  PyObject* kw = s->attrs ? PyDict_Copy(s->attrs) : PyDict_New();
  if (!kw) return nullptr;
  PyObject* stream = s->stream ? PyLong_FromUnsignedLongLong(s->stream) : (Py_INCREF(Py_None), Py_None);
  PyObject* gpu = s->gpu_mode < 0 ? Py_None : (s->gpu_mode ? Py_True : Py_False);
  Py_INCREF(gpu);
  PyObject* step = s->step_arg >= 0 ? PyLong_FromLongLong(s->step_arg) : (Py_INCREF(Py_None), Py_None);
  if (!stream || !step || PyDict_SetItem(kw, s_stream, stream) < 0 || PyDict_SetItem(kw, s_gpu, gpu) < 0 ||
      PyDict_SetItem(kw, s_step, step) < 0) {
    Py_XDECREF(stream);
    Py_DECREF(gpu);
    Py_XDECREF(step);
    Py_DECREF(kw);
    return nullptr;
  }
  Py_DECREF(stream);
  Py_DECREF(gpu);
  Py_DECREF(step);
  return Py_BuildValue("(ON)", s->name, kw);
}

PyObject* stage_get_name(PyObject* o, void*) {
  PyObject* n = ((StageObject*)o)->name;
  Py_INCREF(n);
  return n;
}
PyObject* stage_get_id(PyObject* o, void*) { return PyLong_FromLongLong(((StageObject*)o)->rec.id); }
PyObject* stage_get_attrs(PyObject* o, void*) {
  StageObject* s = (StageObject*)o;
  return s->attrs ? PyDict_Copy(s->attrs) : PyDict_New();
}
PyObject* stage_get_open(PyObject* o, void*) {
  StageObject* s = (StageObject*)o;
  return PyBool_FromLong(s->state == ST_OPEN && s->gen == g.fork_gen);
}

PyObject* stage_repr(PyObject* o) {
  StageObject* s = (StageObject*)o;
  return PyUnicode_FromFormat("<maxinstr.stage %R id=%lld%s>", s->name, (long long)s->rec.id,
                              s->state == ST_OPEN ? " open" : "");
}

// `with` looks __enter__/__exit__ up on the type and binds them to the instance, which for a
// C method allocates a bound builtin-method object each time (~20 ns apiece). Instead, each Stage
// embeds its two bound callables, and the type's __enter__/__exit__ are descriptors that hand out
// those embedded objects. An embedded object owns a reference to its Stage exactly while its own
// refcount is above zero (taken on 0 -> 1 in descr_get, given back by its tp_dealloc on 1 -> 0),
// and is never freed on its own: its memory is the Stage's.
PyObject* bound_enter_vc(PyObject* b, PyObject* const* args, size_t nargsf, PyObject* kw) {
  if (PyVectorcall_NARGS(nargsf) != 0 || (kw && PyTuple_GET_SIZE(kw))) {
    PyErr_SetString(PyExc_TypeError, "__enter__() takes no arguments");
    return nullptr;
  }
  return stage_enter(((BoundObject*)b)->owner, nullptr);
}
PyObject* bound_exit_vc(PyObject* b, PyObject* const* args, size_t nargsf, PyObject* kw) {
  if (kw && PyTuple_GET_SIZE(kw)) {
    PyErr_SetString(PyExc_TypeError, "__exit__() takes positional arguments");
    return nullptr;
  }
  return stage_exit(((BoundObject*)b)->owner, args, PyVectorcall_NARGS(nargsf));
}
void bound_dealloc(PyObject* b) {
  // refcount fell to 0: give back the Stage reference taken in descr_get; memory stays.
  Py_DECREF(((BoundObject*)b)->owner);
}
PyObject* bound_repr(PyObject* b) {
  BoundObject* o = (BoundObject*)b;
  return PyUnicode_FromFormat("<bound %s of %R>", o->vc == bound_enter_vc ? "__enter__" : "__exit__", o->owner);
}

struct BoundDescr {
  PyObject_HEAD
  int which;  // 0 enter, 1 exit
};
PyObject* bound_descr_get(PyObject* d, PyObject* obj, PyObject*) {
  if (!obj) {
    Py_INCREF(d);
    return d;
  }
  if (Py_TYPE(obj) != &StageType) {
    PyErr_SetString(PyExc_TypeError, "descriptor for maxinstr Stage objects only");
    return nullptr;
  }
  StageObject* s = (StageObject*)obj;
  PyObject* b = ((BoundDescr*)d)->which ? (PyObject*)&s->b_exit : (PyObject*)&s->b_enter;
  if (Py_REFCNT(b) == 0) {
    Py_INCREF(obj);
    Py_SET_REFCNT(b, 1);
  } else {
    Py_INCREF(b);
  }
  return b;
}

PyMethodDef stage_methods[] = {
#ifdef Py_GIL_DISABLED
    // Free-threaded builds count references differently: plain methods there, no embedding.
    {"__enter__", (PyCFunction)stage_enter, METH_NOARGS, "Open the stage."},
    {"__exit__", (PyCFunction)(void (*)(void))stage_exit, METH_FASTCALL, "Close the stage."},
#endif
    {"_spec", (PyCFunction)stage_spec, METH_NOARGS, "(name, kwargs) recreating this stage."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef stage_getset[] = {{"name", stage_get_name, nullptr, "stage name", nullptr},
                              {"id", stage_get_id, nullptr, "record id of the last enter (0 before)", nullptr},
                              {"attrs", stage_get_attrs, nullptr, "user attributes", nullptr},
                              {"open", stage_get_open, nullptr, "True while entered", nullptr},
                              {nullptr, nullptr, nullptr, nullptr, nullptr}};

// The shared no-op returned by stage() while disabled.
PyObject* noop_exit(PyObject*, PyObject* const*, Py_ssize_t) { Py_RETURN_FALSE; }
PyObject* noop_call(PyObject*, PyObject* args, PyObject* kwargs) {
  // Decorating while disabled returns the function itself: zero cost, decided at decoration.
  if ((kwargs && PyDict_GET_SIZE(kwargs)) || PyTuple_GET_SIZE(args) != 1) {
    PyErr_SetString(PyExc_TypeError, "a stage used as a decorator takes one callable");
    return nullptr;
  }
  PyObject* f = PyTuple_GET_ITEM(args, 0);
  Py_INCREF(f);
  return f;
}
PyObject* noop_repr(PyObject*) { return PyUnicode_FromString("<maxinstr.stage (disabled)>"); }
// __enter__/__exit__ of the no-op are plain builtin functions stored in the type's dict, not
// method descriptors: `with` then finds them without allocating a bound method (two allocations
// saved, ~40 ns of the ~70 ns a disabled `with stage("x"): pass` would otherwise cost).
PyObject* noop_fn_enter(PyObject*, PyObject*) {
  Py_INCREF(g_noop);
  return g_noop;
}
PyMethodDef noop_fn_defs[] = {{"__enter__", (PyCFunction)noop_fn_enter, METH_NOARGS, nullptr},
                              {"__exit__", (PyCFunction)(void (*)(void))noop_exit, METH_FASTCALL, nullptr}};

// ---------------------------------------------------------------------------------------------
// Module functions
// ---------------------------------------------------------------------------------------------
bool parse_stream(PyObject* v, uint64_t* out) {
  if (v == Py_None) {
    *out = 0;
    return true;
  }
  if (PyLong_Check(v)) {
    *out = (uint64_t)PyLong_AsUnsignedLongLongMask(v);
    return !PyErr_Occurred();
  }
  // torch.cuda.Stream.cuda_stream, cupy Stream.ptr, MAX DeviceStream native handle
  static const char* names[] = {"cuda_stream", "ptr", "native_stream_handle", "handle", nullptr};
  for (int i = 0; names[i]; i++) {
    PyObject* h = PyObject_GetAttrString(v, names[i]);
    if (!h) {
      PyErr_Clear();
      continue;
    }
    bool ok = PyLong_Check(h);
    if (ok) *out = (uint64_t)PyLong_AsUnsignedLongLongMask(h);
    Py_DECREF(h);
    if (ok) return !PyErr_Occurred();
  }
  PyErr_Format(PyExc_TypeError,
               "stream must be an int handle (torch: .cuda_stream, CuPy: .ptr, MAX: maxinstr.integrations.max.max_stream_handle(device)) or None, not %.80s",
               Py_TYPE(v)->tp_name);
  return false;
}

inline bool kw_is(PyObject* k, PyObject* interned) {
  return k == interned || PyUnicode_Compare(k, interned) == 0;
}

PyObject* py_stage(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (UNLIKELY(!g.enabled)) {
    Py_INCREF(g_noop);
    return g_noop;
  }
  if (UNLIKELY(nargs != 1)) {
    PyErr_SetString(PyExc_TypeError, "stage(name, *, stream=None, gpu=None, step=None, **attrs)");
    return nullptr;
  }
  PyObject* name = args[0];
  int32_t nid = intern_name(name);
  if (UNLIKELY(nid < 0)) return nullptr;
  StageObject* s = stage_alloc();
  if (!s) return nullptr;
  Py_INCREF(name);
  s->name = name;
  s->rec.name_id = nid;
  if (kwnames) {
    Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nk; i++) {
      PyObject* k = PyTuple_GET_ITEM(kwnames, i);
      PyObject* v = args[nargs + i];
      if (kw_is(k, s_stream)) {
        if (!parse_stream(v, &s->stream)) goto fail;
      } else if (kw_is(k, s_gpu)) {
        if (v == Py_None)
          s->gpu_mode = -1;
        else {
          int t = PyObject_IsTrue(v);
          if (t < 0) goto fail;
          s->gpu_mode = (int8_t)t;
        }
      } else if (kw_is(k, s_step)) {
        if (v == Py_None)
          s->step_arg = -1;
        else {
          long long st = PyLong_AsLongLong(v);
          if (st == -1 && PyErr_Occurred()) goto fail;
          if (st < 0) {
            PyErr_SetString(PyExc_ValueError, "step must be >= 0 or None");
            goto fail;
          }
          s->step_arg = st;
        }
      } else {
        if (!s->attrs && !(s->attrs = PyDict_New())) goto fail;
        if (PyDict_SetItem(s->attrs, k, v) < 0) goto fail;
      }
    }
  }
  return (PyObject*)s;
fail:
  Py_DECREF(s);
  return nullptr;
}

PyObject* py_mark(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (!g.enabled) Py_RETURN_NONE;
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "mark(name, **attrs)");
    return nullptr;
  }
  int32_t nid = intern_name(args[0]);
  if (nid < 0) return nullptr;
  PyObject* attrs = nullptr;
  if (kwnames && PyTuple_GET_SIZE(kwnames)) {
    attrs = PyDict_New();
    if (!attrs) return nullptr;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
      if (PyDict_SetItem(attrs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
        Py_DECREF(attrs);
        return nullptr;
      }
    Py_SETREF(attrs, record_attrs(attrs));
  }
  ThreadState* ts = get_ts();
  StageObject* parent = innermost_open(ts);
  Record r;
  r.id = next_id();
  r.parent_id = parent ? parent->rec.id : -1;
  r.tid = ts->tid;
  r.host_start_ns = r.host_end_ns = now_ns();
  r.gpu_start_ns = r.gpu_end_ns = -1;
  r.step = parent ? parent->rec.step : -1;
  r.name_id = nid;
  r.depth = parent ? (int16_t)(parent->rec.depth + 1) : 0;
  r.flags = F_MARK;
  marker_mark(nid, r.id);
  push_done(r, attrs);
  Py_XDECREF(attrs);
  Py_RETURN_NONE;
}

PyObject* py_clock_ns(PyObject*, PyObject*) { return PyLong_FromLongLong(now_ns()); }

PyObject* py_set_attrs_hook(PyObject*, PyObject* fn) {
  if (fn != Py_None && !PyCallable_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, "_set_attrs_hook(callable or None)");
    return nullptr;
  }
  Py_XSETREF(g.attrs_hook, fn == Py_None ? nullptr : Py_NewRef(fn));
  Py_RETURN_NONE;
}

PyObject* py_set_enabled(PyObject*, PyObject* on) {
  int t = PyObject_IsTrue(on);
  if (t < 0) return nullptr;
  g.enabled = t != 0;
  Py_RETURN_NONE;
}
PyObject* py_is_enabled(PyObject*, PyObject*) { return PyBool_FromLong(g.enabled); }

// Frees the state of threads that have exited with nothing open.
void sweep_threads() {
  size_t w = 0;
  for (size_t i = 0; i < g.threads.size(); i++) {
    ThreadState* ts = g.threads[i];
    if (!ts->alive.load(std::memory_order_acquire) && innermost_open(ts) == nullptr) {
      for (StageObject* z : ts->stack) {
        z->state = ST_IDLE;
        Py_DECREF(z);
      }
      for (auto& b : ts->bnd) slot_release(b.slot);
      delete ts;
      continue;
    }
    g.threads[w++] = ts;
  }
  g.threads.resize(w);
}

// One optional argument, positional or by keyword `name`: the argument or NULL (error set on misuse).
bool one_arg(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, const char* name, PyObject** out) {
  Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  *out = nullptr;
  if (nargs + nk > 1 || (nk == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), name) != 0)) {
    PyErr_Format(PyExc_TypeError, "takes one optional argument: %s", name);
    return false;
  }
  if (nargs + nk == 1) *out = args[0];
  return true;
}

PyObject* py_drain(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  long long maxr = -1;
  PyObject* a = nullptr;
  if (!one_arg(args, nargs, kwnames, "max_records", &a)) return nullptr;
  if (a) {
    maxr = PyLong_AsLongLong(a);
    if (maxr == -1 && PyErr_Occurred()) return nullptr;
  }
  sweep_threads();
  // While the native writer runs it owns the records: drain() returns names and attrs only.
  const bool writer_on = w.running;
  size_t n = writer_on ? 0 : done_count();
  if (maxr >= 0 && (size_t)maxr < n) n = (size_t)maxr;
  PyObject* bytes = PyBytes_FromStringAndSize(n ? (const char*)&g.done[g.done_head] : "", (Py_ssize_t)(n * sizeof(Record)));
  PyObject* names = PyList_New(0);
  PyObject* attrs = PyList_New(0);
  if (!bytes || !names || !attrs) goto fail;
  {
    // Names first seen since the last drain, plus the names of the returned records: every
    // drain is self-contained, whoever else drained before.
    std::vector<char> want(g.names.size(), 0);
    for (size_t i = g.names_reported; i < g.names.size(); i++) want[i] = 1;
    const Record* rows = n ? &g.done[g.done_head] : nullptr;
    for (size_t i = 0; i < n; i++) {
      size_t id = (size_t)rows[i].name_id;
      if (id < want.size()) want[id] = 1;
    }
    for (size_t i = 0; i < want.size(); i++) {
      if (!want[i]) continue;
      PyObject* t = Py_BuildValue("(iO)", (int)i, g.names[i].str);
      if (!t || PyList_Append(names, t) < 0) {
        Py_XDECREF(t);
        goto fail;
      }
      Py_DECREF(t);
    }
  }
  g.names_reported = g.names.size();
  if (!writer_on) {  // the writer moves these (under its lock) while it runs
    g.done_head += n;
    g.done_drained += n;
  }
  while (g.attrs_head < g.attrs.size() && (writer_on || g.attrs[g.attrs_head].done_index < g.done_drained)) {
    AttrEntry& e = g.attrs[g.attrs_head];
    PyObject* t = Py_BuildValue("(LN)", (long long)e.id, e.attrs);  // steals the entry's reference
    e.attrs = nullptr;
    g.attrs_head++;
    if (!t || PyList_Append(attrs, t) < 0) {
      Py_XDECREF(t);
      goto fail;
    }
    Py_DECREF(t);
  }
  if (writer_on) {
    // g.done is the writer's to take and reset
  } else if (g.done_head == g.done.size()) {
    g.done.clear();
    g.done_head = 0;
  } else if (g.done_head > 4096 && g.done_head * 2 > g.done.size()) {
    g.done.erase(g.done.begin(), g.done.begin() + (ptrdiff_t)g.done_head);
    g.done_head = 0;
  }
  if (g.attrs_head == g.attrs.size()) {
    g.attrs.clear();
    g.attrs_head = 0;
  }
  return Py_BuildValue("(NNN)", bytes, names, attrs);
fail:
  Py_XDECREF(bytes);
  Py_XDECREF(names);
  Py_XDECREF(attrs);
  return nullptr;
}

PyObject* py_names(PyObject*, PyObject*) {
  PyObject* out = PyList_New((Py_ssize_t)g.names.size());
  if (!out) return nullptr;
  for (size_t i = 0; i < g.names.size(); i++) {
    PyObject* t = Py_BuildValue("(iO)", (int)i, g.names[i].str);
    if (!t) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, (Py_ssize_t)i, t);
  }
  return out;
}

PyObject* py_resolve(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  int block = 0;
  PyObject* b = nullptr;
  if (!one_arg(args, nargs, kwnames, "block", &b)) return nullptr;
  if (b) {
    block = PyObject_IsTrue(b);
    if (block < 0) return nullptr;
  }
  if (g.gpu.backend == BK_NONE || pending_count() == 0) return PyLong_FromLong(0);
  int64_t t0 = now_ns();
  size_t k = resolve_all(block != 0);
  if (!block) g.gpu_cost_ns += now_ns() - t0;  // the flusher's pass holds the GIL: the program waits
  return PyLong_FromSize_t(k);
}

// resolve_async(): the session flusher's pass. Like resolve(), but events not placed yet go to
// the placer thread (placer.h) and their records are finished by a later pass.
PyObject* py_resolve_async(PyObject*, PyObject*) {
  if (g.gpu.backend == BK_NONE || pending_count() == 0) return PyLong_FromLong(0);
  int64_t t0 = now_ns();
  size_t k = resolve_all(false, true);
  g.gpu_cost_ns += now_ns() - t0;
  return PyLong_FromSize_t(k);
}

PyObject* py_close_open(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* reason = nullptr;
  PyObject* a = nullptr;
  if (!one_arg(args, nargs, kwnames, "reason", &a)) return nullptr;
  if (a) {
    if (!PyUnicode_Check(a)) {
      PyErr_SetString(PyExc_TypeError, "reason must be str");
      return nullptr;
    }
    reason = a;
    Py_INCREF(reason);
  } else {
    reason = PyUnicode_FromString("closed");
    if (!reason) return nullptr;
  }
  int64_t t = now_ns();
  long closed = 0;
  for (ThreadState* ts : g.threads) {
    // innermost first, so each record's end is set before its parent's
    for (size_t i = ts->stack.size(); i > 0; i--) {
      StageObject* s = ts->stack[i - 1];
      if (s->state != ST_OPEN) continue;
      PyObject* a = s->attrs ? PyDict_Copy(s->attrs) : PyDict_New();
      if (!a || PyDict_SetItemString(a, "unclosed", reason) < 0) {
        Py_XDECREF(a);
        Py_DECREF(reason);
        return nullptr;
      }
      stage_finish(s, t, F_UNCLOSED, a);
      Py_DECREF(a);
      s->state = ST_ZOMBIE;
      closed++;
    }
    if (ts == tls_ts) pop_zombies(ts);  // our own thread: end the marker ranges now
  }
  Py_DECREF(reason);
  return PyLong_FromLong(closed);
}

PyObject* py_set_capacity(PyObject*, PyObject* v) {
  long long n = PyLong_AsLongLong(v);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  if (n < 0) {
    PyErr_SetString(PyExc_ValueError, "capacity must be >= 0");
    return nullptr;
  }
  g.capacity = (size_t)n;
  Py_RETURN_NONE;
}

// _configure_events(pool_size=None, share_ns=None): tests and benchmarks only.
PyObject* py_configure_events(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"pool_size", "share_ns", "floor_ns", "gpu_budget", nullptr};
  PyObject *pool = Py_None, *share = Py_None, *floor = Py_None, *budget = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OOOO", (char**)kw, &pool, &share, &floor, &budget)) return nullptr;
  if (budget != Py_None) {  // a new budget counts from now
    double v = PyFloat_AsDouble(budget);
    if (v == -1.0 && PyErr_Occurred()) return nullptr;
    if (!(v >= 0.0 && v <= 1.0)) {
      PyErr_SetString(PyExc_ValueError, "gpu_budget must be a share of wall time in [0, 1] (0: time every stage)");
      return nullptr;
    }
    g.gpu_budget = v;
    g.gpu_cost_ns = 0;
    if (g.gpu_budget_t0) g.gpu_budget_t0 = now_ns();
  }
  if (floor != Py_None) {  // -1: calibrate (contexts met from now on); >= 0: fixed for all contexts
    long long n = PyLong_AsLongLong(floor);
    if (n == -1 && PyErr_Occurred()) return nullptr;
    g.floor_fixed = n < 0 ? -1 : n;
    for (auto& cx : g.ctxs)
      if (n >= 0) {
        cx.floor_ns = n;
        cx.floor_state = 2;
      }
  }
  if (pool != Py_None) {
    long n = PyLong_AsLong(pool);
    if (n == -1 && PyErr_Occurred()) return nullptr;
    if (n < 4) {
      PyErr_SetString(PyExc_ValueError, "pool_size must be >= 4");
      return nullptr;
    }
    g.pool_max = (int)n;
  }
  if (share != Py_None) {
    long long n = PyLong_AsLongLong(share);
    if (n == -1 && PyErr_Occurred()) return nullptr;
    g.share_ns = n;
  }
  return Py_BuildValue("{sisLsLsd}", "pool_size", g.pool_max, "share_ns", (long long)g.share_ns, "floor_ns",
                       (long long)g.floor_fixed, "gpu_budget", g.gpu_budget);
}

PyObject* py_stats(PyObject*, PyObject*) {
  long open_stages = 0;
  for (ThreadState* ts : g.threads)
    for (StageObject* s : ts->stack)
      if (s->state == ST_OPEN) open_stages++;
  PyObject* errs = PyList_New(0);
  if (!errs) return nullptr;
  for (auto& e : g.errors) {
    PyObject* u = PyUnicode_DecodeUTF8(e.data(), (Py_ssize_t)e.size(), "replace");
    if (!u || PyList_Append(errs, u) < 0) {
      Py_XDECREF(u);
      Py_DECREF(errs);
      return nullptr;
    }
    Py_DECREF(u);
  }
  const char* backend = g.gpu.backend == BK_CUDA ? "cuda" : g.gpu.backend == BK_HIP ? "hip" : "none";
  const char* markers = g.markers == MK_NVTX ? "nvtx" : g.markers == MK_ROCTX ? "roctx" : "none";
  PyObject* d = Py_BuildValue(
      "{sKsKsKslsnsKsKsKsisisssssNsLsisssnsOsKsKsn}", "records", (unsigned long long)g.records, "dropped_records",
      (unsigned long long)g.dropped_records, "pending_records", (unsigned long long)writer_done_count(), "open_stages",
      open_stages, "events_in_flight", (Py_ssize_t)pending_count(), "events_dropped",
      (unsigned long long)g.events_dropped, "events_recorded", (unsigned long long)g.events_recorded,
      "events_shared", (unsigned long long)g.events_shared, "event_pool_size", g.pool_total, "event_pool_max",
      g.pool_max, "gpu_backend", backend, "markers", markers, "errors", errs, "event_share_ns",
      (long long)g.share_ns, "gpu_contexts", (int)g.ctxs.size(), "gpu_library", g.gpu.lib_name.c_str(),
      "capacity", (Py_ssize_t)g.capacity, "gpu_off_after_fork", g.gpu_off_after_fork ? Py_True : Py_False,
      "errors_dropped", (unsigned long long)g.errors_dropped, "events_skipped_capture",
      (unsigned long long)g.events_capture, "threads", (Py_ssize_t)g.threads.size());
  if (!d) return nullptr;
  {
    PyObject* b = Py_BuildValue(
        "{sdsLsKsKsKsKsKsK}", "gpu_budget", g.gpu_budget, "gpu_cost_ns", (long long)g.gpu_cost_ns, "gpu_sampled_out",
        (unsigned long long)g.gpu_sampled_out, "event_elapsed_async", (unsigned long long)placer::P.calls.load(),
        "placer_ns", (unsigned long long)placer::P.ns.load(), "placer_batches",
        (unsigned long long)placer::P.batches.load(), "placer_errors", (unsigned long long)placer::P.errors.load(),
        "attrs_unconverted", (unsigned long long)g.attrs_unconverted);
    if (!b || PyDict_Update(d, b) < 0) {
      Py_XDECREF(b);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(b);
  }
  if (g.time_driver) {
    PyObject* t = Py_BuildValue("{sKsKsKsKsK}", "event_record", (unsigned long long)g.drv_ns[DRV_RECORD],
                                "event_query", (unsigned long long)g.drv_ns[DRV_QUERY], "event_elapsed",
                                (unsigned long long)g.drv_ns[DRV_ELAPSED], "stream_is_capturing",
                                (unsigned long long)g.drv_ns[DRV_CAPTURING], "resolve_front",
                                (unsigned long long)g.drv_ns[DRV_RESOLVE]);
    if (!t || PyDict_SetItemString(d, "driver_time_ns", t) < 0) {
      Py_XDECREF(t);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(t);
  }
  // Per context: the GPU-time floor taken out of every stage (docs/stage-core.md) and how it was
  // set: "calibrated", "fixed" (MAXINSTR_GPU_FLOOR_NS), "failed" (raw event times), "none" (HIP,
  // or the context's reference pairing has not succeeded yet).
  PyObject* fl = PyList_New(0);
  PyObject* fs = PyList_New(0);
  if (!fl || !fs) {
    Py_XDECREF(fl);
    Py_XDECREF(fs);
    Py_DECREF(d);
    return nullptr;
  }
  for (auto& cx : g.ctxs) {
    const char* how = cx.floor_state == 1 ? "calibrated" : cx.floor_state == 2 ? "fixed" : cx.floor_state == -1 ? "failed" : "none";
    PyObject* v = PyLong_FromLongLong(cx.floor_ns);
    PyObject* h = PyUnicode_FromString(how);
    if (!v || !h || PyList_Append(fl, v) < 0 || PyList_Append(fs, h) < 0) {
      Py_XDECREF(v);
      Py_XDECREF(h);
      Py_DECREF(fl);
      Py_DECREF(fs);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(v);
    Py_DECREF(h);
  }
  PyObject* q = PyLong_FromUnsignedLongLong(g.event_queries);
  PyObject* e = PyLong_FromUnsignedLongLong(g.event_elapsed);
  if (!q || !e || PyDict_SetItemString(d, "gpu_floor_ns", fl) < 0 || PyDict_SetItemString(d, "gpu_floor", fs) < 0 ||
      PyDict_SetItemString(d, "event_queries", q) < 0 || PyDict_SetItemString(d, "event_elapsed_calls", e) < 0) {
    Py_XDECREF(q);
    Py_XDECREF(e);
    Py_DECREF(fl);
    Py_DECREF(fs);
    Py_DECREF(d);
    return nullptr;
  }
  Py_DECREF(q);
  Py_DECREF(e);
  Py_DECREF(fl);
  Py_DECREF(fs);
  return d;
}

// cupti_link(path, kind) -> bool: take push/pop of CUPTI external correlation ids from the libcupti
// already loaded at `path` (RTLD_NOLOAD: the very instance the Python side initialised) and tag
// stages with kind `kind` from now on. cupti_link(None) stops tagging (stages already tagged still
// pop their id at exit).
PyObject* py_cupti_link(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "cupti_link(path_or_None, kind=0)");
    return nullptr;
  }
  if (args[0] == Py_None) {
    g.cupti_on = false;
    Py_RETURN_TRUE;
  }
  const char* path = PyUnicode_AsUTF8(args[0]);
  if (!path) return nullptr;
  long kind = nargs > 1 ? PyLong_AsLong(args[1]) : 0;
  if (kind == -1 && PyErr_Occurred()) return nullptr;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) {
    add_error(std::string("cupti: ") + path + " is not loaded in this process");
    Py_RETURN_FALSE;
  }
  auto push = (int (*)(int, uint64_t))dlsym(h, "cuptiActivityPushExternalCorrelationId");
  auto pop = (int (*)(int, uint64_t*))dlsym(h, "cuptiActivityPopExternalCorrelationId");
  if (!push || !pop) {
    add_error(std::string("cupti: ") + path + " lacks cuptiActivityPush/PopExternalCorrelationId");
    dlclose(h);
    Py_RETURN_FALSE;
  }
  g.cupti_push = push;  // the handle is kept: libcupti stays loaded for the process's life
  g.cupti_pop = pop;
  g.cupti_kind = (int)kind;
  g.cupti_on = true;
  Py_RETURN_TRUE;
}

PyObject* py_cupti_stats(PyObject*, PyObject*) {
  return Py_BuildValue("{sOsKsK}", "on", g.cupti_on ? Py_True : Py_False, "pushes",
                       (unsigned long long)g.cupti_pushes, "errors", (unsigned long long)g.cupti_errors);
}

#include "cupti_tags.h"  // launch tags through CUPTI's callback API (kernels=True)

// CUPTI activity buffers, handled here (session kernels=True): CUPTI hands completed buffers to
// buffer_completed() on its own thread, or inside cuptiActivityFlushAll; these callbacks never
// touch Python, so they never need the GIL (no callback can deadlock with a thread that holds
// it, and none competes with the program's thread for it). cupti_take(), called from the
// session's flusher thread, copies the completed buffers out with their record offsets
// (walked with cuptiActivityGetNextRecord); the records are turned into rows there, with numpy.
namespace cuptibuf {
typedef int (*register_fn)(void (*)(uint8_t**, size_t*, size_t*), void (*)(void*, uint32_t, uint8_t*, size_t, size_t));
typedef int (*next_fn)(uint8_t*, size_t, void**);
typedef int (*flush_fn)(uint32_t);
struct Done {
  uint8_t* buf;
  size_t valid;
};
std::mutex mu;
std::vector<Done> done;          // completed, not taken yet
std::vector<uint8_t*> spare;     // emptied buffers kept for reuse (at most kSpare)
constexpr size_t kSpare = 4;
size_t buf_bytes = 8u << 20;
size_t max_pending_bytes = 512u << 20;  // completed but not taken: beyond, buffers are dropped (counted)
size_t pending_bytes = 0;
next_fn next = nullptr;
flush_fn flush = nullptr;
std::atomic<uint64_t> requested{0}, completed{0}, alloc_failed{0}, dropped_buffers{0}, dropped_records{0};
std::atomic<uint64_t> walk_errors{0};
bool registered = false;

uint8_t* get_buffer() {
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!spare.empty()) {
      uint8_t* b = spare.back();
      spare.pop_back();
      return b;
    }
  }
  void* p = nullptr;
  if (posix_memalign(&p, 8, buf_bytes) != 0) return nullptr;  // CUPTI wants 8-byte aligned buffers
  return (uint8_t*)p;
}

void put_back(uint8_t* b) {
  std::lock_guard<std::mutex> lk(mu);
  if (spare.size() < kSpare) spare.push_back(b);
  else free(b);
}

size_t count_records(uint8_t* b, size_t valid) {
  size_t n = 0;
  void* rec = nullptr;
  while (next && next(b, valid, &rec) == 0) n++;
  return n;
}

void buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  requested++;
  uint8_t* b = get_buffer();
  if (!b) alloc_failed++;  // CUPTI drops records it has no buffer for and counts them itself
  *buffer = b;
  *size = b ? buf_bytes : 0;
  *max_records = 0;
}

void buffer_completed(void*, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  if (!buffer) return;
  completed++;
  if (valid == 0) {
    put_back(buffer);
    return;
  }
  bool drop = false;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (pending_bytes + valid > max_pending_bytes) drop = true;
    else {
      done.push_back({buffer, valid});
      pending_bytes += valid;
    }
  }
  if (drop) {
    dropped_buffers++;
    dropped_records += count_records(buffer, valid);
    put_back(buffer);
  }
}
}  // namespace cuptibuf

// cupti_buffers(path, buffer_bytes=8 MiB, max_pending_bytes=512 MiB) -> bool: register the
// buffer callbacks above with the libcupti loaded at `path` (the instance cupti-python uses).
PyObject* py_cupti_buffers(PyObject*, PyObject* args) {
  const char* path = nullptr;
  unsigned long long bytes = 8u << 20, pending = 512u << 20;
  if (!PyArg_ParseTuple(args, "s|KK", &path, &bytes, &pending)) return nullptr;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) {
    add_error(std::string("cupti: ") + path + " is not loaded in this process");
    Py_RETURN_FALSE;
  }
  auto reg = (cuptibuf::register_fn)dlsym(h, "cuptiActivityRegisterCallbacks");
  auto next = (cuptibuf::next_fn)dlsym(h, "cuptiActivityGetNextRecord");
  auto flush = (cuptibuf::flush_fn)dlsym(h, "cuptiActivityFlushAll");
  if (!reg || !next || !flush) {
    add_error(std::string("cupti: ") + path + " lacks cuptiActivityRegisterCallbacks/GetNextRecord/FlushAll");
    dlclose(h);
    Py_RETURN_FALSE;
  }
  if (bytes < 4096) bytes = 4096;
  {
    std::lock_guard<std::mutex> lk(cuptibuf::mu);
    if (bytes != cuptibuf::buf_bytes) {  // spare buffers of another size are not reused
      for (uint8_t* b : cuptibuf::spare) free(b);
      cuptibuf::spare.clear();
    }
    cuptibuf::buf_bytes = (size_t)bytes;
    cuptibuf::max_pending_bytes = (size_t)pending;
  }
  cuptibuf::next = next;
  cuptibuf::flush = flush;
  // two buffers made and touched now, so the first ones CUPTI fills (on the program's thread)
  // take no page faults; emptied buffers come back to this pool, already touched
  while (true) {
    {
      std::lock_guard<std::mutex> lk(cuptibuf::mu);
      if (cuptibuf::spare.size() >= 2) break;
    }
    void* p = nullptr;
    if (posix_memalign(&p, 8, cuptibuf::buf_bytes) != 0) break;
    memset(p, 0, cuptibuf::buf_bytes);
    cuptibuf::put_back((uint8_t*)p);
  }
  if (reg(cuptibuf::buffer_requested, cuptibuf::buffer_completed) != 0) {
    add_error(std::string("cupti: cuptiActivityRegisterCallbacks failed in ") + path);
    Py_RETURN_FALSE;
  }
  cuptibuf::registered = true;
  Py_RETURN_TRUE;
}

// cupti_flush(flag=0) -> int: cuptiActivityFlushAll(flag) with the GIL released (completed
// buffers land in the queue cupti_take() empties). Returns CUPTI's result code.
PyObject* py_cupti_flush(PyObject*, PyObject* args) {
  unsigned int flag = 0;
  if (!PyArg_ParseTuple(args, "|I", &flag)) return nullptr;
  if (!cuptibuf::flush) {
    PyErr_SetString(PyExc_RuntimeError, "cupti_flush: cupti_buffers() was not called");
    return nullptr;
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = cuptibuf::flush(flag);
  Py_END_ALLOW_THREADS return PyLong_FromLong(rc);
}

// cupti_take() -> [(data: bytes, offsets: bytes of int64)]: the completed buffers (their valid
// bytes, copied) and each record's offset in them, oldest first; the buffers go back for reuse.
PyObject* py_cupti_take(PyObject*, PyObject*) {
  std::vector<cuptibuf::Done> got;
  {
    std::lock_guard<std::mutex> lk(cuptibuf::mu);
    got.swap(cuptibuf::done);
    cuptibuf::pending_bytes = 0;
  }
  PyObject* out = PyList_New(0);
  if (!out) return nullptr;
  for (size_t i = 0; i < got.size(); i++) {
    cuptibuf::Done d = got[i];
    std::vector<int64_t> offs;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS void* rec = nullptr;
    offs.reserve(d.valid / 32);
    while ((rc = cuptibuf::next(d.buf, d.valid, &rec)) == 0) offs.push_back((uint8_t*)rec - d.buf);
    Py_END_ALLOW_THREADS
    // CUPTI_ERROR_MAX_LIMIT_REACHED (12) ends a buffer; anything else stops the walk early
    if (rc != 12) cuptibuf::walk_errors++;
    PyObject* data = PyBytes_FromStringAndSize((const char*)d.buf, (Py_ssize_t)d.valid);
    PyObject* off = PyBytes_FromStringAndSize((const char*)offs.data(), (Py_ssize_t)(offs.size() * sizeof(int64_t)));
    PyObject* item = (data && off) ? PyTuple_Pack(2, data, off) : nullptr;
    Py_XDECREF(data);
    Py_XDECREF(off);
    cuptibuf::put_back(d.buf);
    if (!item || PyList_Append(out, item) < 0) {
      Py_XDECREF(item);
      for (size_t j = i + 1; j < got.size(); j++) cuptibuf::put_back(got[j].buf);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return out;
}

PyObject* py_cupti_buffer_stats(PyObject*, PyObject*) {
  return Py_BuildValue("{sOsKsKsKsKsKsK}", "registered", cuptibuf::registered ? Py_True : Py_False, "requested",
                       (unsigned long long)cuptibuf::requested.load(), "completed",
                       (unsigned long long)cuptibuf::completed.load(), "alloc_failed",
                       (unsigned long long)cuptibuf::alloc_failed.load(), "dropped_buffers",
                       (unsigned long long)cuptibuf::dropped_buffers.load(), "dropped_records",
                       (unsigned long long)cuptibuf::dropped_records.load(), "walk_errors",
                       (unsigned long long)cuptibuf::walk_errors.load());
}

// cuProfilerStart/Stop act on the current context. A session's flusher thread (or any thread the
// framework never made a context current on) has none: there we push the primary context of the
// device our stages used (else the first device whose primary context is active), call, and pop.
// We never create a context: a primary context that is not active is not retained.
int profiler_cuda(int (*f)()) {
  GpuApi& a = g.gpu;
  if (gpu_current_key()) return f() == 0;
  if (!a.primary_state || !a.primary_retain || !a.primary_release || !a.ctx_push || !a.ctx_pop) {
    add_error("profiler start/stop: no current context and no primary-context functions in the driver");
    return 0;
  }
  int dev = -1;
  for (auto& cx : g.ctxs)
    if (cx.device >= 0) {
      dev = cx.device;
      break;
    }
  unsigned flags = 0;
  int active = 0;
  if (dev < 0 && a.dev_count && a.dev_get) {
    int n = 0;
    if (a.dev_count(&n) == 0)
      for (int i = 0; i < n && dev < 0; i++) {
        int d = -1;
        if (a.dev_get(&d, i) == 0 && a.primary_state(d, &flags, &active) == 0 && active) dev = d;
      }
  }
  if (dev < 0 || a.primary_state(dev, &flags, &active) != 0 || !active) {
    add_error("profiler start/stop: no current context and no active primary context");
    return 0;
  }
  void* ctx = nullptr;
  int rc = a.primary_retain(&ctx, dev);
  if (rc != 0) {
    add_error("profiler start/stop: cuDevicePrimaryCtxRetain failed (status " + std::to_string(rc) + ")");
    return 0;
  }
  int ok = 0;
  rc = a.ctx_push(ctx);
  if (rc == 0) {
    rc = f();
    ok = rc == 0;
    if (!ok) add_error("profiler start/stop failed (status " + std::to_string(rc) + ")");
    void* popped = nullptr;
    a.ctx_pop(&popped);
  } else {
    add_error("profiler start/stop: cuCtxPushCurrent failed (status " + std::to_string(rc) + ")");
  }
  a.primary_release(dev);
  return ok;
}

PyObject* py_profiler(bool start) {
  int ok = 0;
  if (g.markers == MK_ROCTX && (start ? g.roctx_resume : g.roctx_pause)) {
    ok = (start ? g.roctx_resume : g.roctx_pause)(0) == 0;
  } else {
    gpu_try_load();
    int (*f)() = start ? g.gpu.prof_start : g.gpu.prof_stop;
    if (f && g.gpu.backend == BK_CUDA)
      ok = profiler_cuda(f);
    else if (f && gpu_current_key())
      ok = f() == 0;
  }
  return PyBool_FromLong(ok);
}
// _driver_costs(n=2000, stream=0): benchmarks only. Median-free plain averages, in ns per call,
// of the driver calls a GPU-timed stage makes, measured here in C (no Python in the loop) on the
// current context: where the per-stage cost goes. Synchronises (it is not the hot path).
// The (n=..., stream=0) arguments of the benchmark probes below; loads the driver.
bool probe_args(PyObject* args, PyObject* kwargs, long* n, unsigned long long* stream) {
  static const char* kw[] = {"n", "stream", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|lK", (char**)kw, n, stream)) return false;
  if (*n < 1) *n = 1;
  gpu_try_load();
  return true;
}

PyObject* py_driver_costs(PyObject*, PyObject* args, PyObject* kwargs) {
  long n = 2000;
  unsigned long long stream = 0;
  if (!probe_args(args, kwargs, &n, &stream)) return nullptr;
  GpuApi& a = g.gpu;
  if (a.backend == BK_NONE || !gpu_current_key()) {
    PyErr_SetString(PyExc_RuntimeError, "_driver_costs needs a loaded driver and a current context");
    return nullptr;
  }
  RelaxedCapture relaxed;
  void* st = (void*)(uintptr_t)stream;
  void *e0 = nullptr, *e1 = nullptr;
  if (a.ev_create(&e0, 0) != 0 || a.ev_create(&e1, 0) != 0) {
    PyErr_SetString(PyExc_RuntimeError, "event create failed");
    return nullptr;
  }
  auto per = [n](int64_t t0) { return (double)(now_ns() - t0) / (double)n; };
  void* c = nullptr;
  int cap = 0;
  float ms = 0.f;
  int64_t t = now_ns();
  for (long i = 0; i < n; i++) gpu_current_key();
  double ctx_ns = per(t);
  double cap_ns = -1;
  if (a.is_capturing) {
    t = now_ns();
    for (long i = 0; i < n; i++) a.is_capturing(st, &cap);
    cap_ns = per(t);
  }
  t = now_ns();
  for (long i = 0; i < n; i++) a.ev_record((i & 1) ? e1 : e0, st);
  double rec_ns = per(t);
  a.ev_sync(e1);
  t = now_ns();
  for (long i = 0; i < n; i++) a.ev_query(e1);
  double query_ns = per(t);
  t = now_ns();
  for (long i = 0; i < n; i++) a.ev_elapsed(&ms, e0, e1);
  double el_ns = per(t);
  t = now_ns();
  for (long i = 0; i < n; i++) now_ns();
  double clock_ns = per(t);
  a.ev_sync(e1);
  if (a.ev_destroy) {
    a.ev_destroy(e0);
    a.ev_destroy(e1);
  }
  (void)c;
  return Py_BuildValue("{sdsdsdsdsdsd}", "ctx_current", ctx_ns, "stream_is_capturing", cap_ns, "event_record", rec_ns,
                       "event_query", query_ns, "event_elapsed", el_ns, "clock_gettime", clock_ns);
}

// _event_diag(n=4000, stream=0): benchmarks only. Where an event record's cost comes from, in C:
// each pattern runs n times on `stream` (0: the legacy stream) and reports the host ns per
// iteration to issue it and per iteration including a final synchronize (GPU-bound patterns show
// there). "launch" is an empty kernel (the floor calibration's, spin 0 ns); "pool" events rotate
// through 4096 distinct events as the stage pool does, "pair" reuses two.
PyObject* py_event_diag(PyObject*, PyObject* args, PyObject* kwargs) {
  long n = 4000;
  unsigned long long stream = 0;
  if (!probe_args(args, kwargs, &n, &stream)) return nullptr;
  GpuApi& a = g.gpu;
  if (a.backend != BK_CUDA || !gpu_current_key() || !a.mod_load || !a.launch) {
    PyErr_SetString(PyExc_RuntimeError, "_event_diag needs the CUDA driver and a current context");
    return nullptr;
  }
  RelaxedCapture relaxed;
  void* st = (void*)(uintptr_t)stream;
  void* mod = nullptr;
  void* fn = nullptr;
  int rc = -1;
  for (const char* head : kSpinPtxHeads) {
    std::string ptx = std::string(head) + kSpinPtx;
    rc = a.mod_load(&mod, ptx.c_str());
    if (rc == 0) break;
  }
  if (rc == 0) rc = a.mod_func(&fn, mod, "maxinstr_spin");
  constexpr int kPool = 4096;
  std::vector<void*> ev;
  for (int i = 0; rc == 0 && i < kPool; i++) {
    void* e = nullptr;
    rc = a.ev_create(&e, 0);
    if (rc == 0) ev.push_back(e);
  }
  if (rc != 0) {
    for (void* e : ev) a.ev_destroy(e);
    if (mod && a.mod_unload) a.mod_unload(mod);
    PyErr_Format(PyExc_RuntimeError, "_event_diag setup failed (status %d)", rc);
    return nullptr;
  }
  unsigned long long none = 0;
  void* pn[] = {&none};
  auto launch = [&]() { a.launch(fn, 1, 1, 1, 1, 1, 1, 0, st, pn, nullptr); };
  PyObject* out = PyDict_New();
  auto run = [&](const char* name, auto body) {
    void* last = ev[0];
    a.ev_record(last, st);
    a.ev_sync(last);
    int64_t t0 = now_ns();
    for (long i = 0; i < n; i++) body(i);
    int64_t t1 = now_ns();
    a.ev_record(last, st);
    a.ev_sync(last);
    int64_t t2 = now_ns();
    PyObject* v = Py_BuildValue("{sdsd}", "issue_ns", (double)(t1 - t0) / n, "total_ns", (double)(t2 - t0) / n);
    if (v) PyDict_SetItemString(out, name, v);
    Py_XDECREF(v);
  };
  float ms = 0.f;
  run("launch", [&](long) { launch(); });
  run("record pair", [&](long i) { a.ev_record(ev[(size_t)(i & 1)], st); });
  run("record pool", [&](long i) { a.ev_record(ev[(size_t)(i % kPool)], st); });
  run("launch + record pair", [&](long i) {
    launch();
    a.ev_record(ev[(size_t)(i & 1)], st);
  });
  run("launch + record pool", [&](long i) {
    launch();
    a.ev_record(ev[(size_t)(i % kPool)], st);
  });
  // what a stage pays besides its record: a query of an older event (done or not) and the
  // elapsed time of a completed one
  run("launch + record pool + query(i-32) + elapsed(i-64)", [&](long i) {
    launch();
    a.ev_record(ev[(size_t)(i % kPool)], st);
    if (i >= 64) {
      a.ev_query(ev[(size_t)((i - 32) % kPool)]);
      a.ev_elapsed(&ms, ev[0], ev[(size_t)((i - 64) % kPool)]);
    }
  });
  run("launch + query(i-32)", [&](long i) {
    launch();
    if (i >= 32) a.ev_query(ev[(size_t)((i - 32) % kPool)]);
  });
  for (void* e : ev) a.ev_destroy(e);
  if (mod && a.mod_unload) a.mod_unload(mod);
  return out;
}

PyObject* py_profiler_start(PyObject*, PyObject*) { return py_profiler(true); }
PyObject* py_profiler_stop(PyObject*, PyObject*) { return py_profiler(false); }

// After fork() the child starts clean: new pid in the ids, seq from 1, no open stages (the
// parent's Stage objects become inert: their exit is a no-op), an empty pending buffer, names
// reported again on the first drain, and no GPU timing (a CUDA context does not survive fork).
// Only trivial work here: we are inside fork().
void atfork_child() {
  placer::atfork_child();
  g.pid = (int64_t)getpid();
  g.seq = 0;
  g.fork_gen++;
  tls_ts = nullptr;
  tls_guard.ts = nullptr;
  g.threads.clear();  // the parent's thread states are leaked on purpose (no Python calls here)
  g.done.clear();
  g.done_head = 0;
  g.done_pushed = 0;
  g.done_drained = 0;
  g.attrs.clear();
  g.attrs_head = 0;
  g.names_reported = 0;
  g.records = 0;
  g.dropped_records = 0;
  g.pending.clear();
  g.slots.clear();
  g.ctxs.clear();
  g.last_ctx = -1;
  g.pool_total = 0;
  if (g.gpu.backend != BK_NONE) g.gpu_off_after_fork = true;
  g.gpu_tried = true;
  g.cupti_on = false;  // CUPTI does not follow a fork
  // nor do its buffers: a fresh lock (another thread may have held it at the fork) and empty
  // queues (their buffers belong to the parent's CUPTI; left to the parent)
  new (&cuptibuf::mu) std::mutex();
  new (&cuptibuf::done) std::vector<cuptibuf::Done>();
  new (&cuptibuf::spare) std::vector<uint8_t*>();
  cuptibuf::pending_bytes = 0;
  cuptibuf::registered = false;
}

PyMethodDef module_methods[] = {
    {"clock_ns", py_clock_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns: the host clock of all records and samples."},
    {"set_enabled", py_set_enabled, METH_O, "Process-wide enable/disable of stages and marks."},
    {"is_enabled", py_is_enabled, METH_NOARGS, "Whether stages are recorded."},
    {"stage", (PyCFunction)(void (*)(void))py_stage, METH_FASTCALL | METH_KEYWORDS,
     "stage(name, *, stream=None, gpu=None, step=None, **attrs) -> Stage"},
    {"mark", (PyCFunction)(void (*)(void))py_mark, METH_FASTCALL | METH_KEYWORDS, "mark(name, **attrs): instant record."},
    {"_set_attrs_hook", py_set_attrs_hook, METH_O,
     "_set_attrs_hook(fn): fn(attrs) -> plain-data dict, called at stage exit for attrs holding other than "
     "str/int/float/bool/None (maxinstr.record.attrs.plain)."},
    {"drain", (PyCFunction)(void (*)(void))py_drain, METH_FASTCALL | METH_KEYWORDS,
     "drain(max_records=-1) -> (bytes, [(name_id, name)], [(record_id, attrs)]): records completed since the "
     "last drain; names first seen since then plus those of the returned records; attrs of the returned records"},
    {"names", py_names, METH_NOARGS, "names() -> [(name_id, name)]: every name seen in this process."},
    {"resolve_async", py_resolve_async, METH_NOARGS,
     "resolve_async() -> int: resolve() for the session flusher; elapsed-time calls go to the placer thread."},
    {"resolve", (PyCFunction)(void (*)(void))py_resolve, METH_FASTCALL | METH_KEYWORDS,
     "resolve(block=False) -> int: resolve finished GPU event pairs."},
    {"close_open", (PyCFunction)(void (*)(void))py_close_open, METH_FASTCALL | METH_KEYWORDS,
     "close_open(reason='closed') -> int: close all open stages with flag UNCLOSED."},
    {"stats", py_stats, METH_NOARGS, "Counters and backend facts."},
    {"set_capacity", py_set_capacity, METH_O, "Bound on completed-but-undrained records."},
    {"profiler_start", py_profiler_start, METH_NOARGS, "cuProfilerStart / roctxProfilerResume."},
    {"profiler_stop", py_profiler_stop, METH_NOARGS, "cuProfilerStop / roctxProfilerPause."},
    {"cupti_link", (PyCFunction)(void (*)(void))py_cupti_link, METH_FASTCALL,
     "cupti_link(path_or_None, kind=0) -> bool: tag stages with CUPTI external correlation ids (libcupti at path)."},
    {"cupti_stats", py_cupti_stats, METH_NOARGS, "cupti_stats() -> {'on', 'pushes', 'errors'}."},
    {"cupti_tags", (PyCFunction)(void (*)(void))py_cupti_tags, METH_FASTCALL,
     "cupti_tags(path, runtime_cbids, driver_cbids, flags=1) -> bool: CUPTI callback tagging each launch with its stage."},
    {"cupti_tags_take", py_cupti_tags_take, METH_NOARGS, "cupti_tags_take() -> bytes of 48-byte tags."},
    {"cupti_tags_stats", py_cupti_tags_stats, METH_NOARGS, "cupti_tags_stats() -> {'on', 'calls', 'dropped'}."},
    {"cupti_buffers", py_cupti_buffers, METH_VARARGS,
     "cupti_buffers(path, buffer_bytes=8 MiB, max_pending_bytes=512 MiB) -> bool: CUPTI activity buffers handled "
     "natively (no Python on CUPTI's thread)."},
    {"cupti_flush", py_cupti_flush, METH_VARARGS, "cupti_flush(flag=0) -> int: cuptiActivityFlushAll, GIL released."},
    {"cupti_take", py_cupti_take, METH_NOARGS,
     "cupti_take() -> [(bytes, int64 offsets as bytes)]: completed activity buffers and their record offsets."},
    {"cupti_buffer_stats", py_cupti_buffer_stats, METH_NOARGS, "Counters of the native CUPTI buffers."},
    {"_event_diag", (PyCFunction)(void (*)(void))py_event_diag, METH_VARARGS | METH_KEYWORDS,
     "Benchmarks: host ns per launch/event-record pattern, issue and with the final synchronize."},
    {"_driver_costs", (PyCFunction)(void (*)(void))py_driver_costs, METH_VARARGS | METH_KEYWORDS,
     "Benchmarks: ns per driver call a GPU-timed stage makes (synchronises)."},
    {"_configure_events", (PyCFunction)(void (*)(void))py_configure_events, METH_VARARGS | METH_KEYWORDS,
     "Event pool bound, boundary-sharing window, GPU floor and GPU-timing budget."},
    MAXINSTR_WRITER_METHODS
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_native", "maxinstr native stage core", -1, module_methods,
                          nullptr, nullptr, nullptr, nullptr};

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__native(void) {
  StageType.tp_name = "maxinstr._native.Stage";
  StageType.tp_basicsize = sizeof(StageObject);
  StageType.tp_dealloc = stage_dealloc;
  StageType.tp_flags = Py_TPFLAGS_DEFAULT;
  StageType.tp_doc = "An instrumented stage: use as a context manager (or decorator via maxinstr.stage).";
  StageType.tp_methods = stage_methods;
  StageType.tp_getset = stage_getset;
  StageType.tp_call = stage_call;
  StageType.tp_repr = stage_repr;
  if (PyType_Ready(&StageType) < 0) return nullptr;
  BoundType.tp_name = "maxinstr._native.BoundStageMethod";
  BoundType.tp_basicsize = sizeof(BoundObject);
  BoundType.tp_dealloc = bound_dealloc;
  BoundType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  BoundType.tp_vectorcall_offset = offsetof(BoundObject, vc);
  BoundType.tp_call = PyVectorcall_Call;
  BoundType.tp_repr = bound_repr;
  if (PyType_Ready(&BoundType) < 0) return nullptr;
  BoundDescrType.tp_name = "maxinstr._native.StageMethodDescriptor";
  BoundDescrType.tp_basicsize = sizeof(BoundDescr);
  BoundDescrType.tp_flags = Py_TPFLAGS_DEFAULT;
  BoundDescrType.tp_descr_get = bound_descr_get;
  if (PyType_Ready(&BoundDescrType) < 0) return nullptr;
#ifndef Py_GIL_DISABLED
  for (int which = 0; which < 2; which++) {
    BoundDescr* d = PyObject_New(BoundDescr, &BoundDescrType);
    if (!d) return nullptr;
    d->which = which;
    if (PyDict_SetItemString(StageType.tp_dict, which ? "__exit__" : "__enter__", (PyObject*)d) < 0) return nullptr;
    Py_DECREF(d);
  }
  PyType_Modified(&StageType);
#endif
  NoopType.tp_name = "maxinstr._native.NoopStage";
  NoopType.tp_basicsize = sizeof(PyObject);
  NoopType.tp_flags = Py_TPFLAGS_DEFAULT;
  NoopType.tp_call = noop_call;
  NoopType.tp_repr = noop_repr;
  NoopType.tp_doc = "The shared stage returned while maxinstr is disabled.";
  if (PyType_Ready(&NoopType) < 0) return nullptr;
  for (auto& d : noop_fn_defs) {
    PyObject* f = PyCFunction_New(&d, nullptr);
    if (!f || PyDict_SetItemString(NoopType.tp_dict, d.ml_name, f) < 0) return nullptr;
    Py_DECREF(f);
  }
  PyType_Modified(&NoopType);

  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  g_noop = PyObject_New(PyObject, &NoopType);
  s_stream = PyUnicode_InternFromString("stream");
  s_gpu = PyUnicode_InternFromString("gpu");
  s_step = PyUnicode_InternFromString("step");
  g.name_dict = PyDict_New();
  if (!g_noop || !s_stream || !s_gpu || !s_step || !g.name_dict) return nullptr;
  Py_INCREF(&StageType);
  PyModule_AddObject(m, "Stage", (PyObject*)&StageType);
  Py_INCREF(&NoopType);
  PyModule_AddObject(m, "NoopStage", (PyObject*)&NoopType);
  Py_INCREF(g_noop);
  PyModule_AddObject(m, "NOOP", g_noop);
  PyModule_AddIntConstant(m, "RECORD_SIZE", (long)sizeof(Record));
  PyModule_AddIntConstant(m, "FLAG_EXCEPTION", F_EXCEPTION);
  PyModule_AddIntConstant(m, "FLAG_GPU_TIMED", F_GPU_TIMED);
  PyModule_AddIntConstant(m, "FLAG_MARK", F_MARK);
  PyModule_AddIntConstant(m, "FLAG_GPU_DROPPED", F_GPU_DROPPED);
  PyModule_AddIntConstant(m, "FLAG_UNCLOSED", F_UNCLOSED);
  PyModule_AddIntConstant(m, "FLAG_GPU_SAMPLED_OUT", F_GPU_SAMPLED_OUT);

  g.pid = (int64_t)getpid();
  const char* dis = env("MAXINSTR_DISABLE");
  if (dis && strcmp(dis, "0") != 0 && strcasecmp(dis, "false") != 0 && strcasecmp(dis, "no") != 0) g.enabled = false;
  if (const char* p = env("MAXINSTR_EVENT_POOL")) {
    long n = strtol(p, nullptr, 10);
    if (n >= 4) g.pool_max = (int)n;
  }
  if (const char* p = env("MAXINSTR_EVENT_SHARE_NS")) g.share_ns = strtoll(p, nullptr, 10);
  if (const char* p = env("MAXINSTR_TIME_DRIVER")) g.time_driver = strcmp(p, "0") != 0;
  if (const char* p = env("MAXINSTR_GPU_BUDGET")) {
    char* end = nullptr;
    double v = strtod(p, &end);
    if (end != p && v >= 0) g.gpu_budget = v;
  }
  if (const char* p = env("MAXINSTR_GPU_FLOOR_NS")) {  // unset or "auto": calibrate
    if (strcmp(p, "auto") != 0) {
      long long n = strtoll(p, nullptr, 10);
      g.floor_fixed = n < 0 ? -1 : n;
    }
  }
  init_markers();
  pthread_atfork(nullptr, nullptr, atfork_child);
  writer_init();
  if (const char* p = env("MAXINSTR_ASYNC_PLACE")) placer::P.on = strcmp(p, "0") != 0;
  Py_AtExit(placer::shutdown);
  return m;
}
