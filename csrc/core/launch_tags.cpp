// Launch tags through CUPTI's callback API (docs/kernels.md): each kernel, copy and set gets its
// stage. The API activity records that could carry it cost a launch-bound H200 step ~13-19 %
// (benchmarks/cupti_configs.py); this callback only reads the call's correlation id and the
// calling thread's innermost open stage. One tag per outermost call (a runtime launch's own
// driver call is folded into its tag).
#include "base.h"

#include <mutex>

#include "dispatch.h"
#include "stage.h"
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

namespace {

namespace cuptitag {

struct Tag {  // 48 bytes
  uint32_t correlation_id;
  int32_t domain;    // 1 driver API, 2 runtime API
  int64_t stage_id;  // innermost open stage of the calling thread, -1 none
  int64_t tid;       // the calling thread (OS id)
  int64_t start_ns;  // the core's clock (now_ns: CLOCK_MONOTONIC) at entry and exit of the call;
  int64_t end_ns;    // -1 if not taken (TAG_TIMES off). The collector maps them onto CUPTI's clock
  uint32_t cbid;
  uint32_t inner_correlation_id;  // the first enabled call made inside this one (0 none)
};
static_assert(sizeof(Tag) == 48, "Tag layout is read by Python (kernels/cupti.py TAG_DTYPE)");

// cupti_tags() flags: TIMES takes start/end (CLOCK_MONOTONIC, ~25 ns a read, where cuptiGetTimestamp
// cost a launch-bound H200 step ~2 %); NOOP returns at once (benchmarks: CUPTI's dispatch alone).
constexpr int TAG_TIMES = 1, TAG_NOOP = 2;

// This thread's call in progress: trivially constructible, so no guard on each access.
struct Open {
  uint64_t epoch;  // the subscription it belongs to (a call left open by an unsubscribe is dropped)
  int depth;       // enabled calls entered and not yet exited on this thread
  int64_t os_tid;  // this thread's OS id, read once (0: not yet), for threads that hold no stage
  Tag tag;
};
thread_local Open tls_open;

constexpr size_t kMaxTags = 1u << 22;
std::mutex mu;
std::vector<Tag> tags;
uint64_t calls = 0;  // under mu
void* sub = nullptr;
decltype(CuptiApi::unsubscribe) unsubscribe = nullptr;  // taken by cupti_tags() (dispatch.h)
std::atomic<uint64_t> epoch{1};
std::atomic<int> flags{TAG_TIMES};
std::atomic<uint64_t> dropped{0};

inline int64_t tag_now(int f) { return (f & TAG_TIMES) ? now_ns() : -1; }

// CUpti_CallbackData (cupti_callbacks.h): callbackSite (int, 0 entry / 1 exit) at 0,
// correlationId (uint32) at 64.
void callback(void*, int domain, uint32_t cbid, const void* data) {
  const int f = flags.load(std::memory_order_relaxed);
  if (f & TAG_NOOP) return;
  const char* d = (const char*)data;
  Open& o = tls_open;
  const uint64_t ep = epoch.load(std::memory_order_relaxed);
  if (o.epoch != ep) {
    o.epoch = ep;
    o.depth = 0;
  }
  if (*(const int*)d != 0) {  // exit
    if (o.depth == 0 || --o.depth > 0) return;  // entered before the subscription, or nested
    o.tag.end_ns = tag_now(f);
    std::lock_guard<std::mutex> lock(mu);
    calls++;
    if (tags.size() < kMaxTags)
      tags.push_back(o.tag);
    else
      dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint32_t corr = *(const uint32_t*)(d + 64);
  if (o.depth++ > 0) {  // inside an enabled call of this thread: the runtime's own driver call
    if (!o.tag.inner_correlation_id && corr != o.tag.correlation_id) o.tag.inner_correlation_id = corr;
    return;
  }
  Tag& t = o.tag;
  t = Tag{corr, domain, -1, 0, tag_now(f), -1, cbid, 0};
  ThreadState* ts = tls_ts;  // this thread's own stack: only this thread changes it
  if (ts) {
    t.tid = ts->tid;
  } else {  // a runtime's worker (MAX launches every kernel from one): its launches are tied to
            // stages of other threads by time at analysis, so the thread must be known
    if (!o.os_tid) o.os_tid = (int64_t)syscall(SYS_gettid);
    t.tid = o.os_tid;
  }
  if (ts && !tls_core_gpu_work) {
    for (size_t i = ts->stack.size(); i > 0; i--)
      if (ts->stack[i - 1]->state == ST_OPEN) {
        t.stage_id = ts->stack[i - 1]->rec.id;
        break;
      }
  }
}

// The callback on (or off) for each cbid of the sequence, in domain (1 driver, 2 runtime): -1 (a
// Python error set) when it is not a sequence of ints, else whether CUPTI accepted them all.
int enable_cbids(PyObject* cbids, int domain, uint32_t on) {
  PyObject* seq = PySequence_Fast(cbids, "cbids must be a sequence of ints");
  if (!seq) return -1;
  int ok = 1;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
    long cbid = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (cbid == -1 && PyErr_Occurred()) {
      ok = -1;
      break;
    }
    if (vendor.cupti.enable_callback(on, sub, domain, (uint32_t)cbid) != 0) ok = 0;
  }
  Py_DECREF(seq);
  return ok;
}

}  // namespace cuptitag

// True, False (no such library or symbols) or cuptiSubscribe's error (39: another subscriber).
PyObject* py_cupti_tags(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs == 1 && args[0] == Py_None) {
    if (cuptitag::sub && cuptitag::unsubscribe) cuptitag::unsubscribe(cuptitag::sub);
    cuptitag::sub = nullptr;
    cuptitag::epoch.fetch_add(1);
    Py_RETURN_TRUE;
  }
  if ((nargs != 3 && nargs != 4) || !PyUnicode_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "cupti_tags(path, runtime_cbids, driver_cbids, flags=1) or cupti_tags(None)");
    return nullptr;
  }
  const long f = nargs == 4 ? PyLong_AsLong(args[3]) : cuptitag::TAG_TIMES;
  if (f == -1 && PyErr_Occurred()) return nullptr;
  cuptitag::flags.store((int)f);
  if (cuptitag::sub) Py_RETURN_TRUE;
  const char* path = PyUnicode_AsUTF8(args[0]);
  if (!path) return nullptr;
  const bool loaded = cupti_load(path);
  auto subscribe = loaded ? vendor.cupti.subscribe : nullptr;
  auto enable = loaded ? vendor.cupti.enable_callback : nullptr;
  cuptitag::unsubscribe = loaded ? vendor.cupti.unsubscribe : nullptr;
  if (!subscribe || !enable || !cuptitag::unsubscribe) {
    add_error(std::string("cupti tags: ") + path + " is not loaded or lacks the callback API");
    Py_RETURN_FALSE;
  }
  cuptitag::epoch.fetch_add(1);
  int rc = subscribe(&cuptitag::sub, cuptitag::callback, nullptr);
  if (rc != 0) {  // 39: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (another tool holds CUPTI)
    cuptitag::sub = nullptr;
    add_error("cupti tags: cuptiSubscribe returned " + std::to_string(rc));
    return PyLong_FromLong(rc);
  }
  for (int k = 1; k <= 2; k++)  // domain 2 = runtime (args[1]), 1 = driver (args[2])
    if (cuptitag::enable_cbids(args[k], k == 1 ? 2 : 1, 1) < 0) return nullptr;
  Py_RETURN_TRUE;
}

