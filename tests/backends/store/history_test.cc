// History of store files through the API: every commit is a version with
// its author, session, time, size and content hash; equal contents are kept
// once; old versions read back; restore commits an old version anew; deleted
// files stay recoverable until purged; purge erases the bytes from the
// database files for good.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "backends/store/admin.h"
#include "backends/store/store.h"
#include "tests/support/result_matchers.h"
#include "tests/support/pg_server.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using testing::StoreFixture;

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every test here runs on each engine.
class HistoryTest : public ::testing::TestWithParam<testing::StoreEngine> {
 protected:
  void SetUp() override {
    auto f = StoreFixture::Create({"dev", "ops"}, {}, GetParam());
    ASSERT_TRUE(f.has_value()) << f.error().ToString();
    fixture_ = std::move(*f);
    backend_ = fixture_->OpenBackend();
    ASSERT_NE(backend_, nullptr);
    dev_ = fixture_->CallerFor("dev");
    admin_ = fixture_->CallerFor("admin");
  }

  vfs::Path P(const std::string& p) { return *vfs::Path::Parse(p); }

  vfs::Status Put(const vfs::Caller& c, const std::string& path,
                  const std::string& data,
                  int flags = O_WRONLY | O_CREAT | O_TRUNC) {
    auto f = backend_->Open(c, P(path), flags, 0644);
    if (!f) return std::unexpected(f.error());
    if (!data.empty()) {
      auto n = (*f)->Write(data.data(), data.size(), 0);
      if (!n) return std::unexpected(n.error());
    }
    return (*f)->Flush();
  }

  std::string Get(vfs::FileHandle& f) {
    std::string out, buf(1 << 16, '\0');
    off_t off = 0;
    while (true) {
      auto n = f.Read(buf.data(), buf.size(), off);
      if (!n || *n == 0) break;
      out.append(buf.data(), *n);
      off += *n;
    }
    return out;
  }

  std::string Get(const vfs::Caller& c, const std::string& path) {
    auto f = backend_->Open(c, P(path), O_RDONLY, 0);
    if (!f) return "<" + f.error().ToString() + ">";
    return Get(**f);
  }

  std::string Version(const std::string& path, int64_t n) {
    auto f = backend_->OpenVersion(dev_, P(path), n);
    if (!f) return "<" + f.error().ToString() + ">";
    return Get(**f);
  }

  int64_t Count(const std::string& sql) {
    int64_t n = -1;
    EXPECT_OK(backend_->engine().Read([&](Txn& t) -> vfs::Status {
      auto rows = t.Query(sql);
      if (!rows) return std::unexpected(rows.error());
      n = AsInt((*rows)[0][0]);
      return {};
    }));
    return n;
  }

  // Every byte of the store's files on disk: the SQLite database and its
  // log, or the PostgreSQL database's table files after a checkpoint.
  // `where` gets the files (and tables) that hold "SECRET-".
  std::string StoreBytes(std::string* where = nullptr) {
    if (GetParam() == testing::StoreEngine::kSqlite) {
      return FileBytes(fixture_->db()) + FileBytes(fixture_->db() + "-wal");
    }
    EXPECT_OK(testing::PgQuery(fixture_->db(), "CHECKPOINT"));
    auto oid = testing::PgQuery(
        fixture_->db(),
        "SELECT oid FROM pg_database WHERE datname = current_database()");
    auto dir = testing::PgQuery(fixture_->db(), "SHOW data_directory");
    EXPECT_TRUE(oid.has_value() && dir.has_value());
    std::string all;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(
             dir.value_or("") + "/base/" + oid.value_or(""), ec)) {
      if (!e.is_regular_file()) continue;
      std::string bytes = FileBytes(e.path().string());
      if (bytes.find("SECRET-") != std::string::npos) {
        auto rel = testing::PgQuery(
            fixture_->db(), "SELECT COALESCE((SELECT relname FROM pg_class "
                            "WHERE pg_relation_filenode(oid) = " +
                                e.path().filename().string().substr(
                                    0, e.path().filename().string().find_first_not_of("0123456789")) +
                                "), '?')");
        if (where != nullptr) {
          *where += e.path().string() + " (" + rel.value_or("?") + ") ";
        }
      }
      all += bytes;
    }
    EXPECT_FALSE(all.empty()) << "no table files found";
    return all;
  }

  std::unique_ptr<StoreFixture> fixture_;
  std::unique_ptr<StoreBackend> backend_;
  vfs::Caller dev_, admin_;
  const std::string kFile = "/memories/users/dev/notes.md";
};

