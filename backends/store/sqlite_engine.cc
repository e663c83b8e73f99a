// The embedded engine: one SQLite database file in WAL mode. One connection
// writes (writers in other processes queue on SQLite's lock through the busy
// timeout); a few more connections read, so that a reader never waits behind
// a writer's fsync. The schema lives here as numbered migrations, each run in
// its own transaction and recorded in PRAGMA user_version.
#include "backends/store/sqlite_engine.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "backends/store/engine.h"
#include "backends/store/namespace.h"
#include "backends/store/reader_pool.h"
#include "backends/store/sqlite_log_vfs.h"
#include "spdlog/spdlog.h"

namespace agentvfs::store {
namespace {

// Migrations in order; index + 1 is the schema version each one produces.
// Never edit a released migration: add a new one.
constexpr std::array<std::string_view, 4> kMigrations = {
    R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE inodes(
  ino INTEGER PRIMARY KEY AUTOINCREMENT,
  kind INTEGER NOT NULL,
  mode INTEGER NOT NULL,
  uid INTEGER NOT NULL,
  gid INTEGER NOT NULL,
  nlink INTEGER NOT NULL,
  size INTEGER NOT NULL,
  blocks INTEGER NOT NULL DEFAULT 0,
  atime_ns INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  ctime_ns INTEGER NOT NULL,
  version INTEGER NOT NULL DEFAULT 0,
  content TEXT,
  target TEXT,
  deleted_ns INTEGER);
CREATE TABLE dentries(
  parent INTEGER NOT NULL,
  name TEXT NOT NULL,
  ino INTEGER NOT NULL,
  PRIMARY KEY(parent, name)) WITHOUT ROWID;
CREATE INDEX dentries_ino ON dentries(ino);
CREATE TABLE versions(
  ino INTEGER NOT NULL,
  n INTEGER NOT NULL,
  path TEXT NOT NULL,
  author TEXT NOT NULL,
  session TEXT NOT NULL,
  time_ns INTEGER NOT NULL,
  size INTEGER NOT NULL,
  content TEXT,
  mode INTEGER NOT NULL,
  deleted INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY(ino, n)) WITHOUT ROWID;
CREATE INDEX versions_path ON versions(path, time_ns);
CREATE TABLE contents(
  hash TEXT PRIMARY KEY,
  size INTEGER NOT NULL,
  chunks INTEGER NOT NULL,
  refs INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE blobs(
  id INTEGER PRIMARY KEY,
  hash TEXT NOT NULL UNIQUE,
  size INTEGER NOT NULL,
  refs INTEGER NOT NULL,
  data BLOB NOT NULL);
CREATE TABLE chunks(
  content TEXT NOT NULL,
  seq INTEGER NOT NULL,
  blob INTEGER NOT NULL,
  PRIMARY KEY(content, seq)) WITHOUT ROWID;
CREATE TABLE users(
  name TEXT PRIMARY KEY,
  token_hash TEXT NOT NULL UNIQUE,
  disabled INTEGER NOT NULL DEFAULT 0,
  created_ns INTEGER NOT NULL);
CREATE TABLE teams(name TEXT PRIMARY KEY);
CREATE TABLE members(
  team TEXT NOT NULL,
  user TEXT NOT NULL,
  PRIMARY KEY(team, user)) WITHOUT ROWID;
CREATE TABLE grants(
  prefix TEXT NOT NULL,
  subject_kind TEXT NOT NULL,
  subject TEXT NOT NULL,
  level INTEGER NOT NULL,
  PRIMARY KEY(prefix, subject_kind, subject)) WITHOUT ROWID;
CREATE TABLE leases(
  ino INTEGER PRIMARY KEY,
  session TEXT NOT NULL,
  user TEXT NOT NULL,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  pid_start INTEGER NOT NULL,
  expires_ns INTEGER NOT NULL);
CREATE TABLE changes(
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  path TEXT NOT NULL,
  session TEXT NOT NULL,
  origin TEXT NOT NULL,
  time_ns INTEGER NOT NULL);
INSERT INTO inodes(ino, kind, mode, uid, gid, nlink, size, atime_ns, mtime_ns,
                   ctime_ns)
  VALUES(1, 16384, 493, 0, 0, 2, 0, 0, 0, 0);
)sql",
    // 2: the harness's durable sessions: one row per session with its
    // totals, and its events in order (each appended in its own commit).
    R"sql(
CREATE TABLE sessions(
  id TEXT PRIMARY KEY,
  user TEXT NOT NULL,
  created_ns INTEGER NOT NULL,
  updated_ns INTEGER NOT NULL,
  state TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  task TEXT NOT NULL,
  config TEXT NOT NULL,
  steps INTEGER NOT NULL DEFAULT 0,
  input_tokens INTEGER NOT NULL DEFAULT 0,
  output_tokens INTEGER NOT NULL DEFAULT 0,
  cost_micros INTEGER NOT NULL DEFAULT 0,
  elapsed_ms INTEGER NOT NULL DEFAULT 0);
CREATE INDEX sessions_by_user ON sessions(user, created_ns);
CREATE TABLE events(
  session TEXT NOT NULL,
  seq INTEGER NOT NULL,
  time_ns INTEGER NOT NULL,
  kind TEXT NOT NULL,
  data TEXT NOT NULL,
  PRIMARY KEY(session, seq));
)sql",
    // 3: the directory generation (namespace.h, DirCache): bumped by the
    // schema itself whenever a directory's entry is removed or changed, so
    // that every writer of the file keeps it, whatever its code.
    R"sql(
INSERT INTO meta(key, value) VALUES('dirgen', '0')
  ON CONFLICT(key) DO NOTHING;
CREATE TRIGGER dentries_dir_removed AFTER DELETE ON dentries
  WHEN (SELECT kind FROM inodes WHERE ino = OLD.ino) = 16384
BEGIN
  INSERT INTO meta(key, value) VALUES('dirgen', '1')
    ON CONFLICT(key) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT);
END;
CREATE TRIGGER dentries_dir_changed AFTER UPDATE ON dentries
  WHEN (SELECT kind FROM inodes WHERE ino = OLD.ino) = 16384
    OR (SELECT kind FROM inodes WHERE ino = NEW.ino) = 16384
BEGIN
  INSERT INTO meta(key, value) VALUES('dirgen', '1')
    ON CONFLICT(key) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT);
