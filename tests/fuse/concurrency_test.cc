// Many programs in the sandbox use the view at once (a parallel build, a
// test runner). Eight threads each create, write, read back and delete 200
// files in their own directory through the multi-threaded daemon; every
// byte must come back as written and nothing may be left behind.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

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

}  // namespace
}  // namespace agentvfs::fuse_test
