// The PostgreSQL server the tests use: started by CTest's `postgresql`
// fixture (scripts/pg-test-server, a private server on a Unix socket in a
// temporary directory) and named by AGENTVFS_TEST_PG, a URI of its
// maintenance database. Each store made for a test gets a database of its
// own, dropped when the test ends.
#pragma once

#include <memory>
#include <string>

#include "vfs/error.h"

namespace agentvfs::testing {

// AGENTVFS_TEST_PG, or an error that says how to get a server.
vfs::Result<std::string> TestPostgresUri();

// Creates a fresh, empty database (encoding SQL_ASCII, collation C, like a
// filesystem: names are bytes) and returns its URI.
vfs::Result<std::string> CreateTestDatabase();

// Drops the database named by `uri` (from CreateTestDatabase), closing any
// connection still open to it.
void DropTestDatabase(const std::string& uri);

// Runs one SQL statement on the database named by `uri` (psql-like helper
// for tests); returns the first column of the first row, or "".
vfs::Result<std::string> PgQuery(const std::string& uri,
                                 const std::string& sql);

// A PostgreSQL server of a test's own (scripts/pg-test-server), for tests
// that restart or stop it; stopped and removed by the destructor.
class PrivatePgServer {
 public:
  static vfs::Result<std::unique_ptr<PrivatePgServer>> Start();
  ~PrivatePgServer();
  // The maintenance database's URI.
  const std::string& uri() const { return uri_; }
  // A new empty database on this server (as CreateTestDatabase).
  vfs::Result<std::string> CreateDatabase(const std::string& name);
  // `pg_ctl restart -m MODE`: "fast" (a clean shutdown) or "immediate"
  // (like a crash: no checkpoint, recovery from the WAL at start).
  vfs::Status Restart(const std::string& mode);
  // Stops the server, keeping its data (`pg_ctl stop -m fast`), and starts
  // it again.
  vfs::Status Down();
  vfs::Status Up();

 private:
  PrivatePgServer() = default;
  std::string parent_;
  std::string dir_;
  std::string uri_;
};

}  // namespace agentvfs::testing
