// Sandbox: where a session's commands run. One Sandbox per session holds
//   - the session's view: the routed filesystem (normally a Router with
//     /memories and /skills from the store, as the session's user) served
//     over FUSE at <session dir>/view by a server thread of this process;
//   - a long-lived bubblewrap sandbox (new user, mount, pid, net, ipc, uts
//     and cgroup namespaces; no network; read-only /usr and a small allowlist
//     of /etc; private /tmp and HOME; the workspace directory bound read-write
//     at /workspace; <view>/memories and <view>/skills bound at /memories and
//     /skills; nothing else of the host) whose first process,
//     agentvfs-sandbox-init, starts each command with a cleared environment
//     and the command's limits.
// A command that outlives its wall-clock timeout takes the whole sandbox with
// it (every process in it, however it was forked, since they all live in the
// sandbox's pid namespace); so does a sandbox killed from outside. Either way
// the next command starts a fresh sandbox; the workspace, being the host's
// directory, keeps its files. Close() (or the destructor) ends the session:
// no process, mount or temporary directory remains. See docs/sandbox.md.
//
// Processes inside run as uid/gid `SandboxOptions::uid/gid` of a new user
// namespace, which maps them to an unprivileged host uid/gid: this process's
// own when it is not root; as root, one picked per session (never 0: a
// capability-less host root could still write /proc/sys and use root's
// keyrings). The workspace is then bound through an idmapped mount and the
// view maps owners, so that the files root made are the sandbox user's, as
// on a local disk. They hold no capability outside their namespace and may
// not create user namespaces of their own.
//
// Thread safety: Run and RunTerminal may be called from several threads; a
// session runs one command at a time (calls wait their turn).
//
// Errors (vfs::Error codes): EINVAL for a bad command or cwd, ENOENT when the
// command is not found inside, ENOEXEC/EACCES when it cannot be executed,
// EMSGSIZE for a command line over 512 KiB, EIO with a message when the
// sandbox cannot be started (bwrap missing: say to run scripts/install-deps).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/sandbox/host_ids.h"
#include "vfs/backend.h"
#include "vfs/caller.h"
#include "vfs/error.h"

namespace agentvfs::sandbox {

// Where root's per-session host ids for sandboxes start.
inline constexpr uint32_t kHostIdBase = 0x60000000;

// Per-command limits. 0 means "no limit" for every field.
struct Limits {
  double timeout_s = 120;           // wall clock; then the sandbox is killed
  uint64_t cpu_s = 300;             // CPU seconds per process (RLIMIT_CPU)
  uint64_t memory = 4ull << 30;     // bytes: per process (RLIMIT_DATA) and,
                                    // with a memory cgroup, the whole sandbox
  uint64_t processes = 512;         // pids cgroup, else RLIMIT_NPROC
  uint64_t file_size = 8ull << 30;  // bytes per file written (RLIMIT_FSIZE)
  uint64_t open_files = 4096;       // RLIMIT_NOFILE
  uint64_t output_cap = 1 << 20;    // bytes kept of stdout and of stderr each
};

// Parses "512", "64K", "1.5G" (powers of 1024) into bytes; EINVAL otherwise.
vfs::Result<uint64_t> ParseSize(const std::string& text);

struct SandboxOptions {
  std::string workspace;  // host directory bound read-write at /workspace
  // Served over FUSE; its /memories and /skills are bound into the sandbox.
  // Null: the sandbox has empty read-only /memories and /skills.
  vfs::Backend* view = nullptr;
  vfs::Caller identity;  // the session's user, for the view
  // Where the session directory is made (default: $XDG_RUNTIME_DIR, else
  // $TMPDIR, else /tmp).
  std::string state_dir;
  std::string bwrap = "bwrap";
  // agentvfs-sandbox-init; default: $AGENTVFS_SANDBOX_INIT, else next to the
  // running binary, else ../libexec/agentvfs/, else the build tree's.
  std::string init_path;
  uid_t uid = 1000;  // identity inside the sandbox
  gid_t gid = 1000;
  // Host identity of the sandbox's processes (see above). As root, the
  // default is an id reserved for the session (host_ids.h): kHostIdBase plus
  // a random 16-bit number that no other live session, account or process
  // has.
  std::optional<uid_t> host_uid;
  std::optional<gid_t> host_gid;
  std::string user_name = "agent";
  std::string hostname = "sandbox";
  // Host paths made visible read-only at the same place (e.g. /opt/tools).
  std::vector<std::string> extra_ro_binds;
  // Host files the sandbox must never see: the store's database (with its
  // -wal, -shm and -journal), the token file, the config file with an API
  // key. Create refuses (EINVAL) when one of them lies in the workspace, an
  // extra bind or the system directories bound into the sandbox.
  std::vector<std::string> secret_paths;
  Limits limits;  // defaults for commands that name none
};

struct Command {
  std::vector<std::string> argv;  // argv[0] is searched in the sandbox's PATH
  // Working directory inside the sandbox: /workspace (default), /memories,
  // /skills or a directory below them.
  std::string cwd;
  // Added to the sandbox's environment (PATH, HOME, LANG, TERM, ...).
  std::map<std::string, std::string> env;
  std::string stdin_data;  // fed to stdin, then EOF (empty: /dev/null)
  std::optional<Limits> limits;
};

struct Output {
  std::string text;    // what was kept, with a note where bytes were cut
  uint64_t total = 0;  // bytes the command wrote
  uint64_t cut = 0;    // bytes not kept (total - kept)
};

struct CommandResult {
  int exit_code = -1;          // when it exited
  int signal = 0;              // when a signal ended it (SIGKILL on timeout)
  bool timed_out = false;      // the timeout killed the sandbox
  bool fresh_sandbox = false;  // this command started a new sandbox
  double seconds = 0;          // wall clock from start to end
  Output out, err;
  // "exit 0", "killed by SIGKILL (signal 9)", "timed out after 5 s; ..."
  std::string Describe() const;
};

class Sandbox {
 public:
  // Makes the session directory and mounts the view; the sandbox itself
  // starts with the first command.
  static vfs::Result<std::unique_ptr<Sandbox>> Create(SandboxOptions options);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Runs `cmd` and captures its output; starts a sandbox first if there is
  // none or the last one died. A command that fails to start is an error;
  // one that runs and fails is a result with its exit code or signal.
  vfs::Result<CommandResult> Run(const Command& cmd);

