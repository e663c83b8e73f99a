// Router: the mount table of the agentvfs namespace. It is itself a Backend,
// so every frontend (FUSE, harness tools, CLI) talks to one object, and the
// checks that hold for all backends live here once:
//   - a path goes to the mount with the longest prefix on whole components
//     (/workspace owns /workspace/a, never /workspacefoo);
//   - directories above the mounts (at least "/") are synthesised, read-only
//     and list the next component of each mount below them;
//   - unknown names in a synthesised directory -> ENOENT;
//   - creating anything in a synthesised directory -> EACCES;
//   - removing or renaming a mount point -> EBUSY (unlink of one: EISDIR,
//     as unlink(2) of a directory);
//   - rename or link between two mounts (even of one backend) -> EXDEV;
//   - every write to a read-only mount -> EROFS.
// A mount either strips its prefix (the backend sees "/" for the mount point,
// e.g. /workspace -> local_dir) or keeps full paths (one store serving both
// /memories and /skills).
//
// Change feed: SetChangeListener() registers one adapter per distinct
// mounted backend, which turns that backend's paths into view paths (the
// mount prefix added back for strip_prefix mounts; for full-path mounts the
// path as is, if it lies under one of that backend's prefixes) and drops
// paths hidden by a nested mount of another backend.
//
// Thread-safety: Mount() is not thread-safe and must be called before the
// router is shared (and before SetChangeListener); after that every method
// is safe to call concurrently (the table is immutable while serving).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "vfs/backend.h"

namespace agentvfs::router {

struct MountOptions {
  bool strip_prefix = true;  // backend sees paths relative to the mount point
  bool read_only = false;    // every write -> EROFS
};

class Router final : public vfs::Backend {
 public:
  Router();
  // Unregisters from the backends' change feeds (see SetChangeListener).
  ~Router() override;

  // Takes ownership of a backend, which may then be mounted one or more times.
  vfs::Backend* Adopt(std::unique_ptr<vfs::Backend> backend);
  // Mounts `backend` (owned by this router or outliving it) at `prefix`.
  // EINVAL for "/" or an invalid prefix; EEXIST when already mounted there.
  vfs::Status Mount(const std::string& prefix, vfs::Backend* backend,
                    MountOptions options = {});

  // The mount points, sorted.
  std::vector<vfs::Path> MountPoints() const;

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
  vfs::Status Mknod(const vfs::Caller& c, const vfs::Path& path, mode_t mode,
                    dev_t rdev) override;
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
  vfs::Result<std::string> GetXattr(const vfs::Caller& c, const vfs::Path& path,
                                    const std::string& name) override;
  vfs::Status SetXattr(const vfs::Caller& c, const vfs::Path& path,
                       const std::string& name, const std::string& value,
                       int flags) override;
  vfs::Result<std::vector<std::string>> ListXattr(
      const vfs::Caller& c, const vfs::Path& path) override;
  vfs::Status RemoveXattr(const vfs::Caller& c, const vfs::Path& path,
                          const std::string& name) override;

  // Forwards the change feed of every mounted backend to `listener`, in view
  // paths: for a mount at /workspace with strip_prefix, the backend's /a/b
  // arrives as /workspace/a/b; for a full-path mount, /memories/x arrives as
  // is when one of that backend's mounts is a prefix of it and is dropped
  // otherwise. A backend mounted at several prefixes reports through each.
  // nullptr unregisters; when this returns, the previous listener is called
  // no more. Mounts added afterwards are not registered.
  void SetChangeListener(vfs::ChangeListener* listener) override;

 private:
  struct MountEntry {
    vfs::Path prefix;
    vfs::Backend* backend;  // not owned here (see owned_)
    MountOptions options;
  };
  // Where a path goes: a backend and the path to give it, or (mount == null)
  // a synthesised directory.
  struct Target {
    const MountEntry* mount = nullptr;
    vfs::Path inner;
    bool is_mount_point = false;
  };
  enum class Access { kRead, kWrite };
  class ChangeAdapter;

  // The mount that owns `path` (longest prefix), or null.
  const MountEntry* OwnerOf(const vfs::Path& path) const;

  vfs::Result<Target> Resolve(const vfs::Path& path, Access access) const;
  bool IsSynthetic(const vfs::Path& path) const;
  vfs::Result<vfs::Attr> SyntheticStat(const vfs::Path& path) const;
  std::vector<vfs::DirEntry> SyntheticList(const vfs::Path& path) const;
  vfs::Result<Target> ResolveForCreate(const vfs::Path& path) const;
  vfs::Result<Target> ResolveForRemove(const vfs::Path& path) const;
  // For changing what exists (mode, owner, times, xattrs): the synthesised
  // directories are read-only (EACCES).
  vfs::Result<Target> ResolveForChange(const vfs::Path& path) const;
  // open(O_RDONLY|O_CREAT, no O_TRUNC) on a read-only mount: the existing
  // file opened read-only; EROFS only where the open would create one.
  vfs::Result<std::unique_ptr<vfs::FileHandle>> OpenExistingReadOnly(
      const vfs::Caller& c, const vfs::Path& path, int flags);

  std::vector<std::unique_ptr<vfs::Backend>> owned_;
  std::vector<MountEntry> mounts_;  // sorted by prefix length, longest first

  // Serialises SetChangeListener; guards adapters_. Never held by Changed().
  std::mutex listener_mu_;
  // One per distinct backend while a listener is registered.
  std::vector<std::unique_ptr<ChangeAdapter>> adapters_;
};

}  // namespace agentvfs::router
