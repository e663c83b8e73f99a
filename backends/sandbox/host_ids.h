// Host ids for sandboxes run by root: each session's processes run as a uid
// (and gid) of their own, picked at random from a range no account uses. Two
// sessions must never share one: a sandbox could then reach the other's
// session directory and signal or trace its processes. A HostIdLease holds a
// pick for as long as it lives:
//   - an exclusive flock(2) on `<lock_dir>/<id>` (released by the kernel when
//     the holder exits, however it dies), so live sessions of every agentvfs
//     process on the host exclude each other; Release() removes the file;
//   - a pick named by a passwd or group entry is skipped (a real account);
//   - a pick that any process on the host has as its real, effective, saved
//     or filesystem uid or gid is skipped (checked after the lock is taken:
//     a sandbox process that outlived a session whose holder was killed).
// The lock directory must be a directory owned by root and writable by no
// one else (it is made so when missing); anything else is refused, so a user
// cannot plant one to take or steal ids.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "vfs/error.h"

namespace agentvfs::sandbox {

// Where the leases of the host's sandboxes live by default.
inline constexpr const char* kHostIdLockDir = "/run/agentvfs/sandbox-ids";

struct HostIdPool {
  std::string lock_dir = kHostIdLockDir;
  uint32_t base = 0;  // ids are base + pick
  // 0..65535; default: getrandom(2).
  std::function<uint16_t()> pick;
  int attempts = 64;
};

class HostIdLease {
 public:
  HostIdLease() = default;
  // Takes over `lock_fd`, the locked file at `lock_path`.
  HostIdLease(uint32_t id, int lock_fd, std::string lock_path)
      : id_(id), fd_(lock_fd), path_(std::move(lock_path)) {}
  HostIdLease(HostIdLease&& o) noexcept;
  HostIdLease& operator=(HostIdLease&& o) noexcept;
  HostIdLease(const HostIdLease&) = delete;
  HostIdLease& operator=(const HostIdLease&) = delete;
  ~HostIdLease();

  uint32_t id() const { return id_; }
  bool held() const { return fd_ >= 0; }
  // Gives the id back now (the destructor does it otherwise).
  void Release();

 private:
  uint32_t id_ = 0;
  int fd_ = -1;  // the flock'ed lock file
  std::string path_;
};

// Reserves an id as described above. EAGAIN when `attempts` picks were all
// taken or in use; EACCES/ENOTDIR (naming it) for an unsafe lock directory;
// the errno of a failing syscall otherwise.
vfs::Result<HostIdLease> ReserveHostId(const HostIdPool& pool);

// Whether a process visible in /proc has `id` as any of its uids or gids.
vfs::Result<bool> HostIdInUse(uint32_t id);

}  // namespace agentvfs::sandbox
