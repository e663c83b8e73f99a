// Pieces the FUSE server's files share: the kernel's message headers (as in
// linux/fuse.h, whose Debian 12 copy predates what the server uses of the
// protocol), access to a message in pieces, and the "fuse" logger.
#pragma once

#include <spdlog/spdlog.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace agentvfs::fuse {
namespace abi {

struct InHeader {  // struct fuse_in_header
  uint32_t len, opcode;
  uint64_t unique, nodeid;
  uint32_t uid, gid, pid;
  uint16_t total_extlen, padding;
};
static_assert(sizeof(InHeader) == 40);

struct OutHeader {  // struct fuse_out_header
  uint32_t len;
  int32_t error;
  uint64_t unique;
};
static_assert(sizeof(OutHeader) == 16);

}  // namespace abi

// The "fuse" logger: the one registered under that name, else stderr.
std::shared_ptr<spdlog::logger> FuseLog();

// Copies `n` bytes at offset `off` of the message in `iov` (`count` pieces)
// to `buf`, or from `buf` when `write`; false when the message is shorter.
bool MessageBytes(const struct iovec* iov, int count, size_t off, void* buf,
                  size_t n, bool write);

}  // namespace agentvfs::fuse
