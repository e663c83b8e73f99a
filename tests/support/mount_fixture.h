// Test support for everything that needs a real directory or a real FUSE
// mount: temporary directories that clean up after themselves, a running
// `agentvfs mount` child process (MountedView) that is always unmounted, and
// a helper to run other programs (git, tar) with a timeout.
//
// Unmount guarantees, in order of the failure they cover:
//   - a test that finishes (or fails an ASSERT) destroys its MountedView,
//     which stops the child and unmounts;
//   - a test binary that exits while a view is alive (exit(), a fatal gtest
//     failure) unmounts every mount point it started from an atexit handler
//     and a gtest Environment;
//   - a test binary that crashes or is killed: the child was started with
//     PR_SET_PDEATHSIG=SIGTERM, so it unmounts itself.
// Not thread-safe: start and stop views from the test's main thread (the
// death signal is tied to the thread that forked the child).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/result_matchers.h"

namespace agentvfs::testing {

// A directory made with mkdtemp under /tmp and removed recursively (without
// crossing into other filesystems, e.g. a FUSE mount) when destroyed.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "agentvfs-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + rel.
  std::string Sub(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// Removes `path` and everything below it, staying on `path`'s filesystem.
// Returns false (and leaves what it could not remove) on failure.
bool RemoveTree(const std::string& path);

// One `agentvfs mount --workspace WORKSPACE MOUNTPOINT ...` child process.
class MountedView {
 public:
  // Starts the mount in the foreground as a child process and waits (up to
  // 15 s) until a new mount appears at `mountpoint`. On failure returns null
  // and, if `error` is given, stores why (with the child's log).
  static std::unique_ptr<MountedView> Start(
      const std::string& workspace, const std::string& mountpoint,
      std::vector<std::string> extra_args = {}, std::string* error = nullptr);

  // Stops the child and makes sure the mount is gone.
  ~MountedView();
  MountedView(const MountedView&) = delete;
  MountedView& operator=(const MountedView&) = delete;

  // Sends `signo`, waits up to 10 s for the child to exit, then falls back to
  // `fusermount3 -u -z` and SIGKILL. Returns the child's exit status (0-255)
  // when it exited, 128 + signal when a signal killed it. Idempotent: later
  // calls return the same value.
  int Stop(int signo = SIGTERM);

  const std::string& mountpoint() const { return mountpoint_; }
  const std::string& workspace() const { return workspace_; }
  pid_t pid() const { return pid_; }
  // Everything the child wrote to stdout and stderr so far.
  std::string Log() const;

  // True when `path` is a mount point in /proc/self/mountinfo.
  static bool IsMounted(const std::string& path);
  // How many mounts are stacked at `path` (0 when none).
  static size_t MountCount(const std::string& path);
  // Filesystem type of the topmost mount at `path` ("fuse.agentvfs"), or
  // nullopt when nothing is mounted there.
  static std::optional<std::string> MountType(const std::string& path);

 private:
  MountedView() = default;

  std::string workspace_;
  std::string mountpoint_;
  std::string log_path_;
  pid_t pid_ = -1;
  int mount_id_ = -1;  // our mount's id in /proc/self/mountinfo
  std::optional<int> exit_status_;
};

// Arranges for `mountpoint` to be lazily unmounted when the test binary
// exits, if it is still mounted then. MountedView does this itself; tests
// that mount by other means (e.g. --background) call it directly.
void UnmountAtExit(const std::string& mountpoint);

// `fusermount3 -u -z mountpoint`; true when it is not mounted afterwards.
bool LazyUnmount(const std::string& mountpoint);

struct CommandResult {
  int exit_status = -1;  // 0-255, 128+signal, or -1 when it could not run
  std::string output;    // stdout and stderr, interleaved
  bool timed_out = false;
};

struct CommandOptions {
  std::string cwd;  // "" = the current directory
  // Environment overrides applied on top of the test's environment.
  std::map<std::string, std::string> env;
  std::chrono::milliseconds timeout{120'000};
};

// Runs argv[0] (looked up in PATH) with stdin from /dev/null.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         const CommandOptions& options = {});

}  // namespace agentvfs::testing
