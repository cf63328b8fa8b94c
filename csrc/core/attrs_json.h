// attrs_lines(): the attrs.jsonl lines of stage attrs made in C++ (attrs_json.cpp).
#pragma once

#include "base.h"

namespace maxinstr MAXINSTR_HIDDEN {

// attrs_lines (module.cpp adds it).
extern PyMethodDef attrs_json_methods[];

}  // namespace maxinstr
