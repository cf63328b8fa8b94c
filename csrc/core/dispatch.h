// The vendor dispatch table: every function the core calls in the CUDA driver or HIP runtime,
// roctx and libcupti, taken with dlopen + dlsym by dispatch.cpp; the module links no vendor
// library (tests/core/test_build.py). The hot path calls straight through these pointers.
#pragma once

#include "base.h"

#include <string>
#include <type_traits>

namespace maxinstr MAXINSTR_HIDDEN {

enum Backend { BK_NONE = 0, BK_CUDA = 1, BK_HIP = 2 };

// (member, signature, CUDA name, its older name, HIP name) of the CUDA driver / HIP runtime
// functions, which share these shapes (status 0 success, 600 not ready). The events need the first
// five and ctx_current (CUDA) or get_device (HIP); the rest are optional.
#define GPU_FUNCTIONS(X)                                                                              \
  X(ev_create, int(void**, unsigned), "cuEventCreate", nullptr, "hipEventCreateWithFlags")                     \
  X(ev_record, int(void*, void*), "cuEventRecord", nullptr, "hipEventRecord")                                  \
  X(ev_query, int(void*), "cuEventQuery", nullptr, "hipEventQuery")                                            \
  X(ev_elapsed, int(float*, void*, void*), "cuEventElapsedTime", nullptr, "hipEventElapsedTime")               \
  X(ev_sync, int(void*), "cuEventSynchronize", nullptr, "hipEventSynchronize")                                 \
  X(ev_destroy, int(void*), "cuEventDestroy_v2", "cuEventDestroy", "hipEventDestroy")                          \
  X(ctx_current, int(void**), "cuCtxGetCurrent", nullptr, nullptr)                                             \
  X(get_device, int(int*), nullptr, nullptr, "hipGetDevice")                                                   \
  X(prof_start, int(), "cuProfilerStart", nullptr, "hipProfilerStart")                                         \
  X(prof_stop, int(), "cuProfilerStop", nullptr, "hipProfilerStop")                                            \
  X(is_capturing, int(void*, int*), "cuStreamIsCapturing", nullptr, "hipStreamIsCapturing")                    \
  X(exch_mode, int(int*), "cuThreadExchangeStreamCaptureMode", nullptr, "hipThreadExchangeStreamCaptureMode")  \
  X(mod_load, int(void**, const void*), "cuModuleLoadData", nullptr, nullptr)                                  \
  X(mod_unload, int(void*), "cuModuleUnload", nullptr, nullptr)                                                \
  X(mod_func, int(void**, void*, const char*), "cuModuleGetFunction", nullptr, nullptr)                        \
  X(launch, int(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,    \
                void**), "cuLaunchKernel", nullptr, nullptr)                                                   \
  X(stream_create, int(void**, unsigned), "cuStreamCreate", nullptr, nullptr)                                  \
  X(stream_destroy, int(void*), "cuStreamDestroy_v2", "cuStreamDestroy", nullptr)                              \
  X(ctx_device, int(int*), "cuCtxGetDevice", nullptr, nullptr)                                                 \
  X(dev_count, int(int*), "cuDeviceGetCount", nullptr, nullptr)                                                \
  X(dev_get, int(int*, int), "cuDeviceGet", nullptr, nullptr)                                                  \
  X(primary_state, int(int, unsigned*, int*), "cuDevicePrimaryCtxGetState", nullptr, nullptr)                  \
  X(primary_retain, int(void**, int), "cuDevicePrimaryCtxRetain", nullptr, nullptr)                            \
  X(primary_release, int(int), "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", nullptr)          \
  X(ctx_push, int(void*), "cuCtxPushCurrent_v2", "cuCtxPushCurrent", nullptr)                                  \
  X(ctx_pop, int(void**), "cuCtxPopCurrent_v2", "cuCtxPopCurrent", nullptr)

struct GpuApi {
  int backend = BK_NONE;
  void* lib = nullptr;
  std::string lib_name;
#define DECLARE_GPU_FUNCTION(member, signature, cuda, cuda_old, hip) std::add_pointer_t<signature> member = nullptr;
  GPU_FUNCTIONS(DECLARE_GPU_FUNCTION)
#undef DECLARE_GPU_FUNCTION
};

struct RoctxApi {  // set when a roctx library loaded (markers.cpp picks it)
  void* lib = nullptr;
  int (*push)(const char*) = nullptr;     // roctxRangePushA
  int (*pop)() = nullptr;                 // roctxRangePop
  void (*mark)(const char*) = nullptr;    // roctxMarkA (optional)
  int (*pause)(uint64_t) = nullptr;       // roctxProfilerPause (optional)
  int (*resume)(uint64_t) = nullptr;      // roctxProfilerResume (optional)
};

// The libcupti cupti-python loaded, taken with RTLD_NOLOAD; each user checks the functions it needs.
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

void gpu_try_load();  // the driver, loaded once (dispatch.cpp); no context is ever created

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
