// GPU events (events.h): the pool, the reference pairing, stage boundaries, resolution.
#include "events.h"

#include <cmath>
#include <string>

#include "placer.h"

namespace maxinstr MAXINSTR_HIDDEN {

Events events;
std::atomic<int64_t> budget_offthread_ns{0};

void slot_release(int s) {
  if (s < 0) return;
  Slot& sl = events.slots[(size_t)s];
  if (--sl.ref == 0) events.ctxs[(size_t)sl.ctx].free.push_back(s);
}

namespace {

// Creates up to 64 events in the current context. Only called where ctx is current.
bool pool_grow(int c) {
  int room = events.pool_max - events.pool_total;
  if (room <= 0) return false;
  int n = room < 64 ? room : 64;
  for (int i = 0; i < n; i++) {
    void* ev = nullptr;
    int rc = vendor.gpu.ev_create(&ev, 0);
    if (rc != 0) {
      add_error("event create failed (status " + std::to_string(rc) + ")");
      return i > 0;
    }
    events.slots.push_back(Slot{ev, c, 0, 0, kUnplaced});
    events.ctxs[(size_t)c].free.push_back((int)events.slots.size() - 1);
    events.pool_total++;
  }
  return true;
}

}  // namespace

int slot_alloc(int c, int may_create) {
  Ctx& cx = events.ctxs[(size_t)c];
  if (cx.free.empty()) {
    if (may_create == 2) may_create = gpu_current_key() == cx.key;
    if (!(may_create && pool_grow(c))) {
      resolve_front(8);  // the GPU fell behind, or nobody resolves: try to get events back
      if (events.ctxs[(size_t)c].free.empty()) return -1;
    }
  }
  Ctx& cy = events.ctxs[(size_t)c];
  int s = cy.free.back();
  cy.free.pop_back();
  events.slots[(size_t)s].ref = 1;
  return s;
}

// The reference pair: record an event on the legacy default stream, wait for it, and take the
// midpoint of the host clock around record+wait as its host time (best of three, i.e. the
// narrowest window). Once per context, at its first GPU stage: the only synchronisation outside
// resolve(block=True).
bool ctx_pair_reference(int c) {
  RelaxedCapture relaxed;
  if (vendor.gpu.is_capturing) {  // the legacy stream must not be touched while a graph is captured
    int status = 0;
    if (vendor.gpu.is_capturing(nullptr, &status) != 0 || status != 0) return false;
  }
  int best = -1;
  int64_t best_w = INT64_MAX, best_t = 0;
  for (int i = 0; i < 3; i++) {
    int s = slot_alloc(c, 1);
    if (s < 0) break;
    int64_t t0 = now_ns();
    int rc = vendor.gpu.ev_record(events.slots[(size_t)s].ev, nullptr);
    if (rc == 0) rc = vendor.gpu.ev_sync(events.slots[(size_t)s].ev);
    int64_t t1 = now_ns();
    if (rc != 0) {
      add_error("reference event failed (status " + std::to_string(rc) + "): GPU times off for this context");
      slot_release(s);
      break;
    }
    if (t1 - t0 < best_w) {
      if (best >= 0) slot_release(best);
      best = s;
      best_w = t1 - t0;
      best_t = t0 + (t1 - t0) / 2;
    } else {
      slot_release(s);
    }
  }
  if (best < 0) return false;
  events.ctxs[(size_t)c].anchor = best;
  events.ctxs[(size_t)c].anchor_ns = best_t;
  events.slots[(size_t)best].host_ns = best_t;
  return true;
}

// One stage boundary (enter or exit) on `stream`: returns a slot holding one reference for the
// caller, or -1 (no event: pool exhausted or driver error).
//
// Boundary sharing: if this thread's previous boundary on the same stream and context was less
// than share_ns ago (host clock), its event is reused instead of recording a new one. Submitting
// GPU work (a kernel launch, a copy, an event record) costs the host more than ~1 us, so no work
// of this thread can sit between two boundaries that close: the stream position is the same, and
// one event stands for both. This turns the exit of a stage and the enter of its next sibling (or
// a parent's enter and its first child's enter) into one event. Work submitted to the same stream
// by *another* thread inside that window would be missed; see docs/stage-core.md.
int gpu_point(ThreadState* ts, int c, uint64_t stream, int64_t t_now, int may_create) {
  Boundary* b = nullptr;
  for (auto& x : ts->bnd)
    if (x.slot >= 0 && x.stream == stream && x.ctx == c) {
      b = &x;
      break;
    }
  if (b && t_now - b->t_ns < events.share_ns) {
    events.slots[(size_t)b->slot].ref++;
    b->t_ns = t_now;
    events.events_shared++;
    return b->slot;
  }
  if (vendor.gpu.is_capturing) {
    // A stream capturing a graph would take our event record into the graph (no timestamp),
    // and the legacy stream cannot be used while a blocking stream captures: no GPU time then.
    int status = 0;
    int rc;
    {
      DrvTime dt(DRV_CAPTURING);
      rc = vendor.gpu.is_capturing((void*)(uintptr_t)stream, &status);
    }
    if (rc != 0 || status != 0) {
      events.events_capture++;
      return -1;
    }
  }
  int s = slot_alloc(c, may_create);
  if (s < 0) {
    events.events_dropped++;
    return -1;
  }
  int rc;
  {
    DrvTime dt(DRV_RECORD);
    rc = vendor.gpu.ev_record(events.slots[(size_t)s].ev, (void*)(uintptr_t)stream);
  }
  if (rc != 0) {
    add_error("event record failed (status " + std::to_string(rc) + "): stage keeps host times only");
    slot_release(s);
    events.events_dropped++;
    return -1;
  }
  events.events_recorded++;
  events.slots[(size_t)s].rec_seq = ++events.record_seq;
  events.slots[(size_t)s].host_ns = kUnplaced;
  if (!b) {
    b = &ts->bnd[ts->bnd_next];
    ts->bnd_next = (ts->bnd_next + 1) % kBoundaries;
  }
  slot_release(b->slot);
  events.slots[(size_t)s].ref++;
  int64_t t_after = now_ns();
  if (UNLIKELY(events.gpu_budget_t0 == 0)) events.gpu_budget_t0 = t_now;
  events.gpu_cost_ns += t_after - t_now;
  *b = Boundary{stream, c, s, t_after};
  return s;
}

namespace {

// Host-clock time of a completed event: computed once per recording (cached in the slot) as
// anchor + elapsed(anchor, event). With sibling boundaries shared, a stage's enter event is the
// previous stage's exit event, already placed: one cuEventElapsedTime per event, not two per
// stage. The anchor is the newest placed event of the context, so the float milliseconds stay
// small and keep ~ns precision. Returns the driver status (0 ok, 600 not ready).
int slot_place(Ctx& cx, int s, int64_t* out) {
  Slot& sl = events.slots[(size_t)s];
  if (sl.host_ns != kUnplaced) {
    *out = sl.host_ns;
    return 0;
  }
  if (events.place_async && placer::stage(cx, s)) return placer::kDeferred;
  float ms = 0.f;
  events.event_elapsed++;
  DrvTime dt(DRV_ELAPSED);
  int rc = vendor.gpu.ev_elapsed(&ms, events.slots[(size_t)cx.anchor].ev, sl.ev);
  if (rc != 0) return rc;
  sl.host_ns = cx.anchor_ns + (int64_t)llround((double)ms * 1e6);
  *out = sl.host_ns;
  return 0;
}

// Releases p's events and hands its record (and attrs) to the done queue. Always 1: resolved.
int finish_pending(Pending& p) {
  slot_release(p.ev0);
  slot_release(p.ev1);
  push_done(p.rec, p.attrs);
  Py_XDECREF(p.attrs);
  p.attrs = nullptr;
  return 1;
}

// Resolves p whose exit event is known complete (queried by the caller, or implied by a later
// event of the same stream). 1: resolved (record moved to done, events released); 0: not ready.
int resolve_known(Pending& p) {
  Ctx& cx = events.ctxs[(size_t)p.ctx];
  int64_t t0 = 0, t1 = 0;
  int rc0 = slot_place(cx, p.ev0, &t0);
  int rc1 = (rc0 == 0 || rc0 == placer::kDeferred) ? slot_place(cx, p.ev1, &t1) : rc0;
  if (rc0 == placer::kDeferred || rc1 == placer::kDeferred) return 0;  // placed at a later pass
  int rc = rc0 ? rc0 : rc1;
  if (rc == 600) return 0;  // not complete after all (another thread's event on the stream)
  if (rc == 0) {
    // Take out the floor (ctx_calibrate): enter later and exit earlier by half of it each, so
    // shared boundaries map to the same points and nesting is kept. A stage shorter than the
    // floor (no kernel in it) reads 0 at the middle of its events.
    int64_t f = cx.floor_ns;
    if (t1 - t0 >= f) {
      p.rec.gpu_start_ns = t0 + f / 2;
      p.rec.gpu_end_ns = t1 - (f - f / 2);
    } else {
      p.rec.gpu_start_ns = p.rec.gpu_end_ns = t0 + (t1 - t0) / 2;
    }
    p.rec.flags |= F_GPU_TIMED;
    if (t1 >= cx.anchor_ns) {  // the newest placed event becomes the anchor
      events.slots[(size_t)p.ev1].ref++;
      slot_release(cx.anchor);
      cx.anchor = p.ev1;
      cx.anchor_ns = t1;
    }
  } else {
    add_error("event elapsed-time failed (status " + std::to_string(rc) + ")");
    p.rec.flags |= F_GPU_DROPPED;
    events.events_dropped++;
  }
  return finish_pending(p);
}

// p's exit event failed to query with status rc: the record keeps its host times only.
int resolve_failed(Pending& p, int rc) {
  add_error("event query failed (status " + std::to_string(rc) + ")");
  p.rec.flags |= F_GPU_DROPPED;
  events.events_dropped++;
  return finish_pending(p);
}

// Work on one stream completes in order: once an exit event of a (context, stream) is complete,
// every record of that stream recorded no later (rec_seq) is complete too, and needs no query of
// its own. A pass finds, per stream, the newest complete exit among the records it looks at: one
// query of the newest (enough when the GPU has caught up), else a binary search over the older
// ones (about log2(n) queries). Under load a query costs far more than on an idle GPU (1.3 us
// against 0.3 us on an H200 busy with launches), and asking each record in turn made it ~1 query
// per stage.
struct StreamDone {
  int ctx;
  uint64_t stream;
  std::vector<size_t> idx;  // positions in events.pending of this stream's records, in queue order
  uint64_t done_seq;        // records with exit rec_seq <= done_seq are complete
  int err;                  // a query of err_slot failed with this status (that record is dropped)
  int err_slot;
};

inline int query_exit(size_t i, bool block) {
  events.event_queries++;
  DrvTime dt(DRV_QUERY);
  void* ev = events.slots[(size_t)events.pending[i].ev1].ev;
  return block ? vendor.gpu.ev_sync(ev) : vendor.gpu.ev_query(ev);
}

inline uint64_t exit_seq(size_t i) { return events.slots[(size_t)events.pending[i].ev1].rec_seq; }

void scan_streams(std::vector<StreamDone>& sd, size_t m, bool block) {
  for (size_t i = 0; i < m; i++) {
    Pending& p = events.pending[i];
    StreamDone* d = nullptr;
    for (auto& x : sd)
      if (x.ctx == p.ctx && x.stream == p.stream) {
        d = &x;
        break;
      }
    if (!d) {
      sd.push_back(StreamDone{p.ctx, p.stream, {}, 0, 0, -1});
      d = &sd.back();
    }
    d->idx.push_back(i);
  }
  for (auto& d : sd) {
    // exit events of one stream were recorded in queue order: rec_seq grows along idx
    size_t last = d.idx.back();
    int rc = query_exit(last, block);
    if (rc == 0) {
      d.done_seq = exit_seq(last);
      continue;
    }
    if (rc != 600) {  // that record is dropped; the older ones are searched below
      d.err = rc;
      d.err_slot = events.pending[last].ev1;
    }
    // largest k in [0, n-2] whose exit is complete (lo = -1: none); the oldest first, so a
    // pass with nothing complete costs two queries, not a whole search
    long lo = -1, hi = (long)d.idx.size() - 2;
    if (hi >= 0) {
      int r = query_exit(d.idx[0], false);
      if (r == 0) {
        lo = 0;
      } else {
        if (r != 600 && !d.err) {
          d.err = r;
          d.err_slot = events.pending[d.idx[0]].ev1;
        }
        hi = -1;
      }
    }
    while (lo < hi) {
      long mid = (lo + hi + 1) / 2;
      int r = query_exit(d.idx[(size_t)mid], false);
      if (r == 0) {
        lo = mid;
      } else {
        if (r != 600 && !d.err) {
          d.err = r;
          d.err_slot = events.pending[d.idx[(size_t)mid]].ev1;
        }
        hi = mid - 1;
      }
    }
    d.done_seq = lo >= 0 ? exit_seq(d.idx[(size_t)lo]) : 0;
  }
}

// 1: p resolved (known complete, or its query failed in the scan); 0: not ready.
inline int resolve_scanned(StreamDone* d, Pending& p) {
  if (!d) return 0;
  if (d->err && p.ev1 == d->err_slot) {
    int rc = d->err;
    d->err = 0;
    return resolve_failed(p, rc);
  }
  if (events.slots[(size_t)p.ev1].rec_seq <= d->done_seq) return resolve_known(p);
  return 0;
}

inline StreamDone* find_stream(std::vector<StreamDone>& sd, const Pending& p) {
  for (auto& x : sd)
    if (x.ctx == p.ctx && x.stream == p.stream) return &x;
  return nullptr;
}

// Hands the events of the complete records among pending[from, to) to the placer.
void stage_complete(std::vector<StreamDone>& sd, size_t from, size_t to) {
  int64_t t = 0;
  for (size_t i = from; i < to && i < events.pending.size(); i++) {
    Pending& p = events.pending[i];
    StreamDone* d = find_stream(sd, p);
    if (!d || events.slots[(size_t)p.ev1].rec_seq > d->done_seq) continue;
    Ctx& cx = events.ctxs[(size_t)p.ctx];
    slot_place(cx, p.ev0, &t);
    slot_place(cx, p.ev1, &t);
  }
}

}  // namespace

// Resolves up to n records from the front of the queue, stopping at the first not ready. With
// `async` (and the placer usable), events not placed yet go to the placer (this and the
// following complete records) and their records wait for a later pass; without, they are placed
// here (the pool needs its events back now).
size_t resolve_front(size_t n, bool async) {
  if (events.pending.empty()) return 0;
  DrvTime dt(DRV_RESOLVE);
  RelaxedCapture relaxed;
  if (async) placer::consume();
  else placer::wait_idle();  // the pool needs events back: nothing measured twice meanwhile
  events.place_async = async && placer::usable();
  size_t m = n < events.pending.size() ? n : events.pending.size();
  std::vector<StreamDone> sd;
  scan_streams(sd, m, false);
  size_t k = 0;
  while (k < m && !events.pending.empty()) {
    Pending& p = events.pending.front();
    if (!resolve_scanned(find_stream(sd, p), p)) break;
    events.pending.pop_front();
    k++;
  }
  if (events.place_async) {
    stage_complete(sd, 0, m - k);
    events.place_async = false;
    placer::submit();
  }
  return k;
}

// Resolves every finished record (block: waits for all). Records not complete, or (defer)
// waiting for the placer, stay queued in their order; the others are finished in this pass.
size_t resolve_all(bool block, bool defer) {
  RelaxedCapture relaxed;
  size_t k = 0;
  if (defer && !block && placer::usable()) {
    placer::consume();
    events.place_async = true;
  } else {
    placer::wait_idle();  // inline placement: nothing of ours in flight meanwhile
  }
  std::vector<StreamDone> sd;
  scan_streams(sd, events.pending.size(), block);
  std::deque<Pending> keep;
  for (Pending& p : events.pending) {
    if (resolve_scanned(find_stream(sd, p), p)) {
      k++;
      continue;
    }
    keep.push_back(p);
  }
  events.pending.swap(keep);
  if (events.place_async) {
    events.place_async = false;
    placer::submit();
  }
  return k;
}

}  // namespace maxinstr
