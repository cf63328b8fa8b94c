// The union of intervals per group (intervals.h).
#include "intervals.h"

#include <algorithm>
#include <limits>

namespace columns {

size_t count_groups(const int64_t* g, size_t n) {
  size_t heads = n ? 1 : 0;
  for (size_t i = 1; i < n; ++i) heads += g[i] != g[i - 1];
  return heads;
}

void segmented_union(const int64_t* g, const int64_t* s, const int64_t* e, const int64_t* ix, size_t n, int64_t* og,
                     int64_t* of, int64_t* ol, int64_t* ou) {
  int64_t k = -1;
  int64_t run = 0;  // running max of end inside the group
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t r = ix ? static_cast<size_t>(ix[i]) : i;
    const int64_t si = s[r], ei = e[r];
    int64_t from;
    if (i == 0 || g[i] != g[i - 1]) {
      ++k;
      og[k] = g[i];
      of[k] = si;
      acc = 0;
      from = std::max(si, std::numeric_limits<int64_t>::min() / 2);  // numpy: max(INT64_MIN // 2, start)
      run = ei;
    } else {
      from = std::max(run, si);
      run = std::max(run, ei);
    }
    const int64_t add = static_cast<int64_t>(static_cast<uint64_t>(ei) - static_cast<uint64_t>(from));
    acc += static_cast<double>(add > 0 ? add : 0);
    ol[k] = run;  // the group's so far: its last row leaves the final values
    ou[k] = static_cast<int64_t>(acc);
  }
}

}  // namespace columns