END;
)sql",
    // 4: small contents inline. A content whose `inline_id` is not NULL is
    // exactly the bytes of that `inline_bytes` row (one chunk, no `chunks`
    // or `blobs` rows); the others are as before. The bytes are in a rowid
    // table of their own so that `contents` keeps small rows (it is keyed
    // by random hashes, and a WITHOUT ROWID table keeps whole rows in its
    // interior pages).
    R"sql(
CREATE TABLE inline_bytes(
  id INTEGER PRIMARY KEY,
  data BLOB NOT NULL);
ALTER TABLE contents ADD COLUMN inline_id INTEGER;
)sql",
};

// From this schema on, stored data reads differently: an older agentvfs
// still running on the store would misread it (migration 4: an inline
// content looks purged to it). So the migration to it waits until no other
// process has the store open.
constexpr int kLayoutChange = 4;

constexpr size_t kReaders = 4;
constexpr int kBusyTimeoutMs = 30'000;

// Processes other than this one that have the database at `path` open.
// Every SQLite connection in WAL mode holds a shared lock on byte 128 of
// the -shm file (os_unix.c: UNIX_SHM_DMS) for as long as it is open. They
// are read from /proc/locks: opening and closing the -shm file here would
// drop this process's own POSIX locks on it. Locks are matched by inode
// number only, since /proc/locks names the filesystem's device where stat
// may give another (btrfs subvolumes). A holder in another PID namespace
// shows as pid 0.
std::vector<pid_t> OtherProcessesWithOpen(const std::string& path) {
  std::vector<pid_t> out;
  struct stat st;
  if (::stat((path + "-shm").c_str(), &st) != 0) return out;
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    // "1: POSIX  ADVISORY  READ 1234 fd:01:5678 128 128" (waiters: "1: ->")
    std::istringstream in(line);
    std::string id, kind, mode, type, file, start, end;
    long pid = 0;
    if (!(in >> id >> kind >> mode >> type >> pid >> file >> start >> end)) {
      continue;
    }
    if (kind != "POSIX" || pid < 0 || pid == ::getpid()) continue;
    size_t colon = file.rfind(':');
    if (colon == std::string::npos ||
        std::strtoull(file.c_str() + colon + 1, nullptr, 10) != st.st_ino) {
      continue;
    }
    long long first = std::atoll(start.c_str());
    bool to_eof = end == "EOF";
    long long last = to_eof ? 0 : std::atoll(end.c_str());
    if (first <= 128 && (to_eof || last >= 128) &&
        std::find(out.begin(), out.end(), pid) == out.end()) {
      out.push_back(static_cast<pid_t>(pid));
    }
  }
  return out;
}

