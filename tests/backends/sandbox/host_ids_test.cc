// Host ids of root's sandboxes: a pick that a live session holds (in this
// process or another), that an account names or that a process runs as is
// skipped; a lease ends with its holder, however it dies; an unsafe lock
// directory is refused. The picks are scripted, the locks and processes real.
#include "backends/sandbox/host_ids.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <functional>
#include <thread>

#include "tests/backends/sandbox/sandbox_fixture.h"
#include "tests/support/mount_fixture.h"

namespace agentvfs::testing {
namespace {

using sandbox::HostIdPool;
using sandbox::ReserveHostId;
using ::testing::HasSubstr;

// Far from kHostIdBase, so that the host's real sandboxes never interfere.
constexpr uint32_t kTestBase = 0x61000000;

class HostIdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "host ids are root's (run as root)";
    dir_ = std::make_unique<TempDir>("agentvfs-hostids");
    locks_ = dir_->Sub("locks");
  }
  // A pool whose picks come from `picks`, in order (then the last again).
  HostIdPool Pool(std::deque<uint16_t> picks, int attempts = 8) {
    HostIdPool pool;
    pool.lock_dir = locks_;
    pool.base = kTestBase;
    pool.attempts = attempts;
    auto left = std::make_shared<std::deque<uint16_t>>(std::move(picks));
    pool.pick = [left] {
      uint16_t p = left->front();
      if (left->size() > 1) left->pop_front();
      return p;
    };
    return pool;
  }
  std::unique_ptr<TempDir> dir_;
  std::string locks_;
};

TEST_F(HostIdTest, APickALiveLeaseHoldsIsSkippedUntilReleased) {
  auto a = ReserveHostId(Pool({10}));
  ASSERT_TRUE(a.has_value()) << a.error().message;
  EXPECT_EQ(a->id(), kTestBase + 10);
  auto b = ReserveHostId(Pool({10, 10, 11}));
  ASSERT_TRUE(b.has_value()) << b.error().message;
  EXPECT_EQ(b->id(), kTestBase + 11);
  a->Release();
  EXPECT_NE(
      access((locks_ + "/" + std::to_string(kTestBase + 10)).c_str(), F_OK), 0)
      << "a released lease leaves its lock file behind";
  auto c = ReserveHostId(Pool({10}));
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->id(), kTestBase + 10);
  // The lock directory is root's alone.
  struct stat st;
  ASSERT_EQ(stat(locks_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// A child process that runs `setup`, reports whether it succeeded and then
// waits to be killed (by Kill() or, at the latest, the destructor).
class Holder {
 public:
  explicit Holder(const std::function<bool()>& setup) {
    int ready[2];
    if (pipe(ready) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      char c = setup() ? 'y' : 'n';
      (void)!write(ready[1], &c, 1);
      pause();
      _exit(0);
    }
    close(ready[1]);
    char c = 0;
    ok_ = pid_ > 0 && read(ready[0], &c, 1) == 1 && c == 'y';
    close(ready[0]);
  }
  ~Holder() { Kill(); }
  bool ok() const { return ok_; }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  bool ok_ = false;
};

TEST_F(HostIdTest, ALeaseOfAnotherProcessCountsAndEndsWhenItIsKilled) {
  Holder holder([this] {
    auto held = ReserveHostId(Pool({12}));
    if (!held || held->id() != kTestBase + 12) return false;
    static sandbox::HostIdLease kept;  // held while the child pauses
    kept = std::move(*held);
    return true;
  });
  ASSERT_TRUE(holder.ok());
  auto busy = ReserveHostId(Pool({12}, 3));
  EXPECT_FALSE(busy.has_value());
  holder.Kill();
  auto after = ReserveHostId(Pool({12}));
  ASSERT_TRUE(after.has_value()) << after.error().message;
  EXPECT_EQ(after->id(), kTestBase + 12);
}

// The lock file of a holder that died (its lock dropped by the kernel) is
// removed by the next reservation; a live holder's stays.
TEST_F(HostIdTest, DeadHoldersLockFilesAreSweptLiveOnesKept) {
  auto live = ReserveHostId(Pool({50}));
  ASSERT_TRUE(live.has_value()) << live.error().message;
  const std::string dead = locks_ + "/" + std::to_string(kTestBase + 51);
  { std::ofstream(dead) << ""; }  // as a killed holder leaves it
  auto next = ReserveHostId(Pool({52}));
  ASSERT_TRUE(next.has_value()) << next.error().message;
  EXPECT_NE(access(dead.c_str(), F_OK), 0) << "a dead holder's file stays";
  EXPECT_EQ(
      access((locks_ + "/" + std::to_string(kTestBase + 50)).c_str(), F_OK), 0)
      << "a live holder's file was removed";
  auto again = ReserveHostId(Pool({50, 53}));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->id(), kTestBase + 53);  // 50 is still held
}

TEST_F(HostIdTest, AnIdAProcessRunsAsIsSkipped) {
  const uint32_t used = kTestBase + 20;
  // A process left over from a session whose holder died: it has the id
  // but no lock.
  Holder leftover([used] {
    return setresgid(used, used, used) == 0 && setresuid(used, used, used) == 0;
  });
  ASSERT_TRUE(leftover.ok());
  auto in_use = sandbox::HostIdInUse(used);
  ASSERT_TRUE(in_use.has_value());
  EXPECT_TRUE(*in_use);
  auto got = ReserveHostId(Pool({20, 21}));
  ASSERT_TRUE(got.has_value()) << got.error().message;
  EXPECT_EQ(got->id(), kTestBase + 21);
  leftover.Kill();
  in_use = sandbox::HostIdInUse(used);
  ASSERT_TRUE(in_use.has_value());
  EXPECT_FALSE(*in_use);
}

TEST_F(HostIdTest, AnIdAnAccountNamesIsSkipped) {
  // Base 0: pick 0 is root's uid and gid.
  HostIdPool pool = Pool({0, 0, 54321});
  pool.base = 0;
  ASSERT_EQ(getpwuid(54321), nullptr) << "this host has an account 54321";
  auto got = ReserveHostId(pool);
  ASSERT_TRUE(got.has_value()) << got.error().message;
  EXPECT_EQ(got->id(), 54321u);
}

TEST_F(HostIdTest, WhenEveryPickIsTakenItSaysSo) {
  auto held = ReserveHostId(Pool({30}));
  ASSERT_TRUE(held.has_value());
  auto r = ReserveHostId(Pool({30}, 4));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EAGAIN);
  EXPECT_THAT(r.error().message, HasSubstr("after 4 picks (4 held by live"));
}

