// The Stage type (stage.h): enter/exit, the decorator, the no-op stage, stage() and mark().
#include "stage.h"

#include <cstddef>

#include "dispatch.h"
#include "events.h"
#include "floor.h"
#include "writer.h"

namespace maxinstr MAXINSTR_HIDDEN {

namespace {

// The name_id of `name` (a str), interning it on first sight: registered with the markers and
// handed to the native writer. -1 with a Python error set.
int32_t intern_name(PyObject* name) {
  PyObject* v = PyDict_GetItemWithError(name_table.dict, name);
  if (LIKELY(v != nullptr)) return (int32_t)PyLong_AS_LONG(v);
  if (PyErr_Occurred()) return -1;
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "stage name must be str, not %.80s", Py_TYPE(name)->tp_name);
    return -1;
  }
  Py_ssize_t n = 0;
  const char* u = PyUnicode_AsUTF8AndSize(name, &n);
  PyObject* shown = u ? Py_NewRef(name) : nullptr;  // the name as recorded
  if (!u) {
    // A lone surrogate (os.fsdecode of a non-UTF-8 file name) has no UTF-8: record the name
    // with it escaped as \udcff, as the readers show it (maxinstr/_text.py safe_name).
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
    PyErr_Clear();
    PyObject* b = PyUnicode_AsEncodedString(name, "utf-8", "backslashreplace");
    if (!b) return -1;
    shown = PyUnicode_FromEncodedObject(b, "utf-8", "strict");
    Py_DECREF(b);
    if (!shown || !(u = PyUnicode_AsUTF8AndSize(shown, &n))) {
      Py_XDECREF(shown);
      return -1;
    }
  }
  int32_t id = (int32_t)name_table.entries.size();
  PyObject* idobj = PyLong_FromLong(id);
  if (!idobj || PyDict_SetItem(name_table.dict, name, idobj) < 0) {
    Py_XDECREF(idobj);
    Py_DECREF(shown);
    return -1;
  }
  Py_DECREF(idobj);
  NameEntry e;
  e.str = shown;  // its reference moves into the entry
  e.utf8.assign(u, (size_t)n);
  e.nvtx = marker_register(e.utf8);
  writer_add_name(e.utf8);
  name_table.entries.push_back(std::move(e));
  return id;
}

// The index of context `key` (current), paired and calibrated on first use; -1 while its pairing
// fails (retried at most once a second: a graph capture may be running). Inlined into stage enter.
inline int ctx_index(void* key) {
  int c = events.last_ctx;
  if (c < 0 || events.ctxs[(size_t)c].key != key) {
    c = -1;
    for (size_t i = 0; i < events.ctxs.size(); i++)
      if (events.ctxs[i].key == key) c = (int)i;
    if (c < 0) {  // first met: paired below, as a failed pairing is retried
      Ctx cx;
      cx.key = key;
      events.ctxs.push_back(cx);
      c = (int)events.ctxs.size() - 1;
    }
  }
  events.last_ctx = c;
  if (LIKELY(events.ctxs[(size_t)c].ok)) return c;
  int64_t t = now_ns();
  if (t < events.ctxs[(size_t)c].retry_ns) return -1;
  const bool ok = ctx_pair_reference(c);
  events.ctxs[(size_t)c].ok = ok;
  if (!ok) events.ctxs[(size_t)c].retry_ns = t + 1000000000LL;
  else ctx_calibrate(c);
  return events.ctxs[(size_t)c].ok ? c : -1;
}

PyTypeObject StageType;
PyTypeObject NoopType;
PyTypeObject BoundType;
PyTypeObject BoundDescrType;
PyObject* noop_stage = nullptr;
PyObject* decorator_wrap = nullptr;  // maxinstr.record.stage.wrap, imported on first decorator use
PyObject *kw_stream, *kw_gpu, *kw_step;

constexpr int kFreeMax = 256;
StageObject* free_stages[kFreeMax];
int free_count = 0;

PyObject* bound_enter_vc(PyObject* b, PyObject* const* args, size_t nargsf, PyObject* kw);
PyObject* bound_exit_vc(PyObject* b, PyObject* const* args, size_t nargsf, PyObject* kw);

