// profiler_start/stop: cuProfilerStart/Stop (with a primary context pushed where the calling thread
// has none), or roctxProfilerResume/Pause where the markers are roctx's. See profiler.cpp.
#pragma once

#include "base.h"

namespace maxinstr MAXINSTR_HIDDEN {

// profiler_start, profiler_stop (module.cpp adds them).
extern PyMethodDef profiler_methods[];

}  // namespace maxinstr
