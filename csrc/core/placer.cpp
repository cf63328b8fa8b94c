// The placer thread (placer.h).
#include "placer.h"

#include <new>

#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {
namespace placer {

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

}  // namespace

bool finished() {
  if (!state.started) return false;
  pthread_mutex_lock(&state.mu);
  bool done = state.done;
  pthread_mutex_unlock(&state.mu);
  return done;
}

void consumed() {
  pthread_mutex_lock(&state.mu);
  state.done = false;
  pthread_mutex_unlock(&state.mu);
}

void wait_busy() {
  if (!state.started) return;
  pthread_mutex_lock(&state.mu);
  while (state.busy) pthread_cond_wait(&state.cv, &state.mu);
  pthread_mutex_unlock(&state.mu);
}

bool submit() {
  if (state.staged.empty()) return true;
  if (!state.started) {
    state.started = true;
    if (pthread_create(&state.th, nullptr, main_loop, nullptr) != 0) {
      state.failed = true;
      state.started = false;
      add_error("the event placer thread did not start: events are placed inline");
      return false;
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
  return true;
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
