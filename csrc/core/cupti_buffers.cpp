// CUPTI activity buffers handled natively (kernels=True): CUPTI hands completed buffers to
// buffer_completed() on its own thread or inside cuptiActivityFlushAll; these callbacks never touch
// Python, so they never need the GIL. cupti_take(), on the session's flusher thread, copies them
// out with their record offsets; the records become rows there, with numpy.
#include "base.h"

#include <atomic>
#include <mutex>
#include <new>

#include "dispatch.h"
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

namespace {

namespace cuptibuf {
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
decltype(CuptiApi::next_record) next = nullptr;  // taken by cupti_buffers() (dispatch.h)
decltype(CuptiApi::flush_all) flush = nullptr;
std::atomic<uint64_t> requested{0}, completions{0}, alloc_failed{0}, dropped_buffers{0}, dropped_records{0};
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
  completions++;
  if (valid == 0) {
    put_back(buffer);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    if (pending_bytes + valid <= max_pending_bytes) {
      done.push_back({buffer, valid});
      pending_bytes += valid;
      return;
    }
  }
  dropped_buffers++;
  dropped_records += count_records(buffer, valid);
  put_back(buffer);
}
}  // namespace cuptibuf

// The buffer callbacks above registered with the libcupti loaded at `path` (cupti-python's).
PyObject* py_cupti_buffers(PyObject*, PyObject* args) {
  const char* path = nullptr;
  unsigned long long bytes = 8u << 20, pending = 512u << 20;
  if (!PyArg_ParseTuple(args, "s|KK", &path, &bytes, &pending)) return nullptr;
  if (!cupti_load(path)) {
    add_error(std::string("cupti: ") + path + " is not loaded in this process");
    Py_RETURN_FALSE;
  }
  auto reg = vendor.cupti.register_callbacks;
  if (!reg || !vendor.cupti.next_record || !vendor.cupti.flush_all) {
    add_error(std::string("cupti: ") + path + " lacks cuptiActivityRegisterCallbacks/GetNextRecord/FlushAll");
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
  cuptibuf::next = vendor.cupti.next_record;
  cuptibuf::flush = vendor.cupti.flush_all;
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

// The completed buffers' valid bytes, copied, oldest first; the buffers go back for reuse.
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
    PyObject* item = Py_BuildValue("(y#y#)", (const char*)d.buf, (Py_ssize_t)d.valid,
                                   offs.empty() ? "" : (const char*)offs.data(),
                                   (Py_ssize_t)(offs.size() * sizeof(int64_t)));
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
                       (unsigned long long)cuptibuf::completions.load(), "alloc_failed",
                       (unsigned long long)cuptibuf::alloc_failed.load(), "dropped_buffers",
                       (unsigned long long)cuptibuf::dropped_buffers.load(), "dropped_records",
                       (unsigned long long)cuptibuf::dropped_records.load(), "walk_errors",
                       (unsigned long long)cuptibuf::walk_errors.load());
}

}  // namespace

// fork(): CUPTI does not follow, nor do its buffers (left to the parent): a fresh lock, empty
// queues. Only trivial work: we are inside fork().
void cupti_buffers_atfork_child() {
  new (&cuptibuf::mu) std::mutex();
  new (&cuptibuf::done) std::vector<cuptibuf::Done>();
  new (&cuptibuf::spare) std::vector<uint8_t*>();
  cuptibuf::pending_bytes = 0;
  cuptibuf::registered = false;
}

PyMethodDef cupti_buffers_methods[] = {
    {"cupti_buffers", py_cupti_buffers, METH_VARARGS,
     "cupti_buffers(path, buffer_bytes=8 MiB, max_pending_bytes=512 MiB) -> bool: CUPTI activity buffers handled "
     "natively (no Python on CUPTI's thread)."},
    {"cupti_flush", py_cupti_flush, METH_VARARGS, "cupti_flush(flag=0) -> int: cuptiActivityFlushAll, GIL released."},
    {"cupti_take", py_cupti_take, METH_NOARGS,
     "cupti_take() -> [(bytes, int64 offsets as bytes)]: completed activity buffers and their record offsets."},
    {"cupti_buffer_stats", py_cupti_buffer_stats, METH_NOARGS, "Counters of the native CUPTI buffers."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace maxinstr