// "1234 (agentvfs), 5678 (sqlite3)"
std::string DescribePids(const std::vector<pid_t>& pids) {
  std::string out;
  for (pid_t pid : pids) {
    if (pid == 0) {
      out += std::string(out.empty() ? "" : ", ") +
             "a process in another PID namespace";
      continue;
    }
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::string name;
    std::getline(comm, name);
    out += (out.empty() ? "" : ", ") + std::to_string(pid) +
           (name.empty() ? "" : " (" + name + ")");
  }
  return out;
}

vfs::Error FromSqlite(sqlite3* db, int rc, std::string_view what) {
  std::string msg = std::string(what) + ": " +
                    (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  int code = EIO;
  int primary = rc & 0xff;
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) {
    code = EBUSY;
    msg += " (the store stayed locked by another process; try again)";
  } else if (primary == SQLITE_FULL) {
    code = ENOSPC;
    msg +=
        " (no space left on the store's filesystem; nothing of this "
        "change was kept: free some space on that filesystem outside the "
        "store, then write again; even a delete needs room in the store "
        "to be recorded)";
  } else if (primary == SQLITE_READONLY || primary == SQLITE_PERM ||
             primary == SQLITE_CANTOPEN) {
    code = EACCES;
  } else if (primary == SQLITE_CONSTRAINT) {
    code = EEXIST;
  } else if (primary == SQLITE_NOMEM) {
    code = ENOMEM;
  }
  return vfs::Error{code, std::move(msg)};
}

// One connection with its prepared statements. Used by one thread at a time
// (its owner holds the connection's mutex).
class Connection final : public Txn {
 public:
  static vfs::Result<std::unique_ptr<Connection>> Open(const std::string& path,
                                                       int flags) {
    sqlite3* db = nullptr;
    int rc = sqlite3_open_v2(path.c_str(), &db, flags | SQLITE_OPEN_NOMUTEX,
                             LogGatheringVfs());
    auto conn = std::unique_ptr<Connection>(new Connection(db));
    if (rc != SQLITE_OK) {
      return std::unexpected(FromSqlite(db, rc, "cannot open " + path));
    }
    sqlite3_extended_result_codes(db, 1);
    sqlite3_busy_timeout(db, kBusyTimeoutMs);
    return conn;
  }

  ~Connection() override {
    for (auto& [sql, stmt] : cache_) sqlite3_finalize(stmt);
    sqlite3_close_v2(db_);
  }

  sqlite3* db() const { return db_; }

  DirCache* dir_cache() override { return dir_cache_; }
  void SetDirCache(DirCache* cache) { dir_cache_ = cache; }
  // Refuses statements that would write (a read transaction's callback).
  void SetReadOnly(bool on) { read_only_ = on; }

  vfs::Status Run(std::string_view sql) {
    char* err = nullptr;
    std::string text(sql);
    int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
    if (rc != SQLITE_OK) {
      std::string msg = err != nullptr ? err : sqlite3_errstr(rc);
      sqlite3_free(err);
      vfs::Error e = FromSqlite(db_, rc, "store");
      e.message = msg + (e.code == EBUSY ? " (store locked; try again)" : "");
      return std::unexpected(e);
    }
    return {};
  }

  // Runs one statement without parameters or rows (BEGIN, COMMIT, a
  // PRAGMA) from the statement cache: the hot transaction statements are
  // parsed once per connection, not at every transaction.
  vfs::Status Control(std::string_view sql) { return Step(sql, {}, nullptr); }

