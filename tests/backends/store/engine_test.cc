// The SQLite engine: stores are named by a path or sqlite:PATH (other
// schemes are refused clearly), the schema is created and recorded by
// numbered migrations, a store from a newer agentvfs is refused instead of
// being damaged, a failed transaction leaves nothing behind, and the file is
// private to its owner.
#include "backends/store/engine.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <filesystem>

#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/result_matchers.h"

namespace agentvfs::store {
namespace {

using testing::TempDir;

int UserVersion(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr);
  int v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

TEST(EngineTest, NamesAndSchemes) {
  TempDir dir("agentvfs-engine");
  EXPECT_ERRNO(Engine::Open(dir.Sub("missing.db"), false), ENOENT);
  auto e = Engine::Open("sqlite:" + dir.Sub("a.db"), true);
  ASSERT_TRUE(e.has_value()) << e.error().ToString();
  EXPECT_EQ((*e)->Describe(), "sqlite:" + dir.Sub("a.db"));
  EXPECT_ERRNO(Engine::Open("mysql://x/y", true), EINVAL);
  EXPECT_ERRNO(Engine::Open("", true), EINVAL);
  // A PostgreSQL URI without its // is refused, not made a SQLite file in
  // the working directory, and its text (a password?) is not echoed.
  char cwd[PATH_MAX];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(chdir(dir.path().c_str()), 0);
  for (const char* name : {"postgresql:agent:pw@127.0.0.1", "postgres:x"}) {
    auto bad = Engine::Open(name, true);
    ASSERT_FALSE(bad.has_value()) << name;
    EXPECT_EQ(bad.error().code, EINVAL);
    EXPECT_EQ(bad.error().message.find("pw@"), std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(dir.Sub(name))) << name;
  }
  ASSERT_EQ(chdir(cwd), 0);
  struct stat st;
  ASSERT_EQ(stat(dir.Sub("a.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the store holds token hashes";
}

TEST(EngineTest, MigrationsRunOnceAndAreRecorded) {
  TempDir dir("agentvfs-engine");
  std::string path = dir.Sub("s.db");
  {
    ASSERT_OK_AND_ASSIGN(auto e, Engine::Open(path, true));
    EXPECT_GE(e->SchemaVersion(), 1);
    ASSERT_OK(e->Write(Durability::kFull, [](Txn& t) -> vfs::Status {
      auto r = t.Exec("INSERT INTO meta(key, value) VALUES('probe', 'kept')");
      if (!r) return std::unexpected(r.error());
      return {};
    }));
  }
  int version = UserVersion(path);
  EXPECT_GE(version, 1);
  // Opening again migrates nothing and keeps the data.
  ASSERT_OK_AND_ASSIGN(auto e, Engine::Open(path, false));
  EXPECT_EQ(e->SchemaVersion(), version);
  std::string value;
  ASSERT_OK(e->Read([&](Txn& t) -> vfs::Status {
    auto rows = t.Query("SELECT value FROM meta WHERE key = 'probe'");
    if (!rows) return std::unexpected(rows.error());
    if (!rows->empty()) value = AsText((*rows)[0][0]);
    return {};
  }));
  EXPECT_EQ(value, "kept");
}

TEST(EngineTest, AStoreFromANewerVersionIsRefusedUntouched) {
  TempDir dir("agentvfs-engine");
  std::string path = dir.Sub("s.db");
  { ASSERT_OK_AND_ASSIGN(auto e, Engine::Open(path, true)); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "PRAGMA user_version=999", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  auto e = Engine::Open(path, false);
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, EINVAL);
  EXPECT_NE(e.error().message.find("upgrade agentvfs"), std::string::npos)
      << e.error().message;
  EXPECT_EQ(UserVersion(path), 999);
}

TEST(EngineTest, NotAStoreIsRefusedClearly) {
  TempDir dir("agentvfs-engine");
  std::string path = dir.Sub("notes.txt");
  ASSERT_TRUE(testing::WriteFile(path, std::string(4096, 'x'), 0644));
  auto e = Engine::Open(path, false);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("not a usable store"), std::string::npos)
      << e.error().message;
}

TEST(EngineTest, AFailedTransactionLeavesNothing) {
  TempDir dir("agentvfs-engine");
  ASSERT_OK_AND_ASSIGN(auto e, Engine::Open(dir.Sub("s.db"), true));
  auto failed = e->Write(Durability::kFull, [](Txn& t) -> vfs::Status {
    auto r = t.Exec("INSERT INTO meta(key, value) VALUES('half', 'done')");
    if (!r) return std::unexpected(r.error());
    return vfs::Fail(EIO, "something failed after the first statement");
  });
  EXPECT_ERRNO(failed, EIO);
  int64_t n = -1;
  ASSERT_OK(e->Read([&](Txn& t) -> vfs::Status {
    auto rows = t.Query("SELECT COUNT(*) FROM meta WHERE key = 'half'");
    if (!rows) return std::unexpected(rows.error());
    n = AsInt((*rows)[0][0]);
    return {};
  }));
  EXPECT_EQ(n, 0);
}

// A read transaction may run on the writer's connection; a callback that
// writes there is refused, and nothing of it is committed.
TEST(EngineTest, AWriteInAReadTransactionIsRefused) {
  TempDir dir("agentvfs-engine");
  ASSERT_OK_AND_ASSIGN(auto e, Engine::Open(dir.Sub("s.db"), true));
  auto wrote = e->Read([](Txn& t) -> vfs::Status {
    auto r = t.Exec("INSERT INTO meta(key, value) VALUES('sneaky', 'x')");
    if (!r) return std::unexpected(r.error());
    return {};
  });
  EXPECT_ERRNO(wrote, EROFS);
  int64_t rows = -1;
  ASSERT_OK(e->Read([&](Txn& t) -> vfs::Status {
    auto r = t.Query("SELECT COUNT(*) FROM meta WHERE key = 'sneaky'");
    if (!r) return std::unexpected(r.error());
    rows = AsInt((*r)[0][0]);
    return {};
  }));
  EXPECT_EQ(rows, 0);
  // The connection is usable for writes afterwards.
  ASSERT_OK(e->Write(Durability::kProcess, [](Txn& t) -> vfs::Status {
    auto r = t.Exec("INSERT INTO meta(key, value) VALUES('after', 'ok')");
    if (!r) return std::unexpected(r.error());
    return {};
  }));
}

}  // namespace
}  // namespace agentvfs::store
