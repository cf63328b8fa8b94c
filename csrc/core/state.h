// Process-wide state of the stage core. The GIL is the lock of all shared state (docs/stage-core.md,
// "Threads"); without it run the thread-exit hook (an atomic flag), the native writer (writer.h),
// the placer (placer.h) and the CUPTI callbacks.
#pragma once

#include "base.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

namespace maxinstr MAXINSTR_HIDDEN {

struct StageObject;

struct Boundary {  // the last event this thread recorded on one stream (for boundary sharing)
  uint64_t stream;
  int ctx;
  int slot;  // -1: empty
  int64_t t_ns;
};
constexpr int kBoundaries = 4;

struct ThreadState {
  int64_t tid = 0;
  std::vector<StageObject*> stack;  // strong references; open stages and "zombies" (see exit)
  std::atomic<bool> alive{true};
  Boundary bnd[kBoundaries];
  int bnd_next = 0;
  bool gpu_skip = false;  // the budget left this thread's current top-level stage (and its children) untimed
  ThreadState() {
    for (auto& b : bnd) b = Boundary{0, -1, -1, 0};
  }
};

struct Process {
  bool enabled = true;
  int64_t pid = 0;
  uint32_t seq = 0;
  uint32_t fork_gen = 0;

  std::vector<ThreadState*> threads;

  std::vector<std::string> errors;
  uint64_t errors_dropped = 0;

  // Attrs holding anything but str/int/float/bool/None are replaced at stage exit by this hook's
  // plain-data copy (maxinstr/_attrs.py), so a record holds no reference to the caller's objects.
  PyObject* attrs_hook = nullptr;
  uint64_t attrs_unconverted = 0;  // the hook failed: those attrs were not kept (counted)

  // The steady-state trigger (steady_watch, docs/stage-core.md): -1 off.
  int64_t steady_n = -1;
  std::vector<uint32_t> steady_counts;  // stages entered per name id since armed
  PyObject* steady_hook = nullptr;
  uint64_t depth_refused = 0;      // stages and marks not recorded: nested deeper than kMaxDepth
};
extern Process process;

// Defined here, not only declared: an `extern thread_local` is read through a TLS wrapper call.
inline thread_local ThreadState* tls_ts = nullptr;
// > 0 while this thread launches the core's own GPU work (the floor calibration): the launch
// tags (launch_tags.cpp) then name no stage, as the NVTX ranges do not hold that work either.
inline thread_local int tls_core_gpu_work = 0;
// Set while this thread measures what a stage costs (_probing): its stages keep no record, take
// no id, name no name and push no marker or CUPTI id.
inline thread_local int tls_probe = 0;
struct TlsGuard {  // runs at thread exit, without the GIL: only flips an atomic
  ThreadState* ts = nullptr;
  ~TlsGuard() {
    if (ts) ts->alive.store(false, std::memory_order_release);
  }
};
inline thread_local TlsGuard tls_guard;

// One line for stats()["errors"]; repeats are kept once, and at most 64 lines.
void add_error(const std::string& msg);

// A stage named name_id is entered (top: at the top level) while the steady-state trigger is
// armed: count it, and fire the trigger when this is the enter it waits for.
void steady_enter(int32_t name_id, bool top);

inline int64_t next_id() { return (process.pid << 32) | (int64_t)(++process.seq); }

inline ThreadState* get_ts() {
  ThreadState* ts = tls_ts;
  if (LIKELY(ts != nullptr)) return ts;
  ts = new ThreadState();
  ts->tid = (int64_t)syscall(SYS_gettid);
  process.threads.push_back(ts);
  tls_ts = ts;
  tls_guard.ts = ts;
  return ts;
}

}  // namespace maxinstr
