// `agentvfs exec [options] -- CMD ARGS...` runs one command in a fresh
// session's sandbox and passes on its output and exit status;
// `agentvfs shell` opens an interactive shell there for a person. Both serve
// /memories and /skills as the user whose token is given (when a store is
// named) and bind --workspace at /workspace.
#include "cli/exec_command.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "backends/sandbox/sandbox.h"
#include "cli/signal_guard.h"
#include "cli/store_access.h"
#include "router/router.h"

namespace agentvfs::cli {
namespace {

struct ExecArgs {
  std::string workspace;
  StoreFlags store;
  bool no_store = false;
  std::string cwd;
  std::vector<std::string> env;
  double timeout = -1;
  double cpu = -1;
  std::string memory, file_size, output_cap;
  long processes = -1;
  bool pass_stdin = false;
  std::vector<std::string> command;
};

// The most of stdout and of stderr `exec` keeps in memory each.
constexpr uint64_t kMaxCap = uint64_t{1} << 30;

vfs::Result<sandbox::Limits> LimitsFrom(const ExecArgs& a, bool interactive) {
  sandbox::Limits l;
  if (interactive) l.timeout_s = 0;  // a person's shell has no wall clock
  l.output_cap = 16ull << 20;        // a person reads it; keep more
  for (double v : {a.timeout, a.cpu}) {
    if (!std::isfinite(v))
      return vfs::Fail(EINVAL,
                       "--timeout and --cpu want a number of seconds "
                       "(0 for none), not " +
                           std::to_string(v));
  }
  if (a.timeout >= 0) l.timeout_s = a.timeout;
  // RLIMIT_CPU counts whole seconds; a fraction rounds up (0 means none).
  if (a.cpu >= 0) l.cpu_s = static_cast<uint64_t>(std::ceil(a.cpu));
  if (a.processes >= 0) l.processes = static_cast<uint64_t>(a.processes);
  for (auto [text, field] :
       {std::pair{&a.memory, &l.memory}, std::pair{&a.file_size, &l.file_size},
        std::pair{&a.output_cap, &l.output_cap}}) {
    if (text->empty()) continue;
    auto v = sandbox::ParseSize(*text);
    if (!v) return std::unexpected(v.error());
    *field = *v;
  }
  // 0 is a limit here, not "none": a --memory or --output-cap of 0 let a
  // command take all the memory (the output is kept in this process's, so
  // `yes` grew it by 400 MB a second).
  if (!a.memory.empty() && l.memory == 0)
    return vfs::Fail(EINVAL, "--memory must be more than 0 (default 4G)");
  if (!a.output_cap.empty() && (l.output_cap == 0 || l.output_cap > kMaxCap))
    return vfs::Fail(EINVAL,
                     "--output-cap must be from 1 byte to 1G (the output is "
                     "kept in memory until the command ends); write larger "
                     "output to a file in /workspace");
  return l;
}


int RunInSandbox(const ExecArgs& a, bool interactive) {
  const char* cmd_name = interactive ? "shell" : "exec";
  auto limits = LimitsFrom(a, interactive);
  if (!limits) return Report(cmd_name, limits.error());
  sandbox::Command command;
  command.argv = a.command;
  if (interactive && command.argv.empty()) command.argv = {"/bin/bash", "-l"};
  if (command.argv.empty())
    return Report(cmd_name,
                  vfs::Error{EINVAL,
                             "no command given; write it after --, "
                             "e.g. agentvfs exec --workspace ws -- ls"});
  command.cwd = a.cwd;
  command.limits = *limits;
  for (const auto& kv : a.env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return Report(
          cmd_name,
          vfs::Error{EINVAL, "--env takes NAME=VALUE, not '" + kv + "'"});
    command.env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (interactive) {
    if (!isatty(0))
      return Report(cmd_name,
                    vfs::Error{EINVAL,
                               "needs a terminal (standard input is not "
                               "one); use "
                               "`agentvfs exec -- CMD` from scripts"});
    if (const char* term = std::getenv("TERM")) command.env["TERM"] = term;
  }
  if (a.pass_stdin && !interactive) {
    // Read whole before the command starts, so bounded: endless input
    // (`yes | agentvfs exec --stdin ...`) is an error, not a process that
    // grows until memory runs out.
    constexpr size_t kMaxStdin = size_t{64} << 20;
    char buf[65536];
    while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) {
      command.stdin_data.append(buf, static_cast<size_t>(std::cin.gcount()));
      if (command.stdin_data.size() > kMaxStdin)
        return Report(cmd_name,
                      vfs::Error{EFBIG,
                                 "--stdin takes at most 64 MiB, read before "
                                 "the command starts; put larger input in a "
                                 "file in the workspace and read it there"});
    }
  }

  // Before any thread starts (the store's, the view's, the sandbox's), so
  // that every thread blocks the stop signals and the guard's thread gets
  // them (one that did not block them would let SIGINT kill the process
  // with the sandbox and mounts left behind).
  SignalGuard signals;
  sandbox::SandboxOptions options;
  options.workspace = a.workspace;
  options.limits = *limits;
  options.secret_paths = SecretFiles(a.store);
  auto view = std::make_unique<router::Router>();
  bool with_store = !a.no_store && (!a.store.store.empty() ||
                                    ResolveStoreName(a.store).has_value());
  if (with_store) {
    auto session = OpenStoreAsUser(a.store, cmd_name);
    if (!session) return Report(cmd_name, session.error());
    options.identity = session->caller;
    vfs::Backend* store = view->Adopt(std::move(session->backend));
    router::MountOptions full_paths;
    full_paths.strip_prefix = false;
    for (const char* prefix : {"/memories", "/skills"}) {
      if (auto ok = view->Mount(prefix, store, full_paths); !ok)
        return Report(cmd_name, ok.error());
    }
    options.view = view.get();
  } else if (!a.no_store) {
    std::cerr << "agentvfs " << cmd_name
              << ": no store named (--store, $AGENTVFS_STORE or the config "
                 "file): /memories and /skills are empty\n";
  }

  auto sb = sandbox::Sandbox::Create(options);
  if (!sb) return Report(cmd_name, sb.error());
  if (!a.memory.empty() && !(*sb)->has_memory_cgroup())
    std::cerr << "agentvfs " << cmd_name
              << ": warning: no memory cgroup here (run as root on cgroup "
                 "v2 for one): --memory limits each process's own data "
                 "only, not shared memory (/dev/shm, memfd) nor the sandbox "
                 "as a whole\n";
  signals.SetTarget(sb->get());
  if (signals.signal() != 0) {  // interrupted while the session was made
    signals.SetTarget(nullptr);
    (*sb)->Close();
    return 128 + signals.signal();
  }

  vfs::Result<sandbox::CommandResult> result;
  if (interactive) {
    termios saved{};
    bool raw = tcgetattr(0, &saved) == 0;
    if (raw) {
      termios t = saved;
      cfmakeraw(&t);
      tcsetattr(0, TCSANOW, &t);
    }
    result = (*sb)->RunTerminal(command, 0, 1, signals.winch_fd());
    if (raw) tcsetattr(0, TCSANOW, &saved);
  } else {
    result = (*sb)->Run(command);
  }
  signals.SetTarget(nullptr);
  (*sb)->Close();
  if (!result) return Report(cmd_name, result.error());
  bool cut = false;
  if (!interactive) {
    std::cout << result->out.text << std::flush;
    std::cerr << result->err.text << std::flush;
    // The cut is marked in the output itself, which a redirect into a file
    // hides: say so where a person looks, and fail a command that
    // otherwise succeeded (its output is not what it wrote).
    for (auto [name, o] : {std::pair{"stdout", &result->out},
                           std::pair{"stderr", &result->err}}) {
      if (o->cut == 0) continue;
      cut = true;
      std::cerr << "agentvfs " << cmd_name << ": " << o->cut << " bytes of "
                << name << " were cut out (--output-cap " << limits->output_cap
                << " bytes each); write large output to a file in "
                   "/workspace\n";
    }
  }
  if (signals.signal() != 0) {
    std::cerr << "agentvfs " << cmd_name << ": interrupted; the sandbox was "
              << "stopped\n";
    return 128 + signals.signal();
  }
  if (result->timed_out) {
    std::cerr << "agentvfs " << cmd_name << ": " << result->Describe() << "\n";
    return 124;
  }
  if (result->signal != 0) {
    std::cerr << "agentvfs " << cmd_name << ": the command was "
              << result->Describe() << "\n";
    return 128 + result->signal;
  }
  return result->exit_code == 0 && cut ? 1 : result->exit_code;
}

void AddCommonFlags(CLI::App* cmd, ExecArgs* args) {
  cmd->add_option("--workspace", args->workspace,
                  "Host directory bound read-write at /workspace")
      ->required()
      ->check(CLI::ExistingDirectory);
  AddStoreFlags(cmd, &args->store);
  cmd->add_flag("--no-store", args->no_store,
                "Leave /memories and /skills empty even when a store is named");
  cmd->add_option("--cwd", args->cwd,
                  "Working directory inside: /workspace (default), "
                  "/memories, /skills or below");
  cmd->add_option("--env", args->env,
                  "NAME=VALUE added to the sandbox's environment (repeatable; "
                  "nothing of yours is passed otherwise)")
      // One NAME=VALUE per --env: otherwise CLI11 lets the list run on,
      // and `--env A=1 -- sh -c ...` lost the command's `-c`.
      ->allow_extra_args(false);
  cmd->add_option("--timeout", args->timeout,
                  "Wall-clock seconds before every process of the sandbox is "
                  "killed (0: none; exec default 120, shell none)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--cpu", args->cpu, "CPU seconds per process (default 300)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--memory", args->memory,
                  "Memory, e.g. 2G (per process; for the whole sandbox when a "
                  "memory cgroup is available; default 4G)");
  cmd->add_option("--processes", args->processes,
                  "Processes in the sandbox (default 512)")
      ->check(CLI::Range(1l, 1000000l));
  cmd->add_option("--file-size", args->file_size,
                  "Largest file a process may write, e.g. 1G (default 8G)");
}

}  // namespace

void AddExecCommands(CLI::App& app, int* exit_code) {
  auto exec_args = std::make_shared<ExecArgs>();
  auto* exec = app.add_subcommand(
      "exec",
      "Run a command in a sandbox (bubblewrap: no network, no credentials) "
      "that sees /workspace, /memories and /skills");
  AddCommonFlags(exec, exec_args.get());
  exec->add_option("--output-cap", exec_args->output_cap,
                   "Bytes of stdout and of stderr kept each, up to 1G "
                   "(default 16M; the middle is cut, with a note, and a "
                   "command that exited 0 then exits 1)");
  exec->add_flag("--stdin", exec_args->pass_stdin,
                 "Feed this command's standard input (up to 64 MiB, read "
                 "before the command starts) to the command (default: "
                 "/dev/null)");
  exec->add_option("command", exec_args->command, "The command, after --")
      ->required();
  exec->callback(
      [exec_args, exit_code] { *exit_code = RunInSandbox(*exec_args, false); });

  auto shell_args = std::make_shared<ExecArgs>();
  auto* shell = app.add_subcommand(
      "shell", "An interactive shell inside the agent's sandbox, for a person");
  AddCommonFlags(shell, shell_args.get());
  shell->add_option("command", shell_args->command,
                    "Program to run instead of bash -l, after --");
  shell->callback([shell_args, exit_code] {
    *exit_code = RunInSandbox(*shell_args, true);
  });
}

}  // namespace agentvfs::cli
