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
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
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
constexpr int SQLITE_INTEGER = 1;
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
  char kind;  // 'i' (int64), 't' (int64, strict: times), 'n' (int32: ids, pids, enums), 'f', 's'
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
    if (col.kind == 'i' || col.kind == 't')
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
        case 't':
          // A time: SQLite's conversion would read text as 0 ('abc') or its leading digits and
          // truncate a float, which then pass for real times; anything but an integer reads as
          // INT64_MIN (maxinstr.traces.model.INVALID_NS), for the reader to drop and count.
          col.ints->push_back(a.column_type(st.st, c) == SQLITE_INTEGER ? a.column_int64(st.st, c)
                                                                       : std::numeric_limits<int64_t>::min());
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

py::list query_many(const std::string& uri, const std::vector<py::tuple>& specs, int threads, bool trim) {
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
  // connections close; hand that memory back so peak RSS reflects the columns only (unless
  // the caller is a batch process that will reuse it: trim=False).
  if (trim) malloc_trim(0);
#else
  (void)trim;
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


// ---- direct table scans: SQLite's file format, read without its VDBE -----------------------
//
// Why: stepping a statement costs ~100 ns per row plus ~35 ns per column value in SQLite's
// virtual machine; a 1M-kernel export has 3.7M rows in its kernel and CUDA API tables, most
// of a second. The integer columns of an ordinary rowid table can be read straight from its
// table b-tree (https://www.sqlite.org/fileformat.html): leaf pages in key order, each cell a
// record of varint serial types and big-endian integers. Rows come out in rowid order, as a
// full table scan returns them.
//
// Only the plain case is handled here; anything else makes scan_table return None and the
// caller runs the same query through SQLite: a WAL-mode or damaged file, a page of the wrong
// type, a cell that spills to overflow pages, a value that is not an integer or NULL (a float
// or text in an integer column converts in SQL, not here), too many pages visited.

struct ScanCol {
  int src = -1;           // record column index; -1: absent from this schema version
  int64_t null_value = 0; // ifnull(col, null_value); also the value of an absent column
  char kind = 'i';        // 'i' int64, 'n' int32 (out of range -> -1)
  int shift = 0;          // v >> shift (arithmetic, as SQLite's >>)
  int64_t and_mask = -1;  // v & and_mask
};

struct ScanSpec {
  std::vector<ScanCol> cols;
  int filter_col = -1;    // output column whose value v must have mask[v] != 0
  const uint8_t* mask = nullptr;
  int64_t mask_size = 0;
  int exclude_col = -1;   // output column whose value must differ from exclude_value
  int64_t exclude_value = 0;
};

struct File {
  int fd = -1;
  uint32_t page_size = 0;
  uint32_t usable = 0;
  uint64_t pages = 0;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

struct Unsupported {};  // thrown inside a scan: fall back to SQLite

inline uint64_t be(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// A record's big-endian two's-complement integer of serial type t (1..6: 1, 2, 3, 4, 6 or 8
// bytes); the caller checked that the bytes are inside the record.
inline int64_t record_int(const uint8_t* p, uint8_t t) {
  switch (t) {
    case 1:
      return static_cast<int8_t>(p[0]);
    case 2:
      return static_cast<int16_t>(static_cast<uint16_t>((p[0] << 8) | p[1]));
    case 3: {
      const uint64_t u = (static_cast<uint64_t>(p[0]) << 16) | (static_cast<uint64_t>(p[1]) << 8) | p[2];
      return static_cast<int64_t>(u << 40) >> 40;
    }
    case 4: {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return static_cast<int32_t>(__builtin_bswap32(u));
    }
    case 5: {
      uint32_t lo;
      std::memcpy(&lo, p + 2, 4);
      const uint64_t u = (static_cast<uint64_t>((p[0] << 8) | p[1]) << 32) | __builtin_bswap32(lo);
      return static_cast<int64_t>(u << 16) >> 16;
    }
    default: {
      uint64_t u;
      std::memcpy(&u, p, 8);
      return static_cast<int64_t>(__builtin_bswap64(u));
    }
  }
}

// SQLite varint: 1-9 bytes, big-endian 7-bit groups, the 9th byte whole.
inline const uint8_t* varint(const uint8_t* p, const uint8_t* end, uint64_t& v) {
  v = 0;
  for (int i = 0; i < 8; ++i) {
    if (p >= end) throw Unsupported{};
    const uint8_t b = *p++;
    v = (v << 7) | (b & 0x7f);
    if (!(b & 0x80)) return p;
  }
  if (p >= end) throw Unsupported{};
  v = (v << 8) | *p++;
  return p;
}

void read_page(const File& f, uint64_t no, std::vector<uint8_t>& buf) {
  if (no < 1 || no > f.pages) throw Unsupported{};
  buf.resize(f.page_size);
  size_t got = 0;
  const off_t at = static_cast<off_t>((no - 1) * f.page_size);
  while (got < f.page_size) {
    const ssize_t n = ::pread(f.fd, buf.data() + got, f.page_size - got, at + static_cast<off_t>(got));
    if (n <= 0) throw Unsupported{};
    got += static_cast<size_t>(n);
  }
}

// Header of the b-tree page in buf (page 1 has the file header first).
inline const uint8_t* page_header(const std::vector<uint8_t>& buf, uint64_t no) { return buf.data() + (no == 1 ? 100 : 0); }

// Leaf pages of the table b-tree rooted at `root`, in key order (all leaves are at one depth).
std::vector<uint32_t> table_leaves(const File& f, uint64_t root) {
  std::vector<uint32_t> level{static_cast<uint32_t>(root)};
  std::vector<uint8_t> buf;
  uint64_t visited = 0;
  for (int depth = 0; depth < 32; ++depth) {
    std::vector<uint32_t> next;
    bool leaves = false;
    for (size_t i = 0; i < level.size(); ++i) {
      const uint32_t no = level[i];
      read_page(f, no, buf);
      if (++visited > f.pages) throw Unsupported{};
      const uint8_t* h = page_header(buf, no);
      if (h[0] == 0x0d) {  // table leaf
        if (i == 0) leaves = true;
        if (!leaves) throw Unsupported{};
        continue;
      }
      if (h[0] != 0x05 || leaves) throw Unsupported{};  // not a table interior page, or mixed depths
      const uint32_t ncells = static_cast<uint32_t>(be(h + 3, 2));
      const uint8_t* ptrs = h + 12;
      const uint8_t* end = buf.data() + f.usable;
      if (ptrs + 2 * ncells > end) throw Unsupported{};
      for (uint32_t c = 0; c < ncells; ++c) {
        const uint32_t off = static_cast<uint32_t>(be(ptrs + 2 * c, 2));
        if (off + 4 > f.usable) throw Unsupported{};
        next.push_back(static_cast<uint32_t>(be(buf.data() + off, 4)));
      }
      next.push_back(static_cast<uint32_t>(be(h + 8, 4)));  // right-most child
    }
    if (leaves) return level;
    level.swap(next);
  }
  throw Unsupported{};
}

struct ScanOut {
  std::vector<std::vector<int64_t>> ints;   // per output column (kind 'i')
  std::vector<std::vector<int32_t>> narrow; // per output column (kind 'n')
  int64_t rows = 0;
};

// Reads runs of consecutive pages (leaves of an export are mostly laid out in key order) with
// one pread each, into a buffer reused across runs.
struct PageRun {
  static constexpr size_t kMaxPages = 32;
  std::vector<uint8_t> buf;
  uint64_t first = 0, count = 0;  // pages held
  const uint8_t* get(const File& f, const uint32_t* leaves, size_t li, size_t n_leaves) {
    const uint64_t no = leaves[li];
    if (count && no >= first && no < first + count) return buf.data() + (no - first) * f.page_size;
    if (no < 1 || no > f.pages) throw Unsupported{};
    size_t run = 1;
    while (run < kMaxPages && li + run < n_leaves && leaves[li + run] == no + run && no + run <= f.pages) ++run;
    buf.resize(run * f.page_size);
    size_t got = 0;
    const off_t at = static_cast<off_t>((no - 1) * f.page_size);
    while (got < buf.size()) {
      const ssize_t n = ::pread(f.fd, buf.data() + got, buf.size() - got, at + static_cast<off_t>(got));
      if (n <= 0) throw Unsupported{};
      got += static_cast<size_t>(n);
    }
    first = no;
    count = run;
    return buf.data();
  }
};

void scan_leaves(const File& f, const uint32_t* leaves, size_t n_leaves, const ScanSpec& spec, int64_t reserve,
                 ScanOut& out) {
  const size_t ncol = spec.cols.size();
  out.ints.assign(ncol, {});
  out.narrow.assign(ncol, {});
  for (size_t c = 0; c < ncol; ++c) {
    if (spec.cols[c].kind == 'n')
      out.narrow[c].reserve(static_cast<size_t>(reserve));
    else
      out.ints[c].reserve(static_cast<size_t>(reserve));
  }
  int max_src = -1;
  for (const auto& c : spec.cols) max_src = std::max(max_src, c.src);
  const uint32_t max_local = f.usable - 35;  // a bigger payload spills to overflow pages
  const size_t nsrc = static_cast<size_t>(max_src + 1);
  // per record column we read: its serial type (0 = NULL, also for a short record) and offset
  std::vector<uint8_t> type(nsrc), needed(nsrc);
  std::vector<uint32_t> offset(nsrc);
  for (const auto& c : spec.cols)
    if (c.src >= 0) needed[static_cast<size_t>(c.src)] = 1;
  // the filter and exclusion columns are decided first: a dropped row decodes nothing else
  std::vector<size_t> order;
  for (int c : {spec.exclude_col, spec.filter_col})
    if (c >= 0 && std::find(order.begin(), order.end(), static_cast<size_t>(c)) == order.end())
      order.push_back(static_cast<size_t>(c));
  const size_t n_first = order.size();
  for (size_t c = 0; c < ncol; ++c)
    if (std::find(order.begin(), order.end(), c) == order.end()) order.push_back(c);
  std::vector<int64_t> vals(ncol);
  std::vector<uint8_t> last_header;
  uint64_t last_body_size = 0;
  PageRun pages;
  for (size_t li = 0; li < n_leaves; ++li) {
    const uint32_t no = leaves[li];
    const uint8_t* page = pages.get(f, leaves, li, n_leaves);
    const uint8_t* h = page + (no == 1 ? 100 : 0);
    if (h[0] != 0x0d) throw Unsupported{};
    const uint32_t ncells = static_cast<uint32_t>(be(h + 3, 2));
    const uint8_t* ptrs = h + 8;
    const uint8_t* page_end = page + f.usable;
    if (ptrs + 2 * ncells > page_end) throw Unsupported{};
    for (uint32_t ci = 0; ci < ncells; ++ci) {
      const uint32_t off = static_cast<uint32_t>(be(ptrs + 2 * ci, 2));
      if (off >= f.usable) throw Unsupported{};
      const uint8_t* p = page + off;
      uint64_t payload = 0, rowid = 0;
      p = varint(p, page_end, payload);
      p = varint(p, page_end, rowid);
      if (payload > max_local || p + payload > page_end) throw Unsupported{};
      const uint8_t* rec_end = p + payload;
      uint64_t hsize = 0;
      const uint8_t* hp = varint(p, rec_end, hsize);
      if (hsize > payload || hsize < static_cast<uint64_t>(hp - p)) throw Unsupported{};
      const uint8_t* hend = p + hsize;
      const uint64_t body_size = payload - hsize;
      const uint8_t* body = hend;
      // Rows of an export mostly repeat the previous row's serial types (same integer widths):
      // then the types and offsets found for it hold as they are.
      const size_t hlen = static_cast<size_t>(hend - hp);
      if (hlen == last_header.size() && hlen && std::memcmp(hp, last_header.data(), hlen) == 0 &&
          last_body_size <= body_size) {
        goto decode;
      }
      {
      uint64_t at = 0;  // offset of the next value in the body
      size_t col = 0;
      const uint8_t* h0 = hp;
      for (; hp < hend && col < nsrc; ++col) {
        uint64_t t = *hp;
        if (t < 0x80)
          ++hp;  // nearly every serial type is one byte
        else
          hp = varint(hp, hend, t);
        if (t >= 12) {  // text or blob: skipped; a column we read must be an integer
          if (needed[col]) throw Unsupported{};
          at += (t - 12) / 2;
          if (at > body_size) throw Unsupported{};
          continue;
        }
        static constexpr int8_t kLen[12] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0, -1, -1};
        const int len = kLen[t];
        if (len < 0) throw Unsupported{};  // 10, 11: reserved
        if (at + static_cast<uint64_t>(len) > body_size) throw Unsupported{};
        if (needed[col]) {
          if (t == 7) throw Unsupported{};  // a float: SQL converts it
          type[col] = static_cast<uint8_t>(t);
          offset[col] = static_cast<uint32_t>(at);
        }
        at += static_cast<uint64_t>(len);
      }
      for (; col < nsrc; ++col) type[col] = 0;  // short record (ALTER TABLE ADD COLUMN): NULL
      last_header.assign(h0, hend);
      last_body_size = at;  // the body bytes these types need (checked against each row's body)
      }
    decode:
      (void)rowid;
      bool keep = true;
      for (size_t k = 0; k < ncol; ++k) {
        const size_t c = order[k];
        const ScanCol& sc = spec.cols[c];
        int64_t v = sc.null_value;
        if (sc.src >= 0) {
          const uint8_t t = type[static_cast<size_t>(sc.src)];
          if (t == 8) {
            v = 0;
          } else if (t == 9) {
            v = 1;
          } else if (t != 0) {
            v = record_int(body + offset[static_cast<size_t>(sc.src)], t);
          }
        }
        if (sc.shift) v >>= sc.shift;
        v &= sc.and_mask;
        vals[c] = v;
        if (k + 1 == n_first) {
          if (spec.exclude_col >= 0 && vals[static_cast<size_t>(spec.exclude_col)] == spec.exclude_value) keep = false;
          if (keep && spec.filter_col >= 0) {
            const int64_t fv = vals[static_cast<size_t>(spec.filter_col)];
            keep = fv >= 0 && fv < spec.mask_size && spec.mask[fv];
          }
          if (!keep) break;
        }
      }
      if (!keep) continue;
      for (size_t c = 0; c < ncol; ++c) {
        if (spec.cols[c].kind == 'n') {
          const int64_t v = vals[c];
          out.narrow[c].push_back(v >= INT32_MIN && v <= INT32_MAX ? static_cast<int32_t>(v) : -1);
        } else {
          out.ints[c].push_back(vals[c]);
        }
      }
      ++out.rows;
    }
  }
}

template <typename T>
py::array concat_adopt(std::vector<ScanOut>& parts, size_t c, bool narrow) {
  size_t total = 0;
  for (auto& p : parts) total += narrow ? p.narrow[c].size() : p.ints[c].size();
  auto* v = new std::vector<T>();
  if (parts.size() == 1) {
    if constexpr (std::is_same_v<T, int32_t>) v->swap(parts[0].narrow[c]);
    else v->swap(parts[0].ints[c]);
  } else {
    v->reserve(total);
    for (auto& p : parts) {
      if constexpr (std::is_same_v<T, int32_t>) {
        v->insert(v->end(), p.narrow[c].begin(), p.narrow[c].end());
        std::vector<int32_t>().swap(p.narrow[c]);
      } else {
        v->insert(v->end(), p.ints[c].begin(), p.ints[c].end());
        std::vector<int64_t>().swap(p.ints[c]);
      }
    }
  }
  return adopt(v);
}

// Read integer columns of an ordinary rowid table straight from the file (see above): a list
// of arrays, one per column spec (src, null_value, kind, shift, and_mask), or None when the
// file or a value is outside what this reader handles (the caller then asks SQLite).
py::object scan_table(const std::string& path, int64_t root, const std::vector<py::tuple>& columns, int filter_col,
                      py::object mask_obj, int exclude_col, int64_t exclude_value, int threads, int64_t expected_rows,
                      bool pieces) {
  ScanSpec spec;
  for (const auto& t : columns) {
    ScanCol c;
    c.src = t[0].cast<int>();
    c.null_value = t[1].cast<int64_t>();
    const std::string kind = t[2].cast<std::string>();
    if (kind != "i" && kind != "n") throw std::runtime_error("scan_table: kind must be 'i' or 'n'");
    c.kind = kind[0];
    c.shift = t[3].cast<int>();
    c.and_mask = t[4].cast<int64_t>();
    if (c.shift < 0 || c.shift > 63) throw std::runtime_error("scan_table: shift out of range");
    spec.cols.push_back(c);
  }
  const int ncol = static_cast<int>(spec.cols.size());
  if (filter_col >= ncol || exclude_col >= ncol) throw std::runtime_error("scan_table: column out of range");
  py::array_t<uint8_t, py::array::c_style | py::array::forcecast> mask;
  if (!mask_obj.is_none()) {
    mask = mask_obj.cast<py::array_t<uint8_t, py::array::c_style | py::array::forcecast>>();
    spec.filter_col = filter_col;
    spec.mask = mask.data();
    spec.mask_size = mask.size();
  }
  spec.exclude_col = exclude_col;
  spec.exclude_value = exclude_value;
  std::vector<ScanOut> parts;
  bool ok = true;
  {
    py::gil_scoped_release release;
    try {
      File f;
      f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (f.fd < 0) throw Unsupported{};
      uint8_t head[100];
      if (::pread(f.fd, head, 100, 0) != 100) throw Unsupported{};
      if (std::memcmp(head, "SQLite format 3", 16) != 0) throw Unsupported{};
      uint32_t ps = static_cast<uint32_t>(be(head + 16, 2));
      if (ps == 1) ps = 65536;
      if (ps < 512 || (ps & (ps - 1))) throw Unsupported{};
      if (head[18] != 1 || head[19] != 1) throw Unsupported{};  // WAL mode: pages may live in the -wal file
      f.page_size = ps;
      f.usable = ps - head[20];
      if (f.usable < 480) throw Unsupported{};
      struct stat st;
      if (::fstat(f.fd, &st) != 0) throw Unsupported{};
      f.pages = static_cast<uint64_t>(st.st_size) / ps;
      if (root < 2 || static_cast<uint64_t>(root) > f.pages) throw Unsupported{};
      const std::vector<uint32_t> leaves = table_leaves(f, static_cast<uint64_t>(root));
      const size_t min_leaves = 64;
      const int n = static_cast<int>(std::max<size_t>(
          1, std::min<size_t>(static_cast<size_t>(std::max(1, threads)), leaves.size() / min_leaves)));
      parts.resize(static_cast<size_t>(n));
      std::vector<int> failed(static_cast<size_t>(n), 0);
      auto work = [&](int i) {
        const size_t a = leaves.size() * static_cast<size_t>(i) / static_cast<size_t>(n);
        const size_t b = leaves.size() * static_cast<size_t>(i + 1) / static_cast<size_t>(n);
        const int64_t reserve =
            leaves.empty() ? 16 : std::max<int64_t>(16, expected_rows * static_cast<int64_t>(b - a) /
                                                           static_cast<int64_t>(leaves.size()) + 1024);
        try {
          scan_leaves(f, leaves.data() + a, b - a, spec, reserve, parts[static_cast<size_t>(i)]);
        } catch (const Unsupported&) {
          failed[static_cast<size_t>(i)] = 1;
        } catch (const std::bad_alloc&) {
          failed[static_cast<size_t>(i)] = 2;
        }
      };
      std::vector<std::thread> pool;
      for (int i = 1; i < n; ++i) pool.emplace_back(work, i);
      work(0);
      for (auto& t : pool) t.join();
      for (int x : failed) {
        if (x == 2) throw std::bad_alloc();
        if (x) throw Unsupported{};
      }
    } catch (const Unsupported&) {
      ok = false;
    }
  }
  if (!ok) return py::none();
  py::list out;
  for (int c = 0; c < ncol; ++c) {
    const bool narrow = spec.cols[static_cast<size_t>(c)].kind == 'n';
    if (pieces) {  // one array per thread's leaf range, in order: the caller joins them once
      py::list col;
      for (auto& p : parts) {
        if (narrow) {
          auto* v = new std::vector<int32_t>();
          v->swap(p.narrow[static_cast<size_t>(c)]);
          col.append(adopt(v));
        } else {
          auto* v = new std::vector<int64_t>();
          v->swap(p.ints[static_cast<size_t>(c)]);
          col.append(adopt(v));
        }
      }
      out.append(col);
    } else if (narrow) {
      out.append(concat_adopt<int32_t>(parts, static_cast<size_t>(c), true));
    } else {
      out.append(concat_adopt<int64_t>(parts, static_cast<size_t>(c), false));
    }
  }
  return out;
}


// ---- grouped order statistics for the report ---------------------------------------------
//
// Values bucketed by their group code 0..g-1 with one counting sort (group g's values at
// [start[g], start[g + 1]) of `out`, each group in row order). Returns 1 when a code is outside
// 0..g-1, 2 when `reject(value)` (a value whose place a sort would decide: NaN, -0.0), else 0;
// the three grouped functions below share it.
template <typename T, typename Reject>
int bucket_by_group(const int64_t* c, const T* v, size_t n, size_t g, std::vector<int64_t>& start, T* out,
                    Reject reject) {
  start.assign(g + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    if (c[i] < 0 || static_cast<uint64_t>(c[i]) >= g) return 1;
    if (reject(v[i])) return 2;
    ++start[static_cast<size_t>(c[i]) + 1];
  }
  for (size_t k = 0; k < g; ++k) start[k + 1] += start[k];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (size_t i = 0; i < n; ++i) out[fill[static_cast<size_t>(c[i])]++] = v[i];
  return 0;
}

inline bool sort_decides(double x) { return x != x || (x == 0 && std::signbit(x)); }  // NaN, -0.0

//
// Per integer group, the median and the maximum of int64 values: what a sort of the combined
// (group, value) key gives, in O(n): a counting sort by group, then nth_element per group.
// The report takes per-kernel and per-(stage, kernel) medians over millions of ops; numpy's
// sort of that key was a sixth of the report's time.
py::tuple group_order_stats(py::array_t<int64_t, py::array::c_style | py::array::forcecast> codes,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> values, int64_t n_groups) {
  if (codes.ndim() != 1 || values.ndim() != 1 || codes.size() != values.size())
    throw std::runtime_error("group_order_stats: codes and values must be 1-d of one length");
  if (n_groups < 0) throw std::runtime_error("group_order_stats: n_groups < 0");
  const size_t n = static_cast<size_t>(codes.size());
  const size_t g = static_cast<size_t>(n_groups);
  py::array_t<double> median(static_cast<py::ssize_t>(g)), maximum(static_cast<py::ssize_t>(g));
  double* med = median.mutable_data();
  double* mx = maximum.mutable_data();
  const int64_t* c = codes.data();
  const int64_t* v = values.data();
  bool bad = false;
  {
    py::gil_scoped_release release;
    std::vector<int64_t> start;
    std::vector<int64_t> bucket(n);
    bad = bucket_by_group(c, v, n, g, start, bucket.data(), [](int64_t) { return false; }) != 0;
    if (!bad) {
      for (size_t k = 0; k < g; ++k) {
        int64_t* a = bucket.data() + start[k];
        int64_t* b = bucket.data() + start[k + 1];
        const int64_t m = b - a;
        if (m == 0) {
          med[k] = std::numeric_limits<double>::quiet_NaN();
          mx[k] = 0.0;
          continue;
        }
        int64_t* lo = a + (m - 1) / 2;
        std::nth_element(a, lo, b);
        const int64_t lo_v = *lo;
        const int64_t hi_v = (m % 2 == 0) ? *std::min_element(lo + 1, b) : lo_v;
        // (lo + hi) / 2.0 as numpy computes it: the int64 sum, then a float64 division
        med[k] = static_cast<double>(static_cast<int64_t>(static_cast<uint64_t>(lo_v) + static_cast<uint64_t>(hi_v))) / 2.0;
        mx[k] = static_cast<double>(*std::max_element(lo, b));
      }
    }
  }
  if (bad) throw std::runtime_error("group_order_stats: a code outside 0..n_groups-1");
  return py::make_tuple(median, maximum);
}


// Per group code, the median of float64 values ((lower + upper) / 2 of the middle values, as
// a sort gives them; NaN for an empty group). None when a value is NaN (a sort orders NaN in
// its own way): the caller sorts.
py::object group_medians_f64(py::array_t<int64_t, py::array::c_style | py::array::forcecast> codes,
                             py::array_t<double, py::array::c_style | py::array::forcecast> values, int64_t n_groups) {
  if (codes.ndim() != 1 || values.ndim() != 1 || codes.size() != values.size())
    throw std::runtime_error("group_medians_f64: codes and values must be 1-d of one length");
  if (n_groups < 0) throw std::runtime_error("group_medians_f64: n_groups < 0");
  const size_t n = static_cast<size_t>(codes.size());
  const size_t g = static_cast<size_t>(n_groups);
  py::array_t<double> median(static_cast<py::ssize_t>(g));
  double* med = median.mutable_data();
  const int64_t* c = codes.data();
  const double* v = values.data();
  int bad = 0;  // 1: a code out of range, 2: a NaN or -0.0
  {
    py::gil_scoped_release release;
    std::vector<int64_t> start;
    std::vector<double> bucket(n);
    bad = bucket_by_group(c, v, n, g, start, bucket.data(), sort_decides);
    if (!bad) {
      for (size_t k = 0; k < g; ++k) {
        double* a = bucket.data() + start[k];
        double* b = bucket.data() + start[k + 1];
        const int64_t m = b - a;
        if (m == 0) {
          med[k] = std::numeric_limits<double>::quiet_NaN();
          continue;
        }
        double* lo = a + (m - 1) / 2;
        std::nth_element(a, lo, b);
        const double hi = (m % 2 == 0) ? *std::min_element(lo + 1, b) : *lo;
        med[k] = (*lo + hi) / 2;
      }
    }
  }
  if (bad == 1) throw std::runtime_error("group_medians_f64: a code outside 0..n_groups-1");
  if (bad == 2) return py::none();
  return median;
}


// Per group of intervals sorted by (group, start): (groups, first start, last end, union
// length), as maxinstr.attribute.intervals.segmented_union computes them with numpy (the
// union summed in float64 in row order, then truncated to int64, as its bincount does).
// With `index`, interval i is (start[index[i]], end[index[i]]): no gathered copies.
py::tuple segmented_union(py::array_t<int64_t, py::array::c_style | py::array::forcecast> group,
                          py::array_t<int64_t, py::array::c_style | py::array::forcecast> start,
                          py::array_t<int64_t, py::array::c_style | py::array::forcecast> end, py::object index_obj) {
  const size_t n = static_cast<size_t>(group.size());
  py::array_t<int64_t, py::array::c_style | py::array::forcecast> index;
  const int64_t* ix = nullptr;
  if (!index_obj.is_none()) {
    index = index_obj.cast<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>();
    if (static_cast<size_t>(index.size()) != n) throw std::runtime_error("segmented_union: index length");
    ix = index.data();
    for (size_t i = 0; i < n; ++i)
      if (ix[i] < 0 || ix[i] >= start.size() || ix[i] >= end.size())
        throw std::runtime_error("segmented_union: index out of range");
  } else if (static_cast<size_t>(start.size()) != n || static_cast<size_t>(end.size()) != n) {
    throw std::runtime_error("segmented_union: columns of different lengths");
  }
  const int64_t* g = group.data();
  const int64_t* s = start.data();
  const int64_t* e = end.data();
  size_t heads = n ? 1 : 0;
  for (size_t i = 1; i < n; ++i) heads += g[i] != g[i - 1];
  py::array_t<int64_t> gid(static_cast<py::ssize_t>(heads)), first(static_cast<py::ssize_t>(heads)),
      last(static_cast<py::ssize_t>(heads)), uni(static_cast<py::ssize_t>(heads));
  int64_t* og = gid.mutable_data();
  int64_t* of = first.mutable_data();
  int64_t* ol = last.mutable_data();
  int64_t* ou = uni.mutable_data();
  {
    py::gil_scoped_release release;
    int64_t k = -1;
    int64_t run = 0;  // running max of end inside the group
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t r = ix ? static_cast<size_t>(ix[i]) : i;
      const int64_t si = s[r], ei = e[r];
      int64_t from;
      if (i == 0 || g[i] != g[i - 1]) {
        if (k >= 0) {
          ol[k] = run;
          ou[k] = static_cast<int64_t>(acc);
        }
        ++k;
        og[k] = g[i];
        of[k] = si;
        acc = 0;
        from = si;  // numpy: max(INT64_MIN // 2, start)
        if (si < std::numeric_limits<int64_t>::min() / 2) from = std::numeric_limits<int64_t>::min() / 2;
        run = ei;
      } else {
        from = run > si ? run : si;
        if (ei > run) run = ei;
      }
      const int64_t add = static_cast<int64_t>(static_cast<uint64_t>(ei) - static_cast<uint64_t>(from));
      acc += static_cast<double>(add > 0 ? add : 0);
    }
    if (k >= 0) {
      ol[k] = run;
      ou[k] = static_cast<int64_t>(acc);
    }
  }
  return py::make_tuple(gid, first, last, uni);
}


// float64 values grouped by code 0..n_groups-1: (in each group's row order, sorted within
// each group), i.e. values[argsort(codes, stable)] and values[lexsort((values, codes))]. None
// when a value is NaN or -0.0 (where a sort's placement of equal values would show).
py::object group_sort_f64(py::array_t<int64_t, py::array::c_style | py::array::forcecast> codes,
                          py::array_t<double, py::array::c_style | py::array::forcecast> values, int64_t n_groups) {
  if (codes.ndim() != 1 || values.ndim() != 1 || codes.size() != values.size() || n_groups < 0)
    throw std::runtime_error("group_sort_f64: codes and values must be 1-d of one length");
  const size_t n = static_cast<size_t>(codes.size());
  const size_t g = static_cast<size_t>(n_groups);
  const int64_t* c = codes.data();
  const double* v = values.data();
  py::array_t<double> stable(static_cast<py::ssize_t>(n)), sorted(static_cast<py::ssize_t>(n));
  double* st = stable.mutable_data();
  double* so = sorted.mutable_data();
  int bad = 0;
  {
    py::gil_scoped_release release;
    std::vector<int64_t> start;
    bad = bucket_by_group(c, v, n, g, start, st, sort_decides);
    if (!bad) {
      std::memcpy(so, st, n * sizeof(double));
      for (size_t k = 0; k < g; ++k) std::sort(so + start[k], so + start[k + 1]);
    }
  }
  if (bad == 1) throw std::runtime_error("group_sort_f64: a code outside 0..n_groups-1");
  if (bad == 2) return py::none();
  return py::make_tuple(stable, sorted);
}


// For keys taken in a given row order: how many earlier rows (in that order) had the same key
// (0 for the first). One pass with a hash table: the running count per key.
py::array_t<int64_t> running_counts(py::array_t<int64_t, py::array::c_style | py::array::forcecast> keys) {
  const size_t n = static_cast<size_t>(keys.size());
  const int64_t* k = keys.data();
  py::array_t<int64_t> out(static_cast<py::ssize_t>(n));
  int64_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    int64_t lo = 0, hi = -1;
    if (n) {
      lo = hi = k[0];
      for (size_t i = 1; i < n; ++i) {
        lo = std::min(lo, k[i]);
        hi = std::max(hi, k[i]);
      }
    }
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
    if (n && span < 4 * static_cast<uint64_t>(n) + 1024) {  // dense keys: a table
      std::vector<int64_t> seen(static_cast<size_t>(span) + 1, 0);
      for (size_t i = 0; i < n; ++i) o[i] = seen[static_cast<size_t>(static_cast<uint64_t>(k[i]) - static_cast<uint64_t>(lo))]++;
    } else {
      std::unordered_map<int64_t, int64_t> seen;
      seen.reserve(1024);
      for (size_t i = 0; i < n; ++i) o[i] = seen[k[i]]++;
    }
  }
  return out;
}


