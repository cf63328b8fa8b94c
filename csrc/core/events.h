// GPU events (docs/stage-core.md, "GPU events"): a bounded pool, one event per stage boundary (close
// ones share), lazy resolution, GPU times on the host clock through a reference event per context.
#pragma once

#include "base.h"

#include <deque>
#include <vector>

#include "dispatch.h"
#include "placer.h"
#include "records.h"
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

struct Pending {  // a completed stage waiting for its GPU events
  Record rec;
  int ev0, ev1, ctx;
  uint64_t stream;
  PyObject* attrs;  // strong ref or NULL
};

struct Slot {
  void* ev;
  int ctx;
  int ref;
  uint64_t rec_seq;  // events.record_seq when this event was last recorded (stream order, see resolve)
  int64_t host_ns;   // its time on the host clock once placed (kUnplaced before)
  uint8_t placing = 0;  // handed to the placer thread, not placed yet
};
constexpr int64_t kUnplaced = INT64_MIN;

struct Ctx {
  void* key;              // CUcontext, or (device + 1) for HIP
  bool ok = false;        // reference pairing succeeded
  std::vector<int> free;  // free slots of this context
  int anchor = -1;        // slot of the newest resolved event (its host time is anchor_ns)
  int64_t anchor_ns = 0;
  int64_t retry_ns = 0;   // a failed reference pairing is retried after this host time
  int device = -1;        // CUDA device ordinal of the context (cuCtxGetDevice), -1 unknown
  int64_t floor_ns = 0;   // calibrated event->kernel->event floor, taken out of GPU times
  int floor_state = 0;    // 0 not calibrated, 1 calibrated, 2 fixed by MAXINSTR_GPU_FLOOR_NS, -1 failed
};

struct Events {
  bool gpu_off_after_fork = false;
  std::vector<Slot> slots;
  std::vector<Ctx> ctxs;
  int last_ctx = -1;
  int pool_max = 4096;
  int pool_total = 0;
  int64_t share_ns = 1000;  // see gpu_point(): boundaries closer than this share one event
  std::deque<Pending> pending;  // in exit order
  uint64_t gpu_exits = 0;
  uint64_t events_recorded = 0;
  uint64_t events_shared = 0;
  uint64_t events_dropped = 0;
  uint64_t events_capture = 0;  // boundaries skipped because the stream was capturing a graph
  uint64_t record_seq = 0;      // event records ever made (orders records on one stream)
  uint64_t event_queries = 0;   // cuEventQuery/Synchronize calls made to resolve records
  uint64_t event_elapsed = 0;   // cuEventElapsedTime calls made to resolve records
  bool warned_no_ctx = false;
  // MAXINSTR_TIME_DRIVER=1 (benchmarks): host ns inside each driver call of the hot path and in
  // opportunistic resolution (drv_ns). Off by default: two clock reads per call.
  bool time_driver = false;
  // The GPU-timing budget (docs/stage-core.md): a token bucket earning gpu_budget ns per ns of
  // wall time, holding at most kBudgetCreditNs (idle time saves up no burst), paying for events.
  double gpu_budget = 0.0025;
  int64_t gpu_cost_ns = 0;      // host ns spent recording and resolving events on the program's threads
  int64_t gpu_budget_t0 = 0;    // host time of the first GPU event
  double budget_tokens_ns = 250000.0;  // kBudgetCreditNs
  int64_t budget_last_t = 0;           // host time of the last check (0: none yet)
  int64_t budget_spent_seen = 0;       // event cost (this thread's and the placer's) at the last check
  uint64_t gpu_sampled_out = 0; // stages left untimed by the budget
  bool place_async = false;     // slot_place() hands events to the placer thread
  uint64_t drv_ns[5] = {0, 0, 0, 0, 0};  // record, query/sync, elapsed, is_capturing, resolve_front
  int64_t floor_fixed = -1;     // MAXINSTR_GPU_FLOOR_NS: >= 0 fixes the floor (0 = raw event times)
};
extern Events events;

enum { DRV_RECORD, DRV_QUERY, DRV_ELAPSED, DRV_CAPTURING, DRV_RESOLVE };
struct DrvTime {
  int which;
  int64_t t0;
  explicit DrvTime(int w) : which(events.time_driver ? w : -1), t0(which >= 0 ? now_ns() : 0) {}
  ~DrvTime() {
    if (UNLIKELY(which >= 0)) events.drv_ns[which] += (uint64_t)(now_ns() - t0);
  }
};

// cuEventQuery/Synchronize from any thread invalidate a graph capture in the default global mode:
// ours run with this thread in relaxed capture mode (the documented opt-out), restored afterwards.
struct RelaxedCapture {
  int old = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED == hipStreamCaptureModeRelaxed == 2
  bool on = false;
  RelaxedCapture() {
    if (vendor.gpu.exch_mode) on = vendor.gpu.exch_mode(&old) == 0;
  }
  ~RelaxedCapture() {
    if (on) vendor.gpu.exch_mode(&old);
  }
};

// Gives back one reference to slot s (-1: none); at zero the slot is free again.
void slot_release(int s);

// A free slot of context c with ref = 1, or -1 when the pool is exhausted. may_create: 1 = c is
// current (new events may be created in it), 2 = find out only if events are needed.
int slot_alloc(int c, int may_create);

// The reference pairing of context c, once per context at its first GPU stage.
bool ctx_pair_reference(int c);

constexpr int64_t kBudgetCreditNs = 250000;  // the first 0.25 ms of event work (~150 events) are always spent

// Whether the budget leaves a new top-level stage untimed (at host time t).
inline bool budget_skips(int64_t t) {
  if (events.gpu_budget <= 0 || events.gpu_budget_t0 == 0) return false;
  const int64_t spent = events.gpu_cost_ns + budget_offthread_ns.load(std::memory_order_relaxed);
  if (events.budget_last_t == 0) events.budget_last_t = events.gpu_budget_t0;
  double tokens = events.budget_tokens_ns + events.gpu_budget * (double)(t - events.budget_last_t) -
                  (double)(spent - events.budget_spent_seen);
  if (tokens > (double)kBudgetCreditNs) tokens = (double)kBudgetCreditNs;
  events.budget_tokens_ns = tokens;
  events.budget_last_t = t;
  events.budget_spent_seen = spent;
  return tokens < 0;
}

// One stage boundary (enter or exit) on `stream`: a slot holding one reference for the caller,
// or -1 (no event: pool exhausted, a capture or a driver error).
int gpu_point(ThreadState* ts, int c, uint64_t stream, int64_t t_now, int may_create);

inline size_t pending_count() { return events.pending.size(); }

// Resolves up to n records from the front of the queue, stopping at the first not ready. async:
// events not placed yet go to the placer, their records wait for a later pass.
size_t resolve_front(size_t n, bool async = false);
// Resolves every finished record (block: waits for all); defer: as async above.
size_t resolve_all(bool block, bool defer = false);

}  // namespace maxinstr
