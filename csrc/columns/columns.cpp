// maxinstr._columns: read SQLite result columns straight into numpy arrays.
//
// Why: a 1M-kernel nsys export has ~3M rows to read; Python's sqlite3 builds a tuple and an
// int object per value and needs seconds. Here each SELECT is stepped in C++ into growing
// int64/double buffers that numpy adopts without a copy; text columns are interned into a
// table of distinct strings (trace names repeat massively). Several SELECTs run on parallel
// threads, each with its own read-only connection, with the GIL released.
//
// Like the rest of the native core this links nothing at build time: the system's SQLite
// (libsqlite3.so.0) is dlopened on first use and only the functions below are declared.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlfcn.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// ---- the slice of the SQLite C API we call (declared here; never included) --------------
struct sqlite3;
struct sqlite3_stmt;
constexpr int SQLITE_OK = 0;
constexpr int SQLITE_ROW = 100;
constexpr int SQLITE_DONE = 101;
constexpr int SQLITE_NULL = 5;
constexpr int SQLITE_OPEN_READONLY = 0x00000001;
constexpr int SQLITE_OPEN_URI = 0x00000040;
constexpr int SQLITE_OPEN_NOMUTEX = 0x00008000;

struct Api {
  int (*open_v2)(const char*, sqlite3**, int, const char*) = nullptr;
  int (*close_v2)(sqlite3*) = nullptr;
  int (*prepare_v2)(sqlite3*, const char*, int, sqlite3_stmt**, const char**) = nullptr;
  int (*step)(sqlite3_stmt*) = nullptr;
  int (*reset)(sqlite3_stmt*) = nullptr;
  int (*finalize)(sqlite3_stmt*) = nullptr;
  int (*column_count)(sqlite3_stmt*) = nullptr;
  int (*column_type)(sqlite3_stmt*, int) = nullptr;
  int64_t (*column_int64)(sqlite3_stmt*, int) = nullptr;
  double (*column_double)(sqlite3_stmt*, int) = nullptr;
  const unsigned char* (*column_text)(sqlite3_stmt*, int) = nullptr;
  int (*column_bytes)(sqlite3_stmt*, int) = nullptr;
  int (*bind_int64)(sqlite3_stmt*, int, int64_t) = nullptr;
  const char* (*errmsg)(sqlite3*) = nullptr;
  const char* (*libversion)() = nullptr;
  int (*threadsafe)() = nullptr;
  void* handle = nullptr;
  std::string error;
};

Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libsqlite3.so.0", "libsqlite3.so", "libsqlite3.dylib"}) {
      a.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (a.handle) break;
    }
    if (!a.handle) {
      a.error = "libsqlite3.so.0 not found";
      return;
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(a.handle, name));
      if (!fn) {
        ok = false;
        a.error = std::string("libsqlite3 lacks ") + name;
      }
    };
    sym(a.open_v2, "sqlite3_open_v2");
    sym(a.close_v2, "sqlite3_close_v2");
    sym(a.prepare_v2, "sqlite3_prepare_v2");
    sym(a.step, "sqlite3_step");
    sym(a.reset, "sqlite3_reset");
    sym(a.finalize, "sqlite3_finalize");
    sym(a.column_count, "sqlite3_column_count");
    sym(a.column_type, "sqlite3_column_type");
    sym(a.column_int64, "sqlite3_column_int64");
    sym(a.column_double, "sqlite3_column_double");
    sym(a.column_text, "sqlite3_column_text");
    sym(a.column_bytes, "sqlite3_column_bytes");
    sym(a.bind_int64, "sqlite3_bind_int64");
    sym(a.errmsg, "sqlite3_errmsg");
    sym(a.libversion, "sqlite3_libversion");
    sym(a.threadsafe, "sqlite3_threadsafe");
    if (!ok) {
      dlclose(a.handle);
      a.handle = nullptr;
    }
  });
  return a;
}

Api& require() {
  Api& a = api();
  if (!a.handle) throw std::runtime_error("maxinstr._columns: " + a.error);
  return a;
}

// RAII connection + statement.
struct Db {
  sqlite3* db = nullptr;
  explicit Db(const std::string& uri) {
    Api& a = require();
    if (a.open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, nullptr) !=
        SQLITE_OK) {
      std::string msg = db ? a.errmsg(db) : "cannot open";
      if (db) a.close_v2(db);
      db = nullptr;
      throw std::runtime_error("cannot open database: " + msg);
    }
  }
  ~Db() {
    if (db) require().close_v2(db);
  }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
};

