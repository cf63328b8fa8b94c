// The GPU-time floor: what an event pair around a kernel reads beyond the kernel itself, measured
// once per CUDA context with a tiny PTX kernel and taken out of its GPU times (events.cpp).
#pragma once

#include "base.h"

namespace maxinstr MAXINSTR_HIDDEN {

// Context c (current on this thread), right after its reference pairing: its device ordinal and
// its floor (measured, fixed by MAXINSTR_GPU_FLOOR_NS, or none for HIP).
void ctx_calibrate(int c);

// The spin kernel `maxinstr_spin(u64 ns)` loaded into a new module of the current context: 0, or
// the driver's status (*mod null or loaded: the caller unloads it). benchmarks/native/probes.cpp too.
int spin_kernel_load(void** mod, void** fn);

}  // namespace maxinstr
