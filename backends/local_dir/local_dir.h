// LocalDirBackend: serves one host directory (the agent's /workspace) as a
// vfs::Backend. The sandboxed agent can write anything into that directory,
// including symlinks such as `x -> /etc/passwd` or `up -> ../../..`, and can
// swap a directory for such a symlink at any moment; so the one guarantee
// this backend exists for is: whatever the operation and whatever the tree
// looks like, it never opens, stats, changes or removes anything outside the
// root directory. Every path is resolved by the kernel with openat2(2)
// RESOLVE_BENEATH against a directory fd held since Open(), the final
// component is acted on relative to its (pinned) parent without following it,
// and a symlink that would lead out makes the operation fail with EACCES.
//
// Beyond the Backend contract (see vfs/backend.h), this backend:
//   - refuses to create (Mknod) or open (Open, Truncate) block and character
//     devices: a device node would reach host hardware from inside the root
//     (EPERM for Mknod, EACCES for opening);
//   - refuses SetXattr/RemoveXattr in the "security." and "trusted."
//     namespaces (EPERM), because the daemon runs as root and e.g. a
//     security.capability attribute would grant capabilities to a file the
//     agent controls. Reading any attribute is allowed;
//   - gives files it creates for a Caller with a uid/gid that owner (the group
//     is the parent's when the parent is set-group-ID, as the kernel does).
//     The serving process's umask applies to creation modes, as with open(2).
//
// Thread-safety: the object holds only its root fd, which never changes, so
// all methods are safe to call concurrently. File handles own one fd each and
// use positional I/O, so their methods are safe to call concurrently too.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "vfs/backend.h"

namespace agentvfs::backends {

class LocalDirBackend final : public vfs::Backend {
 public:
  // Opens `root_dir` (which must exist and be a directory) as the root.
  // ENOENT/ENOTDIR/EACCES with a message saying what to fix; ENOSYS when the
  // kernel lacks openat2(2) (Linux < 5.6), without which nothing is served.
  static vfs::Result<std::unique_ptr<LocalDirBackend>> Open(
      const std::string& root_dir);

  ~LocalDirBackend() override;

  // The directory as given to Open(), for messages.
  const std::string& root_dir() const { return root_dir_; }

  vfs::Result<vfs::Attr> Stat(const vfs::Caller& c,
                              const vfs::Path& path) override;
  vfs::Result<std::vector<vfs::DirEntry>> ReadDir(
      const vfs::Caller& c, const vfs::Path& path) override;
  vfs::Result<std::unique_ptr<vfs::FileHandle>> Open(
      const vfs::Caller& c, const vfs::Path& path, int flags,
      mode_t mode = 0644) override;
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

 private:
  LocalDirBackend(int root_fd, std::string root_dir)
      : root_fd_(root_fd), root_dir_(std::move(root_dir)) {}

  // Open() at `links` symlinks deep: creating through a dangling symlink
  // goes on at the link's target (ELOOP past 40). `as_caller`: the thread
  // acts as `c` (a file it makes is the caller's already).
  vfs::Result<std::unique_ptr<vfs::FileHandle>> OpenFollowing(
      const vfs::Caller& c, const vfs::Path& path, int flags, mode_t mode,
      int links, bool as_caller);

  // O_PATH|O_DIRECTORY fd of the root; every resolution starts here. Owned;
  // never changes after construction (that is what makes this thread-safe).
  const int root_fd_;
  const std::string root_dir_;
};

}  // namespace agentvfs::backends
