// attrs_lines(): the attrs.jsonl lines of stage attrs made in C++ (attrs_json.cpp).
#pragma once

#include "base.h"

#include <string>

namespace maxinstr MAXINSTR_HIDDEN {

// The n UTF-8 bytes at s appended as the inside of a JSON string as json.dumps(ensure_ascii=False)
// writes it; attrs.jsonl's and strings.jsonl's (writer.cpp).
void json_escape_into(std::string& out, const char* s, size_t n);

// attrs_lines (module.cpp adds it).
extern PyMethodDef attrs_json_methods[];

}  // namespace maxinstr
