// Grouped order statistics and keyed searches (groups.h).
#include "groups.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

namespace columns {

namespace {

inline bool sort_decides(int64_t) { return false; }
inline bool sort_decides(double x) { return x != x || (x == 0 && std::signbit(x)); }  // NaN, -0.0

// Values bucketed by group with one counting sort: group k's values at [start[k], start[k + 1])
// of `out`, each group in row order.
template <typename T>
int bucket_by_group(const int64_t* c, const T* v, size_t n, size_t g, std::vector<int64_t>& start, T* out) {
  start.assign(g + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    if (c[i] < 0 || static_cast<uint64_t>(c[i]) >= g) return kBadCode;
    if (sort_decides(v[i])) return kSortDecides;
    ++start[static_cast<size_t>(c[i]) + 1];
  }
  for (size_t k = 0; k < g; ++k) start[k + 1] += start[k];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (size_t i = 0; i < n; ++i) out[fill[static_cast<size_t>(c[i])]++] = v[i];
  return kOk;
}

inline double middle(int64_t lo, int64_t hi) {
  return static_cast<double>(static_cast<int64_t>(static_cast<uint64_t>(lo) + static_cast<uint64_t>(hi))) / 2.0;
}
inline double middle(double lo, double hi) { return (lo + hi) / 2; }

template <typename T>
int medians(const int64_t* c, const T* v, size_t n, size_t g, double* med, double* mx) {
  std::vector<int64_t> start;
  std::vector<T> bucket(n);
  if (int bad = bucket_by_group(c, v, n, g, start, bucket.data())) return bad;
  for (size_t k = 0; k < g; ++k) {
    T* a = bucket.data() + start[k];
    T* b = bucket.data() + start[k + 1];
    const int64_t m = b - a;
    if (m == 0) {
      med[k] = std::numeric_limits<double>::quiet_NaN();
      if (mx) mx[k] = 0.0;
      continue;
    }
    T* lo = a + (m - 1) / 2;
    std::nth_element(a, lo, b);
    const T hi = (m % 2 == 0) ? *std::min_element(lo + 1, b) : *lo;
    med[k] = middle(*lo, hi);
    if (mx) mx[k] = static_cast<double>(*std::max_element(lo, b));
  }
  return kOk;
}

}  // namespace

int group_medians(const int64_t* codes, const int64_t* values, size_t n, size_t g, double* median, double* maximum) {
  return medians(codes, values, n, g, median, maximum);
}

int group_medians(const int64_t* codes, const double* values, size_t n, size_t g, double* median) {
  return medians(codes, values, n, g, median, nullptr);
}

int group_sort_f64(const int64_t* codes, const double* values, size_t n, size_t g, double* stable, double* sorted) {
  std::vector<int64_t> start;
  if (int bad = bucket_by_group(codes, values, n, g, start, stable)) return bad;
  std::memcpy(sorted, stable, n * sizeof(double));
  for (size_t k = 0; k < g; ++k) std::sort(sorted + start[k], sorted + start[k + 1]);
  return kOk;
}

void running_counts(const int64_t* k, size_t n, int64_t* o) {
  int64_t lo = 0, hi = -1;
  if (n) {
    const auto [a, b] = std::minmax_element(k, k + n);
    lo = *a;
    hi = *b;
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

void searchsorted_i64(const int64_t* x, int64_t n, const int64_t* q, size_t m, bool right, int64_t* o) {
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

}  // namespace columns
