// `agentvfs migrate`: a whole SQLite store (files of every kind, versions,
// a deleted file, users and their tokens, teams, grants, harness sessions)
// copied into PostgreSQL by the real binary, verified by it, and then used:
// the same tokens, grants, contents and histories, and new writes.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <string>

#include "backends/store/admin.h"
#include "backends/store/auth.h"
#include "backends/store/migrate.h"
#include "backends/store/store.h"
#include "tests/backends/store/process_test_util.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/pg_server.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using testing::StoreEngine;
using testing::StoreFixture;

using test_util::P;

vfs::Status Put(StoreBackend& b, const vfs::Caller& c, const std::string& path,
                const std::string& data) {
  auto f = b.Open(c, P(path), O_WRONLY | O_CREAT | O_TRUNC, 0640);
  if (!f) return std::unexpected(f.error());
  if (!data.empty()) {
    auto w = (*f)->Write(data.data(), data.size(), 0);
    if (!w) return std::unexpected(w.error());
  }
  return (*f)->Flush();
}

std::string Get(StoreBackend& b, const vfs::Caller& c, const std::string& path,
                int64_t version = 0) {
  auto f = version > 0 ? b.OpenVersion(c, P(path), version)
                       : b.Open(c, P(path), O_RDONLY, 0);
  if (!f) return "<" + f.error().ToString() + ">";
  std::string out, buf(1 << 20, '\0');
  off_t off = 0;
  while (true) {
    auto n = (*f)->Read(buf.data(), buf.size(), off);
    if (!n || *n == 0) break;
    out.append(buf.data(), *n);
    off += static_cast<off_t>(*n);
  }
  return out;
}

// `agentvfs migrate --from FROM --to TO`: its exit status and output.
testing::CommandResult Migrate(const std::string& from, const std::string& to) {
  return testing::RunCommand({AGENTVFS_BINARY, "migrate", "--from", from,
                              "--to", to});
}

