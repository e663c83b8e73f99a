// What a command sees and gets back: namespaces, environment, working
// directory, the view, separate and capped output, exit codes and signals.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "tests/backends/sandbox/sandbox_fixture.h"
#include "tests/support/result_matchers.h"

namespace agentvfs::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string HostNs(const std::string& kind) {
  char buf[128];
  ssize_t n = readlink(("/proc/self/ns/" + kind).c_str(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, n) : "";
}

TEST_F(SandboxTest, EveryNamespaceIsNew) {
  auto r =
      Sh("for n in user mnt pid net ipc uts; do echo \"$n $(readlink "
         "/proc/self/ns/$n)\"; done");
  ASSERT_EQ(r.exit_code, 0) << r.err.text;
  for (const char* kind : {"user", "mnt", "pid", "net", "ipc", "uts"}) {
    std::string host = HostNs(kind);
    ASSERT_FALSE(host.empty());
    EXPECT_THAT(r.out.text, HasSubstr(std::string(kind) + " " + kind + ":"));
    EXPECT_THAT(r.out.text, Not(HasSubstr(host))) << kind;
  }
  auto who = Sh("id -u; id -g; hostname; echo $$");
  EXPECT_EQ(who.out.text.substr(0, 15), "1000\n1000\nsandb");
}

TEST_F(SandboxTest, TheEnvironmentIsClearedAndOnlyWhatIsAskedForIsAdded) {
  setenv("AGENTVFS_TOKEN", "avfs_secret_token_value", 1);
  setenv("ANTHROPIC_API_KEY", "sk-ant-secret", 1);
  setenv("OPENAI_API_KEY", "sk-openai-secret", 1);
  MakeSandbox(TestLimits());
  ASSERT_TRUE(sandbox_->Start().has_value());  // while the secrets are set
  sandbox::Command c;
  c.argv = {"env"};
  c.env = {{"PROJECT", "demo"}};
  auto r = sandbox_->Run(c);
  // The sandbox's first process, read from the host (it is not readable
  // from inside: the init is not dumpable).
  std::string init_env = ReadHostFile(
      "/proc/" + std::to_string(sandbox_->init_pid()) + "/environ");
  unsetenv("AGENTVFS_TOKEN");
  unsetenv("ANTHROPIC_API_KEY");
  unsetenv("OPENAI_API_KEY");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_THAT(r->out.text, HasSubstr("PROJECT=demo\n"));
  EXPECT_THAT(r->out.text, HasSubstr("HOME=/home/agent\n"));
  for (const char* secret :
       {"AGENTVFS", "ANTHROPIC", "OPENAI", "secret", "HOME=/root"})
    EXPECT_THAT(r->out.text, Not(HasSubstr(secret)));
  EXPECT_FALSE(init_env.empty());
  EXPECT_THAT(init_env, Not(HasSubstr("secret")));
  EXPECT_THAT(init_env, Not(HasSubstr("AGENTVFS")));
}

TEST_F(SandboxTest, TheWorkingDirectoryIsTheWorkspaceUnlessAnotherInTheView) {
  MakeSandbox(TestLimits());
  sandbox::Command c;
  c.argv = {"pwd"};
  auto r = sandbox_->Run(c);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->out.text, "/workspace\n");
  c.cwd = "/memories/users/alice/";
  r = sandbox_->Run(c);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->out.text, "/memories/users/alice\n");
  c.cwd = "/skills";
  EXPECT_EQ(sandbox_->Run(c)->out.text, "/skills\n");
  c.cwd = "/etc";
  EXPECT_ERRNO(sandbox_->Run(c), EINVAL);
  c.cwd = "/workspace/../etc";
  EXPECT_ERRNO(sandbox_->Run(c), EINVAL);
  c.cwd = "/workspace/missing";
  EXPECT_ERRNO(sandbox_->Run(c), ENOENT);
}

TEST_F(SandboxTest, TheWorkspaceIsSharedWithTheHostAndTheViewWithTheStore) {
  ASSERT_TRUE(
      static_cast<bool>(std::ofstream(workspace_ + "/in.txt") << "from host"));
  auto r = Sh(
      "cat /workspace/in.txt && echo from-sandbox > /workspace/out.txt && "
      "echo remembered > /memories/users/alice/note.md && ls /memories/users");
  ASSERT_EQ(r.exit_code, 0) << r.err.text;
  EXPECT_THAT(r.out.text, HasSubstr("from host"));
  EXPECT_EQ(ReadHostFile(workspace_ + "/out.txt"), "from-sandbox\n");
  // The commit reached the store: another session reads it through the API.
  auto other = store_->OpenBackend();
  auto st = other->Stat(store_->CallerFor("alice"),
                        *vfs::Path::Parse("/memories/users/alice/note.md"));
  ASSERT_TRUE(st.has_value()) << st.error().message;
  EXPECT_EQ(st->st_size, 11);
  // alice's view lists her own home, not bob's.
  EXPECT_THAT(r.out.text, HasSubstr("alice"));
  EXPECT_THAT(r.out.text, Not(HasSubstr("bob")));
}

