// FsOps over a vfs::Backend: what a frontend (the harness's file tools, the
// FUSE layer) does with the interface, minus the kernel. The small amount of
// state a kernel keeps for a program is kept here: a descriptor table with a
// file position per descriptor, and stat(2)'s following of a final symlink
// (the Backend's Stat is lstat), resolved relative to the link's directory
// as the kernel would.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "tests/conformance/fs_ops.h"

namespace agentvfs::conformance {
namespace {

using vfs::Fail;

class BackendOps final : public FsOps {
 public:
  BackendOps(vfs::Backend* backend, std::string prefix,
             std::shared_ptr<void> keep_alive, vfs::Caller caller)
      : backend_(backend),
        prefix_(std::move(prefix)),
        caller_(std::move(caller)),
        keep_alive_(std::move(keep_alive)) {}

  ~BackendOps() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      files_.clear();
    }
    keep_alive_.reset();
  }

  Result<int> Open(const std::string& path, int flags, mode_t mode) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    auto handle = backend_->Open(caller_, *p, flags, mode);
    if (!handle) return std::unexpected(handle.error());
    auto file = std::make_shared<OpenFile>();
    file->handle = std::move(*handle);
    file->flags = flags;
    std::lock_guard<std::mutex> lock(mu_);
    int fd = next_fd_++;
    files_[fd] = std::move(file);
    return fd;
  }

  Status Close(int fd) override {
    std::shared_ptr<OpenFile> file;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = files_.find(fd);
      if (it == files_.end()) return Fail(EBADF, "no such descriptor");
      file = std::move(it->second);
      files_.erase(it);
    }
    return file->handle->Flush();
  }

  Result<size_t> Read(int fd, void* buf, size_t size) override {
    auto file = Get(fd);
    if (!file) return std::unexpected(file.error());
    std::lock_guard<std::mutex> lock((*file)->mu);
    auto n = (*file)->handle->Read(buf, size, (*file)->pos);
    if (n) (*file)->pos += *n;
    return n;
  }

  Result<size_t> Write(int fd, const void* buf, size_t size) override {
    auto file = Get(fd);
    if (!file) return std::unexpected(file.error());
    OpenFile& f = **file;
    std::lock_guard<std::mutex> lock(f.mu);
    auto n = f.handle->Write(buf, size, f.pos);
    if (!n) return n;
    if (f.flags & O_APPEND) {
      // The backend wrote at the end; the position follows, as in write(2).
      auto st = f.handle->Stat();
      if (!st) return std::unexpected(st.error());
      f.pos = st->st_size;
    } else {
      f.pos += *n;
    }
    return n;
  }

  Result<size_t> Pread(int fd, void* buf, size_t size, off_t offset) override {
    auto file = Get(fd);
    if (!file) return std::unexpected(file.error());
    return (*file)->handle->Read(buf, size, offset);
  }

  Result<size_t> Pwrite(int fd, const void* buf, size_t size,
                        off_t offset) override {
    auto file = Get(fd);
    if (!file) return std::unexpected(file.error());
    return (*file)->handle->Write(buf, size, offset);
  }

  // One backend call per vector, like the kernel's single read/write.
  Result<size_t> Readv(int fd, const struct iovec* iov, int count) override {
    size_t total = 0;
    for (int i = 0; i < count; ++i) total += iov[i].iov_len;
    std::string buf(total, '\0');
    auto n = Read(fd, buf.data(), total);
    if (!n) return n;
    size_t done = 0;
    for (int i = 0; i < count && done < *n; ++i) {
      size_t part = std::min(iov[i].iov_len, *n - done);
      std::memcpy(iov[i].iov_base, buf.data() + done, part);
      done += part;
    }
    return n;
  }

  Result<size_t> Writev(int fd, const struct iovec* iov, int count) override {
    std::string buf;
    for (int i = 0; i < count; ++i) {
      buf.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
    }
    return Write(fd, buf.data(), buf.size());
  }

  Result<off_t> Seek(int fd, off_t offset, int whence) override {
    auto file = Get(fd);
    if (!file) return std::unexpected(file.error());
    OpenFile& f = **file;
    std::lock_guard<std::mutex> lock(f.mu);
    off_t base = 0;
    if (whence == SEEK_CUR) {
      base = f.pos;
    } else if (whence == SEEK_END) {
      auto st = f.handle->Stat();
      if (!st) return std::unexpected(st.error());
      base = st->st_size;
    } else if (whence != SEEK_SET) {
      return Fail(EINVAL, "bad whence");
    }
    if (base + offset < 0) return Fail(EINVAL, "negative offset");
    f.pos = base + offset;
    return f.pos;
  }

  Status Ftruncate(int fd, off_t size) override {
    auto file = Get(fd);
    if (!file) return std::unexpected(file.error());
    return (*file)->handle->Truncate(size);
  }
  Status Fsync(int fd) override {
    auto file = Get(fd);
    if (!file) return std::unexpected(file.error());
    return (*file)->handle->Sync(false);
  }
  Result<vfs::Attr> Fstat(int fd) override {
    auto file = Get(fd);
    if (!file) return std::unexpected(file.error());
    return (*file)->handle->Stat();
  }

  Result<vfs::Attr> Stat(const std::string& path) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    vfs::Path current = *p;
    for (int hops = 0; hops < 40; ++hops) {
      auto st = backend_->Stat(caller_, current);
      if (!st || !S_ISLNK(st->st_mode)) return st;
      auto target = backend_->Readlink(caller_, current);
      if (!target) return std::unexpected(target.error());
      if (target->starts_with("/")) {
        return Fail(ENOENT, "absolute symlink targets are not followed here");
      }
      auto next = vfs::Path::Parse(current.Parent().str() + "/" + *target);
      if (!next) return std::unexpected(next.error());
      current = *next;
    }
    return Fail(ELOOP, "too many levels of symbolic links");
  }
  Result<vfs::Attr> Lstat(const std::string& path) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Stat(caller_, *p);
  }
  Status Truncate(const std::string& path, off_t size) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Truncate(caller_, *p, size);
  }
  Status Rename(const std::string& from, const std::string& to,
                unsigned flags) override {
    auto f = Parse(from);
    if (!f) return std::unexpected(f.error());
    auto t = Parse(to);
    if (!t) return std::unexpected(t.error());
    return backend_->Rename(caller_, *f, *t, flags);
  }
  Status Link(const std::string& from, const std::string& to) override {
    auto f = Parse(from);
    if (!f) return std::unexpected(f.error());
    auto t = Parse(to);
    if (!t) return std::unexpected(t.error());
    return backend_->Link(caller_, *f, *t);
  }
  Status Unlink(const std::string& path) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Unlink(caller_, *p);
  }
  Status Mkdir(const std::string& path, mode_t mode) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Mkdir(caller_, *p, mode);
  }
  Status Rmdir(const std::string& path) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Rmdir(caller_, *p);
  }
  Status Symlink(const std::string& target, const std::string& link) override {
    auto p = Parse(link);
    if (!p) return std::unexpected(p.error());
    return backend_->Symlink(caller_, target, *p);
  }
  Result<std::string> Readlink(const std::string& path) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Readlink(caller_, *p);
  }
  Result<std::vector<std::string>> ReadDir(const std::string& path) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    auto entries = backend_->ReadDir(caller_, *p);
    if (!entries) return std::unexpected(entries.error());
    std::vector<std::string> names;
    for (auto& e : *entries) names.push_back(std::move(e.name));
    return names;
  }
  Status Chmod(const std::string& path, mode_t mode) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Chmod(caller_, *p, mode);
  }
  Status Chown(const std::string& path, uid_t uid, gid_t gid) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Chown(caller_, *p, uid, gid);
  }
  Status Utimens(const std::string& path,
                 const struct timespec times[2]) override {
    auto p = Parse(path);
    if (!p) return std::unexpected(p.error());
    return backend_->Utimens(caller_, *p, times);
  }

 private:
  struct OpenFile {
    std::unique_ptr<vfs::FileHandle> handle;
    int flags = 0;
    std::mutex mu;  // guards pos
    off_t pos = 0;
  };

  Result<vfs::Path> Parse(const std::string& rel) const {
    return vfs::Path::Parse(rel.empty() ? prefix_ : prefix_ + "/" + rel);
  }

  Result<std::shared_ptr<OpenFile>> Get(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(fd);
    if (it == files_.end()) return Fail(EBADF, "no such descriptor");
    return it->second;
  }

  vfs::Backend* const backend_;
  const std::string prefix_;
  const vfs::Caller caller_;
  std::shared_ptr<void> keep_alive_;
  std::mutex mu_;
  std::map<int, std::shared_ptr<OpenFile>> files_;  // guarded by mu_
  int next_fd_ = 3;                                 // guarded by mu_
};

}  // namespace

std::unique_ptr<FsOps> MakeBackendOps(vfs::Backend* backend, std::string prefix,
                                      std::shared_ptr<void> keep_alive,
                                      vfs::Caller caller) {
  return std::make_unique<BackendOps>(backend, std::move(prefix),
                                      std::move(keep_alive), std::move(caller));
}

}  // namespace agentvfs::conformance
