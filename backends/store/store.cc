// StoreBackend (see store.h and docs/store.md): the policy of the store --
// auth checks, drafts and commits, leases and stale-writer checks, the change
// feed -- over the namespace tables of namespace.h.
//
// Locks, in the order they may be taken:
//   OpenNode::mu -> (engine's own locks) -> Impl::nodes_mu_
//   Impl::listener_mu_ is only held around ChangeListener::Changed calls.
// nodes_mu_ is only ever held for a map lookup; no engine transaction
// function takes OpenNode::mu.
#include "backends/store/store.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include "backends/store/admin.h"
#include "backends/store/namespace.h"
#include "spdlog/spdlog.h"
#include "vfs/path.h"

namespace agentvfs::store {

using vfs::Caller;
using vfs::Fail;
using vfs::Path;
using vfs::Result;
using vfs::Status;

namespace {

#define TRY(expr)                                     \
  do {                                                \
    if (auto _st = (expr); !_st) {                    \
      return std::unexpected(std::move(_st).error()); \
    }                                                 \
  } while (0)

#define TRY_ASSIGN(var, expr)                                                 \
  auto var##_result = (expr);                                                 \
  if (!var##_result) return std::unexpected(std::move(var##_result).error()); \
  auto var = std::move(*var##_result)

std::shared_ptr<spdlog::logger> Log() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = spdlog::get("store");
    return l ? l : spdlog::default_logger()->clone("store");
  }();
  return log;
}

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// This process's pid namespace ("pid:[4026531836]"), "" if unknown.
std::string PidNamespace() {
  char buf[64];
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Start time of a process (clock ticks since boot), 0 when it is gone.
int64_t ProcessStart(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  // Fields after "(comm)": state is field 3; starttime is field 22. A
  // zombie (dead, not yet reaped) or dying process holds nothing.
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3 && (field == "Z" || field == "X" || field == "x")) return 0;
    if (i == 22) return std::stoll(field);
  }
  return 0;
}

std::string FormatTime(int64_t ns) {
  time_t secs = ns / 1'000'000'000;
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// What a draft holds, chunk by chunk. A chunk that is a hole (or all
// zeros) is stored as no blob at all, so sparse files cost nothing and are
// hashed without reading their holes. The content hash is SHA-256 over the
// list of (chunk size, chunk hash) pairs: equal bytes give an equal hash,
// whatever their holes were.
struct ContentDigest {
  std::string hash;
  std::vector<std::string> chunk_hashes;  // "" for a hole
  std::vector<size_t> chunk_sizes;
  int64_t size = 0;
  int64_t stored = 0;  // bytes in non-hole chunks
};

// Contents up to this size that are not a hole are kept inline: their
// bytes are one `inline_bytes` row, with no chunk and no blob rows. Most
// memories are this small, and a commit of one then touches two small
// B-trees instead of four (docs/store.md).
constexpr int64_t kInlineMax = 64 * 1024;
static_assert(kInlineMax <= static_cast<int64_t>(kChunkSize));

bool Inline(const ContentDigest& d) {
  return d.size > 0 && d.size <= kInlineMax && d.chunk_hashes.size() == 1 &&
         !d.chunk_hashes[0].empty();
}

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* p, size_t n) { EVP_DigestUpdate(ctx_, p, n); }
  std::string Hex() {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, d, &n);
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out;
    for (unsigned i = 0; i < n; ++i) {
      out.push_back(kDigits[d[i] >> 4]);
      out.push_back(kDigits[d[i] & 0xf]);
    }
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

bool AllZero(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// A utimensat(2) time: the given one, now, or (UTIME_OMIT) the old one.
int64_t PickTime(const struct timespec& t, int64_t old, int64_t now) {
  if (t.tv_nsec == UTIME_OMIT) return old;
  if (t.tv_nsec == UTIME_NOW) return now;
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// Writes an inode's mode, owner and times; its ctime becomes `now`.
Status SaveAttrs(Txn& txn, const Inode& n, int64_t now) {
  auto u = txn.Exec(
      "UPDATE inodes SET mode = ?, uid = ?, gid = ?, atime_ns = ?, "
      "mtime_ns = ?, ctime_ns = ? WHERE ino = ?",
      {int64_t{n.mode}, n.uid, n.gid, n.atime_ns, n.mtime_ns, now, n.ino});
  if (!u) return std::unexpected(u.error());
  return {};
}

// A draft: what a session has written and not yet committed. Small drafts
// (most memories) live in memory; one that grows past kSpillAt, or is
// written at an offset beyond it (a sparse file), moves to an anonymous host
// file in the store's scratch directory, so the daemon never holds a big
// file in memory.
class Draft {
 public:
  static constexpr int64_t kSpillAt = int64_t{1} << 20;

  explicit Draft(std::string dir) : dir_(std::move(dir)) {}
  ~Draft() {
    if (fd_ >= 0) close(fd_);
  }
  Draft(const Draft&) = delete;
  Draft& operator=(const Draft&) = delete;

  int64_t Size() const {
    if (fd_ < 0) return static_cast<int64_t>(mem_.size());
    struct stat st;
    return fstat(fd_, &st) == 0 ? st.st_size : 0;
  }
  // 512-byte blocks in use (holes take none).
  int64_t Blocks() const {
    if (fd_ < 0) return (static_cast<int64_t>(mem_.size()) + 511) / 512;
    struct stat st;
    return fstat(fd_, &st) == 0 ? st.st_blocks : 0;
  }

  Result<size_t> Read(void* buf, size_t size, int64_t off) const {
    if (fd_ < 0) {
      if (off >= static_cast<int64_t>(mem_.size())) return size_t{0};
      size_t n = std::min(size, mem_.size() - static_cast<size_t>(off));
      memcpy(buf, mem_.data() + off, n);
      return n;
    }
    size_t have = 0;
    while (have < size) {
      ssize_t n = pread(fd_, static_cast<char*>(buf) + have, size - have,
                        off + static_cast<int64_t>(have));
      if (n < 0) {
        if (errno == EINTR) continue;
        return std::unexpected(vfs::FromErrno(errno, "read draft", ""));
      }
      if (n == 0) break;
      have += static_cast<size_t>(n);
    }
    return have;
  }

  Result<size_t> Write(const void* buf, size_t size, int64_t off) {
    if (fd_ < 0 && off + static_cast<int64_t>(size) > kSpillAt) {
      TRY(Spill());
    }
    if (fd_ < 0) {
      size_t end = static_cast<size_t>(off) + size;
      if (end > mem_.size()) mem_.resize(end, '\0');
      memcpy(mem_.data() + off, buf, size);
      return size;
    }
    size_t done = 0;
    while (done < size) {
      ssize_t n = pwrite(fd_, static_cast<const char*>(buf) + done, size - done,
                         off + static_cast<int64_t>(done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return std::unexpected(DraftError(errno, "write"));
      }
      done += static_cast<size_t>(n);
    }
    return size;
  }

  Status Truncate(int64_t size) {
    if (fd_ < 0 && size > kSpillAt) TRY(Spill());
    if (fd_ < 0) {
      mem_.resize(static_cast<size_t>(size), '\0');
      return {};
    }
    if (ftruncate(fd_, size) != 0) {
      return std::unexpected(DraftError(errno, "truncate"));
    }
    return {};
  }

  // True when [off, off + len) is known to hold no data (a hole of the
  // host file); false when it may hold data.
  bool IsHole(int64_t off, size_t len) const {
    if (fd_ < 0) return false;
    off_t data = lseek(fd_, off, SEEK_DATA);
    return (data < 0 && errno == ENXIO) ||
           (data >= off + static_cast<off_t>(len));
  }

 private:
  // A failed write or truncate of the draft's host file; a full disk says
  // where space is needed.
  vfs::Error DraftError(int err, std::string_view op) const {
    vfs::Error e = vfs::FromErrno(err, op, "");
    if (err == ENOSPC || err == EDQUOT) {
      e.message += " (the draft of this file lives in " + dir_ +
                   "; free some space there, then write again)";
    }
    return e;
  }

  Status Spill() {
    int fd = open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      std::string tmpl = dir_ + "/.agentvfs-draft-XXXXXX";
      fd = mkostemp(tmpl.data(), O_CLOEXEC);
      if (fd < 0) {
        return std::unexpected(vfs::FromErrno(errno, "create draft", dir_));
      }
      unlink(tmpl.c_str());
    }
    fd_ = fd;
    std::string mem = std::move(mem_);
    mem_.clear();
    mem_.shrink_to_fit();
    if (!mem.empty()) {
      auto n = Write(mem.data(), mem.size(), 0);
      if (!n) return std::unexpected(n.error());
    }
    return {};
  }

  std::string dir_;
  std::string mem_;  // the content while fd_ < 0
  int fd_ = -1;
};

Result<ContentDigest> DigestDraft(const Draft* draft) {
  ContentDigest d;
  d.size = draft != nullptr ? draft->Size() : 0;
  Sha256 whole;
  whole.Update("agentvfs-content-1", 18);
  std::string buf(static_cast<size_t>(std::min<int64_t>(
                      static_cast<int64_t>(kChunkSize), d.size)),
                  '\0');
  for (int64_t off = 0; off < d.size; off += static_cast<int64_t>(kChunkSize)) {
    size_t len = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(kChunkSize), d.size - off));
    bool hole = draft->IsHole(off, len);
    std::string chunk_hash;
    if (!hole) {
      TRY_ASSIGN(have, draft->Read(buf.data(), len, off));
      if (have != len)
        return Fail(EIO, "the draft shrank while it was committed");
      hole = AllZero(buf.data(), len);
      if (!hole) {
        Sha256 part;
        part.Update(buf.data(), len);
        chunk_hash = part.Hex();
        d.stored += static_cast<int64_t>(len);
      }
    }
    std::string entry = std::to_string(len) + ":" + chunk_hash + "\n";
    whole.Update(entry.data(), entry.size());
    d.chunk_hashes.push_back(std::move(chunk_hash));
    d.chunk_sizes.push_back(len);
  }
  d.hash = whole.Hex();
  return d;
}

std::string ParentOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

}  // namespace

// State of one file as open by one session: the draft shared by the
// session's write handles, and what the session last committed.
struct OpenNode {
  std::string session;
  int64_t ino = 0;
  std::mutex mu;  // guards everything below
  std::unique_ptr<Draft> draft;
  std::atomic<bool> has_draft{false};  // draft != nullptr, readable unlocked
  int64_t base_version = 0;            // version the draft is based on
  bool dirty = false;                  // the draft differs from base_version
  bool created = false;                // made by this session, never committed
  int64_t last_write_ns = 0;           // mtime to commit (0: keep the inode's)
  int writers = 0;                     // open write handles
  int lease_holders = 0;               // write handles holding the lease
  std::string path;                    // last known path
  // The last content this session committed (readers opened before follow).
  int64_t committed_version = 0;
  std::string committed_content;
  int64_t committed_size = 0;
  // Commit attempts end epochs: what any handle wrote in epoch E is in the
  // attempt that ends E. The failed ones (the last few), so that every
  // handle whose writes they held is told, not only the one that flushed.
  int64_t epoch = 0;
  std::map<int64_t, vfs::Error> failed;
  int64_t forgotten = -1;  // failures of epochs up to this one not kept
};

class StoreBackend::Impl {
 public:
  Impl(StoreBackend& owner, Engine& engine, AuthCache& auth,
       StoreOptions options)
      : owner_(owner), engine_(engine), auth_(auth), options_(options) {
    // Same host: same machine, same boot, same pid namespace (containers
    // on one kernel share the first two), where pids can be checked.
    host_ = ReadSmallFile("/etc/machine-id") + ":" +
            ReadSmallFile("/proc/sys/kernel/random/boot_id") + ":" +
            PidNamespace();
    pid_ = getpid();
    pid_start_ = ProcessStart(pid_);
    scratch_ = engine_.ScratchDir();
    instance_ = host_ + ":" + std::to_string(pid_) + ":" +
                std::to_string(pid_start_) + ":" +
                std::to_string(reinterpret_cast<uintptr_t>(this));
    background_ = std::thread([this] { Background(); });
  }

  ~Impl() {
    engine_.WatchChanges({});
    {
      std::lock_guard lock(bg_mu_);
      stopping_ = true;
    }
    bg_cv_.notify_all();
    background_.join();
  }

  // Requests that came through a frontend's kernel (FUSE: the caller has a
  // pid) are marked with this instance, so that its own poller does not ask
  // the kernel to forget what the kernel itself just did. Changes made
  // through the API (the harness's tools: no pid) are reported to it.
  std::string Origin(const Caller& c) const {
    return c.pid != 0 ? instance_ : std::string();
  }

  static std::unexpected<vfs::Error> NothingCommitted(vfs::Error e) {
    e.message += "; nothing was committed";
    return std::unexpected(std::move(e));
  }

  // --- auth ------------------------------------------------------------
  Result<std::shared_ptr<const Policy>> PolicyOf(const Caller& c) {
    TRY_ASSIGN(policy, auth_.PolicyFor(c.user));
    if (!policy->usable()) return Fail(EACCES, policy->why_not());
    return policy;
  }

  static Status NeedVisible(const Policy& p, const std::string& path) {
    if (!p.Visible(path)) return Fail(ENOENT, "no such file or directory");
    return {};
  }
  static Status NeedRead(const Policy& p, const std::string& path) {
    TRY(NeedVisible(p, path));
    if (p.LevelOf(path) < Level::kRead) {
      return Fail(EACCES, "user '" + p.user() + "' may not read " + path);
    }
    return {};
  }
  // For a name that may not exist yet, in a visible directory.
  static Status NeedCreate(const Policy& p, const std::string& path) {
    if (p.LevelOf(path) < Level::kWrite) {
      return Fail(EACCES, "user '" + p.user() + "' may not create " + path +
                              "; ask an admin for a write grant");
    }
    return {};
  }
  static Status NeedWrite(const Policy& p, const std::string& path) {
    TRY(NeedVisible(p, path));
    if (p.LevelOf(path) < Level::kWrite) {
      return Fail(EACCES, "user '" + p.user() + "' may read but not write " +
                              path + "; ask an admin for a write grant");
    }
    return {};
  }

  // Removing or moving a name changes its directory, so the caller needs
  // write there as well: a grant lets its holders change what is below the
  // granted directory, not remove or carry off the directory itself.
  static Status NeedRemove(const Policy& p, const std::string& path) {
    TRY(NeedWrite(p, path));
    std::string parent = ParentOf(path);
    if (p.LevelOf(parent) < Level::kWrite) {
      return Fail(EACCES, "user '" + p.user() + "' may not remove or move " +
                              path + ": a grant starts there, and only who " +
                              "may write " + parent + " may do that");
    }
    return {};
  }

