// The GPU-time floor (floor.h).
#include "floor.h"

#include <cmath>

#include "dispatch.h"
#include "events.h"
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

namespace {

// The floor (docs/stage-core.md, "The floor": about 2.9 us on an H200) is measured on a private
// non-blocking stream, where a busy kernel keeps [event, empty kernel, event] queued back to back.
// CUDA only (PTX the driver JIT-compiles): the first header JITs on any GPU since Maxwell; should a
// driver refuse that target, the second (PTX ISA 8.0, sm_90) is tried.
const char* const kSpinPtxHeads[] = {".version 6.0\n.target sm_50\n", ".version 8.0\n.target sm_90\n"};
const char kSpinPtx[] =
    ".address_size 64\n"
    ".visible .entry maxinstr_spin(.param .u64 maxinstr_spin_ns)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [maxinstr_spin_ns];\n"
    "  mov.u64 %rd2, %globaltimer;\n"
    "$L_spin:\n"
    "  mov.u64 %rd3, %globaltimer;\n"
    "  sub.s64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p1, %rd4, %rd1;\n"
    "  @%p1 bra $L_spin;\n"
    "  ret;\n"
    "}\n";

}  // namespace

int spin_kernel_load(void** mod, void** fn) {
  int rc = -1;
  for (const char* head : kSpinPtxHeads) {
    std::string ptx = std::string(head) + kSpinPtx;
    rc = vendor.gpu.mod_load(mod, ptx.c_str());
    if (rc == 0) break;
    *mod = nullptr;
  }
  if (rc == 0) rc = vendor.gpu.mod_func(fn, *mod, "maxinstr_spin");
  return rc;
}

namespace {

constexpr int kFloorRuns = 7;
constexpr int64_t kFloorMaxNs = 50000;  // a floor above this is not the front end: not used

// The floor in ns, or -1 (one line in errors()). Its own 14 events (not the pool's) and stream;
// the minimum of 7 pairs: other work can only make a pair longer, never shorter.
int64_t ctx_measure_floor() {
  GpuApi& a = vendor.gpu;
  if (a.backend != BK_CUDA || !a.mod_load || !a.mod_func || !a.launch || !a.stream_create) return -1;
  RelaxedCapture relaxed;
  void* mod = nullptr;
  void* fn = nullptr;
  void* st = nullptr;
  void* ev[2 * kFloorRuns];
  int nev = 0;
  int64_t result = -1;
  std::string why;
  int rc = spin_kernel_load(&mod, &fn);
  if (rc == 0) rc = a.stream_create(&st, 1 /* CU_STREAM_NON_BLOCKING */);
  if (rc != 0) why = "kernel setup";
  for (int i = 0; rc == 0 && i < 2 * kFloorRuns; i++) {
    rc = a.ev_create(&ev[i], 0);
    if (rc != 0)
      why = "event create";
    else
      nev++;
  }
  int launched = 0;
  for (int i = 0; rc == 0 && i < kFloorRuns; i++) {
    unsigned long long busy = 40000, none = 0;  // ns: 40 us covers the host cost of the next 3 calls
    void* pb[] = {&busy};
    void* pn[] = {&none};
    rc = a.launch(fn, 1, 1, 1, 1, 1, 1, 0, st, pb, nullptr);
    if (rc == 0) rc = a.ev_record(ev[2 * i], st);
    if (rc == 0) rc = a.launch(fn, 1, 1, 1, 1, 1, 1, 0, st, pn, nullptr);
    if (rc == 0) rc = a.ev_record(ev[2 * i + 1], st);
    if (rc != 0)
      why = "launch/record";
    else
      launched++;
  }
  if (launched > 0) {  // wait for what was queued (also before destroying anything on failure)
    int r = a.ev_sync(ev[2 * launched - 1]);
    if (rc == 0 && r != 0) {
      rc = r;
      why = "synchronize";
    }
  }
  if (rc == 0) {
    int64_t best = INT64_MAX;
    for (int i = 0; i < kFloorRuns; i++) {
      float ms = 0.f;
      int r = a.ev_elapsed(&ms, ev[2 * i], ev[2 * i + 1]);
      if (r != 0) {
        rc = r;
        why = "elapsed time";
        break;
      }
      int64_t v = (int64_t)llround((double)ms * 1e6);
      if (v < best) best = v;
    }
    if (rc == 0) {
      if (best > kFloorMaxNs) {
        why = "implausible floor " + std::to_string(best) + " ns";
      } else {
        result = best < 0 ? 0 : best;
      }
    }
  }
  if (result < 0)
    add_error("GPU floor calibration failed (" + why + ", status " + std::to_string(rc) +
              "): GPU times are raw event pairs for this context");
  if (a.ev_destroy)
    for (int i = 0; i < nev; i++) a.ev_destroy(ev[i]);
  if (st && a.stream_destroy) a.stream_destroy(st);
  if (mod && a.mod_unload) a.mod_unload(mod);
  return result;
}

}  // namespace

void ctx_calibrate(int c) {
  Ctx& cx = events.ctxs[(size_t)c];
  if (vendor.gpu.backend == BK_CUDA && vendor.gpu.ctx_device) {
    int d = -1;
    if (vendor.gpu.ctx_device(&d) == 0) events.ctxs[(size_t)c].device = d;
  }
  if (cx.floor_state != 0) return;
  if (events.floor_fixed >= 0) {
    cx.floor_ns = events.floor_fixed;
    cx.floor_state = 2;
    return;
  }
  if (vendor.gpu.backend != BK_CUDA) return;  // HIP: not calibrated (state "none"), raw event pairs
  tls_core_gpu_work++;
  int64_t f = ctx_measure_floor();
  tls_core_gpu_work--;
  Ctx& cy = events.ctxs[(size_t)c];
  cy.floor_ns = f < 0 ? 0 : f;
  cy.floor_state = f < 0 ? -1 : 1;
}

}  // namespace maxinstr
