// Launch tags through CUPTI's callback API (included by native.cpp). An experiment for issue 9,
// not used by kernels=True yet: on an H200, the API activity records that carry a stage id to
// each kernel (RUNTIME/DRIVER + EXTERNAL_CORRELATION) cost a launch-bound step ~13-19 %, the
// kernel records themselves ~5 % (benchmarks/cupti_configs.py). Here a native callback on the
// launch/copy/set functions only reads, at API entry and on the calling thread itself, the
// correlation id CUPTI gives the call and the innermost open stage of that thread, and keeps the
// pair; kernel records carry the same correlation id. benchmarks/cupti_configs.py measures it as
// "kernel + native launch tags" against the activity-record configurations.
namespace cuptitag {

typedef void (*callback_fn)(void*, int, uint32_t, const void*);
typedef int (*subscribe_fn)(void**, callback_fn, void*);
typedef int (*enable_fn)(uint32_t, void*, int, uint32_t);
typedef int (*unsubscribe_fn)(void*);
typedef int (*timestamp_fn)(uint64_t*);

struct Tag {  // 48 bytes
  uint32_t correlation_id;
  int32_t domain;    // 1 driver API, 2 runtime API
  int64_t stage_id;  // innermost open stage of the calling thread, -1 none
  int64_t tid;       // the calling thread (OS id)
  int64_t start_ns;  // CUPTI's clock (cuptiGetTimestamp), at entry and exit of the call
  int64_t end_ns;
  uint32_t cbid;
  uint32_t pad;
};
static_assert(sizeof(Tag) == 48, "Tag layout is read by Python (kernels/cupti.py TAG_DTYPE)");

constexpr size_t kMaxTags = 1u << 22;
std::mutex mu;
std::vector<Tag> tags;
void* sub = nullptr;
unsubscribe_fn unsubscribe = nullptr;
timestamp_fn timestamp = nullptr;
uint64_t gen = 1;  // bumped at each take: an exit whose entry was taken before finds nothing to end
std::atomic<uint64_t> calls{0}, dropped{0};

inline int64_t cupti_now() {
  uint64_t t = 0;
  return timestamp && timestamp(&t) == 0 ? (int64_t)t : -1;
}

// CUpti_CallbackData (cupti_callbacks.h): callbackSite (int) at 0, correlationData (uint64_t*, a
// slot CUPTI keeps from the entry to the exit of one call) at 56, correlationId (uint32) at 64.
void callback(void*, int domain, uint32_t cbid, const void* data) {
  const char* d = (const char*)data;
  uint64_t* slot = *(uint64_t* const*)(d + 56);
  if (*(const int*)d != 0) {  // CUPTI_API_EXIT: end the tag its entry made
    if (!slot || !*slot) return;
    int64_t t_end = cupti_now();
    std::lock_guard<std::mutex> lock(mu);
    size_t idx = (size_t)(*slot & 0xffffffffu) - 1;
    if ((*slot >> 32) == gen && idx < tags.size()) tags[idx].end_ns = t_end;
    return;
  }
  Tag t{*(const uint32_t*)(d + 64), domain, -1, 0, cupti_now(), -1, cbid, 0};
  ThreadState* ts = tls_ts;  // this thread's own stack: only this thread changes it
  if (ts) {
    t.tid = ts->tid;
    for (size_t i = ts->stack.size(); i > 0; i--)
      if (ts->stack[i - 1]->state == ST_OPEN) {
        t.stage_id = ts->stack[i - 1]->rec.id;
        break;
      }
  }
  calls.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu);
  if (tags.size() < kMaxTags) {
    tags.push_back(t);
    if (slot) *slot = (gen << 32) | (uint64_t)tags.size();
  } else {
    dropped.fetch_add(1, std::memory_order_relaxed);
    if (slot) *slot = 0;
  }
}

}  // namespace cuptitag

// cupti_tags(path, runtime_cbids, driver_cbids) -> True, False (no such library or symbols) or
// cuptiSubscribe's error code (39: another subscriber holds CUPTI): subscribe to the libcupti
// loaded at path (RTLD_NOLOAD) with the native callback, enabled for those functions only;
// cupti_tags(None) unsubscribes. The subscriber slot is CUPTI's only one.
PyObject* py_cupti_tags(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs == 1 && args[0] == Py_None) {
    if (cuptitag::sub && cuptitag::unsubscribe) cuptitag::unsubscribe(cuptitag::sub);
    cuptitag::sub = nullptr;
    Py_RETURN_TRUE;
  }
  if (nargs != 3 || !PyUnicode_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "cupti_tags(path, runtime_cbids, driver_cbids) or cupti_tags(None)");
    return nullptr;
  }
  if (cuptitag::sub) Py_RETURN_TRUE;
  const char* path = PyUnicode_AsUTF8(args[0]);
  if (!path) return nullptr;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  auto subscribe = h ? (cuptitag::subscribe_fn)dlsym(h, "cuptiSubscribe") : nullptr;
  auto enable = h ? (cuptitag::enable_fn)dlsym(h, "cuptiEnableCallback") : nullptr;
  cuptitag::unsubscribe = h ? (cuptitag::unsubscribe_fn)dlsym(h, "cuptiUnsubscribe") : nullptr;
  cuptitag::timestamp = h ? (cuptitag::timestamp_fn)dlsym(h, "cuptiGetTimestamp") : nullptr;
  if (!subscribe || !enable || !cuptitag::unsubscribe) {
    add_error(std::string("cupti tags: ") + path + " is not loaded or lacks the callback API");
    Py_RETURN_FALSE;
  }
  int rc = subscribe(&cuptitag::sub, cuptitag::callback, nullptr);
  if (rc != 0) {  // 39: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (another tool holds CUPTI)
    cuptitag::sub = nullptr;
    add_error("cupti tags: cuptiSubscribe returned " + std::to_string(rc));
    return PyLong_FromLong(rc);
  }
  for (int k = 1; k <= 2; k++) {
    PyObject* seq = PySequence_Fast(args[k], "cbids must be a sequence of ints");
    if (!seq) return nullptr;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
      long cbid = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
      if (cbid == -1 && PyErr_Occurred()) {
        Py_DECREF(seq);
        return nullptr;
      }
      // domain 2 = runtime (args[1]), 1 = driver (args[2])
      enable(1, cuptitag::sub, k == 1 ? 2 : 1, (uint32_t)cbid);
    }
    Py_DECREF(seq);
  }
  Py_RETURN_TRUE;
}

// cupti_tags_take() -> bytes: the tags kept since the last take (48-byte records, see Tag). A
// call still running keeps end_ns -1.
PyObject* py_cupti_tags_take(PyObject*, PyObject*) {
  std::vector<cuptitag::Tag> out;
  {
    std::lock_guard<std::mutex> lock(cuptitag::mu);
    out.swap(cuptitag::tags);
    cuptitag::gen++;
  }
  return PyBytes_FromStringAndSize((const char*)out.data(), (Py_ssize_t)(out.size() * sizeof(cuptitag::Tag)));
}

PyObject* py_cupti_tags_stats(PyObject*, PyObject*) {
  return Py_BuildValue("{sOsKsK}", "on", cuptitag::sub ? Py_True : Py_False, "calls",
                       (unsigned long long)cuptitag::calls.load(), "dropped",
                       (unsigned long long)cuptitag::dropped.load());
}
