// A store whose filesystem fills up. The store lives on a small tmpfs that a
// child process mounts in its own mount namespace, so the mount ends with the
// child whatever happens. The write or commit that does not fit fails with
// ENOSPC and says what to do; everything acknowledged before stays whole and
// the file passes `PRAGMA integrity_check`; once space is freed, the same
// backend commits again, also the file whose commit failed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/store/admin.h"
#include "backends/store/auth.h"
#include "backends/store/engine.h"
#include "backends/store/store.h"
#include "tests/backends/store/process_test_util.h"
#include "tests/support/mount_fixture.h"

namespace agentvfs::store {
namespace {

using Problems = std::vector<std::string>;
using test_util::P;

// Runs `scenario` in a child process with a private mount namespace in which
// a tmpfs of `size` (mount(8) syntax) covers `dir`. Returns the problems the
// child reported, or why it could not run.
Problems InSmallTmpfs(
    const std::string& dir, const std::string& size,
    const std::function<Problems(const std::string&)>& scenario) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0)
    return {"pipe: " + std::string(strerror(errno))};
  pid_t pid = fork();
  if (pid < 0) return {"fork: " + std::string(strerror(errno))};
  if (pid == 0) {
    close(pipefd[0]);
    Problems problems;
    if (unshare(CLONE_NEWNS) != 0) {
      problems.push_back("unshare(CLONE_NEWNS): " +
                         std::string(strerror(errno)));
    } else if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) !=
               0) {
      problems.push_back("make / private: " + std::string(strerror(errno)));
    } else if (mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                     ("size=" + size + ",mode=0700").c_str()) != 0) {
      problems.push_back("mount tmpfs: " + std::string(strerror(errno)));
    } else {
      problems = scenario(dir);
    }
    std::string out;
    for (const auto& p : problems) out += p + "\n";
    size_t done = 0;
    while (done < out.size()) {
      ssize_t n = write(pipefd[1], out.data() + done, out.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(problems.empty() ? 0 : 1);
  }
  close(pipefd[1]);
  bool timed_out = false;
  std::string out =
      test_util::ReadUntilEof({pipefd[0]}, std::chrono::minutes(2), &timed_out)
          .front();
  close(pipefd[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  Problems problems = test_util::SplitLines(out);
  if (timed_out) problems.push_back("the child did not finish in 2 minutes");
  if (!WIFEXITED(status)) {
    problems.push_back("the child died with signal " +
                       std::to_string(WTERMSIG(status)));
  } else if (WEXITSTATUS(status) != 0 && problems.empty()) {
    problems.push_back("the child exited with " +
                       std::to_string(WEXITSTATUS(status)));
  }
  return problems;
}

std::string RandomContent(size_t size, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(size, '\0');
  for (auto& ch : s) ch = static_cast<char>(gen());
  return s;
}

// Open, write `data` in 64 KiB pieces, flush: the first error, with the step
// that gave it.
std::optional<std::pair<std::string, vfs::Error>> WriteAndCommit(
    StoreBackend& b, const vfs::Caller& c, const std::string& path,
    const std::string& data) {
  auto f = b.Open(c, P(path), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!f) return std::make_pair(std::string("open"), f.error());
  for (size_t off = 0; off < data.size(); off += 64 << 10) {
    size_t n = std::min<size_t>(64 << 10, data.size() - off);
    auto w = (*f)->Write(data.data() + off, n, static_cast<off_t>(off));
    if (!w) return std::make_pair(std::string("write"), w.error());
  }
  if (auto ok = (*f)->Flush(); !ok)
    return std::make_pair(std::string("close"), ok.error());
  return std::nullopt;
}

std::string IntegrityCheck(const std::string& db_path) {
  sqlite3* db = nullptr;
  std::string result = "cannot open";
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) ==
      SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, nullptr) ==
            SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      result = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    } else {
      result = sqlite3_errmsg(db);
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return result;
}

