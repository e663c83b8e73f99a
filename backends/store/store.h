// StoreBackend: /memories and /skills kept in a database (see engine.h), with
// per-user grants (auth.h), a version for every commit, and write conflicts
// rejected rather than merged. It sees full paths (/memories/..., /skills/...):
// the router mounts it with strip_prefix = false. docs/store.md says how it
// works and what it guarantees; in short:
//
//   - Namespace: inodes and directory entries, like a local filesystem, so
//     hard links, renames of whole directories and open-after-unlink work.
//   - Writing: a file opened for writing gets a private draft (a temporary
//     host file, so the FUSE frontend's zero-copy path works), shared by the
//     session's write handles. close(2) (Flush) and fsync (Sync) commit the
//     draft in one transaction as a new version; readers of other sessions
//     see the old or the new content, never a mix. Content is stored in
//     chunks of at most 1 MiB, deduplicated by SHA-256.
//   - Conflicts (never merged):
//       EBUSY   another live session holds the file open for writing (its
//               lease); the lease ends at its close, or when its holder dies
//               (same host: at once; elsewhere: after the lease time).
//       ESTALE  this session read version N and another session has since
//               committed a newer one: open-for-write, truncate, unlink and
//               rename onto the file are refused until the session re-reads
//               it (opens it for reading). A commit whose base is no longer
//               current is refused the same way.
//       EEXIST  O_EXCL create of a name that exists (racing creates: one
//               wins; the other gets EEXIST, or EBUSY while the winner is
//               still writing).
//   - Auth: unreadable -> ENOENT and never listed; readable but not
//     writable -> EACCES; policies cached at most StoreOptions::auth_ttl.
//   - History: every commit and every delete of a file's last name is a
//     version; History/ReadVersion/Restore/Purge below.
//   - Durability: a commit at close or fsync is in the database before the
//     call returns (kill -9 of any process loses nothing acknowledged);
//     with commit_durability = kFull (default) it is also fsynced. Namespace
//     changes (mkdir, rename, unlink, chmod...) survive process death and
//     become power-safe at the next fsync or full commit.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/store/auth.h"
#include "backends/store/engine.h"
#include "vfs/backend.h"

namespace agentvfs::store {

struct StoreOptions {
  // Durability of file commits (close/fsync); see above.
  Durability commit_durability = Durability::kFull;
  // How long a user's grants may be cached.
  std::chrono::milliseconds auth_ttl{2000};
  // A writer's lease lasts this long past its last renewal; renewals happen
  // every third of it while the file stays open.
  std::chrono::milliseconds lease_ttl{15000};
  // How often the change feed is polled for a registered ChangeListener.
  std::chrono::milliseconds poll_interval{200};
};

// One entry of a file's history.
struct VersionInfo {
  int64_t n = 0;     // its number in the path's history (StoreBackend::History)
  std::string path;  // the path the file had at this version
  std::string author;
  std::string session;
  int64_t time_ns = 0;
  int64_t size = 0;
  // SHA-256 (hex) over the content's chunk list (see docs/store.md), not of
  // the bytes themselves; empty for a delete.
  std::string content_hash;
  mode_t mode = 0;
  bool deleted = false;  // a tombstone: the file's last name was removed
};

// What a purge removed.
struct PurgeReport {
  int64_t versions = 0;
  int64_t files = 0;
  int64_t blobs = 0;  // stored chunks removed (blobs, inline contents)
  int64_t bytes = 0;
};

class StoreBackend final : public vfs::Backend {
 public:
  // Opens the store named `name` (engine.h). ENOENT when it does not exist.
  static vfs::Result<std::unique_ptr<StoreBackend>> Open(
      const std::string& name, StoreOptions options = {});
  // Serves the store of an engine already open (Engine::Open), for a tool
  // or test that puts something between the two.
  static std::unique_ptr<StoreBackend> Serve(std::unique_ptr<Engine> engine,
                                             StoreOptions options = {});
  ~StoreBackend() override;

  Engine& engine() { return *engine_; }
  AuthCache& auth() { return auth_; }