struct Stmt {
  sqlite3_stmt* st = nullptr;
  Stmt(Db& d, const std::string& sql) {
    Api& a = require();
    if (a.prepare_v2(d.db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK)
      throw std::runtime_error(std::string("SQL error: ") + a.errmsg(d.db) + " in: " + sql.substr(0, 200));
  }
  ~Stmt() {
    if (st) require().finalize(st);
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
};

// One result column while stepping. Buffers are heap vectors that numpy later adopts.
struct ColumnBuf {
  char kind;  // 'i' (int64), 'n' (int32: ids, pids, enums), 'f', 's'
  std::vector<int64_t>* ints = nullptr;
  std::vector<int32_t>* narrow = nullptr;
  std::vector<double>* reals = nullptr;
  std::vector<int32_t>* codes = nullptr;
  std::unordered_map<std::string, int32_t> index;
  std::vector<std::string> values;
};

struct Result {
  std::vector<ColumnBuf> columns;
  std::string error;
};

// A row filter: keep a row only when mask[value of column `col`] is non-zero (values outside
// the mask are dropped). Used to keep only the API calls whose correlation id some GPU op has.
struct Filter {
  int64_t reserve = 1 << 16;  // expected rows: reserving once avoids regrowth copies
  int col = -1;
  const uint8_t* mask = nullptr;
  int64_t size = 0;
};

void run_query(const std::string& uri, const std::string& sql, const std::string& kinds, const Filter& filter,
               Result& out) {
  Api& a = require();
  out.columns.resize(kinds.size());
  for (size_t c = 0; c < kinds.size(); ++c) {
    ColumnBuf& col = out.columns[c];
    col.kind = kinds[c];
    if (col.kind == 'i')
      col.ints = new std::vector<int64_t>();
    else if (col.kind == 'n')
      col.narrow = new std::vector<int32_t>();
    else if (col.kind == 'f')
      col.reals = new std::vector<double>();
    else if (col.kind == 's')
      col.codes = new std::vector<int32_t>();
    else
      throw std::runtime_error(std::string("unknown column kind '") + col.kind + "'");
  }
  Db db(uri);
  Stmt st(db, sql);
  const int ncol = a.column_count(st.st);
  if (ncol != static_cast<int>(kinds.size()))
    throw std::runtime_error("query returns " + std::to_string(ncol) + " columns but " +
                             std::to_string(kinds.size()) + " kinds were given");
  const size_t reserve = static_cast<size_t>(std::max<int64_t>(16, filter.reserve));
  for (auto& col : out.columns) {
    if (col.ints) col.ints->reserve(reserve);
    if (col.narrow) col.narrow->reserve(reserve);
    if (col.reals) col.reals->reserve(reserve);
    if (col.codes) col.codes->reserve(reserve);
  }
  std::string key;
  for (;;) {
    int rc = a.step(st.st);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) throw std::runtime_error(std::string("SQLite step failed: ") + a.errmsg(db.db));
    if (filter.col >= 0) {
      const int64_t v = a.column_int64(st.st, filter.col);
      if (v < 0 || v >= filter.size || !filter.mask[v]) continue;
    }
    for (int c = 0; c < ncol; ++c) {
      ColumnBuf& col = out.columns[c];
      switch (col.kind) {
        case 'i':
          col.ints->push_back(a.column_int64(st.st, c));  // NULL reads as 0: callers ifnull() in SQL
          break;
        case 'n': {
          // Half the memory of 'i' for columns that hold small integers (ids, 24-bit pids,
          // enums); a value outside the int32 range (only in a damaged file) reads as -1.
          const int64_t v = a.column_int64(st.st, c);
          col.narrow->push_back(v >= INT32_MIN && v <= INT32_MAX ? static_cast<int32_t>(v) : -1);
          break;
        }
        case 'f':
          col.reals->push_back(a.column_type(st.st, c) == SQLITE_NULL ? std::numeric_limits<double>::quiet_NaN()
                                                                       : a.column_double(st.st, c));
          break;
        default: {
          const unsigned char* p = a.column_text(st.st, c);
          if (!p) {
            col.codes->push_back(-1);
            break;
          }
          key.assign(reinterpret_cast<const char*>(p), static_cast<size_t>(a.column_bytes(st.st, c)));
          auto it = col.index.find(key);
          if (it == col.index.end()) {
            int32_t id = static_cast<int32_t>(col.values.size());
            col.index.emplace(key, id);
            col.values.push_back(key);
            col.codes->push_back(id);
          } else {
            col.codes->push_back(it->second);
          }
        }
      }
    }
  }
}

template <typename T>
py::array adopt(std::vector<T>* v) {
  // numpy takes the vector over: no copy; the capsule frees it with the array.
  py::capsule owner(v, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(v->size())}, {static_cast<py::ssize_t>(sizeof(T))}, v->data(),
                        owner);
}

