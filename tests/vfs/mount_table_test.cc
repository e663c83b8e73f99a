// The mount table reader: whole-component containment, and a bind mount
// listed with the directory of the filesystem it shows.
#include "vfs/mount_table.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace agentvfs::vfs {
namespace {

TEST(MountTable, IsWithinComparesWholeComponents) {
  EXPECT_TRUE(IsWithin("/a/b", "/a/b"));
  EXPECT_TRUE(IsWithin("/a/b/c", "/a/b"));
  EXPECT_TRUE(IsWithin("/a", "/"));
  EXPECT_TRUE(IsWithin("/", "/"));
  EXPECT_FALSE(IsWithin("/a/bc", "/a/b"));
  EXPECT_FALSE(IsWithin("/a", "/a/b"));
  EXPECT_FALSE(IsWithin("relative", "/"));
}

TEST(MountTable, ABindMountShowsTheDirectoryItBinds) {
  if (geteuid() != 0) GTEST_SKIP() << "bind mounts need root";
  char tmpl[] = "/tmp/agentvfs-mounttable-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string base = tmpl;
  const std::string src = base + "/src dir", dst = base + "/dst";
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dst.c_str(), 0755), 0);
  ASSERT_EQ(mount(src.c_str(), dst.c_str(), nullptr, MS_BIND, nullptr), 0);
  struct Unmount {
    std::string dst, base;
    ~Unmount() {
      umount2(dst.c_str(), MNT_DETACH);
      std::filesystem::remove_all(base);
    }
  } unmount{dst, base};
  auto table = ReadMountTable();
  ASSERT_FALSE(table.empty());
  EXPECT_TRUE(std::any_of(table.begin(), table.end(),
                          [](const MountEntry& m) { return m.point == "/"; }));
  auto at = std::find_if(table.begin(), table.end(),
                         [&](const MountEntry& m) { return m.point == dst; });
  ASSERT_NE(at, table.end()) << dst << " not in the table";
  // Its root is the source's path inside its own filesystem: the source's
  // path ends with it (the name with a space comes back unescaped).
  EXPECT_TRUE(src.ends_with(at->root)) << at->root;
  EXPECT_TRUE(at->root.ends_with("/src dir")) << at->root;
  EXPECT_FALSE(at->device.empty());
  EXPECT_FALSE(at->fstype.empty());
}

}  // namespace
}  // namespace agentvfs::vfs
