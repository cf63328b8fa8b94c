// CUPTI activity buffers, handled natively (session kernels=True): CUPTI fills buffers the core
// hands out and hands them back on its own thread; the session's flusher takes them with
// cupti_take(). See cupti_buffers.cpp.
#pragma once

#include "base.h"

namespace maxinstr MAXINSTR_HIDDEN {

// The child's side of fork() (module.cpp's handler calls it).
void cupti_buffers_atfork_child();

// cupti_buffers, cupti_flush, cupti_take, cupti_buffer_stats (module.cpp adds them).
extern PyMethodDef cupti_buffers_methods[];

}  // namespace maxinstr
