// The placer thread (placer.h).
#include "placer.h"

#include <cmath>
#include <new>

#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {
namespace placer {

State state;

namespace {

void* main_loop(void*) {
  pthread_mutex_lock(&state.mu);
  for (;;) {
    while (!state.busy && !state.stop) pthread_cond_wait(&state.cv, &state.mu);
    if (!state.busy) break;  // stopping, nothing in flight
    void* ctx = state.flight_ctx;
    pthread_mutex_unlock(&state.mu);
    int64_t t0 = now_ns();
    bool pushed = vendor.gpu.ctx_push(ctx) == 0;  // the events' context, current on this thread
    uint64_t bad = 0;
    for (Item& it : state.flight) {
      it.rc = pushed ? vendor.gpu.ev_elapsed(&it.ms, it.anchor_ev, it.ev) : -1;
      if (it.rc != 0 && it.rc != 600) bad++;
    }
    if (pushed) {
      void* old = nullptr;
      vendor.gpu.ctx_pop(&old);
    }
    state.calls.fetch_add(state.flight.size(), std::memory_order_relaxed);
    const int64_t spent = now_ns() - t0;
    state.ns.fetch_add((uint64_t)spent, std::memory_order_relaxed);
    budget_offthread_ns.fetch_add(spent, std::memory_order_relaxed);
    state.errors.fetch_add(bad, std::memory_order_relaxed);
    state.batches.fetch_add(1, std::memory_order_relaxed);
    pthread_mutex_lock(&state.mu);
    state.busy = false;
    state.done = true;
    pthread_cond_broadcast(&state.cv);
  }
  pthread_mutex_unlock(&state.mu);
  return nullptr;
}

// Releases the references a batch's items hold; with `apply`, places the events measured.
void release_items(std::vector<Item>& items, bool apply) {
  for (Item& it : items) {
    Slot& sl = events.slots[(size_t)it.slot];
    if (apply && it.rc == 0 && sl.rec_seq == it.seq && sl.host_ns == kUnplaced)
      sl.host_ns = it.anchor_ns + (int64_t)llround((double)it.ms * 1e6);
    sl.placing = 0;  // not placed (not ready, an error): placed again later, inline or here
    slot_release(it.slot);
    slot_release(it.anchor);
  }
  items.clear();
}

}  // namespace

void consume() {
  if (!state.started) return;
  pthread_mutex_lock(&state.mu);
  bool done = state.done;
  pthread_mutex_unlock(&state.mu);
  if (!done) return;
  release_items(state.flight, true);
  pthread_mutex_lock(&state.mu);
  state.done = false;
  pthread_mutex_unlock(&state.mu);
}

void wait_idle() {
  if (!state.started) return;
  pthread_mutex_lock(&state.mu);
  while (state.busy) pthread_cond_wait(&state.cv, &state.mu);
  pthread_mutex_unlock(&state.mu);
  consume();
}

// Hands slot s of context cx to the placer. true: staged (or already with it, or the batch is
// full: a later pass stages it); false: place it inline (a batch holds one context's events, and
// a program with several contexts is rare enough to pay for it).
bool stage(Ctx& cx, int s) {
  Slot& sl = events.slots[(size_t)s];
  if (sl.placing || state.staged.size() >= kMaxBatch) return true;
  if (cx.anchor < 0 || (!state.staged.empty() && state.ctx != cx.key)) return false;
  state.ctx = cx.key;
  Slot& an = events.slots[(size_t)cx.anchor];
  state.staged.push_back(Item{s, cx.anchor, an.ev, sl.ev, cx.anchor_ns, sl.rec_seq, 0.f, 0});
  sl.placing = 1;
  sl.ref++;
  an.ref++;
  return true;
}

void submit() {
  if (state.staged.empty()) return;
  if (!state.started) {
    state.started = true;
    if (pthread_create(&state.th, nullptr, main_loop, nullptr) != 0) {
      state.failed = true;
      state.started = false;
      add_error("the event placer thread did not start: events are placed inline");
      release_items(state.staged, false);
      return;
    }
    pthread_detach(state.th);
  }
  pthread_mutex_lock(&state.mu);
  if (!state.busy && !state.done) {
    state.flight.swap(state.staged);
    state.flight_ctx = state.ctx;
    state.busy = true;
    pthread_cond_signal(&state.cv);
  }
  pthread_mutex_unlock(&state.mu);
}

void shutdown() {
  if (!state.started) return;
  pthread_mutex_lock(&state.mu);
  state.stop = true;
  pthread_cond_broadcast(&state.cv);
  while (state.busy) pthread_cond_wait(&state.cv, &state.mu);
  pthread_mutex_unlock(&state.mu);
}

void atfork_child() {
  new (&state.mu) pthread_mutex_t(PTHREAD_MUTEX_INITIALIZER);
  new (&state.cv) pthread_cond_t(PTHREAD_COND_INITIALIZER);
  state.staged.clear();
  state.flight.clear();
  state.busy = state.done = state.started = false;
}

}  // namespace placer
}  // namespace maxinstr
