// No secret the harness holds (the store's database, the token file, the
// config file) is reachable from what the sandbox sees: not under the
// workspace by path, not through a bind mount in it or of it, not through
// another hard link. Each refused case is followed by the same options
// succeeding once the mount or the link is gone, so none passes vacuously.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "backends/sandbox/sandbox.h"
#include "backends/store/engine.h"
#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/result_matchers.h"

namespace agentvfs::testing {
namespace {

using ::testing::HasSubstr;

// A bind mount that is undone however the test ends.
class BindMount {
 public:
  BindMount(const std::string& from, const std::string& to) : to_(to) {
    ok_ = mount(from.c_str(), to.c_str(), nullptr, MS_BIND, nullptr) == 0;
  }
  ~BindMount() { Undo(); }
  bool ok() const { return ok_; }
  void Undo() {
    if (ok_) umount2(to_.c_str(), MNT_DETACH);
    ok_ = false;
  }

 private:
  std::string to_;
  bool ok_ = false;
};

class SandboxSecretsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "bind mounts need root";
    // The sandbox's uid passes through to its session directory.
    ASSERT_EQ(chmod(dir_.path().c_str(), 0711), 0);
    for (const auto& d : {"secrets", "ws", "ws/sub", "state", "elsewhere"})
      ASSERT_EQ(mkdir(dir_.Sub(d).c_str(), 0755), 0) << d;
    std::ofstream(db_) << "not really a database\n";
  }

  // Sandbox::Create with the workspace `ws` and the database as the secret.
  vfs::Result<std::unique_ptr<sandbox::Sandbox>> Create(const std::string& ws) {
    sandbox::SandboxOptions o;
    o.workspace = ws;
    o.state_dir = dir_.Sub("state");
    o.secret_paths = {db_};
    auto sb = sandbox::Sandbox::Create(o);
    if (sb) (*sb)->Close();
    return sb;
  }

  TempDir dir_{"agentvfs-secrets-test"};
  std::string db_ = dir_.Sub("secrets/store.db");
};

// A PostgreSQL store has no file of its own to hide, but the server's
// socket directory (often its data directory; with trust or peer
// authentication the socket alone lets a client in) and libpq's password
// file reach it past every grant: a workspace holding either is refused.
TEST_F(SandboxSecretsTest, APostgresStoresSocketAndPasswordFileAreSecrets) {
  ASSERT_EQ(mkdir(dir_.Sub("ws/pg").c_str(), 0700), 0);
  std::ofstream(dir_.Sub("ws/pgpass")) << "*:*:*:*:secret\n";
  auto create = [&](const std::vector<std::string>& secrets) {
    sandbox::SandboxOptions o;
    o.workspace = dir_.Sub("ws");
    o.state_dir = dir_.Sub("state");
    o.secret_paths = secrets;
    auto sb = sandbox::Sandbox::Create(o);
    if (sb) (*sb)->Close();
    return sb;
  };
  const char* old = std::getenv("PGPASSFILE");
  const std::string saved = old ? old : "";
  unsetenv("PGPASSFILE");
  auto socket_in_ws = store::SecretPathsOf(
      "postgresql:///db?host=" + dir_.Sub("ws/pg") + "&user=u");
  EXPECT_THAT(socket_in_ws, ::testing::Contains(dir_.Sub("ws/pg")));
  auto refused = create(socket_in_ws);
  ASSERT_ERRNO(refused, EINVAL);
  EXPECT_THAT(refused.error().message, HasSubstr(dir_.Sub("ws/pg")));

  setenv("PGPASSFILE", dir_.Sub("ws/pgpass").c_str(), 1);
  auto pass_in_ws = store::SecretPathsOf(
      "postgresql:///db?host=" + dir_.Sub("elsewhere") + "&user=u");
  refused = create(pass_in_ws);
  ASSERT_ERRNO(refused, EINVAL);
  EXPECT_THAT(refused.error().message, HasSubstr(dir_.Sub("ws/pgpass")));
  // A passfile the URI names counts too.
  unsetenv("PGPASSFILE");
  refused = create(
      store::SecretPathsOf("postgresql:///db?host=" + dir_.Sub("elsewhere") +
                           "&passfile=" + dir_.Sub("ws/pgpass")));
  ASSERT_ERRNO(refused, EINVAL);

  // Neither in the workspace: allowed.
  EXPECT_OK(create(store::SecretPathsOf(
      "postgresql:///db?host=" + dir_.Sub("elsewhere") + "&user=u")));
  if (old) setenv("PGPASSFILE", saved.c_str(), 1);
}

