// Sandbox: the host side of a session's bubblewrap sandbox (see sandbox.h and
// docs/sandbox.md). Lock order: run_mu_, then Instance::kill_mu_.
#include "backends/sandbox/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <optional>
#include <sstream>
#include <tuple>

#include "backends/sandbox/protocol.h"
#include "vfs/fuse/fuse_frontend.h"
#include "vfs/host_tree.h"
#include "vfs/mount_table.h"
#include "vfs/path.h"

#ifndef AGENTVFS_SANDBOX_INIT_BUILD_PATH
#define AGENTVFS_SANDBOX_INIT_BUILD_PATH ""
#endif

namespace agentvfs::sandbox {

using nlohmann::json;
using vfs::Fail;
using Clock = std::chrono::steady_clock;

namespace {

std::shared_ptr<spdlog::logger> Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("sandbox");
    if (!l) {
      l = spdlog::default_logger()->clone("sandbox");
      spdlog::register_logger(l);
    }
    return l;
  }();
  return logger;
}

// Files of /etc the sandbox sees (read-only, when the host has them):
// what dynamic linking, locales, time zones, terminals and the usual
// interpreters need, and nothing with secrets (no shadow, no ssl/private,
// no ssh keys, no agentvfs configuration). Not the places where machines
// keep credentials for every user either: /etc/environment (proxies with
// passwords, cloud keys), /etc/gitconfig (an http.extraheader with a
// token), /etc/profile.d (exported tokens).
const char* const kEtcAllowlist[] = {
    "alternatives", "bash.bashrc", "debian_version", "inputrc",
    "ld.so.cache",  "ld.so.conf",  "ld.so.conf.d",   "locale.alias",
    "localtime",    "mime.types",  "nsswitch.conf",  "os-release",
    "profile",      "protocols",   "python3",        "python3.11",
    "services",     "shells",      "ssl/certs",      "ssl/openssl.cnf",
    "terminfo",     "timezone",    "magic",          "magic.mime",
    "perl",
};

// Allowlisted /etc directories bound from the host rather than copied.
bool IsEtcBound(std::string_view name) {
  return name == "alternatives" || name == "ssl/certs";
}

std::string ErrText(int err) { return std::strerror(err); }

std::string ReadSmallFile(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)),
                     std::istreambuf_iterator<char>());
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// One write(2) (what /proc and cgroup files need), never through a symlink.
bool WriteFile(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(),
                O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (close(fd) != 0) ok = false;
  return ok;
}

// Writes a decimal number without the C library's formatting (usable
// between fork and exec).
void WriteNumber(int fd, long value) {
  char buf[24];
  int i = sizeof(buf);
  buf[--i] = '\n';
  do {
    buf[--i] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  ssize_t ignored = write(fd, buf + i, sizeof(buf) - i);
  (void)ignored;
}

// Removes a session directory. Its owner stamp goes last, and only when
// nothing else is left: a removal cut short (a mount that could not be
// detached) leaves a stale session that the next sweep tries again.
void RemoveTree(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  vfs::RemoveTreeAt(fd, "owner");
  if (rmdir(path.c_str()) == 0 || errno != ENOTEMPTY) return;
  bool only_owner = true;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != ".." && n != "owner") only_owner = false;
    }
    closedir(d);
  }
  if (!only_owner) return;
  unlink((path + "/owner").c_str());
  rmdir(path.c_str());
}

// Unmounts a FUSE mount of this process (lazily: a process still inside it
// does not keep it alive); as a non-root user through fusermount3.
void UnmountLazily(const std::string& path) {
  if (umount2(path.c_str(), MNT_DETACH) == 0 || errno == EINVAL ||
      errno == ENOENT)
    return;
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 1);
    dup2(null, 2);
    execlp("fusermount3", "fusermount3", "-u", "-z", path.c_str(),
           static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid > 0) {
    int status;
    waitpid(pid, &status, 0);
  }
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  std::ostringstream s;
  if (u == 0)
    s << n << " bytes";
  else
    s << std::fixed << std::setprecision(1) << v << " " << units[u];
  return s.str();
}

// Output is read in chunks of kReadChunk, at most kReadBudget per stream
// between two looks at the clock.
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kReadBudget = 1 << 20;

// Keeps the first half and the last half of `cap` bytes of a stream.
class Capture {
 public:
  explicit Capture(uint64_t cap)
      : head_cap_(cap == 0 ? UINT64_MAX : cap - cap / 2),
        tail_cap_(cap == 0 ? 0 : cap / 2) {}
  void Add(const char* data, size_t n) {
    total_ += n;
    size_t to_head = 0;
    if (head_.size() < head_cap_)
      to_head =
          static_cast<size_t>(std::min<uint64_t>(n, head_cap_ - head_.size()));
    head_.append(data, to_head);
    data += to_head;
    n -= to_head;
    if (n == 0 || tail_cap_ == 0) return;
    if (n >= tail_cap_) {
      tail_.assign(data + n - tail_cap_, tail_cap_);
      tail_start_ = 0;
      return;
    }
    if (tail_.size() < tail_cap_) {  // still filling the ring
      size_t fill = std::min(n, tail_cap_ - tail_.size());
      tail_.append(data, fill);
      data += fill;
      n -= fill;
    }
    while (n > 0) {  // overwrite the oldest bytes, in at most two copies
      size_t chunk = std::min(n, tail_cap_ - tail_start_);
      std::memcpy(tail_.data() + tail_start_, data, chunk);
      tail_start_ = (tail_start_ + chunk) % tail_cap_;
      data += chunk;
      n -= chunk;
    }
  }
  Output Finish(const char* stream) const {
    Output out;
    out.total = total_;
    std::string tail = tail_.substr(tail_start_) + tail_.substr(0, tail_start_);
    uint64_t kept = head_.size() + tail.size();
    out.cut = total_ - kept;
    out.text = head_;
    if (out.cut > 0) {
      out.text += "\n[... " + std::to_string(out.cut) + " bytes (" +
                  HumanBytes(out.cut) + ") of " + stream +
                  " cut here; the command wrote " + std::to_string(total_) +
                  " bytes in all ...]\n";
    }
    out.text += tail;
    return out;
  }

 private:
  uint64_t head_cap_, tail_cap_;
  std::string head_, tail_;
  size_t tail_start_ = 0;
  uint64_t total_ = 0;
};

// ---------------------------------------------------------------------------
// cgroups: when this process may make child cgroups with the pids (memory)
// controller, each sandbox gets one, so the process limit counts every
// process of the sandbox whatever its uid (RLIMIT_NPROC does not bind uid 0)
// and the memory limit covers the sandbox as a whole.

struct CgroupPlace {
  std::string dir;  // our own cgroup's directory in that hierarchy
  bool v2 = false;
};

