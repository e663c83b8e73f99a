// agentvfs-sandbox-init: the first process (pid 1) inside a bubblewrap
// sandbox. It runs each command the host sends over the control socket (see
// protocol.h) as its own session with the requested limits, reports when it
// started and how it ended, and reaps every orphan. When the host goes away
// (the socket closes) it exits, and with it, as pid 1 of the sandbox's pid
// namespace, every process left in the sandbox.
//
// It holds nothing secret, but the control socket lets it report results, so
// it makes itself non-dumpable: commands of the same uid cannot ptrace it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/sandbox/protocol.h"

namespace {

using agentvfs::sandbox::RecvPacket;
using agentvfs::sandbox::SendPacket;
using nlohmann::json;

int g_sock = -1;
std::map<pid_t, uint64_t> g_running;  // command pid -> request id

// Child side of a failed start: tells the init why, then exits.
// As ChildFail, without the heap (for use after the limits are set).
[[noreturn]] void ChildFailText(int report_fd, int err, const char* what) {
  char msg[1100];
  int n = std::snprintf(msg, sizeof msg, "%d %s", err, what);
  if (n > 0) {
    ssize_t ignored =
        write(report_fd, msg, std::min(static_cast<size_t>(n), sizeof msg - 1));
    (void)ignored;
  }
  _exit(127);
}

[[noreturn]] void ChildFail(int report_fd, int err, const std::string& what) {
  std::string msg = std::to_string(err) + " " + what;
  ssize_t ignored = write(report_fd, msg.data(), msg.size());
  (void)ignored;
  _exit(127);
}

void SetLimit(int resource, const json& limits, const char* key) {
  if (!limits.is_object() || !limits.contains(key)) return;
  const json& v = limits[key];
  if (!v.is_number_unsigned() || v.get<uint64_t>() == 0) return;
  rlim_t value = v.get<uint64_t>();
  rlimit rl{value, value};
  // Over the CPU limit the kernel first sends SIGXCPU, then SIGKILL a second
  // later: the hard limit one above the soft one gives programs the chance to
  // report.
  if (resource == RLIMIT_CPU) rl.rlim_max = value + 1;
  setrlimit(resource, &rl);
}

void StartCommand(const json& req, std::vector<int>& fds) {
  uint64_t id = req.value("id", uint64_t{0});
  auto fail = [&](int err, const std::string& message) {
    SendPacket(
        g_sock,
        {{"op", "failed"}, {"id", id}, {"errno", err}, {"message", message}});
  };
  std::vector<std::string> argv, env;
  try {
    argv = req.at("argv").get<std::vector<std::string>>();
    env = req.at("env").get<std::vector<std::string>>();
  } catch (const std::exception&) {
    fail(EINVAL, "malformed request");
    return;
  }
  std::string cwd = req.value("cwd", std::string("/workspace"));
  bool tty = req.value("tty", false);
  if (argv.empty()) {
    fail(EINVAL, "empty command");
    return;
  }
  if (!tty && fds.size() != 3) {
    fail(EINVAL, "expected stdin, stdout and stderr");
    return;
  }
  int master = -1;
  std::string slave_name;
  if (tty) {
    master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
      fail(errno, "cannot open a terminal");
      if (master >= 0) close(master);
      return;
    }
    char name[128];
    if (ptsname_r(master, name, sizeof(name)) != 0) {
      fail(errno, "cannot name the terminal");
      close(master);
      return;
    }
    slave_name = name;
    winsize ws{};
    ws.ws_row = static_cast<unsigned short>(req.value("rows", 24));
    ws.ws_col = static_cast<unsigned short>(req.value("cols", 80));
    ioctl(master, TIOCSWINSZ, &ws);
  }
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    fail(errno, "pipe");
    if (master >= 0) close(master);
    return;
  }
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(report[0]);
    close(report[1]);
    if (master >= 0) close(master);
    fail(err, "fork");
    return;
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    if (tty) {
      int slave = open(slave_name.c_str(), O_RDWR);
      if (slave < 0) ChildFail(report[1], errno, "open terminal");
      ioctl(slave, TIOCSCTTY, 0);
      for (int i = 0; i < 3; ++i) dup2(slave, i);
      if (slave > 2) close(slave);
    } else {
      for (int i = 0; i < 3; ++i) {
        if (dup2(fds[i], i) < 0) ChildFail(report[1], errno, "dup2");
      }
    }
    const json limits = req.value("limits", json::object());
    SetLimit(RLIMIT_CPU, limits, "cpu_s");
    SetLimit(RLIMIT_DATA, limits, "memory");
    SetLimit(RLIMIT_NPROC, limits, "processes");
    SetLimit(RLIMIT_FSIZE, limits, "file_size");
    SetLimit(RLIMIT_NOFILE, limits, "open_files");
    if (chdir(cwd.c_str()) != 0) {
      // No heap from here on (see below): the limits may leave none.
      const int err = errno;
      char why[1024];
      std::snprintf(why, sizeof why, "cannot change to directory %s: %s",
                    cwd.c_str(), std::strerror(err));
      ChildFailText(report[1], err, why);
    }
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    // execvp searches the PATH of `environ`: the command's own.
    environ = cenv.data();
    execvp(cargv[0], cargv.data());
    int err = errno;
    // Say why, as a shell would: a file named by path that exists but does
    // not run is not "not found". No heap from here on: the limits above
    // (RLIMIT_DATA) may leave none.
    struct stat st;
    const char* cmd = cargv[0];
    const bool named_file =
        std::strchr(cmd, '/') != nullptr && stat(cmd, &st) == 0;
    char why[1024];
    if (err == ENOENT && !named_file) {
      std::snprintf(why, sizeof why, "command not found: %s", cmd);
    } else if (err == ENOENT) {
      std::snprintf(why, sizeof why,
                    "cannot run %s: its interpreter (the #! line) or a "
                    "library it needs was not found",
                    cmd);
    } else if (err == EACCES && named_file && S_ISDIR(st.st_mode)) {
      std::snprintf(why, sizeof why, "cannot run %s: it is a directory", cmd);
    } else if (err == EACCES) {
      std::snprintf(why, sizeof why,
                    "cannot run %s: permission denied (is it executable? "
                    "chmod +x, or run it with its interpreter, e.g. sh %s)",
                    cmd, cmd);
    } else if (err == ENOEXEC) {
      std::snprintf(why, sizeof why,
                    "cannot run %s: not an executable format (a script "
                    "needs a #! line, or run it with its interpreter)",
                    cmd);
    } else {
      std::snprintf(why, sizeof why, "cannot run %s: %s", cmd,
                    std::strerror(err));
    }
    ChildFailText(report[1], err, why);
  }
  close(report[1]);
  if (master >= 0) {
    // The child opened the slave by name; the init keeps no copy of it.
  }
  for (int fd : fds) close(fd);
  fds.clear();
  char buf[512];
  ssize_t n;
  do {
    n = read(report[0], buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n > 0) {
    buf[n] = '\0';
    int err = atoi(buf);
    const char* space = strchr(buf, ' ');
    fail(err == 0 ? EIO : err, space ? space + 1 : "cannot start");
    if (master >= 0) close(master);
    int status;
    waitpid(pid, &status, 0);
    return;
  }
  g_running[pid] = id;
  std::vector<int> out_fds;
  if (master >= 0) out_fds.push_back(master);
  SendPacket(g_sock, {{"op", "started"}, {"id", id}, {"pid", pid}}, out_fds);
  if (master >= 0) close(master);
}

