// CUPTI external correlation (cupti_link.h): cupti_link() and cupti_stats().
#include "cupti_link.h"

#include "dispatch.h"
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

Correlation correlation;

namespace {

// cupti_link(None) stops (stages already tagged still pop their id).
PyObject* py_cupti_link(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "cupti_link(path_or_None, kind=0)");
    return nullptr;
  }
  if (args[0] == Py_None) {
    correlation.on = false;
    Py_RETURN_TRUE;
  }
  const char* path = PyUnicode_AsUTF8(args[0]);
  if (!path) return nullptr;
  long kind = nargs > 1 ? PyLong_AsLong(args[1]) : 0;
  if (kind == -1 && PyErr_Occurred()) return nullptr;
  if (!cupti_load(path)) {
    add_error(std::string("cupti: ") + path + " is not loaded in this process");
    Py_RETURN_FALSE;
  }
  if (!vendor.cupti.push_external_id || !vendor.cupti.pop_external_id) {
    add_error(std::string("cupti: ") + path + " lacks cuptiActivityPush/PopExternalCorrelationId");
    Py_RETURN_FALSE;
  }
  correlation.push = vendor.cupti.push_external_id;
  correlation.pop = vendor.cupti.pop_external_id;
  correlation.kind = (int)kind;
  correlation.on = true;
  Py_RETURN_TRUE;
}

PyObject* py_cupti_stats(PyObject*, PyObject*) {
  return Py_BuildValue("{sOsKsK}", "on", correlation.on ? Py_True : Py_False, "pushes",
                       (unsigned long long)correlation.pushes, "errors", (unsigned long long)correlation.errors);
}

}  // namespace

PyMethodDef cupti_link_methods[] = {
    {"cupti_link", (PyCFunction)(void (*)(void))py_cupti_link, METH_FASTCALL,
     "cupti_link(path_or_None, kind=0) -> bool: tag stages with CUPTI external correlation ids (libcupti at path)."},
    {"cupti_stats", py_cupti_stats, METH_NOARGS, "cupti_stats() -> {'on', 'pushes', 'errors'}."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace maxinstr
