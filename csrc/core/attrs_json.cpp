// attrs_lines(): attrs.jsonl lines byte for byte as rundir.writer.attrs_line makes them. Why C++: a
// json.dumps per record cost 3 to 6 us, slower than a loop records them (a close with a million
// pending attrs took 12 s, issue 29); a line here costs about a tenth of that.
#include "attrs_json.h"

#include <cmath>
#include <string>

namespace maxinstr MAXINSTR_HIDDEN {

void json_escape_into(std::string& out, const char* s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    const unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c != '"' && c != '\\') {
      out += (char)c;  // UTF-8 as is (json.dumps's ensure_ascii=False)
    } else if (c >= 0x20 || (c >= '\b' && c <= '\r' && c != '\v')) {
      out += '\\';
      out += c >= 0x20 ? (char)c : "btn?fr"[c - '\b'];  // \b \t \n \f \r are 8, 9, 10, 12, 13
    } else {
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
}

namespace {

// x of an int, false (no exception set) when it is not one that fits a long long.
bool to_ll(PyObject* v, long long* x) {
  int overflow = 0;
  *x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (!overflow && !(*x == -1 && PyErr_Occurred())) return true;
  PyErr_Clear();
  return false;
}

// A quoted JSON string (json_escape_into); false (no exception set) for a str with a lone
// surrogate: the Python path escapes it.
bool put_str(std::string& out, PyObject* s) {
  Py_ssize_t n = 0;
  const char* u = PyUnicode_AsUTF8AndSize(s, &n);
  if (!u) {
    PyErr_Clear();
    return false;
  }
  out += '"';
  json_escape_into(out, u, (size_t)n);
  out += '"';
  return true;
}

// One JSON scalar as json.dumps writes it; false for anything else (the Python path takes it).
bool put_value(std::string& out, PyObject* v) {
  if (v == Py_None) {
    out += "null";
  } else if (v == Py_True) {
    out += "true";
  } else if (v == Py_False) {
    out += "false";
  } else if (PyLong_CheckExact(v)) {
    long long x = 0;
    if (!to_ll(v, &x)) return false;
    out += std::to_string(x);
  } else if (PyFloat_CheckExact(v)) {
    double d = PyFloat_AS_DOUBLE(v);
    if (std::isnan(d)) {
      out += "NaN";
    } else if (std::isinf(d)) {
      out += d > 0 ? "Infinity" : "-Infinity";
    } else {
      char* text = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);  // float.__repr__
      if (!text) {
        PyErr_Clear();
        return false;
      }
      out += text;
      PyMem_Free(text);
    }
  } else if (PyUnicode_CheckExact(v)) {
    return put_str(out, v);
  } else {
    return false;
  }
  return true;
}

// The line of one pair, appended to out; false (out as it was) when the pair is not simple.
bool put_line(std::string& out, PyObject* item) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) return false;
  PyObject* rid = PyTuple_GET_ITEM(item, 0);
  PyObject* attrs = PyTuple_GET_ITEM(item, 1);
  long long id = 0;
  if (!PyLong_CheckExact(rid) || !PyDict_CheckExact(attrs) || !to_ll(rid, &id)) return false;
  size_t mark = out.size();
  out += "{\"id\":";
  out += std::to_string(id);
  out += ",\"attrs\":{";
  Py_ssize_t pos = 0;
  PyObject *k, *v;
  bool first = true;
  while (PyDict_Next(attrs, &pos, &k, &v)) {
    if (!first) out += ',';
    first = false;
    if (!PyUnicode_CheckExact(k) || !put_str(out, k) || (out += ':', !put_value(out, v))) {
      out.resize(mark);
      return false;
    }
  }
  out += "}}\n";
  return true;
}

PyObject* py_attrs_lines(PyObject*, PyObject* arg) {
  PyObject* seq = PySequence_Fast(arg, "attrs_lines takes a list of (record_id, attrs) pairs");
  if (!seq) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  std::string out;
  out.reserve((size_t)n * 40);
  PyObject* rest = PyList_New(0);
  if (!rest) {
    Py_DECREF(seq);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    if (put_line(out, items[i])) continue;
    if (PyList_Append(rest, items[i]) < 0) {
      Py_DECREF(rest);
      Py_DECREF(seq);
      return nullptr;
    }
  }
  Py_DECREF(seq);
  return Py_BuildValue("(y#N)", out.data(), (Py_ssize_t)out.size(), rest);
}

}  // namespace

PyMethodDef attrs_json_methods[] = {
    {"attrs_lines", py_attrs_lines, METH_O,
     "attrs_lines(pairs) -> (bytes, rest): attrs.jsonl lines of the (record_id, attrs) pairs of JSON "
     "scalars, the other pairs in rest."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace maxinstr
