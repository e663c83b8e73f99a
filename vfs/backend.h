// Backend: the one interface every storage behind agentvfs implements (the
// workspace directory, the store, later remote sandboxes), and which the
// router itself implements so that frontends (FUSE, harness tools, CLI) see a
// single Backend.
//
// Paths: every Path given to a backend is already normalised (see path.h) and
// is relative to the backend's own root ("/" is the backend's root). Shared
// checks (name validity, read-only mounts, cross-mount renames) are done by
// the router above; a backend implements storage only.
//
// Symlinks: path-taking methods never follow a symlink in the *last*
// component, except Open (which, like open(2), follows it). No method ever
// resolves anything outside the backend's root: a symlink that would lead out
// makes the operation fail with EACCES instead.
//
// Thread-safety: all methods may be called concurrently from many threads.
// A FileHandle is used by one thread at a time per call, but different calls
// on one handle may come from different threads (FUSE does this); a handle's
// methods are themselves safe to call concurrently unless noted.
//
// Errors (std::expected<T, Error>, never exceptions). The errno each method
// returns for the cases a caller can cause:
//   ENOENT        the path or a parent does not exist (or is not visible to
//                 the caller: what a caller may not read does not exist)
//   ENOTDIR       a parent component is not a directory
//   EEXIST        create/mkdir/symlink/link target exists; O_CREAT|O_EXCL
//   EISDIR        Open for writing, or Unlink, of a directory
//   ENOTEMPTY     Rmdir, or a rename onto, a non-empty directory
//   EACCES        the caller may not do this; or the path leaves the root
//   EPERM         operation not permitted (chown by a non-owner, link to dir)
//   EROFS         a read-only mount
//   EXDEV         rename/link across backends or mounts
//   EBUSY         the target is a mount point, or another session holds the
//                 file open for writing (the store's lease)
//   ESTALE        the store's stale-writer rule: this session read version N
//                 of the file and another session has since committed a newer
//                 one; re-read the file (open it for reading) and retry
//   EINVAL        bad argument (rename a dir into itself, bad flags)
//   ENAMETOOLONG  a name or path over NAME_MAX/PATH_MAX
//   ELOOP         too many symlinks, or O_NOFOLLOW on a symlink
//   ENODATA       GetXattr/RemoveXattr of an attribute that is not set
//   ENOTSUP       xattrs, fallocate, ... not supported by this backend
//   EIO           anything else; the message says what
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vfs/caller.h"
#include "vfs/error.h"
#include "vfs/path.h"

namespace agentvfs::vfs {

// File attributes are POSIX `struct stat` (st_ino is the backend's own inode
// number; frontends may renumber).
using Attr = struct stat;

struct DirEntry {
  std::string name;  // never "." or ".."
  uint64_t ino = 0;  // backend inode number, 0 if unknown
  mode_t type = 0;   // S_IFMT bits of the entry (S_IFREG, S_IFDIR, ...)
};

// Value for Chown's uid/gid meaning "leave unchanged".
inline constexpr uid_t kKeepUid = static_cast<uid_t>(-1);
inline constexpr gid_t kKeepGid = static_cast<gid_t>(-1);

// An open file. Owns whatever the backend needs (an fd, a draft buffer, a
// lease) and releases it in its destructor. Non-copyable.
class FileHandle {
 public:
  FileHandle() = default;
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  virtual ~FileHandle() = default;

  // Reads up to `size` bytes at `offset`; returns the count (0 at EOF).
  virtual Result<size_t> Read(void* buf, size_t size, off_t offset) = 0;
  // Writes `size` bytes at `offset` (at the end when opened with O_APPEND);
  // returns the count written. EBADF if not opened for writing.
  virtual Result<size_t> Write(const void* buf, size_t size, off_t offset) = 0;
  virtual Result<Attr> Stat() = 0;
  // The attributes the file had when this handle opened it, when the backend
  // has them at hand (a store file the open created), for a frontend's reply
  // to a create; nullopt means: call Stat().
  virtual std::optional<Attr> AttrsAtOpen() const { return std::nullopt; }
  // True when the file's content may differ from what a frontend's kernel
  // cached for it from this session's earlier opens (another session
  // committed since, or the session never opened it): the frontend then
  // drops the cached data and attributes before the first read, so the
  // program reads the content this handle opened, which is the one the
  // backend counts as seen (a store's stale-writer check relies on it).
  virtual bool MayDifferFromCache() const { return false; }
  virtual Status Truncate(off_t size) = 0;
  // Makes written data durable (data only when `datasync`).
  virtual Status Sync(bool datasync) = 0;
  // Called at every close(2) of a descriptor for this handle; a backend that
  // commits on close commits here and reports a failed commit here.
  virtual Status Flush() { return {}; }
  // For a writer that failed part-way: what it wrote through this handle
  // and did not commit is dropped, so that no later Flush() or release
  // commits it. A backend whose writes land at once (a host directory)
  // keeps them. The store keeps them too while another handle of the same
  // session writes the file (they share one draft): that handle's commit
  // takes them.
  virtual void Discard() {}
  // False when Flush() does nothing, so frontends may skip calling it (the
  // FUSE frontend then spares close(2) a round trip to the daemon).
  virtual bool NeedsFlush() const { return true; }
  // fallocate(2); ENOTSUP when the backend cannot.
  virtual Status Allocate(int mode, off_t offset, off_t length) {
    (void)mode, (void)offset, (void)length;
    return Fail(ENOTSUP, "fallocate is not supported here");
  }
  // Metadata changes through the open file (fchmod, fchown, futimens), which
  // still work after the file was unlinked or renamed. The defaults act on
  // NativeFd() and return ENOTSUP without one.
  virtual Status Chmod(mode_t mode);
  virtual Status Chown(uid_t uid, gid_t gid);
  virtual Status Utimens(const struct timespec times[2]);
  // A host file descriptor for zero-copy I/O (splice), or -1 when the data
  // does not live in a host file. Remains owned by the handle.
  virtual int NativeFd() const { return -1; }
};

// Change feed: a backend whose files can change behind a frontend's caches
// (another process committing to a shared store) reports each changed path,
// so that a FUSE view can drop what the kernel cached. Paths are in the
// receiver's terms (the router translates a backend's paths to view paths).
// Changed() may be called from any thread, never while the backend holds a
// lock the receiver could need; it must return quickly.
class ChangeListener {
 public:
  virtual ~ChangeListener() = default;
  // `path` changed (content, attributes, or the entry was created, removed
  // or renamed); its parent directory's listing may have changed too.
  virtual void Changed(const Path& path) = 0;
};

class Backend {
 public:
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual ~Backend() = default;