  // Runs `cmd` on a terminal made inside the sandbox, relaying its bytes to
  // and from `in_fd`/`out_fd` (normally the person's terminal) until it
  // exits. `winch_fd`, when >= 0, becomes readable when the person's window
  // size changed (read from in_fd's terminal). Output is not captured.
  vfs::Result<CommandResult> RunTerminal(const Command& cmd, int in_fd,
                                         int out_fd, int winch_fd = -1);

  // Starts the sandbox now if it is not running (Run does it on demand).
  vfs::Status Start();
  // Kills every process of the sandbox (the next command gets a fresh one).
  void Kill();
  // Ends the session: kills the sandbox, unmounts the view, removes the
  // session directory. Idempotent; the Sandbox is unusable afterwards.
  void Close();

  // Host pid of the sandbox's init (0 when none is running), for tests.
  pid_t init_pid() const;
  const std::string& session_dir() const { return dir_; }
  // Host uid/gid of the sandbox's processes.
  uid_t host_uid() const { return host_uid_; }
  gid_t host_gid() const { return host_gid_; }
  // Whether processes are counted by a pids cgroup and memory is capped for
  // the whole sandbox by a memory cgroup (else per-process rlimits only).
  bool has_pids_cgroup() const;
  bool has_memory_cgroup() const;
  // The running sandbox's cgroup directories (empty when none), for tests.
  std::vector<std::string> cgroup_dirs() const;

  class Instance;  // one running bwrap sandbox
  class Launcher;  // the thread that forks bwrap

 private:
  explicit Sandbox(SandboxOptions options);
  vfs::Status MountView();
  vfs::Status EnsureRunning(bool* fresh);
  vfs::Result<CommandResult> RunLocked(const Command& cmd, int in_fd,
                                       int out_fd, int winch_fd, bool tty);

  SandboxOptions options_;
  std::string dir_;  // the session directory (mode 0700)
  std::string init_path_;
  uid_t host_uid_ = 0;
  gid_t host_gid_ = 0;
  bool drop_ = false;      // root running the sandbox as host_uid_
  HostIdLease host_id_;    // the picked host id, held until Close()
  std::string workspace_;  // what is bound at /workspace
  // The workspace directory as checked (O_PATH), opened once: what is
  // bound is that directory, not whatever its path names later.
  int workspace_fd_ = -1;
  vfs::Status MapWorkspace();
  // Lock order: run_mu_, then instance_mu_.
  std::mutex run_mu_;  // one command at a time; guards view_ and the rest
  mutable std::mutex
      instance_mu_;  // guards the instance_ pointer (Kill() reads it)
  std::unique_ptr<Instance> instance_;
  std::unique_ptr<Launcher> launcher_;
  void DropInstance();  // kills and reaps the running sandbox, if any
  struct View;
  std::unique_ptr<View> view_;
  uint64_t next_id_ = 1;
  unsigned generation_ = 0;  // sandboxes started so far
  bool closed_ = false;
};

}  // namespace agentvfs::sandbox