StageObject* stage_alloc() {
  StageObject* s;
  if (LIKELY(free_count > 0)) {
    s = free_stages[--free_count];
    PyObject_Init((PyObject*)s, &StageType);
  } else {
    s = PyObject_New(StageObject, &StageType);
    if (!s) return nullptr;
  }
  // Zero the embedded objects' headers, not Py_SET_REFCNT(b, 0): on Python >= 3.12 that does
  // nothing to a count that reads as immortal (old memory), and such a bound object then took no
  // reference on its Stage: freed while open (tests/core/test_stage_lifetime.py).
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
  s->gen = process.fork_gen;
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
  if (free_count < kFreeMax)
    free_stages[free_count++] = s;
  else
    PyObject_Free(o);
}

// The depth column is an int16: deeper stages and marks are not recorded (their block runs as
// usual), counted in stats()["depth_refused"] and warned once (docs/stage-core.md, "Records").
constexpr int kMaxDepth = INT16_MAX;

bool refuse_depth(StageObject* parent) {
  if (LIKELY(!parent || parent->rec.depth < kMaxDepth)) return false;
  if (process.depth_refused++ == 0) {
    add_error("stages nested deeper than 32767 levels are not recorded");
    if (PyErr_WarnEx(PyExc_RuntimeWarning,
                     "maxinstr: stages nested deeper than 32767 levels are not recorded (counted in the run)", 1) < 0)
      PyErr_Clear();  // warnings turned into errors: the program is never broken for it
  }
  return true;
}

PyObject* stage_enter(PyObject* o, PyObject*) {
  StageObject* s = (StageObject*)o;
  if (UNLIKELY(s->state != ST_IDLE && s->gen == process.fork_gen)) {
    PyErr_SetString(PyExc_RuntimeError, "this stage is already entered; create a new one with maxinstr.stage()");
    return nullptr;
  }
  ThreadState* ts = get_ts();
  if (UNLIKELY(!ts->stack.empty() && ts->stack.back()->state == ST_ZOMBIE)) pop_zombies(ts);
  StageObject* parent = innermost_open(ts);
  if (UNLIKELY(refuse_depth(parent))) {
    Py_INCREF(o);  // not recorded: the stage stays idle, so its exit does nothing
    return o;
  }
  // before the range and GPU event: a capture the trigger starts holds the whole instance
  if (UNLIKELY(process.steady_n >= 0)) steady_enter(s->rec.name_id, parent == nullptr);
  Record& r = s->rec;
  const bool probe = UNLIKELY(tls_probe != 0);
  r.id = probe ? 0 : next_id();
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
  s->gen = process.fork_gen;
  s->ts = ts;
  s->gpu_ctx = -1;
  s->ev0 = -1;
  Py_INCREF(o);
  ts->stack.push_back(s);
  // The context is looked up (the first time, paired and calibrated) before the range is pushed:
  // the calibration kernels never sit inside a stage's range.
  void* key = nullptr;
  int c = -1;
  // The budget decides once per top-level stage; its children follow it (a step is timed whole).
  if (!parent) ts->gpu_skip = events.gpu_budget_t0 != 0 && events.gpu_budget > 0 && budget_skips(now_ns());
  bool timed = s->gpu_mode == 1 || (s->gpu_mode == -1 && !ts->gpu_skip);
  if (s->gpu_mode == -1 && !timed) {
    r.flags |= F_GPU_SAMPLED_OUT;
    events.gpu_sampled_out++;
  }
  if (timed && !events.gpu_off_after_fork) {
    gpu_try_load();
    key = vendor.gpu.backend ? gpu_current_key() : nullptr;
    if (key) c = ctx_index(key);
  }
  if (!probe) {
    marker_at(r.name_id, r.id, false);
    cupti_enter(s, r.id);
  }
  if (timed && !events.gpu_off_after_fork) {
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
    } else if (s->gpu_mode == 1 && !events.warned_no_ctx) {
      events.warned_no_ctx = true;
      add_error(vendor.gpu.backend ? "gpu=True but no GPU context is current on this thread: host times only"
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

// What a record keeps of `attrs` (new reference or NULL): the dict when every value is a JSON
// scalar, else the hook's plain-data copy; a failing hook keeps none (counted, no exception set).
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
  if (simple || !process.attrs_hook) {
    Py_INCREF(attrs);
    return attrs;
  }
  PyObject* out = PyObject_CallOneArg(process.attrs_hook, attrs);
  if (!out || !PyDict_Check(out)) {
    Py_XDECREF(out);
    PyErr_Clear();
    process.attrs_unconverted++;
    return nullptr;
  }
  return out;
}

}  // namespace

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
      events.pending.push_back(Pending{r, s->ev0, ev1, s->gpu_ctx, s->stream, attrs});
      s->ev0 = -1;
      s->gpu_ctx = -1;
      // Opportunistic (most resolution is the session's): one query per stream resolves a batch, so
      // every 32nd GPU exit, or every 8th while more than a quarter of the pool waits.
      uint64_t x = ++events.gpu_exits;
      if ((x & 31) == 0 || ((x & 7) == 0 && (int)pending_count() * 4 > events.pool_max)) {
        int64_t t0 = now_ns();
        resolve_front(64, (int)pending_count() * 4 <= events.pool_max);  // under pool pressure: inline
        events.gpu_cost_ns += now_ns() - t0;
      }
      return;
    }
    slot_release(s->ev0);
    s->ev0 = -1;
    s->gpu_ctx = -1;
    if (!(flags & F_UNCLOSED)) r.flags |= F_GPU_DROPPED;
  }
  if (UNLIKELY(tls_probe != 0)) return;
  push_done(r, attrs);
}

