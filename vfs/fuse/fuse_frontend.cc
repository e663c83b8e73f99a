// libfuse3 low-level callbacks over a vfs::Backend: the node table, the
// translation of FUSE requests into Backend calls, and mount/unmount.
#define FUSE_USE_VERSION 314
#include "vfs/fuse/fuse_frontend.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <poll.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <stop_token>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "vfs/fuse/fuse_abi.h"
#include "vfs/fuse/uring_channel.h"
#include "vfs/mount_table.h"

namespace agentvfs::fuse {

using vfs::Attr;
using vfs::Caller;
using vfs::Error;
using vfs::Fail;
using vfs::Path;
using vfs::ReadMountTable;
using vfs::Result;
using vfs::Status;

std::shared_ptr<spdlog::logger> FuseLog() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto existing = spdlog::get("fuse");
    return existing ? existing : spdlog::stderr_logger_mt("fuse");
  }();
  return logger;
}

bool MessageBytes(const struct iovec* iov, int count, size_t off, void* buf,
                  size_t n, bool write) {
  for (int i = 0; i < count && n > 0; ++i) {
    size_t len = iov[i].iov_len;
    if (off >= len) {
      off -= len;
      continue;
    }
    size_t k = std::min(n, len - off);
    char* at = static_cast<char*>(iov[i].iov_base) + off;
    if (write) {
      std::memmove(at, buf, k);
    } else {
      std::memmove(buf, at, k);
    }
    buf = static_cast<char*>(buf) + k;
    n -= k;
    off = 0;
  }
  return n == 0;
}

namespace {

std::shared_ptr<spdlog::logger> Log() { return FuseLog(); }

// The server's own ESTALE reasons: the kernel answers them by looking the
// name up again, so nobody needs to read them.
constexpr const char* kLookAgain =
    "file was removed or renamed; look it up again";
constexpr const char* kReplacedBeside =
    "the file was replaced beside the mount while open here";

// Absolute form of `path` without requiring it to be reachable (a dead FUSE
// mount cannot be stat'ed, so realpath of the parent + the name is used).
std::string AbsoluteOf(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::string parent = ".", name = p;
  if (auto slash = p.rfind('/'); slash != std::string::npos) {
    parent = slash == 0 ? "/" : p.substr(0, slash);
    name = p.substr(slash + 1);
  }
  char buf[PATH_MAX];
  if (realpath(parent.c_str(), buf) == nullptr) return p;
  std::string out = buf;
  if (name.empty() || name == ".") return out;
  if (out != "/") out += "/";
  return out + name;
}

}  // namespace

namespace {

// "major:minor" of the filesystem mounted at `path` (the last mount there
// wins, as in path resolution), read from mountinfo without touching the
// mount itself, which may not be served yet.
std::optional<std::string> MountDevice(const std::string& path) {
  const std::string abs = AbsoluteOf(path);
  std::optional<std::string> found;
  for (const auto& m : ReadMountTable())
    if (m.point == abs) found = m.device;
  return found;
}

// Raises the kernel's readahead window of our own mount (capped at 128 KiB
// for FUSE unless set through sysfs), so cold sequential reads ask the
// daemon for large blocks ahead of the reader. Best effort: needs root.
void RaiseReadahead(const std::string& mountpoint, unsigned kib) {
  auto dev = MountDevice(mountpoint);
  if (!dev) return;
  std::ofstream ra("/sys/class/bdi/" + *dev + "/read_ahead_kb");
  if (ra) ra << kib << "\n";
  if (!ra)
    Log()->debug("cannot raise readahead of {} (bdi {})", mountpoint, *dev);
}

// Aborts the FUSE connection of the mount at `mountpoint` through FUSE's
// control filesystem (mounted here if nothing had, as root): every request
// still waiting fails with ECONNABORTED, and a notification waiting for one
// returns. False when that was not possible.
bool AbortConnection(const std::string& mountpoint) {
  auto dev = MountDevice(mountpoint);
  if (!dev) return false;
  const auto colon = dev->find(':');
  if (colon == std::string::npos || dev->substr(0, colon) != "0") return false;
  const std::string control = "/sys/fs/fuse/connections";
  const std::string abort = control + "/" + dev->substr(colon + 1) + "/abort";
  if (access(abort.c_str(), W_OK) != 0)
    mount("fusectl", control.c_str(), "fusectl", 0, nullptr);
  std::ofstream out(abort);
  out << "1\n";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace

bool IsMountPoint(const std::string& path) {
  return MountDevice(path).has_value();
}

Status CheckMountPoint(const std::string& path) {
  if (path.empty()) return Fail(EINVAL, "no mount point given");
  auto dead = [&path] {
    return Fail(
        EBUSY, "'" + path +
                   "' is a dead FUSE mount (its daemon is gone); clear it with "
                   "`fusermount3 -u " +
                   path + "` and mount again");
  };
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOTCONN || err == ECONNABORTED) return dead();
    if (err == ENOENT)
      return Fail(ENOENT, "mount point '" + path +
                              "' does not exist; create it with mkdir first");
    return Fail(err,
                "cannot use mount point '" + path + "': " + std::strerror(err));
  }
  if (!S_ISDIR(st.st_mode))
    return Fail(ENOTDIR, "mount point '" + path + "' is not a directory");
  if (IsMountPoint(path)) {
    // For a while after its daemon died, stat() of a FUSE mount is answered
    // from the kernel's attribute cache; statfs() always asks the daemon.
    struct statfs sfs;
    if (statfs(path.c_str(), &sfs) != 0 &&
        (errno == ENOTCONN || errno == ECONNABORTED))
      return dead();
    return Fail(EBUSY,
                "'" + path +
                    "' is already mounted; unmount it with `fusermount3 -u " +
                    path + "` or choose another directory");
  }
  return {};
}

// ---------------------------------------------------------------------------

struct DirHandle;

class FuseServer::Impl {
 public:
  Impl(vfs::Backend& backend, FuseOptions options)
      : backend_(backend), options_(std::move(options)) {
    nodes_[FUSE_ROOT_ID].nlookup = 1;
  }
  ~Impl() { Teardown(); }

  Status Start();
  Status Run();
  int PollingLoop();
  void Teardown();
  void StartInvalidation();
  void StopInvalidation();
  // Answers requests until the invalidation thread has returned.
  void ServeWhileInvalidating();

  // --- node table -------------------------------------------------------
  // One node per backend file (keyed by st_dev/st_ino), so that hard links
  // are one inode for the kernel: one page cache, one link count. A node
  // has one name per link the kernel has looked up; directories have one.
  struct ChildKey {
    fuse_ino_t parent;
    std::string name;
    bool operator==(const ChildKey&) const = default;
  };
  struct ChildKeyHash {
    size_t operator()(const ChildKey& k) const {
      return std::hash<std::string>{}(k.name) * 31 +
             std::hash<fuse_ino_t>{}(k.parent);
    }
  };
  struct FileKey {
    dev_t dev;
    ino_t ino;
    bool operator==(const FileKey&) const = default;
  };
  struct FileKeyHash {
    size_t operator()(const FileKey& k) const {
      return std::hash<uint64_t>{}(k.ino) * 31 + std::hash<uint64_t>{}(k.dev);
    }
  };
  struct Node {
    uint64_t nlookup = 0;
    std::vector<ChildKey> names;  // empty: unlinked, reachable only by handle
    FileKey key{};
    mode_t type = 0;  // S_IFMT bits
  };

  // A path is built from the node table and then used in a backend call; a
  // rename changes the backend and then the table. Requests that use paths
  // hold this shared from building the path until their table update, a
  // rename holds it alone: with --threads or io_uring requests run at once,
  // and none may see a rename half-way (its path would name a directory
  // that has moved, or another that took the old name). The kernel does not
  // keep them apart: it locks a directory's entries, not its ancestors.
  std::shared_lock<std::shared_mutex> SharedTree() {
    return std::shared_lock(tree_mu_);
  }
  std::unique_lock<std::shared_mutex> ExclusiveTree() {
    return std::unique_lock(tree_mu_);
  }

  // False when `h` is known to be another file than node `ino` (a host
  // descriptor on the node's device with another inode number).
  bool IsFileOf(fuse_ino_t ino, vfs::FileHandle& h) {
    const int fd = h.NativeFd();
    struct stat st;
    if (fd < 0 || ::fstat(fd, &st) != 0) return true;
    auto key = KeyOf(ino);
    return !key || key->dev != st.st_dev || key->ino == st.st_ino;
  }

  Result<Path> PathOf(fuse_ino_t ino) {
    std::lock_guard lock(table_mu_);
    std::string text;
    int budget = kPathWalkBudget;
    if (!AppendPathLocked(ino, &budget, &text)) return Fail(ESTALE, kLookAgain);
    return Path::Parse(text.empty() ? "/" : text);
  }
  // Appends "/a/b" for `ino` to `out`. A node may keep a name whose parent
  // is gone (e.g. a file first seen under a directory the host then swapped
  // away, and looked up again under its replacement), so every name is
  // tried, the most recent first, until one reaches the root. `budget`
  // bounds the total number of steps: the sandbox controls the host tree, and
  // stale names left by its renames must not make this walk explode.
  static constexpr int kPathWalkBudget = 4096;
  bool AppendPathLocked(fuse_ino_t ino, int* budget, std::string* out) {
    if (ino == FUSE_ROOT_ID) return true;
    if (--*budget < 0) return false;
    auto it = nodes_.find(ino);
    if (it == nodes_.end()) return false;
    const auto& names = it->second.names;
    for (auto k = names.rbegin(); k != names.rend(); ++k) {
      const size_t mark = out->size();
      if (AppendPathLocked(k->parent, budget, out)) {
        *out += '/';
        *out += k->name;
        return true;
      }
      out->resize(mark);
    }
    return false;
  }
  Result<Path> ChildPath(fuse_ino_t parent, const char* name) {
    auto p = PathOf(parent);
    if (!p) return p;
    return p->Child(name);
  }

