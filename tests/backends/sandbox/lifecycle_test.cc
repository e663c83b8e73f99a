// Lifecycle: one view per session; a sandbox that dies (or is killed) is
// replaced by the next command with the workspace intact; a view that goes
// away is mounted again; the end of a session leaves no process, mount,
// cgroup or directory behind.
#include <dirent.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "tests/backends/sandbox/sandbox_fixture.h"
#include "tests/support/files.h"

namespace agentvfs::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(SandboxTest, OneSandboxServesTheSessionsCommands) {
  auto a = Sh("echo $$ > /tmp/first; stat -c %d /memories");
  auto b = Sh("cat /tmp/first > /dev/null && stat -c %d /memories");
  EXPECT_TRUE(a.fresh_sandbox);
  EXPECT_FALSE(b.fresh_sandbox);
  // Same /tmp (same sandbox), same view.
  EXPECT_EQ(b.exit_code, 0) << b.err.text;
  EXPECT_FALSE(a.out.text.empty());
  EXPECT_EQ(a.out.text, b.out.text);
}

TEST_F(SandboxTest, AKilledSandboxIsReplacedAndTheWorkspaceRemains) {
  ASSERT_EQ(Sh("echo data > /workspace/f.txt").exit_code, 0);
  pid_t init = sandbox_->init_pid();
  ASSERT_GT(init, 0);
  ASSERT_EQ(kill(init, SIGKILL), 0);
  for (int i = 0; i < 100 && kill(init, 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto r = Sh("cat /workspace/f.txt; ls /memories/users");
  EXPECT_TRUE(r.fresh_sandbox);
  EXPECT_EQ(r.exit_code, 0) << r.err.text;
  EXPECT_THAT(r.out.text, HasSubstr("data\n"));
  EXPECT_NE(sandbox_->init_pid(), init);
}

TEST_F(SandboxTest, ASandboxKilledDuringACommandEndsItAndTheNextStartsFresh) {
  MakeSandbox(TestLimits());
  ASSERT_EQ(Sh("true").exit_code, 0);
  std::thread killer([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    sandbox_->Kill();
  });
  auto r = Sh("echo before; sleep 30");
  killer.join();
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out.text, "before\n");
  EXPECT_THAT(r.err.text, HasSubstr("the sandbox was killed"));
  EXPECT_LT(r.seconds, 10.0);
  auto next = Sh("echo after");
  EXPECT_TRUE(next.fresh_sandbox);
  EXPECT_EQ(next.out.text, "after\n");
}

TEST_F(SandboxTest, AViewThatWentAwayIsMountedAgain) {
  ASSERT_EQ(Sh("echo one > /memories/users/alice/a.md").exit_code, 0);
  std::string view = sandbox_->session_dir() + "/view";
  ASSERT_EQ(MountsUnder(view).size(), 1u);
  ASSERT_EQ(umount2(view.c_str(), MNT_DETACH), 0);
  auto r = Sh("cat /memories/users/alice/a.md");
  EXPECT_TRUE(r.fresh_sandbox);
  EXPECT_EQ(r.out.text, "one\n") << r.err.text;
  EXPECT_EQ(MountsUnder(view).size(), 1u);
}

TEST_F(SandboxTest, EndingTheSessionLeavesNothingBehind) {
  std::string m = Marker();
  auto r = Sh("(setsid sh -c 'sleep 1000; true " + m +
              "' > /dev/null 2>&1 &); echo x > /tmp/t; echo started");
  ASSERT_EQ(r.out.text, "started\n");
  ASSERT_EQ(SettledCount(m), 1u);
  std::string dir = sandbox_->session_dir();
  auto cgroups = sandbox_->cgroup_dirs();
  // This machine lets the sandbox have cgroups (so they are checked below).
  EXPECT_TRUE(sandbox_->has_pids_cgroup());
  struct stat st;
  for (const auto& d : cgroups) EXPECT_EQ(stat(d.c_str(), &st), 0) << d;
  sandbox_->Close();
  EXPECT_TRUE(ProcessesWith(m).empty());
  EXPECT_TRUE(MountsUnder(dir).empty());
  EXPECT_NE(stat(dir.c_str(), &st), 0) << dir << " is still there";
  for (const auto& d : cgroups) EXPECT_NE(stat(d.c_str(), &st), 0) << d;
  // And the workspace is the host's: untouched by the end of the session.
  EXPECT_EQ(stat(workspace_.c_str(), &st), 0);
  // A closed session refuses commands.
  sandbox::Command c;
  c.argv = {"true"};
  EXPECT_FALSE(sandbox_->Run(c).has_value());
}

TEST_F(SandboxTest, TheSandboxCanBeStartedAheadOfTheFirstCommand) {
  MakeSandbox(TestLimits());
  ASSERT_TRUE(sandbox_->Start().has_value());
  EXPECT_GT(sandbox_->init_pid(), 0);
  EXPECT_FALSE(Sh("true").fresh_sandbox);
}

}  // namespace
}  // namespace agentvfs::testing