TEST(MigrateTest, ASqliteStoreMovesToPostgresWhole) {
  ASSERT_OK_AND_ASSIGN(auto src, StoreFixture::Create({"dev", "ops"},
                                                      {{"dev", {"eng"}}},
                                                      StoreEngine::kSqlite));
  const std::string big(3 * (1 << 20) + 12345, 'b');  // four chunks
  {
    auto b = src->OpenBackend();
    ASSERT_NE(b, nullptr);
    vfs::Caller admin = src->CallerFor("admin"), dev = src->CallerFor("dev");
    ASSERT_OK(Put(*b, admin, "/memories/org/oncall.md", "v1\n"));
    ASSERT_OK(Put(*b, admin, "/memories/org/oncall.md", "v2: page ops\n"));
    ASSERT_OK(Put(*b, dev, "/memories/users/dev/big.bin", big));
    ASSERT_OK(Put(*b, dev, "/memories/users/dev/gone.md", "deleted later\n"));
    ASSERT_OK(b->Unlink(dev, P("/memories/users/dev/gone.md")));
    ASSERT_OK(b->Symlink(dev, "big.bin", P("/memories/users/dev/link")));
    ASSERT_OK(b->Mkdir(admin, P("/skills/tool"), 0755));
    ASSERT_OK(Put(*b, admin, "/skills/tool/run.sh", "#!/bin/sh\necho hi\n"));
    ASSERT_OK(b->Chmod(admin, P("/skills/tool/run.sh"), 0755));
    ASSERT_OK(Grant(b->engine(), "admin", "/memories/teams/eng",
                    Subject{"team", "eng"}, Level::kWrite));
    ASSERT_OK(b->engine().Write(Durability::kFull, [](Txn& t) -> vfs::Status {
      auto s = t.Exec(
          "INSERT INTO sessions(id, \"user\", created_ns, updated_ns, state, "
          "task, config) VALUES('run-1', 'dev', 1, 2, 'done', 'tidy up', "
          "'{}')");
      if (!s) return std::unexpected(s.error());
      auto e = t.Exec(
          "INSERT INTO events(session, seq, time_ns, kind, data) "
          "VALUES('run-1', 1, 3, 'user', '{\"text\":\"tidy up\"}')");
      if (!e) return std::unexpected(e.error());
      return {};
    }));
  }

  ASSERT_OK_AND_ASSIGN(std::string uri, testing::CreateTestDatabase());
  auto migrated = Migrate(src->db(), uri);
  ASSERT_EQ(migrated.exit_status, 0) << migrated.output;
  EXPECT_NE(migrated.output.find("verified: every table"), std::string::npos)
      << migrated.output;

  // Into a store that is not empty: refused, nothing changed.
  auto again = Migrate(src->db(), uri);
  EXPECT_NE(again.exit_status, 0);
  EXPECT_NE(again.output.find("already holds a store"), std::string::npos)
      << again.output;

  auto pg = StoreBackend::Open(uri);
  ASSERT_TRUE(pg.has_value()) << pg.error().ToString();
  StoreBackend& b = **pg;
  // The same tokens log in.
  ASSERT_OK_AND_ASSIGN(std::string who, Authenticate(b.engine(), src->token("dev")));
  EXPECT_EQ(who, "dev");
  vfs::Caller dev{.user = "dev", .session = "after-1"};
  vfs::Caller ops{.user = "ops", .session = "after-2"};
  vfs::Caller admin{.user = "admin", .session = "after-3"};
  // Contents, modes, links, history and the deleted file.
  EXPECT_EQ(Get(b, dev, "/memories/org/oncall.md"), "v2: page ops\n");
  EXPECT_TRUE(Get(b, dev, "/memories/users/dev/big.bin") == big);
  EXPECT_TRUE(Get(b, dev, "/memories/users/dev/link") == big);
  ASSERT_OK_AND_ASSIGN(auto st, b.Stat(admin, P("/skills/tool/run.sh")));
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_OK_AND_ASSIGN(auto h, b.History(dev, P("/memories/org/oncall.md")));
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(Get(b, dev, "/memories/org/oncall.md", h[0].n), "v1\n");
  ASSERT_OK_AND_ASSIGN(auto gone, b.History(dev, P("/memories/users/dev/gone.md")));
  ASSERT_FALSE(gone.empty());
  EXPECT_TRUE(gone.back().deleted);
  ASSERT_OK(b.Restore(dev, P("/memories/users/dev/gone.md"), gone.front().n));
  EXPECT_EQ(Get(b, dev, "/memories/users/dev/gone.md"), "deleted later\n");
  // Grants: ops does not see dev's home; dev writes the team's area.
  EXPECT_ERRNO(b.Stat(ops, P("/memories/users/dev/big.bin")), ENOENT);
  EXPECT_OK(Put(b, dev, "/memories/teams/eng/plan.md", "new after migrate\n"));
  // New rows get keys above the copied ones.
  EXPECT_OK(Put(b, admin, "/memories/org/new.md", "fresh\n"));
  EXPECT_EQ(Get(b, dev, "/memories/org/new.md"), "fresh\n");
  EXPECT_EQ(Get(b, dev, "/memories/org/oncall.md"), "v2: page ops\n");
  // The session and its events.
  std::string task;
  int64_t events = 0;
  ASSERT_OK(b.engine().Read([&](Txn& t) -> vfs::Status {
    auto s = t.Query("SELECT task FROM sessions WHERE id = 'run-1'");
    if (!s) return std::unexpected(s.error());
    if (!s->empty()) task = AsText((*s)[0][0]);
    auto e = t.Query("SELECT COUNT(*) FROM events WHERE session = 'run-1'");
    if (!e) return std::unexpected(e.error());
    events = AsInt((*e)[0][0]);
    return {};
  }));
  EXPECT_EQ(task, "tidy up");
  EXPECT_EQ(events, 1);
  pg->reset();
  testing::DropTestDatabase(uri);
}

TEST(MigrateTest, VerificationCatchesADifference) {
  ASSERT_OK_AND_ASSIGN(auto src, StoreFixture::Create({"dev"}, {},
                                                      StoreEngine::kSqlite));
  ASSERT_OK_AND_ASSIGN(std::string uri, testing::CreateTestDatabase());
  {
    ASSERT_OK_AND_ASSIGN(auto from, Engine::Open(src->db(), false));
    ASSERT_OK_AND_ASSIGN(auto to, Engine::Open(uri, true));
    ASSERT_OK(CopyStore(*from, *to));
    ASSERT_OK(VerifyCopy(*from, *to));
    // One changed byte in one row is found.
    ASSERT_OK(to->Write(Durability::kFull, [](Txn& t) -> vfs::Status {
      auto u = t.Exec("UPDATE users SET disabled = 1 WHERE name = 'dev'");
      if (!u) return std::unexpected(u.error());
      return {};
    }));
    auto bad = VerifyCopy(*from, *to);
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.error().message.find("table users"), std::string::npos)
        << bad.error().message;
    // It says what state the copy is in and what to do.
    EXPECT_NE(bad.error().message.find("(committed)"), std::string::npos);
    EXPECT_NE(bad.error().message.find("delete the copy"), std::string::npos);
    // And a store that is not new is refused.
    auto again = CopyStore(*from, *to);
    ASSERT_FALSE(again.has_value());
    EXPECT_EQ(again.error().code, EEXIST);
  }
  testing::DropTestDatabase(uri);
}

}  // namespace
}  // namespace agentvfs::store