  // lstat(2): attributes of `path` itself (a symlink is not followed).
  virtual Result<Attr> Stat(const Caller& c, const Path& path) = 0;
  // Entries of a directory, without "." and "..". ENOTDIR for a non-directory.
  virtual Result<std::vector<DirEntry>> ReadDir(const Caller& c,
                                                const Path& path) = 0;
  // open(2) with O_RDONLY/O_WRONLY/O_RDWR plus O_CREAT, O_EXCL, O_TRUNC,
  // O_APPEND, O_NOFOLLOW (other flags may be ignored). `mode` applies when
  // the file is created; it becomes owned by the caller's uid/gid if known.
  virtual Result<std::unique_ptr<FileHandle>> Open(const Caller& c,
                                                   const Path& path, int flags,
                                                   mode_t mode = 0644) = 0;
  virtual Status Mkdir(const Caller& c, const Path& path, mode_t mode) = 0;
  // mknod(2) for FIFOs, sockets and devices; EPERM/ENOTSUP where refused.
  virtual Status Mknod(const Caller& c, const Path& path, mode_t mode,
                       dev_t rdev) {
    (void)c, (void)path, (void)mode, (void)rdev;
    return Fail(EPERM, "special files cannot be created here");
  }
  virtual Status Unlink(const Caller& c, const Path& path) = 0;
  virtual Status Rmdir(const Caller& c, const Path& path) = 0;
  // Creates a symlink at `link` whose content is `target` (stored verbatim,
  // never resolved by the backend).
  virtual Status Symlink(const Caller& c, const std::string& target,
                         const Path& link) = 0;
  virtual Result<std::string> Readlink(const Caller& c, const Path& path) = 0;
  // Hard link `to` -> same file as `from`. EPERM for directories.
  virtual Status Link(const Caller& c, const Path& from, const Path& to) = 0;
  // rename(2) / renameat2(2); flags: 0, RENAME_NOREPLACE, RENAME_EXCHANGE.
  virtual Status Rename(const Caller& c, const Path& from, const Path& to,
                        unsigned flags) = 0;
  // chmod(2) of the file itself; ENOTSUP/EOPNOTSUPP for a symlink.
  virtual Status Chmod(const Caller& c, const Path& path, mode_t mode) = 0;
  // lchown(2); kKeepUid/kKeepGid leave that part unchanged.
  virtual Status Chown(const Caller& c, const Path& path, uid_t uid,
                       gid_t gid) = 0;
  // utimensat(2) with AT_SYMLINK_NOFOLLOW; times[0]=atime, times[1]=mtime;
  // tv_nsec may be UTIME_NOW or UTIME_OMIT.
  virtual Status Utimens(const Caller& c, const Path& path,
                         const struct timespec times[2]) = 0;
  // truncate(2) of a regular file (follows a final symlink like truncate(2)).
  virtual Status Truncate(const Caller& c, const Path& path, off_t size) = 0;
  virtual Result<struct statvfs> StatFs(const Caller& c, const Path& path) = 0;

  // Registers the one receiver of this backend's change feed (nullptr to
  // stop). Backends whose files only change through themselves ignore it.
  // After SetChangeListener(nullptr) returns, Changed() is not called again.
  virtual void SetChangeListener(ChangeListener* listener) { (void)listener; }

  // Extended attributes of the file itself (l*xattr semantics).
  virtual Result<std::string> GetXattr(const Caller& c, const Path& path,
                                       const std::string& name) {
    (void)c, (void)path, (void)name;
    return Fail(ENOTSUP, "extended attributes are not supported here");
  }
  virtual Status SetXattr(const Caller& c, const Path& path,
                          const std::string& name, const std::string& value,
                          int flags) {
    (void)c, (void)path, (void)name, (void)value, (void)flags;
    return Fail(ENOTSUP, "extended attributes are not supported here");
  }
  virtual Result<std::vector<std::string>> ListXattr(const Caller& c,
                                                     const Path& path) {
    (void)c, (void)path;
    return Fail(ENOTSUP, "extended attributes are not supported here");
  }
  virtual Status RemoveXattr(const Caller& c, const Path& path,
                             const std::string& name) {
    (void)c, (void)path, (void)name;
    return Fail(ENOTSUP, "extended attributes are not supported here");
  }
};

}  // namespace agentvfs::vfs