std::optional<CgroupPlace> FindCgroup(const std::string& controller) {
  std::ifstream mi("/proc/self/mountinfo");
  std::string line;
  std::string v1_mount, v2_mount;
  while (std::getline(mi, line)) {
    std::istringstream s(line);
    std::vector<std::string> f;
    std::string w;
    while (s >> w) f.push_back(w);
    auto dash = std::find(f.begin(), f.end(), "-");
    if (dash == f.end() || dash + 3 > f.end() || f.size() < 5) continue;
    const std::string& fstype = *(dash + 1);
    const std::string& super = *(dash + 3);
    if (fstype == "cgroup2" && v2_mount.empty()) v2_mount = f[4];
    if (fstype == "cgroup") {
      std::istringstream opts(super);
      std::string o;
      while (std::getline(opts, o, ','))
        if (o == controller) v1_mount = f[4];
    }
  }
  std::ifstream cg("/proc/self/cgroup");
  std::string v1_path, v2_path;
  while (std::getline(cg, line)) {
    auto a = line.find(':');
    auto b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctrls = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (ctrls.empty()) v2_path = path;
    std::istringstream cs(ctrls);
    std::string c;
    while (std::getline(cs, c, ','))
      if (c == controller) v1_path = path;
  }
  if (!v1_mount.empty() && !v1_path.empty()) {
    return CgroupPlace{v1_mount + (v1_path == "/" ? "" : v1_path), false};
  }
  if (!v2_mount.empty() && !v2_path.empty()) {
    std::string dir = v2_mount + (v2_path == "/" ? "" : v2_path);
    std::ifstream sc(dir + "/cgroup.subtree_control");
    std::string c;
    while (sc >> c)
      if (c == controller) return CgroupPlace{dir, true};
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// The seccomp filter bwrap installs before it starts the init (and so on
// every command). Namespaces and an unprivileged uid do the isolating; the
// filter closes what they leave:
//   - setuid/setgid bits: the workspace is stored as its owner's (root, when
//     agentvfs runs as root), so a setuid file made inside would be a
//     setuid-root file on the host. chmod/fchmod/fchmodat(2) and
//     open/openat/creat/mknod(at) asking for S_ISUID or S_ISGID get EPERM;
//     openat2 (whose mode is behind a pointer) and io_uring (which can open
//     files past this filter) get ENOSYS, and callers fall back to openat.
//   - kernel keyrings (keyctl, add_key, request_key): ENOSYS.
//   - any ABI but x86-64 (x32, i386): the process is killed.
#ifndef __NR_fchmodat2
#define __NR_fchmodat2 452
#endif

std::vector<sock_filter> SeccompProgram() {
  std::vector<sock_filter> f;
  auto stmt = [&](uint16_t code, uint32_t k) {
    f.push_back(BPF_STMT(code, k));
  };
  auto jump = [&](uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) {
    f.push_back(BPF_JUMP(code, k, jt, jf));
  };
  const uint32_t kNr = offsetof(seccomp_data, nr);
  auto arg = [](int i) {  // the low 32 bits of argument i (little endian)
    return static_cast<uint32_t>(offsetof(seccomp_data, args) + 8 * i);
  };
  const uint32_t kEperm = SECCOMP_RET_ERRNO | EPERM;
  const uint32_t kEnosys = SECCOMP_RET_ERRNO | ENOSYS;
  stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch));
  jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
  stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  stmt(BPF_LD | BPF_W | BPF_ABS, kNr);
  jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1);  // x32
  stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  for (int nr :
       {__NR_keyctl, __NR_add_key, __NR_request_key, __NR_openat2,
        __NR_io_uring_setup, __NR_io_uring_enter, __NR_io_uring_register}) {
    stmt(BPF_LD | BPF_W | BPF_ABS, kNr);
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1);
    stmt(BPF_RET | BPF_K, kEnosys);
  }
  // (syscall, index of the mode argument)
  const std::pair<int, int> mode_calls[] = {
      {__NR_chmod, 1},     {__NR_fchmod, 1}, {__NR_fchmodat, 2},
      {__NR_fchmodat2, 2}, {__NR_creat, 1},  {__NR_mknod, 1},
      {__NR_mknodat, 2}};
  for (auto [nr, mode] : mode_calls) {
    stmt(BPF_LD | BPF_W | BPF_ABS, kNr);
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 3);
    stmt(BPF_LD | BPF_W | BPF_ABS, arg(mode));
    jump(BPF_JMP | BPF_JSET | BPF_K, S_ISUID | S_ISGID, 0, 1);
    stmt(BPF_RET | BPF_K, kEperm);
  }
  // (syscall, flags argument, mode argument): only when creating (O_CREAT
  // or O_TMPFILE's own bit; not O_DIRECTORY, which O_TMPFILE includes: the
  // mode argument of any other open is whatever the register held).
  const uint32_t kCreating = O_CREAT | 020000000;
  for (auto [nr, flags, mode] :
       {std::tuple{__NR_open, 1, 2}, std::tuple{__NR_openat, 2, 3}}) {
    stmt(BPF_LD | BPF_W | BPF_ABS, kNr);
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 5);
    stmt(BPF_LD | BPF_W | BPF_ABS, arg(flags));
    jump(BPF_JMP | BPF_JSET | BPF_K, kCreating, 0, 3);
    stmt(BPF_LD | BPF_W | BPF_ABS, arg(mode));
    jump(BPF_JMP | BPF_JSET | BPF_K, S_ISUID | S_ISGID, 0, 1);
    stmt(BPF_RET | BPF_K, kEperm);
  }
  stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  return f;
}

// A memfd holding the program, for bwrap's --seccomp FD (read from its start).
int SeccompFd() {
  auto program = SeccompProgram();
  int fd = memfd_create("agentvfs-seccomp", MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t bytes = program.size() * sizeof(sock_filter);
  if (write(fd, program.data(), bytes) != static_cast<ssize_t>(bytes) ||
      lseek(fd, 0, SEEK_SET) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// "PID STARTTIME" of this process: who owns a session directory. The start
// time (field 22 of /proc/PID/stat) tells a live owner from a reused pid.
std::string ProcessStamp(pid_t pid) {
  std::string stat = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat");
  auto paren = stat.rfind(')');
  if (paren == std::string::npos) return {};
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  for (int i = 3; i <= 22 && fields >> f; ++i) {
    if (i == 22) return std::to_string(pid) + " " + f;
  }
  return {};
}

// Session directories under `state` whose owning process is gone (killed
// with -9, say): their view and workspace mounts are detached, their
// cgroups and the directory removed. Only directories this process's uid
// (or, as root, a sandbox uid) owns are touched, mounts are never looked
// up through symlinks, and removal never leaves the directory's mount.
void SweepStaleSessions(const std::string& state) {
  DIR* d = opendir(state.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  const bool root = geteuid() == 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("agentvfs-sandbox-", 0) != 0) continue;
    std::string dir = state + "/" + name;
    struct stat st;
    if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    bool ours = st.st_uid == geteuid() || (root && st.st_uid >= kHostIdBase &&
                                           st.st_uid < kHostIdBase + 65536u);
    if (!ours) continue;
    int fd = open((dir + "/owner").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;  // being made right now, or not ours
    char buf[64] = {};
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) continue;
    std::string stamp(buf, static_cast<size_t>(n));
    while (!stamp.empty() && stamp.back() == '\n') stamp.pop_back();
    pid_t pid = static_cast<pid_t>(atol(stamp.c_str()));
    if (pid <= 0 || ProcessStamp(pid) == stamp) continue;  // still alive
    stale.push_back(dir);
    // The cgroups of its sandboxes, by name.
    for (const char* controller : {"pids", "memory"}) {
      auto place = FindCgroup(controller);
      if (!place) continue;
      std::string prefix = "agentvfs-sandbox-" + std::to_string(pid) + "-";
      if (DIR* cg = opendir(place->dir.c_str())) {
        while (dirent* ce = readdir(cg)) {
          if (std::string(ce->d_name).rfind(prefix, 0) == 0)
            rmdir((place->dir + "/" + ce->d_name).c_str());
        }
        closedir(cg);
      }
    }
  }
  closedir(d);
  for (const auto& dir : stale) {
    Log()->info("removing the stale sandbox session {} (its process is gone)",
                dir);
    // Any process still naming the session directory (a bwrap that outlived
    // its owner) goes first: only this uid's or, as root, a sandbox uid's.
    if (DIR* procs = opendir("/proc")) {
      while (dirent* pe = readdir(procs)) {
        pid_t pid = static_cast<pid_t>(atol(pe->d_name));
        if (pid <= 0) continue;
        struct stat pst;
        std::string pdir = std::string("/proc/") + pe->d_name;
        if (stat(pdir.c_str(), &pst) != 0) continue;
        bool mine =
            pst.st_uid == geteuid() || (root && pst.st_uid >= kHostIdBase &&
                                        pst.st_uid < kHostIdBase + 65536u);
        if (!mine) continue;
        std::string cmdline = ReadSmallFile(pdir + "/cmdline");
        if (cmdline.find(dir + "/") != std::string::npos) kill(pid, SIGKILL);
      }
      closedir(procs);
    }
    for (const char* m : {"/view", "/ws"}) {
      std::string point = dir + m;
      if (umount2(point.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0 &&
          errno == EPERM)
        UnmountLazily(point);  // a user's FUSE mount: fusermount3
    }
    RemoveTree(dir);
  }
}

}  // namespace

vfs::Result<uint64_t> ParseSize(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  uint64_t mult = 1;
  std::string suffix = text.substr(used);
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1ull << 30;
  else if (suffix == "T" || suffix == "TiB")
    mult = 1ull << 40;
  else if (!suffix.empty() || used == 0)
    mult = 0;
  if (mult == 0 || !(v >= 0) || v * mult > 1.8e19)
    return Fail(EINVAL, "'" + text +
                            "' is not a size; give bytes or a number with "
                            "K, M, G or T (powers of 1024), e.g. 512M");
  return static_cast<uint64_t>(v * static_cast<double>(mult));
}

std::string CommandResult::Describe() const {
  std::ostringstream s;
  if (timed_out) {
    s << "timed out after " << std::setprecision(3) << seconds
      << " s; every process in the sandbox was killed";
  } else if (signal != 0) {
    s << "killed by " << SignalName(signal) << " (signal " << signal << ")";
    if (signal == SIGXCPU) s << ": CPU time limit reached";
    if (signal == SIGXFSZ) s << ": file size limit reached";
  } else {
    s << "exit " << exit_code;
  }
  return s.str();
}

// ---------------------------------------------------------------------------

struct Sandbox::View {
  std::unique_ptr<fuse::FuseServer> server;
  std::thread runner;
  std::atomic<bool> done{false};
  std::string mountpoint;
  ~View() {
    if (server) UnmountLazily(mountpoint);
    if (runner.joinable()) runner.join();
    if (server) server->Unmount();
  }
};

// One thread that runs jobs handed to it, one at a time; see EnsureRunning.
class Sandbox::Launcher {
 public:
  Launcher() : thread_([this] { Loop(); }) {}
  ~Launcher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  pid_t Run(const std::function<pid_t()>& job) {
    std::unique_lock lock(mu_);
    job_ = &job;
    done_ = false;
    cv_.notify_all();
    cv_.wait(lock, [this] { return done_; });
    return result_;
  }

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || job_ != nullptr; });
      if (stop_) return;
      result_ = (*job_)();
      job_ = nullptr;
      done_ = true;
      cv_.notify_all();
    }
  }
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  const std::function<pid_t()>* job_ = nullptr;
  pid_t result_ = -1;
  bool done_ = false, stop_ = false;
  std::thread thread_;
};