  // --- open nodes ------------------------------------------------------
  std::shared_ptr<OpenNode> GetNode(const std::string& session, int64_t ino) {
    std::lock_guard lock(nodes_mu_);
    auto& weak = nodes_[{session, ino}];
    auto node = weak.lock();
    if (!node) {
      node = std::make_shared<OpenNode>();
      node->session = session;
      node->ino = ino;
      weak = node;
    }
    return node;
  }
  std::shared_ptr<OpenNode> FindNode(const std::string& session, int64_t ino) {
    std::lock_guard lock(nodes_mu_);
    auto it = nodes_.find({session, ino});
    if (it == nodes_.end()) return nullptr;
    auto node = it->second.lock();
    if (!node) nodes_.erase(it);
    return node;
  }

  // The session read (or wrote) `version` of file `ino`, found at `path`
  // (canonical; "" when not known). Returns the version it had seen before.
  std::optional<int64_t> SetSeen(const std::string& session, int64_t ino,
                                 int64_t version, const std::string& path) {
    std::lock_guard lock(nodes_mu_);
    if (!path.empty()) seen_at_[{session, path}] = ino;
    auto [it, added] = seen_.try_emplace({session, ino}, version);
    if (added) return std::nullopt;
    return std::exchange(it->second, version);
  }
  std::optional<int64_t> Seen(const std::string& session, int64_t ino) {
    std::lock_guard lock(nodes_mu_);
    auto it = seen_.find({session, ino});
    if (it == seen_.end()) return std::nullopt;
    return it->second;
  }
  // The session looked `path` up and found no file there (0 in seen_at_):
  // a file another session makes there afterwards is one it never saw.
  // Misses that no open follows (probes for optional files) are forgotten
  // in bulk past a bound.
  void SetMissing(const std::string& session, const std::string& path) {
    std::lock_guard lock(nodes_mu_);
    auto [it, added] = seen_at_.try_emplace({session, path}, 0);
    if (!added) {
      if (it->second == 0) return;
      it->second = 0;
    }
    if (++missing_ <= 100000) return;
    std::erase_if(seen_at_, [](const auto& e) { return e.second == 0; });
    missing_ = 0;
  }
  // The session itself put file `ino` at `path` (a rename, a link): it
  // knows what is there, whatever it found there before.
  void SetSeenAt(const std::string& session, const std::string& path,
                 int64_t ino) {
    std::lock_guard lock(nodes_mu_);
    seen_at_[{session, path}] = ino;
  }
  // The file the session last saw at `path` (0: none was there).
  std::optional<int64_t> SeenAt(const std::string& session,
                                const std::string& path) {
    std::lock_guard lock(nodes_mu_);
    auto it = seen_at_.find({session, path});
    if (it == seen_at_.end()) return std::nullopt;
    return it->second;
  }

  // Draft overlay for stat: what this session sees of a file it is writing.
  void Overlay(const Caller& c, vfs::Attr& st) {
    auto node = FindNode(
        c.session,
        static_cast<int64_t>(static_cast<uint64_t>(st.st_ino) & ~kStoreInoBit));
    if (!node) return;
    std::lock_guard lock(node->mu);
    if (node->draft) {
      st.st_size = node->draft->Size();
      st.st_blocks = node->draft->Blocks();
      if (node->last_write_ns > 0) {
        st.st_mtim.tv_sec = node->last_write_ns / 1'000'000'000;
        st.st_mtim.tv_nsec = node->last_write_ns % 1'000'000'000;
      }
    }
  }

  // --- leases and staleness -------------------------------------------
  bool LeaseAlive(const Row& r, int64_t now) const {
    // r: session, user, host, pid, pid_start, expires_ns
    if (AsInt(r[5]) <= now) return false;
    if (AsText(r[2]) == host_) {
      pid_t pid = static_cast<pid_t>(AsInt(r[3]));
      if (ProcessStart(pid) != AsInt(r[4])) return false;  // holder died
    }
    return true;
  }

  // EBUSY when another live session holds the lease of `ino`.
  Status CheckLease(Txn& txn, const Caller& c, int64_t ino,
                    const std::string& path, int64_t now) {
    auto rows = txn.Query(
        "SELECT session, \"user\", host, pid, pid_start, expires_ns FROM leases "
        "WHERE ino = ?",
        {ino});
    if (!rows) return std::unexpected(rows.error());
    if (rows->empty()) return {};
    const Row& r = (*rows)[0];
    if (AsText(r[0]) == c.session) return {};
    if (!LeaseAlive(r, now)) return {};
    return Fail(EBUSY, path + " is open for writing by user '" + AsText(r[1]) +
                           "' (session " + AsText(r[0]) +
                           "); try again after they close it");
  }

  Status TakeLease(Txn& txn, const Caller& c, int64_t ino, int64_t now) {
    auto ok = txn.Exec(
        "INSERT INTO leases(ino, session, \"user\", host, pid, pid_start, "
        "expires_ns) VALUES(?, ?, ?, ?, ?, ?, ?) ON CONFLICT(ino) DO UPDATE "
        "SET session = excluded.session, \"user\" = excluded.\"user\", "
        "host = excluded.host, pid = excluded.pid, "
        "pid_start = excluded.pid_start, expires_ns = excluded.expires_ns",
        {ino, c.session, c.user, host_, int64_t{pid_}, pid_start_,
         now + options_.lease_ttl.count() * 1'000'000});
    if (!ok) return std::unexpected(ok.error());
    std::lock_guard lock(held_mu_);
    held_.try_emplace({c.session, ino}, 0);
    return {};
  }

  // Ends the session's lease of `ino`, unless an open of the session took
  // it in a transaction of its own and has not registered as a holder yet
  // (MarkOpening): that open holds the lease from now on.
  // The lease is no longer renewed from here on, even if this transaction
  // fails (its row then runs out on its own).
  Status DropLease(Txn& txn, const Caller& c, int64_t ino) {
    {
      std::lock_guard lock(held_mu_);
      auto it = held_.find({c.session, ino});
      if (it != held_.end() && it->second > 0) return {};
      if (it != held_.end()) held_.erase(it);
    }
    auto ok = txn.Exec("DELETE FROM leases WHERE ino = ? AND session = ?",
                       {ino, c.session});
    if (!ok) return std::unexpected(ok.error());
    return {};
  }

  // An open that took the lease of `ino` in its transaction (+1, inside
  // that transaction) and has since registered as a holder on the
  // session's node, or failed to commit (-1). Write transactions of this
  // process run one at a time, so a release either ran before the open's
  // transaction (which then takes the lease anew) or sees the mark.
  void MarkOpening(const std::string& session, int64_t ino, int delta) {
    std::lock_guard lock(held_mu_);
    auto it = held_.find({session, ino});
    if (it == held_.end()) {
      if (delta > 0) held_.emplace(std::pair{session, ino}, delta);
      return;
    }
    it->second += delta;
  }

  // An open whose transaction took the lease of `ino` and then failed. The
  // failure may be a lost acknowledgement (the connection broke while the
  // server committed), so the lease row may well exist: unless another
  // handle or open of the session holds the lease, it is no longer renewed
  // and, if the database answers, removed (else it runs out on its own).
  // Before, the row was renewed for as long as the process lived, and every
  // other session's open got EBUSY for a file nobody had open.
  void ForgetFailedOpen(const Caller& c, int64_t ino) {
    // As at a release, the session's node stays locked until the row is
    // gone: an open registering as a holder meanwhile would need it, and one
    // that took the lease in its transaction keeps it (DropLease sees it).
    auto node = GetNode(c.session, ino);
    std::lock_guard node_lock(node->mu);
    {
      std::lock_guard lock(held_mu_);
      auto it = held_.find({c.session, ino});
      if (it == held_.end()) return;
      --it->second;
      if (it->second > 0 || node->lease_holders > 0) return;
    }
    auto dropped = engine_.Write(Durability::kProcess, [&](Txn& txn) -> Status {
      return DropLease(txn, c, ino);
    });
    if (!dropped) {
      // The row runs out on its own: it is no longer renewed.
      std::lock_guard lock(held_mu_);
      auto it = held_.find({c.session, ino});
      if (it != held_.end() && it->second == 0) held_.erase(it);
      Log()->warn("dropping the write lease of a failed open: {}",
                  dropped.error().ToString());
    }
  }

  // ESTALE when the session read an older version than the current one and
  // someone else committed since. A session that found no file at the path
  // and never read the one another session made there since gets
  // `blind_errno` (an open: EEXIST, as the second of two creates).
  Status CheckStale(Txn& txn, const Caller& c, const Inode& node,
                    const std::string& path, int blind_errno = ESTALE,
                    bool appending = false) {
    auto seen = Seen(c.session, node.ino);
    if (!seen) {
      // Never read this file; but if the session read another one at this
      // path, that was replaced since (saved over by a rename, as editors
      // and `sed -i` do, or removed and made again), or found none there:
      // writing here would overwrite a version the session never saw.
      auto at = SeenAt(c.session, path);
      if (!at || *at == node.ino) return {};
      // An append adds to what is there, whoever made it: no bytes of the
      // file another session made are replaced.
      if (*at == 0 && appending) return {};
      auto rows = txn.Query(
          "SELECT author, session, time_ns FROM versions "
          "WHERE ino = ? AND n = ?",
          {node.ino, node.version});
      if (!rows) return std::unexpected(rows.error());
      if (!rows->empty() && AsText((*rows)[0][1]) == c.session) return {};
      if (*at == 0) {
        return Fail(
            blind_errno,
            path + " was made by " +
                (rows->empty() ? "another session"
                               : "user '" + AsText((*rows)[0][0]) + "' at " +
                                     FormatTime(AsInt((*rows)[0][2]))) +
                " after this session found no file there; read the "
                "file, then write");
      }
      if (rows->empty()) return {};
      const Row& r = (*rows)[0];
      return Fail(ESTALE, path + " was replaced by user '" + AsText(r[0]) +
                              "' at " + FormatTime(AsInt(r[2])) +
                              " (another file now has the name) after this "
                              "session read it; read the file again, then "
                              "write");
    }
    if (*seen == node.version) return {};
    auto rows = txn.Query(
        "SELECT author, session, time_ns FROM versions WHERE ino = ? AND n = ?",
        {node.ino, node.version});
    if (!rows) return std::unexpected(rows.error());
    if (rows->empty()) return {};
    const Row& r = (*rows)[0];
    if (AsText(r[1]) == c.session) return {};
    return Fail(ESTALE, path + " was changed by user '" + AsText(r[0]) +
                            "' at " + FormatTime(AsInt(r[2])) + " (version " +
                            std::to_string(node.version) +
                            ") after this session read version " +
                            std::to_string(*seen) +
                            "; read the file again, then write");
  }

  // --- content ---------------------------------------------------------
  // Where the bytes of a content are: inline in its row, or in chunks.
  struct Layout {
    bool found = false;  // false: no such content (purged)
    int64_t size = 0;
    std::optional<std::string> inline_data;
    std::vector<std::pair<int64_t, int64_t>> blobs;  // (blob id or 0, size)
  };

  static Status LoadLayout(Txn& txn, const std::string& hash, Layout& out) {
    out = Layout{};
    auto rows = txn.Query(
        "SELECT c.size, c.inline_id, i.data FROM contents c "
        "LEFT JOIN inline_bytes i ON i.id = c.inline_id WHERE c.hash = ?",
        {hash});
    if (!rows) return std::unexpected(rows.error());
    if (rows->empty()) return {};
    Row& r = (*rows)[0];
    if (!IsNull(r[1]) && IsNull(r[2])) return {};  // its bytes are gone
    out.found = true;
    out.size = AsInt(r[0]);
    if (!IsNull(r[1])) {
      out.inline_data = AsText(r[2]);
      return {};
    }
    auto chunks = txn.Query(
        "SELECT c.blob, COALESCE(b.size, 0) FROM chunks c "
        "LEFT JOIN blobs b ON b.id = c.blob WHERE c.content = ? "
        "ORDER BY c.seq",
        {hash});
    if (!chunks) return std::unexpected(chunks.error());
    for (const auto& c : *chunks)
      out.blobs.emplace_back(AsInt(c[0]), AsInt(c[1]));
    return {};
  }

  // Gives the session's node of a file a new draft based on `version`,
  // holding `content` (nullptr: empty), clean (node.mu held).
  Status SeedDraft(OpenNode& node, const std::string* content,
                   int64_t version) {
    auto draft = std::make_unique<Draft>(scratch_);
    if (content != nullptr) TRY(CopyContentTo(*content, *draft));
    node.draft = std::move(draft);
    node.has_draft = true;
    node.base_version = version;
    node.dirty = false;
    node.last_write_ns = 0;
    return {};
  }

  // Writes the content `hash` into `draft` from offset 0.
  Status CopyContentTo(const std::string& hash, Draft& draft) {
    if (hash.empty()) return {};
    Layout layout;
    TRY(engine_.Read(
        [&](Txn& txn) -> Status { return LoadLayout(txn, hash, layout); }));
    if (!layout.found) return Fail(EIO, "this content was purged");
    if (layout.inline_data) {
      const std::string& data = *layout.inline_data;
      auto put = draft.Write(data.data(), data.size(), 0);
      if (!put) return std::unexpected(put.error());
      return draft.Truncate(layout.size);
    }
    std::string buf;
    off_t off = 0;
    for (auto [id, size] : layout.blobs) {
      if (id == 0) {  // a hole stays a hole
        off += static_cast<off_t>(kChunkSize);
        continue;
      }
      buf.resize(static_cast<size_t>(size));
      TRY(engine_.Read([&](Txn& txn) -> Status {
        auto n = txn.ReadBlob("blobs", "data", id, buf.data(),
                              static_cast<size_t>(size), 0);
        if (!n) return std::unexpected(n.error());
        return {};
      }));
      auto put = draft.Write(buf.data(), buf.size(), off);
      if (!put) return std::unexpected(put.error());
      off += size;
    }
    return draft.Truncate(layout.size);
  }

