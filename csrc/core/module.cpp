// maxinstr._native (docs/stage-core.md; its units: docs/architecture.md, "The native core"): the
// module's init, fork handler and functions over the whole process; each unit adds its own.
#include "base.h"

#include "attrs_json.h"
#include "cupti_link.h"
#include "dispatch.h"
#include "events.h"
#include "markers.h"
#include "placer.h"
#include "records.h"
#include "stage.h"
#include "state.h"
#include "writer.h"

namespace maxinstr MAXINSTR_HIDDEN {

extern PyMethodDef profiler_methods[], launch_tags_methods[], cupti_buffers_methods[], probe_methods[];
void cupti_buffers_atfork_child();

namespace {

// Appends item (a new reference, or null after an error) to list; false on an error.
bool append_new(PyObject* list, PyObject* item) {
  const bool ok = item && PyList_Append(list, item) == 0;
  Py_XDECREF(item);
  return ok;
}

// d[key] = v (a new reference, or null after an error); false on an error.
bool set_new(PyObject* d, const char* key, PyObject* v) {
  const bool ok = v && PyDict_SetItemString(d, key, v) == 0;
  Py_XDECREF(v);
  return ok;
}

PyObject* py_clock_ns(PyObject*, PyObject*) { return PyLong_FromLongLong(now_ns()); }

PyObject* py_set_attrs_hook(PyObject*, PyObject* fn) {
  if (fn != Py_None && !PyCallable_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, "_set_attrs_hook(callable or None)");
    return nullptr;
  }
  Py_XSETREF(process.attrs_hook, fn == Py_None ? nullptr : Py_NewRef(fn));
  Py_RETURN_NONE;
}

PyObject* py_steady_watch(PyObject*, PyObject* args) {
  long long n = -1;
  PyObject* hook = Py_None;
  if (!PyArg_ParseTuple(args, "LO:steady_watch", &n, &hook)) return nullptr;
  if (hook != Py_None && !PyCallable_Check(hook)) {
    PyErr_SetString(PyExc_TypeError, "steady_watch(n, callable or None)");
    return nullptr;
  }
  bool was = process.steady_n >= 0;
  process.steady_counts.clear();
  if (n < 0 || hook == Py_None) {
    process.steady_n = -1;
    Py_CLEAR(process.steady_hook);
  } else {
    process.steady_n = n;
    Py_XSETREF(process.steady_hook, Py_NewRef(hook));
  }
  return PyBool_FromLong(was);
}

PyObject* py_set_enabled(PyObject*, PyObject* on) {
  int t = PyObject_IsTrue(on);
  if (t < 0) return nullptr;
  process.enabled = t != 0;
  Py_RETURN_NONE;
}
PyObject* py_is_enabled(PyObject*, PyObject*) { return PyBool_FromLong(process.enabled); }

// For the test that C and Python read yes/no alike (tests/test_config.py).
PyObject* py_env_flag(PyObject*, PyObject* args) {
  const char* name = nullptr;
  int dflt = 0;
  if (!PyArg_ParseTuple(args, "sp", &name, &dflt)) return nullptr;
  return PyBool_FromLong(env_flag(name, dflt != 0));
}

// Frees the state of threads that have exited with nothing open.
void sweep_threads() {
  size_t w = 0;
  for (size_t i = 0; i < process.threads.size(); i++) {
    ThreadState* ts = process.threads[i];
    if (!ts->alive.load(std::memory_order_acquire) && innermost_open(ts) == nullptr) {
      for (StageObject* z : ts->stack) {
        z->state = ST_IDLE;
        Py_DECREF(z);
      }
      for (auto& b : ts->bnd) slot_release(b.slot);
      delete ts;
      continue;
    }
    process.threads[w++] = ts;
  }
  process.threads.resize(w);
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
  PyObject* a = nullptr;
  if (!one_arg(args, nargs, kwnames, "max_records", &a)) return nullptr;
  const long long maxr = a ? PyLong_AsLongLong(a) : -1;
  if (maxr == -1 && PyErr_Occurred()) return nullptr;
  sweep_threads();
  // While the native writer runs it owns the records: drain() returns names and attrs only.
  const bool writer_on = writer.running;
  size_t n = writer_on ? 0 : done_count();
  if (maxr >= 0 && (size_t)maxr < n) n = (size_t)maxr;
  PyObject* bytes = PyBytes_FromStringAndSize(n ? (const char*)&completed.done[completed.done_head] : "",
                                              (Py_ssize_t)(n * sizeof(Record)));
  PyObject* names = PyList_New(0);
  PyObject* attrs = PyList_New(0);
  if (!bytes || !names || !attrs) goto fail;
  {
    // Names first seen since the last drain, plus the names of the returned records: every
    // drain is self-contained, whoever else drained before.
    std::vector<char> want(name_table.entries.size(), 0);
    for (size_t i = name_table.reported; i < name_table.entries.size(); i++) want[i] = 1;
    const Record* rows = n ? &completed.done[completed.done_head] : nullptr;
    for (size_t i = 0; i < n; i++) {
      size_t id = (size_t)rows[i].name_id;
      if (id < want.size()) want[id] = 1;
    }
    for (size_t i = 0; i < want.size(); i++)
      if (want[i] && !append_new(names, Py_BuildValue("(iO)", (int)i, name_table.entries[i].str))) goto fail;
  }
  name_table.reported = name_table.entries.size();
  if (!writer_on) {  // the writer moves these (under its lock) while it runs
    completed.done_head += n;
    completed.done_drained += n;
  }
  while (completed.attrs_head < completed.attrs.size() &&
         (writer_on || completed.attrs[completed.attrs_head].done_index < completed.done_drained)) {
    AttrEntry& e = completed.attrs[completed.attrs_head];
    PyObject* t = Py_BuildValue("(LN)", (long long)e.id, e.attrs);  // steals the entry's reference
    e.attrs = nullptr;
    completed.attrs_head++;
    if (!append_new(attrs, t)) goto fail;
  }
  if (writer_on) {
    // completed.done is the writer's to take and reset
  } else if (completed.done_head == completed.done.size()) {
    completed.done.clear();
    completed.done_head = 0;
  } else if (completed.done_head > 4096 && completed.done_head * 2 > completed.done.size()) {
    completed.done.erase(completed.done.begin(), completed.done.begin() + (ptrdiff_t)completed.done_head);
    completed.done_head = 0;
  }
  if (completed.attrs_head == completed.attrs.size()) {
    completed.attrs.clear();
    completed.attrs_head = 0;
  }
  return Py_BuildValue("(NNN)", bytes, names, attrs);
fail:
  Py_XDECREF(bytes);
  Py_XDECREF(names);
  Py_XDECREF(attrs);
  return nullptr;
}

PyObject* py_names(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  for (size_t i = 0; out && i < name_table.entries.size(); i++)
    if (!append_new(out, Py_BuildValue("(iO)", (int)i, name_table.entries[i].str))) Py_CLEAR(out);
  return out;
}

// resolve_all() timed: the program's own threads wait for a pass that holds the GIL.
PyObject* resolve_counted(bool block, bool defer) {
  if (vendor.gpu.backend == BK_NONE || pending_count() == 0) return PyLong_FromLong(0);
  int64_t t0 = now_ns();
  size_t k = resolve_all(block, defer);
  if (!block) events.gpu_cost_ns += now_ns() - t0;
  return PyLong_FromSize_t(k);
}

PyObject* py_resolve(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* b = nullptr;
  if (!one_arg(args, nargs, kwnames, "block", &b)) return nullptr;
  const int block = b ? PyObject_IsTrue(b) : 0;
  return block < 0 ? nullptr : resolve_counted(block != 0, false);
}

// The session flusher's pass: events not placed yet go to the placer thread.
PyObject* py_resolve_async(PyObject*, PyObject*) { return resolve_counted(false, true); }

PyObject* py_close_open(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* a = nullptr;
  if (!one_arg(args, nargs, kwnames, "reason", &a)) return nullptr;
  if (a && !PyUnicode_Check(a)) {
    PyErr_SetString(PyExc_TypeError, "reason must be str");
    return nullptr;
  }
  PyObject* reason = a ? Py_NewRef(a) : PyUnicode_FromString("closed");
  if (!reason) return nullptr;
  int64_t t = now_ns();
  long closed = 0;
  for (ThreadState* ts : process.threads) {
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
  completed.capacity = (size_t)n;
  Py_RETURN_NONE;
}

// Tests and benchmarks only.
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
    events.gpu_budget = v;
    events.gpu_cost_ns = 0;
    budget_offthread_ns.store(0);
    events.budget_tokens_ns = (double)kBudgetCreditNs;
    events.budget_spent_seen = 0;
    events.budget_last_t = 0;
    if (events.gpu_budget_t0) events.gpu_budget_t0 = now_ns();
  }
  if (floor != Py_None) {  // -1: calibrate (contexts met from now on); >= 0: fixed for all contexts
    long long n = PyLong_AsLongLong(floor);
    if (n == -1 && PyErr_Occurred()) return nullptr;
    events.floor_fixed = n < 0 ? -1 : n;
    if (n >= 0)
      for (auto& cx : events.ctxs) {
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
    events.pool_max = (int)n;
  }
  if (share != Py_None) {
    long long n = PyLong_AsLongLong(share);
    if (n == -1 && PyErr_Occurred()) return nullptr;
    events.share_ns = n;
  }
  return Py_BuildValue("{sisLsLsd}", "pool_size", events.pool_max, "share_ns", (long long)events.share_ns, "floor_ns",
                       (long long)events.floor_fixed, "gpu_budget", events.gpu_budget);
}

PyObject* py_stats(PyObject*, PyObject*) {
  long open_stages = 0;
  for (ThreadState* ts : process.threads)
    for (StageObject* s : ts->stack)
      if (s->state == ST_OPEN) open_stages++;
  PyObject* errs = PyList_New(0);
  for (const std::string& e : process.errors)
    if (errs && !append_new(errs, PyUnicode_DecodeUTF8(e.data(), (Py_ssize_t)e.size(), "replace"))) Py_CLEAR(errs);
  if (!errs) return nullptr;
  const char* backend = vendor.gpu.backend == BK_CUDA ? "cuda" : vendor.gpu.backend == BK_HIP ? "hip" : "none";
  const char* marker_kind = markers.kind == MK_NVTX ? "nvtx" : markers.kind == MK_ROCTX ? "roctx" : "none";
  PyObject* d = Py_BuildValue(
      "{sKsKsKslsnsKsKsKsisisssssNsLsisssnsOsKsKsnsdsdsLsKsKsKsKsKsKsK}", "records",
      (unsigned long long)completed.records, "dropped_records", (unsigned long long)completed.dropped_records,
      "pending_records", (unsigned long long)writer_done_count(), "open_stages", open_stages, "events_in_flight",
      (Py_ssize_t)pending_count(), "events_dropped", (unsigned long long)events.events_dropped, "events_recorded",
      (unsigned long long)events.events_recorded, "events_shared", (unsigned long long)events.events_shared,
      "event_pool_size", events.pool_total, "event_pool_max", events.pool_max, "gpu_backend", backend, "markers",
      marker_kind, "errors", errs, "event_share_ns", (long long)events.share_ns, "gpu_contexts",
      (int)events.ctxs.size(), "gpu_library", vendor.gpu.lib_name.c_str(), "capacity", (Py_ssize_t)completed.capacity,
      "gpu_off_after_fork", events.gpu_off_after_fork ? Py_True : Py_False, "errors_dropped",
      (unsigned long long)process.errors_dropped, "events_skipped_capture", (unsigned long long)events.events_capture,
      "threads", (Py_ssize_t)process.threads.size(), "gpu_budget", events.gpu_budget, "gpu_budget_tokens_ns",
      events.budget_tokens_ns, "gpu_cost_ns", (long long)events.gpu_cost_ns, "gpu_sampled_out",
      (unsigned long long)events.gpu_sampled_out, "event_elapsed_async", (unsigned long long)placer::state.calls.load(),
      "placer_ns", (unsigned long long)placer::state.ns.load(), "placer_batches",
      (unsigned long long)placer::state.batches.load(), "placer_errors", (unsigned long long)placer::state.errors.load(),
      "attrs_unconverted", (unsigned long long)process.attrs_unconverted, "depth_refused",
      (unsigned long long)process.depth_refused);
  if (!d) return nullptr;
  bool ok = !events.time_driver ||
            set_new(d, "driver_time_ns",
                    Py_BuildValue("{sKsKsKsKsK}", "event_record", (unsigned long long)events.drv_ns[DRV_RECORD],
                                  "event_query", (unsigned long long)events.drv_ns[DRV_QUERY], "event_elapsed",
                                  (unsigned long long)events.drv_ns[DRV_ELAPSED], "stream_is_capturing",
                                  (unsigned long long)events.drv_ns[DRV_CAPTURING], "resolve_front",
                                  (unsigned long long)events.drv_ns[DRV_RESOLVE]));
  // Per context, the floor taken out of its GPU times and how it was set (docs/stage-core.md).
  PyObject* fl = PyList_New(0);
  PyObject* fs = PyList_New(0);
  ok = ok && fl && fs;
  for (size_t i = 0; ok && i < events.ctxs.size(); i++) {
    const int st = events.ctxs[i].floor_state;
    ok = append_new(fl, PyLong_FromLongLong(events.ctxs[i].floor_ns)) &&
         append_new(fs, PyUnicode_FromString(st == 1 ? "calibrated" : st == 2 ? "fixed" : st == -1 ? "failed" : "none"));
  }
  ok = ok && PyDict_SetItemString(d, "gpu_floor_ns", fl) == 0 && PyDict_SetItemString(d, "gpu_floor", fs) == 0 &&
       set_new(d, "event_queries", PyLong_FromUnsignedLongLong(events.event_queries)) &&
       set_new(d, "event_elapsed_calls", PyLong_FromUnsignedLongLong(events.event_elapsed));
  Py_XDECREF(fl);
  Py_XDECREF(fs);
  if (!ok) Py_CLEAR(d);
  return d;
}

// After fork() the child starts clean (docs/stage-core.md, "fork()"); only trivial work in fork().
void atfork_child() {
  placer::atfork_child();
  process.pid = (int64_t)getpid();
  process.seq = 0;
  process.fork_gen++;
  process.steady_n = -1;  // the child's part starts no capture (its reference is leaked: no Python here)
  process.steady_hook = nullptr;
  process.steady_counts.clear();
  tls_ts = nullptr;
  tls_guard.ts = nullptr;
  process.threads.clear();  // the parent's thread states are leaked on purpose (no Python calls here)
  completed.done.clear();
  completed.attrs.clear();
  completed.done_head = completed.done_pushed = completed.done_drained = completed.attrs_head = 0;
  completed.records = completed.dropped_records = name_table.reported = 0;
  // per-process counts: the child's part says its own
  process.attrs_unconverted = process.depth_refused = 0;
  events.pending.clear();
  events.slots.clear();
  events.ctxs.clear();
  events.last_ctx = -1;
  events.pool_total = 0;
  if (vendor.gpu.backend != BK_NONE) events.gpu_off_after_fork = true;
  vendor.gpu_tried = true;
  correlation.on = false;  // CUPTI does not follow a fork
  cupti_buffers_atfork_child();  // nor do its buffers
}

PyMethodDef module_methods[] = {
    {"clock_ns", py_clock_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns: the host clock of all records and samples."},
    {"set_enabled", py_set_enabled, METH_O, "Process-wide enable/disable of stages and marks."},
    {"is_enabled", py_is_enabled, METH_NOARGS, "Whether stages are recorded."},
    {"_env_flag", py_env_flag, METH_VARARGS, "_env_flag(name, default): a yes/no variable as the core reads it."},
    {"steady_watch", py_steady_watch, METH_VARARGS,
     "steady_watch(n, hook): call hook(name_id, t_ns) once, at the first top-level stage entered whose name was "
     "entered n times before (the steady-state trigger, maxinstr/warmup.py); n < 0 or hook None: off."},
    {"_set_attrs_hook", py_set_attrs_hook, METH_O,
     "_set_attrs_hook(fn): fn(attrs) -> plain-data dict, called at stage exit for attrs holding other than "
     "str/int/float/bool/None (maxinstr._attrs.plain)."},
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
    {"_configure_events", (PyCFunction)(void (*)(void))py_configure_events, METH_VARARGS | METH_KEYWORDS,
     "Event pool bound, boundary-sharing window, GPU floor and GPU-timing budget."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_native", "maxinstr native stage core", -1, module_methods,
                          nullptr, nullptr, nullptr, nullptr};

PyMethodDef* const unit_methods[] = {
    stage_module_methods, profiler_methods, cupti_link_methods, launch_tags_methods, cupti_buffers_methods,
    attrs_json_methods,
#if MAXINSTR_BENCH_PROBES
    probe_methods,
#endif
    writer_methods,
};

}  // namespace

}  // namespace maxinstr

extern "C" PyMODINIT_FUNC PyInit__native(void) {
  using namespace maxinstr;
  if (!stage_types_ready()) return nullptr;

  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  for (PyMethodDef* defs : unit_methods)
    if (PyModule_AddFunctions(m, defs) < 0) return nullptr;
  name_table.dict = PyDict_New();
  if (!name_table.dict || !stage_module_add(m)) return nullptr;
  PyModule_AddIntConstant(m, "RECORD_SIZE", (long)sizeof(Record));
  PyModule_AddIntConstant(m, "FLAG_EXCEPTION", F_EXCEPTION);
  PyModule_AddIntConstant(m, "FLAG_GPU_TIMED", F_GPU_TIMED);
  PyModule_AddIntConstant(m, "FLAG_MARK", F_MARK);
  PyModule_AddIntConstant(m, "FLAG_GPU_DROPPED", F_GPU_DROPPED);
  PyModule_AddIntConstant(m, "FLAG_UNCLOSED", F_UNCLOSED);
  PyModule_AddIntConstant(m, "FLAG_GPU_SAMPLED_OUT", F_GPU_SAMPLED_OUT);

  process.pid = (int64_t)getpid();
  // the MAXINSTR_* variables the core reads (docs/sessions.md), with base.h's rules
  if (env_flag("MAXINSTR_DISABLE", false)) process.enabled = false;
  events.pool_max = (int)env_int("MAXINSTR_EVENT_POOL", events.pool_max, 4);
  events.share_ns = env_int("MAXINSTR_EVENT_SHARE_NS", events.share_ns, 0);
  events.time_driver = env_flag("MAXINSTR_TIME_DRIVER", events.time_driver);
  events.gpu_budget = env_double("MAXINSTR_GPU_BUDGET", events.gpu_budget);
  const char* floor = env("MAXINSTR_GPU_FLOOR_NS");  // unset or "auto": calibrate per context
  if (floor && strcmp(floor, "auto") != 0) events.floor_fixed = env_int("MAXINSTR_GPU_FLOOR_NS", -1, 0);
  init_markers();
  pthread_atfork(nullptr, nullptr, atfork_child);
  writer_init();
  placer::state.on = env_flag("MAXINSTR_ASYNC_PLACE", placer::state.on);
  Py_AtExit(placer::shutdown);
  return m;
}