TEST_P(HistoryTest, EveryCommitIsAVersionWithItsAuthorAndHash) {
  ASSERT_OK(Put(dev_, kFile, "one\n"));
  ASSERT_OK(Put(dev_, kFile, "one\ntwo\n"));
  ASSERT_OK(Put(dev_, kFile, "", O_WRONLY | O_TRUNC));
  ASSERT_OK_AND_ASSIGN(auto h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(h.size(), 3u);
  for (size_t i = 0; i < h.size(); ++i) {
    EXPECT_EQ(h[i].n, static_cast<int64_t>(i + 1));
    EXPECT_EQ(h[i].author, "dev");
    EXPECT_EQ(h[i].session, dev_.session);
    EXPECT_EQ(h[i].path, kFile);
    EXPECT_FALSE(h[i].deleted);
    EXPECT_EQ(h[i].content_hash.size(), 64u);
    if (i > 0) {
      EXPECT_GE(h[i].time_ns, h[i - 1].time_ns);
    }
  }
  EXPECT_EQ(h[0].size, 4);
  EXPECT_EQ(h[1].size, 8);
  EXPECT_EQ(h[2].size, 0);
  EXPECT_NE(h[0].content_hash, h[1].content_hash);
  EXPECT_EQ(Version(kFile, 1), "one\n");
  EXPECT_EQ(Version(kFile, 2), "one\ntwo\n");
  EXPECT_EQ(Version(kFile, 3), "");
  EXPECT_ERRNO(backend_->OpenVersion(dev_, P(kFile), 9), ENOENT);
}

TEST_P(HistoryTest, EqualContentsAreStoredOnce) {
  std::string big(3 << 20, 'x');  // three chunks, all the same
  big[0] = 'a';
  ASSERT_OK(Put(dev_, "/memories/users/dev/a", big));
  ASSERT_OK(Put(dev_, "/memories/users/dev/b", big));
  ASSERT_OK(Put(dev_, "/memories/users/dev/a", "small"));
  ASSERT_OK(Put(dev_, "/memories/users/dev/a", big));
  EXPECT_EQ(Count("SELECT COUNT(*) FROM contents WHERE size = 3145728"), 1);
  // Chunk 0 differs from chunks 1 and 2, which are equal: two blobs.
  EXPECT_EQ(Count("SELECT COUNT(*) FROM blobs WHERE size = 1048576"), 2);
  EXPECT_EQ(Get(dev_, "/memories/users/dev/b"), big);
}

TEST_P(HistoryTest, RestoreCommitsAnOldVersionAsANewOne) {
  ASSERT_OK(Put(dev_, kFile, "good\n"));
  ASSERT_OK(backend_->Chmod(dev_, P(kFile), 0755));
  ASSERT_OK(Put(dev_, kFile, "bad\n"));
  ASSERT_OK_AND_ASSIGN(auto v, backend_->Restore(dev_, P(kFile), 1));
  EXPECT_EQ(v.n, 3);
  EXPECT_EQ(Get(dev_, kFile), "good\n");
  ASSERT_OK_AND_ASSIGN(auto h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[2].content_hash, h[0].content_hash) << "nothing rewritten";
  EXPECT_EQ(Version(kFile, 2), "bad\n");
  // Another user may not restore what it may not write.
  auto ops = fixture_->CallerFor("ops");
  EXPECT_ERRNO(backend_->Restore(ops, P(kFile), 1), ENOENT);
  EXPECT_ERRNO(backend_->History(ops, P(kFile)), ENOENT);
}

TEST_P(HistoryTest, DeletedFilesStayRecoverable) {
  ASSERT_OK(backend_->Mkdir(dev_, P("/memories/users/dev/d"), 0755));
  std::string path = "/memories/users/dev/d/gone.md";
  ASSERT_OK(Put(dev_, path, "remember me\n"));
  ASSERT_OK(backend_->Unlink(dev_, P(path)));
  ASSERT_OK(backend_->Rmdir(dev_, P("/memories/users/dev/d")));
  EXPECT_ERRNO(backend_->Stat(dev_, P(path)), ENOENT);
  ASSERT_OK_AND_ASSIGN(auto h, backend_->History(dev_, P(path)));
  ASSERT_EQ(h.size(), 2u);
  EXPECT_TRUE(h[1].deleted);
  EXPECT_EQ(h[1].author, "dev");
  EXPECT_ERRNO(backend_->OpenVersion(dev_, P(path), 2), ENOENT);
  EXPECT_EQ(Version(path, 1), "remember me\n");
  ASSERT_OK_AND_ASSIGN(auto restored, backend_->Restore(dev_, P(path), 1));
  EXPECT_EQ(restored.n, 3) << "the file comes back as itself";
  EXPECT_EQ(Get(dev_, path), "remember me\n");
  ASSERT_OK_AND_ASSIGN(h, backend_->History(dev_, P(path)));
  ASSERT_EQ(h.size(), 3u) << "its history goes on";
  EXPECT_TRUE(h[1].deleted);
  // A full purge erases it and its whole past.
  ASSERT_OK(backend_->Unlink(dev_, P(path)));
  ASSERT_OK(Put(dev_, path, "a new file at the old name\n"));
  ASSERT_OK_AND_ASSIGN(auto report, backend_->Purge(admin_, P(path), false));
  EXPECT_EQ(report.files, 2);
  EXPECT_EQ(report.versions, 5);
  EXPECT_ERRNO(backend_->History(dev_, P(path)), ENOENT);
}


TEST_P(HistoryTest, PurgeErasesTheBytesForGood) {
  // Small enough to sit whole in one database page.
  const std::string secret = "SECRET-" + std::string(900, 'q') + "-END";
  const std::string kept = "kept-" + std::string(700, 'k');
  ASSERT_OK(Put(dev_, kFile, secret));
  ASSERT_OK(Put(dev_, kFile, kept));
  ASSERT_OK(Put(dev_, "/memories/users/dev/other", kept));  // shares content
  backend_.reset();  // let SQLite fold the log back: the secret is on disk
  backend_ = fixture_->OpenBackend();
  ASSERT_NE(backend_, nullptr);
  std::string db = StoreBytes();
  ASSERT_NE(db.find(secret), std::string::npos) << "test setup: secret stored";

  // Only admins purge.
  EXPECT_ERRNO(backend_->Purge(dev_, P(kFile), true), EACCES);
  ASSERT_OK_AND_ASSIGN(auto report, backend_->Purge(admin_, P(kFile), true));
  EXPECT_EQ(report.versions, 1);
  EXPECT_EQ(report.files, 0);
  EXPECT_GE(report.bytes, static_cast<int64_t>(secret.size()));
  ASSERT_OK_AND_ASSIGN(auto h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(Get(dev_, kFile), kept);
  std::string where;
  db = StoreBytes(&where);
  EXPECT_EQ(db.find("SECRET-"), std::string::npos)
      << "purged content is still in the database files: " << where;

  // A full purge removes the file and its history; shared content stays.
  ASSERT_OK_AND_ASSIGN(report, backend_->Purge(admin_, P(kFile), false));
  EXPECT_EQ(report.files, 1);
  EXPECT_ERRNO(backend_->Stat(dev_, P(kFile)), ENOENT);
  EXPECT_ERRNO(backend_->History(dev_, P(kFile)), ENOENT);
  EXPECT_EQ(Get(dev_, "/memories/users/dev/other"), kept);
  EXPECT_EQ(Count("SELECT COUNT(*) FROM chunks c LEFT JOIN blobs b "
                  "ON b.id = c.blob WHERE c.blob != 0 AND b.id IS NULL"),
            0)
      << "a chunk refers to a purged blob";
  if (GetParam() == testing::StoreEngine::kSqlite) {
    std::string integrity;
    EXPECT_OK(backend_->engine().Read([&](Txn& t) -> vfs::Status {
      auto rows = t.Query("PRAGMA integrity_check");
      if (!rows) return std::unexpected(rows.error());
      integrity = AsText((*rows)[0][0]);
      return {};
    }));
    EXPECT_EQ(integrity, "ok");
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, HistoryTest,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

}  // namespace
}  // namespace agentvfs::store
