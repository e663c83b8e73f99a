// Databases on the tests' PostgreSQL server (see pg_server.h).
#include "tests/support/pg_server.h"

#include <libpq-fe.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <vector>

#include "tests/support/mount_fixture.h"

namespace agentvfs::testing {
namespace {

// The maintenance URI with its database name replaced by `db`. The test
// server's URIs have the form postgresql:///DB?PARAMS.
std::string WithDatabase(const std::string& uri, const std::string& db) {
  auto start = uri.find("///");
  auto end = uri.find('?');
  if (start == std::string::npos) return uri;
  return uri.substr(0, start + 3) + db +
         (end == std::string::npos ? "" : uri.substr(end));
}

std::string DatabaseOf(const std::string& uri) {
  auto start = uri.find("///");
  auto end = uri.find('?');
  if (start == std::string::npos) return "";
  return uri.substr(start + 3, end == std::string::npos
                                   ? std::string::npos
                                   : end - start - 3);
}

// A new database `name` on the server of maintenance URI `base` (bytes for
// names, byte order for listings); its URI.
vfs::Result<std::string> CreateDatabaseOn(const std::string& base,
                                          const std::string& name) {
  auto made = PgQuery(base, "CREATE DATABASE " + name +
                                " ENCODING 'SQL_ASCII' LC_COLLATE 'C' "
                                "LC_CTYPE 'C' TEMPLATE template0");
  if (!made) return std::unexpected(made.error());
  return WithDatabase(base, name);
}

}  // namespace

vfs::Result<std::string> TestPostgresUri() {
  const char* uri = std::getenv("AGENTVFS_TEST_PG");
  if (uri == nullptr || *uri == 0) {
    return vfs::Fail(ENOENT,
                     "AGENTVFS_TEST_PG is not set: run the tests through "
                     "ctest (its `postgresql` fixture starts a private "
                     "server), or start one with `scripts/pg-test-server "
                     "start DIR` and export the URI it prints");
  }
  return std::string(uri);
}

vfs::Result<std::string> PgQuery(const std::string& uri,
                                 const std::string& sql) {
  PGconn* conn = PQconnectdb(uri.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string why = PQerrorMessage(conn);
    PQfinish(conn);
    return vfs::Fail(EIO, "cannot reach the test PostgreSQL server (" + uri +
                              "): " + why);
  }
  PGresult* r = PQexec(conn, sql.c_str());
  auto status = PQresultStatus(r);
  std::string out;
  if (status == PGRES_TUPLES_OK && PQntuples(r) > 0 && PQnfields(r) > 0) {
    out = PQgetvalue(r, 0, 0);
  }
  std::string why = PQresultErrorMessage(r);
  PQclear(r);
  PQfinish(conn);
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    return vfs::Fail(EIO, sql + ": " + why);
  }
  return out;
}

vfs::Result<std::string> CreateTestDatabase() {
  auto base = TestPostgresUri();
  if (!base) return base;
  static std::atomic<int> counter{0};
  std::random_device rd;
  std::string name = "t" + std::to_string(getpid()) + "_" +
                     std::to_string(counter++) + "_" +
                     std::to_string(rd() % 1000000);
  return CreateDatabaseOn(*base, name);
}

namespace {

// Runs scripts/pg-test-server with `args`; its output, or an error with it.
vfs::Result<std::string> RunServerScript(std::vector<std::string> args) {
  args.insert(args.begin(),
              std::string(AGENTVFS_SOURCE_DIR) + "/scripts/pg-test-server");
  CommandResult r = RunCommand(args);
  if (r.exit_status != 0) {
    return vfs::Fail(EIO, args[0] + " " + args[1] + " failed: " + r.output);
  }
  while (!r.output.empty() && r.output.back() == '\n') r.output.pop_back();
  return r.output;
}

}  // namespace

vfs::Result<std::unique_ptr<PrivatePgServer>> PrivatePgServer::Start() {
  // The server's directory inside a private one (the server's user must
  // be able to pass through it).
  char tmpl[] = "/tmp/agentvfs-pgown-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return vfs::Fail(errno, "mkdtemp");
  if (chmod(tmpl, 0711) != 0) return vfs::Fail(errno, "chmod");
  auto server = std::unique_ptr<PrivatePgServer>(new PrivatePgServer());
  server->parent_ = tmpl;
  server->dir_ = server->parent_ + "/pg";
  auto uri = RunServerScript({"start", server->dir_});
  if (!uri) return std::unexpected(uri.error());
  // The script's last line is the URI.
  auto nl = uri->rfind('\n');
  server->uri_ = nl == std::string::npos ? *uri : uri->substr(nl + 1);
  return server;
}

PrivatePgServer::~PrivatePgServer() {
  if (!dir_.empty()) (void)RunServerScript({"stop", dir_});
  if (!parent_.empty()) rmdir(parent_.c_str());
}

vfs::Result<std::string> PrivatePgServer::CreateDatabase(
    const std::string& name) {
  return CreateDatabaseOn(uri_, name);
}

vfs::Status PrivatePgServer::Restart(const std::string& mode) {
  auto r = RunServerScript({"restart", dir_, mode});
  if (!r) return std::unexpected(r.error());
  return {};
}

vfs::Status PrivatePgServer::Down() {
  auto r = RunServerScript({"down", dir_});
  if (!r) return std::unexpected(r.error());
  return {};
}

vfs::Status PrivatePgServer::Up() {
  auto r = RunServerScript({"up", dir_});
  if (!r) return std::unexpected(r.error());
  return {};
}

void DropTestDatabase(const std::string& uri) {
  auto base = TestPostgresUri();
  std::string db = DatabaseOf(uri);
  if (!base || db.empty() || db == "postgres") return;
  (void)PgQuery(*base, "DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
}

}  // namespace agentvfs::testing
