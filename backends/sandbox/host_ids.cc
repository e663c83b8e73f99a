// HostIdLease and ReserveHostId (see host_ids.h).
#include "backends/sandbox/host_ids.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <sstream>
#include <utility>

namespace agentvfs::sandbox {

using vfs::Fail;

namespace {

std::string ErrText(int err) { return std::strerror(err); }

// Makes `dir` (and its parent) when missing, root's and 0700 for the last
// component, then checks that it is a directory owned by root that no one
// else can write, reached without following a symlink at its last step.
// Returns a descriptor of it.
vfs::Result<int> OpenLockDir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/')
    return Fail(EINVAL, "the host id lock directory must be an absolute path");
  auto slash = dir.rfind('/');
  std::string parent = slash == 0 ? "/" : dir.substr(0, slash);
  if (parent != "/" && mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST)
    return Fail(errno, "cannot make " + parent +
                           " (for the sandboxes' host id "
                           "locks): " +
                           ErrText(errno));
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Fail(errno, "cannot make " + dir +
                           " (the sandboxes' host id "
                           "locks): " +
                           ErrText(errno));
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return Fail(err == ELOOP ? ENOTDIR : err,
                "cannot open " + dir + " (the sandboxes' host id locks): " +
                    ErrText(err) + "; it must be a directory owned by root");
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_uid != 0 || (st.st_mode & 022) != 0) {
    close(fd);
    return Fail(EACCES, dir +
                            " (the sandboxes' host id locks) must be owned by "
                            "root and writable by no one else; remove it so "
                            "that agentvfs makes it afresh");
  }
  return fd;
}

bool NamedByAccount(uint32_t id) {
  // getpwuid_r/getgrgid_r: another thread may be looking up users too.
  char buf[16384];
  passwd pw;
  passwd* pwp = nullptr;
  if (getpwuid_r(id, &pw, buf, sizeof(buf), &pwp) == 0 && pwp != nullptr)
    return true;
  group gr;
  group* grp = nullptr;
  return getgrgid_r(id, &gr, buf, sizeof(buf), &grp) == 0 && grp != nullptr;
}

uint16_t RandomPick() {
  uint16_t pick = 0;
  if (getrandom(&pick, sizeof(pick), 0) != sizeof(pick))
    pick = static_cast<uint16_t>(getpid() ^ time(nullptr));
  return pick;
}

}  // namespace

HostIdLease::HostIdLease(HostIdLease&& o) noexcept
    : id_(o.id_), fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}

HostIdLease& HostIdLease::operator=(HostIdLease&& o) noexcept {
  if (this != &o) {
    Release();
    id_ = o.id_;
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

HostIdLease::~HostIdLease() { Release(); }

void HostIdLease::Release() {
  if (fd_ < 0) return;
  // Unlinked while still locked: a process that opened it meanwhile and
  // locks it after us finds it no longer linked and picks again.
  if (!path_.empty()) unlink(path_.c_str());
  close(std::exchange(fd_, -1));
}

vfs::Result<bool> HostIdInUse(uint32_t id) {
  DIR* procs = opendir("/proc");
  if (procs == nullptr)
    return Fail(errno,
                "cannot list /proc to check that a sandbox host id is "
                "unused: " +
                    ErrText(errno));
  const std::string want = std::to_string(id);
  bool used = false;
  while (dirent* e = readdir(procs)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string path = std::string("/proc/") + e->d_name + "/status";
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // gone meanwhile
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) continue;
    std::istringstream lines(std::string(buf, static_cast<size_t>(n)));
    std::string line;
    while (!used && std::getline(lines, line)) {
      if (line.rfind("Uid:", 0) != 0 && line.rfind("Gid:", 0) != 0) continue;
      std::istringstream ids(line.substr(4));
      std::string v;
      while (ids >> v) used = used || v == want;
    }
    if (used) break;
  }
  closedir(procs);
  return used;
}

// Removes the lock files of holders that died without releasing them (the
// kernel dropped their locks): each is locked, checked to still be the
// file of its name, unlinked and closed, as Release() does.
static void SweepDeadLeases(int dirfd) {
  int fd = dup(dirfd);
  if (fd < 0) return;
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return;
  }
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int lock = openat(dirfd, e->d_name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (lock < 0) continue;
    struct stat locked, named;
    if (flock(lock, LOCK_EX | LOCK_NB) == 0 && fstat(lock, &locked) == 0 &&
        fstatat(dirfd, e->d_name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        locked.st_ino == named.st_ino && locked.st_dev == named.st_dev)
      unlinkat(dirfd, e->d_name, 0);
    close(lock);
  }
  closedir(d);
}

vfs::Result<HostIdLease> ReserveHostId(const HostIdPool& pool) {
  auto dir = OpenLockDir(pool.lock_dir);
  if (!dir) return std::unexpected(dir.error());
  const int dirfd = *dir;
  SweepDeadLeases(dirfd);
  int tried_busy = 0;
  for (int i = 0; i < pool.attempts; ++i) {
    const uint32_t id = pool.base + (pool.pick ? pool.pick() : RandomPick());
    if (NamedByAccount(id)) continue;
    const std::string name = std::to_string(id);
    int fd = openat(dirfd, name.c_str(),
                    O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      int err = errno;
      close(dirfd);
      return Fail(err, "cannot open the host id lock " + pool.lock_dir + "/" +
                           name + ": " + ErrText(err));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      close(fd);
      if (err == EWOULDBLOCK) {
        ++tried_busy;
        continue;  // another live session has it
      }
      close(dirfd);
      return Fail(err, "cannot lock " + pool.lock_dir + "/" + name + ": " +
                           ErrText(err));
    }
    // The file may have been unlinked by its last holder between our open
    // and our lock: then the lock is on a name no one else will open.
    struct stat locked, named;
    if (fstat(fd, &locked) != 0 ||
        fstatat(dirfd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
        locked.st_dev != named.st_dev || locked.st_ino != named.st_ino) {
      close(fd);
      continue;
    }
    auto used = HostIdInUse(id);
    if (!used || *used) {
      close(fd);
      if (!used) {
        close(dirfd);
        return std::unexpected(used.error());
      }
      continue;  // a process left over from a session that died
    }
    close(dirfd);
    return HostIdLease(id, fd, pool.lock_dir + "/" + name);
  }
  close(dirfd);
  return Fail(EAGAIN, "no free host id for a sandbox after " +
                          std::to_string(pool.attempts) + " picks (" +
                          std::to_string(tried_busy) +
                          " held by live sessions); end some sessions or "
                          "kill leftover sandbox processes, then retry");
}

}  // namespace agentvfs::sandbox
