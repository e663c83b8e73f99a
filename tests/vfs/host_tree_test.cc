// RemoveTreeAt: any depth without recursion or a descriptor per level,
// never through a symlink or into another mount, and `keep_last` kept.
#include "vfs/host_tree.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"

namespace agentvfs::vfs {
namespace {

using testing::TempDir;

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

int OpenDir(const std::string& path) {
  return open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

// A chain of `depth` directories under `top`, each holding a file, made
// relative to an open directory (the path would pass PATH_MAX).
void MakeDeep(const std::string& top, int depth) {
  int fd = OpenDir(top);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < depth; ++i) {
    ASSERT_EQ(mkdirat(fd, "d", 0755), 0) << i;
    int f = openat(fd, "f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(f, 0);
    close(f);
    int sub = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(sub, 0);
    close(fd);
    fd = sub;
  }
  close(fd);
}

// 20,000 levels overflowed the stack of the recursive removal (a sandbox's
// `mkdir d; cd d` loop crashed `agentvfs exec` as it cleaned up), and with
// a descriptor per level 1,100 levels passed a user's limit of 1,024. Run
// in a child with a limit of 64 descriptors and a 1 MiB stack.
TEST(HostTree, ATreeOfAnyDepthIsRemovedWithFewDescriptors) {
  TempDir dir("agentvfs-hosttree");
  const std::string top = dir.Sub("top");
  ASSERT_EQ(mkdir(top.c_str(), 0755), 0);
  MakeDeep(top, 20'000);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit files{64, 64};
    rlimit stack{1 << 20, 1 << 20};
    if (setrlimit(RLIMIT_NOFILE, &files) != 0 ||
        setrlimit(RLIMIT_STACK, &stack) != 0)
      _exit(2);
    int fd = OpenDir(top);
    if (fd < 0) _exit(3);
    RemoveTreeAt(fd);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(Exists(top + "/d"));
  EXPECT_FALSE(Exists(top + "/f"));
  EXPECT_TRUE(Exists(top));  // the top itself is the caller's
}

TEST(HostTree, NothingOutsideTheTreeIsTouched) {
  TempDir dir("agentvfs-hosttree");
  const std::string top = dir.Sub("top"), outside = dir.Sub("outside");
  ASSERT_EQ(mkdir(top.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(outside.c_str(), 0755), 0);
  ASSERT_TRUE(testing::WriteFile(outside + "/keep", "x"));
  ASSERT_EQ(symlink(outside.c_str(), (top + "/link").c_str()), 0);
  ASSERT_EQ(mkdir((top + "/locked").c_str(), 0755), 0);
  ASSERT_TRUE(testing::WriteFile(top + "/locked/f", "x"));
  ASSERT_EQ(chmod((top + "/locked").c_str(), 0), 0);
  ASSERT_TRUE(testing::WriteFile(top + "/owner", "stamp"));
  // A mount below the tree stays whole (and mounted).
  const bool root = geteuid() == 0;
  struct Unmount {
    std::string point;
    ~Unmount() {
      if (!point.empty()) umount2(point.c_str(), MNT_DETACH);
    }
  } unmount;
  if (root) {
    ASSERT_EQ(mkdir((top + "/mnt").c_str(), 0755), 0);
    ASSERT_EQ(mount(outside.c_str(), (top + "/mnt").c_str(), nullptr, MS_BIND,
                    nullptr),
              0);
    unmount.point = top + "/mnt";
  }
  RemoveTreeAt(OpenDir(top), "owner");
  EXPECT_TRUE(Exists(outside + "/keep"));
  EXPECT_FALSE(Exists(top + "/link"));
  EXPECT_FALSE(Exists(top + "/locked"));
  EXPECT_TRUE(Exists(top + "/owner"));  // keep_last
  if (root) {
    EXPECT_TRUE(Exists(top + "/mnt/keep"));
  }
}

}  // namespace
}  // namespace agentvfs::vfs
