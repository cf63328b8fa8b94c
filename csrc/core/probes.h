// Benchmark-only probes: _driver_costs() and _event_diag() time the driver calls a GPU-timed
// stage makes, in C (benchmarks/stage_overhead.py, benchmarks/event_diag.py; tests/core runs them
// against the stand-in driver). Nothing else in the core calls them. Built when the CMake option
// MAXINSTR_BENCH_PROBES is ON (OFF by default; see CMakeLists.txt); module.cpp adds them then.
#pragma once

#include "base.h"

namespace maxinstr MAXINSTR_HIDDEN {

// _event_diag, _driver_costs.
extern PyMethodDef probe_methods[];

}  // namespace maxinstr
