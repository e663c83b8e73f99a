// Implementation of the FUSE test helpers (see fuse_test_support.h).
#include "tests/fuse/fuse_test_support.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace agentvfs::fuse_test {

::testing::AssertionResult Contains(const std::string& text,
                                    const std::string& part) {
  if (text.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "expected to find \"" << part << "\" in:\n"
         << text;
}

std::string Octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0%o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string Pattern(size_t size, unsigned seed) {
  std::string out(size, '\0');
  uint32_t x = 2654435761u * (seed + 1);
  for (size_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<char>((x >> 24) ^ i);
  }
  return out;
}

std::string ErrnoText(int code) {
  if (code <= 0) return std::to_string(code);
  const char* name = strerrorname_np(code);
  return std::string(name != nullptr ? name : "E?") + " (" +
         std::to_string(code) + ")";
}

int ErrnoOf(long rc) { return rc < 0 ? errno : 0; }

int OpenErrno(const std::string& path, int flags, mode_t mode) {
  int fd = open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return errno;
  close(fd);
  return 0;
}

int AsUser(uid_t uid, gid_t gid, const std::function<int()>& fn,
           const std::vector<gid_t>& groups) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    // Groups first: after setuid we may no longer change them.
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(gid) != 0 ||
        setuid(uid) != 0) {
      _exit(255);
    }
    umask(022);
    _exit(fn() & 0xff);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) == 255) return -1;
  return WEXITSTATUS(status);
}

FuseViewTest::FuseViewTest() {
  // Other uids must be able to walk to the mount point and the workspace.
  chmod(root_.path().c_str(), 0755);
  mkdir(root_.Sub("ws").c_str(), 0755);
  mkdir(root_.Sub("mnt").c_str(), 0755);
}

void FuseViewTest::TearDown() {
  if (view_ == nullptr) return;
  int status = view_->Stop();
  if (expect_clean_stop_) {
    EXPECT_EQ(status, 0) << view_->Log();
  }
  view_.reset();
}

::testing::AssertionResult FuseViewTest::Mount(
    std::vector<std::string> extra_args) {
  std::string error;
  view_ = testing::MountedView::Start(Host(), MountPoint(),
                                      std::move(extra_args), &error);
  if (view_ == nullptr) return ::testing::AssertionFailure() << error;
  return ::testing::AssertionSuccess();
}

std::string FuseViewTest::View(const std::string& rel) const {
  std::string base = root_.Sub("mnt/workspace");
  return rel.empty() ? base : base + "/" + rel;
}

std::string FuseViewTest::Host(const std::string& rel) const {
  std::string base = root_.Sub("ws");
  return rel.empty() ? base : base + "/" + rel;
}

}  // namespace agentvfs::fuse_test
