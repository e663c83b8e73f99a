// How `agentvfs mount` starts and ends beyond the happy path covered by
// tests/e2e/mount_lifecycle_test.cc (SIGTERM, SIGINT, --background): SIGHUP,
// the refusals a person sees when the mount point is wrong, and recovery
// from a daemon killed with SIGKILL, which leaves a dead mount behind.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include "tests/fuse/fuse_test_support.h"

namespace agentvfs::fuse_test {
namespace {

using testing::CommandOptions;
using testing::CommandResult;
using testing::MountedView;
using testing::RunCommand;

class LifecycleTest : public FuseViewTest {
 protected:
  // Runs `agentvfs mount --workspace WS mountpoint` expecting it to give
  // up; never leaves a mount of its own behind.
  CommandResult MountExpectingRefusal(const std::string& mountpoint) {
    const size_t before = MountedView::MountCount(mountpoint);
    CommandResult r = RunCommand(
        {AGENTVFS_BINARY, "mount", "--workspace", Host(), mountpoint},
        CommandOptions{.timeout = std::chrono::seconds(15)});
    while (MountedView::MountCount(mountpoint) > before) {
      if (!testing::LazyUnmount(mountpoint)) break;
    }
    EXPECT_FALSE(r.timed_out) << "the mount command did not give up";
    EXPECT_NE(r.exit_status, 0) << r.output;
    return r;
  }
};

TEST_F(LifecycleTest, SighupUnmountsCleanly) {
  ASSERT_TRUE(Mount());
  ASSERT_TRUE(WriteFile(View("f"), "x"));
  EXPECT_EQ(view_->Stop(SIGHUP), 0) << view_->Log();
  EXPECT_FALSE(MountedView::IsMounted(MountPoint()));
  EXPECT_EQ(ReadFile(Host("f")), "x");
}

TEST_F(LifecycleTest, RefusesAnAlreadyMountedMountPointSayingWhatToDo) {
  ASSERT_TRUE(Mount());
  CommandResult r = MountExpectingRefusal(MountPoint());
  EXPECT_TRUE(Contains(r.output, "already mounted"));
  EXPECT_TRUE(Contains(r.output, "fusermount3 -u " + MountPoint()));
  EXPECT_EQ(MountedView::MountCount(MountPoint()), 1u);
  EXPECT_TRUE(WriteFile(View("still-works"), "yes"));
}

TEST_F(LifecycleTest, RefusesAMissingMountPoint) {
  const std::string missing = Beside("no-such-dir");
  CommandResult r = MountExpectingRefusal(missing);
  EXPECT_TRUE(Contains(r.output, "'" + missing + "' does not exist"));
  EXPECT_TRUE(Contains(r.output, "mkdir"));
  struct stat st;
  EXPECT_NE(lstat(missing.c_str(), &st), 0) << "must not be created";
}

TEST_F(LifecycleTest, RefusesAFileAsMountPoint) {
  const std::string file = Beside("a-file");
  ASSERT_TRUE(WriteFile(file, "not a directory"));
  CommandResult r = MountExpectingRefusal(file);
  EXPECT_TRUE(Contains(r.output, "'" + file + "' is not a directory"));
  EXPECT_FALSE(MountedView::IsMounted(file));
  EXPECT_EQ(ReadFile(file), "not a directory");
}

// kill -9 leaves the kernel mount without a daemon. A person must get a
// clear message and a working way out: `fusermount3 -u`, then mount again.
TEST_F(LifecycleTest, KilledDaemonLeavesADeadMountThatFusermountClears) {
  ASSERT_TRUE(WriteFile(Host("f"), "survives"));
  ASSERT_TRUE(Mount());
  ASSERT_EQ(ReadFile(View("f")), "survives");
  std::unique_ptr<MountedView> dead = std::move(view_);

  ASSERT_EQ(kill(dead->pid(), SIGKILL), 0);
  // Wait for it to die but leave the zombie for MountedView to reap.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, dead->pid(), &info, WEXITED | WNOWAIT), 0)
      << std::strerror(errno);

  // Anything that reaches the daemon fails with ENOTCONN.
  struct statfs sfs;
  EXPECT_NE(statfs(MountPoint().c_str(), &sfs), 0);
  EXPECT_ERRNO_EQ(errno, ENOTCONN);
  struct stat st;
  EXPECT_NE(stat(View("never-looked-up").c_str(), &st), 0);
  EXPECT_ERRNO_EQ(errno, ENOTCONN);
  EXPECT_TRUE(MountedView::IsMounted(MountPoint()));

  // Mounting again without clearing it is refused with instructions, even
  // while the kernel still answers stat() of the root from its cache.
  CommandResult r = MountExpectingRefusal(MountPoint());
  EXPECT_TRUE(Contains(r.output, "dead FUSE mount"));
  EXPECT_TRUE(Contains(r.output, "fusermount3 -u " + MountPoint()));

  // Once the cached attributes (1 s) expire, stat of the mount point itself
  // fails too.
  int stat_errno = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < deadline) {
    stat_errno = ErrnoOf(stat(MountPoint().c_str(), &st));
    if (stat_errno != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_ERRNO_EQ(stat_errno, ENOTCONN);

  // The instructions work.
  CommandResult cleared = RunCommand({"fusermount3", "-u", MountPoint()});
  EXPECT_EQ(cleared.exit_status, 0) << cleared.output;
  EXPECT_FALSE(MountedView::IsMounted(MountPoint()));
  EXPECT_EQ(dead->Stop(), 128 + SIGKILL);

  // And a fresh mount on the same directory serves the workspace.
  ASSERT_TRUE(Mount());
  EXPECT_EQ(ReadFile(View("f")), "survives");
  EXPECT_TRUE(WriteFile(View("g"), "after recovery"));
  EXPECT_EQ(ReadFile(Host("g")), "after recovery");
  EXPECT_EQ(MountedView::MountCount(MountPoint()), 1u);
}

}  // namespace
}  // namespace agentvfs::fuse_test
