// Grouped order statistics and keyed searches for the report, in O(n): a counting sort by group,
// then nth_element per group (numpy's sort of the (group, value) key was a sixth of the report's
// time). Group codes are 0..g-1; the grouped functions return kOk, kBadCode (a code outside
// 0..g-1) or kSortDecides (a float64 value whose place a sort decides by its own rule: NaN, -0.0).
#pragma once

#include <cstddef>
#include <cstdint>

namespace columns {

enum { kOk = 0, kBadCode = 1, kSortDecides = 2 };

// Per group, the median ((lower + upper) / 2 of the middle values, as numpy computes it: for int64
// the int64 sum, then a float64 division) and, with `maximum`, the largest value (NaN and 0 for an
// empty group).
int group_medians(const int64_t* codes, const int64_t* values, size_t n, size_t g, double* median, double* maximum);
int group_medians(const int64_t* codes, const double* values, size_t n, size_t g, double* median);

// values[argsort(codes, stable)] into `stable` and values[lexsort((values, codes))] into `sorted`.
int group_sort_f64(const int64_t* codes, const double* values, size_t n, size_t g, double* stable, double* sorted);

// For keys in a given row order: how many earlier rows had the same key (0 for the first).
void running_counts(const int64_t* keys, size_t n, int64_t* out);

// np.searchsorted(a, v, side) for a sorted int64 array, searching from the previous key's position
// outward (galloping): keys that come nearly sorted (correlation ids, timestamps) cost a few steps.
void searchsorted_i64(const int64_t* a, int64_t n, const int64_t* v, size_t m, bool right, int64_t* out);

}  // namespace columns