void ReapChildren() {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    auto it = g_running.find(pid);
    if (it == g_running.end()) continue;  // an orphan that ended
    SendPacket(g_sock,
               {{"op", "exited"}, {"id", it->second}, {"status", status}});
    g_running.erase(it);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr,
            "usage: agentvfs-sandbox-init CONTROL_FD (run by agentvfs)\n");
    return 2;
  }
  g_sock = atoi(argv[1]);
  if (fcntl(g_sock, F_SETFD, FD_CLOEXEC) != 0) {
    perror("agentvfs-sandbox-init: control socket");
    return 2;
  }
  // Nothing else bwrap left open reaches the sandbox's commands: a
  // descriptor of a host directory (the workspace's, which bwrap bound
  // with --bind-fd) would lead out of the sandbox through its "..".
  if (g_sock > 3) syscall(SYS_close_range, 3, g_sock - 1, 0);
  syscall(SYS_close_range, g_sock + 1, ~0U, 0);
  prctl(PR_SET_DUMPABLE, 0);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    perror("agentvfs-sandbox-init: signalfd");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (SendPacket(g_sock, {{"op", "ready"}}) != 0) return 1;
  for (;;) {
    pollfd p[2] = {{g_sock, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (p[1].revents & POLLIN) {
      signalfd_siginfo si;
      while (read(sfd, &si, sizeof(si)) > 0) {
      }
      ReapChildren();
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      json req;
      std::vector<int> fds;
      int err = RecvPacket(g_sock, &req, &fds);
      if (err == ECONNRESET || err == ENOTCONN || err == EBADF) return 0;
      if (err != 0) continue;
      try {
        if (req.value("op", "") == "exec") StartCommand(req, fds);
      } catch (const std::exception& e) {
        // A field of the wrong type: the request is refused, the init goes on.
        uint64_t id = 0;
        if (req.contains("id") && req["id"].is_number_unsigned())
          id = req["id"].get<uint64_t>();
        SendPacket(g_sock, {{"op", "failed"},
                            {"id", id},
                            {"errno", EINVAL},
                            {"message",
                             std::string("malformed request: ") + e.what()}});
      }
      for (int fd : fds) close(fd);
      // A command that ended while this one started is reaped now.
      ReapChildren();
    }
  }
}