class Sandbox::Instance {
 public:
  ~Instance() { KillAndReap(); }

  pid_t bwrap_pid = -1;
  std::atomic<pid_t> init_pid{0};
  int pidfd = -1;  // of the init: signals reach it, never a reused pid
  int sock = -1;
  std::string run_dir;  // tmp/, home/ of this sandbox
  std::string pids_cgroup, memory_cgroup;
  bool memory_v2 = false;
  uint64_t pids_max = 0, memory_max = 0;  // as last written
  std::atomic<bool> dead{false};

  void Kill() {
    std::lock_guard lock(kill_mu_);
    if (pidfd >= 0) {
      syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
    } else if (bwrap_pid > 0) {
      // Not started far enough to have an init: bwrap is our own child
      // (unreaped, so its pid cannot be reused); without it the sandbox
      // never starts.
      kill(bwrap_pid, SIGKILL);
    }
    dead = true;
  }

  // Records the init once bwrap reported it (Kill() may run meanwhile).
  void SetInit(pid_t pid, int fd) {
    std::lock_guard lock(kill_mu_);
    init_pid = pid;
    pidfd = fd;
    if (dead) syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  }

  void KillAndReap() {
    Kill();
    if (bwrap_pid > 0) {
      int status;
      while (waitpid(bwrap_pid, &status, 0) < 0 && errno == EINTR) {
      }
      bwrap_pid = -1;
    }
    {
      std::lock_guard lock(kill_mu_);
      CloseFd(pidfd);
    }
    CloseFd(sock);
    for (const auto& dir : {pids_cgroup, memory_cgroup}) {
      if (dir.empty()) continue;
      // Killed processes leave their cgroup a moment after the signal.
      for (int i = 0; i < 200 && rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i)
        usleep(5000);
    }
    pids_cgroup.clear();
    memory_cgroup.clear();
    if (!run_dir.empty()) RemoveTree(run_dir);
    run_dir.clear();
  }

  bool Alive() {
    if (dead || bwrap_pid <= 0) return false;
    int status;
    if (waitpid(bwrap_pid, &status, WNOHANG) == bwrap_pid) {
      bwrap_pid = -1;
      dead = true;
      return false;
    }
    pollfd p{sock, 0, 0};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR))) {
      dead = true;
      return false;
    }
    return true;
  }

  void ApplyCgroupLimits(const Limits& l) {
    if (!pids_cgroup.empty() && l.processes != pids_max) {
      WriteFile(pids_cgroup + "/pids.max",
                l.processes == 0 ? "max" : std::to_string(l.processes));
      pids_max = l.processes;
    }
    if (!memory_cgroup.empty() && l.memory != memory_max) {
      std::string file = memory_cgroup +
                         (memory_v2 ? "/memory.max" : "/memory.limit_in_bytes");
      WriteFile(file, l.memory == 0 ? (memory_v2 ? "max" : "-1")
                                    : std::to_string(l.memory));
      memory_max = l.memory;
    }
  }

  uint64_t OomKills() const {
    if (memory_cgroup.empty()) return 0;
    std::ifstream f(memory_cgroup +
                    (memory_v2 ? "/memory.events" : "/memory.oom_control"));
    std::string key;
    uint64_t value;
    while (f >> key >> value)
      if (key == "oom_kill") return value;
    return 0;
  }

 private:
  std::mutex kill_mu_;  // guards pidfd against a concurrent close
};

Sandbox::Sandbox(SandboxOptions options) : options_(std::move(options)) {}

Sandbox::~Sandbox() { Close(); }

namespace {

std::string FindInit(const std::string& configured) {
  std::vector<std::string> candidates;
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("AGENTVFS_SANDBOX_INIT"); env && *env)
    return env;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir = std::string(exe).substr(0, std::string(exe).rfind('/'));
    candidates.push_back(dir + "/agentvfs-sandbox-init");
    candidates.push_back(dir + "/../libexec/agentvfs/agentvfs-sandbox-init");
  }
  candidates.push_back(AGENTVFS_SANDBOX_INIT_BUILD_PATH);
  for (const auto& c : candidates)
    if (!c.empty() && access(c.c_str(), X_OK) == 0) return c;
  return {};
}

}  // namespace