  // Stores the draft's content inside `txn` (inline, or the chunks not
  // stored yet) and counts one more version referring to it.
  Status StoreContent(Txn& txn, const Draft* draft, const ContentDigest& d) {
    auto known = txn.Exec("UPDATE contents SET refs = refs + 1 WHERE hash = ?",
                          {d.hash});
    if (!known) return std::unexpected(known.error());
    if (*known > 0) return {};
    if (Inline(d)) {
      // The bytes in one row of inline_bytes, the content pointing at it.
      std::string buf(static_cast<size_t>(d.size), '\0');
      TRY_ASSIGN(got, draft->Read(buf.data(), buf.size(), 0));
      if (got != buf.size()) {
        return Fail(EIO, "the draft changed while it was committed");
      }
      auto id =
          txn.Query("INSERT INTO inline_bytes(data) VALUES(?) RETURNING id",
                    {Bytes{std::move(buf)}});
      if (!id) return std::unexpected(id.error());
      auto ins = txn.Exec(
          "INSERT INTO contents(hash, size, chunks, refs, inline_id) "
          "VALUES(?, ?, 1, 1, ?)",
          {d.hash, d.size, AsInt((*id)[0][0])});
      if (!ins) return std::unexpected(ins.error());
      return {};
    }
    std::string buf;
    int64_t off = 0;
    for (size_t i = 0; i < d.chunk_hashes.size(); ++i) {
      int64_t id = 0;  // 0: a hole, no blob
      if (!d.chunk_hashes[i].empty()) {
        auto shared = txn.Query(
            "UPDATE blobs SET refs = refs + 1 WHERE hash = ? RETURNING id",
            {d.chunk_hashes[i]});
        if (!shared) return std::unexpected(shared.error());
        if (!shared->empty()) {
          id = AsInt((*shared)[0][0]);
        } else {
          buf.resize(d.chunk_sizes[i]);
          TRY_ASSIGN(got, draft->Read(buf.data(), buf.size(), off));
          if (got != buf.size()) {
            return Fail(EIO, "the draft changed while it was committed");
          }
          auto ins = txn.Query(
              "INSERT INTO blobs(hash, size, data, refs) VALUES(?, ?, ?, 1) "
              "RETURNING id",
              {d.chunk_hashes[i], static_cast<int64_t>(buf.size()),
               Bytes{buf}});
          if (!ins) return std::unexpected(ins.error());
          id = AsInt((*ins)[0][0]);
        }
      }
      auto ch =
          txn.Exec("INSERT INTO chunks(content, seq, blob) VALUES(?, ?, ?)",
                   {d.hash, static_cast<int64_t>(i), id});
      if (!ch) return std::unexpected(ch.error());
      off += static_cast<int64_t>(d.chunk_sizes[i]);
    }
    auto ins = txn.Exec(
        "INSERT INTO contents(hash, size, chunks, refs) VALUES(?, ?, ?, 1)",
        {d.hash, d.size, static_cast<int64_t>(d.chunk_hashes.size())});
    if (!ins) return std::unexpected(ins.error());
    return {};
  }

  // Adds the next version of file `ino`, made at `path`, holding the
  // content `digest` describes (the bytes from `draft` when the store has
  // not got them yet), and makes it the file's current content. Returns its
  // number.
  Result<int64_t> AppendVersion(Txn& txn, const Caller& c, int64_t ino,
                                const std::string& path, const Draft* draft,
                                const ContentDigest& digest, mode_t mode,
                                int64_t mtime, int64_t now) {
    TRY(StoreContent(txn, draft, digest));
    auto maxn = txn.Query(
        "SELECT COALESCE(MAX(n), 0) FROM versions WHERE ino = ?", {ino});
    if (!maxn) return std::unexpected(maxn.error());
    int64_t n = AsInt((*maxn)[0][0]) + 1;
    auto v = txn.Exec(
        "INSERT INTO versions(ino, n, path, author, session, time_ns, size, "
        "content, mode) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
        {ino, n, path, c.user, c.session, now, digest.size, digest.hash,
         int64_t{mode}});
    if (!v) return std::unexpected(v.error());
    auto u = txn.Exec(
        "UPDATE inodes SET version = ?, content = ?, size = ?, blocks = ?, "
        "mtime_ns = ?, ctime_ns = ? WHERE ino = ?",
        {n, digest.hash, digest.size, digest.stored, mtime, now, ino});
    if (!u) return std::unexpected(u.error());
    return n;
  }

  // Commits the draft of `node` (node->mu held). `release` also ends the
  // session's lease in the same transaction.
  Status Commit(const Caller& c, OpenNode& node, Durability durability,
                bool release) {
    // Grants are checked again at each commit: a handle opened before a
    // revoke or a disable commits nothing after it.
    auto policy = PolicyOf(c);
    if (!policy) return NothingCommitted(policy.error());
    TRY_ASSIGN(digest, DigestDraft(node.draft.get()));
    int64_t now = NowNs();
    int64_t committed = 0;
    TRY(engine_.Write(durability, [&](Txn& txn) -> Status {
      TRY_ASSIGN(inode, LoadInode(txn, node.ino));
      if (!inode) return Fail(ENOENT, "the file was purged while open");
      // Someone else holding the lease now means ours ran out.
      auto lease = txn.Query(
          "SELECT session, \"user\", host, pid, pid_start, expires_ns FROM leases "
          "WHERE ino = ?",
          {node.ino});
      if (!lease) return std::unexpected(lease.error());
      if (!lease->empty() && AsText((*lease)[0][0]) != c.session &&
          LeaseAlive((*lease)[0], now)) {
        return Fail(EBUSY, node.path +
                               ": this session's write lease ran out "
                               "and user '" +
                               AsText((*lease)[0][1]) +
                               "' is writing the file now; nothing was "
                               "committed; read it again and redo the change");
      }
      if (inode->version != node.base_version) {
        auto rows = txn.Query(
            "SELECT author, time_ns FROM versions WHERE ino = ? AND n = ?",
            {node.ino, inode->version});
        std::string who = rows && !rows->empty() ? AsText((*rows)[0][0]) : "?";
        int64_t when = rows && !rows->empty() ? AsInt((*rows)[0][1]) : 0;
        return Fail(ESTALE, node.path + " was changed by user '" + who +
                                "' at " + FormatTime(when) + " (version " +
                                std::to_string(inode->version) +
                                ") while this session was writing it; nothing "
                                "was committed; read it again and redo the "
                                "change");
      }
      // The name written through while it still is one of the file's: a
      // file with several names (hard links) is committed, checked and
      // recorded in its history under the one the writer used.
      std::string path = node.path;
      bool named = false;
      if (inode->nlink > 1 && !path.empty()) {
        auto w = Walk(txn, path, false);
        named = w && w->node && w->node->ino == node.ino;
      }
      if (!named) {
        TRY_ASSIGN(any, AnyPath(txn, node.ino));
        if (!any.empty()) path = any;
      }
      if (auto ok = NeedWrite(**policy, path); !ok)
        return NothingCommitted(ok.error());
      int64_t mtime =
          node.last_write_ns > 0 ? node.last_write_ns : inode->mtime_ns;
      TRY_ASSIGN(n, AppendVersion(txn, c, node.ino, path, node.draft.get(),
                                  digest, inode->mode, mtime, now));
      if (!path.empty())
        TRY(RecordChange(txn, path, c.session, now, Origin(c)));
      if (release) TRY(DropLease(txn, c, node.ino));
      committed = n;
      return {};
    }));
    node.base_version = committed;
    node.dirty = false;
    node.created = false;
    node.committed_version = committed;
    node.committed_content = digest.hash;
    node.committed_size = digest.size;
    if (node.last_write_ns > 0) node.last_write_ns = 0;
    SetSeen(c.session, node.ino, committed, node.path);
    return {};
  }

  // --- background: lease renewal, change feed, pruning -----------------
  void SetListener(vfs::ChangeListener* listener) {
    int64_t start = 0;
    if (listener != nullptr) {
      (void)engine_.Read([&](Txn& txn) -> Status {
        auto rows = txn.Query("SELECT COALESCE(MAX(seq), 0) FROM changes");
        if (rows && !rows->empty()) start = AsInt((*rows)[0][0]);
        return {};
      });
    }
    {
      std::lock_guard lock(listener_mu_);
      listener_ = listener;
      last_seq_ = start;
    }
    // Engines that can tell when the feed grew (PostgreSQL's LISTEN) wake
    // the poller at once; the poll interval stays as the fallback.
    if (listener != nullptr) {
      engine_.WatchChanges([this] {
        {
          std::lock_guard lock(bg_mu_);
          change_hint_ = true;
        }
        bg_cv_.notify_all();
      });
    } else {
      engine_.WatchChanges({});
    }
  }