py::str decode(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::list to_python(Result& r) {
  py::list cols;
  for (auto& col : r.columns) {
    if (col.ints) {
      cols.append(adopt(col.ints));
      col.ints = nullptr;
    } else if (col.narrow) {
      cols.append(adopt(col.narrow));
      col.narrow = nullptr;
    } else if (col.reals) {
      cols.append(adopt(col.reals));
      col.reals = nullptr;
    } else {
      py::list values;
      for (const auto& s : col.values) values.append(decode(s));
      cols.append(py::make_tuple(adopt(col.codes), values));
      col.codes = nullptr;
    }
  }
  return cols;
}

void free_result(Result& r) {
  for (auto& col : r.columns) {
    delete col.ints;
    delete col.narrow;
    delete col.reals;
    delete col.codes;
    col.ints = nullptr;
    col.narrow = nullptr;
    col.reals = nullptr;
    col.codes = nullptr;
  }
}

py::list query_many(const std::string& uri, const std::vector<py::tuple>& specs, int threads) {
  require();
  // Each spec: (sql, kinds) or (sql, kinds, filter_column, uint8 mask). Pointers are taken
  // while the GIL is held; the caller keeps the masks alive for the call.
  std::vector<std::pair<std::string, std::string>> queries;
  std::vector<Filter> filters(specs.size());
  std::vector<py::array_t<uint8_t, py::array::c_style | py::array::forcecast>> masks;
  for (size_t i = 0; i < specs.size(); ++i) {
    const py::tuple& t = specs[i];
    queries.emplace_back(t[0].cast<std::string>(), t[1].cast<std::string>());
    if (t.size() >= 5 && !t[4].is_none()) filters[i].reserve = t[4].cast<int64_t>();
    if (t.size() >= 4 && !t[3].is_none()) {
      masks.emplace_back(t[3].cast<py::array_t<uint8_t, py::array::c_style | py::array::forcecast>>());
      filters[i].col = t[2].cast<int>();
      filters[i].mask = masks.back().data();
      filters[i].size = masks.back().size();
      if (filters[i].col < 0 || filters[i].col >= static_cast<int>(queries[i].second.size()))
        throw std::runtime_error("filter column out of range");
    }
  }
  std::vector<Result> results(queries.size());
  {
    py::gil_scoped_release release;
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t i = next++; i < queries.size(); i = next++) {
        try {
          run_query(uri, queries[i].first, queries[i].second, filters[i], results[i]);
        } catch (const std::exception& e) {
          results[i].error = e.what();
        }
      }
    };
    const int n = std::max(1, std::min<int>(threads, static_cast<int>(queries.size())));
    std::vector<std::thread> pool;
    for (int t = 1; t < n; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
  }
  for (auto& r : results) {
    if (!r.error.empty()) {
      std::string msg = r.error;
      for (auto& rr : results) free_result(rr);
      throw std::runtime_error(msg);
    }
  }
  py::list out;
  for (auto& r : results) out.append(to_python(r));
#if defined(__GLIBC__)
  // The reader threads' malloc arenas keep SQLite's page caches and scratch after the
  // connections close; hand that memory back so peak RSS reflects the columns only.
  malloc_trim(0);
#endif
  return out;
}

py::list strings_by_id(const std::string& uri, const std::string& table, py::array_t<int64_t, py::array::c_style> ids) {
  Api& a = require();
  for (char ch : table)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')) throw std::runtime_error("bad table name");
  std::vector<std::string> values(static_cast<size_t>(ids.size()));
  const int64_t* p = ids.data();
  const size_t n = static_cast<size_t>(ids.size());
  {
    py::gil_scoped_release release;
    Db db(uri);
    Stmt st(db, "SELECT value FROM " + table + " WHERE id = ?");
    for (size_t i = 0; i < n; ++i) {
      a.reset(st.st);
      a.bind_int64(st.st, 1, p[i]);
      if (a.step(st.st) == SQLITE_ROW) {
        const unsigned char* t = a.column_text(st.st, 0);
        if (t) values[i].assign(reinterpret_cast<const char*>(t), static_cast<size_t>(a.column_bytes(st.st, 0)));
      }
    }
  }
  py::list out;
  for (const auto& s : values) out.append(decode(s));
  return out;
}

}  // namespace

PYBIND11_MODULE(_columns, m) {
  m.doc() = "Columnar SQLite reading through a dlopened system libsqlite3 (see maxinstr.traces._sqlite_columns)";
  m.def("available", [] { return api().handle != nullptr; }, "True when the system SQLite could be loaded.");
  m.def("load_error", [] { return api().error; }, "Why the system SQLite could not be loaded ('' when it was).");
  m.def(
      "release_memory",
      [] {
#if defined(__GLIBC__)
        return malloc_trim(0) != 0;
#else
        return false;
#endif
      },
      "Return freed heap memory to the OS (glibc malloc_trim): after a big read, the freed "
      "slices and scratch otherwise stay in the process's RSS.");
  m.def("sqlite_version", [] { return std::string(require().libversion()); });
  m.def("query_many", &query_many, py::arg("uri"), py::arg("queries"), py::arg("threads") = 1,
        "Run [(sql, kinds[, filter_column, uint8_mask[, expected_rows]]), ...] on parallel read-only connections; per query "
        "a list of columns: int64 ('i'), int32 ('n', out-of-range values -1) or float64 ('f') arrays, or (int32 codes, [distinct strings]) for kind 's'. "
        "With a mask, only rows whose filter column value v has mask[v] != 0 are kept.");
  m.def("strings_by_id", &strings_by_id, py::arg("uri"), py::arg("table"), py::arg("ids"),
        "value of table rows by integer id, in the order of ids ('' when missing).");
}