namespace {

// `path` with every symlink resolved; a file that does not exist (yet: a
// -wal) by its resolved directory. Empty when even that is missing.
std::string Resolved(const std::string& path) {
  char real[PATH_MAX];
  if (realpath(path.c_str(), real) != nullptr) return real;
  std::filesystem::path p(path);
  if (!p.has_filename() ||
      realpath(p.parent_path().empty() ? "." : p.parent_path().c_str(), real) ==
          nullptr)
    return "";
  return (std::filesystem::path(real) / p.filename()).string();
}

// Where the resolved `path` lies: the filesystem ("major:minor") and the
// path inside that filesystem, through the mount that covers it.
struct Place {
  std::string device;
  std::string inside;
};
std::optional<Place> PlaceOf(const std::vector<vfs::MountEntry>& mounts,
                             const std::string& path) {
  const vfs::MountEntry* cover = nullptr;
  for (const auto& m : mounts) {
    if (vfs::IsWithin(path, m.point) &&
        (cover == nullptr || m.point.size() >= cover->point.size()))
      cover = &m;  // the longest mount point; the last of equals is on top
  }
  if (cover == nullptr) return std::nullopt;
  std::string rest =
      cover->point == "/" ? path : path.substr(cover->point.size());
  std::string inside = cover->root == "/" ? rest : cover->root + rest;
  return Place{cover->device, inside.empty() ? "/" : inside};
}

// EINVAL when a secret can be reached from a directory the sandbox sees:
// it lies under it, or under a mount of the directory or below it that
// shows the secret's filesystem at or above it (a bind mount), or it has
// another hard link on a filesystem the sandbox sees part of.
vfs::Status NoSecretInside(const SandboxOptions& o) {
  std::vector<std::pair<std::string, std::string>> seen = {
      {o.workspace, "the workspace"}};
  for (const auto& b : o.extra_ro_binds) seen.push_back({b, "the bind " + b});
  for (const char* sys :
       {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"})
    seen.push_back({sys, std::string("the system directory ") + sys});
  const auto mounts = vfs::ReadMountTable();
  const std::string advice =
      "; keep the store, the token file and the config file outside the "
      "directories the sandbox sees";
  for (const auto& secret : o.secret_paths) {
    const std::string file = Resolved(secret);
    if (file.empty()) continue;
    const auto at = PlaceOf(mounts, file);
    struct stat st;
    const nlink_t links =
        stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? st.st_nlink : 1;
    for (const auto& [dir, what] : seen) {
      const std::string d = Resolved(dir);
      if (d.empty()) continue;
      if (vfs::IsWithin(file, d))
        return Fail(EINVAL, secret + " is inside " + what + " (" + d +
                                "), where the sandbox could read it" + advice);
      if (!at) continue;
      // The directory itself and every mount below it show a part of some
      // filesystem: the secret's, at or above it?
      std::vector<std::pair<std::string, Place>> shown;
      if (auto p = PlaceOf(mounts, d)) shown.push_back({d, *p});
      for (const auto& m : mounts)
        if (m.point != d && vfs::IsWithin(m.point, d))
          shown.push_back({m.point, Place{m.device, m.root}});
      for (const auto& [where, place] : shown) {
        if (place.device != at->device) continue;
        if (vfs::IsWithin(at->inside, place.inside))
          return Fail(EINVAL, secret + " can be read through " + where +
                                  " in " + what +
                                  " (it shows the directory that holds it, "
                                  "as a bind mount does)" +
                                  advice);
        if (links > 1)
          return Fail(EINVAL,
                      secret + " has " + std::to_string(links) +
                          " hard links, and " + what +
                          " is on the same filesystem: another link may be "
                          "where the sandbox can read it; give the file a "
                          "single link (find the others with `find " +
                          where + " -xdev -samefile " + file + "`)");
      }
    }
  }
  return {};
}

// A workspace is a directory the agent may change all of, so never the
// root, a system directory or a home directory (nor one above them), named
// directly or through a symlink: as root, the idmapped bind hands the
// files of the workspace's owner to the sandbox's user, so `--workspace /`,
// or a link an earlier run planted (`ln -s /root project`), let a command
// read root's ~/.npmrc and rewrite its ~/.bashrc.
vfs::Status NotASystemDirectory(const std::string& real,
                                const std::string& given) {
  auto refuse = [&](const std::string& what) -> vfs::Status {
    return Fail(EINVAL, "workspace '" + given + "'" +
                            (given == real ? "" : " (" + real + ")") + " is " +
                            what +
                            ": the agent could change everything in it. Make "
                            "a directory for the work (mkdir ~/agent-work) "
                            "and name that");
  };
  for (const char* dir :
       {"/", "/home", "/mnt", "/media", "/opt", "/srv", "/tmp", "/var",
        "/var/tmp", "/var/home", "/run", "/run/media"}) {
    if (real == dir) return refuse("a system directory");
  }
  // Whole trees of the system: programs, settings, services' state, logs,
  // runtime files (/run/agentvfs holds the sandbox ids' locks, /run/user
  // the users' agent sockets). Work has its place elsewhere in /var
  // (/var/tmp, /var/www, Silverblue's /var/home) and on removable media
  // (/run/media).
  for (const char* dir :
       {"/bin",       "/boot",     "/dev",         "/etc",     "/lib",
        "/lib32",     "/lib64",    "/libx32",      "/proc",    "/sbin",
        "/sys",       "/usr",      "/var/lib",     "/var/log", "/var/cache",
        "/var/spool", "/var/mail", "/var/backups", "/var/run", "/var/lock",
        "/var/opt"}) {
    if (vfs::IsWithin(real, dir)) return refuse("a system directory");
  }
  if (vfs::IsWithin(real, "/run") && !vfs::IsWithin(real, "/run/media"))
    return refuse("a system directory");
  // Home directories of every account, and what holds them (/home); in a
  // home, its settings and programs: a dot-directory (~/.ssh, ~/.config,
  // ~/.cargo) or ~/bin, and everything below them.
  setpwent();
  std::optional<std::string> home;
  while (passwd* pw = getpwent()) {
    if (pw->pw_dir == nullptr || pw->pw_dir[0] != '/') continue;
    char resolved[PATH_MAX];
    std::string dir = realpath(pw->pw_dir, resolved) ? resolved : pw->pw_dir;
    if (dir == "/") continue;
    if (vfs::IsWithin(dir, real)) {
      home =
          "the home directory of " + std::string(pw->pw_name) + " or holds it";
      break;
    }
    if (vfs::IsWithin(real, dir)) {
      std::string first = real.substr(dir.size() + 1);
      first = first.substr(0, first.find('/'));
      if (first[0] == '.' || first == "bin") {
        home = "in " + dir + "/" + first +
               ", where the programs or settings "
               "of " +
               std::string(pw->pw_name) + " live";
        break;
      }
    }
  }
  endpwent();
  if (home) return refuse(*home);
  return {};
}

// A workspace named through a symlink: the agent of an earlier session
// could have planted it in its workspace (`ln -s /home/alice/src project`,
// then `--workspace ws/project`), and the sandbox would then change
// whatever it leads to. Only links in "/" itself (/home -> /data/home) are
// followed; otherwise the person names the directory itself. EINVAL saying
// which.
vfs::Status NotThroughALink(const std::string& given, const std::string& real) {
  std::string cur;
  if (given.empty() || given[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) == nullptr) return {};  // realpath says
    cur = cwd;
  }
  size_t start = 0;
  while (start < given.size()) {
    size_t end = given.find('/', start);
    if (end == std::string::npos) end = given.size();
    std::string comp = given.substr(start, end - start);
    start = end + 1;
    if (comp.empty() || comp == ".") continue;
    if (comp == "..") {
      cur = cur.substr(0, cur.rfind('/'));  // cur has no links: physical
      continue;
    }
    std::string next = cur + "/" + comp;
    struct stat st;
    if (lstat(next.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) {
      cur = next;
      continue;
    }
    char resolved[PATH_MAX];
    if (realpath(next.c_str(), resolved) == nullptr) return {};
    if (!cur.empty()) {
      return Fail(EINVAL, "workspace '" + given +
                              "' goes through the symlink " + next + " (to " +
                              resolved + "), which an agent working in " + cur +
                              " could have made; name the directory itself "
                              "if that is the one you mean: --workspace " +
                              real);
    }
    cur = resolved;
  }
  return {};
}

}  // namespace

vfs::Result<std::unique_ptr<Sandbox>> Sandbox::Create(SandboxOptions options) {
  if (options.workspace.empty())
    return Fail(EINVAL, "no workspace directory given");
  char real[PATH_MAX];
  if (realpath(options.workspace.c_str(), real) == nullptr)
    return Fail(errno,
                "workspace '" + options.workspace + "': " + ErrText(errno));
  struct stat st;
  if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode))
    return Fail(ENOTDIR,
                "workspace '" + options.workspace + "' is not a directory");
  if (auto ok = NotASystemDirectory(real, options.workspace); !ok)
    return std::unexpected(ok.error());
  if (auto ok = NotThroughALink(options.workspace, real); !ok)
    return std::unexpected(ok.error());
  // The directory checked, pinned: `real` has no symlinks, so none swapped
  // in since (an agent working in the directory above) is followed.
  struct open_how how = {};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS;
  long ws_fd = syscall(SYS_openat2, AT_FDCWD, real, &how, sizeof(how));
  if (ws_fd < 0)
    return Fail(errno == ELOOP ? EINVAL : errno,
                "workspace '" + options.workspace +
                    "' changed while it was "
                    "checked (" +
                    ErrText(errno) + "); name it again");
  options.workspace = real;
  if (auto ok = NoSecretInside(options); !ok)
    return std::unexpected(ok.error());
  const bool root = geteuid() == 0;
  if (!root && ((options.host_uid && *options.host_uid != geteuid()) ||
                (options.host_gid && *options.host_gid != getegid())))
    return Fail(EPERM, "only root can run the sandbox under another uid");
  std::unique_ptr<Sandbox> sb(new Sandbox(std::move(options)));
  sb->workspace_fd_ = static_cast<int>(ws_fd);
  sb->launcher_ = std::make_unique<Launcher>();
  if (root && (!sb->options_.host_uid || !sb->options_.host_gid)) {
    // An id no other live session, account or process has (host_ids.h).
    HostIdPool pool;
    pool.base = kHostIdBase;
    auto lease = ReserveHostId(pool);
    if (!lease) return std::unexpected(lease.error());
    sb->host_id_ = std::move(*lease);
  }
  sb->host_uid_ =
      sb->options_.host_uid.value_or(root ? sb->host_id_.id() : geteuid());
  sb->host_gid_ =
      sb->options_.host_gid.value_or(root ? sb->host_id_.id() : getegid());
  sb->drop_ = root && sb->host_uid_ != 0;
  sb->workspace_ = sb->options_.workspace;
  sb->init_path_ = FindInit(sb->options_.init_path);
  if (sb->init_path_.empty())
    return Fail(ENOENT,
                "agentvfs-sandbox-init not found next to the agentvfs binary; "
                "build the project (scripts/build) or set "
                "AGENTVFS_SANDBOX_INIT to its path");
  // The session directory's parents must let the sandbox's uid through
  // (bwrap, running as that uid, opens what it binds from there).
  auto passable = [&sb](const std::string& dir) {
    if (!sb->drop_) return access(dir.c_str(), W_OK | X_OK) == 0;
    std::string path = dir;
    while (!path.empty()) {
      struct stat st;
      if (stat(path.c_str(), &st) != 0 || !(st.st_mode & S_IXOTH)) return false;
      auto slash = path.rfind('/');
      if (slash == 0 || slash == std::string::npos) break;
      path.resize(slash);
    }
    return true;
  };
  std::string state = sb->options_.state_dir;
  if (!state.empty() && !passable(state))
    return Fail(EACCES, "state directory " + state +
                            " is not usable for the sandbox (it and its "
                            "parents must be searchable by others, o+x)");
  for (const char* var : {"XDG_RUNTIME_DIR", "TMPDIR"}) {
    if (!state.empty()) break;
    if (const char* v = std::getenv(var); v && *v && passable(v)) state = v;
  }
  if (state.empty()) state = "/tmp";
  SweepStaleSessions(state);
  std::string templ = state + "/agentvfs-sandbox-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr)
    return Fail(errno, "cannot make a session directory in " + state + ": " +
                           ErrText(errno));
  sb->dir_ = templ;
  chmod(sb->dir_.c_str(), 0700);
  // Who owns it, for the sweep of a later session should this process die
  // without cleaning up.
  if (!WriteFile(sb->dir_ + "/owner", ProcessStamp(getpid()) + "\n")) {
    int err = errno;
    RemoveTree(sb->dir_);
    return Fail(err, "cannot write to the session directory " + sb->dir_);
  }
  // The /etc the sandbox sees is written while the session directory is
  // still root's alone, and stays root's (read-only to the sandbox's uid).
  const auto& o = sb->options_;
  std::string passwd = "root:x:0:0:root:/root:/usr/sbin/nologin\n";
  std::string group = "root:x:0:\n";
  if (o.uid != 0)
    passwd += o.user_name + ":x:" + std::to_string(o.uid) + ":" +
              std::to_string(o.gid) + ":agentvfs sandbox:/home/" + o.user_name +
              ":/bin/bash\n";
  if (o.gid != 0) group += o.user_name + ":x:" + std::to_string(o.gid) + ":\n";
  passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
  group += "nogroup:x:65534:\n";
  if (mkdir((sb->dir_ + "/etc").c_str(), 0755) != 0 ||
      !WriteFile(sb->dir_ + "/etc/passwd", passwd) ||
      !WriteFile(sb->dir_ + "/etc/group", group) ||
      !WriteFile(sb->dir_ + "/etc/hosts",
                 "127.0.0.1\tlocalhost " + o.hostname +
                     "\n::1\tlocalhost ip6-localhost ip6-loopback\n") ||
      !WriteFile(sb->dir_ + "/etc/hostname", o.hostname + "\n")) {
    int err = errno;
    RemoveTree(sb->dir_);
    return Fail(err, "cannot write the sandbox's /etc files");
  }
  // The allowlisted host files are copied once per session (symlinks kept
  // as symlinks), so a sandbox binds one /etc instead of one per entry:
  // every bind is paid again by each fresh sandbox. The two directories of
  // hundreds of symlinks are bound instead (a symlink costs about 1 ms to
  // make on some filesystems).
  for (const char* name : kEtcAllowlist) {
    if (IsEtcBound(name)) {
      std::error_code ec;
      std::filesystem::create_directories(sb->dir_ + "/etc/" + name, ec);
      continue;
    }
    std::filesystem::path src = std::string("/etc/") + name;
    std::filesystem::path dst = sb->dir_ + "/etc/" + name;
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(src, ec)))
      continue;
    std::filesystem::create_directories(dst.parent_path(), ec);
    std::filesystem::copy(src, dst,
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::copy_symlinks,
                          ec);
    if (ec) {
      Log()->debug("not copying {} into the sandbox's /etc: {}", src.string(),
                   ec.message());
      std::filesystem::remove_all(dst, ec);
    }
  }
  if (sb->drop_) {
    // The sandbox's host uid must reach what bwrap binds: the session
    // directory becomes its own, with a link to (or copy of) the init.
    // The init is put in while the directory is still root's alone.
    std::string init = sb->dir_ + "/init";
    bool ok = true;
    if (link(sb->init_path_.c_str(), init.c_str()) != 0) {
      std::ifstream in(sb->init_path_, std::ios::binary);
      std::ofstream out(init, std::ios::binary);
      out << in.rdbuf();
      ok = static_cast<bool>(out) && chmod(init.c_str(), 0755) == 0;
    }
    ok = ok && chown(sb->dir_.c_str(), sb->host_uid_, sb->host_gid_) == 0;
    if (!ok) {
      int err = errno;
      RemoveTree(sb->dir_);
      return Fail(err, "cannot prepare the session directory " + sb->dir_ +
                           ": " + ErrText(err));
    }
    sb->init_path_ = init;
    if (auto mapped = sb->MapWorkspace(); !mapped) {
      RemoveTree(sb->dir_);
      return std::unexpected(mapped.error());
    }
  }
  if (sb->options_.view != nullptr) {
    if (auto ok = sb->MountView(); !ok) {
      sb->Close();
      return std::unexpected(ok.error());
    }
  }
  return sb;
}