  void Background() {
    auto renew_every = options_.lease_ttl / 3;
    auto last_renew = std::chrono::steady_clock::now();
    auto last_prune = std::chrono::steady_clock::time_point{};
    auto last_grants = std::chrono::steady_clock::now();
    std::unique_lock lock(bg_mu_);
    while (!stopping_) {
      bg_cv_.wait_for(lock, options_.poll_interval,
                      [this] { return stopping_ || change_hint_; });
      if (stopping_) break;
      change_hint_ = false;
      lock.unlock();
      auto now = std::chrono::steady_clock::now();
      if (now - last_renew >= renew_every) {
        last_renew = now;
        RenewLeases();
      }
      if (now - last_prune >= std::chrono::minutes(1)) {
        last_prune = now;
        (void)engine_.Write(Durability::kProcess, [&](Txn& txn) -> Status {
          auto d = txn.Exec("DELETE FROM changes WHERE time_ns < ?",
                            {NowNs() - int64_t{600} * 1'000'000'000});
          if (!d) return std::unexpected(d.error());
          return {};
        });
      }
      if (now - last_grants >= options_.auth_ttl) {
        last_grants = now;
        PollGrants();
      }
      PollChanges();
      lock.lock();
    }
  }

  // Extends the leases this process holds, and only those: a row left
  // behind (a release whose transaction failed) runs out on its own. A
  // lease whose row is gone or belongs to another session now (it ran out
  // and was taken) is no longer held.
  void RenewLeases() {
    std::vector<std::pair<std::string, int64_t>> keys;
    {
      std::lock_guard lock(held_mu_);
      for (const auto& [key, opening] : held_) keys.push_back(key);
    }
    if (keys.empty()) return;
    // A holder whose user may no longer write the file (a revoked grant, a
    // team left, a disabled user) gives its lease up here: renewed for as
    // long as the handle stayed open, it kept everyone else, admins
    // included, out of the file. The handle's commit is refused anyway.
    struct Holder {
      std::pair<std::string, int64_t> key;
      std::string user, path;
    };
    std::vector<Holder> holders;
    (void)engine_.Read([&](Txn& txn) -> Status {
      for (const auto& key : keys) {
        auto row = txn.Query(
            "SELECT \"user\" FROM leases WHERE ino = ? AND session = ?",
            {key.second, key.first});
        auto path = AnyPath(txn, key.second);
        // A store error or an unlinked file: renewed as before.
        if (!row || row->empty() || !path || path->empty()) continue;
        holders.push_back({key, AsText((*row)[0][0]), *path});
      }
      return {};
    });
    std::set<std::pair<std::string, int64_t>> lost;
    for (const auto& h : holders) {
      auto policy = auth_.PolicyFor(h.user);
      if (policy && (*policy)->LevelOf(h.path) < Level::kWrite) {
        Log()->info(
            "write lease of {} given up: user '{}' may no longer "
            "write it",
            h.path, h.user);
        lost.insert(h.key);
      }
    }
    auto ok = engine_.Write(Durability::kProcess, [&](Txn& txn) -> Status {
      int64_t expires = NowNs() + options_.lease_ttl.count() * 1'000'000;
      for (const auto& [session, ino] : keys) {
        if (lost.contains({session, ino})) {
          auto d = txn.Exec(
              "DELETE FROM leases WHERE ino = ? AND session = ? AND host = ? "
              "AND pid = ? AND pid_start = ?",
              {ino, session, host_, int64_t{pid_}, pid_start_});
          if (!d) return std::unexpected(d.error());
          std::lock_guard lock(held_mu_);
          // (An open of the session registering as a holder meanwhile keeps
          // its mark; its commit is refused by the grants anyway.)
          auto it = held_.find({session, ino});
          if (it != held_.end() && it->second == 0) held_.erase(it);
          continue;
        }
        auto u = txn.Exec(
            "UPDATE leases SET expires_ns = ? WHERE ino = ? AND session = ? "
            "AND host = ? AND pid = ? AND pid_start = ?",
            {expires, ino, session, host_, int64_t{pid_}, pid_start_});
        if (!u) return std::unexpected(u.error());
        if (*u == 0) {
          std::lock_guard lock(held_mu_);
          auto it = held_.find({session, ino});
          if (it != held_.end() && it->second == 0) held_.erase(it);
        }
      }
      return {};
    });
    if (!ok) Log()->warn("renewing write leases: {}", ok.error().ToString());
  }

  // A frontend's kernel keeps names and attributes for its cache timeout,
  // which may be long: where a user's grants changed (or the user was
  // disabled), it is told to forget what it cached, so that a revoked name
  // stops answering stat at once, as it stops answering open.
  void PollGrants() {
    std::lock_guard lock(listener_mu_);
    if (listener_ == nullptr) return;
    auto changed = auth_.Refresh();
    if (!changed) {
      Log()->warn("reloading grants: {}", changed.error().ToString());
      return;
    }
    std::set<std::string> paths;
    for (const auto& prefix : *changed) {
      if (prefix == "/") {
        paths.insert({"/memories", "/skills"});
        continue;
      }
      // The prefix, and the directories above it, whose listings and
      // visibility may follow from it.
      for (std::string p = prefix; p.size() > 1; p = ParentOf(p))
        paths.insert(p);
    }
    for (const auto& p : paths) {
      if (auto path = Path::Parse(p)) listener_->Changed(*path);
    }
  }

  void PollChanges() {
    std::lock_guard lock(listener_mu_);
    if (listener_ == nullptr) return;
    std::vector<std::string> paths;
    (void)engine_.Read([&](Txn& txn) -> Status {
      // Only other frontends' changes are read; the feed's end is taken in
      // the same snapshot, so a batch that is not full covers everything up
      // to it (a busy mount's own changes are most of the feed).
      constexpr int64_t kBatch = 2000;
      auto end = txn.Query("SELECT COALESCE(MAX(seq), 0) FROM changes");
      if (!end) return std::unexpected(end.error());
      auto rows = txn.Query(
          "SELECT seq, path FROM changes WHERE seq > ? AND origin != ? "
          "ORDER BY seq LIMIT " +
              std::to_string(kBatch),
          {last_seq_, instance_});
      if (!rows) return std::unexpected(rows.error());
      for (const auto& r : *rows) paths.push_back(AsText(r[1]));
      if (static_cast<int64_t>(rows->size()) < kBatch) {
        last_seq_ = std::max(last_seq_, AsInt((*end)[0][0]));
      } else {
        last_seq_ = AsInt(rows->back()[0]);
      }
      return {};
    });
    for (const auto& p : paths) {
      auto path = Path::Parse(p);
      if (path) listener_->Changed(*path);
    }
  }

  StoreBackend& owner_;
  Engine& engine_;
  AuthCache& auth_;
  StoreOptions options_;
  std::string host_;
  pid_t pid_;
  int64_t pid_start_;
  std::string scratch_;
  std::string instance_;  // this backend among all processes of the store
  // Leases this process holds, by (session, ino), with the number of opens
  // that took the lease and have not registered as holders yet.
  std::mutex held_mu_;
  std::map<std::pair<std::string, int64_t>, int> held_;

  std::mutex nodes_mu_;  // guards nodes_ and seen_
  std::map<std::pair<std::string, int64_t>, std::weak_ptr<OpenNode>> nodes_;
  std::map<std::pair<std::string, int64_t>, int64_t> seen_;
  // (session, canonical path) -> the inode the session last saw there, or
  // 0 when it found none (SetMissing; missing_ counts those).
  std::map<std::pair<std::string, std::string>, int64_t> seen_at_;
  size_t missing_ = 0;

  std::mutex listener_mu_;  // guards listener_, last_seq_
  vfs::ChangeListener* listener_ = nullptr;
  int64_t last_seq_ = 0;

  std::mutex bg_mu_;  // guards stopping_ and change_hint_
  std::condition_variable bg_cv_;
  bool stopping_ = false;
  bool change_hint_ = false;  // the engine says the change feed grew
  std::thread background_;
};

namespace {

// An open store file. Write handles share their session's draft; read
// handles read the draft when their session has one, else the content that
// was current at open (or what their session committed since).
class StoreFile final : public vfs::FileHandle {
 public:
  StoreFile(StoreBackend::Impl& impl, Caller caller,
            std::shared_ptr<OpenNode> node, int flags, bool holds_lease,
            std::string content, int64_t size, int64_t version)
      : impl_(impl),
        caller_(std::move(caller)),
        node_(std::move(node)),
        flags_(flags),
        holds_lease_(holds_lease),
        content_(std::move(content)),
        size_(size),
        version_(version) {
    int acc = flags & O_ACCMODE;
    can_read_ = acc == O_RDONLY || acc == O_RDWR;
    can_write_ = acc == O_WRONLY || acc == O_RDWR;
  }

  ~StoreFile() override {
    if (!can_write_) return;
    std::lock_guard lock(node_->mu);
    // close(2) normally flushed already; this is a handle dropped without a
    // flush (a frontend going away): keep what was written.
    if (auto ok = FlushLocked(Durability::kProcess); !ok) {
      spdlog::warn("store: commit at release of {}: {}", node_->path,
                   ok.error().ToString());
    }
    if (--node_->writers == 0 && node_->draft) {
      node_->draft.reset();
      node_->has_draft = false;
      node_->last_write_ns = 0;
    }
  }

  Result<size_t> Read(void* buf, size_t size, off_t offset) override {
    if (!can_read_) return Fail(EBADF, "file not open for reading");
    // Reads of one handle may run at once (several FUSE threads): what the
    // handle reads is taken under the node's lock, and the layout, once
    // loaded, is shared and never changed.
    std::string content;
    int64_t content_size = 0;
    std::shared_ptr<const StoreBackend::Impl::Layout> layout;
    {
      std::lock_guard lock(node_->mu);
      if (node_->draft) return node_->draft->Read(buf, size, offset);
      if (node_->committed_version > version_) {
        version_ = node_->committed_version;
        content_ = node_->committed_content;
        size_ = node_->committed_size;
        layout_.reset();
      }
      content = content_;
      content_size = size_;
      layout = layout_;
    }
    if (offset >= content_size || content.empty()) return size_t{0};
    if (!layout) {
      auto loaded = std::make_shared<StoreBackend::Impl::Layout>();
      TRY(impl_.engine_.Read([&](Txn& txn) -> Status {
        return StoreBackend::Impl::LoadLayout(txn, content, *loaded);
      }));
      if (!loaded->found) return Fail(EIO, "this content was purged");
      if (!loaded->inline_data &&
          loaded->blobs.size() !=
              static_cast<size_t>((content_size + kChunkSize - 1) /
                                  kChunkSize)) {
        return Fail(EIO, "stored content of " + node_->path + " is incomplete");
      }
      layout = loaded;
      std::lock_guard lock(node_->mu);
      if (content_ == content && !layout_) layout_ = layout;
    }
    return ReadCommitted(static_cast<char*>(buf), size, offset, content_size,
                         *layout);
  }

  Result<size_t> Write(const void* buf, size_t size, off_t offset) override {
    if (!can_write_) return Fail(EBADF, "file not open for writing");
    if (discarded_) return Fail(EBADF, "this handle's writes were discarded");
    std::lock_guard lock(node_->mu);
    TRY(TellLossAtWriteLocked());
    TRY(EnsureLeaseLocked());
    TRY(EnsureDraftLocked());
    if (flags_ & O_APPEND) offset = node_->draft->Size();
    TRY_ASSIGN(n, node_->draft->Write(buf, size, offset));
    MarkWrittenLocked();
    return n;
  }

  void SetAttrsAtOpen(const vfs::Attr& st) { attrs_at_open_ = st; }
  void SetMayDifferFromCache() { may_differ_ = true; }
  bool MayDifferFromCache() const override { return may_differ_; }
  std::optional<vfs::Attr> AttrsAtOpen() const override {
    return attrs_at_open_;
  }

  Result<vfs::Attr> Stat() override {
    vfs::Attr st{};
    bool found = false;
    TRY(impl_.engine_.Read([&](Txn& txn) -> Status {
      TRY_ASSIGN(inode, LoadInode(txn, node_->ino));
      if (inode) {
        st = inode->ToAttr();
        found = true;
      }
      return {};
    }));
    if (!found) return Fail(ENOENT, "the file was purged");
    if (!node_->has_draft && !can_write_) {
      // A reader sees the size of the content it reads.
      std::lock_guard lock(node_->mu);
      if (node_->committed_version <= version_) st.st_size = size_;
    }
    impl_.Overlay(caller_, st);
    return st;
  }

  Status Truncate(off_t size) override {
    if (!can_write_) return Fail(EINVAL, "file not open for writing");
    if (discarded_) return Fail(EBADF, "this handle's writes were discarded");
    std::lock_guard lock(node_->mu);
    TRY(TellLossAtWriteLocked());
    TRY(EnsureLeaseLocked());
    TRY(EnsureDraftLocked());
    TRY(node_->draft->Truncate(size));
    MarkWrittenLocked();
    return {};
  }

  Status Sync(bool datasync) override {
    (void)datasync;
    {
      // Any descriptor of the file: fsync(2) of a read-only one must not
      // acknowledge what the session wrote through another (the draft is
      // shared) while it is still uncommitted.
      std::lock_guard lock(node_->mu);
      TRY(EarlierWritesLostLocked());
      if (node_->dirty || (can_write_ && node_->created)) {
        // A failed fsync changes nothing: the draft stays, and the close
        // (or another fsync) tries again.
        TRY(impl_.Commit(caller_, *node_, Durability::kFull, false));
        EndEpochLocked();
        return {};
      }
    }
    return impl_.engine_.Barrier();
  }

  Status Flush() override {
    if (!can_write_) return {};
    std::lock_guard lock(node_->mu);
    if (auto lost = EarlierWritesLostLocked(); !lost) {
      if (holds_lease_) (void)ReleaseLeaseLocked();
      DropDraftIfUnleasedLocked();
      return lost;
    }
    if (node_->created && !node_->dirty) {
      // A new file nothing was written to yet. Its first close(2) is often
      // not its last: a shell's `> file` opens it, moves the descriptor and
      // closes the first one, and only then writes. Its first version is
      // committed at the close after the writing, so the history does not
      // start with an empty version nobody meant; a file closed with
      // nothing written gets its (empty) first version when its last
      // handle goes. The file itself exists since its create.
      return holds_lease_ ? ReleaseLeaseLocked() : Status{};
    }
    return FlushLocked(impl_.options_.commit_durability);
  }

  // Commits what this session wrote and ends this handle's hold on the
  // lease (the lease itself ends with the last holder).
  Status FlushLocked(Durability durability) {
    Status result;
    if (node_->dirty || node_->created) {
      bool last = holds_lease_ && node_->lease_holders == 1;
      result = CommitLocked(durability, last);
      if (result && last) {
        holds_lease_ = false;
        --node_->lease_holders;
      }
    }
    if (holds_lease_) {
      auto released = ReleaseLeaseLocked();
      if (result && !released) result = released;
    }
    DropDraftIfUnleasedLocked();
    return result;
  }

  // With no lease, a clean draft would only go stale: another session may
  // commit now, and this session's reads and next open must see that (a
  // descriptor kept by dup(2) or a child keeps the handle open). A write
  // through a handle still open makes it again.
  void DropDraftIfUnleasedLocked() {
    if (node_->lease_holders == 0 && !node_->dirty && !node_->created)
      DropDraftLocked();
  }

  // Commits the session's draft, ending the current epoch. When the commit
  // fails, the writer has been told that nothing was committed: the
  // draft's changes are dropped (never committed later behind its back, at
  // release or with the next write), and every other handle that wrote into
  // it is told at its next write, flush or fsync.
  Status CommitLocked(Durability durability, bool release) {
    auto result = impl_.Commit(caller_, *node_, durability, release);
    if (!result) {
      FailEpochLocked(result.error());
      node_->created = false;
      DropDraftLocked();
      // What this handle wrote is lost: every close and fsync of it says
      // so, not only this one (dup(2) and fork share the handle, and the
      // call that failed may have been a child's close-on-exec).
      if (wrote_ && write_epoch_ == node_->epoch) lost_ = result.error();
    }
    EndEpochLocked();
    return result;
  }

  // A commit attempt ended the epoch; this handle's own writes were in it
  // (and it was told the outcome).
  void EndEpochLocked() {
    ++node_->epoch;
    wrote_ = false;
  }

  // Records that the writes of the current epoch were not committed.
  void FailEpochLocked(const vfs::Error& e) {
    node_->failed.emplace(node_->epoch, e);
    while (node_->failed.size() > 16) {
      node_->forgotten = node_->failed.begin()->first;
      node_->failed.erase(node_->failed.begin());
    }
  }

  void DropDraftLocked() {
    node_->draft.reset();
    node_->has_draft = false;
    node_->dirty = false;
    node_->last_write_ns = 0;
  }

  void MarkWrittenLocked() {
    node_->dirty = true;
    node_->last_write_ns = NowNs();
    wrote_ = true;
    write_epoch_ = node_->epoch;
  }

  // The failure of a commit that held what this handle wrote (its own, or
  // one through another handle of the session). Every close and fsync of
  // the handle reports it: processes share a handle (dup(2), fork), and a
  // close by one that never wrote must not use it up. Its next write is
  // told, and that clears it (TellLossAtWriteLocked): the writer knows.
  Status EarlierWritesLostLocked() {
    if (wrote_ && write_epoch_ < node_->epoch) {
      wrote_ = false;
      auto it = node_->failed.find(write_epoch_);
      if (it != node_->failed.end()) {
        lost_ = vfs::Error{
            it->second.code,
            "what was written through this descriptor was not committed "
            "(the session's commit of the file through another descriptor "
            "failed: " +
                it->second.message + ")"};
      } else if (write_epoch_ <= node_->forgotten) {
        lost_ = vfs::Error{
            EIO,
            "what was written through this descriptor may not have been "
            "committed (many commits of the session's other descriptors of "
            "the file failed since); read the file"};
      }
    }
    if (lost_) return std::unexpected(*lost_);
    return {};
  }

  Status TellLossAtWriteLocked() {
    auto lost = EarlierWritesLostLocked();
    lost_.reset();
    return lost;
  }

  // A handle writing again after its session's draft went (a flush let the
  // lease go, or a commit failed): a new draft of the file as it is now,
  // unless another session changed it since this one based its writes on it.
  Status EnsureDraftLocked() {
    if (node_->draft) return {};
    Inode current;
    TRY(impl_.engine_.Read([&](Txn& txn) -> Status {
      TRY_ASSIGN(inode, LoadInode(txn, node_->ino));
      if (!inode) return Fail(ENOENT, "the file was purged");
      current = *inode;
      return {};
    }));
    if (current.version != node_->base_version) {
      return Fail(ESTALE, node_->path +
                              " was changed by another session since this "
                              "session last wrote it; read it again");
    }
    return impl_.SeedDraft(*node_, &current.content, current.version);
  }

  // Drops the session's uncommitted changes to the file (the draft is the
  // session's, shared by its handles of the file; it goes if no other handle
  // writes), and a new file's pending first commit: it stays as it was
  // created, empty. The handle writes nothing more.
  void Discard() override {
    if (!can_write_) return;
    discarded_ = true;
    std::lock_guard lock(node_->mu);
    if (node_->dirty) {
      // Other descriptors of the session (a process in the sandbox, which
      // shares the harness's session) may have written into the draft.
      FailEpochLocked(vfs::Error{EIO,
                                 "the session dropped its uncommitted "
                                 "changes to " +
                                     node_->path + " (a failed edit)"});
      ++node_->epoch;
    }
    node_->dirty = false;
    node_->created = false;
    node_->last_write_ns = 0;
    if (node_->writers == 1 && node_->draft) {
      node_->draft.reset();
      node_->has_draft = false;
    }
  }

  Status Chmod(mode_t mode) override {
    return SetAttr(&mode, nullptr, nullptr, nullptr);
  }
  Status Chown(uid_t uid, gid_t gid) override {
    return SetAttr(nullptr, &uid, &gid, nullptr);
  }
  Status Utimens(const struct timespec times[2]) override {
    return SetAttr(nullptr, nullptr, nullptr, times);
  }

  // Changes attributes of the inode (it may have no name any more).
  Status SetAttr(const mode_t* mode, const uid_t* uid, const gid_t* gid,
                 const struct timespec* times) {
    int64_t now = NowNs();
    // As a commit: the grants of now, not of when the handle was opened.
    TRY_ASSIGN(policy, impl_.PolicyOf(caller_));
    std::string last_path;
    {
      std::lock_guard lock(node_->mu);
      last_path = node_->path;
      // An explicit mtime wins over the write time.
      if (times != nullptr && times[1].tv_nsec != UTIME_OMIT)
        node_->last_write_ns = 0;
    }
    return impl_.engine_.Write(Durability::kProcess, [&](Txn& txn) -> Status {
      TRY_ASSIGN(inode, LoadInode(txn, node_->ino));
      if (!inode) return Fail(ENOENT, "the file was purged");
      TRY_ASSIGN(where, AnyPath(txn, inode->ino));
      TRY(StoreBackend::Impl::NeedWrite(*policy,
                                        where.empty() ? last_path : where));
      Inode n = *inode;
      if (mode != nullptr) n.mode = *mode & 07777;
      if (uid != nullptr && *uid != vfs::kKeepUid) n.uid = *uid;
      if (gid != nullptr && *gid != vfs::kKeepGid) n.gid = *gid;
      if (times != nullptr) {
        n.atime_ns = PickTime(times[0], n.atime_ns, now);
        n.mtime_ns = PickTime(times[1], n.mtime_ns, now);
      }
      TRY(SaveAttrs(txn, n, now));
      if (!where.empty())
        TRY(RecordChange(txn, where, caller_.session, now,
                         impl_.Origin(caller_)));
      return {};
    });
  }

 private:
  // Takes the lease again for a handle that flushed and writes once more.
  Status EnsureLeaseLocked() {
    if (holds_lease_) return {};
    int64_t now = NowNs();
    TRY(impl_.engine_.Write(Durability::kProcess, [&](Txn& txn) -> Status {
      TRY_ASSIGN(inode, LoadInode(txn, node_->ino));
      if (!inode) return Fail(ENOENT, "the file was purged");
      TRY(impl_.CheckLease(txn, caller_, node_->ino, node_->path, now));
      if (inode->version != node_->base_version && !node_->dirty) {
        return Fail(ESTALE, node_->path +
                                " was changed by another session since this "
                                "session last wrote it; read it again");
      }
      return impl_.TakeLease(txn, caller_, node_->ino, now);
    }));
    holds_lease_ = true;
    ++node_->lease_holders;
    return {};
  }

  Status ReleaseLeaseLocked() {
    holds_lease_ = false;
    if (--node_->lease_holders > 0) return {};
    return impl_.engine_.Write(Durability::kProcess, [&](Txn& txn) -> Status {
      return impl_.DropLease(txn, caller_, node_->ino);
    });
  }

  // Reads committed bytes of a content of `content_size` bytes laid out as
  // `layout`.
  Result<size_t> ReadCommitted(char* buf, size_t size, off_t offset,
                               int64_t content_size,
                               const StoreBackend::Impl::Layout& layout) {
    size = static_cast<size_t>(std::min<int64_t>(size, content_size - offset));
    if (layout.inline_data) {
      const std::string& data = *layout.inline_data;
      if (offset >= static_cast<off_t>(data.size())) return size_t{0};
      size = std::min(size, data.size() - static_cast<size_t>(offset));
      std::memcpy(buf, data.data() + offset, size);
      return size;
    }
    const auto& blobs = layout.blobs;
    size_t done = 0;
    TRY(impl_.engine_.Read([&](Txn& txn) -> Status {
      while (done < size) {
        int64_t pos = offset + static_cast<int64_t>(done);
        size_t idx =
            static_cast<size_t>(pos / static_cast<int64_t>(kChunkSize));
        if (idx >= blobs.size()) break;
        size_t in = static_cast<size_t>(pos % static_cast<int64_t>(kChunkSize));
        if (blobs[idx].first == 0) {  // a hole
          size_t chunk_end = std::min<int64_t>(
              static_cast<int64_t>((idx + 1) * kChunkSize), content_size);
          size_t want =
              std::min(size - done, chunk_end - static_cast<size_t>(pos));
          memset(buf + done, 0, want);
          done += want;
          continue;
        }
        size_t want =
            std::min(size - done, static_cast<size_t>(blobs[idx].second) - in);
        auto n = txn.ReadBlob("blobs", "data", blobs[idx].first, buf + done,
                              want, in);
        if (!n) return std::unexpected(n.error());
        if (*n == 0) break;
        done += *n;
      }
      return {};
    }));
    return done;
  }

  StoreBackend::Impl& impl_;
  Caller caller_;
  std::shared_ptr<OpenNode> node_;
  int flags_;
  bool can_read_ = false, can_write_ = false;
  bool discarded_ = false;  // Discard(): writes through it are refused
  bool holds_lease_;
  // Written through since its last flush, in node_->epoch `write_epoch_`.
  bool wrote_ = false;
  int64_t write_epoch_ = 0;
  // What this handle wrote was not committed (EarlierWritesLostLocked).
  std::optional<vfs::Error> lost_;
  // What a read handle reads when its session has no draft.
  std::string content_;
  int64_t size_;
  int64_t version_;
  // Where content_'s bytes are, once read (guarded by node_->mu).
  std::shared_ptr<const StoreBackend::Impl::Layout> layout_;
  // What the creating transaction wrote, when this handle made the file.
  std::optional<vfs::Attr> attrs_at_open_;
  bool may_differ_ = false;
};

}  // namespace

// --- StoreBackend ------------------------------------------------------

StoreBackend::StoreBackend(std::unique_ptr<Engine> engine, StoreOptions options)
    : engine_(std::move(engine)),
      options_(options),
      auth_(*engine_, options.auth_ttl),
      impl_(std::make_unique<Impl>(*this, *engine_, auth_, options)) {}

StoreBackend::~StoreBackend() = default;

Result<std::unique_ptr<StoreBackend>> StoreBackend::Open(
    const std::string& name, StoreOptions options) {
  TRY_ASSIGN(engine, Engine::Open(name, false));
  return Serve(std::move(engine), options);
}

std::unique_ptr<StoreBackend> StoreBackend::Serve(
    std::unique_ptr<Engine> engine, StoreOptions options) {
  return std::unique_ptr<StoreBackend>(
      new StoreBackend(std::move(engine), options));
}

void StoreBackend::SetChangeListener(vfs::ChangeListener* listener) {
  impl_->SetListener(listener);
}

namespace {

// Walk, for a caller: no name is looked up, through a symlink, in a
// directory `policy` hides (Walk's `may_search`), and a walk of the path
// as written that fails beyond such a directory fails as a missing name
// there would, ENOENT, so that ENOTDIR, ELOOP or EACCES never tell what
// that directory holds. Only a failed walk pays for the search of that
// directory.
Result<Walked> WalkFor(Txn& txn, const Policy& policy, const std::string& path,
                       bool follow_last) {
  const SearchCheck may_search = [&policy](const std::string& dir) {
    return policy.Visible(dir);
  };
  auto w = Walk(txn, path, follow_last, &may_search);
  if (w) return w;
  int code = w.error().code;
  if (code != ENOENT && code != ENOTDIR && code != ELOOP && code != EACCES)
    return w;
  std::string prefix;
  for (size_t i = 1; i < path.size();) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) break;  // the last name: no directory below
    prefix = path.substr(0, j);
    auto dir = Walk(txn, prefix, true, &may_search);
    if (!dir || !dir->node) break;  // the failure is here, in sight
    if (!policy.Visible(dir->path))
      return Fail(ENOENT, "no such file or directory");
    i = j + 1;
  }
  return w;
}

int64_t OwnerUid(const Caller& c) { return c.uid ? *c.uid : geteuid(); }
int64_t OwnerGid(const Caller& c) { return c.gid ? *c.gid : getegid(); }

}  // namespace

