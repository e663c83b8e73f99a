// The store's namespace inside a transaction: inode rows, directory entries
// and path walks. Private to backends/store; no policy here (auth and
// conflict rules are in store.cc), only the shape of the tables.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/store/engine.h"
#include "vfs/backend.h"

namespace agentvfs::store {

inline constexpr int64_t kRootIno = 1;
// st_dev reported for store files, so frontends never mix them up with host
// files of the same inode number.
inline constexpr dev_t kStoreDev = 0x41565346;  // "AVSF"
// Added to an inode's number in the st_ino it reports: a view shows store
// and workspace files on one device, where the same number would make two
// files one for tar (a hard link) and du (counted once). Host inode numbers
// do not reach bit 62 on the filesystems a workspace lives on; the
// router's own directories use bit 63.
inline constexpr uint64_t kStoreInoBit = 1ull << 62;
inline constexpr size_t kChunkSize = 1 << 20;

int64_t NowNs();

struct Inode {
  int64_t ino = 0;
  mode_t kind = 0;  // S_IFREG, S_IFDIR or S_IFLNK
  mode_t mode = 0;  // permission bits (07777)
  int64_t uid = 0, gid = 0, nlink = 0, size = 0;
  int64_t stored = 0;  // bytes kept in chunks (holes take none)
  int64_t atime_ns = 0, mtime_ns = 0, ctime_ns = 0;
  int64_t version = 0;   // n of the current content version (0: none yet)
  std::string content;   // hash of the current content ("" = empty)
  std::string target;    // symlink target
  bool deleted = false;  // no name left (kept for history)

  bool IsDir() const { return kind == S_IFDIR; }
  bool IsLink() const { return kind == S_IFLNK; }
  vfs::Attr ToAttr() const;
};

// The columns LoadInode reads, in order (for joins).
extern const char* const kInodeColumns;
Inode InodeFromRow(const Row& row, size_t first = 0);

vfs::Result<std::optional<Inode>> LoadInode(Txn& txn, int64_t ino);
vfs::Result<std::optional<int64_t>> LookupName(Txn& txn, int64_t parent,
                                               std::string_view name);

// Directory paths resolved before, both ways (path -> inode, inode -> path),
// so that a walk looks up only its last component and a directory's path
// costs no lookups. Entries hold for one value of the store's directory
// generation (DirGeneration), which the schema bumps in every transaction
// that removes or changes a directory's entry (SQLite triggers: rmdir, a
// rename of or over a directory, whoever runs it); a walk reads the
// generation in its own transaction, so it never uses an entry its
// snapshot contradicts. Only paths of plain
// directories are kept (no symlink on the way). Thread-safe.
class DirCache {
 public:
  std::optional<int64_t> Ino(int64_t gen, const std::string& path);
  std::optional<std::string> PathOf(int64_t gen, int64_t ino);
  void Put(int64_t gen, const std::string& path, int64_t ino);
  // Forgets everything (a write transaction that filled it rolled back).
  void Clear();

 private:
  // Drops entries of an older generation; false when `gen` is older than
  // the entries (a transaction on an older snapshot: neither use nor fill).
  bool SyncLocked(int64_t gen);
  // Empties the cache for generation `gen` (-1: none yet).
  void ResetLocked(int64_t gen);

  static constexpr size_t kMaxEntries = 16384;
  std::mutex mu_;  // guards everything below
  int64_t gen_ = -1;
  std::unordered_map<std::string, int64_t> inos_;
  std::unordered_map<int64_t, std::string> paths_;
};

// The directory generation of the store as this transaction sees it.
vfs::Result<int64_t> DirGeneration(Txn& txn);

// Where a path leads.
struct Walked {
  std::optional<Inode> parent;  // the directory holding the last name
  std::string name;             // the last component ("" for the root)
  std::optional<Inode> node;    // empty when the last name does not exist
  std::string path;             // canonical path (symlinks inside replaced)
};

// Walks `path` from the root. Symlinks in the middle are followed within
// the store (absolute targets are store paths; a target leaving the store
// -> EACCES; more than 40 -> ELOOP); the last one only if `follow_last`.
// ENOENT when a middle component is missing, ENOTDIR when it is not a
// directory. A missing last component is not an error (node is empty).
// With the transaction's DirCache, a walk whose leading directories are
// cached looks up only the last component.
//
// `may_search`, when given, is asked about each directory (by its path)
// before a name is looked up in it once the walk has followed a symlink;
// false fails the walk with ENOENT, as if the name were missing there. So a
// link (or a chain of links) that passes through a directory the caller
// may not see tells nothing of what that directory holds, as the kernel's
// own walk through a mount does. Directories on the path as written are
// not asked (the callers check the path itself).
using SearchCheck = std::function<bool(const std::string& dir)>;
vfs::Result<Walked> Walk(Txn& txn, const std::string& path, bool follow_last,
                         const SearchCheck* may_search = nullptr);

// Inserts a new inode and its entry `name` in `parent`; returns it.
vfs::Result<Inode> CreateNode(Txn& txn, const Inode& parent,
                              std::string_view name, mode_t kind, mode_t mode,
                              int64_t uid, int64_t gid,
                              const std::string& target, int64_t now_ns);

// Marks (or clears) a purge whose compaction has not finished yet
// (StoreBackend::CompactionPending).
vfs::Status MarkCompactionPending(Txn& txn, bool pending);

// Bumps a directory's mtime and ctime (an entry was added or removed).
vfs::Status TouchDir(Txn& txn, int64_t dir, int64_t now_ns);

// Appends to the change feed. `origin` names the frontend that made the
// change when its kernel already knows it (see StoreBackend's poller).
vfs::Status RecordChange(Txn& txn, const std::string& path,
                         const std::string& session, int64_t now_ns,
                         const std::string& origin = "");

// The path of a directory inode, rebuilt from its entries ("" if gone).
vfs::Result<std::string> DirPath(Txn& txn, int64_t dir);
// Some current path of any inode ("" when it has no name).
vfs::Result<std::string> AnyPath(Txn& txn, int64_t ino);

}  // namespace agentvfs::store
