// SOCK_SEQPACKET framing for the sandbox control channel (see protocol.h).
#include "backends/sandbox/protocol.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace agentvfs::sandbox {

namespace {
constexpr size_t kMaxFds = 4;
}

int SendPacket(int sock, const nlohmann::json& msg,
               const std::vector<int>& fds) {
  std::string body = msg.dump();
  if (body.size() > kMaxPacket) return EMSGSIZE;
  if (fds.size() > kMaxFds) return EINVAL;
  iovec iov{body.data(), body.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (!fds.empty()) {
    mh.msg_control = control;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (n >= 0) return 0;
    if (errno != EINTR) return errno;
  }
}

int RecvPacket(int sock, nlohmann::json* msg, std::vector<int>* fds) {
  std::string body(kMaxPacket + 1, '\0');
  iovec iov{body.data(), body.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno;
  fds->clear();
  for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm != nullptr;
       cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        fds->push_back(fd);
      }
    }
  }
  if (n == 0) return ECONNRESET;
  if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    for (int fd : *fds) close(fd);
    fds->clear();
    return EMSGSIZE;
  }
  body.resize(static_cast<size_t>(n));
  *msg = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!msg->is_object()) {
    for (int fd : *fds) close(fd);
    fds->clear();
    return EBADMSG;
  }
  return 0;
}

}  // namespace agentvfs::sandbox
