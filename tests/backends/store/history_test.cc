// History of store files through the API: every commit is a version with
// its author, session, time, size and content hash; equal contents are kept
// once; old versions read back; restore commits an old version anew; deleted
// files stay recoverable until purged; purge erases the bytes from the
// database files for good.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "backends/store/admin.h"
#include "backends/store/auth.h"
#include "backends/store/namespace.h"
#include "backends/store/store.h"
#include "tests/support/pg_server.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using testing::StoreFixture;

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `sql` on the SQLite database `db`; "" on success, else the error.
std::string Sql(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) == SQLITE_OK) {
    return "";
  }
  std::string out = err != nullptr ? err : "?";
  sqlite3_free(err);
  return out;
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

  // The content hash of the current version of `path`, as dev sees it.
  std::string CurrentHash(const std::string& path) {
    auto h = backend_->History(dev_, P(path));
    return h.has_value() && !h->empty() ? h->back().content_hash
                                        : "<no history of " + path + ">";
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

// A restore that fails part-way (here: the old version's second chunk is
// unreadable) commits nothing: the file keeps its current content, and no
// version is added.
TEST_P(HistoryTest, ARestoreThatFailsPartWayLeavesTheFileAsItWas) {
  std::string old(3 * kChunkSize, '\0');
  for (size_t i = 0; i < old.size(); ++i)
    old[i] = static_cast<char>('a' + (i * 7 + i / 4096) % 26);
  ASSERT_OK(Put(dev_, kFile, old));
  ASSERT_OK(Put(dev_, kFile, "current\n"));
  ASSERT_OK(backend_->engine().Write(
      Durability::kProcess, [&](Txn& t) -> vfs::Status {
        auto n = t.Exec(
            "DELETE FROM blobs WHERE id = (SELECT c.blob FROM chunks c, "
            "versions v WHERE v.path = ? AND v.n = 1 AND c.content = "
            "v.content AND c.seq = 1)",
            {kFile});
        if (!n) return std::unexpected(n.error());
        if (*n != 1) return vfs::Fail(EIO, "no second chunk to remove");
        return {};
      }));
  EXPECT_FALSE(backend_->Restore(dev_, P(kFile), 1).has_value());
  EXPECT_EQ(Get(dev_, kFile), "current\n");
  ASSERT_OK_AND_ASSIGN(auto h, backend_->History(dev_, P(kFile)));
  EXPECT_EQ(h.size(), 2u);
  // The store takes the next commit as usual.
  ASSERT_OK(Put(dev_, kFile, "next\n"));
  EXPECT_EQ(Get(dev_, kFile), "next\n");
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

// A save that writes a new file and renames it over the old one (editors,
// `sed -i`), and a file removed and made again, keep the path's history:
// `history` lists the versions of the files that had the name before, and
// the numbers it showed keep their meaning after each save.
TEST_P(HistoryTest, ASaveByRenameKeepsThePathsHistory) {
  const std::string tmp = "/memories/users/dev/.notes.md.swp";
  auto save = [&](const std::string& data) -> vfs::Status {
    if (auto put = Put(dev_, tmp, data); !put) return put;
    return backend_->Rename(dev_, P(tmp), P(kFile), 0);
  };
  auto numbers = [&](const std::vector<VersionInfo>& h) {
    std::vector<int64_t> out;
    for (const auto& v : h) out.push_back(v.n);
    return out;
  };
  ASSERT_OK(Put(dev_, kFile, "v1\n"));
  ASSERT_OK(Put(dev_, kFile, "v2\n"));
  ASSERT_OK(save("v3\n"));
  ASSERT_OK_AND_ASSIGN(auto h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(numbers(h), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(h[2].deleted) << "the replaced file's end";
  EXPECT_EQ(h[2].path, kFile);
  EXPECT_EQ(h[3].path, tmp) << "the new file was written under its own name";
  EXPECT_EQ(Version(kFile, 1), "v1\n");
  EXPECT_EQ(Version(kFile, 2), "v2\n");
  EXPECT_ERRNO(backend_->OpenVersion(dev_, P(kFile), 3), ENOENT);
  EXPECT_EQ(Version(kFile, 4), "v3\n");
  EXPECT_ERRNO(backend_->OpenVersion(dev_, P(kFile), 5), ENOENT);

  // An edit in place, another save: the numbers shown before still hold.
  ASSERT_OK(Put(dev_, kFile, "v4\n"));
  ASSERT_OK(save("v5\n"));
  ASSERT_OK_AND_ASSIGN(h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(numbers(h), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(Version(kFile, 2), "v2\n");
  EXPECT_EQ(Version(kFile, 5), "v4\n");
  EXPECT_EQ(Version(kFile, 7), "v5\n");
  EXPECT_EQ(CurrentHash(kFile), h.back().content_hash);

  // Restoring a version of a replaced file writes it over the current one.
  ASSERT_OK_AND_ASSIGN(auto v, backend_->Restore(dev_, P(kFile), 1));
  EXPECT_EQ(v.n, 8);
  EXPECT_EQ(Get(dev_, kFile), "v1\n");

  // Removed and made again: the history goes on at the path.
  ASSERT_OK(backend_->Unlink(dev_, P(kFile)));
  ASSERT_OK(Put(dev_, kFile, "fresh\n"));
  ASSERT_OK_AND_ASSIGN(h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(h.size(), 10u);
  EXPECT_TRUE(h[8].deleted);
  EXPECT_EQ(h[9].n, 10);
  EXPECT_EQ(Version(kFile, 10), "fresh\n");

  // A file that moves away takes its own history with it; what was at the
  // path before it stays there, and a restore there brings back the last
  // file that was deleted there.
  const std::string moved = "/memories/users/dev/moved.md";
  ASSERT_OK(backend_->Rename(dev_, P(kFile), P(moved), 0));
  ASSERT_OK_AND_ASSIGN(auto away, backend_->History(dev_, P(moved)));
  ASSERT_EQ(away.size(), 1u);
  EXPECT_EQ(away[0].n, 1);
  ASSERT_OK_AND_ASSIGN(h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(numbers(h), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  ASSERT_OK_AND_ASSIGN(v, backend_->Restore(dev_, P(kFile), 2));
  EXPECT_EQ(v.n, 10);
  EXPECT_EQ(Get(dev_, kFile), "v2\n");
  EXPECT_EQ(Get(dev_, moved), "fresh\n");

  // Nobody else sees any of it; another user's file replaced at a path
  // they share is not mixed in either.
  auto ops = fixture_->CallerFor("ops");
  EXPECT_ERRNO(backend_->History(ops, P(kFile)), ENOENT);
  EXPECT_ERRNO(backend_->OpenVersion(ops, P(kFile), 1), ENOENT);

  // A purge that keeps the current content erases the earlier files too.
  ASSERT_OK(backend_->Purge(admin_, P(kFile), true));
  ASSERT_OK_AND_ASSIGN(h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(Version(kFile, h[0].n), "v2\n");
  EXPECT_ERRNO(backend_->OpenVersion(dev_, P(kFile), 1), ENOENT);
}

// A file with two names is committed under the one written through: the
// history says which, and the write is checked against that name's grants.
TEST_P(HistoryTest, AVersionOfAHardLinkedFileNamesTheNameWrittenThrough) {
  const std::string other = "/memories/users/dev/linked.md";
  ASSERT_OK(Put(dev_, kFile, "one\n"));
  ASSERT_OK(backend_->Link(dev_, P(kFile), P(other)));
  ASSERT_OK(Put(dev_, other, "two\n"));
  ASSERT_OK(Put(dev_, kFile, "three\n"));
  ASSERT_OK(Put(dev_, other, "four\n"));
  ASSERT_OK_AND_ASSIGN(auto h, backend_->History(dev_, P(kFile)));
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(h[0].path, kFile);
  EXPECT_EQ(h[1].path, other);
  EXPECT_EQ(h[2].path, kFile);
  EXPECT_EQ(h[3].path, other);
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

TEST_P(HistoryTest, SmallContentsAreKeptInlineInTheirRow) {
  const std::string dir = "/memories/users/dev/";
  std::string small(4096, '\0');
  for (size_t i = 0; i < small.size(); ++i)
    small[i] = static_cast<char>('a' + i % 23);
  const std::string at_limit(64 * 1024, 'L');
  const std::string over_limit(64 * 1024 + 1, 'O');
  const std::string zeros(8192, '\0');
  int64_t blobs_before = Count("SELECT COUNT(*) FROM blobs");
  ASSERT_OK(Put(dev_, dir + "small", small));
  ASSERT_OK(Put(dev_, dir + "at-limit", at_limit));
  ASSERT_OK(Put(dev_, dir + "over-limit", over_limit));
  ASSERT_OK(Put(dev_, dir + "zeros", zeros));
  ASSERT_OK(Put(dev_, dir + "empty", ""));
  auto inline_rows = [&](const std::string& name) {
    return Count("SELECT COUNT(*) FROM contents WHERE hash = '" +
                 CurrentHash(dir + name) + "' AND inline_id IS NOT NULL");
  };
  auto chunk_rows = [&](const std::string& name) {
    return Count("SELECT COUNT(*) FROM chunks WHERE content = '" +
                 CurrentHash(dir + name) + "'");
  };
  EXPECT_EQ(inline_rows("small"), 1);
  EXPECT_EQ(chunk_rows("small"), 0);
  EXPECT_EQ(inline_rows("at-limit"), 1);
  EXPECT_EQ(chunk_rows("at-limit"), 0);
  EXPECT_EQ(inline_rows("over-limit"), 0);
  EXPECT_EQ(chunk_rows("over-limit"), 1);
  EXPECT_EQ(inline_rows("zeros"), 0) << "a hole stays stored as nothing";
  EXPECT_EQ(Count("SELECT COUNT(*) FROM blobs WHERE size = 8192"), 0);
  EXPECT_EQ(inline_rows("empty"), 0);
  EXPECT_EQ(Count("SELECT COUNT(*) FROM blobs"), blobs_before + 1)
      << "only over-limit has a blob";

  EXPECT_EQ(Get(dev_, dir + "small"), small);
  EXPECT_EQ(Get(dev_, dir + "at-limit"), at_limit);
  EXPECT_EQ(Get(dev_, dir + "over-limit"), over_limit);
  EXPECT_EQ(Get(dev_, dir + "zeros"), zeros);
  EXPECT_EQ(Get(dev_, dir + "empty"), "");
  {  // reads at any offset, and past the end
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend_->Open(dev_, P(dir + "small"), O_RDONLY, 0));
    std::string buf(200, '\0');
    ASSERT_OK_AND_ASSIGN(size_t n, f->Read(buf.data(), buf.size(), 4000));
    EXPECT_EQ(std::string(buf.data(), n), small.substr(4000));
    ASSERT_OK_AND_ASSIGN(n, f->Read(buf.data(), buf.size(), 4096));
    EXPECT_EQ(n, 0u);
    ASSERT_OK_AND_ASSIGN(n, f->Read(buf.data(), 10, 7));
    EXPECT_EQ(std::string(buf.data(), n), small.substr(7, 10));
  }

  // Equal bytes are one row with two references.
  ASSERT_OK(Put(dev_, dir + "small-too", small));
  EXPECT_EQ(CurrentHash(dir + "small-too"), CurrentHash(dir + "small"));
  EXPECT_EQ(Count("SELECT refs FROM contents WHERE hash = '" +
                  CurrentHash(dir + "small") + "'"),
            2);

  // Writing into an inline file starts from its bytes; growing past the
  // limit moves the new version to chunks while the old stays inline.
  {
    ASSERT_OK_AND_ASSIGN(
        auto f, backend_->Open(dev_, P(dir + "at-limit"), O_WRONLY, 0));
    ASSERT_OK_AND_ASSIGN(size_t n, f->Write("++", 2, at_limit.size()));
    EXPECT_EQ(n, 2u);
    ASSERT_OK(f->Flush());
  }
  EXPECT_EQ(Get(dev_, dir + "at-limit"), at_limit + "++");
  EXPECT_EQ(inline_rows("at-limit"), 0);
  EXPECT_EQ(chunk_rows("at-limit"), 1);
  EXPECT_EQ(Version(dir + "at-limit", 1), at_limit);
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend_->Open(dev_, P(dir + "small"), O_RDWR, 0));
    ASSERT_OK_AND_ASSIGN(size_t n, f->Write("XY", 2, 10));
    EXPECT_EQ(n, 2u);
    ASSERT_OK(f->Flush());
  }
  std::string changed = small;
  changed.replace(10, 2, "XY");
  EXPECT_EQ(Get(dev_, dir + "small"), changed);
  EXPECT_EQ(inline_rows("small"), 1);
  EXPECT_EQ(Get(dev_, dir + "small-too"), small);

  // Restoring an inline version brings its bytes back.
  ASSERT_OK(backend_->Restore(dev_, P(dir + "small"), 1));
  EXPECT_EQ(Get(dev_, dir + "small"), small);
}

TEST_P(HistoryTest, PurgeErasesContentThatSeveralVersionsShared) {
  // Versions 1 and 3 hold the same bytes: two references to one content.
  const std::string secret = "SECRET-" + std::string(500, 'r') + "-END";
  ASSERT_OK(Put(dev_, kFile, secret));
  ASSERT_OK(Put(dev_, kFile, "between\n"));
  ASSERT_OK(Put(dev_, kFile, secret));
  std::string hash = CurrentHash(kFile);
  ASSERT_OK(Put(dev_, kFile, "kept\n"));
  ASSERT_OK_AND_ASSIGN(auto report, backend_->Purge(admin_, P(kFile), true));
  EXPECT_EQ(report.versions, 3);
  EXPECT_EQ(Count("SELECT COUNT(*) FROM contents WHERE hash = '" + hash + "'"),
            0)
      << "a content that two purged versions held is still stored";
  std::string where;
  EXPECT_EQ(StoreBytes(&where).find("SECRET-"), std::string::npos)
      << "purged content is still in the database files: " << where;
  EXPECT_EQ(Get(dev_, kFile), "kept\n");
}

TEST_P(HistoryTest, ConcurrentFirstReadsOfOneHandleAgree) {
  std::string small(5000, '\0'), big((1 << 20) + 4096, '\0');
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<char>(i * 7);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 13);
  ASSERT_OK(Put(dev_, "/memories/users/dev/small", small));
  ASSERT_OK(Put(dev_, "/memories/users/dev/big", big));
  for (const auto& [name, want] :
       {std::pair{std::string("small"), small}, {std::string("big"), big}}) {
    for (int round = 0; round < 20; ++round) {
      ASSERT_OK_AND_ASSIGN(
          auto f,
          backend_->Open(dev_, P("/memories/users/dev/" + name), O_RDONLY, 0));
      std::vector<std::thread> readers;
      std::atomic<int> wrong{0};
      for (int t = 0; t < 6; ++t) {
        readers.emplace_back([&, t] {
          size_t off = (want.size() / 6) * static_cast<size_t>(t);
          std::string buf(700, '\0');
          auto n = f->Read(buf.data(), buf.size(), static_cast<off_t>(off));
          if (!n || std::string(buf.data(), *n) != want.substr(off, 700))
            ++wrong;
        });
      }
      for (auto& r : readers) r.join();
      EXPECT_EQ(wrong.load(), 0) << name << ", round " << round;
    }
  }
}

TEST_P(HistoryTest, PurgeErasesInlineBytesThatSpanSeveralPages) {
  // Larger than a database page: the row's bytes continue on overflow
  // pages (SQLite) or in the TOAST table (PostgreSQL).
  std::string secret = "SECRET-";
  for (int i = 0; secret.size() < 40 * 1024; ++i)
    secret += std::to_string(i) + ",";
  secret += "-END";
  ASSERT_OK(Put(dev_, kFile, secret));
  ASSERT_OK(Put(dev_, kFile, "kept\n"));
  backend_.reset();
  backend_ = fixture_->OpenBackend();
  ASSERT_NE(backend_, nullptr);
  ASSERT_NE(StoreBytes().find(secret.substr(1000, 200)), std::string::npos)
      << "test setup: secret stored";
  ASSERT_OK_AND_ASSIGN(auto report, backend_->Purge(admin_, P(kFile), true));
  EXPECT_EQ(report.versions, 1);
  EXPECT_EQ(report.blobs, 1);
  EXPECT_EQ(report.bytes, static_cast<int64_t>(secret.size()));
  std::string where;
  std::string db = StoreBytes(&where);
  EXPECT_EQ(db.find("SECRET-"), std::string::npos)
      << "purged content is still in the database files: " << where;
  EXPECT_EQ(db.find(secret.substr(20000, 100)), std::string::npos)
      << "the middle of purged content is still in the database files";
  EXPECT_EQ(Get(dev_, kFile), "kept\n");
}

// A store written before contents could be inline (schema 3): every
// content is in chunks. Upgraded, it reads as before, and new commits of
// the same bytes share the old rows.
class OldLayoutTest : public HistoryTest {
 protected:
  // Turns the store back into schema 3: each inline content becomes one
  // chunk and one blob, as the old code stored it, and the column goes.
  // Opens the backend again (migrating the store) when `reopen`.
  void Downgrade(bool reopen = true) {
    backend_.reset();
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(fixture_->db().c_str(), &db), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db,
                                 "SELECT c.hash, i.data FROM contents c JOIN "
                                 "inline_bytes i ON i.id = c.inline_id",
                                 -1, &st, nullptr),
              SQLITE_OK);
    std::vector<std::pair<std::string, std::string>> inline_rows;
    while (sqlite3_step(st) == SQLITE_ROW) {
      inline_rows.emplace_back(
          reinterpret_cast<const char*>(sqlite3_column_text(st, 0)),
          std::string(static_cast<const char*>(sqlite3_column_blob(st, 1)),
                      static_cast<size_t>(sqlite3_column_bytes(st, 1))));
    }
    sqlite3_finalize(st);
    ASSERT_FALSE(inline_rows.empty());
    ASSERT_EQ(Sql(db, "BEGIN"), "");
    for (const auto& [hash, data] : inline_rows) {
      ASSERT_EQ(sqlite3_prepare_v2(db,
                                   "INSERT INTO blobs(hash, size, refs, data) "
                                   "VALUES(?, ?, 1, ?)",
                                   -1, &st, nullptr),
                SQLITE_OK);
      std::string chunk_hash = Sha256Hex(data);
      sqlite3_bind_text(st, 1, chunk_hash.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(st, 2, static_cast<sqlite3_int64>(data.size()));
      sqlite3_bind_blob(st, 3, data.data(), static_cast<int>(data.size()),
                        SQLITE_TRANSIENT);
      ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
      sqlite3_finalize(st);
      ASSERT_EQ(Sql(db, "INSERT INTO chunks(content, seq, blob) VALUES('" +
                            hash + "', 0, last_insert_rowid())"),
                "");
    }
    ASSERT_EQ(Sql(db, "COMMIT"), "");
    ASSERT_EQ(Sql(db, "ALTER TABLE contents DROP COLUMN inline_id"), "");
    ASSERT_EQ(Sql(db, "DROP TABLE inline_bytes"), "");
    ASSERT_EQ(Sql(db, "PRAGMA user_version=3"), "");
    sqlite3_close(db);
    if (!reopen) return;
    backend_ = fixture_->OpenBackend();
    ASSERT_NE(backend_, nullptr);
  }
};

TEST_P(OldLayoutTest, ChunkedSmallContentsReadAndAreSharedAfterTheUpgrade) {
  const std::string old_bytes = "written before contents were inline\n";
  ASSERT_OK(Put(dev_, kFile, old_bytes));
  ASSERT_NO_FATAL_FAILURE(Downgrade());
  EXPECT_EQ(Count("SELECT COUNT(*) FROM contents WHERE inline_id IS NOT NULL"),
            0)
      << "the upgrade converts nothing";
  std::string hash = CurrentHash(kFile);
  EXPECT_EQ(Count("SELECT COUNT(*) FROM chunks WHERE content = '" + hash + "'"),
            1);

  EXPECT_EQ(Get(dev_, kFile), old_bytes);
  EXPECT_EQ(Version(kFile, 1), old_bytes);
  // The same bytes again: one more reference to the chunked row.
  ASSERT_OK(Put(dev_, "/memories/users/dev/copy.md", old_bytes));
  EXPECT_EQ(CurrentHash("/memories/users/dev/copy.md"), hash);
  EXPECT_EQ(Count("SELECT refs FROM contents WHERE hash = '" + hash + "'"), 2);
  EXPECT_EQ(Get(dev_, "/memories/users/dev/copy.md"), old_bytes);
  // An append starts from the chunked bytes; the new version is inline.
  ASSERT_OK(Put(dev_, kFile, "more\n", O_WRONLY | O_APPEND));
  EXPECT_EQ(Get(dev_, kFile), old_bytes + "more\n");
  EXPECT_EQ(Count("SELECT COUNT(*) FROM contents WHERE hash = '" +
                  CurrentHash(kFile) + "' AND inline_id IS NOT NULL"),
            1);
  // Purging the old version leaves the copy whole; purging both frees the
  // chunk and its blob.
  ASSERT_OK(backend_->Purge(admin_, P(kFile), false));
  EXPECT_EQ(Get(dev_, "/memories/users/dev/copy.md"), old_bytes);
  ASSERT_OK_AND_ASSIGN(
      auto report,
      backend_->Purge(admin_, P("/memories/users/dev/copy.md"), false));
  EXPECT_EQ(report.blobs, 1);
  EXPECT_EQ(Count("SELECT COUNT(*) FROM chunks WHERE content = '" + hash + "'"),
            0);
  EXPECT_EQ(Count("SELECT COUNT(*) FROM blobs WHERE size = " +
                  std::to_string(old_bytes.size())),
            0);
}

TEST_P(OldLayoutTest, TheUpgradeWaitsUntilNoOtherProcessHasTheStoreOpen) {
  ASSERT_OK(Put(dev_, kFile, "before the upgrade\n"));
  ASSERT_NO_FATAL_FAILURE(Downgrade(/*reopen=*/false));
  // Another process with the store open, as an older agentvfs would have.
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(ready[0]);
    close(done[1]);
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(fixture_->db().c_str(), &db, SQLITE_OPEN_READWRITE,
                        nullptr) != SQLITE_OK ||
        sqlite3_exec(db, "SELECT COUNT(*) FROM inodes", nullptr, nullptr,
                     nullptr) != SQLITE_OK) {
      _exit(2);
    }
    (void)!write(ready[1], "r", 1);
    char byte;
    while (read(done[0], &byte, 1) < 0 && errno == EINTR) {
    }
    sqlite3_close(db);
    _exit(0);
  }
  close(ready[1]);
  close(done[0]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1)
      << "the other process did not open the store";
  auto refused = Engine::Open(fixture_->db(), false);
  close(done[1]);  // the other process closes the store and ends
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_FALSE(refused.has_value())
      << "upgraded while another process had it open";
  EXPECT_EQ(refused.error().code, EBUSY);
  EXPECT_NE(refused.error().message.find(std::to_string(pid)),
            std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("nothing was changed"),
            std::string::npos)
      << refused.error().message;
  // Alone, the upgrade goes through.
  backend_ = fixture_->OpenBackend();
  ASSERT_NE(backend_, nullptr);
  EXPECT_GE(backend_->engine().SchemaVersion(), 4);
  EXPECT_EQ(Get(dev_, kFile), "before the upgrade\n");
}

INSTANTIATE_TEST_SUITE_P(Sqlite, OldLayoutTest,
                         ::testing::Values(testing::StoreEngine::kSqlite),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

// PostgreSQL keeps a deleted row in a table's rewrite while another
// session's snapshot may still see it; a purge must wait that out.
class PgPurgeTest : public HistoryTest {};

TEST_P(PgPurgeTest, PurgeWaitsForAnotherSessionsSnapshotThenErasesInlineBytes) {
  // Bytes over about 2 KiB go to the TOAST table, smaller ones stay in the
  // table's own pages: one secret of each.
  const std::string toasted = "SECRET-" + std::string(3000, 's') + "-END";
  const std::string in_heap = "SECRET-" + std::string(500, 'h') + "-END";
  ASSERT_OK(Put(dev_, kFile, toasted));
  ASSERT_OK(Put(dev_, kFile, in_heap));
  ASSERT_OK(Put(dev_, kFile, "kept\n"));
  ASSERT_OK_AND_ASSIGN(auto other, Engine::Open(fixture_->db(), false));
  std::promise<void> reading;
  auto reader = std::async(std::launch::async, [&] {
    return other->Read([&](Txn& t) -> vfs::Status {
      // The snapshot is taken by the first statement, before the purge.
      // (Not of a table with bytes: its lock would make the rewrite wait.)
      auto rows = t.Query("SELECT COUNT(*) FROM inodes");
      if (!rows) return std::unexpected(rows.error());
      reading.set_value();
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return {};
    });
  });
  reading.get_future().wait();
  std::string before = StoreBytes();
  ASSERT_NE(before.find(toasted.substr(0, 200)), std::string::npos)
      << "test setup: the large secret is stored";
  ASSERT_NE(before.find(in_heap.substr(0, 200)), std::string::npos)
      << "test setup: the small secret is stored";
  ASSERT_OK(backend_->Purge(admin_, P(kFile), true));
  EXPECT_OK(reader.get());
  std::string where;
  std::string db = StoreBytes(&where);
  EXPECT_EQ(db.find("SECRET-"), std::string::npos)
      << "purged content is still in the database files: " << where;
  EXPECT_EQ(Get(dev_, kFile), "kept\n");
}

// The same upgrade on PostgreSQL: refused while another agentvfs session
// is connected, done once it is gone.
class PgUpgradeTest : public HistoryTest {
 protected:
  // agentvfs sessions connected to the store's database.
  int64_t AgentvfsSessions() {
    auto n = testing::PgQuery(
        fixture_->db(),
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = "
        "current_database() AND application_name = 'agentvfs'");
    return n ? std::atoll(n->c_str()) : -1;
  }
  // Waits (up to 10 s) until `n` agentvfs sessions are connected.
  bool AwaitSessions(int64_t n) {
    for (int i = 0; i < 200; ++i) {
      if (AgentvfsSessions() == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
};

TEST_P(PgUpgradeTest, TheUpgradeWaitsUntilNoOtherAgentvfsSessionIsConnected) {
  const std::string bytes = "written at schema 2\n";
  ASSERT_OK(Put(dev_, kFile, bytes));
  backend_.reset();
  // Back to schema 2: the inline content as one chunk and one blob.
  ASSERT_OK(testing::PgQuery(
      fixture_->db(),
      "BEGIN; "
      "INSERT INTO blobs(hash, size, refs, data) "
      "  SELECT encode(sha256(i.data), 'hex'), length(i.data), 1, i.data "
      "  FROM contents c JOIN inline_bytes i ON i.id = c.inline_id; "
      "INSERT INTO chunks(content, seq, blob) "
      "  SELECT c.hash, 0, b.id FROM contents c "
      "  JOIN inline_bytes i ON i.id = c.inline_id "
      "  JOIN blobs b ON b.hash = encode(sha256(i.data), 'hex'); "
      "ALTER TABLE contents DROP COLUMN inline_id; "
      "DROP TABLE inline_bytes; "
      "UPDATE agentvfs_schema SET version = 2; "
      "COMMIT"));
  ASSERT_TRUE(AwaitSessions(0)) << "the closed backend's sessions stayed";
  std::string uri = fixture_->db();
  uri += (uri.find('?') == std::string::npos ? "?" : "&");
  uri += "application_name=agentvfs";
  auto other = std::async(std::launch::async, [uri] {
    return testing::PgQuery(uri, "SELECT pg_sleep(2)");
  });
  ASSERT_TRUE(AwaitSessions(1)) << "the other session did not connect";
  auto refused = Engine::Open(fixture_->db(), false);
  EXPECT_OK(other.get());
  ASSERT_FALSE(refused.has_value())
      << "upgraded while another session was connected";
  EXPECT_EQ(refused.error().code, EBUSY);
  EXPECT_NE(refused.error().message.find("1 other agentvfs session"),
            std::string::npos)
      << refused.error().message;
  ASSERT_TRUE(AwaitSessions(0));
  backend_ = fixture_->OpenBackend();
  ASSERT_NE(backend_, nullptr);
  EXPECT_EQ(Get(dev_, kFile), bytes);
  ASSERT_OK(Put(dev_, "/memories/users/dev/copy.md", bytes));
  EXPECT_EQ(Count("SELECT refs FROM contents WHERE hash = '" +
                  CurrentHash(kFile) + "'"),
            2);
  EXPECT_EQ(Get(dev_, "/memories/users/dev/copy.md"), bytes);
}

INSTANTIATE_TEST_SUITE_P(Postgres, PgUpgradeTest,
                         ::testing::Values(testing::StoreEngine::kPostgres),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

INSTANTIATE_TEST_SUITE_P(Postgres, PgPurgeTest,
                         ::testing::Values(testing::StoreEngine::kPostgres),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

INSTANTIATE_TEST_SUITE_P(Engines, HistoryTest,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

}  // namespace
}  // namespace agentvfs::store