Result<vfs::Attr> StoreBackend::Stat(const Caller& c, const Path& path) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, path.str()));
  vfs::Attr st{};
  std::string missing;
  auto found = engine_->Read([&](Txn& txn) -> Status {
    TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), false));
    if (!w.node) {
      if (w.parent) missing = w.path;
      return Fail(ENOENT, "no such file or directory");
    }
    TRY(Impl::NeedVisible(*policy, w.path));
    st = w.node->ToAttr();
    if (w.node->IsDir() && policy->LevelOf(w.path) < Level::kRead) {
      // A directory the caller only passes through (/memories/users): its
      // link count, size and times would tell how many folders it holds and
      // when one came or went. Link count 1 means "not counted" to find(1).
      st.st_nlink = 1;
      st.st_size = 0;
      st.st_blocks = 0;
      st.st_atim = st.st_mtim = st.st_ctim = timespec{};
    }
    return {};
  });
  if (!found) {
    if (!missing.empty() && !c.session.empty())
      impl_->SetMissing(c.session, missing);
    return std::unexpected(found.error());
  }
  if (S_ISREG(st.st_mode)) impl_->Overlay(c, st);
  return st;
}

Result<std::vector<vfs::DirEntry>> StoreBackend::ReadDir(const Caller& c,
                                                         const Path& path) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, path.str()));
  std::vector<vfs::DirEntry> out;
  TRY(engine_->Read([&](Txn& txn) -> Status {
    // A symlink in the last place is not followed (ENOTDIR), as the
    // Backend contract and the workspace backend have it: a caller that
    // checked it lists a directory cannot be led elsewhere by a link put
    // there meanwhile.
    TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), false));
    if (!w.node) return Fail(ENOENT, "no such directory");
    TRY(Impl::NeedVisible(*policy, w.path));
    if (!w.node->IsDir()) return Fail(ENOTDIR, "not a directory");
    auto rows = txn.Query(
        "SELECT d.name, d.ino, i.kind FROM dentries d JOIN inodes i "
        "ON i.ino = d.ino WHERE d.parent = ? ORDER BY d.name",
        {w.node->ino});
    if (!rows) return std::unexpected(rows.error());
    std::string base = w.path == "/" ? "" : w.path;
    bool all = policy->LevelOf(w.path) >= Level::kRead;
    out.reserve(rows->size());
    for (auto& r : *rows) {
      std::string name = AsText(r[0]);
      if (!all && !policy->Visible(base + "/" + name)) continue;
      out.push_back(vfs::DirEntry{std::move(name),
                                  static_cast<uint64_t>(AsInt(r[1])),
                                  static_cast<mode_t>(AsInt(r[2]))});
    }
    return {};
  }));
  return out;
}

Result<std::unique_ptr<vfs::FileHandle>> StoreBackend::Open(const Caller& c,
                                                            const Path& path,
                                                            int flags,
                                                            mode_t mode) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  int acc = flags & O_ACCMODE;
  bool writing = acc == O_WRONLY || acc == O_RDWR;
  bool create = flags & O_CREAT;
  // O_CREAT|O_EXCL never follows a final symlink (a dangling one occupies
  // the name).
  bool follow = !(flags & O_NOFOLLOW) && !(create && (flags & O_EXCL));
  if (!policy->Visible(path.str()) &&
      !(create && policy->Visible(path.Parent().str()))) {
    return Fail(ENOENT, "no such file or directory");
  }
  if (!writing && (flags & O_TRUNC)) {
    // As on Linux, O_RDONLY|O_TRUNC truncates, and so needs write
    // permission (EACCES without; EISDIR on a directory): the truncation is
    // committed by an open for writing, and the file then opened to read.
    {
      TRY_ASSIGN(w, Open(c, path, (flags & ~O_ACCMODE) | O_WRONLY, mode));
      TRY(w->Flush());
    }
    flags &= ~(O_TRUNC | O_CREAT | O_EXCL);
    create = false;
  }

  if (!writing && !create) {
    Inode inode;
    std::string canon;
    TRY(engine_->Read([&](Txn& txn) -> Status {
      TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), follow));
      if (!w.node || !policy->Visible(w.path))
        return Fail(ENOENT, "no such file or directory");
      if (w.node->IsLink()) return Fail(ELOOP, "O_NOFOLLOW on a symlink");
      TRY(Impl::NeedRead(*policy, w.path));
      inode = *w.node;
      canon = w.path;
      return {};
    }));
    auto before = impl_->SetSeen(c.session, inode.ino, inode.version, canon);
    auto node = impl_->GetNode(c.session, inode.ino);
    {
      std::lock_guard lock(node->mu);
      node->path = canon;
    }
    auto file =
        std::make_unique<StoreFile>(*impl_, c, std::move(node), flags, false,
                                    inode.content, inode.size, inode.version);
    if (!before || *before != inode.version) file->SetMayDifferFromCache();
    return file;
  }

  // Writing (or creating): resolve, check, create if needed and take the
  // lease in one transaction.
  int64_t now = NowNs();
  Inode inode;
  std::string canon;
  bool created = false;
  bool opening = false;
  auto opened = engine_->Write(Durability::kProcess, [&](Txn& txn) -> Status {
    TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), follow));
    // A name the caller cannot see answers as a missing one would, so that
    // neither EEXIST nor EISDIR nor ELOOP tells it is there.
    bool hidden = w.node && !policy->Visible(w.path);
    if (!w.node || hidden) {
      if (!create) return Fail(ENOENT, "no such file or directory");
      if (!w.parent) return Fail(EACCES, "cannot create the root");
      TRY(Impl::NeedVisible(*policy, ParentOf(w.path)));
      TRY(Impl::NeedCreate(*policy, w.path));
      if (hidden) return Fail(EACCES, "may not create " + w.path);
      TRY_ASSIGN(n, CreateNode(txn, *w.parent, w.name, S_IFREG, mode & 07777,
                               OwnerUid(c), OwnerGid(c), "", now));
      inode = n;
      created = true;
      TRY(RecordChange(txn, w.path, c.session, now, impl_->Origin(c)));
    } else {
      if (create && (flags & O_EXCL)) return Fail(EEXIST, "file exists");
      if (w.node->IsLink()) return Fail(ELOOP, "O_NOFOLLOW on a symlink");
      if (w.node->IsDir()) {
        if (writing) return Fail(EISDIR, "is a directory");
      }
      if (!writing) {
        // O_RDONLY|O_CREAT of an existing file.
        TRY(Impl::NeedRead(*policy, w.path));
        inode = *w.node;
        canon = w.path;
        return {};
      }
      TRY(Impl::NeedWrite(*policy, w.path));
      TRY(impl_->CheckLease(txn, c, w.node->ino, w.path, now));
      auto existing = impl_->FindNode(c.session, w.node->ino);
      if (!existing || !existing->has_draft)
        TRY(impl_->CheckStale(txn, c, *w.node, w.path, EEXIST,
                              (flags & O_APPEND) && !(flags & O_TRUNC)));
      inode = *w.node;
      // A truncating open by a process without CAP_FSETID (not root) drops
      // the set-user-ID bit, and set-group-ID with group execute, as
      // truncate(2) does on Linux: the kernel leaves that to us with
      // atomic O_TRUNC. (Writes get it from the kernel.)
      mode_t kill =
          (inode.mode & S_ISUID) |
          ((inode.mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP) ? S_ISGID
                                                                     : 0);
      if ((flags & O_TRUNC) && kill != 0 && c.uid && *c.uid != 0) {
        inode.mode &= ~kill;
        auto m =
            txn.Exec("UPDATE inodes SET mode = ?, ctime_ns = ? WHERE ino = ?",
                     {int64_t{inode.mode}, now, inode.ino});
        if (!m) return std::unexpected(m.error());
        TRY(RecordChange(txn, w.path, c.session, now, impl_->Origin(c)));
      }
    }
    canon = w.path;
    if (!writing) return {};
    TRY(impl_->TakeLease(txn, c, inode.ino, now));
    impl_->MarkOpening(c.session, inode.ino, +1);
    opening = true;
    return {};
  });
  if (!opened) {
    if (opening) impl_->ForgetFailedOpen(c, inode.ino);
    return std::unexpected(opened.error());
  }

  if (!writing) {
    impl_->SetSeen(c.session, inode.ino, inode.version, canon);
    auto node = impl_->GetNode(c.session, inode.ino);
    return std::unique_ptr<vfs::FileHandle>(
        new StoreFile(*impl_, c, std::move(node), flags, false, inode.content,
                      inode.size, inode.version));
  }

  auto node = impl_->GetNode(c.session, inode.ino);
  std::unique_lock lock(node->mu);
  node->path = canon;
  ++node->lease_holders;
  impl_->MarkOpening(c.session, inode.ino, -1);
  ++node->writers;
  auto undo =
      [&](const vfs::Error& e) -> Result<std::unique_ptr<vfs::FileHandle>> {
    --node->writers;
    if (--node->lease_holders == 0) {
      (void)engine_->Write(Durability::kProcess, [&](Txn& txn) -> Status {
        return impl_->DropLease(txn, c, inode.ino);
      });
    }
    return std::unexpected(e);
  };
  if (created) node->created = true;
  if (!node->draft && !created) {
    // Another handle of this session may have committed (and let its draft
    // go) since the transaction above read the file: no other session can,
    // as this one holds the lease, and this session's commits need
    // node->mu. So the file as it is now is the draft's base.
    Inode current;
    auto fresh = engine_->Read([&](Txn& txn) -> Status {
      TRY_ASSIGN(now_inode, LoadInode(txn, inode.ino));
      if (!now_inode) return Fail(ENOENT, "the file was removed while opened");
      current = *now_inode;
      return {};
    });
    if (!fresh) return undo(fresh.error());
    inode = current;
  }
  if (!node->draft) {
    const bool copy = !(flags & O_TRUNC) && !created;
    if (auto ok = impl_->SeedDraft(*node, copy ? &inode.content : nullptr,
                                   inode.version);
        !ok)
      return undo(ok.error());
  }
  // (A file this open made is empty already: O_TRUNC changes nothing.)
  if ((flags & O_TRUNC) && !created) {
    if (auto ok = node->draft->Truncate(0); !ok) return undo(ok.error());
    node->dirty = true;
    node->last_write_ns = now;
  }
  auto before = impl_->SetSeen(c.session, inode.ino, node->base_version, canon);
  const bool may_differ =
      !created && (!before || *before != node->base_version);
  lock.unlock();
  auto file = std::make_unique<StoreFile>(*impl_, c, std::move(node), flags,
                                          true, inode.content, inode.size,
                                          inode.version);
  if (may_differ) file->SetMayDifferFromCache();
  // A frontend's create reply wants the new file's attributes at once: the
  // ones the creating transaction wrote spare it a read transaction.
  if (created) file->SetAttrsAtOpen(inode.ToAttr());
  return file;
}

