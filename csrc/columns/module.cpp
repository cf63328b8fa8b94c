// maxinstr._columns: the bindings of the columns units (docs/architecture.md, "The native core").
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "btree.h"
#include "groups.h"
#include "intervals.h"
#include "query.h"
#include "sqlite.h"

namespace py = pybind11;
using namespace columns;

namespace {

using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
using U8 = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

// numpy takes the vector over: no copy; the capsule frees it with the array.
template <typename T>
py::array adopt(std::vector<T>* v) {
  py::capsule owner(v, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(v->size())}, {static_cast<py::ssize_t>(sizeof(T))}, v->data(),
                        owner);
}

// f() with the GIL released: the unit's work.
template <typename F>
auto nogil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

py::list decode_all(const std::vector<std::string>& strings) {
  py::list out;
  for (const auto& s : strings) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
    if (!o) throw py::error_already_set();
    out.append(py::reinterpret_steal<py::str>(o));
  }
  return out;
}

// Gives freed heap memory back to the OS (glibc): false where there is no such call.
bool trim_heap() {
#if defined(__GLIBC__)
  return malloc_trim(0) != 0;
#else
  return false;
#endif
}

py::list py_query_many(const std::string& uri, const std::vector<py::tuple>& specs, int threads, bool trim) {
  require();
  // Each spec: (sql, kinds[, filter_column, uint8 mask[, expected_rows]]). Pointers are taken
  // while the GIL is held; `masks` keeps the arrays alive for the call.
  std::vector<Query> queries(specs.size());
  std::vector<U8> masks;
  for (size_t i = 0; i < specs.size(); ++i) {
    const py::tuple& t = specs[i];
    Query& q = queries[i];
    q.sql = t[0].cast<std::string>();
    q.kinds = t[1].cast<std::string>();
    if (t.size() >= 5 && !t[4].is_none()) q.filter.reserve = t[4].cast<int64_t>();
    if (t.size() >= 4 && !t[3].is_none()) {
      masks.emplace_back(t[3].cast<U8>());
      q.filter.col = t[2].cast<int>();
      q.filter.mask = masks.back().data();
      q.filter.size = masks.back().size();
      if (q.filter.col < 0 || q.filter.col >= static_cast<int>(q.kinds.size()))
        throw std::runtime_error("filter column out of range");
    }
  }
  nogil([&] { run_queries(uri, queries, threads); });
  for (auto& q : queries)
    if (!q.error.empty()) throw std::runtime_error(q.error);
  py::list out;
  for (auto& q : queries) {
    py::list cols;
    for (auto& col : q.columns) {
      if (col.ints)
        cols.append(adopt(col.ints.release()));
      else if (col.reals)
        cols.append(adopt(col.reals.release()));
      else if (col.kind == 'n')
        cols.append(adopt(col.narrow.release()));
      else
        cols.append(py::make_tuple(adopt(col.narrow.release()), decode_all(col.values)));
    }
    out.append(cols);
  }
  // The reader threads' malloc arenas keep SQLite's page caches after the connections close:
  // given back, peak RSS is the columns' (trim=False: a batch process that will reuse it).
  if (trim) trim_heap();
  return out;
}

py::list py_strings_by_id(const std::string& uri, const std::string& table, py::array_t<int64_t, py::array::c_style> ids) {
  return decode_all(nogil([&] { return strings_by_id(uri, table, ids.data(), static_cast<size_t>(ids.size())); }));
}

// One column of every reader thread's rows: joined, or (pieces) a list of the threads' arrays.
template <typename T>
py::object scan_column(std::vector<ScanOut>& parts, size_t c, bool pieces) {
  auto of = [c](ScanOut& p) -> std::vector<T>& {
    if constexpr (std::is_same_v<T, int32_t>) return p.narrow[c];
    else return p.ints[c];
  };
  if (pieces) {
    py::list col;
    for (auto& p : parts) col.append(adopt(new std::vector<T>(std::move(of(p)))));
    return col;
  }
  auto* v = new std::vector<T>();
  if (parts.size() == 1) {
    v->swap(of(parts[0]));
  } else {
    size_t total = 0;
    for (auto& p : parts) total += of(p).size();
    v->reserve(total);
    for (auto& p : parts) {
      v->insert(v->end(), of(p).begin(), of(p).end());
      std::vector<T>().swap(of(p));
    }
  }
  return adopt(v);
}

