// The store through real mounts: two users in two mount processes sharing a
// team folder (write conflicts are rejected, never merged), a writer's lease
// dying with its process, commits of another session becoming visible to a
// live mount within a second, and a 200 MiB file written and read back
// through the mount without the daemon ever holding it in memory.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "backends/store/admin.h"
#include "backends/store/namespace.h"
#include "tests/fuse/fuse_test_support.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::fuse_test {
namespace {

using testing::MountedView;
using testing::StoreFixture;
using testing::TempDir;

// Two mounts of one store: alice at A, bob at B (both in team eng).
// Every test here runs on each engine: for PostgreSQL the two mounts are two
// processes sharing only the database, as two hosts would.
class TwoMountsTest : public ::testing::TestWithParam<testing::StoreEngine> {
 protected:
  void SetUp() override {
    auto f = StoreFixture::Create(
        {"alice", "bob"}, {{"alice", {"eng"}}, {"bob", {"eng"}}}, GetParam());
    ASSERT_TRUE(f.has_value()) << f.error().ToString();
    store_ = std::move(*f);
  }
  void TearDown() override {
    for (auto& v : views_) {
      if (v) {
        EXPECT_EQ(v->Stop(), 0) << v->Log();
      }
    }
  }

  // Mounts the store as `user`; returns the mount point.
  std::string MountAs(const std::string& user,
                      std::vector<std::string> extra = {}) {
    dirs_.push_back(std::make_unique<TempDir>("agentvfs-ws"));
    std::string ws = dirs_.back()->path();
    dirs_.push_back(std::make_unique<TempDir>("agentvfs-mnt"));
    auto args = store_->MountArgs(user);
    args.insert(args.end(), extra.begin(), extra.end());
    std::string error;
    views_.push_back(
        MountedView::Start(ws, dirs_.back()->path(), args, &error));
    EXPECT_NE(views_.back(), nullptr) << error;
    return views_.back() ? views_.back()->mountpoint() : "/nonexistent";
  }