  // Records one more kernel reference to the file `st` found at
  // (parent, name) and returns its node id.
  fuse_ino_t Remember(fuse_ino_t parent, const std::string& name,
                      const Attr& st) {
    std::lock_guard lock(table_mu_);
    const ChildKey ck{parent, name};
    const FileKey fk{st.st_dev, st.st_ino};
    const mode_t type = st.st_mode & S_IFMT;
    if (auto c = children_.find(ck); c != children_.end()) {
      Node& n = nodes_[c->second];
      if (n.key == fk && n.type == type) {
        n.nlookup++;
        // Found again under this name: it is the newest, the one paths are
        // built from (another name it had may be gone on the host).
        auto at = std::find(n.names.begin(), n.names.end(), ck);
        if (at != n.names.end()) std::rotate(at, at + 1, n.names.end());
        return c->second;
      }
      // The name now holds another file (replaced behind our back).
      UnbindLocked(c->second, ck);
      children_.erase(c);
    }
    if (auto f = by_file_.find(fk); f != by_file_.end()) {
      Node& n = nodes_[f->second];
      if (n.type == type) {
        n.nlookup++;
        n.names.push_back(ck);
        children_.emplace(ck, f->second);
        return f->second;
      }
      by_file_.erase(f);  // inode number reused by a new file
    }
    fuse_ino_t ino = next_ino_++;
    Node& n = nodes_[ino];
    n.nlookup = 1;
    n.names.push_back(ck);
    n.key = fk;
    n.type = type;
    children_.emplace(ck, ino);
    by_file_[fk] = ino;
    return ino;
  }
  // Removes name `ck` from node `ino` (not from children_).
  void UnbindLocked(fuse_ino_t ino, const ChildKey& ck) {
    auto it = nodes_.find(ino);
    if (it == nodes_.end()) return;
    auto& names = it->second.names;
    names.erase(std::remove(names.begin(), names.end(), ck), names.end());
    if (names.empty()) {
      // Unlinked: a new file may get this inode number on the host.
      auto f = by_file_.find(it->second.key);
      if (f != by_file_.end() && f->second == ino) by_file_.erase(f);
    }
  }
  void Forget(fuse_ino_t ino, uint64_t n) {
    if (ino == FUSE_ROOT_ID) return;
    std::lock_guard lock(table_mu_);
    auto it = nodes_.find(ino);
    if (it == nodes_.end()) return;
    if (it->second.nlookup > n) {
      it->second.nlookup -= n;
      return;
    }
    for (const auto& ck : it->second.names) {
      auto c = children_.find(ck);
      if (c != children_.end() && c->second == ino) children_.erase(c);
    }
    auto f = by_file_.find(it->second.key);
    if (f != by_file_.end() && f->second == ino) by_file_.erase(f);
    nodes_.erase(it);
  }
  // The name (parent, name) was removed.
  void Detach(fuse_ino_t parent, const std::string& name) {
    std::lock_guard lock(table_mu_);
    const ChildKey ck{parent, name};
    auto c = children_.find(ck);
    if (c == children_.end()) return;
    UnbindLocked(c->second, ck);
    children_.erase(c);
  }
  // A rename succeeded: move names, as rename(2) or RENAME_EXCHANGE did.
  void Moved(fuse_ino_t parent, const std::string& name, fuse_ino_t newparent,
             const std::string& newname, unsigned flags) {
    std::lock_guard lock(table_mu_);
    const ChildKey from{parent, name}, to{newparent, newname};
    std::optional<fuse_ino_t> src, dst;
    if (auto c = children_.find(from); c != children_.end()) src = c->second;
    if (auto c = children_.find(to); c != children_.end()) dst = c->second;
    // rename(2) between two links of one file does nothing.
    if (src && dst && *src == *dst && !(flags & RENAME_EXCHANGE)) return;
    auto rebind = [&](fuse_ino_t ino, const ChildKey& old_name,
                      const ChildKey& new_name) {
      for (auto& k : nodes_[ino].names)
        if (k == old_name) k = new_name;
    };
    children_.erase(from);
    children_.erase(to);
    if (dst && !(flags & RENAME_EXCHANGE)) UnbindLocked(*dst, to);
    if (src) {
      rebind(*src, from, ChildKey{newparent, std::string(1, '\0')});
    }
    if (dst && (flags & RENAME_EXCHANGE)) {
      rebind(*dst, to, from);
      children_.emplace(from, *dst);
    }
    if (src) {
      rebind(*src, ChildKey{newparent, std::string(1, '\0')}, to);
      children_.emplace(to, *src);
    }
  }

  Caller CallerFor(fuse_req_t req) {
    Caller c = options_.identity;
    const fuse_ctx* ctx = fuse_req_ctx(req);
    c.uid = StoredUid(ctx->uid);
    c.gid = StoredGid(ctx->gid);
    c.pid = ctx->pid;
    c.request_id = next_request_.fetch_add(1, std::memory_order_relaxed);
    // The kernel checked permissions on attributes it may have cached for
    // up to the cache timeout: a file replaced meanwhile (by a rename beside
    // the mount or through another) would otherwise be opened, changed or
    // linked by this root daemon on the strength of the old file's mode.
    // So backends that can have the host check again, as the caller.
    if (host_checks_ && *c.uid != 0) c.groups = GroupsOf(req, *c.uid, *c.gid);
    return c;
  }