TEST_F(SandboxSecretsTest, ABindMountInTheWorkspaceShowingTheStoreIsRefused) {
  BindMount bind(dir_.Sub("secrets"), dir_.Sub("ws/sub"));
  ASSERT_TRUE(bind.ok());
  auto refused = Create(dir_.Sub("ws"));
  ASSERT_ERRNO(refused, EINVAL);
  EXPECT_THAT(refused.error().message, HasSubstr(dir_.Sub("ws/sub")));
  EXPECT_THAT(refused.error().message, HasSubstr("bind mount"));
  bind.Undo();
  EXPECT_OK(Create(dir_.Sub("ws")));
}

TEST_F(SandboxSecretsTest,
       AWorkspaceThatIsABindOfADirectoryAboveTheStoreIsRefused) {
  BindMount bind(dir_.path(), dir_.Sub("ws/sub"));
  ASSERT_TRUE(bind.ok());
  // The workspace is the mount point itself: by path it holds nothing of
  // the store, but it shows the directory above it.
  auto refused = Create(dir_.Sub("ws/sub"));
  ASSERT_ERRNO(refused, EINVAL);
  EXPECT_THAT(refused.error().message, HasSubstr("bind mount"));
  bind.Undo();
  EXPECT_OK(Create(dir_.Sub("ws/sub")));
}

TEST_F(SandboxSecretsTest,
       ABindOfAnotherDirectoryOfTheSameFilesystemIsAllowed) {
  std::ofstream(dir_.Sub("elsewhere/input.csv")) << "a,b\n";
  BindMount bind(dir_.Sub("elsewhere"), dir_.Sub("ws/sub"));
  ASSERT_TRUE(bind.ok());
  EXPECT_OK(Create(dir_.Sub("ws")));
  // The sandbox sees what is mounted there, and writes land in it (the
  // idmapped bind of the workspace once showed the directory under it).
  sandbox::SandboxOptions o;
  o.workspace = dir_.Sub("ws");
  o.state_dir = dir_.Sub("state");
  o.secret_paths = {db_};
  ASSERT_OK_AND_ASSIGN(auto sb, sandbox::Sandbox::Create(o));
  sandbox::Command c;
  c.argv = {"sh", "-c",
            "cat /workspace/sub/input.csv && echo out > "
            "/workspace/sub/output.csv"};
  auto r = sb->Run(c);
  sb->Close();
  ASSERT_OK(r);
  EXPECT_EQ(r->exit_code, 0) << r->err.text;
  EXPECT_EQ(r->out.text, "a,b\n");
  EXPECT_EQ(ReadFile(dir_.Sub("elsewhere/output.csv")), "out\n");
}

TEST_F(SandboxSecretsTest, AStoreWithAnotherHardLinkIsRefused) {
  const std::string link = dir_.Sub("ws/store-link.db");
  ASSERT_EQ(::link(db_.c_str(), link.c_str()), 0);
  auto refused = Create(dir_.Sub("ws"));
  ASSERT_ERRNO(refused, EINVAL);
  EXPECT_THAT(refused.error().message, HasSubstr("2 hard links"));
  ASSERT_EQ(unlink(link.c_str()), 0);
  EXPECT_OK(Create(dir_.Sub("ws")));
}

// The root, system directories and home directories are never a workspace,
// named directly or through a link (one an earlier run may have planted in
// a workspace it could write): the agent could change everything in them.
TEST_F(SandboxSecretsTest, ASystemOrHomeDirectoryIsNoWorkspace) {
  ASSERT_EQ(symlink("/root", dir_.Sub("ws/project").c_str()), 0);
  for (const std::string& ws :
       {std::string("/"), std::string("/etc"), std::string("/etc/ssl"),
        std::string("/usr/share"), std::string("/home"), std::string("/root"),
        std::string("/tmp"), dir_.Sub("ws/project")}) {
    auto sb = Create(ws);
    ASSERT_FALSE(sb.has_value()) << ws;
    EXPECT_EQ(sb.error().code, EINVAL);
    EXPECT_THAT(sb.error().message, HasSubstr("the agent could change "
                                              "everything in it"))
        << ws;
  }
  EXPECT_OK(Create(dir_.Sub("ws")));
}