namespace {

PyObject* stage_exit(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  int64_t t = now_ns();
  StageObject* s = (StageObject*)o;
  if (UNLIKELY(s->state != ST_OPEN || s->gen != process.fork_gen)) Py_RETURN_FALSE;  // closed by close_open / fork
  if (s->attrs) {
    PyObject* kept = record_attrs(s->attrs);
    Py_SETREF(s->attrs, kept);
    // the hook ran Python (a user's __str__, a signal handler): the stage may be closed by now
    if (UNLIKELY(s->state != ST_OPEN || s->gen != process.fork_gen)) Py_RETURN_FALSE;
  }
  uint16_t flags = (nargs > 0 && args[0] != Py_None) ? F_EXCEPTION : 0;
  stage_finish(s, t, flags, nullptr);
  ThreadState* ts = s->ts;
  if (LIKELY(ts == tls_ts && ts->stack.back() == s)) {
    ts->stack.pop_back();
    if (LIKELY(tls_probe == 0)) {
      cupti_exit(s);
      marker_pop();
    }
    s->state = ST_IDLE;
    if (UNLIKELY(!ts->stack.empty() && ts->stack.back()->state == ST_ZOMBIE)) pop_zombies(ts);
    Py_DECREF(o);  // the caller still holds a reference
  } else {
    // Exited out of order or on another thread (docs/stage-core.md, "Non-nested exits"): the
    // record is complete, its range stays pushed until everything above it there is popped.
    s->state = ST_ZOMBIE;
  }
  Py_RETURN_FALSE;
}

// Decorator use: @stage("name") -> maxinstr.record.stage.wrap(stage, func)
PyObject* stage_call(PyObject* o, PyObject* args, PyObject* kwargs) {
  if (!decorator_wrap) {
    PyObject* m = PyImport_ImportModule("maxinstr.record.stage");
    if (!m) return nullptr;
    decorator_wrap = PyObject_GetAttrString(m, "wrap");
    Py_DECREF(m);
    if (!decorator_wrap) return nullptr;
  }
  if (kwargs && PyDict_GET_SIZE(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "a stage used as a decorator takes the function only");
    return nullptr;
  }
  if (PyTuple_GET_SIZE(args) != 1 || !PyCallable_Check(PyTuple_GET_ITEM(args, 0))) {
    PyErr_SetString(PyExc_TypeError, "a stage used as a decorator takes one callable");
    return nullptr;
  }
  return PyObject_CallFunctionObjArgs(decorator_wrap, o, PyTuple_GET_ITEM(args, 0), nullptr);
}

// (name, kwargs) that recreate this stage: the decorator makes a fresh stage per call.
PyObject* stage_spec(PyObject* o, PyObject*) {
  StageObject* s = (StageObject*)o;
  PyObject* kw = s->attrs ? PyDict_Copy(s->attrs) : PyDict_New();
  if (!kw) return nullptr;
  auto put = [kw](PyObject* k, PyObject* v) {
    const bool ok = v && PyDict_SetItem(kw, k, v) == 0;
    Py_XDECREF(v);
    return ok;
  };
  if (!put(kw_stream, s->stream ? PyLong_FromUnsignedLongLong(s->stream) : Py_NewRef(Py_None)) ||
      !put(kw_gpu, Py_NewRef(s->gpu_mode < 0 ? Py_None : (s->gpu_mode ? Py_True : Py_False))) ||
      !put(kw_step, s->step_arg >= 0 ? PyLong_FromLongLong(s->step_arg) : Py_NewRef(Py_None))) {
    Py_DECREF(kw);
    return nullptr;
  }
  return Py_BuildValue("(ON)", s->name, kw);
}

PyObject* stage_get_name(PyObject* o, void*) { return Py_NewRef(((StageObject*)o)->name); }
PyObject* stage_get_id(PyObject* o, void*) { return PyLong_FromLongLong(((StageObject*)o)->rec.id); }
PyObject* stage_get_attrs(PyObject* o, void*) {
  PyObject* a = ((StageObject*)o)->attrs;
  return a ? PyDict_Copy(a) : PyDict_New();
}
PyObject* stage_get_open(PyObject* o, void*) {
  StageObject* s = (StageObject*)o;
  return PyBool_FromLong(s->state == ST_OPEN && s->gen == process.fork_gen);
}

PyObject* stage_repr(PyObject* o) {
  StageObject* s = (StageObject*)o;
  return PyUnicode_FromFormat("<maxinstr.stage %R id=%lld%s>", s->name, (long long)s->rec.id,
                              s->state == ST_OPEN ? " open" : "");
}

// `with` binds __enter__/__exit__, a new bound method each time (~20 ns apiece): each Stage embeds
// its two instead, handed out by descriptors. One holds a reference to its Stage while its own
// count is above zero (taken on 0 -> 1 in descr_get, given back on 1 -> 0); its memory is the Stage's.
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
void bound_dealloc(PyObject* b) { Py_DECREF(((BoundObject*)b)->owner); }  // memory stays: the Stage's
PyObject* bound_repr(PyObject* b) {
  BoundObject* o = (BoundObject*)b;
  return PyUnicode_FromFormat("<bound %s of %R>", o->vc == bound_enter_vc ? "__enter__" : "__exit__", o->owner);
}

struct BoundDescr {
  PyObject_HEAD
  int which;  // 0 enter, 1 exit
};
PyObject* bound_descr_get(PyObject* d, PyObject* obj, PyObject*) {
  if (!obj) return Py_NewRef(d);
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
  return Py_NewRef(PyTuple_GET_ITEM(args, 0));
}
PyObject* noop_repr(PyObject*) { return PyUnicode_FromString("<maxinstr.stage (disabled)>"); }
// __enter__/__exit__ of the no-op are plain builtin functions in the type's dict, not method
// descriptors: `with` binds nothing (~40 ns of the ~70 ns a disabled stage would cost).
PyObject* noop_fn_enter(PyObject*, PyObject*) { return Py_NewRef(noop_stage); }
PyMethodDef noop_fn_defs[] = {{"__enter__", (PyCFunction)noop_fn_enter, METH_NOARGS, nullptr},
                              {"__exit__", (PyCFunction)(void (*)(void))noop_exit, METH_FASTCALL, nullptr}};

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
  for (const char* attr : {"cuda_stream", "ptr", "native_stream_handle", "handle"}) {
    PyObject* h = PyObject_GetAttrString(v, attr);
    if (!h) PyErr_Clear();
    const bool ok = h && PyLong_Check(h);
    if (ok) *out = (uint64_t)PyLong_AsUnsignedLongLongMask(h);
    Py_XDECREF(h);
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
  if (UNLIKELY(!process.enabled)) return Py_NewRef(noop_stage);
  if (UNLIKELY(nargs != 1)) {
    PyErr_SetString(PyExc_TypeError, "stage(name, *, stream=None, gpu=None, step=None, **attrs)");
    return nullptr;
  }
  PyObject* name = args[0];
  int32_t nid = -1;
  if (LIKELY(tls_probe == 0)) {
    nid = intern_name(name);
    if (UNLIKELY(nid < 0)) return nullptr;
  }
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
      if (kw_is(k, kw_stream)) {
        if (!parse_stream(v, &s->stream)) goto fail;
      } else if (kw_is(k, kw_gpu)) {
        const int t = v == Py_None ? -1 : PyObject_IsTrue(v);
        if (t < 0 && v != Py_None) goto fail;
        s->gpu_mode = (int8_t)t;
      } else if (kw_is(k, kw_step)) {
        const long long st = v == Py_None ? -1 : PyLong_AsLongLong(v);
        if (st < 0 && v != Py_None) {
          if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "step must be >= 0 or None");
          goto fail;
        }
        s->step_arg = st;
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
  if (!process.enabled) Py_RETURN_NONE;
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
  if (UNLIKELY(refuse_depth(parent))) {
    Py_XDECREF(attrs);
    Py_RETURN_NONE;
  }
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
  marker_at(nid, r.id, true);
  push_done(r, attrs);
  Py_XDECREF(attrs);
  Py_RETURN_NONE;
}

}  // namespace

