// Integer columns of an ordinary rowid table read straight from the SQLite file's table b-tree
// (https://www.sqlite.org/fileformat.html). Why: SQLite's virtual machine costs ~100 ns per row plus
// ~35 ns per value, and a 1M-kernel export has 3.7M rows in its kernel and CUDA API tables. Only
// the plain case is read: anything else (WAL mode, damage, overflow pages, a value not an integer
// or NULL) makes the caller run the same query through SQLite.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace columns {

struct ScanCol {
  int src = -1;            // record column index; -1: absent from this schema version
  int64_t null_value = 0;  // ifnull(col, null_value); also the value of an absent column
  char kind = 'i';         // 'i' int64, 'n' int32 (out of range -> -1)
  int shift = 0;           // v >> shift (arithmetic, as SQLite's >>)
  int64_t and_mask = -1;   // v & and_mask
};

struct ScanSpec {
  std::vector<ScanCol> cols;
  int filter_col = -1;  // output column whose value v must have mask[v] != 0
  const uint8_t* mask = nullptr;
  int64_t mask_size = 0;
  int exclude_col = -1;  // output column whose value must differ from exclude_value
  int64_t exclude_value = 0;
};

struct ScanOut {  // one reader thread's rows
  std::vector<std::vector<int64_t>> ints;    // per output column (kind 'i')
  std::vector<std::vector<int32_t>> narrow;  // per output column (kind 'n')
  int64_t rows = 0;
};

// Rows of the table rooted at page `root` in rowid order, as consecutive leaf ranges read on up to
// `threads` threads (`parts`, in order); false where this reader cannot. Throws std::bad_alloc.
bool scan_table(const std::string& path, int64_t root, const ScanSpec& spec, int threads, int64_t expected_rows,
                std::vector<ScanOut>& parts);

}  // namespace columns
