// What only the PostgreSQL engine has to show (the store suites run on both
// engines elsewhere): change hints through LISTEN/NOTIFY, commits that
// survive server restarts in the middle of a write loop, clear errors for
// an unreachable server, and no password in what is shown.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "backends/store/admin.h"
#include "backends/store/postgres_engine.h"
#include "backends/store/store.h"
#include "tests/backends/store/process_test_util.h"
#include "tests/support/pg_server.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using testing::PgQuery;
using testing::StoreEngine;
using testing::StoreFixture;

using test_util::P;

class RecordingListener final : public vfs::ChangeListener {
 public:
  void Changed(const vfs::Path& path) override {
    std::lock_guard lock(mu_);
    paths_.push_back(path.str());
    cv_.notify_all();
  }
  // Waits until `path` was reported; the seconds it took, or -1.
  double WaitFor(const std::string& path, std::chrono::milliseconds limit) {
    auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(mu_);
    bool seen = cv_.wait_for(lock, limit, [&] {
      return std::find(paths_.begin(), paths_.end(), path) != paths_.end();
    });
    if (!seen) return -1;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> paths_;
};

vfs::Status CommitFile(StoreBackend& b, const vfs::Caller& c,
                       const std::string& path, const std::string& data) {
  auto f = b.Open(c, P(path), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!f) return std::unexpected(f.error());
  for (size_t off = 0; off < data.size(); off += 1 << 20) {
    size_t n = std::min<size_t>(1 << 20, data.size() - off);
    auto w = (*f)->Write(data.data() + off, n, static_cast<off_t>(off));
    if (!w) return std::unexpected(w.error());
  }
  return (*f)->Flush();
}

TEST(PostgresEngineTest, ACommitWakesAnotherProcessListenerWithoutPolling) {
  ASSERT_OK_AND_ASSIGN(auto fx,
                       StoreFixture::Create({"dev"}, {}, StoreEngine::kPostgres));
  // The watcher would poll only once an hour: anything it sees within a
  // second came from the server's notification.
  StoreOptions watcher_options;
  watcher_options.poll_interval = std::chrono::hours(1);
  auto watcher = fx->OpenBackend(watcher_options);
  ASSERT_NE(watcher, nullptr);
  RecordingListener listener;
  watcher->SetChangeListener(&listener);
  auto writer = fx->OpenBackend();
  ASSERT_NE(writer, nullptr);
  vfs::Caller dev = fx->CallerFor("dev");
  for (int i = 0; i < 3; ++i) {
    std::string path = "/memories/users/dev/n" + std::to_string(i) + ".md";
    ASSERT_OK(
        CommitFile(*writer, dev, path, "note " + std::to_string(i) + "\n"));
    double t = listener.WaitFor(path, std::chrono::seconds(3));
    ASSERT_GE(t, 0) << "no change hint for " << path;
    std::printf("change hint for %s after %.3f s\n", path.c_str(), t);
    EXPECT_LT(t, 1.0);
  }
  watcher->SetChangeListener(nullptr);
}

// Writers keep committing files (some of several chunks) while the server
// is restarted, alternately as a crash (immediate: no checkpoint, recovery
// from the WAL) and cleanly: at least twice, and again (up to eight times)
// until a restart has caught a writer mid-commit, which a slow build can
// miss twice in a row. Every commit that was acknowledged must
// be there whole; every other file must be empty (created, never
// committed) or whole: never a part. Writers carry on after each restart.
TEST(PostgresEngineTest, ServerRestartsDuringAWriteLoopLoseNoAcknowledgedCommit) {
  ASSERT_OK_AND_ASSIGN(auto server, testing::PrivatePgServer::Start());
  ASSERT_OK_AND_ASSIGN(std::string uri, server->CreateDatabase("restarts"));
  ASSERT_OK_AND_ASSIGN(auto admin_token, InitStore(uri, "admin"));
  (void)admin_token;

  constexpr int kWriters = 3;
  auto content = [](int w, int i) {
    // 1 KiB to 2.5 MiB: large ones take several chunk inserts per commit.
    size_t size = (i % 4 == 3) ? (2 << 20) + (1 << 19) : 1024 + 97 * i;
    std::string s(size, '\0');
    for (size_t k = 0; k < size; ++k) {
      s[k] = static_cast<char>('a' + (k * 7 + w * 13 + i) % 26);
    }
    return s;
  };
  struct Outcome {
    std::map<int, bool> acked;  // file index -> Flush returned 0
    std::atomic<int> failures{0};
    std::atomic<int> after_last_restart{0};  // acknowledged after the restarts
  };
  std::vector<Outcome> outcomes(kWriters);
  std::atomic<bool> stop{false};
  std::atomic<bool> restarts_over{false};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      auto backend = StoreBackend::Open(uri);
      if (!backend) {
        ADD_FAILURE() << backend.error().ToString();
        return;
      }
      vfs::Caller c;
      c.user = "admin";
      c.session = "writer-" + std::to_string(w);
      for (int i = 0; !stop; ++i) {
        std::string path =
            "/memories/org/w" + std::to_string(w) + "-" + std::to_string(i);
        auto ok = CommitFile(**backend, c, path, content(w, i));
        outcomes[w].acked[i] = ok.has_value();
        if (!ok) {
          ++outcomes[w].failures;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        } else if (restarts_over) {
          ++outcomes[w].after_last_restart;
        }
      }
    });
  }
  auto any_failure = [&] {
    for (const auto& o : outcomes)
      if (o.failures > 0) return true;
    return false;
  };
  for (int n = 0; n < 8; ++n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ASSERT_OK(server->Restart(n % 2 == 0 ? "immediate" : "fast"));
    if (n >= 1 && any_failure()) break;
  }
  restarts_over = true;
  // Writers must come back on their own and commit again.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (std::chrono::steady_clock::now() < deadline) {
    int least = 1 << 30;
    for (const auto& o : outcomes) least = std::min(least, o.after_last_restart.load());
    if (least >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop = true;
  for (auto& t : writers) t.join();

  auto backend = StoreBackend::Open(uri);
  ASSERT_TRUE(backend.has_value()) << backend.error().ToString();
  vfs::Caller reader;
  reader.user = "admin";
  reader.session = "checker";
  int acked = 0, failed = 0;
  for (int w = 0; w < kWriters; ++w) {
    failed += outcomes[w].failures;
    EXPECT_GE(outcomes[w].after_last_restart.load(), 3)
        << "writer " << w << " did not recover after the restarts";
    for (const auto& [i, ok] : outcomes[w].acked) {
      std::string path =
          "/memories/org/w" + std::to_string(w) + "-" + std::to_string(i);
      auto got = test_util::ReadPath(**backend, reader, path);
      std::string want = content(w, i);
      if (ok) {
        ++acked;
        ASSERT_TRUE(got.has_value())
            << "acknowledged " << path << " is gone: " << got.error().ToString();
        EXPECT_TRUE(*got == want)
            << "acknowledged " << path << " has " << got->size()
            << " bytes, not its " << want.size();
      } else if (got.has_value()) {
        EXPECT_TRUE(got->empty() || *got == want)
            << path << " is half-written: " << got->size() << " of "
            << want.size() << " bytes";
      }
    }
  }
  std::printf("%d commits acknowledged, %d refused during the restarts\n",
              acked, failed);
  EXPECT_GT(acked, 0);
  EXPECT_GT(failed, 0) << "the restarts never hit a writer: test too weak";
  // No content refers to a chunk that is not stored.
  int64_t dangling = -1;
  ASSERT_OK(backend->get()->engine().Read([&](Txn& t) -> vfs::Status {
    auto r = t.Query(
        "SELECT COUNT(*) FROM chunks c LEFT JOIN blobs b ON b.id = c.blob "
        "WHERE c.blob != 0 AND b.id IS NULL");
    if (!r) return std::unexpected(r.error());
    dangling = AsInt((*r)[0][0]);
    return {};
  }));
  EXPECT_EQ(dangling, 0);
}