  // The supplementary groups of the process behind `req`, from /proc
  // (libfuse), remembered for a second per process: a burst of requests
  // reads them once. Unknown (the process is gone, or in a pid namespace
  // the daemon cannot see): none, so the host's check is the stricter one.
  std::vector<gid_t> GroupsOf(fuse_req_t req, uid_t uid, gid_t gid) {
    const pid_t pid = fuse_req_ctx(req)->pid;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(groups_mu_);
      auto it = groups_.find(pid);
      if (it != groups_.end() && it->second.until > now &&
          it->second.uid == uid && it->second.gid == gid)
        return it->second.groups;
    }
    std::vector<gid_t> list(32);
    int n = fuse_req_getgroups(req, static_cast<int>(list.size()), list.data());
    if (n > static_cast<int>(list.size())) {
      list.resize(static_cast<size_t>(n));
      n = fuse_req_getgroups(req, n, list.data());
    }
    list.resize(n > 0 ? std::min(static_cast<size_t>(n), list.size()) : 0);
    std::lock_guard lock(groups_mu_);
    if (groups_.size() > 4096) groups_.clear();
    groups_[pid] = KnownGroups{now + std::chrono::seconds(1), uid, gid, list};
    return list;
  }

  // FuseOptions::id_map, both ways.
  uid_t StoredUid(uid_t uid) const {
    const auto& m = options_.id_map;
    return m && uid == m->shown_uid ? m->stored_uid : uid;
  }
  gid_t StoredGid(gid_t gid) const {
    const auto& m = options_.id_map;
    return m && gid == m->shown_gid ? m->stored_gid : gid;
  }
  Attr Shown(Attr st) const {
    if (const auto& m = options_.id_map) {
      if (st.st_uid == m->stored_uid) st.st_uid = m->shown_uid;
      if (st.st_gid == m->stored_gid) st.st_gid = m->shown_gid;
    }
    return st;
  }

  // Replies an entry for (parent, name) with attributes `st`.
  void ReplyEntry(fuse_req_t req, fuse_ino_t parent, std::string_view name,
                  const Attr& st) {
    fuse_entry_param e{};
    e.ino = Remember(parent, std::string(name), st);
    e.attr = Shown(st);
    e.attr_timeout = options_.attr_timeout;
    e.entry_timeout = options_.entry_timeout;
    if (fuse_reply_entry(req, &e) != 0) Forget(e.ino, 1);
  }
  void ReplyError(fuse_req_t req, const Error& err) {
    if (err.code == EIO) {
      Log()->warn("I/O error: {}", err.ToString());
    } else if (Explained(err)) {
      // The caller gets only the errno; the backend's reason (who holds
      // the file, who changed it, what is full) goes to the mount's log.
      Log()->warn("refused: {}", err.ToString());
    }
    fuse_reply_err(req, err.code > 0 ? err.code : EIO);
  }
  // Whether a refusal loses the caller's work or makes it wait, with a
  // reason a person needs to know what to do: a write conflict (a lease
  // held elsewhere, a change made since the caller read) or a full disk.
  // Not the server's own ESTALE, on which the kernel just looks again.
  // A failed close or fsync: what the program wrote is not kept, whatever
  // the errno (a file purged or made unreadable meanwhile says ENOENT), so
  // the reason always goes to the log.
  void ReplyCommitError(fuse_req_t req, const Error& err) {
    if (err.code != EIO && !Explained(err) && !err.message.empty())
      Log()->warn("refused: {}", err.ToString());
    ReplyError(req, err);
  }
  static bool Explained(const Error& err) {
    switch (err.code) {
      case EBUSY:
      case ENOSPC:
      case EDQUOT:
        return !err.message.empty();
      case ESTALE:
        return !err.message.empty() && err.message != kLookAgain &&
               err.message != kReplacedBeside;
      default:
        return false;
    }
  }
  // Stats `path`, then replies an entry for it under (parent, name).
  void StatAndReplyEntry(fuse_req_t req, const Caller& c, fuse_ino_t parent,
                         const Path& path) {
    auto st = backend_.Stat(c, path);
    if (!st) return ReplyError(req, st.error());
    ReplyEntry(req, parent, path.Name(), *st);
  }

  // Runs `job` on the blocking-operation pool (started on first use).
  // On an io_uring thread the job runs at once: its reply must leave from
  // the thread that received the request (the queue's other threads keep
  // serving meanwhile).
  // Runs `job` on the pool, or here when the pool cannot take it (no thread
  // could be started, no memory): it must run and answer either way, and
  // nothing may throw into libfuse.
  template <typename Job>
  void Offload(Job job) {
    if (UringChannel::InRingThread()) return job();
    try {
      std::lock_guard lock(pool_mu_);
      if (workers_.empty()) {
        for (int i = 0; i < kPoolThreads; ++i)
          workers_.emplace_back([this](std::stop_token stop) { Work(stop); });
      }
      jobs_.emplace_back(job);
      pool_cv_.notify_one();
      return;
    } catch (const std::exception& e) {
      spdlog::warn(
          "fuse: cannot hand a request to the pool ({}); serving it "
          "on the reading thread",
          e.what());
    }
    job();
  }
  void Work(std::stop_token stop) {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock lock(pool_mu_);
        pool_cv_.wait(lock, stop, [this] { return !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping and drained
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  void StopPool() {
    std::vector<std::jthread> workers;
    {
      std::lock_guard lock(pool_mu_);
      workers.swap(workers_);
    }
    workers.clear();  // request_stop + join; queued jobs finish first
  }

  // --- live invalidation (the backend's change feed) --------------------
  // Registered with the backend while Run() serves; only queues the path, so
  // it returns at once whatever thread the backend calls it from.
  class ChangeReceiver final : public vfs::ChangeListener {
   public:
    explicit ChangeReceiver(Impl& impl) : impl_(impl) {}
    void Changed(const Path& path) override { impl_.QueueInvalidation(path); }

   private:
    Impl& impl_;
  };

  void QueueInvalidation(const Path& path) {
    try {
      std::lock_guard lock(inval_mu_);
      if (pending_.insert(path).second) inval_cv_.notify_one();
    } catch (const std::exception& e) {
      // The backend's poller must not die of our allocation failure.
      Log()->warn("cannot queue invalidation of {}: {}", path.str(), e.what());
    }
  }

  // One notification for the kernel: the entry `name` in directory `ino`,
  // or (name empty) the attributes and cached data of inode `ino`.
  struct Notice {
    fuse_ino_t ino;
    std::string name;
  };
  // What to tell the kernel about a change of `path`, from the node table:
  // the kernel can only have cached what it looked up, i.e. the chain of
  // nodes from the root. If the whole path is known: its inode, its entry
  // in the parent, and the parent (whose listing may have changed). If the
  // chain stops earlier (the name was missing or never looked up): the next
  // name in the deepest known directory, which may be cached as negative,
  // and that directory.
  std::vector<Notice> NoticesFor(const Path& path) {
    const auto names = path.Components();
    std::lock_guard lock(table_mu_);
    fuse_ino_t parent = FUSE_ROOT_ID, ino = FUSE_ROOT_ID;
    size_t depth = 0;
    for (; depth < names.size(); ++depth) {
      auto c = children_.find(ChildKey{ino, std::string(names[depth])});
      if (c == children_.end()) break;
      parent = ino;
      ino = c->second;
    }
    std::vector<Notice> out;
    if (depth == names.size()) {
      out.push_back(Notice{ino, {}});
      if (depth == 0) return out;  // the root has no entry
      out.push_back(Notice{parent, std::string(names[depth - 1])});
      out.push_back(Notice{parent, {}});
    } else {
      out.push_back(Notice{ino, std::string(names[depth])});
      out.push_back(Notice{ino, {}});
    }
    return out;
  }

  // Drops the attributes the kernel cached for `ino`, so that it asks again
  // (GETATTR) before it next needs them: size before a read, for one.
  // Safe from a request thread, unlike Invalidate(): with a negative offset
  // the kernel touches no page, so it waits for no lock a request in flight
  // could hold.
  void ForgetCachedAttrs(fuse_ino_t ino) {
    int rc = fuse_lowlevel_notify_inval_inode(session_, ino, /*off=*/-1, 0);
    if (rc != 0 && rc != -ENOENT)
      Log()->debug("forgetting attributes of {}: {}", ino, std::strerror(-rc));
  }

  // Runs on the invalidation thread only.
  void Invalidate(const Path& path, const std::stop_token& stop) {
    for (const Notice& n : NoticesFor(path)) {
      if (stop.stop_requested() || fuse_session_exited(session_)) return;
      int rc = n.name.empty()
                   ? fuse_lowlevel_notify_inval_inode(session_, n.ino,
                                                      /*off=*/0, /*len=*/0)
                   : fuse_lowlevel_notify_inval_entry(
                         session_, n.ino, n.name.data(), n.name.size());
      // ENOENT: the kernel has nothing cached for it, the common case.
      if (rc != 0 && rc != -ENOENT)
        Log()->debug("invalidating {} of {} for {}: {}",
                     n.name.empty() ? "inode" : "entry '" + n.name + "'", n.ino,
                     path.str(), std::strerror(-rc));
    }
  }

  void InvalidationLoop(std::stop_token stop) {
    while (true) {
      std::set<Path> batch;
      {
        std::unique_lock lock(inval_mu_);
        inval_cv_.wait(lock, stop, [this] { return !pending_.empty(); });
        if (stop.stop_requested()) return;
        batch.swap(pending_);
      }
      // Before INIT is answered the kernel has cached nothing (and the
      // protocol version the notify calls check is not known yet).
      if (!initialized_.load(std::memory_order_acquire)) continue;
      for (const auto& path : batch) {
        try {
          Invalidate(path, stop);
        } catch (const std::exception& e) {
          Log()->warn("cannot invalidate {}: {}", path.str(), e.what());
        }
        if (stop.stop_requested()) return;
      }
    }
  }

  static constexpr int kPoolThreads = 2;
  static constexpr unsigned kReadaheadKib = 1024;  // = max_write, one request

  vfs::Backend& backend_;
  FuseOptions options_;
  fuse_session* session_ = nullptr;
  bool mounted_ = false;
  bool signals_ = false;

  std::mutex table_mu_;  // guards nodes_, children_, by_file_, next_ino_
  std::shared_mutex tree_mu_;  // see SharedTree()
  std::unordered_map<fuse_ino_t, Node> nodes_;
  std::unordered_map<ChildKey, fuse_ino_t, ChildKeyHash> children_;
  std::unordered_map<FileKey, fuse_ino_t, FileKeyHash> by_file_;
  fuse_ino_t next_ino_ = FUSE_ROOT_ID + 1;

  std::atomic<uint64_t> next_request_{1};
  // Whether callers' requests carry their groups (Caller::groups): a
  // daemon running as root, whose backends act as root unless told.
  const bool host_checks_ = geteuid() == 0;
  struct KnownGroups {
    std::chrono::steady_clock::time_point until;
    uid_t uid;
    gid_t gid;
    std::vector<gid_t> groups;
  };
  std::mutex groups_mu_;
  std::unordered_map<pid_t, KnownGroups> groups_;

  // --- open files and directories --------------------------------------
  // Every handle given to the kernel is registered, so that a setattr the
  // kernel sends without a file handle (flushing the times of a file whose
  // name is gone) can still reach the file, and so that whatever the kernel
  // never released (requests still queued at unmount) is freed at teardown.
  struct OpenFile {
    std::shared_ptr<vfs::FileHandle> handle;
    fuse_ino_t ino;
    bool registered = false;  // counted in backings_ (see AcquireBacking)
  };
  uint64_t AddFile(std::unique_ptr<vfs::FileHandle> h, fuse_ino_t ino) {
    auto f = std::make_unique<OpenFile>(OpenFile{std::move(h), ino});
    auto* raw = f.get();
    std::lock_guard lock(handles_mu_);
    files_.emplace(raw, std::move(f));
    return reinterpret_cast<uint64_t>(raw);
  }
  void ReleaseFile(uint64_t fh) {
    std::unique_ptr<OpenFile> gone;  // destroyed outside the lock
    {
      std::lock_guard lock(handles_mu_);
      auto it = files_.find(reinterpret_cast<OpenFile*>(fh));
      if (it == files_.end()) return;
      gone = std::move(it->second);
      files_.erase(it);
    }
    if (gone->registered) ReleaseBacking(gone->ino);
  }
  // Any open handle of node `ino`, or null.
  // The backend file node `ino` stands for (its dev and inode number when
  // it was looked up); nullopt for the root and unknown nodes.
  std::optional<FileKey> KeyOf(fuse_ino_t ino) {
    std::lock_guard lock(table_mu_);
    auto it = nodes_.find(ino);
    if (ino == FUSE_ROOT_ID || it == nodes_.end()) return std::nullopt;
    return it->second.key;
  }
  std::shared_ptr<vfs::FileHandle> AnyFileOf(fuse_ino_t ino) {
    std::lock_guard lock(handles_mu_);
    for (const auto& [raw, f] : files_)
      if (f->ino == ino) return f->handle;
    return nullptr;
  }
  uint64_t AddDir(std::unique_ptr<DirHandle> d);

  // --- FUSE passthrough --------------------------------------------------
  // libfuse 3.14 predates passthrough, so the session's device I/O goes
  // through hooks (fuse_session_custom_io): the read hook notes whether the
  // kernel's INIT offers passthrough, and the write hook adds it to libfuse's
  // INIT reply and marks an open's reply with the backing file the handler
  // registered for it (t_reply_backing, set around fuse_reply_open/create
  // on the handler's own thread).
  static ssize_t IoRead(int fd, void* buf, size_t len, void* userdata);
  static ssize_t IoWritev(int fd, struct iovec* iov, int count, void* userdata);
  // The backing id to pass this open of node `ino` through to (the host
  // file `fd`), or 0 to serve it through the daemon; nullopt when the node
  // is not counted (passthrough off, not a regular file). The kernel wants
  // all open files of an inode in one mode, and all passthrough ones on one
  // backing, so the first open of a node decides (passthrough, or the
  // daemon when the kernel refused the file), later opens follow it, and
  // the last release (ReleaseBacking) ends it. An open that finds another
  // host file behind a passed-through node (replaced beside the mount)
  // fails with ESTALE, on which the kernel looks the name up again and
  // retries once.
  Result<std::optional<int32_t>> AcquireBacking(fuse_ino_t ino, int fd);
  // True when node `ino` is passed through to a host file now.
  bool HasBacking(fuse_ino_t ino) {
    std::lock_guard lock(backing_mu_);
    auto it = backings_.find(ino);
    return it != backings_.end() && it->second.id > 0;
  }
  // For the open file registered in fi->fh: its backing id (0: none), with
  // the file marked as holding it and fi adjusted.
  Result<int32_t> PassThrough(fuse_file_info* fi) {
    auto* f = reinterpret_cast<OpenFile*>(fi->fh);
    int fd = f->handle->NativeFd();
    if (fd < 0) return 0;
    auto id = AcquireBacking(f->ino, fd);
    if (!id) return std::unexpected(id.error());
    if (!id->has_value()) return 0;
    f->registered = true;
    if (**id == 0) return 0;
    // The kernel does the I/O on the host file itself, O_DIRECT included,
    // and refuses page-cache flags with passthrough (FOPEN_PASSTHROUGH_MASK:
    // only DIRECT_IO, PARALLEL_DIRECT_WRITES and NOFLUSH may come along).
    fi->direct_io = 0;
    fi->keep_cache = 0;
    return **id;
  }
  void ReleaseBacking(fuse_ino_t ino);
  void ReleaseDir(uint64_t fh);
  void FreeHandles();

  std::atomic<uint64_t> init_unique_{0};
  std::atomic<bool> kernel_offers_passthrough_{false};
  std::atomic<bool> passthrough_{false};          // negotiated at INIT
  std::atomic<bool> passthrough_refused_{false};  // the kernel said EPERM
  std::atomic<bool> kernel_offers_uring_{false};
  // FUSE over io_uring: the rings are made before INIT's reply offers it
  // (PrepareUring; false: not offered), the entries registered once the
  // kernel took that reply (GoUring), and all stopped at Teardown.
  bool PrepareUring();
  void GoUring();
  void StopUring();
  std::mutex uring_mu_;  // guards uring_, uring_stopped_
  std::unique_ptr<UringChannel> uring_;
  bool uring_stopped_ = false;
  struct Backing {
    int32_t id;  // 0: the node's open files go through the daemon
    int opens;
    dev_t dev;
    ino_t host_ino;
  };
  std::mutex backing_mu_;  // guards backings_, refused_devs_
  std::unordered_map<fuse_ino_t, Backing> backings_;
  std::set<dev_t> refused_devs_;  // host file systems the kernel refused

  std::mutex handles_mu_;  // guards files_, dirs_
  std::unordered_map<OpenFile*, std::unique_ptr<OpenFile>> files_;
  std::unordered_map<DirHandle*, std::unique_ptr<DirHandle>> dirs_;

  std::mutex pool_mu_;  // guards jobs_, workers_
  std::condition_variable_any pool_cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::jthread> workers_;

  // Set once OpInit has run: notifications may be sent from then on.
  std::atomic<bool> initialized_{false};
  ChangeReceiver receiver_{*this};
  // receiver_ is registered and invalidator_ runs. Touched only by Run()
  // and Teardown(), which do not overlap.
  bool listening_ = false;
  // Guards pending_ (paths not yet sent, duplicates coalesced). Never held
  // together with table_mu_, nor while notifying the kernel.
  std::mutex inval_mu_;
  std::condition_variable_any inval_cv_;
  std::set<Path> pending_;
  // True from StartInvalidation until InvalidationLoop has returned.
  std::atomic<bool> invalidating_{false};
  std::jthread invalidator_;
};

// An open directory: a snapshot of its entries, taken at each read from
// offset 0 (the first, and each after rewinddir).
struct DirHandle {
  std::vector<vfs::DirEntry> entries;
};

uint64_t FuseServer::Impl::AddDir(std::unique_ptr<DirHandle> d) {
  auto* raw = d.get();
  std::lock_guard lock(handles_mu_);
  dirs_.emplace(raw, std::move(d));
  return reinterpret_cast<uint64_t>(raw);
}

void FuseServer::Impl::ReleaseDir(uint64_t fh) {
  std::unique_ptr<DirHandle> gone;
  std::lock_guard lock(handles_mu_);
  auto it = dirs_.find(reinterpret_cast<DirHandle*>(fh));
  if (it == dirs_.end()) return;
  gone = std::move(it->second);
  dirs_.erase(it);
}

void FuseServer::Impl::FreeHandles() {
  decltype(files_) files;
  decltype(dirs_) dirs;
  {
    std::lock_guard lock(handles_mu_);
    files.swap(files_);
    dirs.swap(dirs_);
  }
}

namespace {

// The kernel ABI pieces of FUSE passthrough (protocol 7.40, Linux 6.9),
// which the system's headers (7.38) do not have yet.
namespace kabi {
using abi::InHeader;
using abi::OutHeader;
constexpr uint32_t kOpInit = 26;
constexpr uint32_t kInitExt = 1u << 30;          // FUSE_INIT_EXT
constexpr uint32_t kPassthroughFlag2 = 1u << 5;  // FUSE_PASSTHROUGH >> 32
constexpr uint32_t kUringFlag2 = 1u << 9;        // FUSE_OVER_IO_URING >> 32
constexpr size_t kInitInFlags = 12, kInitInFlags2 = 16;    // fuse_init_in
constexpr size_t kInitOutFlags = 12, kInitOutFlags2 = 32;  // fuse_init_out
constexpr size_t kInitOutMaxStackDepth = 36;
constexpr uint32_t kOpenPassthrough = 1u << 7;  // FOPEN_PASSTHROUGH
struct BackingMap {                             // struct fuse_backing_map
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
constexpr unsigned long kBackingOpen = _IOW(229, 1, BackingMap);
constexpr unsigned long kBackingClose = _IOW(229, 2, uint32_t);
}  // namespace kabi

thread_local int32_t t_reply_backing = 0;

// Largest WRITE payload (and, as libfuse derives max_pages from it, READ).
constexpr unsigned kMaxWrite = 1u << 20;

// Sends an open's reply with `send`, marked for passthrough to `backing`
// (0: none) by IoWritev on this thread.
template <typename Send>
int ReplyWithBacking(int32_t backing, Send send) {
  t_reply_backing = backing;
  int rc = send();
  t_reply_backing = 0;
  return rc;
}

ssize_t Splice(int in, off_t* in_off, int out, off_t* out_off, size_t len,
               unsigned flags, void*) {
  return ::splice(in, in_off, out, out_off, len, flags);
}
// A spliced reply: into the ring entry when it answers a ring request.
ssize_t SpliceReply(int in, off_t* in_off, int out, off_t* out_off, size_t len,
                    unsigned flags, void* userdata) {
  if (auto n = UringChannel::CaptureSplice(in, len)) return *n;
  return Splice(in, in_off, out, out_off, len, flags, userdata);
}

}  // namespace

ssize_t FuseServer::Impl::IoRead(int fd, void* buf, size_t len,
                                 void* userdata) {
  ssize_t n = ::read(fd, buf, len);
  if (n < static_cast<ssize_t>(sizeof(kabi::InHeader))) return n;
  kabi::InHeader h;
  std::memcpy(&h, buf, sizeof h);
  if (h.opcode == kabi::kOpInit &&
      static_cast<size_t>(n) >= sizeof h + kabi::kInitInFlags2 + 4) {
    auto* self = static_cast<Impl*>(userdata);
    const char* in = static_cast<const char*>(buf) + sizeof h;
    uint32_t flags = 0, flags2 = 0;
    std::memcpy(&flags, in + kabi::kInitInFlags, 4);
    std::memcpy(&flags2, in + kabi::kInitInFlags2, 4);
    self->init_unique_.store(h.unique);
    self->kernel_offers_passthrough_.store((flags & kabi::kInitExt) &&
                                           (flags2 & kabi::kPassthroughFlag2));
    self->kernel_offers_uring_.store((flags & kabi::kInitExt) &&
                                     (flags2 & kabi::kUringFlag2));
  }
  return n;
}

ssize_t FuseServer::Impl::IoWritev(int fd, struct iovec* iov, int count,
                                   void* userdata) {
  auto* self = static_cast<Impl*>(userdata);
  kabi::OutHeader h{};
  if (MessageBytes(iov, count, 0, &h, sizeof h, false) && h.error == 0 &&
      h.unique != 0) {
    if (t_reply_backing != 0 && h.len >= sizeof h + 16) {
      // The open's reply: fuse_open_out ends the message (after the entry
      // in a create's reply): {fh, open_flags, backing_id}.
      uint32_t open_flags = 0;
      int32_t id = t_reply_backing;
      MessageBytes(iov, count, h.len - 8, &open_flags, 4, false);
      open_flags |= kabi::kOpenPassthrough;
      MessageBytes(iov, count, h.len - 8, &open_flags, 4, true);
      MessageBytes(iov, count, h.len - 4, &id, 4, true);
    } else if (h.unique == self->init_unique_.load() &&
               h.len >= sizeof h + kabi::kInitOutMaxStackDepth + 4) {
      // INIT's reply: add what libfuse 3.14 cannot ask for itself.
      const bool passthrough = self->kernel_offers_passthrough_.load() &&
                               self->options_.passthrough &&
                               !self->options_.writeback_cache;
      bool uring = false;
      if (self->options_.io_uring) {
        if (!self->kernel_offers_uring_.load()) {
          Log()->warn(
              "the kernel does not offer FUSE over io_uring; requests stay "
              "on /dev/fuse");
        } else {
          uring = self->PrepareUring();
        }
      }
      if (passthrough || uring) {
        uint32_t flags = 0, flags2 = 0;
        MessageBytes(iov, count, sizeof h + kabi::kInitOutFlags, &flags, 4,
                     false);
        MessageBytes(iov, count, sizeof h + kabi::kInitOutFlags2, &flags2, 4,
                     false);
        flags |= kabi::kInitExt;
        if (passthrough) flags2 |= kabi::kPassthroughFlag2;
        if (uring) flags2 |= kabi::kUringFlag2;
        MessageBytes(iov, count, sizeof h + kabi::kInitOutFlags, &flags, 4,
                     true);
        MessageBytes(iov, count, sizeof h + kabi::kInitOutFlags2, &flags2, 4,
                     true);
      }
      if (passthrough) {
        // Backing files may not themselves be stacked (overlayfs): depth 1.
        uint32_t depth = 1;
        MessageBytes(iov, count, sizeof h + kabi::kInitOutMaxStackDepth, &depth,
                     4, true);
        self->passthrough_.store(true);
        Log()->debug(
            "FUSE passthrough on: workspace file data goes from the kernel "
            "to the host file directly");
      }
      ssize_t n = ::writev(fd, iov, count);
      // The kernel took the reply (and set up the connection) within the
      // write, so ring entries can be registered from now on.
      if (uring) {
        if (n >= 0) {
          self->GoUring();
        } else {
          self->StopUring();
        }
      }
      return n;
    }
  }
  if (auto n = UringChannel::CaptureReply(iov, count)) return *n;
  return ::writev(fd, iov, count);
}

Result<std::optional<int32_t>> FuseServer::Impl::AcquireBacking(fuse_ino_t ino,
                                                                int fd) {
  if (!passthrough_.load() || passthrough_refused_.load()) {
    return std::nullopt;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  std::lock_guard lock(backing_mu_);
  if (auto it = backings_.find(ino); it != backings_.end()) {
    Backing& b = it->second;
    if (b.id > 0 && (b.dev != st.st_dev || b.host_ino != st.st_ino)) {
      return Fail(ESTALE, kReplacedBeside);
    }
    ++b.opens;
    return b.id;
  }
  int id = 0;
  if (!refused_devs_.contains(st.st_dev)) {
    kabi::BackingMap map{fd, 0, 0};
    id = ::ioctl(fuse_session_fd(session_), kabi::kBackingOpen, &map);
    if (id <= 0) {
      int err = errno;
      id = 0;
      if (err == EPERM) {
        passthrough_refused_.store(true);
        Log()->debug(
            "FUSE passthrough unavailable (needs CAP_SYS_ADMIN); the "
            "daemon serves file I/O");
        return std::nullopt;  // for every file: nothing to keep apart
      }
      if (err == ELOOP || err == EOPNOTSUPP || err == EINVAL) {
        // The host file system cannot be a backing (overlayfs is already
        // one layer deep): its files go through the daemon.
        refused_devs_.insert(st.st_dev);
        Log()->debug("FUSE passthrough refused for files on device {}: {}",
                     static_cast<uint64_t>(st.st_dev), std::strerror(err));
      }
    }
  }
  backings_.emplace(ino, Backing{id, 1, st.st_dev, st.st_ino});
  return id;
}

void FuseServer::Impl::ReleaseBacking(fuse_ino_t ino) {
  std::lock_guard lock(backing_mu_);
  auto it = backings_.find(ino);
  if (it == backings_.end() || --it->second.opens > 0) return;
  uint32_t id = static_cast<uint32_t>(it->second.id);
  backings_.erase(it);
  if (id > 0 && session_ != nullptr) {
    (void)::ioctl(fuse_session_fd(session_), kabi::kBackingClose, &id);
  }
}

namespace {

using Impl = FuseServer::Impl;

void ReplyErr(fuse_req_t req, int err) { fuse_reply_err(req, err); }

Impl* Self(fuse_req_t req) {
  return static_cast<Impl*>(fuse_req_userdata(req));
}
vfs::FileHandle* FileOf(fuse_file_info* fi) {
  return reinterpret_cast<Impl::OpenFile*>(fi->fh)->handle.get();
}

// Runs a callback body; converts escaping exceptions into error replies.
template <typename F>
void Guard(fuse_req_t req, const char* op, F&& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (const std::exception& e) {
    Log()->error("{}: unexpected exception: {}", op, e.what());
    fuse_reply_err(req, EIO);
  } catch (...) {
    Log()->error("{}: unexpected exception", op);
    fuse_reply_err(req, EIO);
  }
}

void OpInit(void* userdata, fuse_conn_info* conn) {
  auto* self = static_cast<Impl*>(userdata);
  auto want = [&](unsigned cap) {
    if (conn->capable & cap) conn->want |= cap;
  };
  want(FUSE_CAP_SPLICE_WRITE);
  want(FUSE_CAP_SPLICE_MOVE);
  want(FUSE_CAP_SPLICE_READ);
  want(FUSE_CAP_PARALLEL_DIROPS);
  want(FUSE_CAP_READDIRPLUS);
  want(FUSE_CAP_READDIRPLUS_AUTO);  // the kernel asks for it when it pays
  want(FUSE_CAP_ASYNC_DIO);
  want(FUSE_CAP_ATOMIC_O_TRUNC);
  if (self->options_.writeback_cache) want(FUSE_CAP_WRITEBACK_CACHE);
  // Locks are taken by the kernel locally; the backend does not see them.
  conn->want &= ~(FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS);
  conn->max_write = kMaxWrite;
  conn->max_readahead = 1u << 20;
  conn->max_background = 64;
  conn->congestion_threshold = 48;
  self->initialized_.store(true, std::memory_order_release);
}

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guard(req, "lookup", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->ChildPath(parent, name);
    if (!path) return self->ReplyError(req, path.error());
    auto st = self->backend_.Stat(self->CallerFor(req), *path);
    if (!st && st.error().code == ENOENT) {
      // Gone on the host: a name the table still held for it must not be
      // used to build paths any more.
      self->Detach(parent, std::string(path->Name()));
    }
    if (!st && st.error().code == ENOENT &&
        self->options_.negative_timeout > 0) {
      // Node id 0: the kernel remembers that the name is missing.
      fuse_entry_param e{};
      e.entry_timeout = self->options_.negative_timeout;
      fuse_reply_entry(req, &e);
      return;
    }
    if (!st) return self->ReplyError(req, st.error());
    self->ReplyEntry(req, parent, path->Name(), *st);
  });
}

void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Self(req)->Forget(ino, nlookup);
  fuse_reply_none(req);
}

void OpForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  auto* self = Self(req);
  for (size_t i = 0; i < count; ++i)
    self->Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guard(req, "getattr", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    Result<Attr> st;
    if (fi != nullptr && fi->fh != 0) {
      st = FileOf(fi)->Stat();
    } else if (auto path = self->PathOf(ino); path) {
      st = self->backend_.Stat(self->CallerFor(req), *path);
      // The name may hold another file by now (replaced through another
      // mount, or beside this one) while this one is open here: a stat of
      // the open file (fstat, /proc/PID/fd) answers for it, not for its
      // successor, whose size would cut the open file's reads short.
      if (st) {
        auto key = self->KeyOf(ino);
        if (key && (key->dev != st->st_dev || key->ino != st->st_ino))
          if (auto open = self->AnyFileOf(ino)) st = open->Stat();
      } else if (st.error().code == ENOENT) {
        // Removed beside the mount while the kernel had the name cached:
        // an open file answers for itself; otherwise ESTALE makes the
        // kernel look the name up again, so a stat says ENOENT after all
        // and an open(O_CREAT) (whose permission check asked for fresh
        // attributes) creates the file, instead of failing with ENOENT.
        if (auto open = self->AnyFileOf(ino)) {
          st = open->Stat();
        } else {
          return self->ReplyError(req, Error{ESTALE, kLookAgain});
        }
      }
    } else {
      // No name left (unlinked, renamed over) while a process still holds
      // the file open: fstat(2) asks without a handle, and must work.
      auto any = self->AnyFileOf(ino);
      if (any == nullptr) return self->ReplyError(req, path.error());
      st = any->Stat();
    }
    if (!st) return self->ReplyError(req, st.error());
    Attr shown = self->Shown(*st);
    fuse_reply_attr(req, &shown, self->options_.attr_timeout);
  });
}