vfs::Status Sandbox::MapWorkspace() {
  // An idmapped bind of the workspace: files owned by the workspace's owner
  // appear owned by the sandbox's host uid, and what it creates is stored as
  // the owner's. The mapping is a user namespace made for the purpose by a
  // child that waits while its maps are written.
  struct stat st;
  if (fstat(workspace_fd_, &st) != 0)
    return Fail(errno, "workspace: " + ErrText(errno));
  int sync[2];
  if (pipe2(sync, O_CLOEXEC) != 0) return Fail(errno, "pipe");
  pid_t child = fork();
  if (child < 0) {
    close(sync[0]);
    close(sync[1]);
    return Fail(errno, "fork");
  }
  if (child == 0) {
    close(sync[1]);
    char b;
    if (unshare(CLONE_NEWUSER) != 0) _exit(1);
    // Waits for the parent to finish (EOF), then goes.
    while (read(sync[0], &b, 1) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  close(sync[0]);
  std::string proc = "/proc/" + std::to_string(child);
  int userns = -1;
  // The child unshares asynchronously: wait until its namespace differs.
  std::string own_ns, child_ns;
  char buf[64];
  ssize_t n = readlink("/proc/self/ns/user", buf, sizeof(buf));
  own_ns.assign(buf, n > 0 ? n : 0);
  for (int i = 0; i < 2000; ++i) {
    n = readlink((proc + "/ns/user").c_str(), buf, sizeof(buf));
    child_ns.assign(buf, n > 0 ? n : 0);
    if (!child_ns.empty() && child_ns != own_ns) break;
    usleep(500);
  }
  bool ok =
      child_ns != own_ns &&
      WriteFile(proc + "/uid_map", std::to_string(st.st_uid) + " " +
                                       std::to_string(host_uid_) + " 1\n") &&
      WriteFile(proc + "/gid_map", std::to_string(st.st_gid) + " " +
                                       std::to_string(host_gid_) + " 1\n");
  if (ok) userns = open((proc + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC);
  close(sync[1]);
  int status;
  waitpid(child, &status, 0);
  if (userns < 0)
    return Fail(EIO,
                "cannot make the user namespace for the workspace's "
                "idmapped mount");
  std::string target = dir_ + "/ws";
  mkdir(target.c_str(), 0700);
  // With the mounts inside the workspace (AT_RECURSIVE), each idmapped
  // too: without them, a bind mount in the workspace looked empty to the
  // sandbox, and what it wrote there landed hidden under the mount.
  int tree = open_tree(
      workspace_fd_, "",
      AT_EMPTY_PATH | OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
  int err = 0;
  if (tree < 0) {
    err = errno;
  } else {
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(userns);
    if (mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
                      sizeof(attr)) != 0 ||
        move_mount(tree, "", AT_FDCWD, target.c_str(),
                   MOVE_MOUNT_F_EMPTY_PATH) != 0)
      err = errno;
    close(tree);
  }
  close(userns);
  if (err != 0)
    return Fail(
        err, "cannot bind the workspace " + options_.workspace +
                 " for the sandbox's uid (an idmapped mount: " + ErrText(err) +
                 "); put the workspace, and any mount inside it, on a local "
                 "filesystem such as ext4, xfs, btrfs or tmpfs, or run "
                 "agentvfs as the workspace's owner instead of root");
  workspace_ = target;
  return {};
}

vfs::Status Sandbox::MountView() {
  view_.reset();
  auto v = std::make_unique<View>();
  v->mountpoint = dir_ + "/view";
  mkdir(v->mountpoint.c_str(), 0700);
  fuse::FuseOptions fo;
  fo.mountpoint = v->mountpoint;
  fo.identity = options_.identity;
  fo.fsname = "agentvfs-sandbox";
  if (drop_) {
    fo.allow_other = true;  // the sandbox's uid is not ours
    fo.id_map =
        fuse::FuseOptions::IdMap{geteuid(), host_uid_, getegid(), host_gid_};
  }
  auto server = fuse::FuseServer::Mount(*options_.view, fo);
  if (!server)
    return Fail(server.error().code,
                "cannot mount the session's view: " + server.error().message);
  v->server = std::move(*server);
  View* raw = v.get();
  v->runner = std::thread([raw] {
    if (auto ran = raw->server->Run(); !ran)
      Log()->warn("sandbox view stopped: {}", ran.error().message);
    raw->done = true;
  });
  view_ = std::move(v);
  return {};
}

vfs::Status Sandbox::Start() {
  std::lock_guard lock(run_mu_);
  bool fresh;
  return EnsureRunning(&fresh);
}

vfs::Status Sandbox::EnsureRunning(bool* fresh) {
  *fresh = false;
  if (closed_) return Fail(EINVAL, "the sandbox session has ended");
  if (options_.view != nullptr) {
    struct stat st;
    bool healthy = view_ && !view_->done &&
                   stat(view_->mountpoint.c_str(), &st) == 0 &&
                   fuse::IsMountPoint(view_->mountpoint);
    if (!healthy) {
      Log()->info("the session's view is gone; mounting a fresh one");
      DropInstance();
      if (auto ok = MountView(); !ok) return ok;
    }
  }
  if (instance_ && instance_->Alive()) return {};
  if (instance_) {
    Log()->debug("the sandbox ended; starting a fresh one");
    DropInstance();
  }
  *fresh = true;
  auto inst = std::make_unique<Instance>();
  unsigned gen = ++generation_;
  inst->run_dir = dir_ + "/run-" + std::to_string(gen);
  std::string home = "/home/" + options_.user_name;
  for (const char* sub : {"", "/tmp", "/home"}) {
    if (mkdir((inst->run_dir + sub).c_str(), 0700) != 0)
      return Fail(errno, "cannot make " + inst->run_dir + sub);
  }
  // The sandbox's host uid owns them.
  chmod((inst->run_dir + "/tmp").c_str(), 01777);
  if (drop_) {
    for (const char* sub : {"", "/tmp", "/home"})
      if (chown((inst->run_dir + sub).c_str(), host_uid_, host_gid_) != 0)
        return Fail(errno, "cannot give " + inst->run_dir + sub +
                               " to the sandbox's uid");
  }

  // cgroups for the process count and the memory of the whole sandbox.
  std::string cg_name = "agentvfs-sandbox-" + std::to_string(getpid()) + "-" +
                        std::to_string(gen);
  if (auto place = FindCgroup("pids")) {
    std::string d = place->dir + "/" + cg_name;
    if (mkdir(d.c_str(), 0755) == 0) inst->pids_cgroup = d;
  }
  if (auto place = FindCgroup("memory")) {
    std::string d = place->dir + "/" + cg_name;
    if (mkdir(d.c_str(), 0755) == 0) {
      inst->memory_cgroup = d;
      inst->memory_v2 = place->v2;
    }
  }
  inst->ApplyCgroupLimits(options_.limits);

  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0)
    return Fail(errno, "socketpair: " + ErrText(errno));
  int bufsize = static_cast<int>(kMaxPacket + 4096);
  for (int fd : sp) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof(bufsize));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof(bufsize));
  }
  int info[2];
  if (pipe2(info, O_CLOEXEC) != 0) {
    close(sp[0]);
    close(sp[1]);
    return Fail(errno, "pipe: " + ErrText(errno));
  }
  inst->sock = sp[0];

  // bwrap's arguments, all prepared before fork.
  std::vector<std::string> a = {options_.bwrap,
                                "--unshare-user",
                                "--uid",
                                std::to_string(options_.uid),
                                "--gid",
                                std::to_string(options_.gid),
                                "--disable-userns",
                                "--unshare-pid",
                                "--unshare-net",
                                "--unshare-ipc",
                                "--unshare-uts",
                                "--unshare-cgroup-try",
                                "--hostname",
                                options_.hostname,
                                "--die-with-parent",
                                "--new-session",
                                "--as-pid-1",
                                "--cap-drop",
                                "ALL",
                                "--ro-bind",
                                "/usr",
                                "/usr"};
  for (const char* top :
       {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    char target[PATH_MAX];
    ssize_t n = readlink(top, target, sizeof(target) - 1);
    struct stat st;
    if (n > 0) {
      target[n] = '\0';
      a.insert(a.end(), {"--symlink", target, top});
    } else if (lstat(top, &st) == 0 && S_ISDIR(st.st_mode)) {
      a.insert(a.end(), {"--ro-bind", top, top});
    }
  }
  a.insert(a.end(), {"--ro-bind", dir_ + "/etc", "/etc"});
  for (const char* name : kEtcAllowlist) {
    std::string p = std::string("/etc/") + name;
    if (IsEtcBound(name) && access(p.c_str(), F_OK) == 0)
      a.insert(a.end(), {"--ro-bind", p, p});
  }
  for (const auto& p : options_.extra_ro_binds)
    a.insert(a.end(), {"--ro-bind", p, p});
  a.insert(a.end(),
           {"--proc", "/proc", "--dev", "/dev", "--bind",
            inst->run_dir + "/tmp", "/tmp", "--bind", inst->run_dir + "/home",
            home, "--symlink", "/tmp", "/var/tmp"});
  // The idmapped bind (root) is in the session's own directory; otherwise
  // the directory checked at Create, by its descriptor (fd 6 below).
  if (workspace_ != options_.workspace)
    a.insert(a.end(), {"--bind", workspace_, "/workspace"});
  else
    a.insert(a.end(), {"--bind-fd", "6", "/workspace"});
  if (view_) {
    a.insert(a.end(), {"--bind", view_->mountpoint + "/memories", "/memories",
                       "--bind", view_->mountpoint + "/skills", "/skills"});
  } else {
    a.insert(a.end(), {"--dir", "/memories", "--dir", "/skills"});
  }
  a.insert(a.end(), {"--ro-bind", init_path_, "/.agentvfs-init", "--remount-ro",
                     "/", "--chdir", "/", "--seccomp", "5", "--info-fd", "4",
                     "--", "/.agentvfs-init", "3"});
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  char env_path[] = "PATH=/usr/bin:/bin";
  char* envp[] = {env_path, nullptr};
  std::string log = inst->run_dir + "/bwrap.log";
  std::string pids_procs =
      inst->pids_cgroup.empty() ? "" : inst->pids_cgroup + "/cgroup.procs";
  std::string mem_procs =
      inst->memory_cgroup.empty() ? "" : inst->memory_cgroup + "/cgroup.procs";
  int log_fd =
      open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
           0600);
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  int seccomp_fd = SeccompFd();
  if (seccomp_fd < 0) {
    int err = errno;
    for (int fd : {sp[1], info[0], info[1], log_fd, null_fd})
      if (fd >= 0) close(fd);
    inst->KillAndReap();
    return Fail(err, "cannot prepare the sandbox's seccomp filter");
  }

  const bool drop = drop_;
  const uid_t uid = host_uid_;
  const gid_t gid = host_gid_;
  // Only bwrap's --bind-fd gets the workspace's descriptor: a descriptor
  // of a host directory inside the sandbox would lead out of it
  // (/proc/self/fd/6/.. is the workspace's parent on the host).
  const int ws_pinned = workspace_ != options_.workspace ? -1 : workspace_fd_;
  // bwrap is forked by the launcher thread, which lives as long as this
  // Sandbox: --die-with-parent (the death signal of the forking *thread*)
  // then ends the sandbox exactly when the session or this process ends,
  // also while bwrap is still setting up.
  pid_t pid = launcher_->Run([&]() -> pid_t {
    pid_t pid = fork();
    if (pid == 0) {
      // Only async-signal-safe calls from here to exec.
      setsid();
      // A session keyring of its own: not the caller's (root's keys).
      syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, nullptr);
      for (const std::string* procs : {&pids_procs, &mem_procs}) {
        if (procs->empty()) continue;
        int fd = open(procs->c_str(), O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
          WriteNumber(fd, getpid());
          close(fd);
        }
      }
      if (drop) {
        if (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
            setresuid(uid, uid, uid) != 0)
          _exit(126);
      }
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int s = 1; s < NSIG; ++s) signal(s, SIG_DFL);
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      dup2(log_fd >= 0 ? log_fd : null_fd, 2);
      // fds 3, 4 and 5: the control socket, bwrap's info pipe and the seccomp
      // program; every other descriptor of this process (the store's database
      // among them) closes.
      int sock_fd = fcntl(sp[1], F_DUPFD_CLOEXEC, 10);
      int info_fd = fcntl(info[1], F_DUPFD_CLOEXEC, 10);
      int filter_fd = fcntl(seccomp_fd, F_DUPFD_CLOEXEC, 10);
      int ws_fd = ws_pinned >= 0 ? fcntl(ws_pinned, F_DUPFD_CLOEXEC, 10) : -1;
      dup2(sock_fd, 3);
      dup2(info_fd, 4);
      dup2(filter_fd, 5);
      if (ws_fd >= 0) dup2(ws_fd, 6);  // --bind-fd 6, when not idmapped
      syscall(SYS_close_range, ws_fd >= 0 ? 7 : 6, ~0U, 0);
      execve(argv[0][0] == '/' ? argv[0] : "/usr/bin/bwrap", argv.data(), envp);
      if (argv[0][0] != '/') {
        // Not found where Debian puts it: search PATH ourselves.
        execvpe(argv[0], argv.data(), envp);
      }
      _exit(127);
    }
    return pid;
  });
  if (pid < 0) {
    int err = errno;
    for (int fd : {sp[1], info[0], info[1], log_fd, null_fd, seccomp_fd})
      if (fd >= 0) close(fd);
    inst->KillAndReap();
    return Fail(err, "fork: " + ErrText(err));
  }
  inst->bwrap_pid = pid;
  for (int fd : {sp[1], info[1], log_fd, null_fd, seccomp_fd})
    if (fd >= 0) close(fd);
  int info_fd = info[0];
  // From here a Kill() (e.g. the person's Ctrl-C) reaches the starting
  // sandbox: with no init yet, it kills bwrap.
  Instance* ip = inst.get();
  {
    std::lock_guard ilock(instance_mu_);
    instance_ = std::move(inst);
  }

  auto startup_error = [&](const std::string& what) {
    std::ifstream lf(log);
    std::string text((std::istreambuf_iterator<char>(lf)),
                     std::istreambuf_iterator<char>());
    while (!text.empty() && text.back() == '\n') text.pop_back();
    CloseFd(info_fd);
    bool stopped = ip->dead;
    DropInstance();
    if (stopped) return Fail(EINTR, "the sandbox was stopped while it started");
    std::string hint;
    if (access("/usr/bin/bwrap", X_OK) != 0 && options_.bwrap == "bwrap")
      hint =
          "; bubblewrap is not installed: run scripts/install-deps "
          "(Debian package bubblewrap)";
    return Fail(EIO, "cannot start the sandbox: " + what +
                         (text.empty() ? "" : ": " + text) + hint);
  };

  // bwrap reports the sandbox's first process once it has set it up.
  std::string info_text;
  json info_json;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - Clock::now())
                    .count();
    if (left <= 0) return startup_error("bwrap did not report in 20 s");
    pollfd p{info_fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno != EINTR) return startup_error("poll");
    if (r <= 0) continue;
    char buf[512];
    ssize_t n = read(info_fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return startup_error("bwrap exited");
    info_text.append(buf, static_cast<size_t>(n));
    info_json = json::parse(info_text, nullptr, false);
    if (info_json.is_object() && info_json.contains("child-pid") &&
        info_json["child-pid"].is_number_integer())
      break;
  }
  CloseFd(info_fd);
  pid_t init_pid = info_json["child-pid"].get<pid_t>();
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, init_pid, 0));
  if (pidfd < 0) return startup_error("pidfd_open: " + ErrText(errno));
  // The pid could have been reused if the init died at once: the pidfd
  // counts only if it names bwrap's child.
  std::string stat =
      ReadSmallFile("/proc/" + std::to_string(init_pid) + "/stat");
  auto paren = stat.rfind(')');
  long ppid = -1;
  if (paren != std::string::npos)
    sscanf(stat.c_str() + paren + 1, " %*c %ld", &ppid);
  if (ppid != ip->bwrap_pid) {
    close(pidfd);
    return startup_error("the sandbox's first process ended at once");
  }
  ip->SetInit(init_pid, pidfd);
  // Then the init says it is ready.
  pollfd p{ip->sock, POLLIN, 0};
  if (poll(&p, 1, 20000) <= 0) return startup_error("the init did not start");
  json ready;
  std::vector<int> fds;
  int err = RecvPacket(ip->sock, &ready, &fds);
  for (int fd : fds) close(fd);
  if (err != 0 || !ready.is_object() || ready.value("op", json()) != "ready")
    return startup_error("the init did not start (" + ErrText(err) + ")");
  if (ip->dead) return startup_error("stopped");
  Log()->debug("sandbox {} started: init pid {}", gen, init_pid);
  return {};
}