TEST(PostgresEngineTest, AnUnreachableServerOrMissingStoreIsAClearError) {
  auto gone = Engine::Open("postgresql:///x?host=/nonexistent-dir", false);
  ASSERT_FALSE(gone.has_value());
  EXPECT_NE(gone.error().message.find("cannot connect to PostgreSQL"),
            std::string::npos)
      << gone.error().message;

  ASSERT_OK_AND_ASSIGN(std::string uri, testing::CreateTestDatabase());
  auto empty = Engine::Open(uri, false);
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(empty.error().code, ENOENT);
  EXPECT_NE(empty.error().message.find("agentvfs init --store"),
            std::string::npos)
      << empty.error().message;
  // The suggested command survives a shell: the URI's '?' and '&' quoted.
  EXPECT_NE(empty.error().message.find("--store '" + uri + "'"),
            std::string::npos)
      << empty.error().message;

  // A database holding another program's tables never becomes a store
  // (init, migrate --to): nothing is added next to them.
  ASSERT_OK(PgQuery(uri, "CREATE TABLE invoices(id int)"));
  auto foreign = Engine::Open(uri, true);
  ASSERT_FALSE(foreign.has_value());
  EXPECT_EQ(foreign.error().code, EEXIST);
  EXPECT_NE(foreign.error().message.find("invoices"), std::string::npos)
      << foreign.error().message;
  ASSERT_OK_AND_ASSIGN(
      std::string tables,
      PgQuery(uri,
              "SELECT string_agg(tablename, ',') FROM "
              "pg_tables WHERE schemaname = current_schema()"));
  EXPECT_EQ(tables, "invoices");
  testing::DropTestDatabase(uri);
}

