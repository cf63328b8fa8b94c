// GPU events (events.h): the pool, the reference pairing, stage boundaries, resolution.
#include "events.h"

#include <cmath>

#include "writer.h"

namespace maxinstr MAXINSTR_HIDDEN {

Events events;

void slot_release(int s) {
  if (s < 0) return;
  Slot& sl = events.slots[(size_t)s];
  if (--sl.ref == 0) events.ctxs[(size_t)sl.ctx].free.push_back(s);
}

namespace {

// Up to 64 new events in context c, which is current.
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

// Record an event on the legacy default stream, wait for it, and take the midpoint of the host
// clock around record+wait as its host time: best of three (the narrowest window).
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

// Boundary sharing (docs/stage-core.md): submitting GPU work costs the host over ~1 us, so none of
// this thread's can sit between two of its boundaries on a stream closer than share_ns: one event.
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

constexpr int kDeferred = -7777;  // slot_place(): the event was handed to the placer

// Releases the references a placer batch's items hold; with `apply`, places the events measured.
void release_items(std::vector<placer::Item>& items, bool apply) {
  for (placer::Item& it : items) {
    Slot& sl = events.slots[(size_t)it.slot];
    if (apply && it.rc == 0 && sl.rec_seq == it.seq && sl.host_ns == kUnplaced)
      sl.host_ns = it.anchor_ns + (int64_t)llround((double)it.ms * 1e6);
    sl.placing = 0;  // not placed (not ready, an error): placed again later, inline or there
    slot_release(it.slot);
    slot_release(it.anchor);
  }
  items.clear();
}

// Takes a finished batch's results (non-blocking).
void placer_consume() {
  if (!placer::finished()) return;
  release_items(placer::state.flight, true);
  placer::consumed();
}

// The pool needs its events back: nothing of ours in flight meanwhile, nothing measured twice.
void placer_wait() {
  placer::wait_busy();
  placer_consume();
}

void placer_submit() {
  if (!placer::submit()) release_items(placer::state.staged, false);
}

// Hands slot s of context cx to the placer. True: staged (or already there, or the batch is full:
// a later pass stages it); false: place it inline (a batch holds one context's events). A batch's
// slots and anchors hold an extra reference until it is consumed: none is recorded again meanwhile.
bool placer_stage(Ctx& cx, int s) {
  Slot& sl = events.slots[(size_t)s];
  if (sl.placing || placer::state.staged.size() >= placer::kMaxBatch) return true;
  if (cx.anchor < 0 || (!placer::state.staged.empty() && placer::state.ctx != cx.key)) return false;
  placer::state.ctx = cx.key;
  Slot& an = events.slots[(size_t)cx.anchor];
  placer::state.staged.push_back(placer::Item{s, cx.anchor, an.ev, sl.ev, cx.anchor_ns, sl.rec_seq, 0.f, 0});
  sl.placing = 1;
  sl.ref++;
  an.ref++;
  return true;
}

// Host time of a completed event, cached per recording: anchor + elapsed(anchor, event), the
// anchor the context's newest placed event (float ms keep ~ns precision). 0, or the driver status.
int slot_place(Ctx& cx, int s, int64_t* out) {
  Slot& sl = events.slots[(size_t)s];
  if (sl.host_ns != kUnplaced) {
    *out = sl.host_ns;
    return 0;
  }
  if (events.place_async && placer_stage(cx, s)) return kDeferred;
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
  int rc1 = (rc0 == 0 || rc0 == kDeferred) ? slot_place(cx, p.ev1, &t1) : rc0;
  if (rc0 == kDeferred || rc1 == kDeferred) return 0;  // placed at a later pass
  int rc = rc0 ? rc0 : rc1;
  if (rc == 600) return 0;  // not complete after all (another thread's event on the stream)
  if (rc == 0) {
    // The floor (floor.h) out: half of it at each end, so shared boundaries map to the same
    // points and nesting is kept; a stage shorter than it reads 0 at the middle of its events.
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

// Work on one stream completes in order, so a pass finds per (context, stream) the newest complete
// exit (rec_seq) among its records: one query of the newest, else a binary search
// (docs/stage-core.md, "Resolution": a query per record cost too much under load).
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

inline StreamDone* find_stream(std::vector<StreamDone>& sd, const Pending& p) {
  for (auto& x : sd)
    if (x.ctx == p.ctx && x.stream == p.stream) return &x;
  return nullptr;
}

void scan_streams(std::vector<StreamDone>& sd, size_t m, bool block) {
  for (size_t i = 0; i < m; i++) {
    Pending& p = events.pending[i];
    StreamDone* d = find_stream(sd, p);
    if (!d) {
      sd.push_back(StreamDone{p.ctx, p.stream, {}, 0, 0, -1});
      d = &sd.back();
    }
    d->idx.push_back(i);
  }
  for (auto& d : sd) {
    // whether the exit of the stream's k-th record is complete; a failed query drops that record
    // (the first error of the stream is kept). rec_seq grows along idx (queue order).
    auto complete = [&](size_t k, bool wait) {
      int rc = query_exit(d.idx[k], wait);
      if (rc != 0 && rc != 600 && !d.err) {
        d.err = rc;
        d.err_slot = events.pending[d.idx[k]].ev1;
      }
      return rc == 0;
    };
    const long n = (long)d.idx.size();
    if (complete((size_t)(n - 1), block)) {
      d.done_seq = exit_seq(d.idx.back());
      continue;
    }
    // largest k in [0, n-2] whose exit is complete (lo = -1: none); the oldest first, so a
    // pass with nothing complete costs two queries, not a whole search
    long lo = -1, hi = n - 2;
    if (hi >= 0) {
      if (complete(0, false)) lo = 0;
      else hi = -1;
    }
    while (lo < hi) {
      long mid = (lo + hi + 1) / 2;
      if (complete((size_t)mid, false)) lo = mid;
      else hi = mid - 1;
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

size_t resolve_front(size_t n, bool async) {
  if (events.pending.empty()) return 0;
  DrvTime dt(DRV_RESOLVE);
  RelaxedCapture relaxed;
  if (async) placer_consume();
  else placer_wait();
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
    placer_submit();
  }
  return k;
}

size_t resolve_all(bool block, bool defer) {
  RelaxedCapture relaxed;
  size_t k = 0;
  if (defer && !block && placer::usable()) {
    placer_consume();
    events.place_async = true;
  } else {
    placer_wait();
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
    placer_submit();
  }
  return k;
}

}  // namespace maxinstr
