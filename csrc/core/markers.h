// Markers: NVTX3 (header-only, domain "maxinstr", registered strings) or roctx (dispatch.h); the
// calls are on the hot path: inline here.
#pragma once

#include "base.h"

#include <nvtx3/nvToolsExt.h>

#include "dispatch.h"
#include "records.h"

namespace maxinstr MAXINSTR_HIDDEN {

enum MarkerKind { MK_NONE = 0, MK_NVTX = 1, MK_ROCTX = 2 };

struct Markers {
  int kind = MK_NONE;
  nvtxDomainHandle_t domain = nullptr;
};
extern Markers markers;

// Module init: picks the kind (MAXINSTR_MARKERS, see markers.cpp) and creates the NVTX domain.
void init_markers();

// The NVTX handle of a new name (interning registers each name once), nullptr without NVTX.
inline nvtxStringHandle_t marker_register(const std::string& utf8) {
  return (markers.kind == MK_NVTX) ? nvtxDomainRegisterStringA(markers.domain, utf8.c_str()) : nullptr;
}

// A range pushed, or (mark) an instant, of registered name `name_id`; NVTX's carry the record id
// as their int64 payload.
inline void marker_at(int32_t name_id, int64_t id, bool mark) {
  if (markers.kind == MK_NVTX) {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = name_table.entries[name_id].nvtx;
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = id;
    if (mark) nvtxDomainMarkEx(markers.domain, &a);
    else nvtxDomainRangePushEx(markers.domain, &a);
  } else if (markers.kind == MK_ROCTX) {
    const char* name = name_table.entries[name_id].utf8.c_str();
    if (!mark) vendor.roctx.push(name);
    else if (vendor.roctx.mark) vendor.roctx.mark(name);
  }
}

inline void marker_pop() {
  if (markers.kind == MK_NVTX)
    nvtxDomainRangePop(markers.domain);
  else if (markers.kind == MK_ROCTX)
    vendor.roctx.pop();
}

}  // namespace maxinstr
