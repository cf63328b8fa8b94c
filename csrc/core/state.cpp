// Process-wide state (state.h).
#include "state.h"

namespace maxinstr MAXINSTR_HIDDEN {

Process process;

void add_error(const std::string& msg) {
  for (auto& e : process.errors)
    if (e == msg) return;
  if (process.errors.size() >= 64) {
    process.errors_dropped++;
    return;
  }
  process.errors.push_back(msg);
}

}  // namespace maxinstr
