// Default FileHandle metadata operations for handles backed by a host fd.
#include "vfs/backend.h"

#include <unistd.h>

namespace agentvfs::vfs {

Status FileHandle::Chmod(mode_t mode) {
  int fd = NativeFd();
  if (fd < 0)
    return Fail(ENOTSUP, "cannot change the mode through this handle");
  if (fchmod(fd, mode) != 0)
    return std::unexpected(FromErrno(errno, "fchmod", ""));
  return {};
}

Status FileHandle::Chown(uid_t uid, gid_t gid) {
  int fd = NativeFd();
  if (fd < 0)
    return Fail(ENOTSUP, "cannot change the owner through this handle");
  if (fchown(fd, uid, gid) != 0)
    return std::unexpected(FromErrno(errno, "fchown", ""));
  return {};
}

Status FileHandle::Utimens(const struct timespec times[2]) {
  int fd = NativeFd();
  if (fd < 0)
    return Fail(ENOTSUP, "cannot change the times through this handle");
  if (futimens(fd, times) != 0)
    return std::unexpected(FromErrno(errno, "futimens", ""));
  return {};
}

}  // namespace agentvfs::vfs
