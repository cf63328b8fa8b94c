// SQLite result columns (query.h).
#include "query.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <limits>
#include <stdexcept>
#include <thread>

#include "sqlite.h"

namespace columns {

namespace {

void run_query(const std::string& uri, Query& q) {
  Api& a = require();
  q.columns.resize(q.kinds.size());
  const size_t reserve = static_cast<size_t>(std::max<int64_t>(16, q.filter.reserve));
  for (size_t c = 0; c < q.kinds.size(); ++c) {
    Column& col = q.columns[c];
    col.kind = q.kinds[c];
    if (col.kind == 'i' || col.kind == 't')
      (col.ints = std::make_unique<std::vector<int64_t>>())->reserve(reserve);
    else if (col.kind == 'n' || col.kind == 's')
      (col.narrow = std::make_unique<std::vector<int32_t>>())->reserve(reserve);
    else if (col.kind == 'f')
      (col.reals = std::make_unique<std::vector<double>>())->reserve(reserve);
    else
      throw std::runtime_error(std::string("unknown column kind '") + col.kind + "'");
  }
  Db db(uri);
  Stmt st(db, q.sql);
  const int ncol = a.column_count(st.st);
  if (ncol != static_cast<int>(q.kinds.size()))
    throw std::runtime_error("query returns " + std::to_string(ncol) + " columns but " +
                             std::to_string(q.kinds.size()) + " kinds were given");
  const Filter& filter = q.filter;
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
      Column& col = q.columns[c];
      switch (col.kind) {
        case 'i':
          col.ints->push_back(a.column_int64(st.st, c));  // NULL reads as 0: callers ifnull() in SQL
          break;
        case 't':
          // A time: SQLite would read text as 0 or its leading digits and truncate a float; anything
          // but an integer reads INT64_MIN (maxinstr.traces.model.INVALID_NS), dropped and counted.
          col.ints->push_back(a.column_type(st.st, c) == SQLITE_INTEGER ? a.column_int64(st.st, c)
                                                                       : std::numeric_limits<int64_t>::min());
          break;
        case 'n': {
          // Half the memory of 'i'; a value outside the int32 range (only in a damaged file) reads as -1.
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
            col.narrow->push_back(-1);
            break;
          }
          key.assign(reinterpret_cast<const char*>(p), static_cast<size_t>(a.column_bytes(st.st, c)));
          auto it = col.index.find(key);
          if (it == col.index.end()) {
            int32_t id = static_cast<int32_t>(col.values.size());
            col.index.emplace(key, id);
            col.values.push_back(key);
            col.narrow->push_back(id);
          } else {
            col.narrow->push_back(it->second);
          }
        }
      }
    }
  }
}

}  // namespace

void run_queries(const std::string& uri, std::vector<Query>& queries, int threads) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < queries.size(); i = next++) {
      try {
        run_query(uri, queries[i]);
      } catch (const std::exception& e) {
        queries[i].error = e.what();
      }
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(queries.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

std::vector<std::string> strings_by_id(const std::string& uri, const std::string& table, const int64_t* ids,
                                       size_t n) {
  Api& a = require();
  for (char ch : table)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')) throw std::runtime_error("bad table name");
  std::vector<std::string> values(n);
  Db db(uri);
  Stmt st(db, "SELECT value FROM " + table + " WHERE id = ?");
  for (size_t i = 0; i < n; ++i) {
    a.reset(st.st);
    a.bind_int64(st.st, 1, ids[i]);
    if (a.step(st.st) == SQLITE_ROW) {
      const unsigned char* t = a.column_text(st.st, 0);
      if (t) values[i].assign(reinterpret_cast<const char*>(t), static_cast<size_t>(a.column_bytes(st.st, 0)));
    }
  }
  return values;
}

}  // namespace columns
