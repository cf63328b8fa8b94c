// CUPTI external correlation (session kernels=True): each stage pushes its record id on CUPTI's
// external-correlation stack at enter and pops it at exit (stage.cpp: cupti_enter/cupti_exit), so
// every CUDA API call made while it is the innermost stage of its thread carries its id.
#pragma once

#include "base.h"

namespace maxinstr MAXINSTR_HIDDEN {

// Protected by the GIL. push/pop are taken from the libcupti the Python side loaded
// (cupti-python), through dispatch.h, by cupti_link().
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
