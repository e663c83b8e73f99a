// `agentvfs exec` and `agentvfs shell` as a person uses them: the real
// binary, a real store and, for the shell, a real terminal (a pty).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::e2e {
namespace {

using testing::CommandOptions;
using ::testing::HasSubstr;
using testing::RunCommand;

class SandboxCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = testing::StoreFixture::Create({"dev"});
    ASSERT_TRUE(store.has_value()) << store.error().message;
    store_ = std::move(*store);
    ws_ = std::make_unique<testing::TempDir>("agentvfs-exec-ws");
    state_ = std::make_unique<testing::TempDir>("agentvfs-exec-state");
    // Searchable by the sandbox's uid, as /tmp or /run/user/UID are.
    chmod(state_->path().c_str(), 0711);
  }
  std::vector<std::string> Args(const std::string& cmd) {
    return {AGENTVFS_BINARY, cmd,
            "--workspace",   ws_->path(),
            "--store",       store_->db(),
            "--token-file",  store_->TokenFile("dev")};
  }
  testing::CommandResult Exec(std::vector<std::string> command,
                              std::vector<std::string> flags = {}) {
    auto argv = Args("exec");
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("--");
    argv.insert(argv.end(), command.begin(), command.end());
    // Session directories go to a directory of this test's own.
    return RunCommand(
        argv, CommandOptions{.env = {{"XDG_RUNTIME_DIR", state_->path()}}});
  }
  size_t SessionDirs() {
    size_t n = 0;
    auto names = testing::ListDir(state_->path());
    for (const auto& e : names.value_or(std::vector<std::string>{}))
      if (e.rfind("agentvfs-sandbox-", 0) == 0) ++n;
    return n;
  }
  std::unique_ptr<testing::StoreFixture> store_;
  std::unique_ptr<testing::TempDir> ws_;
  std::unique_ptr<testing::TempDir> state_;
};

TEST_F(SandboxCliTest, ExecPassesOutputAndExitCodeAndLeavesNothing) {
  // While a command runs, its session directory is in $XDG_RUNTIME_DIR
  // (so counting there afterwards means something).
  auto argv = Args("exec");
  argv.insert(argv.end(), {"--", "sleep", "2"});
  argv.insert(
      argv.begin(),
      {"sh", "-c", "\"$@\" & sleep 1; ls \"$XDG_RUNTIME_DIR\"; wait", "sh"});
  auto during = RunCommand(
      argv, CommandOptions{.env = {{"XDG_RUNTIME_DIR", state_->path()}}});
  EXPECT_THAT(during.output, HasSubstr("agentvfs-sandbox-"));
  size_t before = SessionDirs();
  EXPECT_EQ(before, 0u);
  auto r = Exec({"sh", "-c",
                 "echo hello > /workspace/h.txt; echo mem > "
                 "/memories/users/dev/m.md; cat /memories/users/dev/m.md; "
                 "exit 3"});
  EXPECT_EQ(r.exit_status, 3) << r.output;
  EXPECT_EQ(r.output, "mem\n");
  EXPECT_EQ(testing::ReadFile(ws_->Sub("h.txt")), "hello\n");
  EXPECT_EQ(SessionDirs(), before);
}

// Output past --output-cap is cut in the middle, with a note in the
// output; a redirect into a file hides that, so the cut is also said on
// stderr and a command that exited 0 exits 1.
TEST_F(SandboxCliTest, OutputCutByTheCapIsSaidAndFails) {
  auto r = Exec({"sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a"},
                {"--output-cap", "4K"});
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.output, HasSubstr("bytes of stdout were cut out (--output-cap "
                                  "4096 bytes each)"));
  auto fits = Exec({"sh", "-c", "echo small"}, {"--output-cap", "4K"});
  EXPECT_EQ(fits.exit_status, 0) << fits.output;
  EXPECT_EQ(fits.output, "small\n");
}

// Each --env takes one NAME=VALUE, wherever it stands: the command after
// `--` keeps its own options (CLI11 let the list run on, and `-c` was
// refused as an unexpected argument).
TEST_F(SandboxCliTest, EnvTakesOneValueAndLeavesTheCommandItsOptions) {
  auto r = Exec({"sh", "-c", "echo \"$A,$B\""},
                {"--env", "A=1", "--env=B=two words"});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_EQ(r.output, "1,two words\n");
}

