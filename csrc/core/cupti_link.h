// CUPTI external correlation (kernels=True): each stage pushes its record id at enter and pops it
// at exit (stage.h), so every CUDA API call made while it is its thread's innermost carries it.
#pragma once

#include "base.h"

namespace maxinstr MAXINSTR_HIDDEN {

// Protected by the GIL; push/pop set by cupti_link() from dispatch.h's libcupti.
struct Correlation {
  int (*push)(int, uint64_t) = nullptr;   // cuptiActivityPushExternalCorrelationId
  int (*pop)(int, uint64_t*) = nullptr;   // cuptiActivityPopExternalCorrelationId
  int kind = 0;                           // CUpti_ExternalCorrelationKind
  bool on = false;
  uint64_t pushes = 0;
  uint64_t errors = 0;
};
extern Correlation correlation;

// cupti_link, cupti_stats (module.cpp adds them).
extern PyMethodDef cupti_link_methods[];

}  // namespace maxinstr