// A server that stays down: the first operation keeps trying for the retry
// time (AGENTVFS_PG_RETRY_SECONDS, 1 s here), then the others fail at once
// saying since when, until the server is back; then the store works again
// without reopening it.
TEST(PostgresEngineTest, AServerThatStaysDownFailsOperationsAtOnce) {
  ASSERT_OK_AND_ASSIGN(auto server, testing::PrivatePgServer::Start());
  ASSERT_OK_AND_ASSIGN(std::string uri, server->CreateDatabase("down"));
  ASSERT_OK_AND_ASSIGN(auto admin_token, InitStore(uri, "admin"));
  (void)admin_token;
  ASSERT_EQ(setenv("AGENTVFS_PG_RETRY_SECONDS", "1", 1), 0);
  auto opened = Engine::Open(uri, false);
  unsetenv("AGENTVFS_PG_RETRY_SECONDS");
  ASSERT_OK(opened);
  Engine& engine = **opened;
  auto read = [&] {
    return engine.Read([](Txn&) -> vfs::Status { return {}; });
  };
  auto write = [&] {
    return engine.Write(Durability::kFull, [](Txn& t) -> vfs::Status {
      auto r = t.Query("SELECT 1", {});
      if (!r) return std::unexpected(r.error());
      return {};
    });
  };
  ASSERT_OK(read());
  ASSERT_OK(write());

  ASSERT_OK(server->Down());
  vfs::Status first = read();
  ASSERT_FALSE(first.has_value());
  EXPECT_EQ(first.error().code, EIO);
  EXPECT_NE(first.error().message.find("until the server answers"),
            std::string::npos)
      << first.error().message;
  // The next ones do not wait: they say since when the server has not
  // answered (one of them may be the one that tries again, every 2 s).
  int at_once = 0;
  for (int i = 0; i < 4; ++i) {
    for (vfs::Status s : {read(), write()}) {
      ASSERT_FALSE(s.has_value());
      EXPECT_EQ(s.error().code, EIO);
      if (s.error().message.find("no answer since") != std::string::npos)
        ++at_once;
    }
  }
  EXPECT_GT(at_once, 0);

  ASSERT_OK(server->Up());
  vfs::Status again = read();
  for (int i = 0; i < 200 && !again; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    again = read();
  }
  EXPECT_OK(again);
  EXPECT_OK(write());
}

