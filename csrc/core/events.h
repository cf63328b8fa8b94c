// GPU events: a bounded pool of events created once and reused, one event per stage boundary
// (siblings and parent/child boundaries share one event when no work can have been submitted
// between them), lazy non-blocking resolution, GPU times mapped onto the host clock through a
// reference event per context. The floor taken out of GPU times is measured apart (floor.cpp);
// the elapsed-time calls can go to the placer thread (placer.h).
//
// What stage enter/exit calls is here: inline, or declared and defined in events.cpp.
#pragma once

#include "base.h"

#include <atomic>
#include <deque>
#include <vector>

#include "dispatch.h"
#include "floor.h"
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
  uint8_t placing = 0;  // handed to the placer thread (placer.h), not placed yet
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

// Protected by the GIL, as all process state (state.h).
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
  // MAXINSTR_TIME_DRIVER=1 (benchmarks): host ns spent inside each driver call of the hot path and
  // inside opportunistic resolution, so a benchmark can split a GPU-timed stage's cost into the
  // driver's and ours. Off by default: two clock reads per call.
  bool time_driver = false;
  // The GPU-timing budget (docs/stage-core.md): recording and resolving events costs the program's
  // threads host time (1.5-2 us per event on a busy H200 with the placer, ~5 us inline), which a
  // launch-bound loop of short stages feels. Stages with gpu=None are GPU-timed while that cost
  // stays within `gpu_budget` of the wall time since the first GPU event (plus a starting credit);
  // beyond it, whole top-level stages (with their children) are left untimed until the cost is
  // back under budget. 0: every stage is timed. gpu=True stages are always timed.
  double gpu_budget = 0.0025;
  int64_t gpu_cost_ns = 0;      // host ns spent recording and resolving events on the program's threads
  int64_t gpu_budget_t0 = 0;    // host time of the first GPU event
  // The budget is a token bucket: it earns `gpu_budget` ns per ns of wall time, holds at most the
  // starting credit, and pays for what the events cost. Before it held no cap, so time without GPU
  // stages (a pause, a phase of untimed work) saved up a credit spent later in one burst of fully
  // timed steps (H100, decoder_ab: every decode step of a block timed, the step ~1 point slower).
  double budget_tokens_ns = 250000.0;  // kBudgetCreditNs
  int64_t budget_last_t = 0;           // host time of the last check (0: none yet)
  int64_t budget_spent_seen = 0;       // event cost (this thread's and the placer's) at the last check
  uint64_t gpu_sampled_out = 0; // stages left untimed by the budget
  bool place_async = false;     // slot_place() hands events to the placer thread (placer.h)
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

// While some stream captures a CUDA graph in the default "global" mode, calls such as
// cuEventQuery/cuEventSynchronize from any thread are illegal and invalidate that capture. Our
// queries (resolve(), opportunistic resolution, the reference pairing) run with this thread in
// "relaxed" capture mode, the documented opt-out for exactly this kind of bookkeeping, and
// restore the thread's mode afterwards.
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

// The reference pairing of context c, once per context at its first GPU stage (then ctx_calibrate,
// floor.h).
bool ctx_pair_reference(int c);

// Index of the context state for key (the current context), creating it on first use; -1 when
// its reference pairing failed. Its one caller is stage enter: `static` lets the compiler inline
// it there as it did when the core was one file, with or without link-time optimisation.
static inline int ctx_index(void* key) {
  int found = -1;
  if (events.last_ctx >= 0 && events.ctxs[(size_t)events.last_ctx].key == key) {
    found = events.last_ctx;
  } else {
    for (size_t i = 0; i < events.ctxs.size(); i++)
      if (events.ctxs[i].key == key) found = (int)i;
  }
  if (found >= 0) {
    events.last_ctx = found;
    Ctx& cx = events.ctxs[(size_t)found];
    if (LIKELY(cx.ok)) return found;
    // The pairing failed (e.g. a graph capture was running): try again at most once a second.
    int64_t t = now_ns();
    if (t < cx.retry_ns) return -1;
    cx.ok = ctx_pair_reference(found);
    if (!cx.ok) events.ctxs[(size_t)found].retry_ns = t + 1000000000LL;
    else ctx_calibrate(found);
    return events.ctxs[(size_t)found].ok ? found : -1;
  }
  Ctx cx;
  cx.key = key;
  events.ctxs.push_back(cx);
  int c = (int)events.ctxs.size() - 1;
  events.last_ctx = c;
  events.ctxs[(size_t)c].ok = ctx_pair_reference(c);
  if (!events.ctxs[(size_t)c].ok) events.ctxs[(size_t)c].retry_ns = now_ns() + 1000000000LL;
  else ctx_calibrate(c);
  return events.ctxs[(size_t)c].ok ? c : -1;
}

constexpr int64_t kBudgetCreditNs = 250000;  // the first 0.25 ms of event work (~150 events) are always spent

// Host ns the placer thread spent in elapsed-time calls since the budget began (placer.cpp adds
// them): not the program's thread, yet a launch-bound program feels them, since they take the
// driver's locks its launches need (H100, decoder_ab: GPU events cost the step ~1 point while
// the program's own threads counted 0.25 %). So they count against the budget too.
extern std::atomic<int64_t> budget_offthread_ns;

// Whether the budget leaves a new top-level stage untimed (at host time t).
inline bool budget_skips(int64_t t) {
  if (events.gpu_budget <= 0 || events.gpu_budget_t0 == 0) return false;
  const int64_t spent = events.gpu_cost_ns + budget_offthread_ns.load(std::memory_order_relaxed);
  if (events.budget_last_t == 0) events.budget_last_t = events.gpu_budget_t0;
  double tokens = events.budget_tokens_ns + events.gpu_budget * (double)(t - events.budget_last_t) -
                  (double)(spent - events.budget_spent_seen);
  if (tokens > (double)kBudgetCreditNs) tokens = (double)kBudgetCreditNs;  // idle time saves no more than this
  events.budget_tokens_ns = tokens;
  events.budget_last_t = t;
  events.budget_spent_seen = spent;
  return tokens < 0;
}

// One stage boundary (enter or exit) on `stream` (see events.cpp): a slot holding one reference
// for the caller, or -1.
int gpu_point(ThreadState* ts, int c, uint64_t stream, int64_t t_now, int may_create);

inline size_t pending_count() { return events.pending.size(); }

// Resolves up to n records from the front of the queue (see events.cpp).
size_t resolve_front(size_t n, bool async = false);
// Resolves every finished record (see events.cpp).
size_t resolve_all(bool block, bool defer = false);


}  // namespace maxinstr
