// profiler_start/stop: cuProfilerStart/Stop (with a primary context pushed where the calling
// thread has none), or roctxProfilerResume/Pause where the markers are roctx's.
#include "base.h"

#include "dispatch.h"
#include "events.h"
#include "markers.h"
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

namespace {

// cuProfilerStart/Stop act on the current context; where none is (a flusher thread) the active
// primary context of our stages' device (else the first active one) is pushed around the call.
int profiler_cuda(int (*f)()) {
  GpuApi& a = vendor.gpu;
  if (gpu_current_key()) return f() == 0;
  if (!a.primary_state || !a.primary_retain || !a.primary_release || !a.ctx_push || !a.ctx_pop) {
    add_error("profiler start/stop: no current context and no primary-context functions in the driver");
    return 0;
  }
  int dev = -1;  // the first context's with a known device
  for (auto& cx : events.ctxs)
    if (dev < 0) dev = cx.device;
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
  if (markers.kind == MK_ROCTX && (start ? vendor.roctx.resume : vendor.roctx.pause)) {
    ok = (start ? vendor.roctx.resume : vendor.roctx.pause)(0) == 0;
  } else {
    gpu_try_load();
    int (*f)() = start ? vendor.gpu.prof_start : vendor.gpu.prof_stop;
    if (f && vendor.gpu.backend == BK_CUDA)
      ok = profiler_cuda(f);
    else if (f && gpu_current_key())
      ok = f() == 0;
  }
  return PyBool_FromLong(ok);
}

PyObject* py_profiler_start(PyObject*, PyObject*) { return py_profiler(true); }
PyObject* py_profiler_stop(PyObject*, PyObject*) { return py_profiler(false); }

}  // namespace

PyMethodDef profiler_methods[] = {
    {"profiler_start", py_profiler_start, METH_NOARGS, "cuProfilerStart / roctxProfilerResume."},
    {"profiler_stop", py_profiler_stop, METH_NOARGS, "cuProfilerStop / roctxProfilerPause."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace maxinstr