TEST(PostgresEngineTest, PasswordsNeverShow) {
  EXPECT_EQ(RedactPostgresUri("postgresql://bob:s3cret@db.example:5433/team"),
            "postgresql://bob@db.example:5433/team");
  EXPECT_EQ(RedactPostgresUri("postgresql:///team?host=/run/pg&password=x"),
            "postgresql:///team?host=/run/pg");
  auto bad = Engine::Open("postgresql://bob:s3cret@/x?host=/nonexistent-dir",
                          false);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().message.find("s3cret"), std::string::npos)
      << bad.error().message;
}

// Each session of the engine carries what frees the store from a client
// host that vanished inside a transaction (the write lock would otherwise be
// held until the kernel's keepalive, 2 h), and passes names as bytes.
TEST(PostgresEngineTest, SessionsEndTransactionsOfAVanishedClient) {
  ASSERT_OK_AND_ASSIGN(
      auto fx, StoreFixture::Create({"alice"}, {}, StoreEngine::kPostgres));
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Open(fx->db(), false));
  auto show = [](Txn& t, const char* what, std::string* out) -> vfs::Status {
    auto rows = t.Query(std::string("SHOW ") + what);
    if (!rows) return std::unexpected(rows.error());
    *out = std::get<std::string>((*rows)[0][0]);
    return {};
  };
  // (tcp_keepalives_* read 0 here: the test server is reached through a
  // Unix socket, where they do not apply.)
  std::map<std::string, std::string> want = {
      {"idle_in_transaction_session_timeout", "1min"},
      {"client_encoding", "SQL_ASCII"}};
  ASSERT_OK_AND_ASSIGN(auto version,
                       PgQuery(fx->db(), "SHOW server_version_num"));
  if (std::stoi(version) >= 140000)
    want["client_connection_check_interval"] = "10s";
  for (const auto& [what, value] : want) {
    std::string in_write, in_read;
    ASSERT_OK(engine->Write(Durability::kProcess, [&](Txn& t) {
      return show(t, what.c_str(), &in_write);
    }));
    ASSERT_OK(
        engine->Read([&](Txn& t) { return show(t, what.c_str(), &in_read); }));
    EXPECT_EQ(in_write, value) << what;
    EXPECT_EQ(in_read, value) << what;
  }
}

// A client whose environment asks for UTF8 (PGCLIENTENCODING) still stores
// and lists a name that is not UTF-8, byte for byte, in a SQL_ASCII store.
TEST(PostgresEngineTest, NameBytesPassWhateverTheClientEncoding) {
  ASSERT_OK_AND_ASSIGN(
      auto fx, StoreFixture::Create({"alice"}, {}, StoreEngine::kPostgres));
  setenv("PGCLIENTENCODING", "UTF8", 1);
  struct Unset {
    ~Unset() { unsetenv("PGCLIENTENCODING"); }
  } unset;
  auto backend = fx->OpenBackend();
  ASSERT_NE(backend, nullptr);
  auto alice = fx->CallerFor("alice");
  const std::string name = "caf\xe9.md";  // Latin-1, not UTF-8
  ASSERT_OK(CommitFile(*backend, alice, "/memories/users/alice/" + name, "x"));
  ASSERT_OK_AND_ASSIGN(auto entries,
                       backend->ReadDir(alice, P("/memories/users/alice")));
  bool found = false;
  for (const auto& e : entries) found = found || e.name == name;
  EXPECT_TRUE(found);
}

// A purge run by a role that may use the store but does not own its
// tables: PostgreSQL skips their VACUUM with a mere warning. The purge is
// committed, and it says so, and that the bytes may still be on disk,
// instead of reporting them erased.
// A role made for a test, dropped with what it owns when the test ends.
struct DropRoleAtEnd {
  std::string uri, role;
  ~DropRoleAtEnd() {
    (void)PgQuery(uri, "DROP OWNED BY " + role);
    (void)PgQuery(uri, "DROP ROLE " + role);
  }
};

