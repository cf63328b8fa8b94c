// attrs_lines(): the attrs.jsonl lines of stage attrs made in C++ (attrs_json.cpp).
#pragma once

#include "base.h"

#include <string>

namespace maxinstr MAXINSTR_HIDDEN {

// Appends the n UTF-8 bytes at s as the inside of a JSON string, as json.dumps(ensure_ascii=False)
// writes it: `"`, `\`, and the C0 controls escaped (\b \f \n \r \t, others \u00xx in lowercase
// hex), everything else as is. Shared by attrs.jsonl (attrs_json.cpp) and strings.jsonl (writer.cpp).
void json_escape_into(std::string& out, const char* s, size_t n);

// attrs_lines (module.cpp adds it).
extern PyMethodDef attrs_json_methods[];

}  // namespace maxinstr
