// Implementation of the mount and process helpers for tests. Everything that
// runs between fork() and exec() is async-signal-safe: the argument and
// environment arrays are built before forking.
#include "tests/support/mount_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "vfs/mount_table.h"

#ifndef AGENTVFS_BINARY
#error "AGENTVFS_BINARY must name the built agentvfs binary"
#endif

extern char** environ;

namespace agentvfs::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::vector<vfs::MountEntry> MountsAt(const std::string& path) {
  std::string want = StripTrailingSlashes(path);
  std::vector<vfs::MountEntry> out;
  for (auto& rec : vfs::ReadMountTable()) {
    if (rec.point == want) out.push_back(rec);
  }
  return out;
}

bool MountIdPresent(const std::string& path, int id) {
  for (const auto& rec : MountsAt(path)) {
    if (rec.id == id) return true;
  }
  return false;
}

// Waits up to `timeout` for `pid` (our child) to exit. Returns its exit
// status in shell convention, or nullopt on timeout.
std::optional<int> WaitForExit(pid_t pid, milliseconds timeout) {
  // glibc 2.36's <sys/pidfd.h> lacks extern "C"; call the syscall itself.
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (pidfd >= 0) close(pidfd);
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (r < 0 && errno != EINTR) {
      if (pidfd >= 0) close(pidfd);
      return -1;  // not our child (already reaped)
    }
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 1000)));
    } else {
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  if (pidfd >= 0) close(pidfd);
  return std::nullopt;
}

std::string ReadFileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Mount points (and their child pids, -1 when not ours) that must not
// outlive the test binary.
struct Registry {
  std::mutex mu;
  std::map<std::string, pid_t> mounts;  // guarded by mu
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // leaked: used from atexit
  return *registry;
}

void CleanUpAllMounts() {
  Registry& reg = GetRegistry();
  std::map<std::string, pid_t> mounts;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    mounts.swap(reg.mounts);
  }
  for (const auto& [mountpoint, pid] : mounts) {
    if (pid > 0) {
      kill(pid, SIGTERM);
      if (!WaitForExit(pid, milliseconds(5000))) {
        LazyUnmount(mountpoint);
        kill(pid, SIGKILL);
        WaitForExit(pid, milliseconds(5000));
      }
    }
    if (MountedView::IsMounted(mountpoint)) LazyUnmount(mountpoint);
  }
}

class UnmountEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { CleanUpAllMounts(); }
};

void RegisterCleanup() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(CleanUpAllMounts); });
}

// Registered before main() so gtest runs its TearDown after the last test.
[[maybe_unused]] ::testing::Environment* const kUnmountEnvironment =
    ::testing::AddGlobalTestEnvironment(new UnmountEnvironment);

void Register(const std::string& mountpoint, pid_t pid) {
  RegisterCleanup();
  Registry& reg = GetRegistry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.mounts[mountpoint] = pid;
}

void Unregister(const std::string& mountpoint) {
  Registry& reg = GetRegistry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.mounts.erase(mountpoint);
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

bool RemoveBelow(int dirfd, dev_t dev) {
  DIR* dir = fdopendir(dirfd);
  if (dir == nullptr) {
    close(dirfd);
    return false;
  }
  bool ok = true;
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  for (const auto& name : names) {
    struct stat st;
    if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      ok = false;
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      if (st.st_dev != dev) {  // a mount point: never delete through it
        ok = false;
        continue;
      }
      // Make sure we can enter and empty directories a test chmod-ed to 0.
      fchmodat(dirfd, name.c_str(), 0700, 0);
      int sub = openat(dirfd, name.c_str(),
                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0 || !RemoveBelow(sub, dev)) ok = false;
      if (unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0) ok = false;
    } else if (unlinkat(dirfd, name.c_str(), 0) != 0) {
      ok = false;
    }
  }
  closedir(dir);
  return ok;
}

}  // namespace

bool RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return unlink(path.c_str()) == 0;
  chmod(path.c_str(), 0700);
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = RemoveBelow(fd, st.st_dev);
  return rmdir(path.c_str()) == 0 && ok;
}