TEST_F(SandboxCliTest, ExecReportsTimeoutsSignalsAndBadInput) {
  auto t = Exec({"sleep", "30"}, {"--timeout", "0.5"});
  EXPECT_EQ(t.exit_status, 124);
  EXPECT_THAT(t.output, HasSubstr("timed out after"));
  auto s = Exec({"sh", "-c", "kill -KILL $$"});
  EXPECT_EQ(s.exit_status, 128 + 9);
  EXPECT_THAT(s.output, HasSubstr("SIGKILL"));
  auto missing = Exec({"no-such-command"});
  EXPECT_EQ(missing.exit_status, 2);
  EXPECT_THAT(missing.output, HasSubstr("command not found: no-such-command"));
  auto bad = Exec({"true"}, {"--memory", "lots"});
  EXPECT_EQ(bad.exit_status, 2);
  EXPECT_THAT(bad.output, HasSubstr("not a size"));
  // 0 is no limit a person means: it let a command take all the memory.
  for (std::vector<std::string> zero :
       {std::vector<std::string>{"--memory", "0"},
        {"--output-cap", "0"},
        {"--output-cap", "2G"},
        {"--processes", "0"}}) {
    auto z = Exec({"true"}, zero);
    EXPECT_EQ(z.exit_status, 2) << zero[0] << " " << zero[1];
    EXPECT_THAT(z.output, HasSubstr(zero[0])) << z.output;
  }
  auto nodir = Exec({"true"}, {"--cwd", "/workspace/no-such-dir"});
  EXPECT_NE(nodir.exit_status, 0);
  EXPECT_THAT(nodir.output, HasSubstr("cannot change to directory "
                                      "/workspace/no-such-dir: No such file"));
  auto outside = Exec({"true"}, {"--cwd", "/etc"});
  EXPECT_EQ(outside.exit_status, 2);
  EXPECT_THAT(outside.output, HasSubstr("outside the view"));
  auto nan = Exec({"true"}, {"--timeout", "nan"});
  EXPECT_EQ(nan.exit_status, 2);
  EXPECT_THAT(nan.output, HasSubstr("want a number of seconds"));
  // A file that exists but does not run says why, not "not found".
  std::ofstream(ws_->Sub("noexec.sh")) << "echo hi\n";
  std::ofstream(ws_->Sub("nointerp.sh")) << "#!/no/such/interpreter\necho\n";
  chmod(ws_->Sub("nointerp.sh").c_str(), 0755);
  auto noexec = Exec({"/workspace/noexec.sh"});
  EXPECT_NE(noexec.exit_status, 0);
  EXPECT_THAT(noexec.output, HasSubstr("permission denied (is it executable?"));
  auto nointerp = Exec({"/workspace/nointerp.sh"});
  EXPECT_NE(nointerp.exit_status, 0);
  EXPECT_THAT(nointerp.output, HasSubstr("its interpreter (the #! line)"));
  EXPECT_THAT(nointerp.output, ::testing::Not(HasSubstr("command not found")));
  // --stdin is bounded: endless input is an error, not unbounded memory.
  auto argv = Args("exec");
  std::string cmdline = "head -c 70000000 /dev/zero | \"$@\" --stdin -- true";
  argv.insert(argv.begin(), {"sh", "-c", cmdline, "sh"});
  auto big = RunCommand(
      argv, CommandOptions{.env = {{"XDG_RUNTIME_DIR", state_->path()}}});
  EXPECT_NE(big.exit_status, 0);
  EXPECT_THAT(big.output, HasSubstr("--stdin takes at most 64 MiB"));
}