namespace {

vfs::Result<std::string> InsideDir(const std::string& cwd) {
  if (cwd.empty()) return std::string("/workspace");
  auto p = vfs::Path::Parse(cwd);
  if (!p)
    return Fail(EINVAL,
                "working directory '" + cwd + "': " + p.error().message);
  for (const char* root : {"/workspace", "/memories", "/skills"}) {
    if (p->HasPrefix(*vfs::Path::Parse(root))) return p->str();
  }
  return Fail(EINVAL, "working directory '" + cwd +
                          "' is outside the view; use /workspace, /memories, "
                          "/skills or a directory below them");
}

}  // namespace

vfs::Result<CommandResult> Sandbox::Run(const Command& cmd) {
  std::lock_guard lock(run_mu_);
  return RunLocked(cmd, -1, -1, -1, false);
}

vfs::Result<CommandResult> Sandbox::RunTerminal(const Command& cmd, int in_fd,
                                                int out_fd, int winch_fd) {
  std::lock_guard lock(run_mu_);
  return RunLocked(cmd, in_fd, out_fd, winch_fd, true);
}

vfs::Result<CommandResult> Sandbox::RunLocked(const Command& cmd, int in_fd,
                                              int out_fd, int winch_fd,
                                              bool tty) {
  if (cmd.argv.empty() || cmd.argv[0].empty())
    return Fail(EINVAL, "no command given");
  auto cwd = InsideDir(cmd.cwd);
  if (!cwd) return std::unexpected(cwd.error());
  const Limits limits = cmd.limits.value_or(options_.limits);
  std::string home = "/home/" + options_.user_name;
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"},
      {"HOME", home},
      {"USER", options_.user_name},
      {"LOGNAME", options_.user_name},
      {"SHELL", "/bin/bash"},
      {"LANG", "C.UTF-8"},
      {"TMPDIR", "/tmp"},
      {"PWD", *cwd},
      {"TERM", tty ? "xterm-256color" : "dumb"},
      // Byte code of /skills scripts goes to /tmp, not into the store.
      {"PYTHONPYCACHEPREFIX", "/tmp/.pycache"},
  };
  for (const auto& [k, v] : cmd.env) {
    if (k.empty() || k.find('=') != std::string::npos ||
        k.find('\0') != std::string::npos || v.find('\0') != std::string::npos)
      return Fail(EINVAL, "environment variable name '" + k + "' is not valid");
    env[k] = v;
  }
  std::vector<std::string> env_list;
  for (const auto& [k, v] : env) env_list.push_back(k + "=" + v);
  for (const auto& arg : cmd.argv)
    if (arg.find('\0') != std::string::npos)
      return Fail(EINVAL, "a command argument contains a NUL byte");

  bool fresh = false;
  if (auto ok = EnsureRunning(&fresh); !ok) return std::unexpected(ok.error());
  Instance& inst = *instance_;
  inst.ApplyCgroupLimits(limits);
  uint64_t oom_before = inst.OomKills();

  json limits_json = {{"cpu_s", limits.cpu_s},
                      {"memory", limits.memory},
                      {"file_size", limits.file_size},
                      {"open_files", limits.open_files}};
  // Without a pids cgroup the process limit falls back to RLIMIT_NPROC,
  // which counts the uid's processes (and does not bind uid 0).
  if (inst.pids_cgroup.empty()) limits_json["processes"] = limits.processes;
  uint64_t id = next_id_++;
  json req = {{"op", "exec"},         {"id", id},    {"argv", cmd.argv},
              {"env", env_list},      {"cwd", *cwd}, {"tty", tty},
              {"limits", limits_json}};
  if (tty && in_fd >= 0) {
    winsize ws{};
    if (ioctl(in_fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0) {
      req["rows"] = ws.ws_row;
      req["cols"] = ws.ws_col;
    }
  }

  // Pipes: the command's ends go to the init; ours stay here. stdin is a
  // socket pair so that feeding a command that stopped reading gives EPIPE
  // (MSG_NOSIGNAL), never a SIGPIPE that would kill this process.
  int out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, in_p[2] = {-1, -1};
  auto close_all = [&] {
    for (int* p : {out_p, err_p, in_p}) {
      CloseFd(p[0]);
      CloseFd(p[1]);
    }
  };
  std::vector<int> send_fds;
  if (!tty) {
    if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0) {
      int e = errno;
      close_all();
      return Fail(e, "pipe: " + ErrText(e));
    }
    if (!cmd.stdin_data.empty()) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        int e = errno;
        close_all();
        return Fail(e, "socketpair: " + ErrText(e));
      }
      in_p[0] = sv[0];
      in_p[1] = sv[1];
      shutdown(in_p[0], SHUT_WR);  // the command's end only reads
    } else {
      in_p[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    send_fds = {in_p[0], out_p[1], err_p[1]};
  }
  auto start = Clock::now();
  int serr = SendPacket(inst.sock, req, send_fds);
  CloseFd(in_p[0]);
  CloseFd(out_p[1]);
  CloseFd(err_p[1]);
  if (serr == EMSGSIZE) {
    close_all();
    return Fail(EMSGSIZE,
                "the command line is over 512 KiB; write it to a script in "
                "/workspace and run that");
  }
  if (serr != 0) {
    close_all();
    DropInstance();
    return Fail(EIO, "the sandbox did not take the command (" + ErrText(serr) +
                         "); the next command starts a fresh sandbox");
  }
  for (int fd : {out_p[0], err_p[0], in_p[1]})
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  Capture out(limits.output_cap), err(limits.output_cap);
  std::string err_note;  // said after the output, not counted in it
  CommandResult result;
  result.fresh_sandbox = fresh;
  size_t stdin_off = 0;
  int master = -1;
  bool master_open = false;
  bool exited = false, sandbox_died = false, loop_failed = false;
  int status = 0;
  std::optional<vfs::Error> start_error;
  std::optional<Clock::time_point> deadline;
  if (limits.timeout_s > 0)
    deadline = start + std::chrono::microseconds(
                           static_cast<int64_t>(limits.timeout_s * 1e6));
  std::vector<char> buf(kReadChunk);

  // Reads what `fd` has, up to `budget` bytes, so that a command writing
  // without pause cannot keep this loop from its deadline.
  auto drain = [&](int& fd, Capture& cap, size_t budget) {
    while (fd >= 0 && budget > 0) {
      ssize_t n = read(fd, buf.data(), std::min(buf.size(), budget));
      if (n > 0) {
        cap.Add(buf.data(), static_cast<size_t>(n));
        budget -= static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || errno != EAGAIN) CloseFd(fd);
      return;
    }
  };
  // After the command ended: what is already in the pipe, and no more
  // (a process it left in the background may go on writing, unheard).
  auto drain_buffered = [&](int& fd, Capture& cap) {
    int pending = 0;
    if (fd >= 0 && ioctl(fd, FIONREAD, &pending) == 0 && pending > 0)
      drain(fd, cap, static_cast<size_t>(pending));
  };
  auto relay = [](int to, const char* data, size_t n) {
    // The person's terminal, or the sandbox's: short blocking writes.
    while (n > 0) {
      ssize_t w = write(to, data, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;
      data += w;
      n -= static_cast<size_t>(w);
    }
  };

  while (!exited && !sandbox_died && !start_error) {
    std::vector<pollfd> p;
    p.push_back({inst.sock, POLLIN, 0});
    int i_out = -1, i_err = -1, i_in = -1, i_master = -1, i_tin = -1,
        i_winch = -1;
    auto add = [&](int fd, short events) {
      p.push_back({fd, events, 0});
      return static_cast<int>(p.size() - 1);
    };
    if (out_p[0] >= 0) i_out = add(out_p[0], POLLIN);
    if (err_p[0] >= 0) i_err = add(err_p[0], POLLIN);
    if (in_p[1] >= 0) i_in = add(in_p[1], POLLOUT);
    if (master_open) {
      i_master = add(master, POLLIN);
      if (in_fd >= 0) i_tin = add(in_fd, POLLIN);
      if (winch_fd >= 0) i_winch = add(winch_fd, POLLIN);
    }
    int timeout_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      *deadline - Clock::now())
                      .count();
      timeout_ms = static_cast<int>(std::max<int64_t>(0, left + 1));
    }
    int r = poll(p.data(), p.size(), timeout_ms);
    if (r < 0 && errno != EINTR) {
      loop_failed = true;
      break;
    }
    if (deadline && Clock::now() >= *deadline) {
      result.timed_out = true;
      break;
    }
    if (r <= 0) continue;
    if (p[0].revents) {
      json msg;
      std::vector<int> fds;
      int e = RecvPacket(inst.sock, &msg, &fds);
      if (e == EAGAIN || e == EINTR || e == EBADMSG) {
        for (int fd : fds) close(fd);
        continue;
      }
      if (e != 0) {
        for (int fd : fds) close(fd);
        sandbox_died = true;
        break;
      }
      auto number = [&msg](const char* key, int64_t fallback) {
        auto it = msg.find(key);
        return it != msg.end() && it->is_number_integer() ? it->get<int64_t>()
                                                          : fallback;
      };
      auto it = msg.find("op");
      std::string op =
          it != msg.end() && it->is_string() ? it->get<std::string>() : "";
      if (number("id", -1) != static_cast<int64_t>(id)) {
        for (int fd : fds) close(fd);
        continue;
      }
      if (op == "started") {
        if (tty && !fds.empty()) {
          master = fds[0];
          master_open = true;
          fds.erase(fds.begin());
        }
      } else if (op == "failed") {
        auto m = msg.find("message");
        start_error = vfs::Error{static_cast<int>(number("errno", EIO)),
                                 m != msg.end() && m->is_string()
                                     ? m->get<std::string>()
                                     : "cannot start the command"};
      } else if (op == "exited") {
        status = static_cast<int>(number("status", 0));
        exited = true;
      }
      for (int fd : fds) close(fd);
    }
    if (i_out >= 0 && p[i_out].revents) drain(out_p[0], out, kReadBudget);
    if (i_err >= 0 && p[i_err].revents) drain(err_p[0], err, kReadBudget);
    if (i_in >= 0 && p[i_in].revents) {
      ssize_t n = send(in_p[1], cmd.stdin_data.data() + stdin_off,
                       cmd.stdin_data.size() - stdin_off, MSG_NOSIGNAL);
      if (n > 0) stdin_off += static_cast<size_t>(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) ||
          stdin_off == cmd.stdin_data.size())
        CloseFd(in_p[1]);
    }
    if (i_master >= 0 && p[i_master].revents) {
      ssize_t n = read(master, buf.data(), buf.size());
      if (n > 0 && out_fd >= 0) {
        relay(out_fd, buf.data(), static_cast<size_t>(n));
      } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        master_open = false;  // EIO: the terminal's last user closed it
      }
    }
    if (i_tin >= 0 && p[i_tin].revents) {
      ssize_t n = read(in_fd, buf.data(), buf.size());
      if (n > 0) {
        relay(master, buf.data(), static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        // The person's side is gone: hang up the sandbox's terminal, as
        // closing a terminal window does (the shell gets SIGHUP).
        in_fd = -1;
        CloseFd(master);
        master_open = false;
      }
    }
    if (i_winch >= 0 && p[i_winch].revents) {
      char b[256];
      ssize_t ignored = read(winch_fd, b, sizeof(b));
      (void)ignored;
      winsize ws{};
      if (ioctl(in_fd, TIOCGWINSZ, &ws) == 0) ioctl(master, TIOCSWINSZ, &ws);
    }
  }
  auto end = Clock::now();
  result.seconds = std::chrono::duration<double>(end - start).count();
  if (start_error) {
    close_all();
    CloseFd(master);
    return std::unexpected(*start_error);
  }
  if (result.timed_out || sandbox_died || loop_failed) {
    // Every process of the sandbox goes: the pid namespace ends with its
    // init. What they wrote so far is kept.
    int poll_errno = errno;
    DropInstance();
    result.signal = SIGKILL;
    drain_buffered(out_p[0], out);
    drain_buffered(err_p[0], err);
    if (loop_failed) {
      close_all();
      CloseFd(master);
      return Fail(EIO, "waiting for the command failed (" +
                           ErrText(poll_errno) + "); the sandbox was stopped");
    }
    if (sandbox_died && !result.timed_out)
      err_note =
          "\n[the sandbox was killed; the next command starts a "
          "fresh one]\n";
  } else {
    drain_buffered(out_p[0], out);
    drain_buffered(err_p[0], err);
    if (master >= 0) {
      fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
      ssize_t n;
      while ((n = read(master, buf.data(), buf.size())) > 0 && out_fd >= 0)
        relay(out_fd, buf.data(), static_cast<size_t>(n));
    }
    if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
    if (instance_ && instance_->OomKills() > oom_before)
      err_note =
          "\n[memory limit reached: the kernel killed a process of "
          "the sandbox]\n";
  }
  close_all();
  CloseFd(master);
  result.out = out.Finish("stdout");
  result.err = err.Finish("stderr");
  result.err.text += err_note;
  return result;
}