TEST_F(HostIdTest, AnUnsafeLockDirectoryIsRefused) {
  ASSERT_EQ(mkdir(locks_.c_str(), 0777), 0);
  ASSERT_EQ(chmod(locks_.c_str(), 0777), 0);
  auto r = ReserveHostId(Pool({40}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EACCES);
  EXPECT_THAT(r.error().message, HasSubstr("must be owned by root"));
  ASSERT_EQ(chmod(locks_.c_str(), 0700), 0);
  ASSERT_EQ(chown(locks_.c_str(), 4242, 4242), 0);
  r = ReserveHostId(Pool({40}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EACCES);
  ASSERT_EQ(rmdir(locks_.c_str()), 0);
  // A symlink planted in its place is not followed.
  std::string real = dir_->Sub("elsewhere");
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(symlink(real.c_str(), locks_.c_str()), 0);
  r = ReserveHostId(Pool({40}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ENOTDIR);
  EXPECT_EQ(access((real + "/" + std::to_string(kTestBase + 40)).c_str(), F_OK),
            -1);
}

// A session's sandbox runs under the id it reserved, holds it while it
// lives and gives it back when it ends.
TEST_F(SandboxTest, TheSessionHoldsItsHostIdUntilItEnds) {
  if (geteuid() != 0) GTEST_SKIP() << "as root only";
  MakeSandbox(TestLimits());
  ASSERT_EQ(Sh("true").exit_code, 0);
  const uint32_t id = sandbox_->host_uid();
  EXPECT_EQ(sandbox_->host_gid(), id);
  std::string lock =
      std::string(sandbox::kHostIdLockDir) + "/" + std::to_string(id);
  int fd = open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << lock;
  EXPECT_EQ(flock(fd, LOCK_EX | LOCK_NB), -1);
  EXPECT_EQ(errno, EWOULDBLOCK);
  sandbox_->Close();
  EXPECT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  EXPECT_NE(access(lock.c_str(), F_OK), 0) << lock << " is left behind";
  close(fd);
  auto in_use = sandbox::HostIdInUse(id);
  ASSERT_TRUE(in_use.has_value());
  EXPECT_FALSE(*in_use);
}

}  // namespace
}  // namespace agentvfs::testing