// Below a home, its settings and programs are no workspace either (a link
// planted as `project -> /home/alice/.ssh` let the agent add a key), nor
// are state, logs and runtime files of the system; /var/tmp is fine.
TEST_F(SandboxSecretsTest, SettingsAndSystemStateAreNoWorkspace) {
  const passwd* me = getpwuid(geteuid());
  ASSERT_NE(me, nullptr);
  std::string hidden = std::string(me->pw_dir) + "/.agentvfs-ws-XXXXXX";
  ASSERT_NE(mkdtemp(hidden.data()), nullptr) << me->pw_dir;
  ASSERT_EQ(mkdir((hidden + "/sub").c_str(), 0755), 0);
  for (const std::string& ws :
       {hidden, hidden + "/sub", std::string("/run"), std::string("/var/log"),
        std::string("/var/lib"), std::string("/var/cache/apt"),
        std::string("/var")}) {
    auto sb = Create(ws);
    ASSERT_FALSE(sb.has_value()) << ws;
    EXPECT_EQ(sb.error().code, EINVAL);
    EXPECT_THAT(sb.error().message, HasSubstr("the agent could change "
                                              "everything in it"))
        << ws;
  }
  EXPECT_THAT(Create(hidden + "/sub").error().message,
              HasSubstr("where the programs or settings of"));
  rmdir((hidden + "/sub").c_str());
  rmdir(hidden.c_str());
  // Work elsewhere in /var is fine (/var/www, Silverblue's /var/home).
  char tmp[] = "/var/tmp/agentvfs-ws-XXXXXX";
  ASSERT_NE(mkdtemp(tmp), nullptr);
  EXPECT_OK(Create(tmp));
  rmdir(tmp);
  char www[] = "/var/agentvfs-ws-XXXXXX";
  ASSERT_NE(mkdtemp(www), nullptr);
  EXPECT_OK(Create(www));
  rmdir(www);
}

// A workspace named through a symlink is refused, saying which directory
// to name instead: an earlier session's agent could have planted the link.
// Links in / itself (merged /usr, /home on another disk) are followed.
TEST_F(SandboxSecretsTest, AWorkspaceNamedThroughALinkIsRefused) {
  ASSERT_EQ(
      symlink(dir_.Sub("elsewhere").c_str(), dir_.Sub("ws/project").c_str()),
      0);
  auto sb = Create(dir_.Sub("ws/project"));
  ASSERT_FALSE(sb.has_value());
  EXPECT_EQ(sb.error().code, EINVAL);
  EXPECT_THAT(sb.error().message,
              HasSubstr("goes through the symlink " + dir_.Sub("ws/project") +
                        " (to " + dir_.Sub("elsewhere") + ")"));
  EXPECT_THAT(sb.error().message,
              HasSubstr("--workspace " + dir_.Sub("elsewhere")));
  // The hint names the directory the path leads to, not the link's target.
  ASSERT_EQ(mkdir(dir_.Sub("elsewhere/inner").c_str(), 0755), 0);
  EXPECT_THAT(Create(dir_.Sub("ws/project/inner")).error().message,
              HasSubstr("--workspace " + dir_.Sub("elsewhere/inner")));
  // Also as a relative path with a link on the way.
  char cwd[PATH_MAX];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(chdir(dir_.Sub("ws").c_str()), 0);
  auto rel = Create("project/inner/..");
  ASSERT_EQ(chdir(cwd), 0);
  ASSERT_FALSE(rel.has_value());
  EXPECT_THAT(rel.error().message, HasSubstr("goes through the symlink"));
  EXPECT_OK(Create(dir_.Sub("elsewhere")));
  EXPECT_OK(Create(dir_.Sub("ws/../elsewhere")));
}

}  // namespace
}  // namespace agentvfs::testing
