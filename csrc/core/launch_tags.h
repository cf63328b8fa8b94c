// Launch tags through CUPTI's callback API: what kernels=True uses to give each kernel, copy and
// set its stage. On an H200 the API activity records that could carry a stage id to each op
// (RUNTIME/DRIVER + EXTERNAL_CORRELATION) cost a launch-bound step ~13-19 %
// (benchmarks/cupti_configs.py). Here a native callback on the launch/copy/set functions only
// reads, on the calling thread itself, the correlation id CUPTI gives the call and the innermost
// open stage of that thread; kernel records carry the same correlation id.
//
// One tag per outermost call: the driver call a runtime launch makes inside itself is folded
// into the runtime call's tag (inner_correlation_id), so a runtime launch costs one tag, not two.
// The tag is built in thread-local storage at entry and appended, under the one lock, at exit.
#pragma once

#include "base.h"

namespace maxinstr MAXINSTR_HIDDEN {

// cupti_tags, cupti_tags_take, cupti_tags_stats (module.cpp adds them).
extern PyMethodDef launch_tags_methods[];

}  // namespace maxinstr
