// The SQLite engine (see engine.h): a store in one database file.
#pragma once

#include <memory>
#include <string>

#include "backends/store/engine.h"

namespace agentvfs::store {

// Opens the SQLite store at `path` (creating it, mode 0600, when `create`).
vfs::Result<std::unique_ptr<Engine>> OpenSqliteEngine(const std::string& path,
                                                      bool create);

}  // namespace agentvfs::store
