// Engine: the small private interface between the store's policy (who may
// read what, which write wins, versions, leases; all in StoreBackend and
// StoreAdmin) and the database that keeps its rows. An engine runs
// transactions of portable SQL (`?` placeholders; types INTEGER, TEXT and
// BLOB; INSERT ... ON CONFLICT; RETURNING) and owns its own schema
// migrations, so that a PostgreSQL engine can follow with no change above
// it. Engines are chosen by the store's name (see Engine::Open): a file path
// or `sqlite:PATH` is SQLite; `postgresql://` (or `postgres://`) is
// PostgreSQL.
//
// Transactions: Write() runs its function inside one write transaction and
// commits it (or rolls it back when the function fails); concurrent writers,
// in this process or others, queue (they wait instead of failing). A failure
// from the function is returned as is; a failure of the database itself is
// EIO with the engine's message, or EBUSY when the database stayed locked
// longer than the busy timeout. Read() runs a consistent read-only snapshot.
//
// Durability: Write(kFull) returns only once the transaction is on stable
// storage (fsync); Write(kProcess) survives the death of any process (the
// data is in the kernel) but not a power cut, until the next kFull write or
// Barrier(). Both keep the database consistent.
//
// Thread-safety: every method may be called from any thread; the engine
// serialises its own connection use. A Txn is used only inside the function
// it was given to.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "vfs/error.h"

namespace agentvfs::store {

class DirCache;  // namespace.h

// A BLOB value (bytes), as distinct from TEXT.
struct Bytes {
  std::string data;
};

// One SQL value: NULL, INTEGER, TEXT or BLOB.
using Value = std::variant<std::monostate, int64_t, std::string, Bytes>;
using Row = std::vector<Value>;

// A store's name as it may be shown (logs, messages): a PostgreSQL URI
// without its password; any other name as it is.
std::string DisplayName(const std::string& name);

// `s` as one shell word, for a command a message suggests: as it is when it
// holds only safe characters, else in single quotes (a URI's '&' and '?').
std::string ShellQuoted(const std::string& s);

// Host paths that reach the store `name` other than through a user's token,
// which a sandbox must never see: a SQLite file with its -wal, -shm and
// -journal; for PostgreSQL, the files libpq takes a password or settings
// from ($PGPASSFILE or ~/.pgpass, $PGSERVICEFILE or ~/.pg_service.conf,
// and a passfile the URI names) and the directory of every Unix socket the
// URI or $PGHOST names (the server's socket directory, often its data
// directory).
std::vector<std::string> SecretPathsOf(const std::string& name);

// Accessors for row values; a NULL reads as 0 / "".
int64_t AsInt(const Value& v);
const std::string& AsText(const Value& v);  // TEXT or BLOB bytes
bool IsNull(const Value& v);

enum class Durability { kFull, kProcess };

class Txn {
 public:
  virtual ~Txn() = default;
  // Runs a statement and returns every row it produced.
  virtual vfs::Result<std::vector<Row>> Query(
      std::string_view sql, const std::vector<Value>& params = {}) = 0;
  // Runs a statement and returns the number of rows it changed.
  virtual vfs::Result<int64_t> Exec(std::string_view sql,
                                    const std::vector<Value>& params = {}) = 0;
  // Reads `size` bytes at `offset` of a BLOB column value in the row whose
  // integer key is `rowid` (for chunk reads without loading the whole blob).
  virtual vfs::Result<size_t> ReadBlob(std::string_view table,
                                       std::string_view column, int64_t rowid,
                                       void* buf, size_t size,
                                       size_t offset) = 0;
  // Whether each statement is a round trip to a server. Code above the
  // engine then folds several lookups into one statement (a recursive path
  // walk, say); in-process engines run many small indexed statements
  // faster than one elaborate one.
  virtual bool StatementsAreRoundTrips() const { return false; }
  // The engine's cache of directory paths (namespace.h), or none. The
  // engine only keeps it; code above the engine fills and checks it.
  virtual DirCache* dir_cache() { return nullptr; }
};

class Engine {
 public:
  // Opens (creating if missing, when `create`) the store named `name` and
  // brings its schema up to date. ENOENT when missing and !create; EINVAL for
  // an unknown scheme; EIO with the database's message otherwise.
  static vfs::Result<std::unique_ptr<Engine>> Open(const std::string& name,
                                                   bool create);

  virtual ~Engine() = default;
  using TxnFn = std::function<vfs::Status(Txn&)>;
  virtual vfs::Status Write(Durability durability, const TxnFn& fn) = 0;
  virtual vfs::Status Read(const TxnFn& fn) = 0;
  // Makes every earlier kProcess write durable.
  virtual vfs::Status Barrier() = 0;
  // Schema version after migrations.
  virtual int SchemaVersion() const = 0;
  // For messages: "sqlite:/path/team.db".
  virtual std::string Describe() const = 0;
  // A host directory on the same filesystem as the store where the store may
  // keep private temporary files (drafts of files being written).
  virtual std::string ScratchDir() const = 0;
  // After a purge: makes sure deleted content is really gone from the files
  // (secure deletion and checkpoint of the write-ahead log).
  virtual vfs::Status Compact() = 0;

  // Change hints: `on_change` is called (from a thread of the engine's) soon
  // after any process commits a row to the `changes` table, so that a live
  // mount can read the feed at once instead of at its next poll. A hint may
  // be spurious or, when the engine has no such mechanism (SQLite), never
  // come: readers of the feed still poll. Replaces any earlier callback; an
  // empty function stops the hints. The callback must not call the engine.
  virtual void WatchChanges(std::function<void()> on_change) {
    (void)on_change;
  }

  // After rows were copied in with their keys (agentvfs migrate): makes sure
  // keys generated from now on continue above the copied ones.
  virtual vfs::Status ResyncKeys(Txn& txn) {
    (void)txn;
    return {};
  }
};

}  // namespace agentvfs::store
