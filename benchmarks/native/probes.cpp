// Benchmark-only probes: _driver_costs() and _event_diag() time the driver calls a GPU-timed stage
// makes, in C (benchmarks/stage_overhead.py, benchmarks/event_diag.py; tests/core runs them
// against the stand-in driver). Built into maxinstr._native only with the CMake option
// MAXINSTR_BENCH_PROBES (csrc/core/CMakeLists.txt); it includes the core's headers from there.
#include "base.h"

#include <string>
#include <vector>

#include "dispatch.h"
#include "events.h"
#include "floor.h"

namespace maxinstr MAXINSTR_HIDDEN {

namespace {

// The (n=..., stream=0) arguments of the benchmark probes below; loads the driver.
bool probe_args(PyObject* args, PyObject* kwargs, long* n, unsigned long long* stream) {
  static const char* kw[] = {"n", "stream", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|lK", (char**)kw, n, stream)) return false;
  if (*n < 1) *n = 1;
  gpu_try_load();
  return true;
}

// _driver_costs(n=2000, stream=0): plain averages, in ns per call, of the driver calls a GPU-timed
// stage makes, on the current context, no Python in the loop. Synchronises.
PyObject* py_driver_costs(PyObject*, PyObject* args, PyObject* kwargs) {
  long n = 2000;
  unsigned long long stream = 0;
  if (!probe_args(args, kwargs, &n, &stream)) return nullptr;
  GpuApi& a = vendor.gpu;
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
  // ns per call of `call(i)`, averaged over n calls
  auto per = [n](auto call) {
    const int64_t t0 = now_ns();
    for (long i = 0; i < n; i++) call(i);
    return (double)(now_ns() - t0) / (double)n;
  };
  int cap = 0;
  float ms = 0.f;
  const double ctx_ns = per([](long) { gpu_current_key(); });
  const double cap_ns = a.is_capturing ? per([&](long) { a.is_capturing(st, &cap); }) : -1;
  const double rec_ns = per([&](long i) { a.ev_record((i & 1) ? e1 : e0, st); });
  a.ev_sync(e1);
  const double query_ns = per([&](long) { a.ev_query(e1); });
  const double el_ns = per([&](long) { a.ev_elapsed(&ms, e0, e1); });
  const double clock_ns = per([](long) { now_ns(); });
  a.ev_sync(e1);
  if (a.ev_destroy) {
    a.ev_destroy(e0);
    a.ev_destroy(e1);
  }
  return Py_BuildValue("{sdsdsdsdsdsd}", "ctx_current", ctx_ns, "stream_is_capturing", cap_ns, "event_record", rec_ns,
                       "event_query", query_ns, "event_elapsed", el_ns, "clock_gettime", clock_ns);
}

// _event_diag(n=4000, stream=0): where an event record's cost comes from: each pattern runs n
// times on `stream` (0: legacy); host ns per iteration to issue it, and with a final synchronize.
// "launch" is the floor's empty kernel; "pool" rotates through 4096 events as the pool does,
// "pair" reuses two.
PyObject* py_event_diag(PyObject*, PyObject* args, PyObject* kwargs) {
  long n = 4000;
  unsigned long long stream = 0;
  if (!probe_args(args, kwargs, &n, &stream)) return nullptr;
  GpuApi& a = vendor.gpu;
  if (a.backend != BK_CUDA || !gpu_current_key() || !a.mod_load || !a.launch) {
    PyErr_SetString(PyExc_RuntimeError, "_event_diag needs the CUDA driver and a current context");
    return nullptr;
  }
  RelaxedCapture relaxed;
  void* st = (void*)(uintptr_t)stream;
  void* mod = nullptr;
  void* fn = nullptr;
  int rc = spin_kernel_load(&mod, &fn);
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

}  // namespace

PyMethodDef probe_methods[] = {
    {"_event_diag", (PyCFunction)(void (*)(void))py_event_diag, METH_VARARGS | METH_KEYWORDS,
     "Benchmarks: host ns per launch/event-record pattern, issue and with the final synchronize."},
    {"_driver_costs", (PyCFunction)(void (*)(void))py_driver_costs, METH_VARARGS | METH_KEYWORDS,
     "Benchmarks: ns per driver call a GPU-timed stage makes (synchronises)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace maxinstr
