// `agentvfs mount [--workspace DIR] [--store STORE] MOUNTPOINT`: the routed
// view (/workspace from a host directory; /memories and /skills from the
// store, as the user whose token is given) served over FUSE.
#include "cli/mount_command.h"

#include <fcntl.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>

#include "backends/local_dir/local_dir.h"
#include "cli/store_access.h"
#include "router/router.h"
#include "vfs/fuse/fuse_frontend.h"
#include "vfs/mount_table.h"

namespace agentvfs::cli {
namespace {

struct MountArgs {
  std::string workspace;
  StoreFlags store;
  bool with_store = false;
  bool no_store = false;
  std::string commit_sync = "full";
  std::string mountpoint;
  bool background = false;
  bool allow_other = false;
  bool debug = false;
  bool writeback = false;
  bool no_passthrough = false;
  bool io_uring = false;
  double timeout = 1.0;
  unsigned threads = 1;
  unsigned poll_us = 50;
  bool xattrs = false;
  std::string log_file;
};

// Sends the mount's log (the server's, the store's, this command's) to the
// end of `file`, made 0600 if new: paths and user names are in it.
vfs::Status LogTo(const std::string& file) {
  int fd =
      ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return std::unexpected(vfs::FromErrno(errno, "open", file));
  ::close(fd);
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("", sink));
    for (const char* name : {"fuse", "store"}) {
      spdlog::drop(name);
      spdlog::register_logger(std::make_shared<spdlog::logger>(name, sink));
    }
    spdlog::flush_on(spdlog::level::info);
  } catch (const spdlog::spdlog_ex& e) {
    return vfs::Fail(EIO, "cannot log to " + file + ": " + e.what());
  }
  return {};
}

// `path` made absolute against the current directory (unchanged when it
// is absolute, empty, or a PostgreSQL URI).
std::string Absolute(const std::string& path) {
  if (path.empty() || path.starts_with("/") ||
      path.starts_with("postgresql://") || path.starts_with("postgres://"))
    return path;
  const bool sqlite = path.starts_with("sqlite:");
  std::string file = sqlite ? path.substr(7) : path;
  if (file.starts_with("/")) return path;
  std::error_code ec;
  auto abs = std::filesystem::absolute(file, ec);
  if (ec) return path;
  return (sqlite ? "sqlite:" : "") + abs.lexically_normal().string();
}

