// FsOps: the small set of filesystem operations the conformance suite is
// written against, so that one suite runs unchanged against
//   - real syscalls on a plain directory (the POSIX reference),
//   - a vfs::Backend called directly (the router over each backend), and
//   - real syscalls through a FUSE mount of the agentvfs binary.
// Paths are relative to the root under test ("" or "." is the root itself).
// Every failure carries the errno a program would have seen. File
// descriptors are small integers owned by the FsOps; those still open when
// it is destroyed are closed then.
//
// Thread-safety: methods may be called from several threads at once, on
// different descriptors.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "vfs/backend.h"
#include "vfs/error.h"

namespace agentvfs::conformance {

using vfs::Result;
using vfs::Status;

class FsOps {
 public:
  FsOps() = default;
  FsOps(const FsOps&) = delete;
  FsOps& operator=(const FsOps&) = delete;
  virtual ~FsOps() = default;

  // open(2); returns a descriptor for the calls below.
  virtual Result<int> Open(const std::string& path, int flags,
                           mode_t mode = 0644) = 0;
  // close(2); reports a failed flush/commit.
  virtual Status Close(int fd) = 0;
  // read(2)/write(2) at the descriptor's position (write(2) with O_APPEND
  // always writes at the end).
  virtual Result<size_t> Read(int fd, void* buf, size_t size) = 0;
  virtual Result<size_t> Write(int fd, const void* buf, size_t size) = 0;
  virtual Result<size_t> Pread(int fd, void* buf, size_t size,
                               off_t offset) = 0;
  virtual Result<size_t> Pwrite(int fd, const void* buf, size_t size,
                                off_t offset) = 0;
  virtual Result<size_t> Readv(int fd, const struct iovec* iov, int count) = 0;
  virtual Result<size_t> Writev(int fd, const struct iovec* iov, int count) = 0;
  virtual Result<off_t> Seek(int fd, off_t offset, int whence) = 0;
  virtual Status Ftruncate(int fd, off_t size) = 0;
  virtual Status Fsync(int fd) = 0;
  virtual Result<vfs::Attr> Fstat(int fd) = 0;

  // stat(2) (follows a final symlink) and lstat(2).
  virtual Result<vfs::Attr> Stat(const std::string& path) = 0;
  virtual Result<vfs::Attr> Lstat(const std::string& path) = 0;
  virtual Status Truncate(const std::string& path, off_t size) = 0;
  // renameat2(2); flags 0, RENAME_NOREPLACE or RENAME_EXCHANGE.
  virtual Status Rename(const std::string& from, const std::string& to,
                        unsigned flags = 0) = 0;
  virtual Status Link(const std::string& from, const std::string& to) = 0;
  virtual Status Unlink(const std::string& path) = 0;
  virtual Status Mkdir(const std::string& path, mode_t mode = 0755) = 0;
  virtual Status Rmdir(const std::string& path) = 0;
  virtual Status Symlink(const std::string& target,
                         const std::string& link) = 0;
  virtual Result<std::string> Readlink(const std::string& path) = 0;
  // Names in a directory, without "." and "..", in no particular order.
  virtual Result<std::vector<std::string>> ReadDir(const std::string& path) = 0;
  // chmod(2) (the tests never chmod a symlink), lchown(2), and
  // utimensat(2) with AT_SYMLINK_NOFOLLOW.
  virtual Status Chmod(const std::string& path, mode_t mode) = 0;
  virtual Status Chown(const std::string& path, uid_t uid, gid_t gid) = 0;
  virtual Status Utimens(const std::string& path,
                         const struct timespec times[2]) = 0;

  // Memory mapping exists only where there is a kernel file behind the
  // descriptor; SupportsMmap() says whether Mmap can work at all.
  virtual bool SupportsMmap() const { return false; }
  virtual Result<void*> Mmap(int fd, size_t length, int prot, int flags,
                             off_t offset) {
    (void)fd, (void)length, (void)prot, (void)flags, (void)offset;
    return vfs::Fail(ENOTSUP, "no memory mapping through this interface");
  }
};

// Real syscalls (openat, renameat2, ...) relative to a directory opened at
// `root_path`. `keep_alive` (e.g. the temporary directory, or the mount) is
// released only after every descriptor, including the root's, is closed.
Result<std::unique_ptr<FsOps>> MakeSyscallOps(const std::string& root_path,
                                              std::shared_ptr<void> keep_alive);

// Calls on a vfs::Backend (any, usually a Router) as `caller`, with paths
// placed under `prefix` ("/workspace"). `keep_alive` is destroyed after the
// backend is no longer used (it may own the backend).
std::unique_ptr<FsOps> MakeBackendOps(
    vfs::Backend* backend, std::string prefix, std::shared_ptr<void> keep_alive,
    vfs::Caller caller = vfs::Caller::Local());

// How an instantiation of the suite builds a fresh, empty root per test.
struct FsOpsFactory {
  std::string name;
  std::function<Result<std::unique_ptr<FsOps>>()> make;
};

// Lets gtest print a factory by name instead of as raw bytes.
inline void PrintTo(const FsOpsFactory& factory, std::ostream* os) {
  *os << factory.name;
}

}  // namespace agentvfs::conformance
