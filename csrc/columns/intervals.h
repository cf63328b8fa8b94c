// The union of intervals per group as maxinstr.attribute.intervals.segmented_union computes it
// (summed in float64 in row order, then truncated to int64, as its bincount does).
#pragma once

#include <cstddef>
#include <cstdint>

namespace columns {

// Groups in `group` (runs of equal codes): the size of segmented_union's outputs.
size_t count_groups(const int64_t* group, size_t n);

// For intervals sorted by (group, start), per group: its code, first start, last end, union
// length. Interval i is (start[r], end[r]) with r = index ? index[i] : i.
void segmented_union(const int64_t* group, const int64_t* start, const int64_t* end, const int64_t* index, size_t n,
                     int64_t* gid, int64_t* first, int64_t* last, int64_t* uni);

}  // namespace columns
