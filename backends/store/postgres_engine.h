// The PostgreSQL engine (see engine.h and docs/postgresql.md): one store in
// one PostgreSQL database, shared by every host that can reach the server.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/store/engine.h"

namespace agentvfs::store {

// Opens the store in the database named by the libpq connection URI `uri`
// (postgresql://USER@HOST:PORT/DB?...; a password comes from PGPASSWORD or
// ~/.pgpass, never the URI on a command line). The database must exist;
// `create` makes the store's tables in it when they are missing, otherwise
// a database without them is ENOENT.
vfs::Result<std::unique_ptr<Engine>> OpenPostgresEngine(const std::string& uri,
                                                        bool create);

// `uri` without its password, for messages and logs.
std::string RedactPostgresUri(const std::string& uri);

// SecretPathsOf (engine.h) for a PostgreSQL store.
std::vector<std::string> PostgresSecretPaths(const std::string& uri);

}  // namespace agentvfs::store
