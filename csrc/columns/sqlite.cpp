// The SQLite API (sqlite.h), dlopened once.
#include "sqlite.h"

#include <dlfcn.h>

#include <mutex>
#include <type_traits>

namespace columns {

Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libsqlite3.so.0", "libsqlite3.so", "libsqlite3.dylib"}) {
      a.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (a.handle) break;
    }
    if (!a.handle) {
      a.error = "libsqlite3.so.0 not found";
      return;
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(a.handle, name));
      if (!fn) {
        ok = false;
        a.error = std::string("libsqlite3 lacks ") + name;
      }
    };
#define COLUMNS_BIND(name, ret, params) sym(a.name, "sqlite3_" #name);
    COLUMNS_SQLITE_FUNCTIONS(COLUMNS_BIND)
#undef COLUMNS_BIND
    if (!ok) {
      dlclose(a.handle);
      a.handle = nullptr;
    }
  });
  return a;
}

}  // namespace columns