TempDir::TempDir(const std::string& prefix) {
  std::string templ = "/tmp/" + prefix + "-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp(" << templ << "): " << std::strerror(errno);
    return;
  }
  path_ = templ;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  if (MountedView::IsMounted(path_)) LazyUnmount(path_);
  // A --background daemon unmounted by the test goes on closing its store
  // here for a moment (SQLite removes its -wal and -shm files at the last
  // close), which a removal running at the same time trips over: try again
  // for up to 5 s before calling it a leftover.
  for (int attempt = 0; !RemoveTree(path_); ++attempt) {
    if (attempt == 50) {
      ADD_FAILURE() << "could not remove temporary directory " << path_;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string DescribeErrno(int code) {
  return std::string(vfs::ErrnoName(code)) + " (" + std::to_string(code) + ")";
}

bool MountedView::IsMounted(const std::string& path) {
  return !MountsAt(path).empty();
}

size_t MountedView::MountCount(const std::string& path) {
  return MountsAt(path).size();
}

std::optional<std::string> MountedView::MountType(const std::string& path) {
  auto mounts = MountsAt(path);
  if (mounts.empty()) return std::nullopt;
  return mounts.back().fstype;  // later lines are mounted on top
}

bool LazyUnmount(const std::string& mountpoint) {
  if (!MountedView::IsMounted(mountpoint)) return true;
  RunCommand({"fusermount3", "-u", "-z", mountpoint},
             CommandOptions{.timeout = milliseconds(10'000)});
  if (MountedView::IsMounted(mountpoint)) {
    umount2(mountpoint.c_str(), MNT_DETACH);  // works when we are root
  }
  return !MountedView::IsMounted(mountpoint);
}

void UnmountAtExit(const std::string& mountpoint) {
  Register(StripTrailingSlashes(mountpoint), -1);
}

std::unique_ptr<MountedView> MountedView::Start(
    const std::string& workspace, const std::string& mountpoint,
    std::vector<std::string> extra_args, std::string* error) {
  auto fail = [error](std::string why) -> std::unique_ptr<MountedView> {
    if (error != nullptr) *error = std::move(why);
    return nullptr;
  };
  char resolved[PATH_MAX];
  if (realpath(mountpoint.c_str(), resolved) == nullptr) {
    return fail("mount point " + mountpoint + ": " + std::strerror(errno));
  }
  std::unique_ptr<MountedView> view(new MountedView);
  view->workspace_ = workspace;
  view->mountpoint_ = resolved;

  std::string log_template = "/tmp/agentvfs-mount-XXXXXX.log";
  int log_fd = mkostemps(log_template.data(), 4, O_CLOEXEC);
  if (log_fd < 0) return fail(std::string("mkstemp: ") + std::strerror(errno));
  view->log_path_ = log_template;

  std::vector<std::string> args = {AGENTVFS_BINARY, "mount", "--workspace",
                                   workspace, view->mountpoint_};
  for (auto& a : extra_args) args.push_back(std::move(a));
  std::vector<char*> argv = CStrings(args);

  std::vector<int> before;
  for (const auto& rec : MountsAt(view->mountpoint_)) before.push_back(rec.id);

  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return fail(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Child: die (and so unmount) with the thread that started us.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    close_range(3, ~0U, 0);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  view->pid_ = pid;
  Register(view->mountpoint_, pid);

  auto deadline = Clock::now() + std::chrono::seconds(15);
  for (;;) {
    for (const auto& rec : MountsAt(view->mountpoint_)) {
      if (std::find(before.begin(), before.end(), rec.id) == before.end()) {
        view->mount_id_ = rec.id;
        return view;
      }
    }
    if (auto status = WaitForExit(pid, milliseconds(0))) {
      view->exit_status_ = *status;
      Unregister(view->mountpoint_);
      return fail("agentvfs mount exited with status " +
                  std::to_string(*status) + " before mounting " +
                  view->mountpoint_ + "; its output:\n" + view->Log());
    }
    if (Clock::now() > deadline) {
      std::string log = view->Log();
      view->Stop(SIGKILL);
      return fail("agentvfs mount did not mount " + view->mountpoint_ +
                  " within 15 s; its output:\n" + log);
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

MountedView::~MountedView() {
  Stop();
  if (log_path_.empty()) return;
  // The daemon's log is worth keeping only for a test that failed; tests
  // that kill the daemon on purpose (status != 0) pass and leave nothing.
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "agentvfs mount's log kept in %s\n",
                 log_path_.c_str());
    return;
  }
  unlink(log_path_.c_str());
}

std::string MountedView::Log() const { return ReadFileText(log_path_); }

int MountedView::Stop(int signo) {
  if (exit_status_) return *exit_status_;
  if (pid_ <= 0) return -1;
  // Only our own mount is ever lazily unmounted, never someone else's.
  auto still_mounted = [&] {
    return mount_id_ >= 0 && MountIdPresent(mountpoint_, mount_id_);
  };

  kill(pid_, signo);
  std::optional<int> status = WaitForExit(pid_, milliseconds(10'000));
  if (!status) {
    if (still_mounted()) LazyUnmount(mountpoint_);
    status = WaitForExit(pid_, milliseconds(2'000));
  }
  if (!status) {
    kill(pid_, SIGKILL);
    status = WaitForExit(pid_, milliseconds(10'000));
  }
  if (still_mounted()) LazyUnmount(mountpoint_);
  Unregister(mountpoint_);
  exit_status_ = status.value_or(-1);
  return *exit_status_;
}

CommandResult RunCommand(const std::vector<std::string>& argv_in,
                         const CommandOptions& options) {
  CommandResult result;
  std::vector<std::string> args = argv_in;
  std::vector<char*> argv = CStrings(args);

  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env_map[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : options.env) env_map[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp = CStrings(env_strings);

  int out_fd = memfd_create("agentvfs-command-output", MFD_CLOEXEC);
  if (out_fd < 0) {
    result.output = std::string("memfd_create: ") + std::strerror(errno);
    return result;
  }
  const char* cwd = options.cwd.empty() ? nullptr : options.cwd.c_str();
  pid_t pid = fork();
  if (pid < 0) {
    close(out_fd);
    result.output = std::string("fork: ") + std::strerror(errno);
    return result;
  }
  if (pid == 0) {
    setpgid(0, 0);  // so a timeout can kill everything it started
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    close_range(3, ~0U, 0);
    if (cwd != nullptr && chdir(cwd) != 0) _exit(126);
    execvpe(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  std::optional<int> status = WaitForExit(pid, options.timeout);
  if (!status) {
    result.timed_out = true;
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    status = WaitForExit(pid, milliseconds(10'000));
  }
  result.exit_status = status.value_or(-1);
  struct stat st;
  if (fstat(out_fd, &st) == 0 && st.st_size > 0) {
    result.output.resize(st.st_size);
    ssize_t n = pread(out_fd, result.output.data(), st.st_size, 0);
    result.output.resize(n > 0 ? n : 0);
  }
  close(out_fd);
  return result;
}

}  // namespace agentvfs::testing
