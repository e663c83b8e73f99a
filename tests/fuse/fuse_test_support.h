// Shared pieces of the FUSE mount tests: a fixture that lays out a scratch
// directory (ROOT/ws is the workspace, ROOT/mnt the mount point, anything
// else a test needs beside them) and mounts it with chosen options; running
// a syscall as another uid/gid in a forked child; small file helpers; and an
// errno assertion that prints names ("EACCES (13)") instead of numbers.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"

namespace agentvfs::fuse_test {

// Uids and gids no real account uses, so files they own are obviously ours.
inline constexpr uid_t kUser = 4242;
inline constexpr gid_t kUserGroup = 4242;
inline constexpr uid_t kOtherUser = 4243;
inline constexpr gid_t kOtherGroup = 4243;

using agentvfs::testing::ListDir;
using agentvfs::testing::ReadFile;
using agentvfs::testing::WriteFile;
// Succeeds when `text` contains `part`; on failure prints both.
::testing::AssertionResult Contains(const std::string& text,
                                    const std::string& part);
// Permission bits as C writes them: "0644", "04755".
std::string Octal(mode_t mode);
// Deterministic bytes (all 256 values occur), different per seed.
std::string Pattern(size_t size, unsigned seed);

// "EACCES (13)", "0" for success, "-1" for AsUser's "could not run".
std::string ErrnoText(int code);
// 0 when a syscall returning -1 on failure succeeded, else errno.
int ErrnoOf(long rc);
// open(path, flags, mode) and close: 0 or errno.
int OpenErrno(const std::string& path, int flags, mode_t mode = 0644);

// Runs `fn` in a forked child whose credentials are exactly uid/gid and the
// supplementary `groups` (none by default) and whose umask is 022, and
// returns fn's result, which must be 0..255 (an errno, 0 for success).
// Returns -1 when the child could not take the credentials or died. Call
// from the main thread only.
int AsUser(uid_t uid, gid_t gid, const std::function<int()>& fn,
           const std::vector<gid_t>& groups = {});

// Fixture: ROOT (0755) holding ws/ (0755, the workspace) and mnt/.
class FuseViewTest : public ::testing::Test {
 protected:
  FuseViewTest();
  void TearDown() override;

  // Mounts ROOT/ws at ROOT/mnt with `extra_args` added to the command line.
  ::testing::AssertionResult Mount(std::vector<std::string> extra_args = {});

  // MOUNTPOINT/workspace/rel: the workspace as seen through the view.
  std::string View(const std::string& rel = "") const;
  // ROOT/ws/rel: the same directory on the host, bypassing the mount.
  std::string Host(const std::string& rel = "") const;
  // ROOT/rel: beside the workspace (not reachable through the view).
  std::string Beside(const std::string& rel) const { return root_.Sub(rel); }
  std::string MountPoint() const { return root_.Sub("mnt"); }

  // TearDown expects the daemon to stop with status 0 unless cleared.
  bool expect_clean_stop_ = true;
  testing::TempDir root_{"agentvfs-fuse"};
  std::unique_ptr<testing::MountedView> view_;  // destroyed before root_
};

}  // namespace agentvfs::fuse_test

// EXPECT_ERRNO_EQ(AsUser(...), EPERM): compares errno values, printing names.
#define EXPECT_ERRNO_EQ(actual, expected)             \
  EXPECT_EQ(::agentvfs::fuse_test::ErrnoText(actual), \
            ::agentvfs::fuse_test::ErrnoText(expected))
#define ASSERT_ERRNO_EQ(actual, expected)             \
  ASSERT_EQ(::agentvfs::fuse_test::ErrnoText(actual), \
            ::agentvfs::fuse_test::ErrnoText(expected))
