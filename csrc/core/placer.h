// The placer thread: cuEventElapsedTime (~3 us under launch load) off the program's threads
// (docs/stage-core.md, "The placer thread"). events.cpp stages and submits a batch, the placer
// fills in each item's ms and rc, events.cpp consumes it; only the placer touches it in flight.
#pragma once

#include "base.h"

#include <pthread.h>

#include <atomic>
#include <vector>

#include "dispatch.h"

namespace maxinstr MAXINSTR_HIDDEN {

// The placer's host ns in elapsed-time calls count against the budget too: they take the driver locks
// the program's launches need (H100, decoder_ab: ~1 point of a step while its threads counted 0.25 %).
inline std::atomic<int64_t> budget_offthread_ns{0};

namespace placer {

constexpr size_t kMaxBatch = 256;

struct Item {
  int slot;
  int anchor;
  void* anchor_ev;
  void* ev;
  int64_t anchor_ns;
  uint64_t seq;
  float ms;  // the placer's results
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
inline State state;

inline bool usable() {
  return state.on && !state.failed && !state.stop && vendor.gpu.backend == BK_CUDA && vendor.gpu.ctx_push &&
         vendor.gpu.ctx_pop;
}

// Program side, non-blocking: whether state.flight holds a finished batch, to be taken and then
// handed back with consumed().
bool finished();
void consumed();
// Waits until no batch is in flight.
void wait_busy();
// Hands what was staged to the placer when it is idle (else it waits for the next pass). False:
// the thread could not start (one error line); the staged items are the caller's to release.
bool submit();
// Py_AtExit: no driver call may be in flight while the interpreter (and then the driver) goes.
void shutdown();
// fork(): the thread does not exist in the child; GPU timing is off there.
void atfork_child();

}  // namespace placer
}  // namespace maxinstr