namespace agentvfs::testing {
namespace {

// A harness killed with -9 leaves its view mounted and its session
// directory behind (its sandbox dies with the control socket); the next
// session made in the same place clears them.
TEST_F(SandboxTest, ASessionWhoseProcessDiedIsClearedByTheNext) {
  TempDir state("agentvfs-sweep");
  chmod(state.path().c_str(), 0711);
  std::string m = Marker();
  std::string script = "(setsid sh -c 'sleep 1000; true " + m +
                       "' > /dev/null 2>&1 &); sleep 1000";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("XDG_RUNTIME_DIR", state.path().c_str(), 1);
    execl(AGENTVFS_BINARY, AGENTVFS_BINARY, "exec", "--workspace",
          workspace_.c_str(), "--store", store_->db().c_str(), "--token-file",
          store_->TokenFile("alice").c_str(), "--", "sh", "-c", script.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  // The marker is in the command line of `agentvfs exec` itself too, and
  // of any child it forks before an exec (e.g. the helper that makes the
  // workspace's user namespace): wait for a process of the sandbox, whose
  // command line is the script alone.
  auto in_sandbox = [&] {
    auto pids = ProcessesWith(m);
    return std::count_if(pids.begin(), pids.end(), [&](pid_t p) {
      return ReadHostFile("/proc/" + std::to_string(p) + "/cmdline")
                 .find("--workspace") == std::string::npos;
    });
  };
  for (int i = 0; i < 500 && in_sandbox() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // (Seen twice in a day, not reproduced in 45 runs: bwrap, as the
  // sandbox's uid, could not reach the session's etc. Say what the modes
  // and owners were, should it happen again.)
  auto modes = [&] {
    std::string out;
    std::vector<std::string> paths = {"/tmp", state.path()};
    for (const auto& name :
         ListDir(state.path()).value_or(std::vector<std::string>{})) {
      paths.push_back(state.Sub(name));
      paths.push_back(state.Sub(name) + "/etc");
    }
    for (const auto& p : paths) {
      struct stat st {};
      if (stat(p.c_str(), &st) != 0) continue;
      out += p + ": " + std::to_string(st.st_mode & 07777) + " " +
             std::to_string(st.st_uid) + ":" + std::to_string(st.st_gid) + "\n";
    }
    return out;
  };
  ASSERT_GT(in_sandbox(), 0) << "the sandbox did not start; modes (decimal) "
                                "and owners:\n"
                             << modes();
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status;
  waitpid(child, &status, 0);
  std::string dir;
  for (const auto& name :
       ListDir(state.path()).value_or(std::vector<std::string>{}))
    if (name.rfind("agentvfs-sandbox-", 0) == 0) dir = state.Sub(name);
  ASSERT_FALSE(dir.empty());
  // Its sandbox is gone with it; its mounts are not.
  for (int i = 0; i < 250 && !ProcessesWith(m).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(ProcessesWith(m).empty());
  EXPECT_FALSE(MountsUnder(dir).empty());

  sandbox::SandboxOptions o;
  o.workspace = workspace_;
  o.view = view_.get();
  o.identity = store_->CallerFor("alice", "sweeper");
  o.state_dir = state.path();
  auto next = sandbox::Sandbox::Create(o);
  ASSERT_TRUE(next.has_value()) << next.error().message;
  EXPECT_TRUE(MountsUnder(dir).empty());
  // No process of the dead session is left (bwrap names its directory).
  for (int i = 0; i < 100 && !ProcessesWith(dir + "/").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(ProcessesWith(dir + "/").empty());
  struct stat st;
  EXPECT_NE(stat(dir.c_str(), &st), 0) << dir << " is still there";
  // The workspace was not touched by the removal.
  EXPECT_EQ(stat(workspace_.c_str(), &st), 0);
  (*next)->Close();
}

}  // namespace
}  // namespace agentvfs::testing