py::object py_scan_table(const std::string& path, int64_t root, const std::vector<py::tuple>& columns, int filter_col,
                      py::object mask_obj, int exclude_col, int64_t exclude_value, int threads, int64_t expected_rows,
                      bool pieces) {
  ScanSpec spec;
  for (const auto& t : columns) {
    const std::string kind = t[2].cast<std::string>();
    if (kind != "i" && kind != "n") throw std::runtime_error("scan_table: kind must be 'i' or 'n'");
    const ScanCol c{t[0].cast<int>(), t[1].cast<int64_t>(), kind[0], t[3].cast<int>(), t[4].cast<int64_t>()};
    if (c.shift < 0 || c.shift > 63) throw std::runtime_error("scan_table: shift out of range");
    spec.cols.push_back(c);
  }
  const int ncol = static_cast<int>(spec.cols.size());
  if (filter_col >= ncol || exclude_col >= ncol) throw std::runtime_error("scan_table: column out of range");
  U8 mask;
  if (!mask_obj.is_none()) {
    mask = mask_obj.cast<U8>();
    spec.filter_col = filter_col;
    spec.mask = mask.data();
    spec.mask_size = mask.size();
  }
  spec.exclude_col = exclude_col;
  spec.exclude_value = exclude_value;
  std::vector<ScanOut> parts;
  if (!nogil([&] { return scan_table(path, root, spec, threads, expected_rows, parts); })) return py::none();
  py::list out;
  for (size_t c = 0; c < spec.cols.size(); ++c)
    out.append(spec.cols[c].kind == 'n' ? scan_column<int32_t>(parts, c, pieces) : scan_column<int64_t>(parts, c, pieces));
  return out;
}

// codes and values: 1-d, one length; n_groups >= 0 (`name` says whose arguments they are).
void check_groups(const char* name, const I64& codes, const py::array& values, int64_t n_groups) {
  if (codes.ndim() != 1 || values.ndim() != 1 || codes.size() != values.size())
    throw std::runtime_error(std::string(name) + ": codes and values must be 1-d of one length");
  if (n_groups < 0) throw std::runtime_error(std::string(name) + ": n_groups < 0");
}

// A grouped unit's result: throws on a code out of range; false when a value is one the caller's
// sort must decide (the binding returns None).
bool grouped(const char* name, int bad) {
  if (bad == kBadCode) throw std::runtime_error(std::string(name) + ": a code outside 0..n_groups-1");
  return bad != kSortDecides;
}

py::tuple py_group_order_stats(I64 codes, I64 values, int64_t n_groups) {
  check_groups("group_order_stats", codes, values, n_groups);
  py::array_t<double> median(n_groups), maximum(n_groups);
  grouped("group_order_stats", nogil([&] {
            return group_medians(codes.data(), values.data(), static_cast<size_t>(codes.size()),
                                 static_cast<size_t>(n_groups), median.mutable_data(), maximum.mutable_data());
          }));
  return py::make_tuple(median, maximum);
}

py::object py_group_medians_f64(I64 codes, F64 values, int64_t n_groups) {
  check_groups("group_medians_f64", codes, values, n_groups);
  py::array_t<double> median(n_groups);
  if (!grouped("group_medians_f64", nogil([&] {
                 return group_medians(codes.data(), values.data(), static_cast<size_t>(codes.size()),
                                      static_cast<size_t>(n_groups), median.mutable_data());
               })))
    return py::none();
  return median;
}

py::object py_group_sort_f64(I64 codes, F64 values, int64_t n_groups) {
  if (codes.ndim() != 1 || values.ndim() != 1 || codes.size() != values.size() || n_groups < 0)
    throw std::runtime_error("group_sort_f64: codes and values must be 1-d of one length");
  const size_t n = static_cast<size_t>(codes.size());
  py::array_t<double> stable(static_cast<py::ssize_t>(n)), sorted(static_cast<py::ssize_t>(n));
  if (!grouped("group_sort_f64", nogil([&] {
                 return group_sort_f64(codes.data(), values.data(), n, static_cast<size_t>(n_groups),
                                       stable.mutable_data(), sorted.mutable_data());
               })))
    return py::none();
  return py::make_tuple(stable, sorted);
}

py::tuple py_segmented_union(I64 group, I64 start, I64 end, py::object index_obj) {
  const size_t n = static_cast<size_t>(group.size());
  I64 index;
  const int64_t* ix = nullptr;
  if (!index_obj.is_none()) {
    index = index_obj.cast<I64>();
    if (static_cast<size_t>(index.size()) != n) throw std::runtime_error("segmented_union: index length");
    ix = index.data();
    for (size_t i = 0; i < n; ++i)
      if (ix[i] < 0 || ix[i] >= start.size() || ix[i] >= end.size())
        throw std::runtime_error("segmented_union: index out of range");
  } else if (static_cast<size_t>(start.size()) != n || static_cast<size_t>(end.size()) != n) {
    throw std::runtime_error("segmented_union: columns of different lengths");
  }
  const auto heads = static_cast<py::ssize_t>(count_groups(group.data(), n));
  py::array_t<int64_t> gid(heads), first(heads), last(heads), uni(heads);
  nogil([&] {
    segmented_union(group.data(), start.data(), end.data(), ix, n, gid.mutable_data(), first.mutable_data(),
                    last.mutable_data(), uni.mutable_data());
  });
  return py::make_tuple(gid, first, last, uni);
}