  vfs::Result<std::vector<Row>> Query(
      std::string_view sql, const std::vector<Value>& params) override {
    std::vector<Row> rows;
    auto st = Step(sql, params, &rows);
    if (!st) return std::unexpected(st.error());
    return rows;
  }

  vfs::Result<int64_t> Exec(std::string_view sql,
                            const std::vector<Value>& params) override {
    auto st = Step(sql, params, nullptr);
    if (!st) return std::unexpected(st.error());
    return sqlite3_changes64(db_);
  }

  vfs::Result<size_t> ReadBlob(std::string_view table, std::string_view column,
                               int64_t rowid, void* buf, size_t size,
                               size_t offset) override {
    sqlite3_blob* blob = nullptr;
    std::string t(table), c(column);
    int rc =
        sqlite3_blob_open(db_, "main", t.c_str(), c.c_str(), rowid, 0, &blob);
    if (rc != SQLITE_OK) {
      return std::unexpected(FromSqlite(db_, rc, "cannot open stored chunk"));
    }
    size_t total = static_cast<size_t>(sqlite3_blob_bytes(blob));
    size_t n = offset >= total ? 0 : std::min(size, total - offset);
    if (n > 0) {
      rc = sqlite3_blob_read(blob, buf, static_cast<int>(n),
                             static_cast<int>(offset));
    }
    sqlite3_blob_close(blob);
    if (rc != SQLITE_OK) {
      return std::unexpected(FromSqlite(db_, rc, "cannot read stored chunk"));
    }
    return n;
  }

 private:
  explicit Connection(sqlite3* db) : db_(db) {}

  vfs::Status Step(std::string_view sql, const std::vector<Value>& params,
                   std::vector<Row>* rows) {
    sqlite3_stmt* stmt = nullptr;
    std::string key(sql);
    if (auto it = cache_.find(key); it != cache_.end()) {
      stmt = it->second;
    } else {
      int rc =
          sqlite3_prepare_v3(db_, key.c_str(), static_cast<int>(key.size()),
                             SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
      if (rc != SQLITE_OK) {
        return std::unexpected(FromSqlite(db_, rc, "bad statement " + key));
      }
      cache_.emplace(std::move(key), stmt);
    }
    if (read_only_ && !sqlite3_stmt_readonly(stmt)) {
      return vfs::Fail(EROFS, "store: a write in a read transaction");
    }
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    for (size_t i = 0; i < params.size(); ++i) {
      int idx = static_cast<int>(i) + 1;
      const Value& v = params[i];
      if (std::holds_alternative<int64_t>(v)) {
        sqlite3_bind_int64(stmt, idx, std::get<int64_t>(v));
      } else if (std::holds_alternative<std::string>(v)) {
        const auto& s = std::get<std::string>(v);
        sqlite3_bind_text64(stmt, idx, s.data(), s.size(), SQLITE_STATIC,
                            SQLITE_UTF8);
      } else if (std::holds_alternative<Bytes>(v)) {
        const auto& b = std::get<Bytes>(v).data;
        sqlite3_bind_blob64(stmt, idx, b.data(), b.size(), SQLITE_STATIC);
      } else {
        sqlite3_bind_null(stmt, idx);
      }
    }
    while (true) {
      int rc = sqlite3_step(stmt);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) {
        vfs::Error e = FromSqlite(db_, rc, "store");
        sqlite3_reset(stmt);
        return std::unexpected(e);
      }
      if (rows == nullptr) continue;
      Row row;
      int cols = sqlite3_column_count(stmt);
      row.reserve(cols);
      for (int c = 0; c < cols; ++c) {
        switch (sqlite3_column_type(stmt, c)) {
          case SQLITE_INTEGER:
            row.emplace_back(int64_t{sqlite3_column_int64(stmt, c)});
            break;
          case SQLITE_TEXT:
            row.emplace_back(std::string(
                reinterpret_cast<const char*>(sqlite3_column_text(stmt, c)),
                sqlite3_column_bytes(stmt, c)));
            break;
          case SQLITE_BLOB: {
            const char* p =
                static_cast<const char*>(sqlite3_column_blob(stmt, c));
            row.emplace_back(
                Bytes{std::string(p, p + sqlite3_column_bytes(stmt, c))});
            break;
          }
          case SQLITE_FLOAT:
            row.emplace_back(int64_t(sqlite3_column_double(stmt, c)));
            break;
          default:
            row.emplace_back(std::monostate{});
        }
      }
      rows->push_back(std::move(row));
    }
    sqlite3_reset(stmt);
    return {};
  }