void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
               fuse_file_info* fi) {
  Guard(req, "setattr", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    // An open file is changed through its handle: its name may be gone
    // (unlinked, renamed over) while the kernel still flushes times or size.
    vfs::FileHandle* h = (fi != nullptr && fi->fh != 0) ? FileOf(fi) : nullptr;
    auto path = self->PathOf(ino);
    std::shared_ptr<vfs::FileHandle> any;  // keeps a borrowed handle alive
    if (!path && h == nullptr) {
      // No name left (unlinked, replaced); the kernel may still flush the
      // times of a file some process holds open.
      any = self->AnyFileOf(ino);
      if (any == nullptr) return self->ReplyError(req, path.error());
      h = any.get();
    }
    Caller c = self->CallerFor(req);
    auto& b = self->backend_;
    vfs::FileHandle* meta = h;  // for mode, owner and times
    if (h == nullptr && path) {
      // fchmod, fchown and futimens come without a handle (only ftruncate
      // brings one), and the node's name may hold another host file by now
      // (renamed beside the mount, by the sandbox). Then a file open here
      // is changed through its handle, never through the name: root's
      // `tar` does fchown(fd, 0, 0) then fchmod(fd, 04755), and acting on
      // the name made a planted file set-user-ID root. With none open,
      // ESTALE makes the kernel look the name up again, as on a local
      // filesystem. While the name still holds the node's file, the change
      // goes by name as before, checked again by the host as the caller.
      if (auto key = self->KeyOf(ino)) {
        auto now = b.Stat(c, *path);
        const bool elsewhere =
            now ? now->st_dev != key->dev || now->st_ino != key->ino
                : now.error().code == ENOENT;
        if (elsewhere) {
          auto open = self->AnyFileOf(ino);
          if (open == nullptr)
            return self->ReplyError(req, Error{ESTALE, kLookAgain});
          // (Not for a size change: truncate(2) by path comes here too,
          // and the open file may be a read-only descriptor.)
          any = std::move(open);
          meta = any.get();
        }
      }
    }
    if (to_set & FUSE_SET_ATTR_MODE) {
      mode_t mode = attr->st_mode & 07777;
      Status r = meta ? meta->Chmod(mode) : b.Chmod(c, *path, mode);
      if (!r) return self->ReplyError(req, r.error());
    }
    if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
      uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? self->StoredUid(attr->st_uid)
                                               : vfs::kKeepUid;
      gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? self->StoredGid(attr->st_gid)
                                               : vfs::kKeepGid;
      Status r = meta ? meta->Chown(uid, gid) : b.Chown(c, *path, uid, gid);
      if (!r) return self->ReplyError(req, r.error());
    }
    if (to_set & FUSE_SET_ATTR_SIZE) {
      Status r =
          h ? h->Truncate(attr->st_size) : b.Truncate(c, *path, attr->st_size);
      if (!r) return self->ReplyError(req, r.error());
    }
    if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
      struct timespec ts[2];
      ts[0].tv_sec = ts[1].tv_sec = 0;
      ts[0].tv_nsec = ts[1].tv_nsec = UTIME_OMIT;
      if (to_set & FUSE_SET_ATTR_ATIME_NOW)
        ts[0].tv_nsec = UTIME_NOW;
      else if (to_set & FUSE_SET_ATTR_ATIME)
        ts[0] = attr->st_atim;
      if (to_set & FUSE_SET_ATTR_MTIME_NOW)
        ts[1].tv_nsec = UTIME_NOW;
      else if (to_set & FUSE_SET_ATTR_MTIME)
        ts[1] = attr->st_mtim;
      Status r = meta ? meta->Utimens(ts) : b.Utimens(c, *path, ts);
      if (!r) return self->ReplyError(req, r.error());
    }
    Result<Attr> st = meta ? meta->Stat() : b.Stat(c, *path);
    if (!st) return self->ReplyError(req, st.error());
    Attr shown = self->Shown(*st);
    fuse_reply_attr(req, &shown, self->options_.attr_timeout);
  });
}