py::array_t<int64_t> py_running_counts(I64 keys) {
  py::array_t<int64_t> out(keys.size());
  nogil([&] { running_counts(keys.data(), static_cast<size_t>(keys.size()), out.mutable_data()); });
  return out;
}

py::array_t<int64_t> py_searchsorted_i64(I64 a, I64 v, bool right) {
  py::array_t<int64_t> out(v.size());
  nogil([&] {
    searchsorted_i64(a.data(), a.size(), v.data(), static_cast<size_t>(v.size()), right, out.mutable_data());
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(_columns, m) {
  m.doc() = "Columnar SQLite reading through a dlopened system libsqlite3 (see maxinstr.traces._sqlite_columns)";
  m.def("available", [] { return api().handle != nullptr; }, "True when the system SQLite could be loaded.");
  m.def("release_memory", &trim_heap,
        "Return freed heap memory to the OS (glibc malloc_trim): after a big read, the freed "
        "slices and scratch otherwise stay in the process's RSS.");
  m.def("sqlite_version", [] { return std::string(require().libversion()); });
  m.def("query_many", &py_query_many, py::arg("uri"), py::arg("queries"), py::arg("threads") = 1, py::arg("trim") = true,
        "Run [(sql, kinds[, filter_column, uint8_mask[, expected_rows]]), ...] on parallel read-only connections; "
        "per query its columns by kind (query.h: 'i' 't' 'n' 'f' arrays, 's' (codes, [strings])), only rows "
        "whose filter column value v has mask[v] != 0.");
  m.def("scan_table", &py_scan_table, py::arg("path"), py::arg("root"), py::arg("columns"), py::arg("filter_col") = -1,
        py::arg("mask") = py::none(), py::arg("exclude_col") = -1, py::arg("exclude_value") = 0, py::arg("threads") = 1,
        py::arg("expected_rows") = 0, py::arg("pieces") = false,
        "Integer columns [(record_index or -1, null_value, 'i'|'n', shift, and_mask)] of a rowid table read from "
        "the file's b-tree in rowid order, as ((ifnull(col, null_value) >> shift) & and_mask), less the rows "
        "excluded or masked out (btree.h); None where it cannot (then ask SQLite). pieces: each column a list of "
        "the reader threads' arrays.");
  m.def("group_order_stats", &py_group_order_stats, py::arg("codes"), py::arg("values"), py::arg("n_groups"),
        "(median, max) of int64 values per group code 0..n_groups-1, as float64 arrays (NaN and 0 for an empty "
        "group); the median of an even count is (lower + upper) / 2.0 of the int64 middle values.");
  m.def("group_medians_f64", &py_group_medians_f64, py::arg("codes"), py::arg("values"), py::arg("n_groups"),
        "median of float64 values per group code 0..n_groups-1 (NaN for an empty group), (lower + upper) / 2 of "
        "the middle values; None when a value is NaN.");
  m.def("segmented_union", &py_segmented_union, py::arg("group"), py::arg("start"), py::arg("end"),
        py::arg("index") = py::none(),
        "(groups, first start, last end, union length) per group of intervals sorted by (group, start), as "
        "maxinstr.attribute.intervals.segmented_union computes them; with index, interval i is "
        "(start[index[i]], end[index[i]]).");
  m.def("group_sort_f64", &py_group_sort_f64, py::arg("codes"), py::arg("values"), py::arg("n_groups"),
        "(values[argsort(codes, stable)], values[lexsort((values, codes))]) for float64 values and group codes "
        "0..n_groups-1; None when a value is NaN or -0.0.");
  m.def("running_counts", &py_running_counts, py::arg("keys"),
        "Per row, how many earlier rows have the same int64 key (0 for the first).");
  m.def("searchsorted_i64", &py_searchsorted_i64, py::arg("a"), py::arg("v"), py::arg("right") = false,
        "np.searchsorted(a, v, side='right' if right else 'left') for a sorted int64 array, galloping from the "
        "previous key's position (nearly sorted keys cost a few steps each).");
  m.def("strings_by_id", &py_strings_by_id, py::arg("uri"), py::arg("table"), py::arg("ids"),
        "value of table rows by integer id, in the order of ids ('' when missing).");
}