  sqlite3* db_;
  std::map<std::string, sqlite3_stmt*, std::less<>> cache_;
  DirCache* dir_cache_ = nullptr;  // the engine's
  bool read_only_ = false;
};

class SqliteEngine final : public Engine {
 public:
  SqliteEngine(std::string path, std::unique_ptr<Connection> writer)
      : path_(std::move(path)), writer_(std::move(writer)) {
    writer_->SetDirCache(&dir_cache_);
  }

  vfs::Status OpenReaders() {
    for (size_t i = 0; i < kReaders; ++i) {
      auto c = Connection::Open(path_, SQLITE_OPEN_READONLY);
      if (!c) return std::unexpected(c.error());
      if (auto ok = (*c)->Run("PRAGMA query_only=1"); !ok) return ok;
      (*c)->SetDirCache(&dir_cache_);
      readers_.Set(i, std::move(*c));
    }
    return {};
  }

  vfs::Status Migrate() {
    std::lock_guard lock(write_mu_);
    for (size_t v = 0; v < kMigrations.size(); ++v) {
      int target = static_cast<int>(v) + 1;
      if (auto ok = writer_->Run("BEGIN IMMEDIATE"); !ok) return ok;
      auto rows = writer_->Query("PRAGMA user_version", {});
      if (!rows) {
        (void)writer_->Run("ROLLBACK");
        return std::unexpected(rows.error());
      }
      int current = static_cast<int>(AsInt((*rows)[0][0]));
      if (current > static_cast<int>(kMigrations.size())) {
        (void)writer_->Run("ROLLBACK");
        return vfs::Fail(EINVAL, path_ + " has schema version " +
                                     std::to_string(current) +
                                     ", newer than this agentvfs knows (" +
                                     std::to_string(kMigrations.size()) +
                                     "); upgrade agentvfs");
      }
      if (current >= target) {
        (void)writer_->Run("ROLLBACK");
        continue;
      }
      if (target == kLayoutChange && current >= 1) {
        if (auto others = OtherProcessesWithOpen(path_); !others.empty()) {
          (void)writer_->Run("ROLLBACK");
          return vfs::Fail(
              EBUSY, path_ + " needs a schema upgrade (" +
                         std::to_string(current) + " to " +
                         std::to_string(target) +
                         ": small files stored inline) that older agentvfs "
                         "processes cannot read, and other processes have it "
                         "open: " +
                         DescribePids(others) +
                         ". Stop them (mounts, `agentvfs` commands), then run "
                         "this again; nothing was changed");
        }
      }
      auto ok = writer_->Run(kMigrations[v]);
      if (ok)
        ok = writer_->Run("PRAGMA user_version=" + std::to_string(target));
      if (ok) ok = writer_->Run("COMMIT");
      if (!ok) {
        (void)writer_->Run("ROLLBACK");
        return vfs::Fail(ok.error().code, "migrating " + path_ + " to schema " +
                                              std::to_string(target) + ": " +
                                              ok.error().message);
      }
      spdlog::get("store")
          ? spdlog::get("store")->info("{}: schema migrated to version {}",
                                       path_, target)
          : void();
    }
    version_ = static_cast<int>(kMigrations.size());
    return {};
  }

