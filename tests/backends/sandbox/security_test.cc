// Security, from inside the sandbox: every attempt below is a shell snippet
// that exits 0 when the attack worked and 1 when it was stopped; the test
// fails unless it was stopped. The tools each attempt uses are checked to
// exist (a missing tool would make an attempt "fail" for the wrong reason),
// and positive controls show that the same snippets succeed where they
// should, so none of these tests can pass vacuously.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "tests/backends/sandbox/sandbox_fixture.h"
#include "tests/support/result_matchers.h"

namespace agentvfs::testing {
namespace {

using ::testing::HasSubstr;

struct Attempt {
  const char* name;
  // Placeholders: {DB} the store's database, {DBDIR} its directory, {TOKEN}
  // alice's token, {TOKENFILE} a file holding it, {HOSTPID} the test's pid,
  // {PORT} a TCP port listening on the host's 127.0.0.1.
  const char* script;
};

class SecurityTest : public SandboxTest,
                     public ::testing::WithParamInterface<Attempt> {
 protected:
  void SetUp() override {
    SandboxTest::SetUp();
    // bob's private memory, which alice may not see.
    auto bob = store_->CallerFor("bob");
    auto backend = store_->OpenBackend();
    auto f =
        backend->Open(bob, *vfs::Path::Parse("/memories/users/bob/secret.md"),
                      O_CREAT | O_WRONLY, 0644);
    ASSERT_TRUE(f.has_value()) << f.error().message;
    ASSERT_TRUE((*f)->Write("bob's secret\n", 13, 0).has_value());
    ASSERT_TRUE((*f)->Flush().has_value());
    f->reset();
    // A host listener the sandbox must not reach.
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(listen(listener_, 8), 0);
    socklen_t len = sizeof(a);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    // The token is in this process's environment while the sandbox starts.
    setenv("AGENTVFS_TOKEN", store_->token("alice").c_str(), 1);
    MakeSandbox(TestLimits());
    ASSERT_TRUE(sandbox_->Start().has_value());
    unsetenv("AGENTVFS_TOKEN");
  }
  void TearDown() override {
    if (listener_ >= 0) close(listener_);
    SandboxTest::TearDown();
  }
  std::string Expand(std::string s) {
    std::string db = store_->db();
    std::map<std::string, std::string> values = {
        {"{DB}", db},
        {"{DBDIR}", db.substr(0, db.rfind('/'))},
        {"{TOKEN}", store_->token("alice")},
        {"{TOKENFILE}", store_->TokenFile("alice")},
        {"{HOSTPID}", std::to_string(getpid())},
        {"{PORT}", std::to_string(port_)}};
    for (const auto& [k, v] : values) {
      for (size_t at; (at = s.find(k)) != std::string::npos;)
        s.replace(at, k.size(), v);
    }
    return s;
  }
  int listener_ = -1;
  int port_ = 0;
};

// Python one-liners shared by attempts and controls.
#define PY_CONNECT(host, port)                    \
  "python3 -c \"import socket,sys\n"              \
  "try:\n"                                        \
  "  socket.create_connection(('" host "', " port \
  "), timeout=3)\n"                               \
  "except OSError: sys.exit(1)\n\""
#define PY_MOUNT(call)                         \
  "python3 -c \"import ctypes,sys\n"           \
  "libc = ctypes.CDLL(None, use_errno=True)\n" \
  "sys.exit(0 if libc." call " == 0 else 1)\""
#define PY_PTRACE(pid)                         \
  "python3 -c \"import ctypes,sys\n"           \
  "libc = ctypes.CDLL(None, use_errno=True)\n" \
  "sys.exit(0 if libc.ptrace(16, " pid ", 0, 0) == 0 else 1)\""

const Attempt kAttempts[] = {
    {"ReadTheStoreDatabase",
     "cat {DB} > /dev/null 2>&1 || ls {DBDIR} > /dev/null 2>&1 || "
     "ls -l /proc/[0-9]*/fd 2>/dev/null | grep -q '\\.db' || exit 1"},
    {"FindTheTokenInTheEnvironment",
     "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | "
     "grep -q -e '{TOKEN}' -e AGENTVFS || exit 1"},
    {"FindTheTokenInAnyFile",
     "cat {TOKENFILE} > /dev/null 2>&1 || grep -rqs '{TOKEN}' /etc /tmp /home "
     "/workspace /memories /skills /proc/1/cmdline || exit 1"},
    {"ReadShadow",
     "cat /etc/shadow > /dev/null 2>&1 || cat /etc/gshadow > /dev/null 2>&1 || "
     "exit 1"},
    {"ReadMachineWideCredentials",
     "test -e /etc/environment || test -e /etc/gitconfig || "
     "test -e /etc/profile.d || exit 1"},
    {"SeeHostProcesses",
     "test -e /proc/{HOSTPID} || kill -0 {HOSTPID} 2>/dev/null || "
     "test $(ls /proc | grep -c '^[0-9]*$') -gt 10 || "
     "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -q "
     "'sandbox[_]test' || exit 1"},
    {"PtraceAHostProcess", PY_PTRACE("{HOSTPID}") " || exit 1"},
    {"PtraceTheSandboxInit", PY_PTRACE("1") " || exit 1"},
    // The syscalls themselves (mount(8) refuses a non-root uid before
    // asking the kernel).
    {"MountATmpfs",
     PY_MOUNT("mount(b'none', b'/tmp', b'tmpfs', 0, None)") " || exit 1"},
    {"UnmountTheView",
     PY_MOUNT("umount2(b'/memories', 2)") " || " PY_MOUNT(
         "umount2(b'/skills', 0)") " || " PY_MOUNT("umount2(b'/workspace', "
                                                   "2)") " || exit 1"},
    {"RemountTheSystemWritable",
     PY_MOUNT("mount(None, b'/usr', None, 0x20 | 0x1000, None)") " || exit 1"},
    {"MakeAUserNamespace",
     "unshare -U -r true 2>/dev/null || unshare -m true 2>/dev/null || exit 1"},
    {"WriteSystemDirectories",
     "touch /usr/bin/evil 2>/dev/null || touch /etc/evil 2>/dev/null || "
     "touch /bin/evil 2>/dev/null || touch /evil 2>/dev/null || "
     "echo x > /usr/lib/evil 2>/dev/null || exit 1"},
    {"WriteKernelSettings",
     "echo evil > /proc/sys/kernel/hostname 2>/dev/null || "
     "echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || "
     "echo 1 > /proc/sysrq-trigger 2>/dev/null || exit 1"},
    {"ReadAnotherUsersMemories",
     "cat /memories/users/bob/secret.md 2>/dev/null || "
     "ls /memories/users | grep -q bob || "
     "grep -rqs \"bob's secret\" /memories || exit 1"},
    {"MakeASetuidFile",
     "cp /bin/sh /workspace/suid; chmod 4755 /workspace/suid 2>/dev/null; "
     "chmod g+s /workspace/suid 2>/dev/null; test -u /workspace/suid || "
     "test -g /workspace/suid || python3 -c \"import os,sys\n"
     "fd = os.open('/workspace/suid2', os.O_CREAT | os.O_WRONLY, 0o6755)\n"
     "sys.exit(0 if os.stat(fd).st_mode & 0o6000 else 1)\" 2>/dev/null || "
     "exit 1"},
    {"UseTheKernelKeyrings",
     "python3 -c \"import ctypes,sys\n"
     "libc = ctypes.CDLL(None, use_errno=True)\n"
     "sys.exit(0 if libc.syscall(250, 0, -3, 0) > 0 else 1)\" || exit 1"},
    {"SeeANetworkInterfaceButLoopback",
     "tail -n +3 /proc/net/dev | grep -v '^ *lo:' | grep -q : || exit 1"},
    {"ReachTheHostsLoopback", PY_CONNECT("127.0.0.1", "{PORT}") " || exit 1"},
    {"ReachTheInternetByAddress", PY_CONNECT("1.1.1.1", "53") " || exit 1"},
    {"ResolveANameByDns",
     "getent hosts deb.debian.org > /dev/null 2>&1 || "
     "python3 -c \"import socket; socket.getaddrinfo('example.com', 443)\" "
     "2>/dev/null || exit 1"},
};

TEST_P(SecurityTest, IsStopped) {
  std::string script = Expand(GetParam().script);
  auto r = Sh(script);
  EXPECT_EQ(r.exit_code, 1) << GetParam().name << " was not stopped ("
                            << r.Describe() << "): " << script << "\n"
                            << r.out.text << r.err.text;
  // Seen from the host as well: no setuid or setgid file in the workspace,
  // and no token in the environment of the sandbox's first process.
  for (const char* name : {"suid", "suid2"}) {
    struct stat st;
    if (stat((workspace_ + "/" + name).c_str(), &st) == 0) {
      EXPECT_EQ(st.st_mode & 06000, 0u) << name;
    }
  }
  std::string environ = ReadHostFile(
      "/proc/" + std::to_string(sandbox_->init_pid()) + "/environ");
  EXPECT_EQ(environ.find(store_->token("alice")), std::string::npos);
  EXPECT_EQ(environ.find("AGENTVFS"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(FromInsideTheSandbox, SecurityTest,
                         ::testing::ValuesIn(kAttempts),
                         [](const ::testing::TestParamInfo<Attempt>& info) {
                           return std::string(info.param.name);
                         });

// Whatever the caller's uid, the sandbox's processes are an unprivileged
// host uid (as root: one of the session's own), with no capability.
TEST_F(SandboxTest, ProcessesRunUnderAnUnprivilegedHostUid) {
  MakeSandbox(TestLimits());
  ASSERT_TRUE(sandbox_->Start().has_value());
  std::string status =
      ReadHostFile("/proc/" + std::to_string(sandbox_->init_pid()) + "/status");
  std::string uid = std::to_string(sandbox_->host_uid());
  EXPECT_THAT(status, HasSubstr("Uid:\t" + uid + "\t" + uid + "\t" + uid));
  EXPECT_THAT(status, HasSubstr("CapEff:\t0000000000000000"));
  EXPECT_NE(sandbox_->host_uid(), 0u);
  if (geteuid() == 0) {
    EXPECT_GE(sandbox_->host_uid(), sandbox::kHostIdBase);
  }
}

// A command inherits only its standard descriptors: no descriptor of the
// sandbox's making reaches it. (The workspace's, given to bwrap for
// --bind-fd, did, and `ls /proc/self/fd/6/..` listed the workspace's
// parent on the host.) The init's control socket is not inherited either.
TEST_F(SandboxTest, ACommandInheritsOnlyItsStandardDescriptors) {
  auto r = Sh("ls /proc/self/fd | tr '\\n' ' '; ls /proc/self/fd/6/.. 2>&1");
  EXPECT_EQ(r.out.text.substr(0, r.out.text.find('l')), "0 1 2 3 ")
      << r.out.text;
  EXPECT_THAT(r.out.text, HasSubstr("No such file or directory"));
}

// The tools the attempts use are there, so a "stopped" is not a
// "command not found".
TEST_F(SandboxTest, TheAttemptsToolsExistInside) {
  auto r =
      Sh("for t in cat ls grep tr kill mount umount unshare touch getent "
         "python3; do command -v $t > /dev/null || echo missing $t; done");
  EXPECT_EQ(r.out.text, "") << r.err.text;
}

// Positive controls: the same snippets succeed where access is allowed.
TEST_F(SandboxTest, TheSameSnippetsSucceedWhereAllowed) {
  int server = socket(AF_INET, SOCK_STREAM, 0);
  (void)server;
  close(server);
  struct Control {
    const char* name;
    std::string script;
  };
  std::ofstream(workspace_ + "/token.txt") << "avfs_visible_here";
  const Control controls[] = {
      {"read a workspace file", "cat /workspace/token.txt > /dev/null"},
      {"grep finds a string", "grep -rqs avfs_visible_here /workspace"},
      {"see own processes", "kill -0 $$ && test -e /proc/$$"},
      {"write the workspace, /tmp and home",
       "touch /workspace/ok /tmp/ok ~/ok"},
      {"read own memories and the org's",
       "echo mine > /memories/users/alice/m.md && "
       "cat /memories/users/alice/m.md > /dev/null && ls /memories/org"},
      {"connect on the sandbox's own loopback",
       "python3 -c \"import socket,sys\n"
       "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
       "socket.create_connection(s.getsockname(), timeout=3)\""},
      {"ptrace a child of one's own",
       "sleep 5 & " PY_PTRACE("$!") "; r=$?; kill $!; exit $r"},
      {"start a process that outlives the command",
       "(setsid sleep 30 > /dev/null 2>&1 & echo $! > /tmp/sibling)"},
      {"ptrace a process that is not one's descendant",
       PY_PTRACE("$(cat /tmp/sibling)")},
      {"chmod and create with ordinary modes",
       "touch /workspace/plain && chmod 755 /workspace/plain && "
       "test -x /workspace/plain && python3 -c \"import os\n"
       "os.close(os.open('/workspace/plain2', os.O_CREAT | os.O_WRONLY, "
       "0o755))\" && test -x /workspace/plain2 && ls / > /dev/null"},
      {"resolve localhost", "getent hosts localhost > /dev/null"},
  };
  MakeSandbox(TestLimits());
  // The host itself has an interface besides loopback (so the sandbox's
  // lack of one means something).
  std::istringstream dev(ReadHostFile("/proc/net/dev"));
  bool other_interface = false;
  for (std::string line; std::getline(dev, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != "lo") other_interface = true;
  }
  EXPECT_TRUE(other_interface);
  for (const auto& c : controls) {
    auto r = Sh(c.script);
    EXPECT_EQ(r.exit_code, 0) << c.name << ": " << r.out.text << r.err.text;
  }
}

}  // namespace
}  // namespace agentvfs::testing
