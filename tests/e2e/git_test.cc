// git inside the mounted workspace: the most common thing an agent does to
// its files, and a demanding user of a filesystem (lock files with O_EXCL,
// rename over existing files, hard-to-fake stat data in the index, mmap of
// pack files, fsync). Runs the real `git` binary with an isolated
// configuration (HOME and GIT_CONFIG_NOSYSTEM point away from the host's).
#include <sys/stat.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/e2e/e2e_support.h"

namespace agentvfs::e2e {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class GitTest : public MountedWorkspaceTest {
 protected:
  void SetUp() override {
    MountedWorkspaceTest::SetUp();
    if (HasFatalFailure()) return;
    home_ = std::make_unique<testing::TempDir>("agentvfs-e2e-home");
  }
  void TearDown() override {
    MountedWorkspaceTest::TearDown();
    home_.reset();
  }

  // `git ARGS...` in `dir`; fails the test unless it exits 0.
  std::string Git(const std::string& dir, std::vector<std::string> args) {
    std::vector<std::string> argv = {"git",
                                     "-c",
                                     "user.name=Agent Tester",
                                     "-c",
                                     "user.email=agent@example.com",
                                     "-c",
                                     "init.defaultBranch=main",
                                     "-c",
                                     "core.fsync=all"};
    argv.insert(argv.end(), args.begin(), args.end());
    testing::CommandOptions options;
    options.cwd = dir;
    options.env = {{"HOME", home_->path()},
                   {"GIT_CONFIG_NOSYSTEM", "1"},
                   {"GIT_CONFIG_GLOBAL", home_->Sub(".gitconfig")},
                   {"LC_ALL", "C"},
                   {"GIT_TERMINAL_PROMPT", "0"}};
    return Run(argv, options);
  }

  std::unique_ptr<testing::TempDir> home_;
};

TEST_F(GitTest, InitCommitBranchCheckoutAndFsck) {
  const std::string repo = View("repo");
  ASSERT_EQ(mkdir(repo.c_str(), 0755), 0) << std::strerror(errno);
  Git(repo, {"init", "-q"});
  ASSERT_FALSE(HasFailure());

  // First commit: text, a binary blob, an executable, a nested directory.
  ASSERT_TRUE(WriteFile(repo + "/README.md", "# v1\n"));
  ASSERT_EQ(mkdir((repo + "/src").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(repo + "/src/main.c", "int main() { return 0; }\n"));
  ASSERT_EQ(mkdir((repo + "/tools").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(repo + "/tools/run.sh", "#!/bin/sh\necho ran\n", 0755));
  std::string blob;
  for (int i = 0; i < 200000; ++i) blob += static_cast<char>((i * 7919) >> 3);
  ASSERT_TRUE(WriteFile(repo + "/data.bin", blob));
  Git(repo, {"add", "-A"});
  Git(repo, {"commit", "-q", "-m", "first"});
  const std::string first = Trim(Git(repo, {"rev-parse", "HEAD"}));
  ASSERT_EQ(first.size(), 40u) << first;

  // Second commit: modify, delete, add.
  ASSERT_TRUE(WriteFile(repo + "/README.md", "# v2\nmore\n"));
  Git(repo, {"rm", "-q", "src/main.c"});
  ASSERT_TRUE(WriteFile(repo + "/notes.txt", "notes\n"));
  Git(repo, {"add", "-A"});
  Git(repo, {"commit", "-q", "-m", "second"});
  EXPECT_EQ(Git(repo, {"status", "--porcelain"}), "")
      << "the tree must be clean right after a commit";

  Git(repo, {"branch", "feature"});
  EXPECT_EQ(Git(repo, {"branch", "--list", "--format=%(refname:short)"}),
            "feature\nmain\n");

  // Going back to the first commit restores its files exactly.
  Git(repo, {"checkout", "-q", first});
  EXPECT_EQ(ReadFile(repo + "/README.md"), "# v1\n");
  EXPECT_EQ(ReadFile(repo + "/src/main.c"), "int main() { return 0; }\n");
  EXPECT_EQ(ReadFile(repo + "/data.bin"), blob);
  EXPECT_EQ(ReadFile(repo + "/notes.txt"), std::nullopt);
  struct stat st;
  ASSERT_EQ(stat((repo + "/tools/run.sh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u) << "git keeps the executable bit";
  EXPECT_EQ(Git(repo, {"status", "--porcelain"}), "");

  // Commit on the feature branch, then come back to main.
  Git(repo, {"checkout", "-q", "feature"});
  EXPECT_EQ(ReadFile(repo + "/README.md"), "# v2\nmore\n");
  EXPECT_EQ(ReadFile(repo + "/src/main.c"), std::nullopt);
  ASSERT_TRUE(WriteFile(repo + "/feature.txt", "feature work\n"));
  Git(repo, {"add", "feature.txt"});
  Git(repo, {"commit", "-q", "-m", "third"});
  Git(repo, {"checkout", "-q", "main"});
  EXPECT_EQ(ReadFile(repo + "/feature.txt"), std::nullopt);
  Git(repo, {"merge", "-q", "--ff-only", "feature"});
  EXPECT_EQ(ReadFile(repo + "/feature.txt"), "feature work\n");
  EXPECT_EQ(Trim(Git(repo, {"rev-list", "--count", "HEAD"})), "3");

  // Repacking rewrites the object store with renames and fsyncs; the
  // repository must still be whole afterwards.
  Git(repo, {"gc", "-q"});
  Git(repo, {"fsck", "--full", "--strict", "--no-dangling"});
  EXPECT_EQ(Git(repo, {"status", "--porcelain"}), "");

  // The host sees the same, intact repository.
  Git(Host("repo"), {"fsck", "--full", "--strict", "--no-dangling"});
  EXPECT_EQ(Trim(Git(Host("repo"), {"log", "--format=%s"})),
            "third\nsecond\nfirst");
}

TEST_F(GitTest, CloneIntoTheViewMatchesTheSource) {
  // A repository on the host, cloned into the view (many small files,
  // packs, checkouts), then verified.
  testing::TempDir source("agentvfs-e2e-src");
  Git(source.path(), {"init", "-q"});
  for (int i = 0; i < 50; ++i) {
    std::string dir = source.Sub("d" + std::to_string(i % 5));
    mkdir(dir.c_str(), 0755);
    ASSERT_TRUE(WriteFile(dir + "/f" + std::to_string(i) + ".txt",
                          std::string(i * 97, 'a' + i % 26)));
  }
  Git(source.path(), {"add", "-A"});
  Git(source.path(), {"commit", "-q", "-m", "many files"});
  Git(View(), {"clone", "-q", "--no-local", source.path(), "clone"});
  Git(View("clone"), {"fsck", "--full", "--strict", "--no-dangling"});
  EXPECT_EQ(Git(View("clone"), {"status", "--porcelain"}), "");
  EXPECT_EQ(Git(View("clone"), {"rev-parse", "HEAD"}),
            Git(source.path(), {"rev-parse", "HEAD"}));
  EXPECT_EQ(CompareTrees(source.Sub("d3"), View("clone/d3"),
                         CompareOptions{.mtimes = false}),
            std::vector<std::string>{});
}

}  // namespace
}  // namespace agentvfs::e2e