  vfs::Status Write(Durability durability, const TxnFn& fn) override {
    if (HeldByThisThread()) {
      // A write inside this thread's own transaction would wait for itself.
      return vfs::Fail(EDEADLK, "store: a write nested in a transaction");
    }
    std::lock_guard lock(write_mu_);
    HoldingWriter holding(*this);
    int want = durability == Durability::kFull ? 2 : 1;  // FULL : NORMAL
    if (want != synchronous_) {
      if (auto ok = writer_->Control(want == 2 ? "PRAGMA synchronous=FULL"
                                               : "PRAGMA synchronous=NORMAL");
          !ok) {
        return ok;
      }
      synchronous_ = want;
    }
    if (auto ok = writer_->Control("BEGIN IMMEDIATE"); !ok) return ok;
    vfs::Status result = fn(*writer_);
    if (result) result = writer_->Control("COMMIT");
    if (!result) {
      (void)writer_->Control("ROLLBACK");
      // Walks inside the transaction may have cached directories that now
      // never existed (and whose inode numbers will be given out again).
      dir_cache_.Clear();
    }
    return result;
  }

  // A read runs on the writer's connection when no write holds it, else on
  // a pool connection. In WAL mode a connection drops its whole page cache
  // at the start of its first read after any other connection committed;
  // the writer's connection made this process's commits itself, so its
  // cache stays valid across them, while a pool connection re-reads every
  // page it needs after each commit (and frees the memory and takes it
  // again). A write that arrives meanwhile waits for this one read.
  vfs::Status Read(const TxnFn& fn) override {
    if (!HeldByThisThread()) {
      std::unique_lock w(write_mu_, std::try_to_lock);
      if (w.owns_lock()) {
        HoldingWriter holding(*this);
        // Read-only like the pool's connections: a callback that wrote
        // would fail instead of committing. (Not PRAGMA query_only: setting
        // it expires every prepared statement of the connection.)
        writer_->SetReadOnly(true);
        vfs::Status result = ReadOn(*writer_, fn);
        writer_->SetReadOnly(false);
        return result;
      }
    }
    auto r = readers_.Acquire();
    return ReadOn(*r.conn, fn);
  }

  vfs::Status Barrier() override {
    return Write(Durability::kFull, [](Txn& t) -> vfs::Status {
      auto n = t.Exec(
          "INSERT INTO meta(key, value) VALUES('barrier', '1') "
          "ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1");
      if (!n) return std::unexpected(n.error());
      return {};
    });
  }

  int SchemaVersion() const override { return version_; }
  std::string Describe() const override { return "sqlite:" + path_; }
  std::string ScratchDir() const override {
    auto dir = std::filesystem::path(path_).parent_path();
    return dir.empty() ? "." : dir.string();
  }

  vfs::Status Compact() override {
    if (HeldByThisThread()) {
      return vfs::Fail(EDEADLK, "store: compaction inside a transaction");
    }
    std::lock_guard lock(write_mu_);
    // Overwrite the freed pages, then fold the log into the database and
    // truncate it, so that erased content is in neither file.
    if (auto ok = writer_->Run("PRAGMA secure_delete=ON"); !ok) return ok;
    if (auto ok = writer_->Run("VACUUM"); !ok) return ok;
    // A checkpoint waits for readers through the busy handler: with the
    // connection's usual timeout, each attempt would wait 30 s for a
    // reader that stays. These attempts wait a tenth of a second each (and
    // a tenth between them): about 5 s in all.
    struct ShortBusyWait {
      sqlite3* db;
      explicit ShortBusyWait(sqlite3* d) : db(d) {
        sqlite3_busy_timeout(db, 100);
      }
      ~ShortBusyWait() { sqlite3_busy_timeout(db, kBusyTimeoutMs); }
    } short_wait(writer_->db());
    for (int attempt = 0; attempt < 25; ++attempt) {
      auto rows = writer_->Query("PRAGMA wal_checkpoint(TRUNCATE)", {});
      if (!rows) return std::unexpected(rows.error());
      if (!rows->empty() && AsInt((*rows)[0][0]) == 0) return {};
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return vfs::Fail(EBUSY,
                     "the write-ahead log could not be truncated because "
                     "another process keeps reading the store; stop the "
                     "mounts of this store and run `agentvfs compact`");
  }

 private:
  // Records which thread holds write_mu_ (for a transaction or a read on
  // the writer's connection), so that a read nested in it takes a pool
  // connection instead of locking write_mu_ again, and a nested write fails
  // instead of waiting for itself.
  struct HoldingWriter {
    explicit HoldingWriter(SqliteEngine& e) : engine(e) {
      engine.writer_owner_.store(std::this_thread::get_id());
    }
    ~HoldingWriter() { engine.writer_owner_.store(std::thread::id()); }
    SqliteEngine& engine;
  };
  bool HeldByThisThread() const {
    return writer_owner_.load() == std::this_thread::get_id();
  }

  static vfs::Status ReadOn(Connection& conn, const TxnFn& fn) {
    if (auto ok = conn.Control("BEGIN"); !ok) return ok;
    vfs::Status result = fn(conn);
    if (!result || !conn.Control("COMMIT")) (void)conn.Control("ROLLBACK");
    return result;
  }

  std::string path_;
  // Directory paths for namespace.cc's walks: statements are cheap here,
  // but a walk that skips its leading directories is cheaper still.
  DirCache dir_cache_;
  std::mutex write_mu_;  // guards writer_ and synchronous_
  std::atomic<std::thread::id> writer_owner_{};  // of write_mu_, when held
  std::unique_ptr<Connection> writer_;
  int synchronous_ = 0;
  ReaderPool<Connection, kReaders> readers_;
  int version_ = 0;
};

}  // namespace