// The test server's URI `uri` (as postgres) as `role`; "" if it names no
// user.
std::string AsRole(std::string uri, const std::string& role) {
  auto at = uri.find("user=postgres");
  if (at == std::string::npos) return "";
  return uri.replace(at, 13, "user=" + role);
}

TEST(PostgresEngineTest, APurgeThatCouldNotCompactSaysSo) {
  ASSERT_OK_AND_ASSIGN(
      auto fx, StoreFixture::Create({"alice"}, {}, StoreEngine::kPostgres));
  auto owner = fx->OpenBackend();
  ASSERT_NE(owner, nullptr);
  auto admin = fx->CallerFor("admin");
  const std::string path = "/memories/users/admin/secret.md";
  ASSERT_OK(CommitFile(*owner, admin, path, "erase me\n"));
  const std::string role = "avfs_not_owner_" + std::to_string(getpid());
  for (const std::string& sql :
       {"CREATE ROLE " + role + " LOGIN",
        "GRANT USAGE ON SCHEMA public TO " + role,
        // Not ALL: from PostgreSQL 17 that includes MAINTAIN (VACUUM).
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
        "public TO " +
            role,
        "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO " + role}) {
    ASSERT_OK(PgQuery(fx->db(), sql));
  }
  DropRoleAtEnd drop{fx->db(), role};
  std::string uri = AsRole(fx->db(), role);
  ASSERT_FALSE(uri.empty()) << fx->db();
  {
    ASSERT_OK_AND_ASSIGN(auto other, StoreBackend::Open(uri));
    auto purged = other->Purge(admin, P(path), false);
    ASSERT_ERRNO(purged, EACCES);
    EXPECT_NE(purged.error().message.find("is committed"), std::string::npos)
        << purged.error().message;
    EXPECT_NE(purged.error().message.find("may still be"), std::string::npos)
        << purged.error().message;
    EXPECT_NE(purged.error().message.find("agentvfs compact"),
              std::string::npos)
        << purged.error().message;
    // `agentvfs compact` as that role fails the same way.
    EXPECT_ERRNO(CompactStore(other->engine(), "admin"), EACCES);
  }
  EXPECT_ERRNO(owner->History(admin, P(path)), ENOENT);
  // As the owner it finishes the purge; it needs admin on /.
  EXPECT_ERRNO(CompactStore(owner->engine(), "alice"), EACCES);
  EXPECT_OK(CompactStore(owner->engine(), "admin"));
  // The owner's purge compacts.
  ASSERT_OK(CommitFile(*owner, admin, path, "erase me too\n"));
  ASSERT_OK(owner->Purge(admin, P(path), false));
}

// A database role that may read the store's tables but not write them is
// a misconfigured store, not a refusal by the store's grants: EIO (a mount
// logs it) with the server's reason and what to do, not a bare EACCES.
TEST(PostgresEngineTest, ARoleWithoutPrivilegesIsAnErrorOfTheStore) {
  ASSERT_OK_AND_ASSIGN(
      auto fx, StoreFixture::Create({"alice"}, {}, StoreEngine::kPostgres));
  const std::string role = "avfs_read_only_" + std::to_string(getpid());
  for (const std::string& sql :
       {"CREATE ROLE " + role + " LOGIN",
        "GRANT USAGE ON SCHEMA public TO " + role,
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + role}) {
    ASSERT_OK(PgQuery(fx->db(), sql));
  }
  DropRoleAtEnd drop{fx->db(), role};
  std::string uri = AsRole(fx->db(), role);
  ASSERT_FALSE(uri.empty()) << fx->db();
  ASSERT_OK_AND_ASSIGN(auto reader, StoreBackend::Open(uri));
  auto alice = fx->CallerFor("alice");
  auto wrote = CommitFile(*reader, alice, "/memories/users/alice/x.md", "x\n");
  ASSERT_ERRNO(wrote, EIO);
  EXPECT_NE(wrote.error().message.find("permission denied"), std::string::npos)
      << wrote.error().message;
  EXPECT_NE(wrote.error().message.find("lacks privileges"), std::string::npos)
      << wrote.error().message;
}

}  // namespace
}  // namespace agentvfs::store
