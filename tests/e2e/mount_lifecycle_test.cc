// The `agentvfs mount` command as a person or a sandbox launcher uses it:
// the mount appears, shows the workspace, and disappears cleanly on SIGTERM
// or SIGINT; a busy mount point is refused; --background returns once the
// view is usable.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/e2e/e2e_support.h"

namespace agentvfs::e2e {
namespace {

using testing::CommandOptions;
using testing::MountedView;
using testing::RunCommand;
using testing::TempDir;

TEST(MountLifecycleTest, MountAppearsAndDisappearsCleanly) {
  TempDir workspace("agentvfs-e2e-ws"), mountpoint("agentvfs-e2e-mnt");
  ASSERT_TRUE(WriteFile(workspace.Sub("from-host"), "written on the host"));
  ASSERT_FALSE(MountedView::IsMounted(mountpoint.path()));

  std::string error;
  auto view =
      MountedView::Start(workspace.path(), mountpoint.path(), {}, &error);
  ASSERT_NE(view, nullptr) << error;
  EXPECT_TRUE(MountedView::IsMounted(view->mountpoint()));
  EXPECT_EQ(MountedView::MountType(view->mountpoint()), "fuse.agentvfs");
  EXPECT_EQ(MountedView::MountCount(view->mountpoint()), 1u);

  // MOUNTPOINT/workspace is the host directory.
  struct stat st;
  ASSERT_EQ(stat((view->mountpoint() + "/workspace").c_str(), &st), 0)
      << std::strerror(errno);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  const std::string view_ws = view->mountpoint() + "/workspace";
  EXPECT_EQ(ReadFile(view_ws + "/from-host"), "written on the host");
  ASSERT_TRUE(WriteFile(view_ws + "/from-view", "written through the view"));
  EXPECT_EQ(ReadFile(workspace.Sub("from-view")), "written through the view");

  EXPECT_EQ(view->Stop(), 0) << view->Log();
  EXPECT_FALSE(MountedView::IsMounted(mountpoint.path()));
  EXPECT_EQ(ListDir(mountpoint.path()), std::vector<std::string>{})
      << "the mount point is an empty directory again";
  EXPECT_EQ(ReadFile(workspace.Sub("from-view")), "written through the view");
}

TEST(MountLifecycleTest, SigintUnmountsCleanly) {
  TempDir workspace("agentvfs-e2e-ws"), mountpoint("agentvfs-e2e-mnt");
  std::string error;
  auto view =
      MountedView::Start(workspace.path(), mountpoint.path(), {}, &error);
  ASSERT_NE(view, nullptr) << error;
  ASSERT_TRUE(WriteFile(view->mountpoint() + "/workspace/f", "x"));
  EXPECT_EQ(view->Stop(SIGINT), 0) << view->Log();
  EXPECT_FALSE(MountedView::IsMounted(mountpoint.path()));
}

TEST(MountLifecycleTest, StopsCleanlyWhileAFileIsOpen) {
  TempDir workspace("agentvfs-e2e-ws"), mountpoint("agentvfs-e2e-mnt");
  std::string error;
  auto view =
      MountedView::Start(workspace.path(), mountpoint.path(), {}, &error);
  ASSERT_NE(view, nullptr) << error;
  // A program still holding a file (or its cwd) in the view must not keep
  // the mount around after the command was told to stop.
  int fd = open((view->mountpoint() + "/workspace/held").c_str(),
                O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  int status = view->Stop();
  close(fd);
  EXPECT_EQ(status, 0) << view->Log();
  EXPECT_FALSE(MountedView::IsMounted(mountpoint.path()));
}

TEST(MountLifecycleTest, RefusesAnAlreadyMountedMountPoint) {
  TempDir workspace("agentvfs-e2e-ws"), other("agentvfs-e2e-ws2"),
      mountpoint("agentvfs-e2e-mnt");
  ASSERT_TRUE(WriteFile(workspace.Sub("mine"), "first mount"));
  std::string error;
  auto view =
      MountedView::Start(workspace.path(), mountpoint.path(), {}, &error);
  ASSERT_NE(view, nullptr) << error;

  auto second = RunCommand({AGENTVFS_BINARY, "mount", "--workspace",
                            other.path(), view->mountpoint()},
                           CommandOptions{.timeout = std::chrono::seconds(15)});
  // Whatever happened, never leave a second mount stacked on the first.
  while (MountedView::MountCount(view->mountpoint()) > 1) {
    testing::LazyUnmount(view->mountpoint());
  }
  EXPECT_FALSE(second.timed_out) << "the second mount did not give up";
  EXPECT_NE(second.exit_status, 0) << second.output;
  EXPECT_FALSE(second.output.empty()) << "the refusal should say why";
  EXPECT_EQ(ReadFile(view->mountpoint() + "/workspace/mine"), "first mount")
      << "the first mount must keep working";
  EXPECT_EQ(view->Stop(), 0) << view->Log();
}

// Refusals before anything is mounted: a mount point with files in it
// (they would be hidden), a token with no store to use it for, --no-store
// with a store named.
TEST(MountLifecycleTest, RefusesWhatWouldHideFilesOrIgnoreAFlag) {
  TempDir workspace("agentvfs-e2e-ws"), mountpoint("agentvfs-e2e-mnt");
  testing::UnmountAtExit(mountpoint.path());
  ASSERT_TRUE(WriteFile(mountpoint.Sub("mine"), "mine"));
  auto r = RunCommand({AGENTVFS_BINARY, "mount", "--workspace",
                       workspace.path(), mountpoint.path()},
                      CommandOptions{.timeout = std::chrono::seconds(15)});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_NE(r.output.find("is not empty"), std::string::npos) << r.output;
  EXPECT_FALSE(MountedView::IsMounted(mountpoint.path()));
  ASSERT_EQ(unlink(mountpoint.Sub("mine").c_str()), 0);
  ASSERT_TRUE(WriteFile(workspace.Sub("tok"), "avfs_x\n", 0600));
  r = RunCommand({AGENTVFS_BINARY, "mount", "--workspace", workspace.path(),
                  "--token-file", workspace.Sub("tok"), mountpoint.path()},
                 CommandOptions{.env = {{"AGENTVFS_STORE", ""},
                                        {"AGENTVFS_CONFIG", "/nonexistent"}},
                                .timeout = std::chrono::seconds(15)});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_NE(r.output.find("--token-file is for a store"), std::string::npos)
      << r.output;
  r = RunCommand({AGENTVFS_BINARY, "mount", "--workspace", workspace.path(),
                  "--no-store", "--store", "x.db", mountpoint.path()},
                 CommandOptions{.timeout = std::chrono::seconds(15)});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_NE(r.output.find("--no-store serves no store"), std::string::npos)
      << r.output;
  EXPECT_FALSE(MountedView::IsMounted(mountpoint.path()));
  // NaN passes a range check; the kernel would cache for good.
  r = RunCommand({AGENTVFS_BINARY, "mount", "--workspace", workspace.path(),
                  "--no-store", "--cache-timeout", "nan", mountpoint.path()},
                 CommandOptions{.timeout = std::chrono::seconds(15)});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_NE(r.output.find("--cache-timeout must be"), std::string::npos)
      << r.output;
  EXPECT_FALSE(MountedView::IsMounted(mountpoint.path()));
  // A view inside its own workspace would contain itself (the daemon then
  // waited on its own mount for good).
  const std::string inner = workspace.Sub("inner");
  ASSERT_EQ(mkdir(inner.c_str(), 0755), 0);
  testing::UnmountAtExit(inner);
  r = RunCommand({AGENTVFS_BINARY, "mount", "--workspace", workspace.path(),
                  "--no-store", inner},
                 CommandOptions{.timeout = std::chrono::seconds(15)});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_NE(r.output.find("inside the workspace"), std::string::npos)
      << r.output;
  EXPECT_FALSE(MountedView::IsMounted(inner));
}

TEST(MountLifecycleTest, BackgroundReturnsOnceMounted) {
  TempDir workspace("agentvfs-e2e-ws"), mountpoint("agentvfs-e2e-mnt");
  ASSERT_TRUE(WriteFile(workspace.Sub("f"), "background"));
  testing::UnmountAtExit(mountpoint.path());
  auto r = RunCommand({AGENTVFS_BINARY, "mount", "--workspace",
                       workspace.path(), mountpoint.path(), "--background"},
                      CommandOptions{.timeout = std::chrono::seconds(15)});
  ASSERT_FALSE(r.timed_out) << "--background did not return: " << r.output;
  ASSERT_EQ(r.exit_status, 0) << r.output;
  EXPECT_TRUE(MountedView::IsMounted(mountpoint.path()))
      << "--background returned before the view was mounted";
  EXPECT_EQ(ReadFile(mountpoint.Sub("workspace/f")), "background");
  // A background mount is stopped by unmounting it.
  EXPECT_TRUE(testing::LazyUnmount(mountpoint.path()));
}

class ViewFreshnessTest : public MountedWorkspaceTest {};

// A person inspecting an agent's workspace through a mount must see what is
// there now: a change made beside the mount (the agent writing its files
// directly) shows in the view within a few seconds, not never.
TEST_F(ViewFreshnessTest, HostChangesAppearInTheView) {
  ASSERT_TRUE(WriteFile(Host("f"), "old contents"));
  ASSERT_EQ(ReadFile(View("f")), "old contents");  // now cached, if at all
  ASSERT_EQ(ListDir(View()), std::vector<std::string>{"f"});

  ASSERT_TRUE(WriteFile(Host("f"), "new, longer contents"));
  ASSERT_TRUE(WriteFile(Host("g"), "added"));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline &&
         (ReadFile(View("f")) != "new, longer contents" ||
          ListDir(View()) != std::vector<std::string>{"f", "g"})) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(ReadFile(View("f")), "new, longer contents");
  EXPECT_EQ(ListDir(View()), (std::vector<std::string>{"f", "g"}));
  EXPECT_EQ(ReadFile(View("g")), "added");

  ASSERT_EQ(unlink(Host("g").c_str()), 0);
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  struct stat st;
  while (std::chrono::steady_clock::now() < deadline &&
         lstat(View("g").c_str(), &st) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(lstat(View("g").c_str(), &st), 0) << "a deleted file lingers";
}

TEST(MountLifecycleTest, RootOfTheViewIsNotWritable) {
  TempDir workspace("agentvfs-e2e-ws"), mountpoint("agentvfs-e2e-mnt");
  std::string error;
  auto view =
      MountedView::Start(workspace.path(), mountpoint.path(), {}, &error);
  ASSERT_NE(view, nullptr) << error;
  const std::string root = view->mountpoint();
  EXPECT_NE(mkdir((root + "/new").c_str(), 0755), 0);
  EXPECT_EQ(errno, EACCES);
  EXPECT_LT(open((root + "/new-file").c_str(), O_WRONLY | O_CREAT, 0644), 0);
  EXPECT_EQ(errno, EACCES);
  EXPECT_NE(rmdir((root + "/workspace").c_str()), 0);
  EXPECT_EQ(errno, EBUSY);
  EXPECT_NE(rename((root + "/workspace").c_str(), (root + "/moved").c_str()),
            0);
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(view->Stop(), 0) << view->Log();
}

TEST(MountLifecycleTest, RootListsTheWorkspace) {
  TempDir workspace("agentvfs-e2e-ws"), mountpoint("agentvfs-e2e-mnt");
  std::string error;
  auto view =
      MountedView::Start(workspace.path(), mountpoint.path(), {}, &error);
  ASSERT_NE(view, nullptr) << error;
  // `ls MOUNTPOINT` is how a person finds their way in.
  EXPECT_EQ(ListDir(view->mountpoint()), std::vector<std::string>{"workspace"});
  EXPECT_EQ(view->Stop(), 0) << view->Log();
}

}  // namespace
}  // namespace agentvfs::e2e
