// The log-gathering VFS (backends/store/sqlite_log_vfs.h): a transaction's
// log frames reach the file in far fewer writes than SQLite asks for, every
// commit is visible to another connection (on the default VFS) as soon as
// it returns, transactions bigger than one gathered write and transactions
// that spill and rewrite frames come out whole, and the file stays a plain
// SQLite database.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

#include "backends/store/sqlite_log_vfs.h"
#include "tests/support/mount_fixture.h"

namespace agentvfs::store {
namespace {

using testing::TempDir;

class LogVfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(LogGatheringVfs(), nullptr);
    path_ = dir_.Sub("t.db");
    ASSERT_EQ(sqlite3_open_v2(path_.c_str(), &writer_,
                              SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                              LogGatheringVfs()),
              SQLITE_OK);
    Exec(writer_,
         "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
         "CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB NOT NULL);");
    // The other connection uses SQLite's own VFS.
    ASSERT_EQ(
        sqlite3_open_v2(path_.c_str(), &reader_, SQLITE_OPEN_READONLY, nullptr),
        SQLITE_OK);
  }
  void TearDown() override {
    sqlite3_close(reader_);
    sqlite3_close(writer_);
  }

  static void Exec(sqlite3* db, const std::string& sql) {
    char* err = nullptr;
    int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    ASSERT_EQ(rc, SQLITE_OK) << sql << ": " << (err ? err : "");
    sqlite3_free(err);
  }
  static std::string Scalar(sqlite3* db, const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db);
    std::string out = "(no row)";
    if (sqlite3_step(st) == SQLITE_ROW) {
      auto* text = sqlite3_column_text(st, 0);
      out = text ? reinterpret_cast<const char*>(text) : "NULL";
    }
    sqlite3_finalize(st);
    return out;
  }
  // count and total length of the rows, as the reader sees them now.
  std::string ReaderSees() {
    return Scalar(reader_, "SELECT count(*) || '/' || total(length(v)) FROM t");
  }

  TempDir dir_{"agentvfs-logvfs"};
  std::string path_;
  sqlite3* writer_ = nullptr;
  sqlite3* reader_ = nullptr;
};

TEST_F(LogVfsTest, SmallCommitsAreGatheredAndSeenAtOnce) {
  LogVfsStats before = LogGatheringVfsStats();
  constexpr int kCommits = 50;
  for (int i = 0; i < kCommits; ++i) {
    // Three rows of 3,000 bytes: several pages, so several frames.
    Exec(writer_, "BEGIN");
    for (int j = 0; j < 3; ++j) {
      Exec(writer_, "INSERT INTO t(v) VALUES(randomblob(3000))");
    }
    Exec(writer_, "COMMIT");
    ASSERT_EQ(ReaderSees(), std::to_string(3 * (i + 1)) + "/" +
                                std::to_string(9000 * (i + 1)) + ".0")
        << "after commit " << i;
  }
  LogVfsStats after = LogGatheringVfsStats();
  uint64_t asked = after.log_writes_asked - before.log_writes_asked;
  uint64_t issued = after.log_writes_issued - before.log_writes_issued;
  // Two writes per frame asked (header, page), at least four frames per
  // commit; one write per commit issued.
  EXPECT_GE(asked, 8u * kCommits);
  EXPECT_LE(issued, uint64_t{kCommits} + 1);
  EXPECT_EQ(Scalar(reader_, "PRAGMA integrity_check"), "ok");
}

