// The vendor dispatch table (dispatch.h): the core's only dlopen and dlsym calls.
#include "dispatch.h"

#include <dlfcn.h>

#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

Dispatch vendor;

namespace {

// only_if_loaded: RTLD_NOLOAD, a library the process has already loaded, never a new one.
void* open_library(const char* path, bool only_if_loaded) {
  return dlopen(path, RTLD_NOW | RTLD_LOCAL | (only_if_loaded ? RTLD_NOLOAD : 0));
}

// out = the function `name` of h, else `fallback` (an older name of it); nullptr when neither.
template <typename F>
void bind(void* h, F& out, const char* name, const char* fallback = nullptr) {
  void* p = name ? dlsym(h, name) : nullptr;
  if (!p && fallback) p = dlsym(h, fallback);
  out = reinterpret_cast<F>(p);
}

// Keeps the GPU library at `path` as vendor.gpu when it has every function the events need; else
// an error line and false.
template <typename BindAll>
bool load_gpu(const char* path, bool only_if_loaded, int backend, const char* lacks, BindAll bind_all) {
  void* h = open_library(path, only_if_loaded);
  if (!h) return false;
  GpuApi a;
  a.lib = h;
  a.lib_name = path;
  bind_all(h, a);
  const bool has_current = backend == BK_CUDA ? a.ctx_current != nullptr : a.get_device != nullptr;
  if (!a.ev_create || !a.ev_record || !a.ev_query || !a.ev_elapsed || !a.ev_sync || !has_current) {
    add_error(std::string(backend == BK_CUDA ? "cuda: " : "hip: ") + path + lacks);
    dlclose(h);
    return false;
  }
  a.backend = backend;
  vendor.gpu = a;
  return true;
}

bool load_cuda(const char* path) {
  const char* lacks = " lacks a needed cuEvent*/cuCtxGetCurrent function";
  return load_gpu(path, false, BK_CUDA, lacks, [](void* h, GpuApi& a) {
#define BIND_CUDA(member, signature, cuda, cuda_old, hip) bind(h, a.member, cuda, cuda_old);
    GPU_FUNCTIONS(BIND_CUDA)
#undef BIND_CUDA
  });
}

bool load_hip(const char* path, bool only_if_loaded) {
  const char* lacks = " lacks a needed hipEvent*/hipGetDevice function";
  return load_gpu(path, only_if_loaded, BK_HIP, lacks, [](void* h, GpuApi& a) {
#define BIND_HIP(member, signature, cuda, cuda_old, hip) bind(h, a.member, hip);
    GPU_FUNCTIONS(BIND_HIP)
#undef BIND_HIP
  });
}

// A HIP runtime the process has already loaded, under any of its usual names.
bool load_loaded_hip() {
  return load_hip("libamdhip64.so", true) || load_hip("libamdhip64.so.7", true) || load_hip("libamdhip64.so.6", true);
}

}  // namespace

// CUDA: libcuda.so.1 (MAXINSTR_CUDA_LIBRARY overrides). HIP: only a runtime the process has already
// loaded (never one the program does not use), or MAXINSTR_HIP_LIBRARY. No context is created.
void gpu_try_load() {
  if (vendor.gpu.backend != BK_NONE) return;
  if (vendor.gpu_tried) {
    // HIP may be loaded by the framework after our first stage: look again now and then.
    if ((++vendor.gpu_retry & 4095) != 0) return;
    if (!env("MAXINSTR_CUDA_LIBRARY")) load_loaded_hip();
    return;
  }
  vendor.gpu_tried = true;
  if (const char* p = env("MAXINSTR_CUDA_LIBRARY")) {
    if (!load_cuda(p)) add_error(std::string("MAXINSTR_CUDA_LIBRARY=") + p + " could not be loaded");
    return;
  }
  if (const char* p = env("MAXINSTR_HIP_LIBRARY")) {
    if (!load_hip(p, false)) add_error(std::string("MAXINSTR_HIP_LIBRARY=") + p + " could not be loaded");
    return;
  }
  if (load_cuda("libcuda.so.1")) return;
  load_loaded_hip();
}

bool roctx_load(const char* path) {
  void* h = open_library(path, false);
  if (!h) return false;
  RoctxApi r;
  r.lib = h;
  bind(h, r.push, "roctxRangePushA");
  bind(h, r.pop, "roctxRangePop");
  if (!r.push || !r.pop) {
    add_error(std::string("roctx: ") + path + " lacks roctxRangePushA/roctxRangePop");
    dlclose(h);
    return false;
  }
  bind(h, r.mark, "roctxMarkA");
  bind(h, r.pause, "roctxProfilerPause");
  bind(h, r.resume, "roctxProfilerResume");
  vendor.roctx = r;
  return true;
}

// Every function any user of libcupti needs, taken at once; the handle is kept for the process's life.
bool cupti_load(const char* path) {
  if (vendor.cupti.lib && vendor.cupti.path == path) return true;
  void* h = open_library(path, true);
  if (!h) return false;
  CuptiApi c;
  c.lib = h;
  c.path = path;
  bind(h, c.push_external_id, "cuptiActivityPushExternalCorrelationId");
  bind(h, c.pop_external_id, "cuptiActivityPopExternalCorrelationId");
  bind(h, c.register_callbacks, "cuptiActivityRegisterCallbacks");
  bind(h, c.next_record, "cuptiActivityGetNextRecord");
  bind(h, c.flush_all, "cuptiActivityFlushAll");
  bind(h, c.subscribe, "cuptiSubscribe");
  bind(h, c.enable_callback, "cuptiEnableCallback");
  bind(h, c.unsubscribe, "cuptiUnsubscribe");
  vendor.cupti = c;
  return true;
}

}  // namespace maxinstr
