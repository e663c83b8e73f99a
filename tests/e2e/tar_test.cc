// tar and rm -rf through the mount: unpacking an archive into the workspace
// is how agents receive projects, and it exercises creation of every kind
// of entry, permission bits, hard links, symlinks and restored mtimes. The
// result is compared byte for byte and mode for mode with the source tree.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/e2e/e2e_support.h"

namespace agentvfs::e2e {
namespace {

using testing::TempDir;

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(size, '\0');
  for (auto& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

class TarTest : public MountedWorkspaceTest {
 protected:
  // A tree with every kind of entry tar knows about (but devices).
  void BuildSourceTree(const std::string& root) {
    const std::vector<std::pair<std::string, size_t>> sizes = {
        {"empty", 0},
        {"one", 1},
        {"page-minus-1", 4095},
        {"page", 4096},
        {"page-plus-1", 4097},
        {"a/b/c/d/deep.txt", 131079},
        {"big.bin", (1 << 20) + 13},
        {"bigger.bin", 3 << 20},
        {"with space.txt", 77}};
    for (const char* dir :
         {"a", "a/b", "a/b/c", "a/b/c/d", "bin", "emptydir"}) {
      ASSERT_EQ(mkdir((root + "/" + dir).c_str(), 0755), 0) << dir;
    }
    uint32_t seed = 1;
    for (const auto& [name, size] : sizes) {
      ASSERT_TRUE(WriteFile(root + "/" + name, RandomBytes(size, seed++)));
    }
    ASSERT_TRUE(WriteFile(root + "/bin/tool.sh",
                          "#!/bin/sh\necho tool-ran \"$@\"\n", 0755));
    ASSERT_TRUE(WriteFile(root + "/secret", "private\n", 0600));
    ASSERT_EQ(mkdir((root + "/a/private-dir").c_str(), 0700), 0);
    ASSERT_TRUE(WriteFile(root + "/a/private-dir/inner", "inner\n", 0640));
    ASSERT_EQ(symlink("one", (root + "/link-to-one").c_str()), 0);
    ASSERT_EQ(symlink("../../one", (root + "/a/b/up").c_str()), 0);
    ASSERT_EQ(symlink("does-not-exist", (root + "/dangling").c_str()), 0);
    ASSERT_EQ(symlink("a/b", (root + "/dir-link").c_str()), 0);
    ASSERT_EQ(link((root + "/page").c_str(), (root + "/hard-to-page").c_str()),
              0);
    // Fixed, old mtimes, so a restored time cannot be "now" by accident.
    struct timespec times[2] = {{1'500'000'000, 0}, {1'500'000'000, 0}};
    for (const auto& [name, size] : sizes) {
      ASSERT_EQ(utimensat(AT_FDCWD, (root + "/" + name).c_str(), times, 0), 0);
    }
    for (const char* name : {"bin/tool.sh", "secret", "a/private-dir/inner"}) {
      ASSERT_EQ(utimensat(AT_FDCWD, (root + "/" + name).c_str(), times, 0), 0);
    }
  }

  std::string Tar(std::vector<std::string> args) {
    args.insert(args.begin(), "tar");
    return Run(args);
  }
};

TEST_F(TarTest, ExtractIntoTheViewMatchesTheSource) {
  TempDir source("agentvfs-e2e-src"), scratch("agentvfs-e2e-scratch");
  ASSERT_NO_FATAL_FAILURE(BuildSourceTree(source.path()));
  const std::string archive = scratch.Sub("tree.tar");
  Tar({"-C", source.path(), "-cf", archive, "."});
  ASSERT_FALSE(HasFailure());

  const std::string out = View("extracted");
  ASSERT_EQ(mkdir(out.c_str(), 0755), 0) << std::strerror(errno);
  Tar({"-C", out, "-xpf", archive});
  ASSERT_FALSE(HasFailure());

  EXPECT_EQ(CompareTrees(source.path(), out), std::vector<std::string>{})
      << "as seen through the view";
  EXPECT_EQ(CompareTrees(source.path(), Host("extracted")),
            std::vector<std::string>{})
      << "as stored in the host directory";
  Run({"diff", "-r", "--no-dereference", source.path(), out});

  // tar recreated the hard link as one file with two names.
  struct stat page, hard;
  ASSERT_EQ(stat((out + "/page").c_str(), &page), 0);
  ASSERT_EQ(stat((out + "/hard-to-page").c_str(), &hard), 0);
  EXPECT_EQ(page.st_ino, hard.st_ino);
  EXPECT_EQ(page.st_nlink, 2u);

  // The executable runs from the view.
  EXPECT_EQ(Run({out + "/bin/tool.sh", "arg"}), "tool-ran arg\n");

  // And the tree archives back out of the view unchanged.
  const std::string archive2 = scratch.Sub("again.tar");
  Tar({"-C", out, "-cf", archive2, "."});
  ASSERT_EQ(mkdir(scratch.Sub("roundtrip").c_str(), 0755), 0);
  Tar({"-C", scratch.Sub("roundtrip"), "-xpf", archive2});
  EXPECT_EQ(CompareTrees(source.path(), scratch.Sub("roundtrip")),
            std::vector<std::string>{})
      << "after a round trip through the view";
}

TEST_F(TarTest, RmRfLeavesTheWorkspaceEmpty) {
  TempDir source("agentvfs-e2e-src"), scratch("agentvfs-e2e-scratch");
  ASSERT_NO_FATAL_FAILURE(BuildSourceTree(source.path()));
  const std::string archive = scratch.Sub("tree.tar");
  Tar({"-C", source.path(), "-cf", archive, "."});
  const std::string out = View("tree");
  ASSERT_EQ(mkdir(out.c_str(), 0755), 0) << std::strerror(errno);
  Tar({"-C", out, "-xpf", archive});
  ASSERT_FALSE(HasFailure());

  Run({"rm", "-rf", out});
  struct stat st;
  EXPECT_NE(lstat(out.c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(ListDir(View()), std::vector<std::string>{});
  EXPECT_EQ(ListDir(Host()), std::vector<std::string>{})
      << "nothing may be left behind in the host directory";
}

}  // namespace
}  // namespace agentvfs::e2e
