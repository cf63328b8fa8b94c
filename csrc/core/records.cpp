// Records (records.h): interning names, and the producer end of the completed-record queue.
#include "records.h"

#include "markers.h"
#include "writer.h"

namespace maxinstr MAXINSTR_HIDDEN {

NameTable name_table;
CompletedRecords completed;

void push_done(const Record& r, PyObject* attrs) {
  completed.records++;
  const bool locked = writer.running;  // the native writer takes completed.done concurrently (writer.h)
  if (locked) pthread_mutex_lock(&writer.mu);
  if (UNLIKELY(done_count() >= completed.capacity)) {
    completed.dropped_records++;
    if (locked) pthread_mutex_unlock(&writer.mu);
    return;
  }
  if (attrs && PyDict_GET_SIZE(attrs) > 0) {
    if (UNLIKELY(locked && completed.attrs.size() - completed.attrs_head >= completed.capacity)) {
      writer.dropped_attrs++;  // the Python flusher has not taken attrs for a whole buffer's worth
    } else {
      Py_INCREF(attrs);
      completed.attrs.push_back(AttrEntry{completed.done_pushed, r.id, attrs});
    }
  }
  completed.done.push_back(r);
  completed.done_pushed++;
  if (locked) {
    writer_after_push();
    pthread_mutex_unlock(&writer.mu);
  }
}

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
  PyObject* shown = name;  // the name as recorded
  PyObject* escaped = nullptr;
  if (!u) {
    // A lone surrogate (os.fsdecode of a non-UTF-8 file name) has no UTF-8: record the name
    // with it escaped as \udcff, as the readers show it (maxinstr/_text.py safe_name).
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
    PyErr_Clear();
    PyObject* b = PyUnicode_AsEncodedString(name, "utf-8", "backslashreplace");
    if (!b) return -1;
    escaped = PyUnicode_FromEncodedObject(b, "utf-8", "strict");
    Py_DECREF(b);
    if (!escaped) return -1;
    u = PyUnicode_AsUTF8AndSize(escaped, &n);
    if (!u) {
      Py_DECREF(escaped);
      return -1;
    }
    shown = escaped;
  }
  int32_t id = (int32_t)name_table.entries.size();
  PyObject* idobj = PyLong_FromLong(id);
  if (!idobj) {
    Py_XDECREF(escaped);
    return -1;
  }
  if (PyDict_SetItem(name_table.dict, name, idobj) < 0) {
    Py_DECREF(idobj);
    Py_XDECREF(escaped);
    return -1;
  }
  Py_DECREF(idobj);
  NameEntry e;
  e.str = shown;
  if (!escaped) Py_INCREF(shown);  // (escaped: its reference moves into the entry)
  e.utf8.assign(u, (size_t)n);
  e.nvtx = marker_register(e.utf8);
  writer_add_name(e.utf8);
  name_table.entries.push_back(std::move(e));
  return id;
}

}  // namespace maxinstr
