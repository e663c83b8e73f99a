// FuseServer: serves any vfs::Backend (normally the router) as a libfuse3
// low-level filesystem, for one agentvfs identity (user, session). The kernel
// does POSIX permission checks (`default_permissions`) against the modes and
// owners the backend reports; new files are given to the requesting uid/gid
// through the Caller passed to the backend.
//
// Inodes: the kernel addresses files by node id. FuseServer keeps a table
// node id -> (parent node id, name, lookup count); the path of a node is
// rebuilt from that chain, so renaming a directory renames everything under
// it at once. Node ids are never reused, so the generation is always 0. A node
// leaves the table when the kernel forgets its last lookup.
//
// Threads: requests are read by one thread (or by libfuse's multi-threaded
// loop with FuseOptions::threads > 1); fsync and fallocate, which can block
// for long, run on a small pool and reply from there. The node table is
// guarded by one mutex (table_mu_), never held while calling the backend, so
// there is no lock order to get wrong. Open files and directories
// are owned by heap objects whose pointer is the FUSE file handle; the kernel
// never uses a handle concurrently with its release.
//
// Change feed: while Run() serves, the server is the backend's
// ChangeListener (see vfs::Backend::SetChangeListener). A changed path is
// mapped to node ids through the node table and the kernel is told to drop
// the cached name, attributes and data (fuse_lowlevel_notify_inval_entry /
// _inval_inode), so that a change made by another process shows at once
// even with long cache timeouts. Those notifications can wait for kernel
// locks held by a request being served, so they are sent from one dedicated
// thread, never from a request thread or under table_mu_; duplicate paths
// queued meanwhile are sent once. The listener is unregistered (and the
// thread joined) when Run() returns and at unmount.
//
// No exception crosses into libfuse: every callback catches std::bad_alloc
// (ENOMEM) and anything else (EIO, logged).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vfs/backend.h"

namespace agentvfs::fuse {

struct FuseOptions {
  std::string mountpoint;
  bool allow_other = false;  // let other uids (a sandbox) use the mount
  bool debug = false;        // libfuse request tracing on stderr
  // Threads reading requests. 1 (the default) serves every request on one
  // thread, with only fsync and fallocate handed to a small pool: on a small
  // machine this halves the cost of a metadata round trip (no hand-off
  // between threads). More threads use libfuse's multi-threaded loop.
  unsigned threads = 1;
  // With one thread: how long to keep asking for the next request after
  // answering one before sleeping (saves a cross-CPU wake-up per request in
  // back-to-back sequences; 0 = sleep at once).
  unsigned poll_micros = 50;
  // Serve extended attributes. Off, the first xattr request of each kind is
  // answered ENOSYS, after which the kernel reports EOPNOTSUPP itself and
  // stops asking, also for the security.capability check it otherwise makes
  // before every write (one round trip per write(2) saved).
  bool xattrs = false;
  // Kernel batches small writes; but then it trusts its own file sizes, so
  // changes made beside the mount (the sandbox writing the workspace
  // directory directly) stay invisible while the inode is cached. Opt-in.
  bool writeback_cache = false;
  // FUSE passthrough (kernel 6.9+, CAP_SYS_ADMIN): reads, writes and mmap
  // of files whose backend has a host file descriptor (the workspace) go
  // from the kernel straight to the host file, without a round trip to the
  // daemon. Used when the kernel offers it and the writeback cache is off;
  // otherwise (or when the kernel refuses a file) the daemon serves I/O.
  bool passthrough = true;
  // FUSE over io_uring (Linux 6.14+): requests arrive on per-CPU queues
  // served by threads bound to each CPU (see uring_channel.h), which keeps a
  // round trip's two wake-ups on one CPU. Needs the fuse module parameter
  // enable_uring=Y, which Mount sets when it may (root) and otherwise
  // refuses with the command to run. FORGET, INTERRUPT and notifications
  // stay on /dev/fuse, served as `threads` says.
  bool io_uring = false;
  double entry_timeout = 1.0;  // seconds the kernel may cache names
  double attr_timeout = 1.0;   // seconds the kernel may cache attributes
  // Seconds the kernel may remember that a name does not exist; 0 (the
  // default) makes it ask again at every access. Worth raising only when
  // every change beside the mount arrives through the backend's change feed:
  // a file created behind the kernel's back stays invisible this long.
  double negative_timeout = 0.0;
  std::string fsname = "agentvfs";
  // Ownership as the mount's users see it: files the backend reports as
  // owned by stored_uid/stored_gid appear owned by shown_uid/shown_gid, and
  // requests from shown_uid/shown_gid act as stored_uid/stored_gid (new
  // files, chown). A sandbox running under an unprivileged uid thus owns,
  // as on a local disk, the files its user made as root.
  struct IdMap {
    uid_t stored_uid = 0, shown_uid = 0;
    gid_t stored_gid = 0, shown_gid = 0;
  };
  std::optional<IdMap> id_map;
  // Caller template: user and session of this view. uid/gid/pid are filled
  // per request from the FUSE request context.
  vfs::Caller identity;
};

// Checks that `path` can be used as a mount point: it exists, is a
// directory, and is not already a (possibly dead) mount. The error message
// says what to do.
vfs::Status CheckMountPoint(const std::string& path);

// True when `path` is a mount point listed in /proc/self/mountinfo.
bool IsMountPoint(const std::string& path);

class FuseServer {
 public:
  // Mounts `backend` (which must outlive the server) at options.mountpoint.
  static vfs::Result<std::unique_ptr<FuseServer>> Mount(vfs::Backend& backend,
                                                        FuseOptions options);
  FuseServer(const FuseServer&) = delete;
  FuseServer& operator=(const FuseServer&) = delete;
  // Unmounts if still mounted.
  ~FuseServer();

  // Installs handlers so SIGINT, SIGTERM and SIGHUP end Run() cleanly.
  vfs::Status HandleSignals();
  // Detaches from the terminal (fork; the parent exits once mounted).
  vfs::Status Daemonize();
  // Serves requests until unmounted or a handled signal arrives. While it
  // runs, the backend's change feed invalidates the kernel's caches (the
  // listener is registered here rather than at Mount because Daemonize()
  // forks, and threads do not survive a fork).
  vfs::Status Run();
  // Unmounts; further Run() calls return at once. Idempotent.
  void Unmount();

  class Impl;

 private:
  explicit FuseServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentvfs::fuse
