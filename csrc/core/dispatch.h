// The vendor dispatch table: every function the core calls in a vendor library (the CUDA driver or
// the HIP runtime, roctx, libcupti), taken with dlopen + dlsym at run time by dispatch.cpp, the
// only unit that calls them; the module links no vendor library (tests/core/test_build.py). The
// hot path calls straight through these pointers: no lazy lookup per call.
#pragma once

#include "base.h"

#include <string>

namespace maxinstr MAXINSTR_HIDDEN {

enum Backend { BK_NONE = 0, BK_CUDA = 1, BK_HIP = 2 };

struct GpuApi {
  int backend = BK_NONE;
  void* lib = nullptr;
  std::string lib_name;
  // CUDA driver and HIP runtime share these shapes: status int (0 = success, 600 = not ready),
  // opaque handles.
  int (*ev_create)(void**, unsigned) = nullptr;
  int (*ev_record)(void*, void*) = nullptr;
  int (*ev_query)(void*) = nullptr;
  int (*ev_elapsed)(float*, void*, void*) = nullptr;
  int (*ev_sync)(void*) = nullptr;
  int (*ev_destroy)(void*) = nullptr;
  int (*ctx_current)(void**) = nullptr;  // CUDA: cuCtxGetCurrent
  int (*get_device)(int*) = nullptr;     // HIP: hipGetDevice
  int (*prof_start)() = nullptr;
  int (*prof_stop)() = nullptr;
  // Optional (stream capture, CUDA 10+/HIP 5+): see RelaxedCapture and gpu_point.
  int (*is_capturing)(void*, int*) = nullptr;
  int (*exch_mode)(int*) = nullptr;
  // Optional (CUDA only), for the floor calibration (ctx_calibrate): a tiny PTX kernel on a
  // private non-blocking stream.
  int (*mod_load)(void**, const void*) = nullptr;         // cuModuleLoadData
  int (*mod_unload)(void*) = nullptr;                     // cuModuleUnload
  int (*mod_func)(void**, void*, const char*) = nullptr;  // cuModuleGetFunction
  int (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                void**) = nullptr;                        // cuLaunchKernel
  int (*stream_create)(void**, unsigned) = nullptr;       // cuStreamCreate
  int (*stream_destroy)(void*) = nullptr;                 // cuStreamDestroy_v2
  // Optional (CUDA only), for profiler_start/stop on a thread with no current context.
  int (*ctx_device)(int*) = nullptr;                      // cuCtxGetDevice
  int (*dev_count)(int*) = nullptr;                       // cuDeviceGetCount
  int (*dev_get)(int*, int) = nullptr;                    // cuDeviceGet
  int (*primary_state)(int, unsigned*, int*) = nullptr;   // cuDevicePrimaryCtxGetState
  int (*primary_retain)(void**, int) = nullptr;           // cuDevicePrimaryCtxRetain
  int (*primary_release)(int) = nullptr;                  // cuDevicePrimaryCtxRelease_v2
  int (*ctx_push)(void*) = nullptr;                       // cuCtxPushCurrent_v2
  int (*ctx_pop)(void**) = nullptr;                       // cuCtxPopCurrent_v2
};

struct RoctxApi {  // set when a roctx library loaded (markers.cpp picks it)
  void* lib = nullptr;
  int (*push)(const char*) = nullptr;     // roctxRangePushA
  int (*pop)() = nullptr;                 // roctxRangePop
  void (*mark)(const char*) = nullptr;    // roctxMarkA (optional)
  int (*pause)(uint64_t) = nullptr;       // roctxProfilerPause (optional)
  int (*resume)(uint64_t) = nullptr;      // roctxProfilerResume (optional)
};

// The libcupti the Python side loaded (cupti-python), taken with RTLD_NOLOAD. Functions it lacks
// stay null: each user checks those it needs.
struct CuptiApi {
  void* lib = nullptr;
  std::string path;
  // external correlation (cupti_link.cpp)
  int (*push_external_id)(int, uint64_t) = nullptr;   // cuptiActivityPushExternalCorrelationId
  int (*pop_external_id)(int, uint64_t*) = nullptr;   // cuptiActivityPopExternalCorrelationId
  // activity buffers (cupti_buffers.cpp)
  int (*register_callbacks)(void (*)(uint8_t**, size_t*, size_t*),
                            void (*)(void*, uint32_t, uint8_t*, size_t, size_t)) = nullptr;
  int (*next_record)(uint8_t*, size_t, void**) = nullptr;  // cuptiActivityGetNextRecord
  int (*flush_all)(uint32_t) = nullptr;                    // cuptiActivityFlushAll
  // callback API (launch_tags.cpp)
  int (*subscribe)(void**, void (*)(void*, int, uint32_t, const void*), void*) = nullptr;
  int (*enable_callback)(uint32_t, void*, int, uint32_t) = nullptr;
  int (*unsubscribe)(void*) = nullptr;
};

struct Dispatch {
  GpuApi gpu;
  bool gpu_tried = false;
  uint32_t gpu_retry = 0;  // HIP: retries of "is the HIP runtime loaded yet"
  RoctxApi roctx;
  CuptiApi cupti;
};
extern Dispatch vendor;

// Loads the driver once (see dispatch.cpp); no context is ever created.
void gpu_try_load();

// The current context's key: the CUcontext, or (device + 1) for HIP; nullptr for none.
inline void* gpu_current_key() {
  if (vendor.gpu.backend == BK_CUDA) {
    void* c = nullptr;
    if (vendor.gpu.ctx_current(&c) != 0) return nullptr;
    return c;
  }
  if (vendor.gpu.backend == BK_HIP) {
    int d = -1;
    if (vendor.gpu.get_device(&d) != 0 || d < 0) return nullptr;
    return (void*)(intptr_t)(d + 1);
  }
  return nullptr;
}

// roctx from `path` into vendor.roctx; false (an error line if it lacks the range functions) when not.
bool roctx_load(const char* path);

// The libcupti already loaded at `path` into vendor.cupti (once per path); false when none is.
bool cupti_load(const char* path);

}  // namespace maxinstr