  // --- vfs::Backend --------------------------------------------------------
  vfs::Result<vfs::Attr> Stat(const vfs::Caller& c,
                              const vfs::Path& path) override;
  vfs::Result<std::vector<vfs::DirEntry>> ReadDir(
      const vfs::Caller& c, const vfs::Path& path) override;
  vfs::Result<std::unique_ptr<vfs::FileHandle>> Open(const vfs::Caller& c,
                                                     const vfs::Path& path,
                                                     int flags,
                                                     mode_t mode) override;
  vfs::Status Mkdir(const vfs::Caller& c, const vfs::Path& path,
                    mode_t mode) override;
  vfs::Status Unlink(const vfs::Caller& c, const vfs::Path& path) override;
  vfs::Status Rmdir(const vfs::Caller& c, const vfs::Path& path) override;
  vfs::Status Symlink(const vfs::Caller& c, const std::string& target,
                      const vfs::Path& link) override;
  vfs::Result<std::string> Readlink(const vfs::Caller& c,
                                    const vfs::Path& path) override;
  vfs::Status Link(const vfs::Caller& c, const vfs::Path& from,
                   const vfs::Path& to) override;
  vfs::Status Rename(const vfs::Caller& c, const vfs::Path& from,
                     const vfs::Path& to, unsigned flags) override;
  vfs::Status Chmod(const vfs::Caller& c, const vfs::Path& path,
                    mode_t mode) override;
  vfs::Status Chown(const vfs::Caller& c, const vfs::Path& path, uid_t uid,
                    gid_t gid) override;
  vfs::Status Utimens(const vfs::Caller& c, const vfs::Path& path,
                      const struct timespec times[2]) override;
  vfs::Status Truncate(const vfs::Caller& c, const vfs::Path& path,
                       off_t size) override;
  vfs::Result<struct statvfs> StatFs(const vfs::Caller& c,
                                     const vfs::Path& path) override;
  void SetChangeListener(vfs::ChangeListener* listener) override;

  // --- History (needs read on the path; Restore needs write; Purge admin) --
  // Versions of the file at `path`, oldest first, after those of the
  // deleted files that had the name before it: a file removed there, or
  // replaced by a rename over it (an editor's or `sed -i`'s save), in the
  // order they went. Numbered 1, 2, ... along the whole path, so numbers
  // already shown keep their meaning when a save replaces the file (until a
  // purge). When no file has that name now, the same without a current
  // file (deleted files stay recoverable until purged).
  vfs::Result<std::vector<VersionInfo>> History(const vfs::Caller& c,
                                                const vfs::Path& path);
  // Opens version `n` of `path`'s history (as History numbers it) read-only.
  vfs::Result<std::unique_ptr<vfs::FileHandle>> OpenVersion(
      const vfs::Caller& c, const vfs::Path& path, int64_t n);
  // Commits version `n`'s content (and mode) as a new version at `path`
  // (version `n` of its history, perhaps of a file the current one replaced),
  // bringing a deleted file back as itself (its history continues) with any
  // missing parent directories. Nothing is rewritten: the restore is itself
  // a version.
  vfs::Result<VersionInfo> Restore(const vfs::Caller& c, const vfs::Path& path,
                                   int64_t n);
  // Erases for good: every version of the file at (or last at) `path` and
  // of the deleted files that were there before it (all of them, or, for a
  // live file with `keep_current`, those older than its current one),
  // and content no version refers to any more; then compacts the database
  // so the bytes are gone from its files. A live file purged without
  // keep_current is removed.
  // True when a purge committed but its compaction never finished (the
  // process was stopped, or the compaction failed): purged bytes may still
  // be in the database's files until `agentvfs compact` runs.
  vfs::Result<bool> CompactionPending();
  vfs::Result<PurgeReport> Purge(const vfs::Caller& c, const vfs::Path& path,
                                 bool keep_current);

  class Impl;

 private:
  StoreBackend(std::unique_ptr<Engine> engine, StoreOptions options);
  std::unique_ptr<Engine> engine_;
  StoreOptions options_;
  AuthCache auth_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentvfs::store