TEST_F(LogVfsTest, BigAndSpillingTransactionsComeOutWhole) {
  // 1 MiB in one transaction: far more log than one gathered write.
  LogVfsStats before = LogGatheringVfsStats();
  Exec(writer_, "INSERT INTO t(k, v) VALUES(1, zeroblob(1048576))");
  LogVfsStats after = LogGatheringVfsStats();
  EXPECT_GE(after.log_writes_issued - before.log_writes_issued,
            (1u << 20) / kMaxGathered);
  EXPECT_EQ(ReaderSees(), "1/1048576.0");

  // A transaction bigger than the page cache: SQLite spills frames to the
  // log before the commit and rewrites pages already in it.
  Exec(writer_, "PRAGMA cache_size=8");
  Exec(writer_, "BEGIN");
  for (int i = 0; i < 2000; ++i) {
    Exec(writer_, "INSERT INTO t(k, v) VALUES(" + std::to_string(100 + i) +
                      ", randomblob(100))");
  }
  Exec(writer_, "UPDATE t SET v = zeroblob(150) WHERE k >= 100");
  Exec(writer_, "UPDATE t SET v = zeroblob(120) WHERE k >= 100 AND k % 2 = 0");
  Exec(writer_, "COMMIT");
  EXPECT_EQ(ReaderSees(),
            "2001/" + std::to_string(1048576 + 1000 * 150 + 1000 * 120) + ".0");
  EXPECT_EQ(Scalar(reader_, "PRAGMA integrity_check"), "ok");

  // A rolled-back transaction leaves nothing a reader can see.
  Exec(writer_, "BEGIN");
  Exec(writer_, "DELETE FROM t");
  Exec(writer_, "ROLLBACK");
  EXPECT_EQ(Scalar(reader_, "SELECT count(*) FROM t"), "2001");

  // Checkpointed and reopened with the default VFS: a plain database.
  Exec(writer_, "PRAGMA wal_checkpoint(TRUNCATE)");
  sqlite3_close(reader_);
  sqlite3_close(writer_);
  writer_ = nullptr;
  ASSERT_EQ(
      sqlite3_open_v2(path_.c_str(), &reader_, SQLITE_OPEN_READONLY, nullptr),
      SQLITE_OK);
  EXPECT_EQ(Scalar(reader_, "PRAGMA integrity_check"), "ok");
  EXPECT_EQ(Scalar(reader_, "SELECT total(length(v)) FROM t"),
            std::to_string(1048576 + 1000 * 150 + 1000 * 120) + ".0");
}

// Frames a transaction spilled and then rolled back must never reach the
// file later: by then another writer may have put its committed frames at
// the same offsets.
TEST_F(LogVfsTest, RolledBackFramesNeverOverwriteAnotherWritersCommit) {
  sqlite3* other = nullptr;  // a second writer, on SQLite's own VFS
  ASSERT_EQ(
      sqlite3_open_v2(path_.c_str(), &other, SQLITE_OPEN_READWRITE, nullptr),
      SQLITE_OK);
  Exec(other, "PRAGMA synchronous=NORMAL");
  Exec(writer_, "PRAGMA cache_size=8");
  constexpr int64_t kOtherBytes = 2 << 20;
  for (int round = 0; round < 5; ++round) {
    Exec(writer_, "BEGIN");
    for (int i = 0; i < 300; ++i) {
      Exec(writer_, "INSERT INTO t(v) VALUES(randomblob(700))");
    }
    Exec(writer_, "ROLLBACK");
    // More log than the spill wrote, at the same offsets.
    Exec(other, "INSERT INTO t(v) VALUES(zeroblob(" +
                    std::to_string(kOtherBytes + round * 4096) + "))");
    // Reads and writes of the first connection pass its barriers, flushes
    // and syncs.
    EXPECT_EQ(Scalar(writer_, "SELECT count(*) FROM t"),
              std::to_string(round + 1));
    Exec(writer_, "INSERT INTO t(v) VALUES(x'01')");
    Exec(writer_, "DELETE FROM t WHERE v = x'01'");
  }
  sqlite3_close(other);
  int64_t want = 0;
  for (int round = 0; round < 5; ++round) want += kOtherBytes + round * 4096;
  EXPECT_EQ(Scalar(reader_, "SELECT total(length(v)) FROM t"),
            std::to_string(want) + ".0");
  EXPECT_EQ(
      Scalar(reader_, "SELECT count(*) FROM t WHERE v <> zeroblob(length(v))"),
      "0");
  EXPECT_EQ(Scalar(reader_, "PRAGMA integrity_check"), "ok");
}

TEST_F(LogVfsTest, FullSynchronousCommitsToo) {
  Exec(writer_, "PRAGMA synchronous=FULL");
  for (int i = 0; i < 20; ++i) {
    Exec(writer_, "INSERT INTO t(v) VALUES(randomblob(5000))");
    ASSERT_EQ(ReaderSees(), std::to_string(i + 1) + "/" +
                                std::to_string(5000 * (i + 1)) + ".0");
  }
  EXPECT_EQ(Scalar(reader_, "PRAGMA integrity_check"), "ok");
}

}  // namespace
}  // namespace agentvfs::store