void OpReadlink(fuse_req_t req, fuse_ino_t ino) {
  Guard(req, "readlink", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->PathOf(ino);
    if (!path) return self->ReplyError(req, path.error());
    auto target = self->backend_.Readlink(self->CallerFor(req), *path);
    if (!target) return self->ReplyError(req, target.error());
    fuse_reply_readlink(req, target->c_str());
  });
}

void OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
             dev_t rdev) {
  Guard(req, "mknod", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->ChildPath(parent, name);
    if (!path) return self->ReplyError(req, path.error());
    Caller c = self->CallerFor(req);
    Status r;
    if (S_ISREG(mode)) {
      auto h = self->backend_.Open(c, *path, O_CREAT | O_EXCL | O_WRONLY,
                                   mode & 07777);
      if (h)
        r = (*h)->Flush();
      else
        r = std::unexpected(h.error());
    } else {
      r = self->backend_.Mknod(c, *path, mode, rdev);
    }
    if (!r) return self->ReplyError(req, r.error());
    self->StatAndReplyEntry(req, c, parent, *path);
  });
}

void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Guard(req, "mkdir", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->ChildPath(parent, name);
    if (!path) return self->ReplyError(req, path.error());
    Caller c = self->CallerFor(req);
    if (auto r = self->backend_.Mkdir(c, *path, mode & 07777); !r)
      return self->ReplyError(req, r.error());
    self->StatAndReplyEntry(req, c, parent, *path);
  });
}