Status StoreBackend::Mkdir(const Caller& c, const Path& path, mode_t mode) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, path.Parent().str()));
  int64_t now = NowNs();
  return engine_->Write(Durability::kProcess, [&](Txn& txn) -> Status {
    TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), false));
    if (!w.parent) return Fail(EEXIST, "exists");
    TRY(Impl::NeedVisible(*policy, ParentOf(w.path)));
    if (w.node && policy->Visible(w.path)) return Fail(EEXIST, "file exists");
    TRY(Impl::NeedCreate(*policy, w.path));
    if (w.node) return Fail(EEXIST, "file exists");
    TRY_ASSIGN(n, CreateNode(txn, *w.parent, w.name, S_IFDIR, mode & 07777,
                             OwnerUid(c), OwnerGid(c), "", now));
    (void)n;
    return RecordChange(txn, w.path, c.session, now, impl_->Origin(c));
  });
}

Status StoreBackend::Symlink(const Caller& c, const std::string& target,
                             const Path& link) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, link.Parent().str()));
  if (target.empty()) return Fail(ENOENT, "empty symlink target");
  if (target.size() >= PATH_MAX) return Fail(ENAMETOOLONG, "target too long");
  int64_t now = NowNs();
  return engine_->Write(Durability::kProcess, [&](Txn& txn) -> Status {
    TRY_ASSIGN(w, WalkFor(txn, *policy, link.str(), false));
    if (!w.parent) return Fail(EEXIST, "exists");
    if (w.node && policy->Visible(w.path)) return Fail(EEXIST, "file exists");
    TRY(Impl::NeedCreate(*policy, w.path));
    if (w.node) return Fail(EEXIST, "file exists");
    TRY_ASSIGN(n, CreateNode(txn, *w.parent, w.name, S_IFLNK, 0777, OwnerUid(c),
                             OwnerGid(c), target, now));
    (void)n;
    return RecordChange(txn, w.path, c.session, now, impl_->Origin(c));
  });
}

Result<std::string> StoreBackend::Readlink(const Caller& c, const Path& path) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, path.str()));
  std::string target;
  TRY(engine_->Read([&](Txn& txn) -> Status {
    TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), false));
    if (!w.node) return Fail(ENOENT, "no such file");
    TRY(Impl::NeedRead(*policy, w.path));
    if (!w.node->IsLink()) return Fail(EINVAL, "not a symlink");
    target = w.node->target;
    return {};
  }));
  return target;
}

namespace {

// Removes the entry (parent, name) of `node`; the last name of a file makes
// a tombstone version so the file stays recoverable.
Status RemoveName(Txn& txn, const Caller& c, const Inode& parent,
                  const std::string& name, const Inode& node,
                  const std::string& path, int64_t now) {
  auto d = txn.Exec("DELETE FROM dentries WHERE parent = ? AND name = ?",
                    {parent.ino, name});
  if (!d) return std::unexpected(d.error());
  TRY(TouchDir(txn, parent.ino, now));
  if (node.IsDir()) {
    auto del = txn.Exec("DELETE FROM inodes WHERE ino = ?", {node.ino});
    if (!del) return std::unexpected(del.error());
    auto up = txn.Exec("UPDATE inodes SET nlink = nlink - 1 WHERE ino = ?",
                       {parent.ino});
    if (!up) return std::unexpected(up.error());
    return {};
  }
  if (node.nlink > 1) {
    auto up = txn.Exec(
        "UPDATE inodes SET nlink = nlink - 1, ctime_ns = ? WHERE ino = ?",
        {now, node.ino});
    if (!up) return std::unexpected(up.error());
    return {};
  }
  if (node.IsLink()) {
    auto del = txn.Exec("DELETE FROM inodes WHERE ino = ?", {node.ino});
    if (!del) return std::unexpected(del.error());
    return {};
  }
  auto up = txn.Exec(
      "UPDATE inodes SET nlink = 0, ctime_ns = ?, deleted_ns = ? WHERE ino = ?",
      {now, now, node.ino});
  if (!up) return std::unexpected(up.error());
  auto maxn = txn.Query(
      "SELECT COALESCE(MAX(n), 0) FROM versions WHERE ino = ?", {node.ino});
  if (!maxn) return std::unexpected(maxn.error());
  auto v = txn.Exec(
      "INSERT INTO versions(ino, n, path, author, session, time_ns, size, "
      "content, mode, deleted) VALUES(?, ?, ?, ?, ?, ?, 0, NULL, ?, 1)",
      {node.ino, AsInt((*maxn)[0][0]) + 1, path, c.user, c.session, now,
       int64_t{node.mode}});
  if (!v) return std::unexpected(v.error());
  return {};
}

}  // namespace

Status StoreBackend::Unlink(const Caller& c, const Path& path) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, path.str()));
  int64_t now = NowNs();
  return engine_->Write(Durability::kProcess, [&](Txn& txn) -> Status {
    TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), false));
    if (!w.node) return Fail(ENOENT, "no such file");
    TRY(Impl::NeedRemove(*policy, w.path));
    if (w.node->IsDir()) return Fail(EISDIR, "is a directory; use rmdir");
    if (!w.node->IsLink()) {
      TRY(impl_->CheckLease(txn, c, w.node->ino, w.path, now));
      TRY(impl_->CheckStale(txn, c, *w.node, w.path));
    }
    TRY(RemoveName(txn, c, *w.parent, w.name, *w.node, w.path, now));
    return RecordChange(txn, w.path, c.session, now, impl_->Origin(c));
  });
}

Status StoreBackend::Rmdir(const Caller& c, const Path& path) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, path.str()));
  int64_t now = NowNs();
  return engine_->Write(Durability::kProcess, [&](Txn& txn) -> Status {
    TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), false));
    if (!w.node) return Fail(ENOENT, "no such directory");
    if (!w.parent) return Fail(EBUSY, "the root cannot be removed");
    TRY(Impl::NeedRemove(*policy, w.path));
    if (!w.node->IsDir()) return Fail(ENOTDIR, "not a directory");
    auto any = txn.Query("SELECT 1 FROM dentries WHERE parent = ? LIMIT 1",
                         {w.node->ino});
    if (!any) return std::unexpected(any.error());
    if (!any->empty()) return Fail(ENOTEMPTY, "directory not empty");
    TRY(RemoveName(txn, c, *w.parent, w.name, *w.node, w.path, now));
    return RecordChange(txn, w.path, c.session, now, impl_->Origin(c));
  });
}

namespace {

// A hard link gives a file a second place. It must not let anyone reach the
// file whom the first place does not, nor keep access alive after the grant
// that gave it is gone (a member taken off a team keeping a link in their
// own folder). So both places must be under the same grants: for every
// subject, the same highest level. EXDEV otherwise, as for a link to another
// filesystem, which tools answer by copying.
Result<bool> UnderSameGrants(Txn& txn, const std::string& a,
                             const std::string& b) {
  auto rows =
      txn.Query("SELECT prefix, subject_kind, subject, level FROM grants");
  if (!rows) return std::unexpected(rows.error());
  std::map<std::string, int64_t> at_a, at_b;
  for (const auto& r : *rows) {
    std::string prefix = AsText(r[0]);
    std::string who = AsText(r[1]) + ":" + AsText(r[2]);
    int64_t level = AsInt(r[3]);
    if (PathHasPrefix(a, prefix)) at_a[who] = std::max(at_a[who], level);
    if (PathHasPrefix(b, prefix)) at_b[who] = std::max(at_b[who], level);
  }
  return at_a == at_b;
}

Status SameGrants(Txn& txn, const std::string& a, const std::string& b) {
  TRY_ASSIGN(same, UnderSameGrants(txn, a, b));
  if (!same) {
    return Fail(EXDEV, "cannot hard-link " + a + " to " + b +
                           ": the two places are shared under different "
                           "grants; copy the file instead");
  }
  return {};
}

// For a rename from `from` to `to`, places under different grants: EXDEV
// when `node` is a file with other names (hard links), or a directory that
// holds one, since the move would leave a name under each set of grants,
// which Link refuses.
Status NoOtherNames(Txn& txn, const Inode& node, const std::string& from,
                    const std::string& to) {
  if (!node.IsDir()) {
    if (node.nlink <= 1) return {};
  } else {
    auto linked = txn.Query(
        "WITH RECURSIVE sub(ino) AS (SELECT CAST(? AS BIGINT) UNION "
        "SELECT d.ino FROM dentries d JOIN sub ON d.parent = sub.ino) "
        "SELECT 1 FROM sub JOIN inodes i ON i.ino = sub.ino "
        "WHERE i.nlink > 1 AND i.kind != ? LIMIT 1",
        {node.ino, int64_t{S_IFDIR}});
    if (!linked) return std::unexpected(linked.error());
    if (linked->empty()) return {};
  }
  return Fail(EXDEV, "cannot move " + from + " to " + to + ": " +
                         (node.IsDir() ? "a file in it has" : "it has") +
                         " other names (hard links), and the two places are "
                         "shared under different grants; copy instead");
}

}  // namespace

Status StoreBackend::Link(const Caller& c, const Path& from, const Path& to) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, from.str()));
  TRY(Impl::NeedVisible(*policy, to.Parent().str()));
  int64_t now = NowNs();
  std::string placed;
  int64_t placed_ino = 0;
  TRY(engine_->Write(Durability::kProcess, [&](Txn& txn) -> Status {
    TRY_ASSIGN(src, WalkFor(txn, *policy, from.str(), false));
    if (!src.node) return Fail(ENOENT, "no such file");
    TRY(Impl::NeedWrite(*policy, src.path));
    if (src.node->IsDir()) return Fail(EPERM, "cannot hard-link a directory");
    TRY_ASSIGN(dst, WalkFor(txn, *policy, to.str(), false));
    if (!dst.parent) return Fail(EEXIST, "exists");
    if (dst.node && policy->Visible(dst.path))
      return Fail(EEXIST, "file exists");
    TRY(Impl::NeedCreate(*policy, dst.path));
    if (dst.node) return Fail(EEXIST, "file exists");
    TRY(SameGrants(txn, src.path, dst.path));
    auto d = txn.Exec("INSERT INTO dentries(parent, name, ino) VALUES(?, ?, ?)",
                      {dst.parent->ino, dst.name, src.node->ino});
    if (!d) return std::unexpected(d.error());
    auto up = txn.Exec(
        "UPDATE inodes SET nlink = nlink + 1, ctime_ns = ? WHERE ino = ?",
        {now, src.node->ino});
    if (!up) return std::unexpected(up.error());
    TRY(TouchDir(txn, dst.parent->ino, now));
    placed = dst.path;
    placed_ino = src.node->ino;
    return RecordChange(txn, dst.path, c.session, now, impl_->Origin(c));
  }));
  if (!c.session.empty()) impl_->SetSeenAt(c.session, placed, placed_ino);
  return {};
}

namespace {

// EINVAL when directory `dir` is `ancestor` or lies below it.
Status NotBelow(Txn& txn, int64_t dir, int64_t ancestor) {
  int64_t cur = dir;
  for (int depth = 0; cur != kRootIno && depth < 4096; ++depth) {
    if (cur == ancestor) {
      return Fail(EINVAL, "cannot move a directory into itself");
    }
    auto up =
        txn.Query("SELECT parent FROM dentries WHERE ino = ? LIMIT 1", {cur});
    if (!up) return std::unexpected(up.error());
    if (up->empty()) break;
    cur = AsInt((*up)[0][0]);
  }
  return {};
}

}  // namespace