int RunMount(const MountArgs& given) {
  // --background's daemon runs in "/" (fuse_daemonize): every path it uses
  // later (the store, the token file, the mount point to unmount) is made
  // absolute now, while relative ones still mean what the user meant.
  MountArgs a = given;
  a.mountpoint = Absolute(a.mountpoint);
  a.store.token_file = Absolute(a.store.token_file);
  if (!a.log_file.empty()) {
    a.log_file = Absolute(a.log_file);
    if (auto ok = LogTo(a.log_file); !ok) return Report("mount", ok.error());
  }
  // CLI11's range check lets NaN through (every comparison with it is
  // false); the kernel would then keep names and attributes for good.
  if (std::isnan(a.timeout))
    return Report("mount", vfs::Error{EINVAL,
                                      "--cache-timeout must be a number of "
                                      "seconds from 0 to 31536000"});
  auto router = std::make_unique<router::Router>();
  vfs::Caller identity;
  if (!a.workspace.empty()) {
    // A view mounted inside its own workspace contains itself: looking up
    // the mount point's name in the workspace enters the view, and the
    // daemon waits on its own mount for good.
    std::error_code ec1, ec2;
    auto ws_real = std::filesystem::canonical(a.workspace, ec1);
    auto mnt_real = std::filesystem::canonical(a.mountpoint, ec2);
    if (!ec1 && !ec2 && ws_real != mnt_real &&
        mnt_real.string().starts_with(
            ws_real.string() == "/" ? "/" : ws_real.string() + "/")) {
      return Report("mount",
                    vfs::Error{EINVAL, "the mount point " + mnt_real.string() +
                                           " is inside the workspace " +
                                           ws_real.string() +
                                           ", so the view would contain "
                                           "itself; mount it outside"});
    }
    auto ws = backends::LocalDirBackend::Open(a.workspace);
    if (!ws) {
      std::cerr << "agentvfs mount: " << ws.error().message << "\n";
      return 2;
    }
    vfs::Backend* ws_backend = router->Adopt(std::move(*ws));
    if (auto ok = router->Mount("/workspace", ws_backend); !ok) {
      std::cerr << "agentvfs mount: " << ok.error().message << "\n";
      return 2;
    }
  }
  if (a.no_store &&
      (a.with_store || !a.store.store.empty() || !a.store.token_file.empty()))
    return Report("mount",
                  vfs::Error{EINVAL,
                             "--no-store serves no store: drop "
                             "--store, --with-store and --token-file"});
  if (a.no_store && a.workspace.empty())
    return Report("mount", vfs::Error{EINVAL,
                                      "--no-store needs --workspace: there "
                                      "would be nothing to serve"});
  bool with_store = !a.no_store && (a.with_store || !a.store.store.empty() ||
                                    (std::getenv("AGENTVFS_STORE") != nullptr &&
                                     *std::getenv("AGENTVFS_STORE") != '\0') ||
                                    a.workspace.empty());
  // With the writeback cache the kernel keeps the sizes of regular files it
  // has cached and never takes them from the daemon again: other sessions'
  // commits would not show, and an append would land over them.
  if (with_store && a.writeback)
    return Report(
        "mount",
        vfs::Error{EINVAL,
                   "--writeback-cache cannot serve a store: the kernel would "
                   "keep its own file sizes, so other sessions' commits "
                   "would not show and appends would overwrite them; drop "
                   "--writeback-cache, or add --no-store to serve /workspace "
                   "alone"});
  // The store by its absolute name, however it was named (flag,
  // AGENTVFS_STORE, config file).
  if (with_store)
    if (auto name = ResolveStoreName(a.store)) a.store.store = Absolute(*name);
  if (!with_store && !a.store.token_file.empty())
    return Report("mount", vfs::Error{EINVAL,
                                      "--token-file is for a store, and none "
                                      "is named: add --store STORE (or set "
                                      "AGENTVFS_STORE)"});
  // What is in a non-empty mount point would be hidden while mounted. (A
  // mount point that is mounted already gets its own refusal, below.)
  auto mounted_at = [](const std::string& dir) {
    std::error_code ec;
    auto real = std::filesystem::canonical(dir, ec);
    if (ec) return false;
    for (const auto& m : vfs::ReadMountTable())
      if (m.point == real.string()) return true;
    return false;
  };
  if (std::error_code ec; std::filesystem::is_directory(a.mountpoint, ec) &&
                          !std::filesystem::is_empty(a.mountpoint, ec) && !ec &&
                          !mounted_at(a.mountpoint))
    return Report(
        "mount",
        vfs::Error{EEXIST, a.mountpoint + " is not empty: mount on an empty "
                                          "directory (what is in it would be "
                                          "hidden while the view is mounted)"});
  // The store runs a thread (lease renewal, change feed) and records this
  // process as the holder of its leases. Neither survives the fork of
  // --background, so there the store is opened once to check it (a wrong
  // token or a missing store mounts nothing, and says so on the terminal),
  // closed, and opened for good in the daemon, before it serves a request.
  store::StoreOptions store_options;
  store_options.commit_durability = a.commit_sync == "normal"
                                        ? store::Durability::kProcess
                                        : store::Durability::kFull;
  auto serve_store = [&](bool check_only) -> vfs::Status {
    auto session = OpenStoreAsUser(a.store, "mount", store_options);
    if (!session) return std::unexpected(session.error());
    if (check_only || identity.user.empty()) {
      identity = session->caller;
    } else {
      session->caller = identity;  // the session the mount was made for
    }
    if (check_only) return {};
    vfs::Backend* store = router->Adopt(std::move(session->backend));
    router::MountOptions full_paths;
    full_paths.strip_prefix = false;
    for (const char* prefix : {"/memories", "/skills"}) {
      if (auto ok = router->Mount(prefix, store, full_paths); !ok) return ok;
    }
    spdlog::info("serving the store as user '{}' (session {})", identity.user,
                 identity.session);
    return {};
  };
  if (with_store) {
    if (auto ok = serve_store(/*check_only=*/a.background); !ok)
      return Report("mount", ok.error());
  }

  fuse::FuseOptions options;
  options.mountpoint = a.mountpoint;
  options.allow_other = a.allow_other;
  options.debug = a.debug;
  options.writeback_cache = a.writeback;
  options.passthrough = !a.no_passthrough;
  options.io_uring = a.io_uring;
  options.entry_timeout = a.timeout;
  options.attr_timeout = a.timeout;
  options.threads = a.threads;
  options.poll_micros = a.poll_us;
  options.xattrs = a.xattrs;
  options.identity = identity;
  // The kernel already applied the calling process's umask to every mode it
  // sends; the daemon must not apply its own on top.
  umask(0);
  auto server = fuse::FuseServer::Mount(*router, options);
  if (!server) {
    std::cerr << "agentvfs mount: " << server.error().message << "\n";
    return 1;
  }
  if (auto ok = (*server)->HandleSignals(); !ok) {
    std::cerr << "agentvfs mount: " << ok.error().message << "\n";
    return 1;
  }
  if (a.background) {
    if (auto ok = (*server)->Daemonize(); !ok) {
      std::cerr << "agentvfs mount: " << ok.error().message << "\n";
      return 1;
    }
    // In the daemon now: no request has been read yet.
    if (with_store) {
      if (auto ok = serve_store(/*check_only=*/false); !ok) {
        spdlog::error("cannot open the store in the background daemon: {}",
                      ok.error().message);
        (*server)->Unmount();
        return 1;
      }
    }
  } else {
    spdlog::info(
        "mounted the view at {} (Ctrl-C or `fusermount3 -u {}` to "
        "unmount)",
        a.mountpoint, a.mountpoint);
  }
  auto ran = (*server)->Run();
  (*server)->Unmount();
  if (!ran) {
    spdlog::error("{}", ran.error().message);
    return 1;
  }
  return 0;
}

}  // namespace

void AddMountCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<MountArgs>();
  auto* cmd = app.add_subcommand(
      "mount",
      "Mount the routed view (/workspace, /memories, /skills) with FUSE");
  cmd->add_option("--workspace", args->workspace,
                  "Host directory served as /workspace")
      ->check(CLI::ExistingDirectory);
  AddStoreFlags(cmd, &args->store);
  cmd->add_flag("--with-store", args->with_store,
                "Serve /memories and /skills from the store named by "
                "$AGENTVFS_STORE or the config file (implied by --store)");
  cmd->add_flag("--no-store", args->no_store,
                "Serve /workspace only, even when $AGENTVFS_STORE names a "
                "store");
  cmd->add_option("--commit-sync", args->commit_sync,
                  "full: every commit at close is fsynced (survives a power "
                  "cut; default); normal: it survives any process crash and "
                  "reaches the disk with the next fsync")
      ->check(CLI::IsMember({"full", "normal"}));
  cmd->add_option("mountpoint", args->mountpoint,
                  "Empty directory to mount the view on")
      ->required();
  cmd->add_flag("--background", args->background, "Detach once mounted");
  cmd->add_flag(
      "--allow-other", args->allow_other,
      "Let other users (e.g. a sandbox under another uid) use the mount");
  cmd->add_flag("--debug", args->debug, "Trace every FUSE request on stderr");
  cmd->add_option("--log-file", args->log_file,
                  "Append the mount's log to FILE instead of stderr (with "
                  "--background, the only place it goes): refused writes "
                  "and why (who holds the file, who changed it), errors");
  cmd->add_flag("--writeback-cache", args->writeback,
                "Let the kernel batch writes (faster small writes; changes "
                "made beside the mount may stay unseen)");
  cmd->add_flag("--no-passthrough", args->no_passthrough,
                "Serve workspace file I/O through the daemon instead of "
                "letting the kernel pass it through to the host file");
  cmd->add_flag("--io-uring", args->io_uring,
                "Take FUSE requests over io_uring, one queue per CPU (Linux "
                "6.14+; turns on the fuse module's enable_uring if root): "
                "cheaper metadata round trips");
  cmd->add_option("--cache-timeout", args->timeout,
                  "Seconds the kernel may cache names and attributes")
      ->check(CLI::Range(0.0, 31536000.0));
  cmd->add_option(
         "--threads", args->threads,
         "Threads reading FUSE requests (1: one thread plus a pool for fsync; "
         "more: libfuse's multi-threaded loop)")
      ->check(CLI::Range(1u, 256u));
  cmd->add_option(
         "--poll-us", args->poll_us,
         "Microseconds to wait awake for the next request before sleeping "
         "(one thread only; 0 sleeps at once)")
      ->check(CLI::Range(0u, 100000u));
  cmd->add_flag(
      "--xattr", args->xattrs,
      "Serve extended attributes (user.*); without it they are not "
      "supported (EOPNOTSUPP), which spares every write a round trip");
  cmd->callback([args, exit_code] { *exit_code = RunMount(*args); });
}

}  // namespace agentvfs::cli
