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

struct Tag {  // 24 bytes
  uint32_t correlation_id;
  int32_t domain;  // 1 driver API, 2 runtime API
  int64_t stage_id;  // innermost open stage of the calling thread, -1 none
  int64_t tid;
};

constexpr size_t kMaxTags = 1u << 22;
std::mutex mu;
std::vector<Tag> tags;
void* sub = nullptr;
unsubscribe_fn unsubscribe = nullptr;
std::atomic<uint64_t> calls{0}, dropped{0};

// CUpti_CallbackData (cupti_callbacks.h): callbackSite (int) at 0, correlationId (uint32) at 64.
void callback(void*, int domain, uint32_t, const void* data) {
  const char* d = (const char*)data;
  if (*(const int*)d != 0) return;  // CUPTI_API_ENTER only
  Tag t{*(const uint32_t*)(d + 64), domain, -1, 0};
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
  if (tags.size() < kMaxTags)
    tags.push_back(t);
  else
    dropped.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace cuptitag

// cupti_tags(path, runtime_cbids, driver_cbids) -> bool: subscribe to the libcupti loaded at path
// (RTLD_NOLOAD) with the native callback, enabled for those functions only; cupti_tags(None)
// unsubscribes. The subscriber slot is CUPTI's only one: nothing else may hold it.
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
  if (!subscribe || !enable || !cuptitag::unsubscribe) {
    add_error(std::string("cupti tags: ") + path + " is not loaded or lacks the callback API");
    Py_RETURN_FALSE;
  }
  int rc = subscribe(&cuptitag::sub, cuptitag::callback, nullptr);
  if (rc != 0) {
    cuptitag::sub = nullptr;
    add_error("cupti tags: cuptiSubscribe returned " + std::to_string(rc));
    Py_RETURN_FALSE;
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

// cupti_tags_take() -> bytes: the tags kept since the last take (24-byte records, see Tag).
PyObject* py_cupti_tags_take(PyObject*, PyObject*) {
  std::vector<cuptitag::Tag> out;
  {
    std::lock_guard<std::mutex> lock(cuptitag::mu);
    out.swap(cuptitag::tags);
  }
  return PyBytes_FromStringAndSize((const char*)out.data(), (Py_ssize_t)(out.size() * sizeof(cuptitag::Tag)));
}

PyObject* py_cupti_tags_stats(PyObject*, PyObject*) {
  return Py_BuildValue("{sOsKsK}", "on", cuptitag::sub ? Py_True : Py_False, "calls",
                       (unsigned long long)cuptitag::calls.load(), "dropped",
                       (unsigned long long)cuptitag::dropped.load());
}