Status StoreBackend::Rename(const Caller& c, const Path& from, const Path& to,
                            unsigned flags) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedVisible(*policy, from.str()));
  TRY(Impl::NeedVisible(*policy, to.Parent().str()));
  if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE)) {
    return Fail(EINVAL, "RENAME_NOREPLACE with RENAME_EXCHANGE");
  }
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
    return Fail(EINVAL, "unsupported rename flags");
  }
  int64_t now = NowNs();
  // Names and files the rename put in place, for the session's record.
  std::vector<std::pair<std::string, int64_t>> placed;
  TRY(engine_->Write(Durability::kProcess, [&](Txn& txn) -> Status {
    placed.clear();
    TRY_ASSIGN(src, WalkFor(txn, *policy, from.str(), false));
    if (!src.node) return Fail(ENOENT, "no such file or directory");
    if (!src.parent) return Fail(EBUSY, "the root cannot be renamed");
    TRY(Impl::NeedRemove(*policy, src.path));
    TRY_ASSIGN(dst, WalkFor(txn, *policy, to.str(), false));
    if (!dst.parent) return Fail(EBUSY, "the root cannot be replaced");
    TRY(Impl::NeedCreate(*policy, dst.path));
    if (dst.node) TRY(Impl::NeedRemove(*policy, dst.path));
    if (src.node->ino == (dst.node ? dst.node->ino : -1)) return {};
    // Moving a file that has other names (or a directory holding one) into
    // a place under other grants would do what Link refuses.
    TRY_ASSIGN(same_grants, UnderSameGrants(txn, src.path, dst.path));
    if (!same_grants) {
      TRY(NoOtherNames(txn, *src.node, src.path, dst.path));
      if ((flags & RENAME_EXCHANGE) && dst.node)
        TRY(NoOtherNames(txn, *dst.node, dst.path, src.path));
    }
    // A directory may not move below itself.
    if (src.node->IsDir()) TRY(NotBelow(txn, dst.parent->ino, src.node->ino));
    if (flags & RENAME_EXCHANGE) {
      if (!dst.node) return Fail(ENOENT, "no such file or directory");
      if (dst.node->IsDir()) TRY(NotBelow(txn, src.parent->ino, dst.node->ino));
      // Each name gets the other file, as a rename onto it would: the same
      // lease and staleness rules, on both sides.
      for (const Walked* side : {&src, &dst}) {
        if (side->node->IsDir() || side->node->IsLink()) continue;
        TRY(impl_->CheckLease(txn, c, side->node->ino, side->path, now));
        TRY(impl_->CheckStale(txn, c, *side->node, side->path));
      }
      auto a =
          txn.Exec("UPDATE dentries SET ino = ? WHERE parent = ? AND name = ?",
                   {dst.node->ino, src.parent->ino, src.name});
      auto b =
          txn.Exec("UPDATE dentries SET ino = ? WHERE parent = ? AND name = ?",
                   {src.node->ino, dst.parent->ino, dst.name});
      if (!a) return std::unexpected(a.error());
      if (!b) return std::unexpected(b.error());
      if (src.node->IsDir() != dst.node->IsDir() &&
          src.parent->ino != dst.parent->ino) {
        int64_t delta = src.node->IsDir() ? 1 : -1;
        auto p1 = txn.Exec("UPDATE inodes SET nlink = nlink - ? WHERE ino = ?",
                           {delta, src.parent->ino});
        auto p2 = txn.Exec("UPDATE inodes SET nlink = nlink + ? WHERE ino = ?",
                           {delta, dst.parent->ino});
        if (!p1) return std::unexpected(p1.error());
        if (!p2) return std::unexpected(p2.error());
      }
    } else {
      // Moving a file away from its name removes it from there, as an
      // unlink would: a session with a stale view of it may not (an editor
      // saving by renaming the old file to a backup, then writing anew).
      if (!src.node->IsDir() && !src.node->IsLink())
        TRY(impl_->CheckStale(txn, c, *src.node, src.path));
      if (dst.node) {
        if (flags & RENAME_NOREPLACE) return Fail(EEXIST, "file exists");
        if (src.node->IsDir() && !dst.node->IsDir()) {
          return Fail(ENOTDIR, "cannot replace a file with a directory");
        }
        if (!src.node->IsDir() && dst.node->IsDir()) {
          return Fail(EISDIR, "cannot replace a directory with a file");
        }
        if (dst.node->IsDir()) {
          auto any =
              txn.Query("SELECT 1 FROM dentries WHERE parent = ? LIMIT 1",
                        {dst.node->ino});
          if (!any) return std::unexpected(any.error());
          if (!any->empty()) return Fail(ENOTEMPTY, "directory not empty");
        } else if (!dst.node->IsLink()) {
          TRY(impl_->CheckLease(txn, c, dst.node->ino, dst.path, now));
          TRY(impl_->CheckStale(txn, c, *dst.node, dst.path));
        }
        TRY(RemoveName(txn, c, *dst.parent, dst.name, *dst.node, dst.path,
                       now));
      }
      auto del = txn.Exec("DELETE FROM dentries WHERE parent = ? AND name = ?",
                          {src.parent->ino, src.name});
      if (!del) return std::unexpected(del.error());
      auto ins =
          txn.Exec("INSERT INTO dentries(parent, name, ino) VALUES(?, ?, ?)",
                   {dst.parent->ino, dst.name, src.node->ino});
      if (!ins) return std::unexpected(ins.error());
      if (src.node->IsDir() && src.parent->ino != dst.parent->ino) {
        auto p1 = txn.Exec("UPDATE inodes SET nlink = nlink - 1 WHERE ino = ?",
                           {src.parent->ino});
        auto p2 = txn.Exec("UPDATE inodes SET nlink = nlink + 1 WHERE ino = ?",
                           {dst.parent->ino});
        if (!p1) return std::unexpected(p1.error());
        if (!p2) return std::unexpected(p2.error());
      }
    }
    auto ct = txn.Exec("UPDATE inodes SET ctime_ns = ? WHERE ino = ?",
                       {now, src.node->ino});
    if (!ct) return std::unexpected(ct.error());
    TRY(TouchDir(txn, src.parent->ino, now));
    TRY(TouchDir(txn, dst.parent->ino, now));
    placed.emplace_back(dst.path, src.node->ino);
    if ((flags & RENAME_EXCHANGE) && dst.node)
      placed.emplace_back(src.path, dst.node->ino);
    TRY(RecordChange(txn, src.path, c.session, now, impl_->Origin(c)));
    return RecordChange(txn, dst.path, c.session, now, impl_->Origin(c));
  }));
  if (!c.session.empty()) {
    for (const auto& [path, ino] : placed)
      impl_->SetSeenAt(c.session, path, ino);
  }
  return {};
}

namespace {

struct AttrChange {
  std::optional<mode_t> mode;
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
  const struct timespec* times = nullptr;
};

}  // namespace

static Status ChangeAttrs(StoreBackend::Impl& impl, Engine& engine,
                          const Caller& c, const Path& path, bool follow,
                          const AttrChange& change) {
  TRY_ASSIGN(policy, impl.PolicyOf(c));
  TRY(StoreBackend::Impl::NeedVisible(*policy, path.str()));
  int64_t now = NowNs();
  int64_t ino = 0;
  TRY(engine.Write(Durability::kProcess, [&](Txn& txn) -> Status {
    TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), follow));
    if (!w.node) return Fail(ENOENT, "no such file or directory");
    TRY(StoreBackend::Impl::NeedWrite(*policy, w.path));
    Inode n = *w.node;
    if (change.mode) {
      if (n.IsLink()) return Fail(EOPNOTSUPP, "symlinks have no mode");
      n.mode = *change.mode & 07777;
    }
    if (change.uid && *change.uid != vfs::kKeepUid) n.uid = *change.uid;
    if (change.gid && *change.gid != vfs::kKeepGid) n.gid = *change.gid;
    if (change.times != nullptr) {
      n.atime_ns = PickTime(change.times[0], n.atime_ns, now);
      n.mtime_ns = PickTime(change.times[1], n.mtime_ns, now);
    }
    TRY(SaveAttrs(txn, n, now));
    ino = n.ino;
    return RecordChange(txn, w.path, c.session, now, impl.Origin(c));
  }));
  if (change.times != nullptr && change.times[1].tv_nsec != UTIME_OMIT) {
    if (auto node = impl.FindNode(c.session, ino)) {
      std::lock_guard lock(node->mu);
      node->last_write_ns = 0;
    }
  }
  return {};
}

Status StoreBackend::Chmod(const Caller& c, const Path& path, mode_t mode) {
  AttrChange ch;
  ch.mode = mode;
  return ChangeAttrs(*impl_, *engine_, c, path, false, ch);
}

Status StoreBackend::Chown(const Caller& c, const Path& path, uid_t uid,
                           gid_t gid) {
  AttrChange ch;
  ch.uid = uid;
  ch.gid = gid;
  return ChangeAttrs(*impl_, *engine_, c, path, false, ch);
}

Status StoreBackend::Utimens(const Caller& c, const Path& path,
                             const struct timespec times[2]) {
  AttrChange ch;
  ch.times = times;
  return ChangeAttrs(*impl_, *engine_, c, path, false, ch);
}

Status StoreBackend::Truncate(const Caller& c, const Path& path, off_t size) {
  if (size < 0) return Fail(EINVAL, "negative size");
  TRY_ASSIGN(file, Open(c, path, O_WRONLY, 0));
  TRY(file->Truncate(size));
  return file->Flush();
}

Result<struct statvfs> StoreBackend::StatFs(const Caller& c, const Path& path) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  (void)policy;
  (void)path;
  struct statvfs st {};
  if (statvfs(impl_->scratch_.c_str(), &st) != 0) {
    return std::unexpected(vfs::FromErrno(errno, "statfs", impl_->scratch_));
  }
  st.f_namemax = NAME_MAX;
  return st;
}

}  // namespace agentvfs::store

// --- History -----------------------------------------------------------

namespace agentvfs::store {
namespace {

VersionInfo VersionFromRow(const Row& r) {
  VersionInfo v;
  v.n = AsInt(r[0]);
  v.path = AsText(r[1]);
  v.author = AsText(r[2]);
  v.session = AsText(r[3]);
  v.time_ns = AsInt(r[4]);
  v.size = AsInt(r[5]);
  v.content_hash = AsText(r[6]);
  v.mode = static_cast<mode_t>(AsInt(r[7]));
  v.deleted = AsInt(r[8]) != 0;
  return v;
}

// Whether `p` may read what lies at `path`.
bool Readable(const Policy& p, const std::string& path) {
  return p.Visible(path) && p.LevelOf(path) >= Level::kRead;
}

constexpr const char* kVersionColumns =
    "n, path, author, session, time_ns, size, content, mode, deleted";

// One file of a path's history: its inode, and the number its versions
// start after in the numbering `history` shows.
struct TimelineFile {
  int64_t ino = 0;
  int64_t offset = 0;
};

// The files that have had `path`, oldest first, numbered as one history:
// each deleted file whose last name was removed there (by rm, or by a rename
// over it: an editor's or `sed -i`'s save), in the order they went, then the
// file at `path` now. A version's number is its file's offset plus its own
// number in that file, so the numbers a path showed stay as they were when
// the next file takes the name (a deleted file's numbers are final). When
// no file went from there, the last deleted file that had the path at all
// stands alone. A file that moved away and still lives under another name
// is not here: its history goes with it, and its new place may be one the
// caller cannot read. A name `policy` hides (reached through a symlink, say)
// is answered as a missing one, whatever it is, and so is a path that
// cannot be walked. `canon` gets the path without symlinks.
Result<std::vector<TimelineFile>> TimelineOf(Txn& txn, const Policy& policy,
                                             const std::string& path,
                                             std::string* canon) {
  auto walked = WalkFor(txn, policy, path, false);
  if (!walked && walked.error().code != ENOENT &&
      walked.error().code != ENOTDIR && walked.error().code != ELOOP) {
    return std::unexpected(walked.error());
  }
  int64_t live = 0;
  *canon = path;
  if (walked && walked->node && policy.Visible(walked->path)) {
    const Walked& w = *walked;
    if (w.node->IsDir()) return Fail(EISDIR, path + " is a directory");
    if (w.node->IsLink()) return Fail(EINVAL, path + " is a symlink");
    *canon = w.path;
    live = w.node->ino;
  }
  // A deleted file's last version is its tombstone, made where its last
  // name was removed.
  auto gone = txn.Query(
      "SELECT v.ino, v.n FROM versions v JOIN inodes i ON i.ino = v.ino "
      "WHERE v.path = ? AND v.deleted = 1 AND i.nlink = 0 AND v.ino != ? "
      "AND v.n = (SELECT MAX(n) FROM versions l WHERE l.ino = v.ino) "
      "ORDER BY v.time_ns, v.ino",
      {*canon, live});
  if (!gone) return std::unexpected(gone.error());
  std::vector<TimelineFile> files;
  int64_t offset = 0;
  for (const auto& r : *gone) {
    files.push_back({AsInt(r[0]), offset});
    offset += AsInt(r[1]);
  }
  if (live != 0) {
    files.push_back({live, offset});
    return files;
  }
  if (!files.empty()) return files;
  auto rows = txn.Query(
      "SELECT v.ino FROM versions v JOIN inodes i ON i.ino = v.ino "
      "WHERE v.path = ? AND i.nlink = 0 ORDER BY v.time_ns DESC LIMIT 1",
      {path});
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) {
    return Fail(ENOENT, "no file is at " + path +
                            " and no deleted file was there (a file that was "
                            "renamed keeps its history under its new name)");
  }
  files.push_back({AsInt((*rows)[0][0]), 0});
  return files;
}

// The file at `path` now, or else the last deleted file that had it: the
// one a restore brings back or writes over, and a purge starts from.
Result<int64_t> FileOfPath(Txn& txn, const Policy& policy,
                           const std::string& path, std::string* canon) {
  TRY_ASSIGN(files, TimelineOf(txn, policy, path, canon));
  return files.back().ino;
}

// Version `n` of a history made of `files` (as History numbers them): the
// file it belongs to and its number there. ENOENT when there is no such
// version.
Result<std::pair<int64_t, int64_t>> VersionIn(
    const std::vector<TimelineFile>& files, const std::string& path,
    int64_t n) {
  for (size_t i = files.size(); i-- > 0;) {
    if (n > files[i].offset)
      return std::pair{files[i].ino, n - files[i].offset};
  }
  return Fail(ENOENT, path + " has no version " + std::to_string(n) +
                          "; `agentvfs history` lists them");
}

}  // namespace

Result<std::vector<VersionInfo>> StoreBackend::History(const Caller& c,
                                                       const Path& path) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedRead(*policy, path.str()));
  std::vector<VersionInfo> out;
  TRY(engine_->Read([&](Txn& txn) -> Status {
    std::string canon;
    TRY_ASSIGN(files, TimelineOf(txn, *policy, path.str(), &canon));
    TRY(Impl::NeedRead(*policy, canon));
    for (const TimelineFile& f : files) {
      auto rows = txn.Query(std::string("SELECT ") + kVersionColumns +
                                " FROM versions WHERE ino = ? ORDER BY n",
                            {f.ino});
      if (!rows) return std::unexpected(rows.error());
      for (const auto& r : *rows) {
        VersionInfo v = VersionFromRow(r);
        v.n += f.offset;
        // A version made while the file lived where this caller cannot read
        // stays hidden, as the file was then.
        if (Readable(*policy, v.path)) out.push_back(std::move(v));
      }
    }
    return {};
  }));
  return out;
}

