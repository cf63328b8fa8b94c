// The placer thread: cuEventElapsedTime off the program's threads (included by native.cpp).
//
// Placing an event on the host clock takes one cuEventElapsedTime against the context's anchor.
// On an H200 busy with launches that call costs ~3 us of host time (0.3-0.5 us on an idle GPU;
// benchmarks/event_diag.py), the larger part of what a GPU-timed stage cost the thread that
// resolved it. The opportunistic resolution at stage exits and the session flusher's passes
// therefore hand the elapsed-time calls of complete records to this thread in batches and move
// on; the records are finished (no driver call left) at a later pass once their events are
// placed. Explicit resolve() and resolve(block=True) place inline, as before.
//
// Sharing: the program's side (GIL held) stages items, submits a batch, and consumes a finished
// batch; the placer only reads the batch's event handles and writes each item's ms/rc while the
// batch is in flight, and the program's side does not touch the batch then. Every slot in a batch
// (the event and the anchor it is measured against) holds an extra reference from staging to
// consumption, so no event of a batch is re-recorded in between.
namespace placer {

constexpr int kDeferred = -7777;  // slot_place(): the event was handed to the placer
constexpr size_t kMaxBatch = 256;

struct Item {
  int slot;
  int anchor;
  void* anchor_ev;
  void* ev;
  int64_t anchor_ns;
  uint64_t seq;
  float ms;
  int rc;
};

struct State {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  std::vector<Item> staged;  // program side only
  std::vector<Item> flight;  // the placer's while busy
  void* ctx = nullptr;       // the context of the staged / in-flight items
  void* flight_ctx = nullptr;
  bool busy = false;         // flight submitted, not finished
  bool done = false;         // flight finished, not consumed
  bool started = false;
  bool stop = false;
  bool failed = false;       // the thread could not start: place inline
  bool on = true;            // MAXINSTR_ASYNC_PLACE
  pthread_t th{};
  std::atomic<uint64_t> calls{0}, ns{0}, batches{0}, errors{0};
};
State P;

inline bool usable() {
  return P.on && !P.failed && !P.stop && g.gpu.backend == BK_CUDA && g.gpu.ctx_push && g.gpu.ctx_pop;
}

void* main_loop(void*) {
  pthread_mutex_lock(&P.mu);
  for (;;) {
    while (!P.busy && !P.stop) pthread_cond_wait(&P.cv, &P.mu);
    if (!P.busy) break;  // stopping, nothing in flight
    void* ctx = P.flight_ctx;
    pthread_mutex_unlock(&P.mu);
    int64_t t0 = now_ns();
    bool pushed = g.gpu.ctx_push(ctx) == 0;  // the events' context, current on this thread
    uint64_t bad = 0;
    for (Item& it : P.flight) {
      it.rc = pushed ? g.gpu.ev_elapsed(&it.ms, it.anchor_ev, it.ev) : -1;
      if (it.rc != 0 && it.rc != 600) bad++;
    }
    if (pushed) {
      void* old = nullptr;
      g.gpu.ctx_pop(&old);
    }
    P.calls.fetch_add(P.flight.size(), std::memory_order_relaxed);
    P.ns.fetch_add((uint64_t)(now_ns() - t0), std::memory_order_relaxed);
    P.errors.fetch_add(bad, std::memory_order_relaxed);
    P.batches.fetch_add(1, std::memory_order_relaxed);
    pthread_mutex_lock(&P.mu);
    P.busy = false;
    P.done = true;
    pthread_cond_broadcast(&P.cv);
  }
  pthread_mutex_unlock(&P.mu);
  return nullptr;
}

// Releases the references a batch's items hold; with `apply`, places the events measured.
void release_items(std::vector<Item>& items, bool apply) {
  for (Item& it : items) {
    Slot& sl = g.slots[(size_t)it.slot];
    if (apply && it.rc == 0 && sl.rec_seq == it.seq && sl.host_ns == kUnplaced)
      sl.host_ns = it.anchor_ns + (int64_t)llround((double)it.ms * 1e6);
    sl.placing = 0;  // not placed (not ready, an error): placed again later, inline or here
    slot_release(it.slot);
    slot_release(it.anchor);
  }
  items.clear();
}

// Takes a finished batch's results (program side). Non-blocking.
void consume() {
  if (!P.started) return;
  pthread_mutex_lock(&P.mu);
  bool done = P.done;
  pthread_mutex_unlock(&P.mu);
  if (!done) return;
  release_items(P.flight, true);
  pthread_mutex_lock(&P.mu);
  P.done = false;
  pthread_mutex_unlock(&P.mu);
}

// Waits for the batch in flight, then consumes it (resolve() before it places inline).
void wait_idle() {
  if (!P.started) return;
  pthread_mutex_lock(&P.mu);
  while (P.busy) pthread_cond_wait(&P.cv, &P.mu);
  pthread_mutex_unlock(&P.mu);
  consume();
}

// Hands slot s of context cx to the placer. true: staged (or already with it, or the batch is
// full: a later pass stages it); false: place it inline (a batch holds one context's events, and
// a program with several contexts is rare enough to pay for it).
bool stage(Ctx& cx, int s) {
  Slot& sl = g.slots[(size_t)s];
  if (sl.placing || P.staged.size() >= kMaxBatch) return true;
  if (cx.anchor < 0 || (!P.staged.empty() && P.ctx != cx.key)) return false;
  P.ctx = cx.key;
  Slot& an = g.slots[(size_t)cx.anchor];
  P.staged.push_back(Item{s, cx.anchor, an.ev, sl.ev, cx.anchor_ns, sl.rec_seq, 0.f, 0});
  sl.placing = 1;
  sl.ref++;
  an.ref++;
  return true;
}

// Submits what was staged when the placer is idle (else it waits for the next pass).
void submit() {
  if (P.staged.empty()) return;
  if (!P.started) {
    P.started = true;
    if (pthread_create(&P.th, nullptr, main_loop, nullptr) != 0) {
      P.failed = true;
      P.started = false;
      add_error("the event placer thread did not start: events are placed inline");
      release_items(P.staged, false);
      return;
    }
    pthread_detach(P.th);
  }
  pthread_mutex_lock(&P.mu);
  if (!P.busy && !P.done) {
    P.flight.swap(P.staged);
    P.flight_ctx = P.ctx;
    P.busy = true;
    pthread_cond_signal(&P.cv);
  }
  pthread_mutex_unlock(&P.mu);
}

// Py_AtExit: no driver call may be in flight while the interpreter (and then the driver) goes.
void shutdown() {
  if (!P.started) return;
  pthread_mutex_lock(&P.mu);
  P.stop = true;
  pthread_cond_broadcast(&P.cv);
  while (P.busy) pthread_cond_wait(&P.cv, &P.mu);
  pthread_mutex_unlock(&P.mu);
}

// fork(): the thread does not exist in the child; GPU timing is off there.
void atfork_child() {
  new (&P.mu) pthread_mutex_t(PTHREAD_MUTEX_INITIALIZER);
  new (&P.cv) pthread_cond_t(PTHREAD_COND_INITIALIZER);
  P.staged.clear();
  P.flight.clear();
  P.busy = P.done = P.started = false;
}

}  // namespace placer
