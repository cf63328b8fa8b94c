// The slice of SQLite's C API the columns module calls, from the system's libsqlite3.so.0 dlopened
// on first use (without it the Python sqlite3 path gives the same results, slower).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace columns {

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

// (member, return type, parameters): each is sqlite3_<member> of the library.
#define COLUMNS_SQLITE_FUNCTIONS(X)                                                 \
  X(open_v2, int, (const char*, sqlite3**, int, const char*))                       \
  X(close_v2, int, (sqlite3*))                                                      \
  X(prepare_v2, int, (sqlite3*, const char*, int, sqlite3_stmt**, const char**))    \
  X(step, int, (sqlite3_stmt*))                                                     \
  X(reset, int, (sqlite3_stmt*))                                                    \
  X(finalize, int, (sqlite3_stmt*))                                                 \
  X(column_count, int, (sqlite3_stmt*))                                             \
  X(column_type, int, (sqlite3_stmt*, int))                                         \
  X(column_int64, int64_t, (sqlite3_stmt*, int))                                    \
  X(column_double, double, (sqlite3_stmt*, int))                                    \
  X(column_text, const unsigned char*, (sqlite3_stmt*, int))                        \
  X(column_bytes, int, (sqlite3_stmt*, int))                                        \
  X(bind_int64, int, (sqlite3_stmt*, int, int64_t))                                 \
  X(errmsg, const char*, (sqlite3*))                                                \
  X(libversion, const char*, ())                                                    \
  X(threadsafe, int, ())

struct Api {
#define COLUMNS_DECLARE(name, ret, params) ret(*name) params = nullptr;
  COLUMNS_SQLITE_FUNCTIONS(COLUMNS_DECLARE)
#undef COLUMNS_DECLARE
  void* handle = nullptr;  // null: not loaded, `error` says why
  std::string error;
};

// Loaded once, on first use.
Api& api();

// The loaded API, else a std::runtime_error saying why not.
inline Api& require() {
  Api& a = api();
  if (!a.handle) throw std::runtime_error("maxinstr._columns: " + a.error);
  return a;
}

// A read-only connection (a URI: file:...?immutable=1 and the like).
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

}  // namespace columns
