// SQLite result columns stepped into vectors numpy adopts, text interned (names repeat massively),
// queries on parallel threads. Why: Python's sqlite3 builds a tuple and an int object per value
// and needs seconds for the ~3M rows of a 1M-kernel nsys export.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace columns {

struct Column {
  char kind;  // 'i' int64, 't' int64 (strict: times), 'n' int32 (ids, pids, enums), 'f' float64, 's' text
  std::unique_ptr<std::vector<int64_t>> ints;    // 'i', 't'
  std::unique_ptr<std::vector<int32_t>> narrow;  // 'n', and the codes of 's' (-1: NULL)
  std::unique_ptr<std::vector<double>> reals;    // 'f'
  std::unordered_map<std::string, int32_t> index;
  std::vector<std::string> values;  // 's': the distinct strings, by code
};

// A row filter: keep a row only when mask[value of column `col`] is non-zero (values outside the
// mask are dropped). Used to keep only the API calls whose correlation id some GPU op has.
struct Filter {
  int64_t reserve = 1 << 16;  // expected rows: reserving once avoids regrowth copies
  int col = -1;
  const uint8_t* mask = nullptr;
  int64_t size = 0;
};

struct Query {
  std::string sql, kinds;  // one kind per result column
  Filter filter;
  std::vector<Column> columns;  // the result
  std::string error;            // or why there is none
};

// Runs the queries on up to `threads` threads, one read-only connection each.
void run_queries(const std::string& uri, std::vector<Query>& queries, int threads);

// `value` of the rows of `table` by integer id, in the order of ids ('' when missing).
std::vector<std::string> strings_by_id(const std::string& uri, const std::string& table, const int64_t* ids,
                                       size_t n);

}  // namespace columns
