// The control channel between a Sandbox (host side) and agentvfs-sandbox-init,
// the first process inside the bubblewrap sandbox. It is one SOCK_SEQPACKET
// socket pair: every message is one JSON object in one packet, and file
// descriptors travel beside it as SCM_RIGHTS (the command's stdin, stdout and
// stderr from the host; a terminal's master side back from the init).
//
// Host -> init:  {"op":"exec","id":N,"argv":[..],"env":[..],"cwd":"/workspace",
//                 "tty":false,"rows":R,"cols":C,"limits":{"cpu_s":..,...}}
//                with 3 fds (stdin, stdout, stderr) unless "tty" is true.
// Init -> host:  {"op":"ready"}                        once, at start
//                {"op":"started","id":N,"pid":P}       (+ master fd with tty)
//                {"op":"failed","id":N,"errno":E,"message":".."}
//                {"op":"exited","id":N,"status":S}     S is a waitpid status
// Neither side trusts the other's packets beyond parsing them: a malformed
// packet is an error result, never a crash.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace agentvfs::sandbox {

// Largest packet either side sends or accepts (argv and environment of one
// command included); the sockets' buffers are sized for it.
inline constexpr size_t kMaxPacket = 512 * 1024;

// Sends `msg` with `fds` (may be empty). Returns 0 or an errno.
int SendPacket(int sock, const nlohmann::json& msg,
               const std::vector<int>& fds = {});

// Receives one packet. Returns 0 and fills `msg` (and `fds`, which the caller
// then owns), ECONNRESET at end of stream, EBADMSG for a packet that is not
// one JSON object, or another errno.
int RecvPacket(int sock, nlohmann::json* msg, std::vector<int>* fds);

}  // namespace agentvfs::sandbox
