// SandboxTest fixture (see sandbox_fixture.h).
#include "tests/backends/sandbox/sandbox_fixture.h"

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "tests/support/files.h"
#include "vfs/mount_table.h"

namespace agentvfs::testing {

void SandboxTest::SetUp() {
  auto store = StoreFixture::Create({"alice", "bob"});
  ASSERT_TRUE(store.has_value()) << store.error().message;
  store_ = std::move(*store);
  dir_ = std::make_unique<TempDir>("agentvfs-sandbox-test");
  workspace_ = dir_->Sub("ws");
  ASSERT_EQ(mkdir(workspace_.c_str(), 0755), 0);
  view_ = store_->MakeRouter();
}

void SandboxTest::TearDown() {
  if (sandbox_) sandbox_->Close();
  sandbox_.reset();
}

sandbox::Limits SandboxTest::TestLimits() {
  sandbox::Limits l;
  l.timeout_s = 60;
  return l;
}

void SandboxTest::MakeSandbox(sandbox::Limits limits) {
  sandbox::SandboxOptions o;
  o.workspace = workspace_;
  o.view = view_.get();
  o.identity = store_->CallerFor("alice", "sandbox-test");
  o.limits = limits;
  auto sb = sandbox::Sandbox::Create(o);
  ASSERT_TRUE(sb.has_value()) << sb.error().message;
  sandbox_ = std::move(*sb);
}

sandbox::CommandResult SandboxTest::Sh(const std::string& script,
                                       std::optional<sandbox::Limits> limits) {
  if (!sandbox_) MakeSandbox(TestLimits());
  sandbox::Command c;
  c.argv = {"sh", "-c", script};
  c.limits = limits;
  auto r = sandbox_->Run(c);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return r ? *r : sandbox::CommandResult{};
}

std::vector<pid_t> ProcessesWith(const std::string& marker) {
  std::vector<pid_t> found;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::string cmdline =
        ReadHostFile("/proc/" + std::to_string(pid) + "/cmdline");
    // A zombie has an empty command line; it is gone but for its entry.
    if (cmdline.find(marker) != std::string::npos) found.push_back(pid);
  }
  closedir(d);
  return found;
}

size_t SettledCount(const std::string& marker) {
  size_t last = ProcessesWith(marker).size();
  for (int stable = 0, i = 0; i < 250 && stable < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    size_t now = ProcessesWith(marker).size();
    stable = now == last ? stable + 1 : 0;
    last = now;
  }
  return last;
}

std::vector<std::string> MountsUnder(const std::string& prefix) {
  std::vector<std::string> found;
  for (const auto& m : vfs::ReadMountTable())
    if (m.point.starts_with(prefix)) found.push_back(m.point);
  return found;
}

// With read(2), not an ifstream: a process that exits while its /proc files
// are read makes read fail with ESRCH, which libstdc++'s filebuf turns into
// an exception whatever the stream's exception mask.
std::string ReadHostFile(const std::string& path) {
  return ReadFile(path).value_or("");
}

std::string Marker() {
  static int n = 0;
  return "agentvfs-marker-" + std::to_string(getpid()) + "-" +
         std::to_string(++n);
}

}  // namespace agentvfs::testing
