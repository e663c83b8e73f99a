// Many programs in the sandbox use the view at once (a parallel build, a
// test runner). Eight threads each create, write, read back and delete 200
// files in their own directory through the multi-threaded daemon; every
// byte must come back as written and nothing may be left behind.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/fuse/fuse_test_support.h"

namespace agentvfs::fuse_test {
namespace {

class ConcurrencyTest : public FuseViewTest {};

// One worker's files: returns a description of the first problem, or "".
std::string Work(const std::string& dir, int id, int files) {
  auto fail = [&](const std::string& what, int i) {
    return "thread " + std::to_string(id) + " file " + std::to_string(i) +
           ": " + what + ": " + std::strerror(errno);
  };
  // Sizes from empty to beyond one FUSE write (1 MiB) at the far end.
  auto size_of = [&](int i) {
    return static_cast<size_t>((i * 7919 + id * 104729) % 70000) +
           (i % 50 == 0 ? (1u << 20) + 3 : 0);
  };
  for (int i = 0; i < files; ++i) {
    const std::string path = dir + "/f" + std::to_string(i);
    const std::string data = Pattern(size_of(i), id * 1000 + i);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return fail("create", i);
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = write(fd, data.data() + done, data.size() - done);
      if (n <= 0) {
        close(fd);
        return fail("write", i);
      }
      done += static_cast<size_t>(n);
    }
    if (close(fd) != 0) return fail("close", i);
    // Every other file is read back at once, the rest after all are made.
    if (i % 2 == 0 && ReadFile(path) != data) return fail("read back", i);
  }
  for (int i = 1; i < files; i += 2) {
    const std::string path = dir + "/f" + std::to_string(i);
    if (ReadFile(path) != Pattern(size_of(i), id * 1000 + i)) {
      return fail("read back later", i);
    }
  }
  for (int i = 0; i < files; ++i) {
    const std::string path = dir + "/f" + std::to_string(i);
    if (unlink(path.c_str()) != 0) return fail("unlink", i);
  }
  return "";
}

TEST_F(ConcurrencyTest, EightThreadsWithTheirOwnDirectories) {
  const int kThreads = 8, kFiles = 200;
  ASSERT_TRUE(Mount());
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(mkdir(View("t" + std::to_string(t)).c_str(), 0755), 0)
        << std::strerror(errno);
  }
  std::mutex mu;
  std::vector<std::string> problems;  // guarded by mu
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string problem = Work(View("t" + std::to_string(t)), t, kFiles);
      if (!problem.empty()) {
        std::lock_guard lock(mu);
        problems.push_back(problem);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& p : problems) ADD_FAILURE() << p;

  for (int t = 0; t < kThreads; ++t) {
    const std::string rel = "t" + std::to_string(t);
    EXPECT_EQ(ListDir(View(rel)), std::vector<std::string>{}) << rel;
    EXPECT_EQ(ListDir(Host(rel)), std::vector<std::string>{}) << rel;
    EXPECT_EQ(rmdir(View(rel).c_str()), 0)
        << rel << ": " << std::strerror(errno);
  }
  EXPECT_EQ(ListDir(Host()), std::vector<std::string>{});
}

// With several daemon threads, a request that works inside a directory
// (by its node) must not meet a rename of that directory half-way: the
// daemon turns the node into a path, and a rename applied between that and
// the backend call sent the request to a path that no longer exists (a
// spurious ENOENT) or, worse, to another directory that took the old name.
// On a local filesystem, work through a directory fd never fails because
// the directory was renamed.
TEST_F(ConcurrencyTest, WorkInADirectoryNeverMeetsItsRenameHalfWay) {
  ASSERT_TRUE(Mount({"--threads", "4"}));
  ASSERT_EQ(mkdir(View("p").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(View("p/a").c_str(), 0755), 0);
  int dir = open(View("p/a").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir, 0) << std::strerror(errno);
  std::atomic<bool> stop{false};
  std::atomic<int> renames{0};
  std::thread renamer([&] {
    const std::string a = View("p/a"), b = View("p/b");
    while (!stop) {
      if (rename(a.c_str(), b.c_str()) == 0 &&
          rename(b.c_str(), a.c_str()) == 0)
        renames += 2;
    }
  });
  std::vector<std::string> problems;
  int done = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (int i = 0;
       problems.size() < 5 && std::chrono::steady_clock::now() < until; ++i) {
    const std::string name = "f" + std::to_string(i);
    int fd = openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                    0644);
    if (fd < 0) {
      problems.push_back("create " + name + ": " + std::strerror(errno));
      continue;
    }
    close(fd);
    struct stat st;
    if (fstatat(dir, name.c_str(), &st, 0) != 0)
      problems.push_back("stat " + name + ": " + std::strerror(errno));
    if (unlinkat(dir, name.c_str(), 0) != 0)
      problems.push_back("unlink " + name + ": " + std::strerror(errno));
    ++done;
  }
  stop = true;
  renamer.join();
  close(dir);
  for (const auto& p : problems) ADD_FAILURE() << p;
  std::printf(
      "%d files made and removed while the directory was renamed %d "
      "times\n",
      done, renames.load());
  EXPECT_GT(renames.load(), 0);
  EXPECT_EQ(ListDir(Host("p/a")), std::vector<std::string>{});
}

}  // namespace
}  // namespace agentvfs::fuse_test
