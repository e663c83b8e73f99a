// LocalDirBackend: a host directory served with every lookup confined beneath
// a root directory fd. The pattern throughout: resolve the *parent* of a path
// with openat2(RESOLVE_BENEATH) (the kernel refuses any '..' or symlink that
// would step out, atomically with the walk, so a concurrent swap of a
// directory for a symlink cannot redirect it), then act on (parent fd, name)
// with a call that does not follow the last component. What has no *at()
// form (chmod of an O_PATH fd, xattrs, reopening a file pinned with O_PATH
// once its type is checked) goes through /proc/self/fd/N, which names
// exactly the inode already pinned: the one deliberate use of magic links
// here, always after the confined resolution.
#include "backends/local_dir/local_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace agentvfs::backends {
namespace {

using vfs::Caller;
using vfs::Fail;
using vfs::Path;
using vfs::Result;
using vfs::Status;

// openat2 returns EAGAIN when a rename raced a '..' step under
// RESOLVE_BENEATH; the kernel expects the caller to retry.
constexpr int kMaxResolveRetries = 16;
// Symlinks followed by hand before ELOOP, as the kernel's limit.
constexpr int kMaxSymlinkDepth = 40;
// Rounds of "create exclusively, else open the existing file" before giving
// up on a path that keeps appearing and disappearing under us.
constexpr int kMaxCreateRounds = 8;
// Open flags passed to the host. Anything else (O_ASYNC, kernel-internal bits
// FUSE may forward) is dropped: openat2, unlike open, rejects unknown bits.
constexpr int kPassedOpenFlags =
    O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC | O_APPEND | O_NOFOLLOW | O_DIRECT |
    O_DSYNC | O_SYNC | O_NONBLOCK | O_NOATIME | O_DIRECTORY | O_LARGEFILE;

// Where a failing errno came from: resolving the path, or the operation.
enum class Stage { kResolve, kOperate };

// The one errno -> vfs::Error mapping of this backend.
vfs::Error FromErrno(int err, std::string_view op, std::string_view path,
                     Stage stage = Stage::kOperate) {
  if (stage == Stage::kResolve) {
    // Under RESOLVE_BENEATH, EXDEV means a '..' or an (absolute) symlink
    // tried to leave the root. Outside of resolution EXDEV keeps its usual
    // meaning (rename/link across mounts), hence the stage.
    if (err == EXDEV) {
      return vfs::Error{
          EACCES, std::string(op) + " " + std::string(path) +
                      ": the path leads outside the workspace through a "
                      "symlink; use a path (or a relative symlink) that stays "
                      "inside the workspace"};
    }
    if (err == EAGAIN) {
      return vfs::Error{EAGAIN, std::string(op) + " " + std::string(path) +
                                    ": directories were renamed while the "
                                    "path was looked up; try again"};
    }
  }
  return vfs::FromErrno(err, op, path);
}

// The current errno as a failed result.
std::unexpected<vfs::Error> Errno(std::string_view op, const Path& path,
                                  Stage stage = Stage::kOperate) {
  return std::unexpected(FromErrno(errno, op, path.str(), stage));
}

// A given errno as a failed result, for cases decided here, not by a syscall.
std::unexpected<vfs::Error> Errno(int err, std::string_view op,
                                  const Path& path) {
  return std::unexpected(FromErrno(err, op, path.str()));
}

// Owns one file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  // Gives up ownership.
  int Release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// openat2(root_fd, rel, ...) confined beneath root_fd. Returns the fd, or -1
// with errno set.
int OpenBeneath(int root_fd, const std::string& rel, int flags, mode_t mode) {
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(static_cast<unsigned>(flags)) | O_CLOEXEC;
  // openat2 insists on mode 0 unless a file may be created.
  how.mode = (flags & O_CREAT) ? (mode & 07777) : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (int attempt = 0;; ++attempt) {
    long fd = syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    if (errno == EINTR) continue;
    if (errno != EAGAIN || attempt >= kMaxResolveRetries) return -1;
  }
}

// "/proc/self/fd/N" or "/proc/self/fd/N/name": the pinned fd itself, or the
// entry `name` of the pinned directory fd. The magic link is only ever an
// intermediate (or, for chmod, the whole) step, never agent-controlled.
std::string ProcFdPath(int fd, std::string_view name = {}) {
  std::string out = "/proc/self/fd/" + std::to_string(fd);
  if (!name.empty()) {
    out += '/';
    out += name;
  }
  return out;
}

// The path a relative symlink body `target` names when read in directory
// `dir`, by name ('.' and '..' taken lexically); nullopt when '..' climbs
// above the root.
std::optional<Path> LinkTarget(const Path& dir, std::string_view target) {
  std::vector<std::string_view> parts = dir.Components();
  size_t start = 0;
  while (start <= target.size()) {
    size_t end = target.find('/', start);
    if (end == std::string_view::npos) end = target.size();
    std::string_view part = target.substr(start, end - start);
    start = end + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (parts.empty()) return std::nullopt;
      parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string text;
  for (auto part : parts) {
    text += '/';
    text += part;
  }
  auto parsed = Path::Parse(text.empty() ? "/" : text);
  if (!parsed) return std::nullopt;
  return *parsed;
}

// What a path-taking operation acts on: `name` inside the pinned directory
// `dirfd`. For the root itself, dirfd is the root fd, name is "" and
// `empty_path` is AT_EMPTY_PATH, so *at() calls that accept it act on the
// root directory.
struct Target {
  UniqueFd parent;  // owns dirfd unless the target is the root
  int dirfd = -1;
  std::string name;
  int empty_path = 0;
};

// The pinned parent directory of a (non-root) path.
Result<Target> LocateParent(int root_fd, const Path& path,
                            std::string_view op) {
  int fd =
      OpenBeneath(root_fd, path.Parent().Relative(), O_PATH | O_DIRECTORY, 0);
  if (fd < 0) return Errno(op, path, Stage::kResolve);
  Target t;
  t.parent = UniqueFd(fd);
  t.dirfd = fd;
  t.name = std::string(path.Name());
  return t;
}

Result<Target> Locate(int root_fd, const Path& path, std::string_view op) {
  if (!path.IsRoot()) return LocateParent(root_fd, path, op);
  Target t;
  t.dirfd = root_fd;
  t.empty_path = AT_EMPTY_PATH;
  return t;
}

// The owner a file created for `c` in a directory with attributes `parent`
// gets; -1 leaves that part as the kernel made it. A set-group-ID parent
// already gave the new file its group, as it would for a local process.
std::pair<uid_t, gid_t> NewOwner(const Caller& c, const struct stat& parent) {
  uid_t uid = c.uid.value_or(vfs::kKeepUid);
  gid_t gid = (parent.st_mode & S_ISGID) ? vfs::kKeepGid
                                         : c.gid.value_or(vfs::kKeepGid);
  return {uid, gid};
}

bool HasIdentity(const Caller& c) {
  return c.uid.has_value() || c.gid.has_value();
}

// Makes the calling thread act as `c` on the host while it lives.
//
// Always for creation: mkdir, mknod, symlink and open(O_CREAT) give the new
// entry its owner in the same step (giving it away afterwards by name would
// give away whatever the agent renamed over that name in between). The
// thread's filesystem uid and gid become the caller's; a set-group-ID parent
// still gives its group, as for a local process.
//
// With the caller's supplementary groups known (Caller::groups, set by a
// frontend whose own checks ran on cached attributes), the host also checks
// permissions as the caller: the thread takes those groups and no effective
// capabilities, so every operation is allowed exactly when it would be for
// the caller's own process on the host, against the file that is there now.
// Otherwise the thread keeps the effective capabilities it had (leaving
// uid 0 drops the filesystem ones; they are put back): the host's checks
// stay the daemon's.
//
// Only this thread changes: Linux credentials are per thread, glibc does not
// broadcast setfsuid, setgroups is called as a raw syscall (glibc's wrapper
// would change every thread), and capset with pid 0 is the thread's.
class ActAs {
 public:
  ActAs() = default;
  ActAs(const ActAs&) = delete;
  ActAs& operator=(const ActAs&) = delete;
  ~ActAs() { Leave(); }

  // Back to the daemon's own credentials before the end of the scope.
  void Leave() {
    if (!entered_ && !groups_set_) return;
    const int err = errno;  // the failure being reported, if any
    if (entered_) {
      // Back to uid 0 the kernel raises the filesystem capabilities from
      // the permitted set; the saved set says which were effective.
      setfsuid(old_uid_);
      setfsgid(old_gid_);
      syscall(SYS_capset, &header_, saved_);
    }
    if (groups_set_)
      syscall(SYS_setgroups, old_groups_.size(), old_groups_.data());
    entered_ = groups_set_ = false;
    errno = err;
  }

  // Switches to c's identity. True when a node made now is the caller's
  // (switched, or the caller is who the daemon is); false when it must be
  // given away afterwards (ChownNew): no identity, or a daemon that cannot
  // switch (not root), which also cannot give it to anyone but itself.
  Result<bool> Enter(const Caller& c, std::string_view op, const Path& path) {
    if (!HasIdentity(c)) return false;
    const uid_t uid = c.uid.value_or(geteuid());
    const gid_t gid = c.gid.value_or(getegid());
    const bool checked = c.groups.has_value() && uid != 0;
    if (uid == geteuid() && gid == getegid() && !checked) return true;
    if (geteuid() != 0) return false;
    header_ = {_LINUX_CAPABILITY_VERSION_3, 0};
    if (syscall(SYS_capget, &header_, saved_) != 0) return Errno(op, path);
    if (checked) {
      int n = getgroups(0, nullptr);
      if (n < 0) return Errno(op, path);
      old_groups_.resize(static_cast<size_t>(n));
      if (n > 0 && getgroups(n, old_groups_.data()) != n)
        return Errno(op, path);
      if (syscall(SYS_setgroups, c.groups->size(), c.groups->data()) != 0)
        return Errno(op, path);
      groups_set_ = true;
    }
    // setfsuid/setfsgid report the previous id and never fail loudly: the
    // switch is read back (an invalid id, -1, only reads).
    old_uid_ = static_cast<uid_t>(setfsuid(uid));
    old_gid_ = static_cast<gid_t>(setfsgid(gid));
    entered_ = true;
    if (static_cast<uid_t>(setfsuid(-1)) != uid ||
        static_cast<gid_t>(setfsgid(-1)) != gid) {
      Leave();
      return false;
    }
    __user_cap_data_struct now[_LINUX_CAPABILITY_U32S_3];
    for (size_t i = 0; i < _LINUX_CAPABILITY_U32S_3; ++i) {
      now[i] = saved_[i];
      if (checked) now[i].effective = 0;
    }
    if ((checked || uid != 0) && syscall(SYS_capset, &header_, now) != 0) {
      const int err = errno;
      Leave();
      return Errno(err, op, path);
    }
    return true;
  }

 private:
  bool entered_ = false;
  bool groups_set_ = false;
  uid_t old_uid_ = 0;
  gid_t old_gid_ = 0;
  std::vector<gid_t> old_groups_;
  __user_cap_header_struct header_{};
  __user_cap_data_struct saved_[_LINUX_CAPABILITY_U32S_3]{};
};

// Gives the just-created entry `t.name` in `t.dirfd` to the caller, for a
// daemon that could not create it as the caller (ActAs): one that cannot
// switch ids can only give a node to itself, so the swap ActAs guards
// against cannot hand anything to anyone else.
Status ChownNew(const Caller& c, const Target& t, const Path& path,
                std::string_view op) {
  if (!HasIdentity(c)) return {};
  struct stat parent;
  if (fstat(t.dirfd, &parent) != 0) return Errno(op, path);
  auto [uid, gid] = NewOwner(c, parent);
  if (fchownat(t.dirfd, t.name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0)
    return Errno(op, path);
  return {};
}

bool IsDevice(mode_t mode) { return S_ISCHR(mode) || S_ISBLK(mode); }

// A path resolved beneath the root with O_PATH (following a final symlink
// unless `nofollow`), plus its attributes, so the type can be checked before
// anything with side effects (opening a device, a FIFO) happens.
struct Pinned {
  UniqueFd fd;
  struct stat st;
};

Result<Pinned> PinBeneath(int root_fd, const Path& path, bool nofollow,
                          std::string_view op) {
  int fd = OpenBeneath(root_fd, path.Relative(),
                       O_PATH | (nofollow ? O_NOFOLLOW : 0), 0);
  if (fd < 0) return Errno(op, path, Stage::kResolve);
  Pinned p{UniqueFd(fd), {}};
  if (fstat(fd, &p.st) != 0) return Errno(op, path);
  if (IsDevice(p.st.st_mode)) {
    return Fail(EACCES, std::string(op) + " " + path.str() +
                            ": is a device node; device files are not opened "
                            "in the workspace");
  }
  return p;
}

// Opens the inode `pinned` refers to with `flags`, through its magic link:
// the check done on the pinned inode cannot be raced by a rename.
Result<UniqueFd> Reopen(const Pinned& pinned, int flags, const Path& path,
                        std::string_view op) {
  flags &= ~(O_CREAT | O_EXCL | O_NOFOLLOW);
  int fd;
  do {
    fd = open(ProcFdPath(pinned.fd.get()).c_str(), flags | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Errno(op, path);
  return UniqueFd(fd);
}

// An open host file. All I/O is positional (or O_APPEND writes), so
// concurrent calls on one handle are safe.
class LocalFile final : public vfs::FileHandle {
 public:
  LocalFile(UniqueFd fd, bool append, std::string path)
      : fd_(std::move(fd)), append_(append), path_(std::move(path)) {}

  Result<size_t> Read(void* buf, size_t size, off_t offset) override {
    ssize_t n = pread(fd_.get(), buf, size, offset);
    if (n < 0) return std::unexpected(FromErrno(errno, "read", path_));
    return static_cast<size_t>(n);
  }

  Result<size_t> Write(const void* buf, size_t size, off_t offset) override {
    // With O_APPEND the kernel places the data at the end. Linux pwrite
    // would too (a documented bug), but write(2) says what is meant.
    ssize_t n = append_ ? write(fd_.get(), buf, size)
                        : pwrite(fd_.get(), buf, size, offset);
    if (n < 0) return std::unexpected(FromErrno(errno, "write", path_));
    return static_cast<size_t>(n);
  }

  Result<vfs::Attr> Stat() override {
    vfs::Attr st;
    if (fstat(fd_.get(), &st) != 0)
      return std::unexpected(FromErrno(errno, "stat", path_));
    return st;
  }

  Status Truncate(off_t size) override {
    if (ftruncate(fd_.get(), size) != 0)
      return std::unexpected(FromErrno(errno, "truncate", path_));
    return {};
  }

  Status Sync(bool datasync) override {
    int rc = datasync ? fdatasync(fd_.get()) : fsync(fd_.get());
    if (rc != 0) return std::unexpected(FromErrno(errno, "fsync", path_));
    return {};
  }

  Status Allocate(int mode, off_t offset, off_t length) override {
    if (fallocate(fd_.get(), mode, offset, length) != 0)
      return std::unexpected(FromErrno(errno, "fallocate", path_));
    return {};
  }

  int NativeFd() const override { return fd_.get(); }
  // Data lives in the host file from the moment it is written.
  bool NeedsFlush() const override { return false; }

 private:
  const UniqueFd fd_;
  const bool append_;
  const std::string path_;  // for messages
};

}  // namespace

Result<std::unique_ptr<LocalDirBackend>> LocalDirBackend::Open(
    const std::string& root_dir) {
  int fd = open(root_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = "workspace directory '" + root_dir + "' ";
    switch (err) {
      case ENOENT:
        msg += "does not exist; create it (mkdir -p '" + root_dir +
               "') or give an existing directory";
        break;
      case ENOTDIR:
        msg += "is not a directory; give a directory";
        break;
      case EACCES:
        msg += "cannot be searched by this process; fix its permissions";
        break;
      default:
        return std::unexpected(FromErrno(err, "open workspace", root_dir));
    }
    return Fail(err, std::move(msg));
  }
  UniqueFd root(fd);
  // Without openat2 (Linux >= 5.6) nothing can be resolved safely, so find
  // out now rather than on the first request.
  int probe = OpenBeneath(fd, ".", O_PATH | O_DIRECTORY, 0);
  if (probe < 0) {
    if (errno == ENOSYS) {
      return Fail(ENOSYS,
                  "this kernel lacks openat2(2) (Linux 5.6 or newer is "
                  "needed to confine the workspace); upgrade the kernel");
    }
    return std::unexpected(FromErrno(errno, "open workspace", root_dir));
  }
  close(probe);
  return std::unique_ptr<LocalDirBackend>(
      new LocalDirBackend(root.Release(), root_dir));
}

LocalDirBackend::~LocalDirBackend() { close(root_fd_); }

Result<vfs::Attr> LocalDirBackend::Stat(const Caller&, const Path& path) {
  auto t = Locate(root_fd_, path, "stat");
  if (!t) return std::unexpected(t.error());
  vfs::Attr st;
  if (fstatat(t->dirfd, t->name.c_str(), &st,
              AT_SYMLINK_NOFOLLOW | t->empty_path) != 0)
    return Errno("stat", path);
  return st;
}

Result<std::vector<vfs::DirEntry>> LocalDirBackend::ReadDir(const Caller& c,
                                                            const Path& path) {
  ActAs as;
  if (auto e = as.Enter(c, "readdir", path); !e)
    return std::unexpected(e.error());
  // O_NOFOLLOW: like every method but Open, ReadDir does not follow a final
  // symlink (the kernel answers ENOTDIR for one).
  int fd = OpenBeneath(root_fd_, path.Relative(),
                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
  if (fd < 0) return Errno("readdir", path, Stage::kResolve);
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    int err = errno;
    close(fd);
    return std::unexpected(FromErrno(err, "readdir", path.str()));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> closer(dir, closedir);
  std::vector<vfs::DirEntry> entries;
  for (;;) {
    errno = 0;
    struct dirent* de = readdir(dir);
    if (de == nullptr) {
      if (errno != 0) return Errno("readdir", path);
      break;
    }
    std::string_view name = de->d_name;
    if (name == "." || name == "..") continue;
    mode_t type = DTTOIF(de->d_type);
    if (de->d_type == DT_UNKNOWN) {
      struct stat st;
      if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed since it was listed
        return Errno("readdir", path);
      }
      type = st.st_mode & S_IFMT;
    }
    entries.push_back(vfs::DirEntry{std::string(name), de->d_ino, type});
  }
  return entries;
}

Result<std::unique_ptr<vfs::FileHandle>> LocalDirBackend::Open(const Caller& c,
                                                               const Path& path,
                                                               int flags,
                                                               mode_t mode) {
  ActAs as;
  auto as_caller = as.Enter(c, "open", path);
  if (!as_caller) return std::unexpected(as_caller.error());
  return OpenFollowing(c, path, flags, mode, 0, *as_caller);
}

Result<std::unique_ptr<vfs::FileHandle>> LocalDirBackend::OpenFollowing(
    const Caller& c, const Path& path, int flags, mode_t mode, int links,
    bool as_caller) {
  if ((flags & O_PATH) == O_PATH)
    return Fail(EINVAL, "open " + path.str() +
                            ": O_PATH is not supported; open for reading or "
                            "writing");
  if ((flags & O_TMPFILE) == O_TMPFILE)
    return Fail(EOPNOTSUPP,
                "open " + path.str() + ": O_TMPFILE is not supported here");
  if ((flags & O_ACCMODE) == O_ACCMODE)
    return Fail(EINVAL, "open " + path.str() + ": invalid access mode");
  flags = (flags & kPassedOpenFlags) | O_NOCTTY;
  const bool append = flags & O_APPEND;
  auto handle = [&](UniqueFd fd) -> std::unique_ptr<vfs::FileHandle> {
    return std::make_unique<LocalFile>(std::move(fd), append, path.str());
  };

  // Opens the existing file without creating it: pin, refuse devices and
  // O_NOFOLLOW symlinks, reopen.
  auto open_existing = [&]() -> Result<std::unique_ptr<vfs::FileHandle>> {
    auto pinned = PinBeneath(root_fd_, path, flags & O_NOFOLLOW, "open");
    if (!pinned) return std::unexpected(pinned.error());
    if (S_ISLNK(pinned->st.st_mode)) {
      // What open(2) says for O_NOFOLLOW on a symlink.
      return Errno(ELOOP, "open", path);
    }
    // Opening a FIFO waits for its other end, which a hostile sandbox
    // need never provide: the daemon would hang. A mount never asks (the
    // kernel serves FIFOs and sockets itself), so only tools get here.
    if (S_ISDIR(pinned->st.st_mode) && (flags & O_CREAT)) {
      // What open(2) says for O_CREAT on an existing directory.
      return Errno(EISDIR, "open", path);
    }
    if (S_ISFIFO(pinned->st.st_mode) || S_ISSOCK(pinned->st.st_mode)) {
      return Fail(ENXIO, "open " + path.str() +
                             ": is a FIFO or a socket; only regular files "
                             "and directories are opened here");
    }
    auto fd = Reopen(*pinned, flags, path, "open");
    if (!fd) return std::unexpected(fd.error());
    return handle(std::move(*fd));
  };

  if (!(flags & O_CREAT)) return open_existing();

  // Creation: O_EXCL first, so we know whether this call made the file and
  // must give it to the caller; an existing file is then opened as such.
  for (int round = 0; round < kMaxCreateRounds; ++round) {
    int fd = OpenBeneath(root_fd_, path.Relative(), flags | O_EXCL, mode);
    if (fd >= 0) {
      UniqueFd owned(fd);
      if (HasIdentity(c) && !as_caller) {
        auto parent = LocateParent(root_fd_, path, "open");
        if (!parent) return std::unexpected(parent.error());
        struct stat pst;
        if (fstat(parent->dirfd, &pst) != 0) return Errno("open", path);
        auto [uid, gid] = NewOwner(c, pst);
        if (fchown(fd, uid, gid) != 0) return Errno("open", path);
        // chown clears set-user-ID and set-group-ID; a file the caller had
        // created itself would keep them, so put back what it asked for
        // (set-group-ID only when the file's group is the caller's own).
        mode_t keep = mode & S_ISUID;
        if ((mode & S_ISGID) && c.gid &&
            (gid == vfs::kKeepGid ? pst.st_gid : gid) == *c.gid)
          keep |= S_ISGID;
        if (keep != 0 && fchmod(fd, (mode & (0777 | S_ISVTX)) | keep) != 0)
          return Errno("open", path);
      }
      return handle(std::move(owned));
    }
    if (errno != EEXIST || (flags & O_EXCL))
      return Errno("open", path, Stage::kResolve);
    auto existing = open_existing();
    if (existing || existing.error().code != ENOENT) return existing;
    // Exists, yet following it finds nothing: a dangling symlink (handled
    // below), or a file removed between the two opens (another round).
    auto parent = LocateParent(root_fd_, path, "open");
    if (!parent) return std::unexpected(parent.error());
    struct stat lst;
    if (fstatat(parent->dirfd, parent->name.c_str(), &lst,
                AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(lst.st_mode))
      break;
  }
  // A symlink to a missing file, which open(2) creates. Letting the kernel
  // follow it here would act on whatever the link names by then (the
  // sandbox can swap it): truncate an existing file, give it to the caller,
  // or block on a FIFO. So read the link from the pinned parent and create
  // at its target, with the same O_EXCL-first steps. The target is
  // resolved by name under the link's directory ('..' lexically, never
  // above the root); an absolute target leads out of the workspace.
  if (links >= kMaxSymlinkDepth) return Errno(ELOOP, "open", path);
  auto parent = LocateParent(root_fd_, path, "open");
  if (!parent) return std::unexpected(parent.error());
  std::string target(PATH_MAX, '\0');
  ssize_t len = readlinkat(parent->dirfd, parent->name.c_str(), target.data(),
                           target.size());
  if (len < 0) {
    // No longer a symlink: it was replaced meanwhile; start again.
    if (errno == EINVAL || errno == ENOENT)
      return OpenFollowing(c, path, flags, mode, links + 1, as_caller);
    return Errno("open", path);
  }
  target.resize(static_cast<size_t>(len));
  if (target.empty() || target[0] == '/') {
    return Fail(EACCES, "open " + path.str() + ": it is a symlink to " +
                            target + ", which is outside the workspace");
  }
  auto next = LinkTarget(path.Parent(), target);
  if (!next) {
    return Fail(EACCES, "open " + path.str() + ": it is a symlink to " +
                            target + ", which is outside the workspace");
  }
  return OpenFollowing(c, *next, flags, mode, links + 1, as_caller);
}

Status LocalDirBackend::Mkdir(const Caller& c, const Path& path, mode_t mode) {
  if (path.IsRoot()) {
    return Errno(EEXIST, "mkdir", path);
  }
  ActAs as;
  auto as_caller = as.Enter(c, "mkdir", path);
  if (!as_caller) return std::unexpected(as_caller.error());
  auto t = LocateParent(root_fd_, path, "mkdir");
  if (!t) return std::unexpected(t.error());
  // The kernel already makes a directory in a set-group-ID parent
  // set-group-ID and gives it the parent's group.
  if (mkdirat(t->dirfd, t->name.c_str(), mode & 07777) != 0)
    return Errno("mkdir", path);
  if (*as_caller) return {};
  return ChownNew(c, *t, path, "mkdir");
}

Status LocalDirBackend::Mknod(const Caller& c, const Path& path, mode_t mode,
                              dev_t rdev) {
  if (IsDevice(mode)) {
    return Fail(EPERM, "mknod " + path.str() +
                           ": device nodes cannot be created in the "
                           "workspace; use a FIFO, a socket or a file");
  }
  if (path.IsRoot()) {
    return Errno(EEXIST, "mknod", path);
  }
  ActAs as;
  auto as_caller = as.Enter(c, "mknod", path);
  if (!as_caller) return std::unexpected(as_caller.error());
  auto t = LocateParent(root_fd_, path, "mknod");
  if (!t) return std::unexpected(t.error());
  if (mknodat(t->dirfd, t->name.c_str(), mode, rdev) != 0)
    return Errno("mknod", path);
  if (*as_caller) return {};
  return ChownNew(c, *t, path, "mknod");
}

Status LocalDirBackend::Unlink(const Caller& c, const Path& path) {
  ActAs as;
  if (auto e = as.Enter(c, "unlink", path); !e)
    return std::unexpected(e.error());
  if (path.IsRoot()) {
    return Errno(EISDIR, "unlink", path);
  }
  auto t = LocateParent(root_fd_, path, "unlink");
  if (!t) return std::unexpected(t.error());
  if (unlinkat(t->dirfd, t->name.c_str(), 0) != 0) return Errno("unlink", path);
  return {};
}

Status LocalDirBackend::Rmdir(const Caller& c, const Path& path) {
  ActAs as;
  if (auto e = as.Enter(c, "rmdir", path); !e)
    return std::unexpected(e.error());
  if (path.IsRoot()) {
    return Errno(EBUSY, "rmdir", path);
  }
  auto t = LocateParent(root_fd_, path, "rmdir");
  if (!t) return std::unexpected(t.error());
  if (unlinkat(t->dirfd, t->name.c_str(), AT_REMOVEDIR) != 0)
    return Errno("rmdir", path);
  return {};
}

Status LocalDirBackend::Symlink(const Caller& c, const std::string& target,
                                const Path& link) {
  if (link.IsRoot()) {
    return Errno(EEXIST, "symlink", link);
  }
  ActAs as;
  auto as_caller = as.Enter(c, "symlink", link);
  if (!as_caller) return std::unexpected(as_caller.error());
  auto t = LocateParent(root_fd_, link, "symlink");
  if (!t) return std::unexpected(t.error());
  if (symlinkat(target.c_str(), t->dirfd, t->name.c_str()) != 0)
    return Errno("symlink", link);
  if (*as_caller) return {};
  return ChownNew(c, *t, link, "symlink");
}

Result<std::string> LocalDirBackend::Readlink(const Caller&, const Path& path) {
  if (path.IsRoot()) {
    return Errno(EINVAL, "readlink", path);
  }
  auto t = LocateParent(root_fd_, path, "readlink");
  if (!t) return std::unexpected(t.error());
  // A symlink's content is at most PATH_MAX - 1 bytes on Linux; a full
  // buffer would mean truncation, so it is one byte larger than needed.
  std::string buf(vfs::kPathMax + 1, '\0');
  ssize_t n = readlinkat(t->dirfd, t->name.c_str(), buf.data(), buf.size());
  if (n < 0) return Errno("readlink", path);
  if (static_cast<size_t>(n) >= buf.size()) {
    return Errno(ENAMETOOLONG, "readlink", path);
  }
  buf.resize(static_cast<size_t>(n));
  return buf;
}

Status LocalDirBackend::Link(const Caller& c, const Path& from,
                             const Path& to) {
  ActAs as;
  if (auto e = as.Enter(c, "link", from); !e) return std::unexpected(e.error());
  if (from.IsRoot()) {
    return Errno(EPERM, "link", from);
  }
  if (to.IsRoot()) {
    return Errno(EEXIST, "link", to);
  }
  auto src = LocateParent(root_fd_, from, "link");
  if (!src) return std::unexpected(src.error());
  auto dst = LocateParent(root_fd_, to, "link");
  if (!dst) return std::unexpected(dst.error());
  // Flags 0: a symlink at `from` is linked itself, never followed.
  if (linkat(src->dirfd, src->name.c_str(), dst->dirfd, dst->name.c_str(), 0) !=
      0)
    return std::unexpected(
        FromErrno(errno, "link", from.str() + " -> " + to.str()));
  return {};
}

Status LocalDirBackend::Rename(const Caller& c, const Path& from,
                               const Path& to, unsigned flags) {
  ActAs as;
  if (auto e = as.Enter(c, "rename", from); !e)
    return std::unexpected(e.error());
  const std::string what = from.str() + " -> " + to.str();
  if (flags & ~static_cast<unsigned>(RENAME_NOREPLACE | RENAME_EXCHANGE))
    return Fail(EINVAL, "rename " + what + ": unsupported flags");
  if (from.IsRoot() || to.IsRoot())
    return Fail(EBUSY,
                "rename " + what + ": the workspace root cannot be renamed");
  auto src = LocateParent(root_fd_, from, "rename");
  if (!src) return std::unexpected(src.error());
  auto dst = LocateParent(root_fd_, to, "rename");
  if (!dst) return std::unexpected(dst.error());
  if (renameat2(src->dirfd, src->name.c_str(), dst->dirfd, dst->name.c_str(),
                flags) != 0)
    return std::unexpected(FromErrno(errno, "rename", what));
  return {};
}

Status LocalDirBackend::Chmod(const Caller& c, const Path& path, mode_t mode) {
  ActAs as;
  if (auto e = as.Enter(c, "chmod", path); !e)
    return std::unexpected(e.error());
  auto t = Locate(root_fd_, path, "chmod");
  if (!t) return std::unexpected(t.error());
  // fchmodat(AT_SYMLINK_NOFOLLOW) is not a syscall; pin the entry itself
  // (not what it points to) and change it through its fd.
  UniqueFd pinned;
  int fd = root_fd_;
  if (!path.IsRoot()) {
    fd = openat(t->dirfd, t->name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return Errno("chmod", path);
    pinned = UniqueFd(fd);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("chmod", path);
  if (S_ISLNK(st.st_mode)) {
    return Fail(EOPNOTSUPP, "chmod " + path.str() +
                                ": is a symlink; symlinks have no mode of "
                                "their own");
  }
  if (chmod(ProcFdPath(fd).c_str(), mode & 07777) == 0) return {};
  // A write or truncate by someone who may write the file but does not own
  // it makes the kernel clear its set-ID bits (as a local filesystem
  // would), by asking for this mode: the caller may not chmod, so the
  // daemon clears them for it, once the host agrees the caller may write.
  const mode_t now = st.st_mode & 07777, asked = mode & 07777;
  const mode_t dropped = now & ~asked;
  if (errno == EPERM && S_ISREG(st.st_mode) && dropped != 0 &&
      (dropped & ~static_cast<mode_t>(S_ISUID | S_ISGID)) == 0 &&
      (asked & ~now) == 0 &&
      faccessat(AT_FDCWD, ProcFdPath(fd).c_str(), W_OK, AT_EACCESS) == 0) {
    as.Leave();
    if (chmod(ProcFdPath(fd).c_str(), asked) == 0) return {};
  }
  return Errno("chmod", path);
}

Status LocalDirBackend::Chown(const Caller& c, const Path& path, uid_t uid,
                              gid_t gid) {
  ActAs as;
  if (auto e = as.Enter(c, "chown", path); !e)
    return std::unexpected(e.error());
  auto t = Locate(root_fd_, path, "chown");
  if (!t) return std::unexpected(t.error());
  if (fchownat(t->dirfd, t->name.c_str(), uid, gid,
               AT_SYMLINK_NOFOLLOW | t->empty_path) != 0)
    return Errno("chown", path);
  return {};
}

Status LocalDirBackend::Utimens(const Caller& c, const Path& path,
                                const struct timespec times[2]) {
  ActAs as;
  if (auto e = as.Enter(c, "utimens", path); !e)
    return std::unexpected(e.error());
  auto t = Locate(root_fd_, path, "utimens");
  if (!t) return std::unexpected(t.error());
  if (utimensat(t->dirfd, t->name.c_str(), times,
                AT_SYMLINK_NOFOLLOW | t->empty_path) != 0)
    return Errno("utimens", path);
  return {};
}

Status LocalDirBackend::Truncate(const Caller& c, const Path& path,
                                 off_t size) {
  ActAs as;
  if (auto e = as.Enter(c, "truncate", path); !e)
    return std::unexpected(e.error());
  auto pinned = PinBeneath(root_fd_, path, /*nofollow=*/false, "truncate");
  if (!pinned) return std::unexpected(pinned.error());
  // Checked before opening: a directory cannot be opened for writing, and
  // opening a FIFO for writing would block or fail with ENXIO.
  if (S_ISDIR(pinned->st.st_mode)) {
    return Errno(EISDIR, "truncate", path);
  }
  if (!S_ISREG(pinned->st.st_mode)) {
    return Errno(EINVAL, "truncate", path);
  }
  auto fd = Reopen(*pinned, O_WRONLY | O_NONBLOCK | O_NOCTTY, path, "truncate");
  if (!fd) return std::unexpected(fd.error());
  if (ftruncate(fd->get(), size) != 0) return Errno("truncate", path);
  return {};
}

Result<struct statvfs> LocalDirBackend::StatFs(const Caller&,
                                               const Path& path) {
  // The file system of `path` (which may be a mount inside the root).
  int fd = OpenBeneath(root_fd_, path.Relative(), O_PATH, 0);
  if (fd < 0) return Errno("statfs", path, Stage::kResolve);
  UniqueFd owned(fd);
  struct statvfs sv;
  if (fstatvfs(fd, &sv) != 0) return Errno("statfs", path);
  return sv;
}

// The l*xattr calls below address "/proc/self/fd/<parent>/<name>": the parent
// is pinned beneath the root and the l* family never follows `name`. The
// root itself is "/proc/self/fd/<root>/.".

Result<std::string> LocalDirBackend::GetXattr(const Caller& c, const Path& path,
                                              const std::string& name) {
  ActAs as;
  if (auto e = as.Enter(c, "getxattr", path); !e)
    return std::unexpected(e.error());
  auto t = Locate(root_fd_, path, "getxattr");
  if (!t) return std::unexpected(t.error());
  const std::string p = ProcFdPath(t->dirfd, path.IsRoot() ? "." : t->name);
  // Size, then value; the value may grow in between, hence the loop.
  for (int attempt = 0; attempt < 4; ++attempt) {
    ssize_t size = lgetxattr(p.c_str(), name.c_str(), nullptr, 0);
    if (size < 0) return Errno("getxattr", path);
    std::string value(static_cast<size_t>(size), '\0');
    ssize_t n = lgetxattr(p.c_str(), name.c_str(), value.data(), value.size());
    if (n >= 0) {
      value.resize(static_cast<size_t>(n));
      return value;
    }
    if (errno != ERANGE) return Errno("getxattr", path);
  }
  return Errno(ERANGE, "getxattr", path);
}

namespace {

// Only user.* attributes are set or removed: security.* and trusted.* are
// privileged (the daemon is root), and system.* are POSIX ACLs, which the
// host would enforce on the sandbox's own view of the files while a mount's
// permission checks would not.
Status WritableXattr(std::string_view op, const Path& path,
                     const std::string& name) {
  if (name.starts_with("security.") || name.starts_with("trusted.")) {
    return Fail(EPERM, std::string(op) + " " + path.str() + ": attribute '" +
                           name +
                           "' is privileged; only user.* attributes can be "
                           "changed in the workspace");
  }
  if (name.starts_with("system.")) {
    return Fail(EOPNOTSUPP, std::string(op) + " " + path.str() +
                                ": attribute '" + name +
                                "' (ACLs) is not supported; only user.* "
                                "attributes can be changed in the workspace");
  }
  return {};
}

}  // namespace

Status LocalDirBackend::SetXattr(const Caller& c, const Path& path,
                                 const std::string& name,
                                 const std::string& value, int flags) {
  ActAs as;
  if (auto e = as.Enter(c, "setxattr", path); !e)
    return std::unexpected(e.error());
  if (auto ok = WritableXattr("setxattr", path, name); !ok) return ok;
  auto t = Locate(root_fd_, path, "setxattr");
  if (!t) return std::unexpected(t.error());
  const std::string p = ProcFdPath(t->dirfd, path.IsRoot() ? "." : t->name);
  if (lsetxattr(p.c_str(), name.c_str(), value.data(), value.size(), flags) !=
      0)
    return Errno("setxattr", path);
  return {};
}

Result<std::vector<std::string>> LocalDirBackend::ListXattr(const Caller& c,
                                                            const Path& path) {
  ActAs as;
  if (auto e = as.Enter(c, "listxattr", path); !e)
    return std::unexpected(e.error());
  auto t = Locate(root_fd_, path, "listxattr");
  if (!t) return std::unexpected(t.error());
  const std::string p = ProcFdPath(t->dirfd, path.IsRoot() ? "." : t->name);
  for (int attempt = 0; attempt < 4; ++attempt) {
    ssize_t size = llistxattr(p.c_str(), nullptr, 0);
    if (size < 0) return Errno("listxattr", path);
    std::string buf(static_cast<size_t>(size), '\0');
    ssize_t n = llistxattr(p.c_str(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == ERANGE) continue;
      return Errno("listxattr", path);
    }
    // NUL-separated (and NUL-terminated) names.
    std::vector<std::string> names;
    size_t start = 0;
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      if (buf[i] != '\0') continue;
      if (i > start) names.emplace_back(buf.data() + start, i - start);
      start = i + 1;
    }
    return names;
  }
  return Errno(ERANGE, "listxattr", path);
}

Status LocalDirBackend::RemoveXattr(const Caller& c, const Path& path,
                                    const std::string& name) {
  ActAs as;
  if (auto e = as.Enter(c, "removexattr", path); !e)
    return std::unexpected(e.error());
  if (auto ok = WritableXattr("removexattr", path, name); !ok) return ok;
  auto t = Locate(root_fd_, path, "removexattr");
  if (!t) return std::unexpected(t.error());
  const std::string p = ProcFdPath(t->dirfd, path.IsRoot() ? "." : t->name);
  if (lremovexattr(p.c_str(), name.c_str()) != 0)
    return Errno("removexattr", path);
  return {};
}

}  // namespace agentvfs::backends
