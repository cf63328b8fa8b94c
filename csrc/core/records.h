// The record layout, the names records refer to, and the queue of completed records (push_done).
#pragma once

#include "base.h"

#include <string>
#include <vector>

#include <nvtx3/nvToolsExt.h>

namespace maxinstr MAXINSTR_HIDDEN {

// maxinstr.rundir.format.STAGE_DTYPE (docs/formats.md), 72 little-endian bytes.
struct Record {
  int64_t id;
  int64_t parent_id;
  int64_t tid;
  int64_t host_start_ns;
  int64_t host_end_ns;
  int64_t gpu_start_ns;
  int64_t gpu_end_ns;
  int64_t step;
  int32_t name_id;
  int16_t depth;
  uint16_t flags;
};
static_assert(sizeof(Record) == 72, "Record must match STAGE_DTYPE (72 bytes)");

enum : uint16_t {
  F_EXCEPTION = 1u << 0,
  F_GPU_TIMED = 1u << 1,
  F_MARK = 1u << 2,
  F_GPU_DROPPED = 1u << 3,
  F_UNCLOSED = 1u << 4,
  F_GPU_SAMPLED_OUT = 1u << 5,  // left without GPU events by the timing budget (see budget_skips)
};

// A record holds a name_id; the table maps it to the name (interned by stage.cpp).
struct NameEntry {
  PyObject* str;  // strong ref
  std::string utf8;
  nvtxStringHandle_t nvtx;
};

struct NameTable {
  PyObject* dict = nullptr;  // str -> int name_id
  std::vector<NameEntry> entries;
  size_t reported = 0;  // entries [0, reported) were returned by a drain()
};
inline NameTable name_table;

struct AttrEntry {
  uint64_t done_index;  // position of the record in the completed stream
  int64_t id;
  PyObject* attrs;  // strong ref
};

// Completed records, FIFO: done[done_head:] are undrained (the GIL is their lock, and the native
// writer's mutex too while it runs: see push_done).
struct CompletedRecords {
  std::vector<Record> done;
  size_t done_head = 0;
  uint64_t done_pushed = 0;   // records ever pushed (index of the next one)
  uint64_t done_drained = 0;  // records ever drained
  std::vector<AttrEntry> attrs;
  size_t attrs_head = 0;
  size_t capacity = 1000000;
  uint64_t records = 0;
  uint64_t dropped_records = 0;
};
inline CompletedRecords completed;

inline size_t done_count() { return completed.done.size() - completed.done_head; }

}  // namespace maxinstr
