// Process-wide state (state.h).
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

Process process;

void add_error(const std::string& msg) {
  for (auto& e : process.errors)
    if (e == msg) return;
  if (process.errors.size() >= 64) {
    process.errors_dropped++;
    return;
  }
  process.errors.push_back(msg);
}

// Called with the GIL, before the stage is on its thread's stack: the hook (Python) may release
// the GIL, so the trigger disarms itself first and fires once.
void steady_enter(int32_t name_id, bool top) {
  if (name_id < 0) return;
  size_t i = (size_t)name_id;
  if (i >= process.steady_counts.size()) process.steady_counts.resize(i + 1, 0);
  uint32_t before = process.steady_counts[i]++;
  if (!top || (int64_t)before < process.steady_n) return;
  process.steady_n = -1;
  process.steady_counts.clear();
  PyObject* hook = process.steady_hook;
  process.steady_hook = nullptr;
  if (!hook) return;
  // the enter's own time is taken after this: the hook's time is in no stage
  PyObject* r = PyObject_CallFunction(hook, "iL", (int)name_id, (long long)now_ns());
  if (!r) {
    PyErr_Clear();
    add_error("steady-state trigger: the session's hook raised");
  }
  Py_XDECREF(r);
  Py_DECREF(hook);
}

}  // namespace maxinstr