// False when not subscribed or CUPTI refused.
PyObject* py_cupti_tags_enable(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "cupti_tags_enable(domain, cbids, on)");
    return nullptr;
  }
  long domain = PyLong_AsLong(args[0]);
  int on = PyObject_IsTrue(args[2]);
  if ((domain == -1 && PyErr_Occurred()) || on < 0) return nullptr;
  if (!cuptitag::sub || !vendor.cupti.enable_callback) Py_RETURN_FALSE;
  const int ok = cuptitag::enable_cbids(args[1], (int)domain, (uint32_t)on);
  return ok < 0 ? nullptr : PyBool_FromLong(ok);
}

PyObject* py_cupti_tags_take(PyObject*, PyObject*) {
  std::vector<cuptitag::Tag> out;
  {
    std::lock_guard<std::mutex> lock(cuptitag::mu);
    out.swap(cuptitag::tags);
  }
  return PyBytes_FromStringAndSize((const char*)out.data(), (Py_ssize_t)(out.size() * sizeof(cuptitag::Tag)));
}

PyObject* py_cupti_tags_stats(PyObject*, PyObject*) {
  unsigned long long calls;
  {
    std::lock_guard<std::mutex> lock(cuptitag::mu);
    calls = cuptitag::calls;
  }
  return Py_BuildValue("{sOsKsK}", "on", cuptitag::sub ? Py_True : Py_False, "calls", calls, "dropped",
                       (unsigned long long)cuptitag::dropped.load());
}

}  // namespace

PyMethodDef launch_tags_methods[] = {
    {"cupti_tags", (PyCFunction)(void (*)(void))py_cupti_tags, METH_FASTCALL,
     "cupti_tags(path, runtime_cbids, driver_cbids, flags=1) -> bool: CUPTI callback tagging each launch with its stage."},
    {"cupti_tags_enable", (PyCFunction)(void (*)(void))py_cupti_tags_enable, METH_FASTCALL,
     "cupti_tags_enable(domain, cbids, on) -> bool: the launch tags' callback on or off for those functions."},
    {"cupti_tags_take", py_cupti_tags_take, METH_NOARGS, "cupti_tags_take() -> bytes of 48-byte tags."},
    {"cupti_tags_stats", py_cupti_tags_stats, METH_NOARGS, "cupti_tags_stats() -> {'on', 'calls', 'dropped'}."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace maxinstr