vfs::Result<std::unique_ptr<Engine>> OpenSqliteEngine(const std::string& path,
                                                      bool create) {
  struct stat st;
  bool exists = ::stat(path.c_str(), &st) == 0;
  if (!exists && !create) {
    return vfs::Fail(ENOENT, "no store at " + path +
                                 "; create one with `agentvfs init --store " +
                                 ShellQuoted(path) + " --admin NAME`");
  }
  if (exists && !S_ISREG(st.st_mode)) {
    return vfs::Fail(EINVAL, path + " is not a store file");
  }
  if (!exists) {
    // Private to the owner from the first byte: the database holds token
    // hashes and everyone's memories. (An empty file is a new database;
    // SQLite gives its -wal and -shm files the same mode.)
    int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      return vfs::Fail(
          errno == ENOENT ? ENOENT : EACCES,
          "cannot create the store " + path + ": " + std::strerror(errno));
    }
    ::close(fd);
  }
  auto writer = Connection::Open(path, SQLITE_OPEN_READWRITE);
  if (!writer) return std::unexpected(writer.error());
  Connection& w = **writer;
  // A database that is no store yet (schema version 0): only `init` makes
  // one, and only in a new or empty database, never in another program's
  // (nothing here may write to a file that a mistyped store name found).
  auto schema = w.Query("PRAGMA user_version", {});
  if (!schema) {
    return vfs::Fail(schema.error().code, path + " is not a usable store (" +
                                              schema.error().message + ")");
  }
  if (AsInt((*schema)[0][0]) == 0) {
    if (!create) {
      return vfs::Fail(ENOENT, "no agentvfs store in " + path +
                                   "; create one with `agentvfs init --store " +
                                   ShellQuoted(path) + " --admin NAME`");
    }
    auto tables = w.Query("SELECT COUNT(*) FROM sqlite_master", {});
    if (!tables) return std::unexpected(tables.error());
    if (AsInt((*tables)[0][0]) > 0) {
      return vfs::Fail(EEXIST, path +
                                   " is a database of another program (it has "
                                   "tables but no agentvfs schema); a store is "
                                   "made only in a new or empty file: choose "
                                   "another name");
    }
    if (exists && (st.st_mode & 077) != 0 && ::chmod(path.c_str(), 0600) != 0) {
      return vfs::Fail(EACCES, "cannot make " + path +
                                   " private to its owner (chmod 0600): " +
                                   std::strerror(errno));
    }
  }
  for (std::string_view pragma :
       {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL",
        "PRAGMA foreign_keys=OFF", "PRAGMA temp_store=MEMORY"}) {
    if (auto ok = w.Run(pragma); !ok) {
      return vfs::Fail(ok.error().code, path + " is not a usable store (" +
                                            ok.error().message + ")");
    }
  }
  auto engine = std::make_unique<SqliteEngine>(path, std::move(*writer));
  if (auto ok = engine->Migrate(); !ok) return std::unexpected(ok.error());
  if (auto ok = engine->OpenReaders(); !ok) return std::unexpected(ok.error());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace agentvfs::store
