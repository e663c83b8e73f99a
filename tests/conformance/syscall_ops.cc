// FsOps over real syscalls. Every path-taking call is the *at() form against
// a root directory fd, so a test's path may be close to PATH_MAX without the
// root's own path counting against it. The one exception is truncate(2),
// which has no *at() form: it gets the absolute path when that fits, and
// otherwise falls back to open + ftruncate.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <mutex>
#include <set>

#include "tests/conformance/fs_ops.h"

namespace agentvfs::conformance {
namespace {

const char* Rel(const std::string& path) {
  return path.empty() ? "." : path.c_str();
}

class SyscallOps final : public FsOps {
 public:
  SyscallOps(int root_fd, std::string root_path,
             std::shared_ptr<void> keep_alive)
      : root_fd_(root_fd),
        root_path_(std::move(root_path)),
        keep_alive_(std::move(keep_alive)) {}

  ~SyscallOps() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : fds_) close(fd);
      fds_.clear();
    }
    close(root_fd_);
    keep_alive_.reset();  // e.g. unmounts; nothing of ours is open any more
  }

  Result<int> Open(const std::string& path, int flags, mode_t mode) override {
    int fd = openat(root_fd_, Rel(path), flags | O_CLOEXEC, mode);
    if (fd < 0) return Err("open", path);
    std::lock_guard<std::mutex> lock(mu_);
    fds_.insert(fd);
    return fd;
  }

  Status Close(int fd) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fds_.erase(fd);
    }
    if (close(fd) != 0) return Err("close", "");
    return {};
  }

  Result<size_t> Read(int fd, void* buf, size_t size) override {
    ssize_t n = read(fd, buf, size);
    if (n < 0) return Err("read", "");
    return static_cast<size_t>(n);
  }
  Result<size_t> Write(int fd, const void* buf, size_t size) override {
    ssize_t n = write(fd, buf, size);
    if (n < 0) return Err("write", "");
    return static_cast<size_t>(n);
  }
  Result<size_t> Pread(int fd, void* buf, size_t size, off_t offset) override {
    ssize_t n = pread(fd, buf, size, offset);
    if (n < 0) return Err("pread", "");
    return static_cast<size_t>(n);
  }
  Result<size_t> Pwrite(int fd, const void* buf, size_t size,
                        off_t offset) override {
    ssize_t n = pwrite(fd, buf, size, offset);
    if (n < 0) return Err("pwrite", "");
    return static_cast<size_t>(n);
  }
  Result<size_t> Readv(int fd, const struct iovec* iov, int count) override {
    ssize_t n = readv(fd, iov, count);
    if (n < 0) return Err("readv", "");
    return static_cast<size_t>(n);
  }
  Result<size_t> Writev(int fd, const struct iovec* iov, int count) override {
    ssize_t n = writev(fd, iov, count);
    if (n < 0) return Err("writev", "");
    return static_cast<size_t>(n);
  }
  Result<off_t> Seek(int fd, off_t offset, int whence) override {
    off_t r = lseek(fd, offset, whence);
    if (r < 0) return Err("lseek", "");
    return r;
  }
  Status Ftruncate(int fd, off_t size) override {
    if (ftruncate(fd, size) != 0) return Err("ftruncate", "");
    return {};
  }
  Status Fsync(int fd) override {
    if (fsync(fd) != 0) return Err("fsync", "");
    return {};
  }
  Result<vfs::Attr> Fstat(int fd) override {
    struct stat st;
    if (fstat(fd, &st) != 0) return Err("fstat", "");
    return st;
  }

  Result<vfs::Attr> Stat(const std::string& path) override {
    struct stat st;
    if (fstatat(root_fd_, Rel(path), &st, 0) != 0) return Err("stat", path);
    return st;
  }
  Result<vfs::Attr> Lstat(const std::string& path) override {
    struct stat st;
    if (fstatat(root_fd_, Rel(path), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return Err("lstat", path);
    }
    return st;
  }
  Status Truncate(const std::string& path, off_t size) override {
    std::string abs = root_path_ + "/" + path;
    if (abs.size() < PATH_MAX) {
      if (truncate(abs.c_str(), size) != 0) return Err("truncate", path);
      return {};
    }
    int fd = openat(root_fd_, Rel(path), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return Err("truncate", path);
    int r = ftruncate(fd, size);
    int err = errno;
    close(fd);
    if (r != 0) return Fail(err, "truncate", path);
    return {};
  }
  Status Rename(const std::string& from, const std::string& to,
                unsigned flags) override {
    if (renameat2(root_fd_, Rel(from), root_fd_, Rel(to), flags) != 0) {
      return Err("rename", from + " -> " + to);
    }
    return {};
  }
  Status Link(const std::string& from, const std::string& to) override {
    if (linkat(root_fd_, Rel(from), root_fd_, Rel(to), 0) != 0) {
      return Err("link", from + " -> " + to);
    }
    return {};
  }
  Status Unlink(const std::string& path) override {
    if (unlinkat(root_fd_, Rel(path), 0) != 0) return Err("unlink", path);
    return {};
  }
  Status Mkdir(const std::string& path, mode_t mode) override {
    if (mkdirat(root_fd_, Rel(path), mode) != 0) return Err("mkdir", path);
    return {};
  }
  Status Rmdir(const std::string& path) override {
    if (unlinkat(root_fd_, Rel(path), AT_REMOVEDIR) != 0) {
      return Err("rmdir", path);
    }
    return {};
  }
  Status Symlink(const std::string& target, const std::string& link) override {
    if (symlinkat(target.c_str(), root_fd_, Rel(link)) != 0) {
      return Err("symlink", link);
    }
    return {};
  }
  Result<std::string> Readlink(const std::string& path) override {
    std::string buf(PATH_MAX, '\0');
    ssize_t n = readlinkat(root_fd_, Rel(path), buf.data(), buf.size());
    if (n < 0) return Err("readlink", path);
    buf.resize(n);
    return buf;
  }
  Result<std::vector<std::string>> ReadDir(const std::string& path) override {
    int fd = openat(root_fd_, Rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Err("opendir", path);
    DIR* dir = fdopendir(fd);
    if (dir == nullptr) {
      int err = errno;
      close(fd);
      return Fail(err, "fdopendir", path);
    }
    std::vector<std::string> names;
    errno = 0;
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(std::move(name));
      errno = 0;
    }
    int err = errno;
    closedir(dir);
    if (err != 0) return Fail(err, "readdir", path);
    return names;
  }
  Status Chmod(const std::string& path, mode_t mode) override {
    if (fchmodat(root_fd_, Rel(path), mode, 0) != 0) return Err("chmod", path);
    return {};
  }
  Status Chown(const std::string& path, uid_t uid, gid_t gid) override {
    if (fchownat(root_fd_, Rel(path), uid, gid, AT_SYMLINK_NOFOLLOW) != 0) {
      return Err("lchown", path);
    }
    return {};
  }
  Status Utimens(const std::string& path,
                 const struct timespec times[2]) override {
    if (utimensat(root_fd_, Rel(path), times, AT_SYMLINK_NOFOLLOW) != 0) {
      return Err("utimensat", path);
    }
    return {};
  }

  bool SupportsMmap() const override { return true; }
  Result<void*> Mmap(int fd, size_t length, int prot, int flags,
                     off_t offset) override {
    void* p = mmap(nullptr, length, prot, flags, fd, offset);
    if (p == MAP_FAILED) return Err("mmap", "");
    return p;
  }

 private:
  static std::unexpected<vfs::Error> Fail(int err, std::string_view op,
                                          const std::string& path) {
    return std::unexpected(vfs::FromErrno(err, op, path));
  }
  static std::unexpected<vfs::Error> Err(std::string_view op,
                                         const std::string& path) {
    return Fail(errno, op, path);
  }

  const int root_fd_;
  const std::string root_path_;
  std::shared_ptr<void> keep_alive_;
  std::mutex mu_;
  std::set<int> fds_;  // guarded by mu_: descriptors the test left open
};

}  // namespace

Result<std::unique_ptr<FsOps>> MakeSyscallOps(
    const std::string& root_path, std::shared_ptr<void> keep_alive) {
  int fd = open(root_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return std::unexpected(vfs::FromErrno(errno, "open root", root_path));
  }
  return std::make_unique<SyscallOps>(fd, root_path, std::move(keep_alive));
}

}  // namespace agentvfs::conformance
