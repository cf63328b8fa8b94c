// The placer thread: cuEventElapsedTime off the program's threads (events.cpp hands it events).
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
#pragma once

#include "base.h"

#include <pthread.h>

#include <atomic>
#include <vector>

#include "dispatch.h"
#include "events.h"

namespace maxinstr MAXINSTR_HIDDEN {
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
extern State state;

inline bool usable() {
  return state.on && !state.failed && !state.stop && vendor.gpu.backend == BK_CUDA && vendor.gpu.ctx_push &&
         vendor.gpu.ctx_pop;
}

// Takes a finished batch's results (program side). Non-blocking.
void consume();
// Waits for the batch in flight, then consumes it (resolve() before it places inline).
void wait_idle();
// Hands slot s of context cx to the placer (see placer.cpp); false: place it inline.
bool stage(Ctx& cx, int s);
// Submits what was staged when the placer is idle (else it waits for the next pass).
void submit();
// Py_AtExit: no driver call may be in flight while the interpreter (and then the driver) goes.
void shutdown();
// fork(): the thread does not exist in the child; GPU timing is off there.
void atfork_child();

}  // namespace placer
}  // namespace maxinstr
