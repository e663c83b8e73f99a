// FUSE over io_uring (`agentvfs mount --io-uring`, vfs/fuse/uring_channel.h):
// requests reach the daemon through per-CPU rings instead of /dev/fuse, and
// everything a mount does still works: metadata, directories larger than one
// reply, file data served by the daemon (written requests carry a full 1 MiB
// payload, read replies are spliced), fsync (which blocks on the ring thread
// itself), many processes on both CPUs at once, and a clean unmount. The
// conformance suite runs through the ring too (FuseUring, StoreFuseUring).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>

#include "tests/fuse/fuse_test_support.h"

namespace agentvfs::fuse_test {
namespace {

// The kernel must know FUSE over io_uring (Linux 6.14+), and only root may
// turn it on.
bool UringAvailable(std::string* why) {
  std::ifstream param("/sys/module/fuse/parameters/enable_uring");
  if (!param) {
    *why = "this kernel has no FUSE over io_uring";
    return false;
  }
  if (geteuid() != 0) {
    *why = "turning FUSE over io_uring on needs root";
    return false;
  }
  return true;
}

// What the daemon's --debug log says its rings did (all -1: no such line).
struct RingCounts {
  long served = -1, failed = -1, spliced = -1, max_payload = -1;
};
RingCounts RingCountsIn(const std::string& log) {
  static const std::regex line(
      "io_uring: ([0-9]+) requests served \\(([0-9]+) answered EIO here\\), "
      "([0-9]+) spliced replies, largest payload ([0-9]+) bytes");
  std::smatch m;
  RingCounts c;
  if (std::regex_search(log, m, line)) {
    c.served = std::stol(m[1]);
    c.failed = std::stol(m[2]);
    c.spliced = std::stol(m[3]);
    c.max_payload = std::stol(m[4]);
  }
  return c;
}

class UringTest : public FuseViewTest {
 protected:
  void SetUp() override {
    std::string why;
    if (!UringAvailable(&why)) GTEST_SKIP() << why;
  }
  // Stops the daemon and returns its log.
  std::string StopAndLog() {
    EXPECT_EQ(view_->Stop(), 0);
    return view_->Log();
  }
};

TEST_F(UringTest, MetadataAndDirectoriesGoThroughTheRing) {
  ASSERT_TRUE(Mount({"--io-uring", "--debug"}));
  ASSERT_EQ(mkdir(View("d").c_str(), 0755), 0) << std::strerror(errno);
  // 300 names: a listing takes several READDIR replies.
  std::set<std::string> made;
  for (int i = 0; i < 300; ++i) {
    std::string name = "entry-with-a-longish-name-" + std::to_string(i);
    ASSERT_TRUE(WriteFile(View("d/" + name), std::to_string(i)));
    made.insert(name);
  }
  auto listed = ListDir(View("d"));
  ASSERT_TRUE(listed.has_value());
  std::set<std::string> seen(listed->begin(), listed->end());
  EXPECT_EQ(seen, made);

  ASSERT_EQ(rename(View("d/entry-with-a-longish-name-0").c_str(),
                   View("d/renamed").c_str()),
            0);
  ASSERT_EQ(symlink("renamed", View("d/link").c_str()), 0);
  char target[64] = {};
  ASSERT_EQ(readlink(View("d/link").c_str(), target, sizeof target - 1), 7);
  EXPECT_STREQ(target, "renamed");
  EXPECT_EQ(ReadFile(View("d/link")).value_or("(unreadable)"), "0");
  ASSERT_EQ(chmod(View("d/renamed").c_str(), 0600), 0);
  struct stat st {};
  ASSERT_EQ(stat(Host("d/renamed").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(truncate(View("d/renamed").c_str(), 4096), 0);
  ASSERT_EQ(stat(View("d/renamed").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4096);
  struct statvfs vfs {};
  EXPECT_EQ(statvfs(View().c_str(), &vfs), 0);
  // fsync runs on the ring thread that received it.
  int fd = open(View("d/renamed").c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_EQ(fsync(fd), 0);
  EXPECT_EQ(close(fd), 0);
  EXPECT_ERRNO_EQ(ErrnoOf(rmdir(View("d").c_str())), ENOTEMPTY);
  EXPECT_ERRNO_EQ(OpenErrno(View("d/missing"), O_RDONLY), ENOENT);
  for (const auto& name :
       ListDir(View("d")).value_or(std::vector<std::string>{}))
    ASSERT_EQ(unlink(View("d/" + name).c_str()), 0) << name;
  ASSERT_EQ(rmdir(View("d").c_str()), 0);
  EXPECT_ERRNO_EQ(ErrnoOf(access(Host("d").c_str(), F_OK)), ENOENT);

  std::string log = StopAndLog();
  EXPECT_TRUE(Contains(log, "FUSE requests now arrive over io_uring"));
  // Well over one request per file made, listed, changed and removed, all
  // answered by the handlers.
  RingCounts c = RingCountsIn(log);
  EXPECT_GT(c.served, 600) << log.substr(0, 2000);
  EXPECT_EQ(c.failed, 0);
}

TEST_F(UringTest, FileDataServedByTheDaemonGoesThroughTheRing) {
  ASSERT_TRUE(Mount({"--io-uring", "--no-passthrough", "--debug"}));
  // 3 MiB: WRITE requests with full 1 MiB payloads, READ replies spliced
  // from the host file into the ring.
  std::string data = Pattern(3 << 20, 11);
  ASSERT_TRUE(WriteFile(View("big"), data));
  auto on_host = ReadFile(Host("big"));
  ASSERT_TRUE(on_host.has_value());
  EXPECT_TRUE(*on_host == data) << "host copy differs";
  std::string fresh = Pattern((2 << 20) + 123, 12);
  ASSERT_TRUE(WriteFile(Host("fresh"), fresh));
  auto back = ReadFile(View("fresh"));
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(*back == fresh) << "host-written file read through the view";
  int fd = open(View("big").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  char buf[10] = {};
  ASSERT_EQ(pread(fd, buf, sizeof buf, (1 << 20) + 5), 10);
  EXPECT_EQ(std::string(buf, 10), data.substr((1 << 20) + 5, 10));
  close(fd);

  std::string log = StopAndLog();
  EXPECT_TRUE(Contains(log, "FUSE requests now arrive over io_uring"));
  RingCounts c = RingCountsIn(log);
  EXPECT_GT(c.served, 10);
  EXPECT_EQ(c.failed, 0);
  // A whole 1 MiB WRITE came through a ring entry, and reads were spliced
  // from the host file into entries.
  EXPECT_EQ(c.max_payload, 1 << 20);
  EXPECT_GT(c.spliced, 0);
}

TEST_F(UringTest, ManyProcessesOnEveryCpu) {
  ASSERT_TRUE(Mount({"--io-uring", "--debug"}));
  constexpr int kProcs = 8, kFiles = 60;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Each child works on its own files; requests come from whichever CPU
      // the scheduler puts it on, so every queue gets some.
      std::string dir = View("p" + std::to_string(p));
      if (mkdir(dir.c_str(), 0755) != 0) _exit(1);
      for (int i = 0; i < kFiles; ++i) {
        std::string f = dir + "/" + std::to_string(i);
        std::string body = Pattern(100 + i * 37, p * 1000 + i);
        if (!WriteFile(f, body)) _exit(2);
        if (ReadFile(f).value_or("") != body) _exit(3);
        struct stat st {};
        if (stat(f.c_str(), &st) != 0 || st.st_size != (off_t)body.size())
          _exit(4);
      }
      for (int i = 0; i < kFiles; i += 2)
        if (unlink((dir + "/" + std::to_string(i)).c_str()) != 0) _exit(5);
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child failed with status " << status;
  }
  for (int p = 0; p < kProcs; ++p)
    EXPECT_EQ(ListDir(Host("p" + std::to_string(p)))
                  .value_or(std::vector<std::string>{})
                  .size(),
              static_cast<size_t>(kFiles / 2));
  RingCounts c = RingCountsIn(StopAndLog());
  EXPECT_GT(c.served, kProcs * kFiles * 3);
  EXPECT_EQ(c.failed, 0);
}

TEST_F(UringTest, FusermountUnmountsCleanly) {
  ASSERT_TRUE(Mount({"--io-uring"}));
  ASSERT_TRUE(WriteFile(View("f"), "x"));
  ASSERT_EQ(system(("fusermount3 -u '" + MountPoint() + "'").c_str()), 0);
  // The daemon notices the unmount, stops its ring threads and exits 0 by
  // itself (waited for up to 10 s, left for Stop() to reap).
  bool exited = false;
  for (int i = 0; i < 1000 && !exited; ++i) {
    siginfo_t info{};
    ASSERT_EQ(waitid(P_PID, view_->pid(), &info, WEXITED | WNOHANG | WNOWAIT),
              0)
        << std::strerror(errno);
    exited = info.si_pid == view_->pid();
    if (!exited) usleep(10000);
  }
  EXPECT_TRUE(exited) << "the daemon is still running 10 s after the unmount";
  EXPECT_EQ(view_->Stop(), 0);
  EXPECT_FALSE(testing::MountedView::IsMounted(MountPoint()));
  EXPECT_EQ(ReadFile(Host("f")).value_or("(unreadable)"), "x");
}

// kill -9 of a daemon with rings registered leaves the same dead mount as
// without them, which `fusermount3 -u` clears; the next mount works.
TEST_F(UringTest, KilledDaemonLeavesAMountThatFusermountClears) {
  ASSERT_TRUE(Mount({"--io-uring"}));
  ASSERT_TRUE(WriteFile(View("f"), "kept"));
  ASSERT_EQ(kill(view_->pid(), SIGKILL), 0);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, view_->pid(), &info, WEXITED | WNOWAIT), 0)
      << std::strerror(errno);
  // Until the kernel has finished tearing the dead daemon's rings down (it
  // does so asynchronously), a request can still be handed to a ring and
  // fail with ECANCELED or ECONNABORTED; then the mount is dead as without
  // rings: ENOTCONN.
  int err = 0;
  for (int i = 0; i < 500; ++i) {
    err = OpenErrno(View("f"), O_RDONLY);
    if (err != ECANCELED && err != ECONNABORTED) break;
    usleep(10000);
  }
  EXPECT_ERRNO_EQ(err, ENOTCONN);
  ASSERT_EQ(system(("fusermount3 -u '" + MountPoint() + "'").c_str()), 0);
  EXPECT_FALSE(testing::MountedView::IsMounted(MountPoint()));
  EXPECT_EQ(view_->Stop(), 128 + SIGKILL);
  view_.reset();
  ASSERT_TRUE(Mount({"--io-uring"}));
  EXPECT_EQ(ReadFile(View("f")).value_or("(unreadable)"), "kept");
}

}  // namespace
}  // namespace agentvfs::fuse_test