Problems FillTheDisk(const std::string& dir) {
  Problems problems;
  auto fail = [&](const std::string& what) { problems.push_back(what); };
  auto content_of = [](StoreBackend& b, const vfs::Caller& c,
                       const std::string& path) {
    return test_util::ReadPath(b, c, path).value_or("<unreadable>");
  };
  const std::string db = dir + "/store.db";
  auto admin = InitStore(db, "admin");
  if (!admin) return {"init: " + admin.error().ToString()};
  std::string token;
  {
    auto engine = Engine::Open(db, false);
    if (!engine) return {"engine: " + engine.error().ToString()};
    auto t = AddUser(**engine, "admin", "dev", {});
    if (!t) return {"add user: " + t.error().ToString()};
    token = *t;
  }
  // Space to give back later, in two steps (tmpfs holds written pages).
  const std::string filler = dir + "/filler", small_filler = dir + "/filler2";
  for (auto [path, size] :
       {std::pair{filler, 1 << 20}, std::pair{small_filler, 512 << 10}}) {
    std::string bytes = RandomContent(static_cast<size_t>(size), 7);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, bytes.data(), bytes.size()) !=
                      static_cast<ssize_t>(bytes.size())) {
      return {"cannot write " + path + ": " + std::string(strerror(errno))};
    }
    close(fd);
  }
  auto backend = StoreBackend::Open(db, StoreOptions{});
  if (!backend) return {"open backend: " + backend.error().ToString()};
  StoreBackend& b = **backend;
  auto user = Authenticate(b.engine(), token);
  if (!user) return {"token: " + user.error().ToString()};
  vfs::Caller c;
  c.user = *user;
  c.session = "disk-full";
  c.uid = geteuid();
  c.gid = getegid();

  // Commit 192 KiB files until one does not fit.
  std::vector<std::pair<std::string, std::string>> acknowledged;
  std::optional<std::pair<std::string, vfs::Error>> failure;
  std::string failed_path;
  for (int i = 0; i < 200 && !failure; ++i) {
    std::string path = "/memories/users/dev/f" + std::to_string(i);
    std::string data = RandomContent(192 << 10, static_cast<uint32_t>(100 + i));
    failure = WriteAndCommit(b, c, path, data);
    if (failure) {
      failed_path = path;
    } else {
      acknowledged.emplace_back(path, std::move(data));
    }
  }
  if (!failure) return {"200 files of 192 KiB fit in the small filesystem"};
  std::fprintf(stderr, "%zu files fitted; then %s of %s: %s\n",
               acknowledged.size(), failure->first.c_str(), failed_path.c_str(),
               failure->second.ToString().c_str());
  if (acknowledged.empty()) fail("not even the first file fitted");
  const vfs::Error& e = failure->second;
  if (e.code != ENOSPC) {
    fail(failure->first + " of " + failed_path + " failed with errno " +
         std::to_string(e.code) + ", not ENOSPC: " + e.ToString());
  }
  if (e.message.find("space") == std::string::npos) {
    fail("the message does not say that space ran out: " + e.ToString());
  }

  // With a little space back, a file is created, but a draft that grows big
  // enough to move to the scratch directory does not fit: its write fails.
  if (unlink(small_filler.c_str()) != 0) return {"cannot remove the filler"};
  auto big = WriteAndCommit(b, c, "/memories/users/dev/big",
                            RandomContent(3 << 20, 9));
  if (!big) {
    fail("a 3 MiB file was committed on the full filesystem");
  } else {
    std::fprintf(stderr, "the 3 MiB file: %s: %s\n", big->first.c_str(),
                 big->second.ToString().c_str());
    if (big->first != "write" || big->second.code != ENOSPC) {
      fail("the 3 MiB file's " + big->first + " failed with " +
           big->second.ToString() + ", not its write with ENOSPC");
    }
  }

  // Nothing acknowledged was lost, through this backend and a new one.
  auto second = StoreBackend::Open(db, StoreOptions{});
  if (!second) return {"reopen: " + second.error().ToString()};
  vfs::Caller c2 = c;
  c2.session = "disk-full-reader";
  for (const auto& [path, data] : acknowledged) {
    if (content_of(b, c, path) != data)
      fail(path + " differs after the failure");
    if (content_of(**second, c2, path) != data)
      fail(path + " differs in a new backend");
  }
  if (auto check = IntegrityCheck(db); check != "ok")
    fail("integrity_check on the full filesystem: " + check);

  // Free space: the same backend commits again, the failed path too.
  if (unlink(filler.c_str()) != 0) return {"cannot remove the filler"};
  std::string again = RandomContent(192 << 10, 4242);
  if (auto r = WriteAndCommit(b, c, failed_path, again); r) {
    fail("after freeing space, " + r->first + " of " + failed_path +
         " still fails: " + r->second.ToString());
  } else if (content_of(**second, c2, failed_path) != again) {
    fail(failed_path + " reads back wrong after the retry");
  }
  if (auto r = WriteAndCommit(b, c, "/memories/users/dev/after", "later"); r) {
    fail("after freeing space, a new file fails at " + r->first + ": " +
         r->second.ToString());
  }
  for (const auto& [path, data] : acknowledged) {
    if (content_of(b, c, path) != data)
      fail(path + " differs after space came back");
  }
  if (auto check = IntegrityCheck(db); check != "ok")
    fail("integrity_check after freeing space: " + check);
  return problems;
}

TEST(DiskFullTest, ACommitThatDoesNotFitFailsWithEnospcAndLosesNothing) {
  testing::TempDir mnt("agentvfs-diskfull");
  for (const auto& problem : InSmallTmpfs(mnt.path(), "4m", FillTheDisk))
    ADD_FAILURE() << problem;
}

}  // namespace
}  // namespace agentvfs::store
