// Error formatting and the errno -> Error mapping shared by syscall-based code.
#include "vfs/error.h"

#include <cstring>
#include <string>

namespace agentvfs::vfs {

std::string ErrnoName(int code) {
  switch (code) {
#define AGENTVFS_ERRNO_CASE(e) \
  case e:                      \
    return #e;
    AGENTVFS_ERRNO_CASE(EPERM)
    AGENTVFS_ERRNO_CASE(ENOENT)
    AGENTVFS_ERRNO_CASE(EIO)
    AGENTVFS_ERRNO_CASE(EBADF)
    AGENTVFS_ERRNO_CASE(EAGAIN)
    AGENTVFS_ERRNO_CASE(ENOMEM)
    AGENTVFS_ERRNO_CASE(EACCES)
    AGENTVFS_ERRNO_CASE(EFAULT)
    AGENTVFS_ERRNO_CASE(EBUSY)
    AGENTVFS_ERRNO_CASE(EEXIST)
    AGENTVFS_ERRNO_CASE(EXDEV)
    AGENTVFS_ERRNO_CASE(ENODEV)
    AGENTVFS_ERRNO_CASE(ENOTDIR)
    AGENTVFS_ERRNO_CASE(EISDIR)
    AGENTVFS_ERRNO_CASE(EINVAL)
    AGENTVFS_ERRNO_CASE(EMFILE)
    AGENTVFS_ERRNO_CASE(EFBIG)
    AGENTVFS_ERRNO_CASE(ENOSPC)
    AGENTVFS_ERRNO_CASE(ESPIPE)
    AGENTVFS_ERRNO_CASE(EROFS)
    AGENTVFS_ERRNO_CASE(EMLINK)
    AGENTVFS_ERRNO_CASE(ERANGE)
    AGENTVFS_ERRNO_CASE(ENAMETOOLONG)
    AGENTVFS_ERRNO_CASE(ENOSYS)
    AGENTVFS_ERRNO_CASE(ENOTEMPTY)
    AGENTVFS_ERRNO_CASE(ELOOP)
    AGENTVFS_ERRNO_CASE(ENODATA)
    AGENTVFS_ERRNO_CASE(ENOTSUP)
    AGENTVFS_ERRNO_CASE(ETIMEDOUT)
    AGENTVFS_ERRNO_CASE(ESTALE)
    AGENTVFS_ERRNO_CASE(ETXTBSY)
    AGENTVFS_ERRNO_CASE(E2BIG)
    AGENTVFS_ERRNO_CASE(ENXIO)
#undef AGENTVFS_ERRNO_CASE
    default:
      break;
  }
  return "E" + std::to_string(code);
}

std::string Error::ToString() const {
  std::string out = ErrnoName(code);
  if (!message.empty()) {
    out += ": ";
    out += message;
  }
  return out;
}

Error FromErrno(int err, std::string_view op, std::string_view path) {
  std::string msg(op);
  if (!path.empty()) {
    msg += " ";
    msg += path;
  }
  msg += ": ";
  msg += std::strerror(err);
  return Error{err, std::move(msg)};
}

}  // namespace agentvfs::vfs
