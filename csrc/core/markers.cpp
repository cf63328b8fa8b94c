// Markers (markers.h): which kind this process uses.
#include "markers.h"

#include <string>

#include "dispatch.h"
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

Markers markers;

// MAXINSTR_MARKERS = nvtx | roctx | none | (unset: roctx when a roctx library loads, else nvtx).
void init_markers() {
  const char* want = env("MAXINSTR_MARKERS");
  std::string w = want ? want : "auto";
  if (w != "none" && w != "roctx" && w != "nvtx" && w != "auto") {
    env_warn("MAXINSTR_MARKERS", want, "one of nvtx/roctx/none", "roctx when a roctx library loads, else nvtx");
    w = "auto";
  }
  if (w == "none") {
    markers.kind = MK_NONE;
    return;
  }
  if (w == "roctx" || w == "auto") {
    const char* path = env("MAXINSTR_ROCTX_LIBRARY");
    if (path ? roctx_load(path)
             : roctx_load("librocprofiler-sdk-roctx.so") || roctx_load("librocprofiler-sdk-roctx.so.1") ||
                   roctx_load("libroctx64.so") || roctx_load("libroctx64.so.4")) {
      markers.kind = MK_ROCTX;
      return;
    }
    if (w == "roctx" || path) add_error("roctx requested but no roctx library could be loaded");
  }
  markers.kind = MK_NVTX;
  markers.domain = nvtxDomainCreateA("maxinstr");
}

}  // namespace maxinstr