TEST_F(SandboxTest, TmpIsPrivateAndLastsAsLongAsTheSandbox) {
  std::string name = Marker();
  auto r = Sh("echo x > /tmp/" + name + " && ls /tmp");
  ASSERT_EQ(r.exit_code, 0) << r.err.text;
  struct stat st;
  EXPECT_NE(stat(("/tmp/" + name).c_str(), &st), 0);
  EXPECT_EQ(Sh("cat /tmp/" + name).out.text, "x\n");
}

TEST_F(SandboxTest, StdoutAndStderrAreSeparateAndTheExitCodeIsReported) {
  auto r = Sh("echo out; echo err >&2; exit 7");
  EXPECT_EQ(r.out.text, "out\n");
  EXPECT_EQ(r.err.text, "err\n");
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.Describe(), "exit 7");
  auto s = Sh("kill -TERM $$; sleep 5");
  EXPECT_EQ(s.signal, SIGTERM);
  EXPECT_EQ(s.exit_code, -1);
  EXPECT_THAT(s.Describe(), HasSubstr("SIGTERM"));
}

TEST_F(SandboxTest, OutputOverTheCapKeepsItsStartAndEndWithANote) {
  sandbox::Limits l = TestLimits();
  l.output_cap = 64 * 1024;
  auto r =
      Sh("echo FIRST; head -c 3000000 /dev/zero | tr '\\0' y; echo; echo LAST; "
         "head -c 100000 /dev/zero | tr '\\0' e >&2",
         l);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.total, 6u + 3000000u + 1u + 5u);
  EXPECT_EQ(r.out.cut, r.out.total - 64 * 1024);
  EXPECT_EQ(r.out.text.substr(0, 6), "FIRST\n");
  EXPECT_EQ(r.out.text.substr(r.out.text.size() - 5), "LAST\n");
  EXPECT_THAT(r.out.text, HasSubstr("[... " + std::to_string(r.out.cut) +
                                    " bytes (2.8 MiB) of stdout cut here"));
  EXPECT_EQ(r.err.total, 100000u);
  EXPECT_EQ(r.err.cut, 100000u - 64 * 1024);
  EXPECT_THAT(r.err.text, HasSubstr("of stderr cut here"));
  // Under the cap nothing is cut or noted.
  auto small = Sh("echo hello");
  EXPECT_EQ(small.out.cut, 0u);
  EXPECT_EQ(small.out.text, "hello\n");
}

TEST_F(SandboxTest, StdinIsFedWhenGivenAndEmptyOtherwise) {
  MakeSandbox(TestLimits());
  sandbox::Command c;
  c.argv = {"wc", "-c"};
  c.stdin_data = std::string(200000, 'z');
  EXPECT_EQ(sandbox_->Run(c)->out.text, "200000\n");
  c.stdin_data.clear();
  EXPECT_EQ(sandbox_->Run(c)->out.text, "0\n");
}

TEST_F(SandboxTest, ACommandThatCannotStartIsAnError) {
  MakeSandbox(TestLimits());
  sandbox::Command c;
  c.argv = {"no-such-program-here"};
  auto r = sandbox_->Run(c);
  ASSERT_ERRNO(r, ENOENT);
  EXPECT_THAT(r.error().message, HasSubstr("no-such-program-here"));
  c.argv = {};
  EXPECT_ERRNO(sandbox_->Run(c), EINVAL);
  c.argv = {"true"};
  c.env = {{"BAD=NAME", "x"}};
  EXPECT_ERRNO(sandbox_->Run(c), EINVAL);
  c.env.clear();
  c.argv = {"sh", "-c", std::string(600 * 1024, 'x')};
  EXPECT_ERRNO(sandbox_->Run(c), EMSGSIZE);
  // The session goes on.
  c.argv = {"true"};
  auto ok = sandbox_->Run(c);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->exit_code, 0);
  EXPECT_FALSE(ok->fresh_sandbox);
}

TEST(SandboxSizes, ParseSize) {
  EXPECT_EQ(*sandbox::ParseSize("512"), 512u);
  EXPECT_EQ(*sandbox::ParseSize("64K"), 65536u);
  EXPECT_EQ(*sandbox::ParseSize("1.5G"), 1610612736u);
  EXPECT_ERRNO(sandbox::ParseSize("lots"), EINVAL);
  EXPECT_ERRNO(sandbox::ParseSize("-1M"), EINVAL);
  EXPECT_ERRNO(sandbox::ParseSize("5X"), EINVAL);
}

}  // namespace
}  // namespace agentvfs::testing