void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guard(req, "unlink", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->ChildPath(parent, name);
    if (!path) return self->ReplyError(req, path.error());
    if (auto r = self->backend_.Unlink(self->CallerFor(req), *path); !r)
      return self->ReplyError(req, r.error());
    self->Detach(parent, name);
    fuse_reply_err(req, 0);
  });
}

void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guard(req, "rmdir", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->ChildPath(parent, name);
    if (!path) return self->ReplyError(req, path.error());
    if (auto r = self->backend_.Rmdir(self->CallerFor(req), *path); !r)
      return self->ReplyError(req, r.error());
    self->Detach(parent, name);
    fuse_reply_err(req, 0);
  });
}

void OpSymlink(fuse_req_t req, const char* target, fuse_ino_t parent,
               const char* name) {
  Guard(req, "symlink", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->ChildPath(parent, name);
    if (!path) return self->ReplyError(req, path.error());
    Caller c = self->CallerFor(req);
    if (auto r = self->backend_.Symlink(c, target, *path); !r)
      return self->ReplyError(req, r.error());
    self->StatAndReplyEntry(req, c, parent, *path);
  });
}

void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name,
              fuse_ino_t newparent, const char* newname, unsigned int flags) {
  Guard(req, "rename", [&] {
    auto* self = Self(req);
    auto tree = self->ExclusiveTree();
    auto from = self->ChildPath(parent, name);
    if (!from) return self->ReplyError(req, from.error());
    auto to = self->ChildPath(newparent, newname);
    if (!to) return self->ReplyError(req, to.error());
    if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE))
      return ReplyErr(req, EINVAL);
    if (auto r = self->backend_.Rename(self->CallerFor(req), *from, *to, flags);
        !r)
      return self->ReplyError(req, r.error());
    self->Moved(parent, name, newparent, newname, flags);
    fuse_reply_err(req, 0);
  });
}

void OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
            const char* newname) {
  Guard(req, "link", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto from = self->PathOf(ino);
    if (!from) return self->ReplyError(req, from.error());
    auto to = self->ChildPath(newparent, newname);
    if (!to) return self->ReplyError(req, to.error());
    Caller c = self->CallerFor(req);
    if (auto r = self->backend_.Link(c, *from, *to); !r)
      return self->ReplyError(req, r.error());
    self->StatAndReplyEntry(req, c, newparent, *to);
  });
}

// Flags for the backend, adjusted for what the kernel does itself.
int BackendFlags(const Impl& self, int flags, fuse_file_info* fi) {
  // O_DIRECT is honoured by the kernel (direct_io: no page cache for this
  // file); the host file is opened normally so buffers need no alignment.
  if (flags & O_DIRECT) {
    fi->direct_io = 1;
    flags &= ~O_DIRECT;
  }
  if (self.options_.writeback_cache) {
    // With a writeback cache the kernel may read pages of a write-only file
    // and appends at the size it knows; the host fd must allow both.
    if ((flags & O_ACCMODE) == O_WRONLY) flags = (flags & ~O_ACCMODE) | O_RDWR;
    flags &= ~O_APPEND;
  }
  return flags & ~(O_NOCTTY | O_ASYNC);
}

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guard(req, "open", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->PathOf(ino);
    if (!path) return self->ReplyError(req, path.error());
    int flags = BackendFlags(*self, fi->flags, fi) & ~(O_CREAT | O_EXCL);
    // A passed-through node may meet another host file behind its name
    // (ESTALE below): truncate only once the file is known to be the one.
    const bool truncate_later = (flags & O_TRUNC) &&
                                (flags & O_ACCMODE) != O_RDONLY &&
                                self->HasBacking(ino);
    if (truncate_later) flags &= ~O_TRUNC;
    auto h = self->backend_.Open(self->CallerFor(req), *path, flags, 0);
    // The name no longer holds this node's file: it was removed or replaced
    // beside the mount while the kernel still had it cached. ESTALE makes
    // the kernel look the name up again and retry, so the open reaches the
    // file there now under a node of its own (and an open(O_CREAT) creates
    // it), as on a local filesystem; before, O_CREAT got ENOENT, and a
    // replaced file was served under the old file's node and cache.
    if (!h && h.error().code == ENOENT)
      return self->ReplyError(req, Error{ESTALE, kLookAgain});
    if (!h) return self->ReplyError(req, h.error());
    if (!self->IsFileOf(ino, **h))
      return self->ReplyError(req, Error{ESTALE, kLookAgain});
    fi->noflush = (*h)->NeedsFlush() ? 0 : 1;
    vfs::FileHandle* raw = h->get();
    fi->fh = self->AddFile(std::move(*h), ino);
    // FUSE_CAP_AUTO_INVAL_DATA drops the cache when mtime or size change.
    fi->keep_cache = 1;
    if (raw->MayDifferFromCache()) {
      // Another session committed since this one last opened the file, and
      // the change feed's invalidation may not have arrived: the kernel
      // would serve this open the old pages, with the old size.
      fi->keep_cache = 0;
      self->ForgetCachedAttrs(ino);
    }
    auto backing = self->PassThrough(fi);
    if (!backing) {
      self->ReleaseFile(fi->fh);
      return self->ReplyError(req, backing.error());
    }
    if (truncate_later) {
      if (auto t = raw->Truncate(0); !t) {
        self->ReleaseFile(fi->fh);
        return self->ReplyError(req, t.error());
      }
    }
    if (ReplyWithBacking(*backing, [&] { return fuse_reply_open(req, fi); }))
      self->ReleaseFile(fi->fh);
  });
}

void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) {
  Guard(req, "create", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->ChildPath(parent, name);
    if (!path) return self->ReplyError(req, path.error());
    Caller c = self->CallerFor(req);
    int flags = BackendFlags(*self, fi->flags, fi) | O_CREAT;
    auto h = self->backend_.Open(c, *path, flags, mode & 07777);
    if (!h) return self->ReplyError(req, h.error());
    auto known = (*h)->AttrsAtOpen();
    Result<Attr> st = known ? Result<Attr>(*known) : (*h)->Stat();
    if (!st) return self->ReplyError(req, st.error());
    fuse_entry_param e{};
    e.ino = self->Remember(parent, name, *st);
    e.attr = self->Shown(*st);
    e.attr_timeout = self->options_.attr_timeout;
    e.entry_timeout = self->options_.entry_timeout;
    fi->noflush = (*h)->NeedsFlush() ? 0 : 1;
    // The attributes go with the reply; pages the kernel may hold of a file
    // it knew (O_CREAT of an existing one) go with keep_cache = 0.
    fi->keep_cache = (*h)->MayDifferFromCache() ? 0 : 1;
    fi->fh = self->AddFile(std::move(*h), e.ino);
    auto backing = self->PassThrough(fi);
    if (!backing) {
      self->ReleaseFile(fi->fh);
      self->Forget(e.ino, 1);
      return self->ReplyError(req, backing.error());
    }
    if (ReplyWithBacking(*backing,
                         [&] { return fuse_reply_create(req, &e, fi); })) {
      self->ReleaseFile(fi->fh);
      self->Forget(e.ino, 1);
    }
  });
}

void OpRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off,
            fuse_file_info* fi) {
  Guard(req, "read", [&] {
    auto* h = FileOf(fi);
    if (int fd = h->NativeFd(); fd >= 0) {
      // Zero-copy: libfuse splices straight from the host file.
      fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
      buf.buf[0].flags =
          static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
      buf.buf[0].fd = fd;
      buf.buf[0].pos = off;
      fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
      return;
    }
    std::unique_ptr<char[]> data(new char[size]);
    auto n = h->Read(data.get(), size, off);
    if (!n) return Self(req)->ReplyError(req, n.error());
    fuse_reply_buf(req, data.get(), *n);
  });
}

void OpWriteBuf(fuse_req_t req, fuse_ino_t, fuse_bufvec* in, off_t off,
                fuse_file_info* fi) {
  Guard(req, "write", [&] {
    auto* h = FileOf(fi);
    const size_t size = fuse_buf_size(in);
    const bool append =
        (fi->flags & O_APPEND) && !Self(req)->options_.writeback_cache;
    if (int fd = h->NativeFd(); fd >= 0 && !append) {
      fuse_bufvec out = FUSE_BUFVEC_INIT(size);
      out.buf[0].flags =
          static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
      out.buf[0].fd = fd;
      out.buf[0].pos = off;
      ssize_t n = fuse_buf_copy(&out, in, FUSE_BUF_SPLICE_NONBLOCK);
      if (n < 0) return ReplyErr(req, static_cast<int>(-n));
      fuse_reply_write(req, static_cast<size_t>(n));
      return;
    }
    std::unique_ptr<char[]> data(new char[size]);
    fuse_bufvec mem = FUSE_BUFVEC_INIT(size);
    mem.buf[0].mem = data.get();
    ssize_t copied =
        fuse_buf_copy(&mem, in, static_cast<fuse_buf_copy_flags>(0));
    if (copied < 0) return ReplyErr(req, static_cast<int>(-copied));
    auto n = h->Write(data.get(), static_cast<size_t>(copied), off);
    if (!n) return Self(req)->ReplyError(req, n.error());
    fuse_reply_write(req, *n);
  });
}

void OpFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Guard(req, "flush", [&] {
    auto r = FileOf(fi)->Flush();
    if (!r) return Self(req)->ReplyCommitError(req, r.error());
    fuse_reply_err(req, 0);
  });
}

void OpRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Guard(req, "release", [&] {
    Self(req)->ReleaseFile(fi->fh);
    fi->fh = 0;
    fuse_reply_err(req, 0);
  });
}

void OpFsync(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) {
  // A flush to disk can take seconds; the reading thread goes on meanwhile.
  // The kernel does not release the file while this request is pending.
  vfs::FileHandle* h = FileOf(fi);
  Self(req)->Offload([req, h, datasync] {
    Guard(req, "fsync", [&] {
      auto r = h->Sync(datasync != 0);
      if (!r) return Self(req)->ReplyCommitError(req, r.error());
      fuse_reply_err(req, 0);
    });
  });
}