Result<std::unique_ptr<vfs::FileHandle>> StoreBackend::OpenVersion(
    const Caller& c, const Path& path, int64_t n) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY(Impl::NeedRead(*policy, path.str()));
  VersionInfo v;
  int64_t ino = 0, file_n = 0;  // the file and the version's number in it
  TRY(engine_->Read([&](Txn& txn) -> Status {
    std::string canon;
    TRY_ASSIGN(files, TimelineOf(txn, *policy, path.str(), &canon));
    TRY(Impl::NeedRead(*policy, canon));
    TRY_ASSIGN(found, VersionIn(files, path.str(), n));
    std::tie(ino, file_n) = found;
    auto rows = txn.Query(std::string("SELECT ") + kVersionColumns +
                              " FROM versions WHERE ino = ? AND n = ?",
                          {ino, file_n});
    if (!rows) return std::unexpected(rows.error());
    if (rows->empty() || !Readable(*policy, AsText((*rows)[0][1]))) {
      return Fail(ENOENT, path.str() + " has no version " + std::to_string(n) +
                              "; `agentvfs history` lists them");
    }
    v = VersionFromRow((*rows)[0]);
    return {};
  }));
  if (v.deleted) {
    return Fail(ENOENT, "version " + std::to_string(n) + " of " + path.str() +
                            " is its deletion; pick an earlier version");
  }
  // A node of its own, so the reads never see a draft.
  auto node = std::make_shared<OpenNode>();
  node->ino = ino;
  node->path = v.path;
  return std::unique_ptr<vfs::FileHandle>(
      new StoreFile(*impl_, c, std::move(node), O_RDONLY, false, v.content_hash,
                    v.size, file_n));
}

Result<VersionInfo> StoreBackend::Restore(const Caller& c, const Path& path,
                                          int64_t n) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  TRY_ASSIGN(old, OpenVersion(c, path, n));
  TRY(Impl::NeedWrite(*policy, path.str()));
  mode_t mode = 0644;
  std::string content;
  bool deleted = false;  // no file at the path: a deleted one comes back
  TRY(engine_->Read([&](Txn& txn) -> Status {
    // Version n may be of a file that had the path before the last one.
    std::string canon;
    TRY_ASSIGN(files, TimelineOf(txn, *policy, path.str(), &canon));
    TRY_ASSIGN(inode, LoadInode(txn, files.back().ino));
    deleted = inode && inode->deleted;
    TRY_ASSIGN(source, VersionIn(files, path.str(), n));
    auto rows =
        txn.Query("SELECT mode, content FROM versions WHERE ino = ? AND n = ?",
                  {source.first, source.second});
    if (!rows) return std::unexpected(rows.error());
    if (rows->empty())
      return Fail(ENOENT, path.str() + " has no version " + std::to_string(n));
    mode = static_cast<mode_t>(AsInt((*rows)[0][0]));
    content = AsText((*rows)[0][1]);
    return {};
  }));
  // A deleted file comes back as itself (its history goes on), in one
  // transaction that links it and commits version n's content as its next
  // version: never with the content it had when it was deleted, which may
  // have been written where this caller cannot read. Missing parent
  // directories are made where the caller may create them.
  bool relinked = false;
  if (deleted) {
    auto draft = std::make_unique<Draft>(impl_->scratch_);
    TRY(impl_->CopyContentTo(content, *draft));
    TRY_ASSIGN(digest, DigestDraft(draft.get()));
    std::tuple<int64_t, int64_t, std::string> seen;  // ino, version, path
    TRY(engine_->Write(
        impl_->options_.commit_durability, [&](Txn& txn) -> Status {
          int64_t now = NowNs();
          TRY(MakeDirs(txn, path.Parent().str(), now,
                       [&](const std::string& dir) -> Status {
                         TRY(Impl::NeedVisible(*policy, ParentOf(dir)));
                         return Impl::NeedCreate(*policy, dir);
                       }));
          TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), false));
          if (w.node || !w.parent) return {};  // a file is there: see below
          std::string canon;
          TRY_ASSIGN(ino, FileOfPath(txn, *policy, path.str(), &canon));
          TRY_ASSIGN(inode, LoadInode(txn, ino));
          if (!inode || !inode->deleted || inode->nlink != 0) return {};
          TRY(impl_->CheckLease(txn, c, ino, w.path, now));
          auto d = txn.Exec(
              "INSERT INTO dentries(parent, name, ino) VALUES(?, ?, ?)",
              {w.parent->ino, w.name, ino});
          if (!d) return std::unexpected(d.error());
          auto u = txn.Exec(
              "UPDATE inodes SET nlink = 1, deleted_ns = NULL, mode = ? "
              "WHERE ino = ?",
              {int64_t{(inode->mode & S_IFMT) | (mode & 07777)}, ino});
          if (!u) return std::unexpected(u.error());
          TRY_ASSIGN(made,
                     impl_->AppendVersion(txn, c, ino, w.path, draft.get(),
                                          digest, mode & 07777, now, now));
          TRY(TouchDir(txn, w.parent->ino, now));
          TRY(RecordChange(txn, w.path, c.session, now, impl_->Origin(c)));
          seen = {ino, made, w.path};
          relinked = true;
          return {};
        }));
    impl_->SetSeen(c.session, std::get<0>(seen), std::get<1>(seen),
                   std::get<2>(seen));
  }
  if (!relinked) {
    // A file is at the path: version n is committed over it as any write
    // would be (lease and staleness rules apply). The restorer has just
    // looked at the history: what it restores over is what it saw.
    TRY(engine_->Read([&](Txn& txn) -> Status {
      TRY_ASSIGN(w, WalkFor(txn, *policy, path.str(), false));
      if (w.node)
        impl_->SetSeen(c.session, w.node->ino, w.node->version, w.path);
      return {};
    }));
    TRY_ASSIGN(file, Open(c, path, O_WRONLY | O_CREAT | O_TRUNC, mode & 07777));
    // A restore that fails part-way commits nothing.
    struct DiscardUnlessDone {
      vfs::FileHandle& h;
      bool done = false;
      ~DiscardUnlessDone() {
        if (!done) h.Discard();
      }
    } discard{*file};
    std::string buf(kChunkSize, '\0');
    off_t off = 0;
    while (true) {
      TRY_ASSIGN(got, old->Read(buf.data(), buf.size(), off));
      if (got == 0) break;
      TRY_ASSIGN(put, file->Write(buf.data(), got, off));
      if (put != got) return Fail(EIO, "short write while restoring");
      off += static_cast<off_t>(got);
    }
    TRY(file->Chmod(mode & 07777));
    discard.done = true;
    TRY(file->Flush());
  }
  TRY_ASSIGN(history, History(c, path));
  if (history.empty()) return Fail(EIO, "restore left no version");
  return history.back();
}

Result<PurgeReport> StoreBackend::Purge(const Caller& c, const Path& path,
                                        bool keep_current) {
  TRY_ASSIGN(policy, impl_->PolicyOf(c));
  if (policy->LevelOf(path.str()) < Level::kAdmin) {
    TRY(Impl::NeedVisible(*policy, path.str()));
    return Fail(EACCES, "purging needs admin on " + path.str());
  }
  PurgeReport report;
  int64_t now = NowNs();
  TRY(engine_->Write(Durability::kFull, [&](Txn& txn) -> Status {
    std::string canon;
    TRY_ASSIGN(current, FileOfPath(txn, *policy, path.str(), &canon));
    // The purge removes every name of the file: the purger needs admin where
    // each of them is, not only on the path it gave (which may lead through
    // a symlink).
    auto names =
        txn.Query("SELECT parent, name FROM dentries WHERE ino = ?", {current});
    if (!names) return std::unexpected(names.error());
    std::vector<std::string> where{canon};
    for (const auto& r : *names) {
      TRY_ASSIGN(dir, DirPath(txn, AsInt(r[0])));
      if (!dir.empty())
        where.push_back((dir == "/" ? "" : dir) + "/" + AsText(r[1]));
    }
    for (const auto& p : where) {
      if (policy->LevelOf(p) >= Level::kAdmin) continue;
      if (p == canon && !policy->Visible(p)) {
        return Fail(ENOENT, "no such file or directory");
      }
      // Another name of the file is not named unless the purger can see it.
      return Fail(EACCES, "purging " + path.str() + " needs admin on " +
                              (policy->Visible(p) ? p : "every name it has") +
                              "; ask an admin");
    }
    // The file at the path and every deleted file that was there before.
    std::vector<int64_t> inos{current};
    auto earlier = txn.Query(
        "SELECT DISTINCT v.ino FROM versions v JOIN inodes i ON i.ino = v.ino "
        "WHERE v.path = ? AND i.nlink = 0 AND v.ino != ?",
        {canon, current});
    if (!earlier) return std::unexpected(earlier.error());
    for (const auto& r : *earlier) inos.push_back(AsInt(r[0]));
    // Their versions may have been made elsewhere (a file moved here from
    // another team's folder): erasing those needs admin there as well.
    for (int64_t ino : inos) {
      auto made_at =
          txn.Query("SELECT DISTINCT path FROM versions WHERE ino = ?", {ino});
      if (!made_at) return std::unexpected(made_at.error());
      for (const auto& r : *made_at) {
        std::string p = AsText(r[0]);
        if (policy->LevelOf(p) >= Level::kAdmin) continue;
        return Fail(EACCES,
                    "purging " + path.str() + " would erase versions made at " +
                        (policy->Visible(p) ? p : "a place") + " where user '" +
                        policy->user() + "' is not admin; ask an admin there");
      }
    }
    // (content, versions of it going): each version holds one reference.
    std::vector<std::pair<std::string, int64_t>> refs_gone;
    for (int64_t ino : inos) {
      TRY_ASSIGN(inode, LoadInode(txn, ino));
      bool keep = keep_current && inode && !inode->deleted;
      auto old = txn.Query(
          keep ? "SELECT content, COUNT(*) FROM versions WHERE ino = ? AND "
                 "n < ? AND content IS NOT NULL GROUP BY content"
               : "SELECT content, COUNT(*) FROM versions WHERE ino = ? AND "
                 "? >= 0 AND content IS NOT NULL GROUP BY content",
          {ino, inode ? inode->version : int64_t{0}});
      if (!old) return std::unexpected(old.error());
      for (const auto& r : *old)
        refs_gone.emplace_back(AsText(r[0]), AsInt(r[1]));
      auto del =
          txn.Exec(keep ? "DELETE FROM versions WHERE ino = ? AND n < ?"
                        : "DELETE FROM versions WHERE ino = ? AND ? >= 0",
                   {ino, inode ? inode->version : int64_t{0}});
      if (!del) return std::unexpected(del.error());
      report.versions += *del;
      if (!keep && inode) {
        auto names =
            txn.Query("SELECT parent, name FROM dentries WHERE ino = ?", {ino});
        if (!names) return std::unexpected(names.error());
        for (const auto& r : *names) {
          auto d =
              txn.Exec("DELETE FROM dentries WHERE parent = ? AND name = ?",
                       {AsInt(r[0]), AsText(r[1])});
          if (!d) return std::unexpected(d.error());
          TRY(TouchDir(txn, AsInt(r[0]), now));
        }
        auto di = txn.Exec("DELETE FROM inodes WHERE ino = ?", {ino});
        if (!di) return std::unexpected(di.error());
        auto dl = txn.Exec("DELETE FROM leases WHERE ino = ?", {ino});
        if (!dl) return std::unexpected(dl.error());
        report.files += 1;
        TRY(RecordChange(txn, canon, c.session, now, impl_->Origin(c)));
      }
    }
    // One reference less per version gone; content nobody refers to any
    // more goes, and so do chunks nobody shares.
    for (const auto& [h, gone] : refs_gone) {
      auto left = txn.Query(
          "UPDATE contents SET refs = refs - ? WHERE hash = ? "
          "RETURNING refs, inline_id",
          {gone, h});
      if (!left) return std::unexpected(left.error());
      if (left->empty() || AsInt((*left)[0][0]) > 0) continue;
      if (!IsNull((*left)[0][1])) {  // inline: one row of bytes
        auto di = txn.Query(
            "DELETE FROM inline_bytes WHERE id = ? RETURNING length(data)",
            {AsInt((*left)[0][1])});
        if (!di) return std::unexpected(di.error());
        auto dd = txn.Exec("DELETE FROM contents WHERE hash = ?", {h});
        if (!dd) return std::unexpected(dd.error());
        report.blobs += static_cast<int64_t>(di->size());
        if (!di->empty()) report.bytes += AsInt((*di)[0][0]);
        continue;
      }
      auto blobs = txn.Query(
          "SELECT blob FROM chunks WHERE content = ? AND blob != 0", {h});
      if (!blobs) return std::unexpected(blobs.error());
      auto dc = txn.Exec("DELETE FROM chunks WHERE content = ?", {h});
      if (!dc) return std::unexpected(dc.error());
      auto dd = txn.Exec("DELETE FROM contents WHERE hash = ?", {h});
      if (!dd) return std::unexpected(dd.error());
      for (const auto& b : *blobs) {
        int64_t id = AsInt(b[0]);
        auto refs = txn.Query(
            "UPDATE blobs SET refs = refs - 1 WHERE id = ? RETURNING refs, "
            "size",
            {id});
        if (!refs) return std::unexpected(refs.error());
        if (refs->empty() || AsInt((*refs)[0][0]) > 0) continue;
        auto db = txn.Exec("DELETE FROM blobs WHERE id = ?", {id});
        if (!db) return std::unexpected(db.error());
        report.blobs += *db;
        report.bytes += AsInt((*refs)[0][1]);
      }
    }
    // Until the compaction below has finished, the purged bytes may still
    // be in the database's files: a purge stopped meanwhile (killed, a
    // crash) leaves this mark for the next admin to see.
    return MarkCompactionPending(txn, true);
  }));
  if (auto compacted = engine_->Compact(); !compacted) {
    vfs::Error e = compacted.error();
    e.message =
        "the purge is committed (nothing purged can be read any more), but "
        "compacting the store failed: " +
        e.message +
        (e.message.find("agentvfs compact") == std::string::npos
             ? "; once that is fixed, run `agentvfs compact`"
             : "");
    return std::unexpected(e);
  }
  (void)engine_->Write(Durability::kProcess, [](Txn& txn) -> Status {
    return MarkCompactionPending(txn, false);
  });
  return report;
}

Result<bool> StoreBackend::CompactionPending() {
  bool pending = false;
  TRY(engine_->Read([&](Txn& txn) -> Status {
    auto rows =
        txn.Query("SELECT 1 FROM meta WHERE key = 'compaction_pending'");
    if (!rows) return std::unexpected(rows.error());
    pending = !rows->empty();
    return {};
  }));
  return pending;
}

}  // namespace agentvfs::store