  std::unique_ptr<StoreFixture> store_;
  std::vector<std::unique_ptr<TempDir>> dirs_;
  std::vector<std::unique_ptr<MountedView>> views_;
};

std::string Eng(const std::string& mnt, const std::string& name) {
  return mnt + "/memories/teams/eng/" + name;
}

int OpenFd(const std::string& path, int flags) {
  int fd = open(path.c_str(), flags, 0644);
  return fd;
}

bool WriteAllFd(int fd, const std::string& data) {
  return write(fd, data.data(), data.size()) ==
         static_cast<ssize_t>(data.size());
}

TEST_P(TwoMountsTest, AConcurrentWriterGetsEbusyUntilTheHolderCloses) {
  std::string a = MountAs("alice"), b = MountAs("bob");
  int fa = OpenFd(Eng(a, "plan.md"), O_WRONLY | O_CREAT | O_TRUNC);
  ASSERT_GE(fa, 0) << strerror(errno);
  ASSERT_TRUE(WriteAllFd(fa, "alice's plan\n"));

  errno = 0;
  EXPECT_EQ(OpenFd(Eng(b, "plan.md"), O_WRONLY | O_APPEND), -1);
  EXPECT_EQ(ErrnoText(errno), ErrnoText(EBUSY)) << "bob must not write while "
                                                   "alice holds the file";
  ASSERT_EQ(close(fa), 0) << strerror(errno);

  int fb = OpenFd(Eng(b, "plan.md"), O_WRONLY | O_APPEND);
  ASSERT_GE(fb, 0) << "after alice closed, bob may write: " << strerror(errno);
  ASSERT_TRUE(WriteAllFd(fb, "bob's addition\n"));
  ASSERT_EQ(close(fb), 0);
  EXPECT_EQ(ReadFile(Eng(a, "plan.md")).value_or("?"),
            "alice's plan\nbob's addition\n");
}

TEST_P(TwoMountsTest, AStaleWriterIsRejectedUntilItRereads) {
  std::string a = MountAs("alice"), b = MountAs("bob");
  ASSERT_TRUE(WriteFile(Eng(a, "notes.md"), "v1\n", 0644));
  // Bob reads version 1.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(ReadFile(Eng(b, "notes.md")).value_or("?"), "v1\n");
  // Alice commits version 2.
  ASSERT_TRUE(WriteFile(Eng(a, "notes.md"), "v2 by alice\n", 0644));
  // Bob, who read version 1, may not replace it.
  errno = 0;
  EXPECT_EQ(OpenFd(Eng(b, "notes.md"), O_WRONLY | O_TRUNC), -1);
  EXPECT_EQ(ErrnoText(errno), ErrnoText(ESTALE));
  errno = 0;
  EXPECT_EQ(unlink(Eng(b, "notes.md").c_str()), -1);
  EXPECT_EQ(ErrnoText(errno), ErrnoText(ESTALE));
  EXPECT_EQ(ReadFile(Eng(a, "notes.md")).value_or("?"), "v2 by alice\n")
      << "the winner's data is intact";
  // Once bob has read version 2, his write goes through.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ASSERT_EQ(ReadFile(Eng(b, "notes.md")).value_or("?"), "v2 by alice\n");
  int fb = OpenFd(Eng(b, "notes.md"), O_WRONLY | O_APPEND);
  ASSERT_GE(fb, 0) << strerror(errno);
  ASSERT_TRUE(WriteAllFd(fb, "v3 by bob\n"));
  ASSERT_EQ(close(fb), 0);
  EXPECT_EQ(ReadFile(Eng(a, "notes.md")).value_or("?"),
            "v2 by alice\nv3 by bob\n");
}

TEST_P(TwoMountsTest, OfTwoRacingCreatesOneWinsAndTheOtherIsTold) {
  std::string a = MountAs("alice"), b = MountAs("bob");
  for (int round = 0; round < 10; ++round) {
    for (int flags : {O_WRONLY | O_CREAT, O_WRONLY | O_CREAT | O_EXCL}) {
      std::string name =
          "race-" + std::to_string(round) + ((flags & O_EXCL) ? "-excl" : "");
      std::barrier sync(2);
      int err[2] = {0, 0};
      auto racer = [&](int i, const std::string& mnt) {
        sync.arrive_and_wait();
        int fd = OpenFd(Eng(mnt, name), flags);
        if (fd < 0) {
          err[i] = errno;
          sync.arrive_and_wait();
          return;
        }
        // Hold the file while the other racer tries.
        sync.arrive_and_wait();
        std::string mine = i == 0 ? "alice wins\n" : "bob wins\n";
        if (!WriteAllFd(fd, mine)) err[i] = errno;
        if (close(fd) != 0) err[i] = errno;
      };
      std::thread t0(racer, 0, a), t1(racer, 1, b);
      t0.join();
      t1.join();
      int winners = (err[0] == 0) + (err[1] == 0);
      EXPECT_EQ(winners, 1) << name << ": alice " << ErrnoText(err[0])
                            << ", bob " << ErrnoText(err[1]);
      int loser = err[0] != 0 ? err[0] : err[1];
      EXPECT_TRUE(loser == EEXIST || loser == EBUSY) << ErrnoText(loser);
      // The winner's own mount shows its data at once (the other mount may
      // keep its cached attributes for up to a second).
      std::string want = err[0] == 0 ? "alice wins\n" : "bob wins\n";
      EXPECT_EQ(ReadFile(Eng(err[0] == 0 ? a : b, name)).value_or("?"), want)
          << name;
    }
  }
}

TEST_P(TwoMountsTest, ALeaseDiesWithItsHolder) {
  std::string a = MountAs("alice"), b = MountAs("bob");
  int fa = OpenFd(Eng(a, "held.md"), O_WRONLY | O_CREAT);
  ASSERT_GE(fa, 0) << strerror(errno);
  errno = 0;
  ASSERT_EQ(OpenFd(Eng(b, "held.md"), O_WRONLY), -1);
  ASSERT_EQ(ErrnoText(errno), ErrnoText(EBUSY));
  // Alice's daemon dies with the file open for writing.
  ASSERT_EQ(kill(views_[0]->pid(), SIGKILL), 0);
  close(fa);                        // ENOTCONN: the mount is dead
  EXPECT_NE(views_[0]->Stop(), 0);  // reaps it and clears the dead mount
  views_[0].reset();
  int fb = OpenFd(Eng(b, "held.md"), O_WRONLY);
  ASSERT_GE(fb, 0) << "the dead holder's lease must end at once: "
                   << strerror(errno);
  ASSERT_TRUE(WriteAllFd(fb, "bob took over\n"));
  ASSERT_EQ(close(fb), 0);
}

TEST_P(TwoMountsTest, ALeaseOfAnUnreachableHolderExpires) {
  // A holder on another host cannot be checked for life: its lease lasts
  // until it stops renewing it.
  std::string b = MountAs("bob");
  ASSERT_TRUE(WriteFile(Eng(b, "remote.md"), "x\n", 0644));
  ASSERT_OK_AND_ASSIGN(auto engine, store::Engine::Open(store_->db(), false));
  int64_t expires = store::NowNs() + 1'500'000'000;
  ASSERT_OK(engine->Write(
      store::Durability::kProcess, [&](store::Txn& t) -> vfs::Status {
        auto r = t.Exec(
            "INSERT INTO leases(ino, session, \"user\", host, pid, pid_start, "
            "expires_ns) SELECT d.ino, 'far-away', 'alice', 'other-host', 1, "
            "1, ? "
            "FROM dentries d WHERE d.name = 'remote.md'",
            {expires});
        if (!r) return std::unexpected(r.error());
        if (*r != 1) return vfs::Fail(EIO, "no such file in the store");
        return {};
      }));
  errno = 0;
  EXPECT_EQ(OpenFd(Eng(b, "remote.md"), O_WRONLY), -1);
  EXPECT_EQ(ErrnoText(errno), ErrnoText(EBUSY));
  std::this_thread::sleep_for(std::chrono::milliseconds(1700));
  int fb = OpenFd(Eng(b, "remote.md"), O_WRONLY);
  EXPECT_GE(fb, 0) << "an expired lease must not block: " << strerror(errno);
  if (fb >= 0) close(fb);
}

// Polls until `path` reads as `want`; seconds taken, or -1 after `limit_s`.
double SecondsUntilContent(const std::string& path, const std::string& want,
                           double limit_s) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (ReadFile(path).value_or("") == want) return t;
    if (t > limit_s) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST_P(TwoMountsTest, AnotherSessionsCommitIsVisibleWithinASecond) {
  // Long kernel cache timeouts: only the store's change feed can make the
  // mount notice.
  std::string a = MountAs("alice", {"--cache-timeout", "3600"});
  std::string b = MountAs("bob");
  ASSERT_TRUE(WriteFile(Eng(b, "shared.md"), "first\n", 0644));
  ASSERT_GE(SecondsUntilContent(Eng(a, "shared.md"), "first\n", 2.0), 0);
  for (int i = 0; i < 5; ++i) {
    std::string content =
        "change " + std::to_string(i) + " by bob" + std::string(i, '!') + "\n";
    // Bob must have read what he replaces.
    ASSERT_TRUE(ReadFile(Eng(b, "shared.md")).has_value());
    ASSERT_TRUE(WriteFile(Eng(b, "shared.md"), content, 0644));
    double t = SecondsUntilContent(Eng(a, "shared.md"), content, 3.0);
    ASSERT_GE(t, 0) << "alice's mount never showed change " << i;
    std::printf("change %d visible to the other mount after %.3f s\n", i, t);
    EXPECT_LT(t, 1.0);
  }
  // New names, removals and renames too.
  ASSERT_TRUE(WriteFile(Eng(b, "new.md"), "new\n", 0644));
  EXPECT_LT(SecondsUntilContent(Eng(a, "new.md"), "new\n", 3.0), 1.0);
  ASSERT_EQ(unlink(Eng(b, "new.md").c_str()), 0);
  auto start = std::chrono::steady_clock::now();
  while (access(Eng(a, "new.md").c_str(), F_OK) == 0 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LT(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      1.0)
      << "the removal took too long to show";
}

// A read right after another session's commit, before the change feed's
// invalidation can have reached this mount, gets the new content. Before,
// the kernel served the old pages (and size) it had cached while the store
// counted the new version as read, so a write based on the old bytes passed
// the stale-writer check and silently replaced the other session's commit.
TEST_P(TwoMountsTest, AReadRightAfterAnotherSessionsCommitIsTheNewContent) {
  std::string a = MountAs("alice", {"--cache-timeout", "3600"});
  std::string b = MountAs("bob");
  std::string current = "counter=0\n";
  ASSERT_TRUE(WriteFile(Eng(b, "counter"), current, 0644));
  ASSERT_GE(SecondsUntilContent(Eng(a, "counter"), current, 3.0), 0);
  for (int i = 1; i <= 10; ++i) {
    ASSERT_EQ(ReadFile(Eng(a, "counter")).value_or("?"), current) << i;
    current = "counter=" + std::to_string(i) + std::string(i, '+') + "\n";
    ASSERT_TRUE(WriteFile(Eng(b, "counter"), current, 0644));
    EXPECT_EQ(ReadFile(Eng(a, "counter")).value_or("?"), current)
        << "alice read an older version right after bob's commit " << i;
  }
}

// With the writeback cache the kernel keeps the sizes of files it cached
// and never takes them from the daemon again: another session's commit
// would not show, and an append after it landed over its bytes. A store is
// therefore not served with it.
TEST_P(TwoMountsTest, TheWritebackCacheIsRefusedWithAStore) {
  TempDir ws("agentvfs-ws"), mnt("agentvfs-mnt");
  auto args = store_->MountArgs("alice");
  args.push_back("--writeback-cache");
  std::string error;
  auto view = MountedView::Start(ws.path(), mnt.path(), args, &error);
  EXPECT_EQ(view, nullptr);
  EXPECT_NE(error.find("--writeback-cache cannot serve a store"),
            std::string::npos)
      << error;
  if (view) {
    EXPECT_EQ(view->Stop(), 0);
  }
}

// A session that found no file at a path and then opens for writing the
// file another session made there since, without having read it, is the
// second of two creates: EEXIST, and the first one's file stays whole
// (before, bob's open went through and wrote over alice's bytes).
TEST_P(TwoMountsTest, ABlindCreateOverAFileMadeSinceIsRefused) {
  std::string a = MountAs("alice"), b = MountAs("bob");
  const std::string alices = "alice: the important, longer content\n";
  for (int flags : {O_WRONLY | O_CREAT, O_WRONLY | O_CREAT | O_TRUNC}) {
    std::string name = "made-" + std::to_string(flags);
    struct stat st;
    ASSERT_NE(stat(Eng(b, name).c_str(), &st), 0);  // bob: no file there
    ASSERT_TRUE(WriteFile(Eng(a, name), alices, 0644));
    errno = 0;
    int fd = OpenFd(Eng(b, name), flags);
    if (fd >= 0) {
      (void)WriteAllFd(fd, "bob: short\n");
      close(fd);
    }
    EXPECT_EQ(fd, -1) << name;
    EXPECT_EQ(ErrnoText(errno), ErrnoText(EEXIST)) << name;
    EXPECT_EQ(ReadFile(Eng(a, name)).value_or("?"), alices) << name;
    // Once bob has read it, he writes it like any file.
    ASSERT_EQ(ReadFile(Eng(b, name)).value_or("?"), alices) << name;
    fd = OpenFd(Eng(b, name), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0) << name << ": " << strerror(errno);
    ASSERT_TRUE(WriteAllFd(fd, "bob\n"));
    ASSERT_EQ(close(fd), 0);
  }
}

// A session may not move a file it has a stale view of away from its name,
// as it may not unlink it: an editor that saves by renaming the old file to
// a backup and writing a new one would otherwise put the other session's
// version out of the file's history without a word.
TEST_P(TwoMountsTest, AStaleFileIsNotMovedAwayEither) {
  std::string a = MountAs("alice"), b = MountAs("bob");
  ASSERT_TRUE(WriteFile(Eng(a, "plan.md"), "v1\n", 0644));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(ReadFile(Eng(b, "plan.md")).value_or("?"), "v1\n");
  ASSERT_TRUE(WriteFile(Eng(a, "plan.md"), "v1\nalice's line\n", 0644));
  errno = 0;
  EXPECT_EQ(rename(Eng(b, "plan.md").c_str(), Eng(b, "plan.md~").c_str()), -1);
  EXPECT_EQ(ErrnoText(errno), ErrnoText(ESTALE));
  EXPECT_EQ(ReadFile(Eng(a, "plan.md")).value_or("?"), "v1\nalice's line\n");
  ASSERT_EQ(ReadFile(Eng(b, "plan.md")).value_or("?"), "v1\nalice's line\n");
  EXPECT_EQ(rename(Eng(b, "plan.md").c_str(), Eng(b, "plan.md~").c_str()), 0)
      << strerror(errno);
}

// Peak resident memory of a process, in KiB.
long PeakRssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

TEST_P(TwoMountsTest, A200MiBFileStreamsThroughTheMount) {
  std::string a = MountAs("alice");
  const size_t kSize = 200u << 20;
  const size_t kBlock = 1u << 20;
  std::string block = Pattern(kBlock, 7);
  int fd = OpenFd(Eng(a, "big.bin"), O_WRONLY | O_CREAT | O_TRUNC);
  ASSERT_GE(fd, 0);
  for (size_t off = 0; off < kSize; off += kBlock) {
    // Every block differs (no deduplication to hide behind).
    std::string b = block;
    std::memcpy(b.data(), &off, sizeof off);
    ASSERT_TRUE(WriteAllFd(fd, b)) << strerror(errno);
  }
  ASSERT_EQ(close(fd), 0) << strerror(errno);
  struct stat st;
  ASSERT_EQ(stat(Eng(a, "big.bin").c_str(), &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), kSize);

  // Read back through a fresh mount (nothing in its page cache).
  std::string b_mnt = MountAs("bob");
  fd = OpenFd(Eng(b_mnt, "big.bin"), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string buf(kBlock, '\0');
  for (size_t off = 0; off < kSize; off += kBlock) {
    size_t have = 0;
    while (have < kBlock) {
      ssize_t n = read(fd, buf.data() + have, kBlock - have);
      ASSERT_GT(n, 0) << "at " << off + have;
      have += static_cast<size_t>(n);
    }
    std::string want = block;
    std::memcpy(want.data(), &off, sizeof off);
    ASSERT_TRUE(buf == want) << "block at " << off << " differs";
  }
  char extra;
  EXPECT_EQ(read(fd, &extra, 1), 0);
  close(fd);
  long writer_kib = PeakRssKib(views_[0]->pid());
  long reader_kib = PeakRssKib(views_[1]->pid());
  std::printf("peak RSS: writing daemon %ld KiB, reading daemon %ld KiB\n",
              writer_kib, reader_kib);
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer keeps freed memory in quarantine (256 MiB by default),
  // so resident size says nothing here; the plain build checks the bound.
  (void)writer_kib, (void)reader_kib;
#else
  EXPECT_LT(writer_kib, 100 * 1024) << "the writer held the file in memory";
  EXPECT_LT(reader_kib, 100 * 1024) << "the reader held the file in memory";
#endif
}

INSTANTIATE_TEST_SUITE_P(Engines, TwoMountsTest,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

}  // namespace
}  // namespace agentvfs::fuse_test
