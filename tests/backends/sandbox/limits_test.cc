// Limits: the wall-clock timeout takes every process of the sandbox with it,
// however it was forked; CPU, memory, process count and file size are capped
// as configured. Each limit is also shown not to bite below it.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/backends/sandbox/sandbox_fixture.h"

namespace agentvfs::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

TEST_F(SandboxTest, TheTimeoutKillsEveryProcessIncludingDoubleForkedOnes) {
  std::string m = Marker();
  ASSERT_EQ(Sh("echo kept > /workspace/kept.txt").exit_code, 0);
  sandbox::Limits l = TestLimits();
  l.timeout_s = 1.5;
  // A background child, a double-forked daemon in its own session, a
  // process that ignores SIGTERM and SIGHUP, and the foreground waiting.
  auto start = std::chrono::steady_clock::now();
  // Watches the processes while the command runs: they must exist (else the
  // test proves nothing) before the timeout takes them.
  std::atomic<size_t> most{0};
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done) {
      most = std::max(most.load(), ProcessesWith(m).size());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto r = Sh("sh -c 'sleep 1000; true " + m + "-bg' & " +
                  "(setsid sh -c 'sleep 1000; true " + m + "-daemon' &) ; " +
                  "sh -c 'trap \"\" TERM HUP; sleep 1000; true " + m +
                  "-stubborn' & " + "echo started; sleep 1000; true " + m,
              l);
  done = true;
  watcher.join();
  EXPECT_GE(most.load(), 4u);  // background, daemon, stubborn, foreground
  double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_EQ(r.out.text, "started\n");
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 10.0);
  EXPECT_THAT(r.Describe(), HasSubstr("timed out"));
  EXPECT_TRUE(ProcessesWith(m).empty());
  // The next command gets a fresh sandbox; the workspace is still there.
  auto next = Sh("cat /workspace/kept.txt");
  EXPECT_TRUE(next.fresh_sandbox);
  EXPECT_EQ(next.out.text, "kept\n");
}

TEST_F(SandboxTest, BackgroundProcessesOutliveTheirCommandWithinTheSandbox) {
  // A command may leave a server running for the next one; it lives as long
  // as the sandbox.
  std::string m = Marker();
  auto r =
      Sh("(sh -c 'sleep 1000; true " + m + "' > /dev/null 2>&1 &); echo ok");
  EXPECT_EQ(r.out.text, "ok\n");
  EXPECT_EQ(SettledCount(m), 1u);
  sandbox_->Kill();
  for (int i = 0; i < 100 && !ProcessesWith(m).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(ProcessesWith(m).empty());
}

TEST_F(SandboxTest, TheCpuLimitStopsABusyLoop) {
  sandbox::Limits l = TestLimits();
  l.cpu_s = 1;
  auto r = Sh("exec sh -c 'while :; do :; done'", l);
  EXPECT_FALSE(r.timed_out);
  EXPECT_THAT(r.signal, AnyOf(SIGXCPU, SIGKILL)) << r.Describe();
  EXPECT_LT(r.seconds, 10.0);
  // Under the limit the same kind of work finishes.
  auto fine = Sh("i=0; while [ $i -lt 1000 ]; do i=$((i+1)); done; echo $i", l);
  EXPECT_EQ(fine.out.text, "1000\n");
}

TEST_F(SandboxTest, TheMemoryLimitStopsAnAllocation) {
  sandbox::Limits l = TestLimits();
  l.memory = 256ull << 20;
  auto r = Sh("python3 -c 'x = bytearray(600 << 20); print(len(x))'", l);
  EXPECT_NE(r.exit_code, 0) << r.out.text;
  EXPECT_THAT(r.out.text, ::testing::Not(HasSubstr("629145600")));
  EXPECT_THAT(r.err.text, AnyOf(HasSubstr("MemoryError"),
                                HasSubstr("memory limit reached")))
      << r.Describe();
  auto fine = Sh("python3 -c 'x = bytearray(64 << 20); print(len(x))'", l);
  EXPECT_EQ(fine.out.text, "67108864\n") << fine.err.text;
}

TEST_F(SandboxTest, TheMemoryLimitCoversTheWholeSandbox) {
  // Three processes, each under the per-process limit, together over it:
  // the sandbox's memory cgroup stops them.
  sandbox::Limits l = TestLimits();
  l.memory = 256ull << 20;
  MakeSandbox(l);
  ASSERT_TRUE(sandbox_->Start().has_value());
  ASSERT_TRUE(sandbox_->has_memory_cgroup());
  auto r = Sh(
      "for i in 1 2 3; do python3 -c 'import time; x = bytearray(150 << 20); "
      "time.sleep(3); print(\"kept\")' & done; wait",
      l);
  EXPECT_THAT(r.err.text, HasSubstr("memory limit reached")) << r.out.text;
  EXPECT_NE(r.out.text, "kept\nkept\nkept\n");
}

TEST_F(SandboxTest, TheProcessLimitStopsAForkBomb) {
  auto processes = [this](uint64_t limit) {
    sandbox::Limits l = TestLimits();
    l.processes = limit;
    Sh("for i in $(seq 60); do sleep 30 & done 2>/dev/null; echo done", l);
    // The sleeps that started are still running (a child forked but not yet
    // exec'd is still named sh). The next command counts the processes with
    // a glob its shell expands itself: a pipeline's members need not all
    // exist yet when one of them lists /proc.
    sandbox::Limits room = TestLimits();
    room.processes = 1000;
    auto count = Sh("set -- /proc/[0-9]*; echo $#", room);
    sandbox_->Kill();
    return std::stoi(count.out.text);
  };
  // The count is the survivors plus the counting shell (and the sandbox's
  // init, if it has one).
  EXPECT_LE(processes(24), 24 + 1);
  EXPECT_GE(processes(200), 60 + 1);
}

TEST_F(SandboxTest, TheFileSizeLimitStopsAGrowingFile) {
  sandbox::Limits l = TestLimits();
  l.file_size = 1 << 20;
  auto r = Sh("head -c 3000000 /dev/zero > /workspace/big", l);
  EXPECT_NE(r.exit_code, 0);
  struct stat st;
  ASSERT_EQ(stat((workspace_ + "/big").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
  auto fine = Sh("head -c 1000000 /dev/zero > /workspace/small", l);
  EXPECT_EQ(fine.exit_code, 0);
}

}  // namespace
}  // namespace agentvfs::testing

namespace agentvfs::testing {
namespace {

TEST_F(SandboxTest, AnOutputFloodCannotHoldOffTheTimeout) {
  sandbox::Limits l = TestLimits();
  l.timeout_s = 1;
  l.output_cap = 4096;
  auto r = Sh("yes flood", l);
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_GT(r.out.total, 4096u);
  EXPECT_LE(r.out.text.size(), 4096u + 200u);  // what was kept, and the note
  // A command that exits while a child it left floods its stdout returns
  // at once with what was written up to then.
  auto left = Sh("(yes left-behind &); echo done", l);
  EXPECT_FALSE(left.timed_out);
  EXPECT_EQ(left.exit_code, 0);
  EXPECT_LT(left.seconds, 1.0);
  sandbox_->Kill();
}

}  // namespace
}  // namespace agentvfs::testing
