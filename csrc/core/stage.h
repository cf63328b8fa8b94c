// The Stage type: a raw CPython type, because the hot path (`with stage("x"): ...`) must cost a
// few hundred ns at most and an empty *Python* context manager already costs ~230 ns.
#pragma once

#include "base.h"

#include "cupti_link.h"
#include "markers.h"
#include "records.h"
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

enum : uint8_t { ST_IDLE = 0, ST_OPEN = 1, ST_ZOMBIE = 2 };

// A bound __enter__/__exit__ embedded in its Stage (see BoundDescr in stage.cpp).
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

// CUPTI external correlation (cupti_link.h): one push at enter, one pop at exit.
inline void cupti_enter(StageObject* s, int64_t id) {
  if (correlation.on) {
    if (LIKELY(correlation.push(correlation.kind, (uint64_t)id) == 0)) {
      s->cupti_pushed = 1;
      correlation.pushes++;
    } else {
      correlation.errors++;
    }
  }
}

inline void cupti_exit(StageObject* s) {
  if (s->cupti_pushed) {
    uint64_t last = 0;
    if (UNLIKELY(correlation.pop(correlation.kind, &last) != 0)) correlation.errors++;
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
// their marker ranges. Only on the stack's own thread: markers are per thread.
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

// Finishes s's record at host time t (GPU exit event, then pending or done). Stack untouched.
void stage_finish(StageObject* s, int64_t t, uint16_t flags, PyObject* attrs_override);

// Module init: the types readied before the module exists, then added to m (false: an error set).
bool stage_types_ready();
bool stage_module_add(PyObject* m);

extern PyMethodDef stage_module_methods[];

}  // namespace maxinstr