// Lists directory `ino` into `dir`: ".", "..", then the backend's entries.
Status ListInto(fuse_req_t req, fuse_ino_t ino, DirHandle& dir) {
  auto* self = Self(req);
  auto path = self->PathOf(ino);
  if (!path) return std::unexpected(path.error());
  auto entries = self->backend_.ReadDir(self->CallerFor(req), *path);
  if (!entries) return std::unexpected(entries.error());
  dir.entries.clear();
  dir.entries.reserve(entries->size() + 2);
  dir.entries.push_back(vfs::DirEntry{".", 0, S_IFDIR});
  dir.entries.push_back(vfs::DirEntry{"..", 0, S_IFDIR});
  for (auto& e : *entries) dir.entries.push_back(std::move(e));
  return {};
}

// A read from offset 0 lists the directory as it is now: the first read
// after opendir, and every one after rewinddir(3) (an lseek to 0, which the
// kernel does not pass on). A listing taken at opendir missed what was made
// between opendir and the first read (a failed export's clean-up left the
// files it had just written), and one reused after a rewind missed what
// was made since.
Status RewindIfAsked(fuse_req_t req, fuse_ino_t ino, DirHandle& dir,
                     off_t off) {
  if (off == 0) return ListInto(req, ino, dir);
  return {};
}

void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guard(req, "opendir", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    // The listing comes at the first read; here only what opendir(3) must
    // refuse: a name gone or hidden, or not a directory.
    auto path = self->PathOf(ino);
    if (!path) return self->ReplyError(req, path.error());
    auto st = self->backend_.Stat(self->CallerFor(req), *path);
    if (!st) return self->ReplyError(req, st.error());
    if (!S_ISDIR(st->st_mode))
      return self->ReplyError(req, vfs::Error{ENOTDIR, path->str()});
    auto dir = std::make_unique<DirHandle>();
    fi->fh = self->AddDir(std::move(dir));
    if (fuse_reply_open(req, fi) != 0) self->ReleaseDir(fi->fh);
  });
}

void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
               fuse_file_info* fi) {
  Guard(req, "readdir", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto* dir = reinterpret_cast<DirHandle*>(fi->fh);
    if (auto ok = RewindIfAsked(req, ino, *dir, off); !ok)
      return self->ReplyError(req, ok.error());
    std::unique_ptr<char[]> buf(new char[size]);
    size_t used = 0;
    for (size_t i = static_cast<size_t>(off); i < dir->entries.size(); ++i) {
      const auto& e = dir->entries[i];
      struct stat st {};
      // glibc's readdir() hides entries whose d_ino is 0.
      st.st_ino = e.ino != 0 ? e.ino : 0xffffffffu;
      st.st_mode = e.type;
      size_t need =
          fuse_add_direntry(req, buf.get() + used, size - used, e.name.c_str(),
                            &st, static_cast<off_t>(i + 1));
      if (need > size - used) break;
      used += need;
    }
    fuse_reply_buf(req, buf.get(), used);
  });
}

// readdir with attributes: the kernel fills its dentry and attribute caches
// from the listing, so `rm -rf`, `ls -l`, `find` or `git status` need no
// LOOKUP per entry afterwards. Every entry returned with attributes counts as
// one lookup, as for a LOOKUP reply; "." and ".." (and entries that vanished
// since opendir) go without attributes (node id 0), which counts nothing.
void OpReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   fuse_file_info* fi) {
  Guard(req, "readdirplus", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto* dir = reinterpret_cast<DirHandle*>(fi->fh);
    if (auto ok = RewindIfAsked(req, ino, *dir, off); !ok)
      return self->ReplyError(req, ok.error());
    auto dir_path = self->PathOf(ino);
    if (!dir_path) return self->ReplyError(req, dir_path.error());
    Caller c = self->CallerFor(req);
    std::unique_ptr<char[]> buf(new char[size]);
    size_t used = 0;
    // Lookups counted for this reply, to give back if it never arrives.
    std::vector<fuse_ino_t> counted;
    for (size_t i = static_cast<size_t>(off); i < dir->entries.size(); ++i) {
      const auto& d = dir->entries[i];
      fuse_entry_param e{};
      e.attr.st_ino = d.ino != 0 ? d.ino : 0xffffffffu;
      e.attr.st_mode = d.type;
      const bool dots = d.name == "." || d.name == "..";
      if (!dots) {
        auto path = dir_path->Child(d.name);
        auto st = path ? self->backend_.Stat(c, *path)
                       : Result<Attr>(std::unexpected(path.error()));
        if (st) {
          e.ino = self->Remember(ino, d.name, *st);
          e.attr = self->Shown(*st);
          e.attr_timeout = self->options_.attr_timeout;
          e.entry_timeout = self->options_.entry_timeout;
        }
      }
      size_t need =
          fuse_add_direntry_plus(req, buf.get() + used, size - used,
                                 d.name.c_str(), &e, static_cast<off_t>(i + 1));
      if (need > size - used) {
        if (e.ino != 0) self->Forget(e.ino, 1);  // not sent after all
        break;
      }
      if (e.ino != 0) counted.push_back(e.ino);
      used += need;
    }
    if (fuse_reply_buf(req, buf.get(), used) != 0) {
      // The kernel did not take the listing (interrupted, or gone).
      for (fuse_ino_t n : counted) self->Forget(n, 1);
    }
  });
}

void OpReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Self(req)->ReleaseDir(fi->fh);
  fuse_reply_err(req, 0);
}

void OpFsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  fuse_reply_err(req, 0);
}

void OpStatfs(fuse_req_t req, fuse_ino_t ino) {
  Guard(req, "statfs", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    auto path = self->PathOf(ino);
    if (!path) return self->ReplyError(req, path.error());
    auto st = self->backend_.StatFs(self->CallerFor(req), *path);
    if (!st) return self->ReplyError(req, st.error());
    fuse_reply_statfs(req, &*st);
  });
}

// ACLs stored as xattrs would not be enforced by the kernel's
// default_permissions checks, so they are refused rather than silently kept.
bool RefusedXattr(const char* name) {
  return std::strncmp(name, "system.", 7) == 0;
}

void OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name,
                const char* value, size_t size, int flags) {
  Guard(req, "setxattr", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    if (!self->options_.xattrs) return ReplyErr(req, ENOSYS);
    if (RefusedXattr(name)) return ReplyErr(req, EOPNOTSUPP);
    auto path = self->PathOf(ino);
    if (!path) return self->ReplyError(req, path.error());
    auto r = self->backend_.SetXattr(self->CallerFor(req), *path, name,
                                     std::string(value, size), flags);
    if (!r) return self->ReplyError(req, r.error());
    fuse_reply_err(req, 0);
  });
}

void ReplySized(fuse_req_t req, const std::string& data, size_t size) {
  if (size == 0) {
    fuse_reply_xattr(req, data.size());
  } else if (data.size() > size) {
    fuse_reply_err(req, ERANGE);
  } else {
    fuse_reply_buf(req, data.data(), data.size());
  }
}

void OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  Guard(req, "getxattr", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    if (!self->options_.xattrs) return ReplyErr(req, ENOSYS);
    if (RefusedXattr(name)) return ReplyErr(req, EOPNOTSUPP);
    auto path = self->PathOf(ino);
    if (!path) return self->ReplyError(req, path.error());
    auto v = self->backend_.GetXattr(self->CallerFor(req), *path, name);
    if (!v) return self->ReplyError(req, v.error());
    ReplySized(req, *v, size);
  });
}

void OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  Guard(req, "listxattr", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    if (!self->options_.xattrs) return ReplyErr(req, ENOSYS);
    auto path = self->PathOf(ino);
    if (!path) return self->ReplyError(req, path.error());
    auto names = self->backend_.ListXattr(self->CallerFor(req), *path);
    if (!names) return self->ReplyError(req, names.error());
    std::string joined;
    for (const auto& n : *names) {
      joined += n;
      joined.push_back('\0');
    }
    ReplySized(req, joined, size);
  });
}

void OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  Guard(req, "removexattr", [&] {
    auto* self = Self(req);
    auto tree = self->SharedTree();
    if (!self->options_.xattrs) return ReplyErr(req, ENOSYS);
    if (RefusedXattr(name)) return ReplyErr(req, EOPNOTSUPP);
    auto path = self->PathOf(ino);
    if (!path) return self->ReplyError(req, path.error());
    auto r = self->backend_.RemoveXattr(self->CallerFor(req), *path, name);
    if (!r) return self->ReplyError(req, r.error());
    fuse_reply_err(req, 0);
  });
}

void OpFallocate(fuse_req_t req, fuse_ino_t, int mode, off_t offset,
                 off_t length, fuse_file_info* fi) {
  vfs::FileHandle* h = FileOf(fi);
  Self(req)->Offload([req, h, mode, offset, length] {
    Guard(req, "fallocate", [&] {
      auto r = h->Allocate(mode, offset, length);
      if (!r) return Self(req)->ReplyError(req, r.error());
      fuse_reply_err(req, 0);
    });
  });
}

void OpLseek(fuse_req_t req, fuse_ino_t, off_t off, int whence,
             fuse_file_info* fi) {
  Guard(req, "lseek", [&] {
    int fd = FileOf(fi)->NativeFd();
    if (fd < 0) return ReplyErr(req, ENOSYS);
    off_t r = lseek(fd, off, whence);
    if (r < 0) return ReplyErr(req, errno);
    fuse_reply_lseek(req, r);
  });
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = OpInit;
  ops.lookup = OpLookup;
  ops.forget = OpForget;
  ops.forget_multi = OpForgetMulti;
  ops.getattr = OpGetattr;
  ops.setattr = OpSetattr;
  ops.readlink = OpReadlink;
  ops.mknod = OpMknod;
  ops.mkdir = OpMkdir;
  ops.unlink = OpUnlink;
  ops.rmdir = OpRmdir;
  ops.symlink = OpSymlink;
  ops.rename = OpRename;
  ops.link = OpLink;
  ops.open = OpOpen;
  ops.create = OpCreate;
  ops.read = OpRead;
  ops.write_buf = OpWriteBuf;
  ops.flush = OpFlush;
  ops.release = OpRelease;
  ops.fsync = OpFsync;
  ops.opendir = OpOpendir;
  ops.readdir = OpReaddir;
  ops.readdirplus = OpReaddirplus;
  ops.releasedir = OpReleasedir;
  ops.fsyncdir = OpFsyncdir;
  ops.statfs = OpStatfs;
  ops.setxattr = OpSetxattr;
  ops.getxattr = OpGetxattr;
  ops.listxattr = OpListxattr;
  ops.removexattr = OpRemovexattr;
  ops.fallocate = OpFallocate;
  ops.lseek = OpLseek;
  return ops;
}