// SIGTERM, SIGHUP or SIGINT to exec with a store: the command is stopped
// and nothing of the session is left (before, the store's thread took the
// signal and the process died with its mounts and directory in place).
TEST_F(SandboxCliTest, AStoppedExecWithAStoreLeavesNothing) {
  for (int sig : {SIGTERM, SIGHUP, SIGINT}) {
    SCOPED_TRACE(strsignal(sig));
    auto argv = Args("exec");
    argv.insert(argv.end(), {"--timeout", "30", "--", "sh", "-c",
                             "echo up > /workspace/up; sleep 30"});
    unlink(ws_->Sub("up").c_str());
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      setenv("XDG_RUNTIME_DIR", state_->path().c_str(), 1);
      int null = open("/dev/null", O_RDWR);
      dup2(null, 0);
      dup2(null, 1);
      dup2(null, 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    for (int i = 0; i < 500 && !testing::ReadFile(ws_->Sub("up")); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    bool up = testing::ReadFile(ws_->Sub("up")).has_value();
    kill(child, sig);
    int status = 0;
    int waited = 0;
    for (int i = 0; i < 750 && waited == 0; ++i) {
      waited = waitpid(child, &status, WNOHANG);
      if (waited == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (waited == 0) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      ADD_FAILURE() << "exec did not stop";
      continue;
    }
    EXPECT_TRUE(up);
    ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig);
    EXPECT_EQ(SessionDirs(), 0u);
    auto mounts = testing::ReadFile("/proc/self/mountinfo").value_or("");
    EXPECT_EQ(mounts.find(state_->path()), std::string::npos) << mounts;
  }
}

// The sandbox never sees the store, the token or a config file that may
// hold an API key: a workspace (or bind) holding one is refused before
// anything runs.
TEST_F(SandboxCliTest, AWorkspaceHoldingTheStoreTheTokenOrTheConfigIsRefused) {
  const std::string db_dir =
      std::filesystem::path(store_->db()).parent_path().string();
  const std::string token_in_ws = ws_->Sub("token");
  std::filesystem::copy_file(store_->TokenFile("dev"), token_in_ws);
  const std::string config_in_ws = ws_->Sub("config.yaml");
  { std::ofstream(config_in_ws) << "api_key: sk-test\n"; }
  struct Case {
    std::string what;
    std::vector<std::string> argv;
    std::map<std::string, std::string> env;
  };
  const std::vector<Case> cases = {
      {"store",
       {AGENTVFS_BINARY, "exec", "--workspace", db_dir, "--store", store_->db(),
        "--token-file", store_->TokenFile("dev")},
       {}},
      {"token",
       {AGENTVFS_BINARY, "exec", "--workspace", ws_->path(), "--store",
        store_->db(), "--token-file", token_in_ws},
       {}},
      {"config",
       {AGENTVFS_BINARY, "exec", "--workspace", ws_->path(), "--store",
        store_->db(), "--token-file", store_->TokenFile("dev")},
       {{"AGENTVFS_CONFIG", config_in_ws}}},
  };
  for (const auto& c : cases) {
    auto argv = c.argv;
    argv.insert(argv.end(), {"--", "touch", "/workspace/ran"});
    auto env = c.env;
    env["XDG_RUNTIME_DIR"] = state_->path();
    auto r = RunCommand(argv, CommandOptions{.env = env});
    EXPECT_NE(r.exit_status, 0) << c.what;
    EXPECT_THAT(r.output, HasSubstr("where the sandbox could read it"))
        << c.what;
    struct stat st;
    EXPECT_NE(stat(ws_->Sub("ran").c_str(), &st), 0) << c.what;
    EXPECT_NE(stat((db_dir + "/ran").c_str(), &st), 0) << c.what;
  }
  EXPECT_EQ(SessionDirs(), 0u);
}

TEST_F(SandboxCliTest, AWrongTokenRunsNothing) {
  std::string bad = ws_->Sub("bad.token");
  std::ofstream(bad) << "avfs_0000";
  auto argv = Args("exec");
  argv[argv.size() - 1] = bad;
  argv.insert(argv.end(), {"--", "sh", "-c", "touch /workspace/ran"});
  auto r = RunCommand(argv);
  EXPECT_NE(r.exit_status, 0);
  EXPECT_THAT(r.output, HasSubstr("token is not valid"));
  EXPECT_FALSE(testing::ReadFile(ws_->Sub("ran")).has_value());
}

TEST_F(SandboxCliTest, ShellGivesAPersonATerminalInsideTheSandbox) {
  int master;
  auto argv = Args("shell");
  argv.insert(argv.end(), {"--", "/bin/sh"});
  pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    setenv("TERM", "xterm", 1);
    execv(a[0], a.data());
    _exit(127);
  }
  std::string script =
      "tty; id -un; echo typed > /workspace/from-shell; "
      "ls /memories/users; exit 5\n";
  ASSERT_EQ(write(master, script.data(), script.size()),
            static_cast<ssize_t>(script.size()));
  std::string seen;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{master, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[4096];
      ssize_t n = read(master, buf, sizeof(buf));
      if (n > 0) seen.append(buf, n);
    }
    if (waitpid(pid, &status, WNOHANG) == pid) break;
  }
  close(master);
  if (!WIFEXITED(status)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the shell did not end; it showed:\n" << seen;
  }
  EXPECT_EQ(WEXITSTATUS(status), 5) << seen;
  EXPECT_THAT(seen, HasSubstr("/dev/pts/"));  // a terminal of its own
  EXPECT_THAT(seen, HasSubstr("agent"));
  EXPECT_THAT(seen, HasSubstr("\ndev\r"));  // ls /memories/users
  EXPECT_EQ(testing::ReadFile(ws_->Sub("from-shell")), "typed\n");
}

TEST_F(SandboxCliTest, ShellRefusesWithoutATerminal) {
  auto argv = Args("shell");
  auto r = RunCommand(argv);
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_THAT(r.output, HasSubstr("needs a terminal"));
}

}  // namespace
}  // namespace agentvfs::e2e
