// Caller: who is asking. Every Backend operation takes one explicitly, so
// authorisation, ownership of new files and audit never depend on ambient
// process state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

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
  pid_t pid = 0;

  // The operator running the command line or the daemon itself.
  static Caller Local() { return Caller{}; }
};

}  // namespace agentvfs::vfs