// Makes the kernel offer FUSE over io_uring (fuse module parameter
// enable_uring), or says why it cannot and what to do.
Status EnableFuseUring() {
  const char* param = "/sys/module/fuse/parameters/enable_uring";
  std::ifstream in(param);
  std::string value;
  if (!in || !std::getline(in, value)) {
    return Fail(EOPNOTSUPP,
                "this kernel has no FUSE over io_uring (it needs Linux 6.14+ "
                "built with CONFIG_FUSE_IO_URING); mount without --io-uring");
  }
  if (value == "Y" || value == "1") return {};
  std::ofstream out(param);
  out << "Y";
  out.flush();
  if (!out) {
    return Fail(EPERM,
                "FUSE over io_uring is off in the kernel (fuse module "
                "parameter enable_uring=N); as root run `echo Y > " +
                    std::string(param) + "`, or mount without --io-uring");
  }
  Log()->info("turned on FUSE over io_uring ({}=Y)", param);
  return {};
}

}  // namespace

Status FuseServer::Impl::Start() {
  if (auto ok = CheckMountPoint(options_.mountpoint); !ok) return ok;
  if (options_.io_uring) {
    if (auto ok = EnableFuseUring(); !ok) return ok;
  }
  std::string opts =
      "default_permissions,fsname=" + options_.fsname + ",subtype=agentvfs";
  if (options_.allow_other) opts += ",allow_other";
  std::vector<std::string> argv_text = {"agentvfs", "-o", opts};
  if (options_.debug) {
    argv_text.push_back("-d");
    Log()->set_level(spdlog::level::debug);  // the server's own notes too
  }
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  static const fuse_lowlevel_ops ops = MakeOps();
  session_ = fuse_session_new(&args, &ops, sizeof(ops), this);
  fuse_opt_free_args(&args);  // libfuse may have copied them to the heap
  if (session_ == nullptr)
    return Fail(EINVAL, "libfuse refused the session options '" + opts + "'");
  if (fuse_session_mount(session_, options_.mountpoint.c_str()) != 0) {
    fuse_session_destroy(session_);
    session_ = nullptr;
    std::string hint =
        options_.allow_other
            ? " (allow_other needs root or user_allow_other in /etc/fuse.conf)"
            : " (is /dev/fuse available and fusermount3 installed?)";
    return Fail(EIO, "cannot mount at '" + options_.mountpoint + "'" + hint);
  }
  mounted_ = true;
  if ((options_.passthrough && !options_.writeback_cache) ||
      options_.io_uring) {
    // The same device, read and written through hooks that negotiate
    // passthrough and io_uring (IoRead, IoWritev) and hand ring requests'
    // replies to the ring.
    static const fuse_custom_io io = {
        .writev = &Impl::IoWritev,
        .read = &Impl::IoRead,
        .splice_receive = &Splice,
        .splice_send = &SpliceReply,
    };
    if (int rc =
            fuse_session_custom_io(session_, &io, fuse_session_fd(session_));
        rc != 0) {
      Log()->warn("cannot hook the FUSE device ({}); no passthrough",
                  std::strerror(-rc));
    }
  }
  RaiseReadahead(options_.mountpoint, kReadaheadKib);
  return {};
}

// The single-threaded loop. After each request it keeps asking the device
// for the next one for a short while before sleeping in poll(): a process
// that sends requests back to back (stat after stat) then finds the daemon
// awake, which saves the cross-CPU wake-up that dominates a round trip on a
// virtual machine. Idle, it costs nothing; busy, at most kSpinMicros of CPU
// after each request.
int FuseServer::Impl::PollingLoop() {
  const int fd = fuse_session_fd(session_);
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
    return fuse_session_loop(session_);
  fuse_buf buf{};
  int rc = 0;
  auto spin_until = std::chrono::steady_clock::now();
  while (!fuse_session_exited(session_)) {
    int res = fuse_session_receive_buf(session_, &buf);
    if (res == -EAGAIN) {
      if (std::chrono::steady_clock::now() < spin_until) continue;
      pollfd p{fd, POLLIN, 0};
      // The timeout bounds how long a signal that lands just before poll()
      // goes unnoticed.
      if (poll(&p, 1, 1000) < 0 && errno != EINTR) {
        rc = -errno;
        break;
      }
      continue;
    }
    if (res == -EINTR) continue;
    if (res <= 0) {
      if (res < 0) rc = res;
      break;
    }
    fuse_session_process_buf(session_, &buf);
    spin_until = std::chrono::steady_clock::now() +
                 std::chrono::microseconds(options_.poll_micros);
  }
  free(buf.mem);
  fuse_session_reset(session_);
  // As fuse_session_loop: a signal that ended the loop is reported as such.
  if (rc == 0 && fuse_session_exited(session_)) return 0;
  return rc;
}

void FuseServer::Impl::StartInvalidation() {
  if (listening_ || session_ == nullptr) return;
  invalidating_.store(true, std::memory_order_release);
  invalidator_ = std::jthread([this](std::stop_token stop) {
    InvalidationLoop(stop);
    invalidating_.store(false, std::memory_order_release);
  });
  backend_.SetChangeListener(&receiver_);
  listening_ = true;
}

// A notification the thread has sent may wait for a kernel lock that a
// request holds until it is answered: a LOOKUP holds its directory, which
// invalidating an entry in it takes. The loop has ended (or never ran), so
// nobody else would answer that request, and the join would wait forever
// (as would the process that sent it). So requests are served here, as
// usual, until the thread has returned; it stops after the notification in
// flight.
void FuseServer::Impl::StopInvalidation() {
  if (!listening_) return;
  backend_.SetChangeListener(nullptr);  // no Changed() after this returns
  listening_ = false;
  invalidator_.request_stop();
  ServeWhileInvalidating();
  invalidator_.join();
  std::lock_guard lock(inval_mu_);
  pending_.clear();
}

void FuseServer::Impl::ServeWhileInvalidating() {
  if (!invalidating_.load(std::memory_order_acquire)) return;
  const int fd = fuse_session_fd(session_);
  // Never block in a read: a request can be withdrawn between poll and read.
  if (const int fl = fcntl(fd, F_GETFL); fl >= 0 && !(fl & O_NONBLOCK))
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool aborted = false;
  fuse_buf buf{};
  while (invalidating_.load(std::memory_order_acquire)) {
    // The request the notification waits for may be gone: libfuse read it
    // after a stop signal and dropped it. Then only aborting the connection
    // ends the wait.
    if (!aborted && std::chrono::steady_clock::now() > deadline) {
      aborted = true;
      const bool ok = AbortConnection(options_.mountpoint);
      Log()->warn(
          "a cache notification still waited 5 s after the stop; {} the "
          "FUSE connection of {}",
          ok ? "aborted" : "could not abort", options_.mountpoint);
    }
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, /*timeout ms=*/10);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    // The connection ended: the kernel ended the notification with it.
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) break;
    // libfuse drops (never answers) a request it reads while the session
    // is marked exited, as a stop signal (even a second one) marks it.
    fuse_session_reset(session_);
    const int res = fuse_session_receive_buf(session_, &buf);
    if (res == -EAGAIN || res == -EINTR) continue;
    if (res <= 0) break;
    fuse_session_process_buf(session_, &buf);
  }
  free(buf.mem);
}

Status FuseServer::Impl::Run() {
  if (session_ == nullptr) return {};
  StartInvalidation();
  int rc;
  if (options_.threads <= 1) {
    rc = PollingLoop();
  } else {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, 1);
    fuse_loop_cfg_set_max_threads(cfg, options_.threads);
    fuse_loop_cfg_set_idle_threads(cfg, options_.threads);
    rc = fuse_session_loop_mt(session_, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  StopInvalidation();
  // A signal ends the loop with rc = signal number; that is a clean stop.
  if (rc < 0)
    return Fail(-rc, std::string("FUSE loop failed: ") + std::strerror(-rc));
  return {};
}

void FuseServer::Impl::Teardown() {
  StopInvalidation();  // before the session it writes to goes
  StopPool();
  if (session_ == nullptr) return;
  if (signals_) {
    fuse_remove_signal_handlers(session_);
    signals_ = false;
  }
  if (mounted_) {
    fuse_session_unmount(session_);
    mounted_ = false;
  }
  StopUring();  // before the session its threads use goes
  fuse_session_destroy(session_);
  session_ = nullptr;
  FreeHandles();  // no callback can run any more
}

bool FuseServer::Impl::PrepareUring() {
  std::lock_guard lock(uring_mu_);
  if (uring_stopped_ || uring_) return false;
  UringChannel::Config cfg;
  cfg.session = session_;
  cfg.dev_fd = fuse_session_fd(session_);
  // The kernel wants room for its largest message: max_write and as many
  // pages (OpInit); a page more leaves slack.
  cfg.payload_size = kMaxWrite + 4096;
  auto ch = UringChannel::Prepare(cfg);
  if (!ch) {
    Log()->warn(
        "FUSE over io_uring unavailable ({}); requests stay on "
        "/dev/fuse",
        ch.error().ToString());
    return false;
  }
  uring_ = std::move(*ch);
  return true;
}

void FuseServer::Impl::GoUring() {
  std::lock_guard lock(uring_mu_);
  if (uring_) uring_->Go();
}

void FuseServer::Impl::StopUring() {
  std::unique_ptr<UringChannel> ch;
  {
    std::lock_guard lock(uring_mu_);
    uring_stopped_ = true;  // no channel is made after this
    ch.swap(uring_);
  }
  if (ch) ch->Stop();
}

FuseServer::FuseServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FuseServer::~FuseServer() = default;

Result<std::unique_ptr<FuseServer>> FuseServer::Mount(vfs::Backend& backend,
                                                      FuseOptions options) {
  auto impl = std::make_unique<Impl>(backend, std::move(options));
  if (auto ok = impl->Start(); !ok) return std::unexpected(ok.error());
  return std::unique_ptr<FuseServer>(new FuseServer(std::move(impl)));
}

Status FuseServer::HandleSignals() {
  if (impl_->session_ == nullptr) return Fail(EINVAL, "not mounted");
  if (fuse_set_signal_handlers(impl_->session_) != 0)
    return Fail(EIO, "cannot install signal handlers");
  impl_->signals_ = true;
  return {};
}

Status FuseServer::Daemonize() {
  if (fuse_daemonize(0) != 0)
    return Fail(EIO, "cannot detach into the background");
  return {};
}

Status FuseServer::Run() { return impl_->Run(); }

void FuseServer::Unmount() { impl_->Teardown(); }

}  // namespace agentvfs::fuse
