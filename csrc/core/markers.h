// Markers: NVTX3 (header-only, domain "maxinstr", registered strings, int64 payload = record id)
// or roctx (dlopened through dispatch.h; no payload). The push/pop/mark calls are on the hot path:
// inline here.
#pragma once

#include "base.h"

#include <cstring>

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

// A range or mark of registered name `name_id` with the record id as its int64 payload.
inline nvtxEventAttributes_t nvtx_attributes(int32_t name_id, int64_t id) {
  nvtxEventAttributes_t a;
  memset(&a, 0, sizeof(a));
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = name_table.entries[name_id].nvtx;
  a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
  a.payload.llValue = id;
  return a;
}

inline void marker_push(int32_t name_id, int64_t id) {
  if (markers.kind == MK_NVTX) {
    nvtxEventAttributes_t a = nvtx_attributes(name_id, id);
    nvtxDomainRangePushEx(markers.domain, &a);
  } else if (markers.kind == MK_ROCTX) {
    vendor.roctx.push(name_table.entries[name_id].utf8.c_str());
  }
}

inline void marker_pop() {
  if (markers.kind == MK_NVTX)
    nvtxDomainRangePop(markers.domain);
  else if (markers.kind == MK_ROCTX)
    vendor.roctx.pop();
}

inline void marker_mark(int32_t name_id, int64_t id) {
  if (markers.kind == MK_NVTX) {
    nvtxEventAttributes_t a = nvtx_attributes(name_id, id);
    nvtxDomainMarkEx(markers.domain, &a);
  } else if (markers.kind == MK_ROCTX && vendor.roctx.mark) {
    vendor.roctx.mark(name_table.entries[name_id].utf8.c_str());
  }
}

}  // namespace maxinstr
