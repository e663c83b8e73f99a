// Caller: who is asking. Every Backend operation takes one explicitly, so
// authorisation, ownership of new files and audit never depend on ambient
// process state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace agentvfs::vfs {

struct Caller {
  std::string user;     // agentvfs user name ("" = the local operator)
  std::string session;  // session id, "" outside a harness session
  uint64_t request_id = 0;
  // POSIX identity of the requesting process when known (FUSE requests).
  // Backends that store POSIX ownership give new files this owner; when
  // absent, new files belong to the serving process.
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
  // The requesting process's supplementary groups, set by a frontend whose
  // own permission checks ran on attributes that may be stale (FUSE with
  // default_permissions caches them): it asks a backend that can to have
  // the host check every operation as uid/gid/groups too, against the file
  // that is there now. Absent: uid/gid only give new files their owner.
  std::optional<std::vector<gid_t>> groups;
  pid_t pid = 0;

  // The operator running the command line or the daemon itself.
  static Caller Local() { return Caller{}; }
};

}  // namespace agentvfs::vfs