// np.searchsorted(a, v, side) for a sorted int64 array, searching from the previous key's
// position outward (galloping): keys that come nearly sorted (correlation ids, timestamps)
// cost a few steps each instead of a whole binary search.
py::array_t<int64_t> searchsorted_i64(py::array_t<int64_t, py::array::c_style | py::array::forcecast> a,
                                      py::array_t<int64_t, py::array::c_style | py::array::forcecast> v, bool right) {
  const int64_t n = static_cast<int64_t>(a.size());
  const size_t m = static_cast<size_t>(v.size());
  const int64_t* x = a.data();
  const int64_t* q = v.data();
  py::array_t<int64_t> out(static_cast<py::ssize_t>(m));
  int64_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    // first position p with x[p] > key (right) or x[p] >= key (left): "before(p)" = x[p] < key / <= key
    auto before = [&](int64_t p, int64_t key) { return right ? x[p] <= key : x[p] < key; };
    int64_t pos = 0;
    for (size_t i = 0; i < m; ++i) {
      const int64_t key = q[i];
      int64_t lo, hi;  // answer in [lo, hi]
      if (pos < n && before(pos, key)) {  // answer after pos: gallop up
        int64_t step = 1;
        lo = pos + 1;
        hi = pos + 1;
        while (hi < n && before(hi, key)) {
          lo = hi + 1;
          hi = hi + step;
          step <<= 1;
        }
        if (hi > n) hi = n;
      } else {  // answer at or before pos: gallop down
        int64_t step = 1;
        hi = pos;
        lo = pos;
        while (lo > 0 && !before(lo - 1, key)) {
          hi = lo - 1;
          lo = lo - step;
          step <<= 1;
          if (lo < 0) lo = 0;
        }
      }
      while (lo < hi) {  // binary search in [lo, hi)
        const int64_t mid = lo + (hi - lo) / 2;
        if (before(mid, key)) lo = mid + 1;
        else hi = mid;
      }
      o[i] = pos = lo;
    }
  }
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
  m.def("query_many", &query_many, py::arg("uri"), py::arg("queries"), py::arg("threads") = 1, py::arg("trim") = true,
        "Run [(sql, kinds[, filter_column, uint8_mask[, expected_rows]]), ...] on parallel read-only connections; per query "
        "a list of columns: int64 ('i'; 't': INT64_MIN for a value that is not an integer, NULL included), int32 ('n', out-of-range values -1) or float64 ('f') arrays, or (int32 codes, [distinct strings]) for kind 's'. "
        "With a mask, only rows whose filter column value v has mask[v] != 0 are kept.");
  m.def("scan_table", &scan_table, py::arg("path"), py::arg("root"), py::arg("columns"), py::arg("filter_col") = -1,
        py::arg("mask") = py::none(), py::arg("exclude_col") = -1, py::arg("exclude_value") = 0, py::arg("threads") = 1,
        py::arg("expected_rows") = 0, py::arg("pieces") = false,
        "Integer columns of an ordinary rowid table read straight from the file's table b-tree, in rowid order: "
        "columns [(record_index or -1, null_value, 'i'|'n', shift, and_mask)] give ((ifnull(col, null_value) >> shift) "
        "& and_mask); rows whose exclude_col value equals exclude_value, or (with a mask) whose filter_col value v "
        "has mask[v] == 0, are dropped. None when the file or a value is outside what it handles (WAL mode, "
        "overflow pages, a non-integer value, damage): then run the query through SQLite. With pieces, each column "
        "is a list of arrays (one per reader thread, in row order) to be joined by the caller.");
  m.def("group_order_stats", &group_order_stats, py::arg("codes"), py::arg("values"), py::arg("n_groups"),
        "(median, max) of int64 values per group code 0..n_groups-1, as float64 arrays (NaN and 0 for an empty "
        "group); the median of an even count is (lower + upper) / 2.0 of the int64 middle values.");
  m.def("group_medians_f64", &group_medians_f64, py::arg("codes"), py::arg("values"), py::arg("n_groups"),
        "median of float64 values per group code 0..n_groups-1 (NaN for an empty group), (lower + upper) / 2 of "
        "the middle values; None when a value is NaN.");
  m.def("segmented_union", &segmented_union, py::arg("group"), py::arg("start"), py::arg("end"),
        py::arg("index") = py::none(),
        "(groups, first start, last end, union length) per group of intervals sorted by (group, start), as "
        "maxinstr.attribute.intervals.segmented_union computes them; with index, interval i is "
        "(start[index[i]], end[index[i]]).");
  m.def("group_sort_f64", &group_sort_f64, py::arg("codes"), py::arg("values"), py::arg("n_groups"),
        "(values[argsort(codes, stable)], values[lexsort((values, codes))]) for float64 values and group codes "
        "0..n_groups-1; None when a value is NaN or -0.0.");
  m.def("running_counts", &running_counts, py::arg("keys"),
        "Per row, how many earlier rows have the same int64 key (0 for the first).");
  m.def("searchsorted_i64", &searchsorted_i64, py::arg("a"), py::arg("v"), py::arg("right") = false,
        "np.searchsorted(a, v, side='right' if right else 'left') for a sorted int64 array, galloping from the "
        "previous key's position (nearly sorted keys cost a few steps each).");
  m.def("strings_by_id", &strings_by_id, py::arg("uri"), py::arg("table"), py::arg("ids"),
        "value of table rows by integer id, in the order of ids ('' when missing).");
}
