// StoreFixture: a fresh store, set up with `InitStore` (admin "admin") and
// the users a test asks for, with their tokens kept in files for mounts
// (`--token-file`) and callers for the API. The store is a SQLite file in a
// temporary directory, or a fresh database on the tests' PostgreSQL server
// (pg_server.h); suites that hold for both run once per engine
// (INSTANTIATE_TEST_SUITE_P(..., ::testing::ValuesIn(kAllEngines),
// EngineName)).
#pragma once

#include <map>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include "backends/store/store.h"
#include "router/router.h"
#include "tests/support/mount_fixture.h"
#include "vfs/error.h"

namespace agentvfs::testing {

enum class StoreEngine { kSqlite, kPostgres };
inline constexpr StoreEngine kAllEngines[] = {StoreEngine::kSqlite,
                                              StoreEngine::kPostgres};
// "Sqlite" / "Postgres", for test names.
std::string EngineName(StoreEngine engine);
// For gtest's messages ("GetParam() = Postgres").
inline void PrintTo(StoreEngine engine, std::ostream* os) {
  *os << EngineName(engine);
}
// For INSTANTIATE_TEST_SUITE_P's name generator.
template <typename Info>
std::string EngineName(const Info& info) {
  return EngineName(info.param);
}

class StoreFixture {
 public:
  // Users are added by "admin", each with `teams[user]` as teams.
  static vfs::Result<std::unique_ptr<StoreFixture>> Create(
      const std::vector<std::string>& users,
      const std::map<std::string, std::vector<std::string>>& teams = {},
      StoreEngine engine = StoreEngine::kSqlite);
  ~StoreFixture();

  // The store's name: a file path (SQLite) or a postgresql:// URI.
  const std::string& db() const { return db_; }
  StoreEngine engine() const { return engine_; }
  const std::string& dir() const { return dir_->path(); }
  const std::string& token(const std::string& user) const {
    return tokens_.at(user);
  }
  // A file holding the user's token (mode 0600).
  std::string TokenFile(const std::string& user) const;
  // A caller of the API as `user` in session "api-<user>-<n>".
  vfs::Caller CallerFor(const std::string& user, std::string session = "");
  // Opens the store (another StoreBackend on the same file).
  std::unique_ptr<store::StoreBackend> OpenBackend(
      store::StoreOptions options = {}) const;
  // A router with a new StoreBackend at /memories and /skills.
  std::unique_ptr<router::Router> MakeRouter(
      store::StoreOptions options = {}) const;
  // `agentvfs mount` arguments naming this store and `user`'s token file.
  std::vector<std::string> MountArgs(const std::string& user) const;

 private:
  StoreFixture() = default;
  std::unique_ptr<TempDir> dir_;
  std::string db_;
  StoreEngine engine_ = StoreEngine::kSqlite;
  std::map<std::string, std::string> tokens_;
  int sessions_ = 0;
};

}  // namespace agentvfs::testing