bool stage_types_ready() {
  StageType.tp_name = "maxinstr._native.Stage";
  StageType.tp_basicsize = sizeof(StageObject);
  StageType.tp_dealloc = stage_dealloc;
  StageType.tp_flags = Py_TPFLAGS_DEFAULT;
  StageType.tp_doc = "An instrumented stage: use as a context manager (or decorator via maxinstr.stage).";
  StageType.tp_methods = stage_methods;
  StageType.tp_getset = stage_getset;
  StageType.tp_call = stage_call;
  StageType.tp_repr = stage_repr;
  if (PyType_Ready(&StageType) < 0) return false;
  BoundType.tp_name = "maxinstr._native.BoundStageMethod";
  BoundType.tp_basicsize = sizeof(BoundObject);
  BoundType.tp_dealloc = bound_dealloc;
  BoundType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  BoundType.tp_vectorcall_offset = offsetof(BoundObject, vc);
  BoundType.tp_call = PyVectorcall_Call;
  BoundType.tp_repr = bound_repr;
  if (PyType_Ready(&BoundType) < 0) return false;
  BoundDescrType.tp_name = "maxinstr._native.StageMethodDescriptor";
  BoundDescrType.tp_basicsize = sizeof(BoundDescr);
  BoundDescrType.tp_flags = Py_TPFLAGS_DEFAULT;
  BoundDescrType.tp_descr_get = bound_descr_get;
  if (PyType_Ready(&BoundDescrType) < 0) return false;
#ifndef Py_GIL_DISABLED
  for (int which = 0; which < 2; which++) {
    BoundDescr* d = PyObject_New(BoundDescr, &BoundDescrType);
    if (!d) return false;
    d->which = which;
    if (PyDict_SetItemString(StageType.tp_dict, which ? "__exit__" : "__enter__", (PyObject*)d) < 0) return false;
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
  if (PyType_Ready(&NoopType) < 0) return false;
  for (auto& d : noop_fn_defs) {
    PyObject* f = PyCFunction_New(&d, nullptr);
    if (!f || PyDict_SetItemString(NoopType.tp_dict, d.ml_name, f) < 0) return false;
    Py_DECREF(f);
  }
  PyType_Modified(&NoopType);
  return true;
}

bool stage_module_add(PyObject* m) {
  noop_stage = PyObject_New(PyObject, &NoopType);
  kw_stream = PyUnicode_InternFromString("stream");
  kw_gpu = PyUnicode_InternFromString("gpu");
  kw_step = PyUnicode_InternFromString("step");
  if (!noop_stage || !kw_stream || !kw_gpu || !kw_step) return false;
  Py_INCREF(&StageType);
  PyModule_AddObject(m, "Stage", (PyObject*)&StageType);
  Py_INCREF(&NoopType);
  PyModule_AddObject(m, "NoopStage", (PyObject*)&NoopType);
  Py_INCREF(noop_stage);
  PyModule_AddObject(m, "NOOP", noop_stage);
  return true;
}

// _probing(on): this thread's stages are measured, not recorded (tls_probe): what a stage costs
// on this machine, without a record (record/footprint.py).
PyObject* py_probing(PyObject*, PyObject* on) {
  int t = PyObject_IsTrue(on);
  if (t < 0) return nullptr;
  tls_probe = t;
  Py_RETURN_NONE;
}

PyMethodDef stage_module_methods[] = {
    {"_probing", py_probing, METH_O, "_probing(on): this thread's stages are timed, not recorded (footprint probe)."},
    {"stage", (PyCFunction)(void (*)(void))py_stage, METH_FASTCALL | METH_KEYWORDS,
     "stage(name, *, stream=None, gpu=None, step=None, **attrs) -> Stage"},
    {"mark", (PyCFunction)(void (*)(void))py_mark, METH_FASTCALL | METH_KEYWORDS, "mark(name, **attrs): instant record."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace maxinstr
