// Rowid tables read from the SQLite file (btree.h).
#include "btree.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>

namespace columns {

namespace {

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

// Pages first..first+count-1 into buf.
void read_pages(const File& f, uint64_t first, size_t count, std::vector<uint8_t>& buf) {
  if (first < 1 || first + count - 1 > f.pages) throw Unsupported{};
  buf.resize(count * f.page_size);
  size_t got = 0;
  const off_t at = static_cast<off_t>((first - 1) * f.page_size);
  while (got < buf.size()) {
    const ssize_t n = ::pread(f.fd, buf.data() + got, buf.size() - got, at + static_cast<off_t>(got));
    if (n <= 0) throw Unsupported{};
    got += static_cast<size_t>(n);
  }
}

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
      read_pages(f, no, 1, buf);
      if (++visited > f.pages) throw Unsupported{};
      const uint8_t* h = buf.data() + (no == 1 ? 100 : 0);  // page 1 has the file header first
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
    read_pages(f, no, run, buf);
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
      if (hlen != last_header.size() || !hlen || std::memcmp(hp, last_header.data(), hlen) != 0 ||
          last_body_size > body_size) {
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

}  // namespace

bool scan_table(const std::string& path, int64_t root, const ScanSpec& spec, int threads, int64_t expected_rows,
                std::vector<ScanOut>& parts) {
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
  return true;
} catch (const Unsupported&) {
  return false;
}
}

}  // namespace columns