void Sandbox::DropInstance() {
  std::unique_ptr<Instance> old;
  {
    std::lock_guard lock(instance_mu_);
    old = std::move(instance_);
  }
  if (old) old->KillAndReap();
}

void Sandbox::Kill() {
  // Safe while Run() waits: it sees the control socket close, reports the
  // command as killed and reaps the sandbox.
  std::lock_guard lock(instance_mu_);
  if (instance_) instance_->Kill();
}

void Sandbox::Close() {
  Kill();
  std::lock_guard lock(run_mu_);
  if (closed_) return;
  closed_ = true;
  DropInstance();
  view_.reset();
  if (workspace_ != options_.workspace) {
    umount2(workspace_.c_str(), MNT_DETACH);
    workspace_ = options_.workspace;
  }
  if (!dir_.empty()) RemoveTree(dir_);
  if (workspace_fd_ >= 0) close(workspace_fd_);
  workspace_fd_ = -1;
  host_id_.Release();  // its processes are gone: another session may take it
}

pid_t Sandbox::init_pid() const {
  std::lock_guard lock(instance_mu_);
  return instance_ ? instance_->init_pid.load() : 0;
}

bool Sandbox::has_pids_cgroup() const {
  std::lock_guard lock(instance_mu_);
  return instance_ && !instance_->pids_cgroup.empty();
}

std::vector<std::string> Sandbox::cgroup_dirs() const {
  std::lock_guard lock(instance_mu_);
  std::vector<std::string> dirs;
  if (instance_) {
    for (const auto& d : {instance_->pids_cgroup, instance_->memory_cgroup})
      if (!d.empty()) dirs.push_back(d);
  }
  return dirs;
}

bool Sandbox::has_memory_cgroup() const {
  std::lock_guard lock(instance_mu_);
  return instance_ && !instance_->memory_cgroup.empty();
}

}  // namespace agentvfs::sandbox
