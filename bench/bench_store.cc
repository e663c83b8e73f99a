// agentvfs_bench_store: one step of the store benchmark, timed, printed as
// one JSON line. scripts/bench-store runs these against a store served
// through `agentvfs mount --store` (/memories), against the same workload on
// the native filesystem, and against raw SQLite doing the equivalent work in
// a plain table, and compares them (issue 3, acceptance point 8).
//
//   agentvfs_bench_store <op> [flags]      (--help lists the ops' flags)
//
// Setup (not measurements):
//   setup      create a store (InitStore, admin "admin") with one user, and
//              write that user's token to --token-file
//   populate   insert --dirs x --files empty files (or --files in one flat
//              directory with --dirs 0) under /memories/users/<user>/<under>
//              straight into the store's tables, in one transaction, with the
//              rows the store itself makes for a create (namespace.h
//              CreateNode)
//   sqlite-fill  a raw SQLite table of --files rows of --size bytes
// Measurements (files in directories: native, or through the mount):
//   commit     --files new files of --size bytes (--per-dir files per
//              directory dNNNN, 0 = flat): open(O_CREAT|O_WRONLY), write,
//              [fsync with --fsync], close; through the mount each close is
//              one commit. Also prints the mean time per file of each call
//              (open_us, write_us, close_us)
//   read       read the files made by `commit` in --block reads, verified
//   list       readdir of <dir> (and fstatat of every entry with --stat)
//   statlat    fstatat latency of --samples random files of each tree made
//              by `populate` (dirs dNNNN, files fNNNNNN), the trees' samples
//              interleaved; each stat is relative to an open fd of its
//              directory, so it resolves exactly one name the kernel has not
//              cached
//   exec       run the command after `--` in <dir> (for rm -rf)
//   api-statlat  StoreBackend::Stat latency of random files of a
//              `populate` tree, in this process (no FUSE)
//   api-commit like `commit`, but through the StoreBackend API in this
//              process (no FUSE): the same backend calls the mount makes
//              for each file (lookup, create, stat, write, getattr, flush,
//              release), as the user whose token is in --token-file, with
//              commit durability --sync; shows what FUSE adds. Also prints
//              the mean time per file of the calls (lookup_us, create_us,
//              write_us, getattr_us, commit_us, release_us)
// Raw SQLite baselines (table (name TEXT PRIMARY KEY, data BLOB), WAL):
//   sqlite-commit  --files INSERTs of --size bytes, one transaction each,
//                  PRAGMA synchronous=--sync
//   sqlite-read    every row's blob through sqlite3_blob_read, verified
//   sqlite-list    SELECT name of every row
// Raw PostgreSQL baselines (libpq; table (name TEXT PRIMARY KEY, data
// BYTEA) in the database --db, a postgresql:// URI):
//   pg-commit      --files INSERTs, one transaction each, synchronous_commit
//                  on (--sync full) or off (--sync normal)
//   pg-fill        the same rows in one transaction
//   pg-read        every row's bytes (SELECT data, binary), verified
//
// File contents are distinct per file (the store deduplicates equal
// content) and verifiable on read. Only the system calls (or SQLite calls)
// are timed, not generating or checking data. Exit status: 0 on success, 1
// on an error or a wrong read-back, 2 on a usage error.
#include <dirent.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/store/admin.h"
#include "backends/store/engine.h"
#include "backends/store/namespace.h"
#include "backends/store/store.h"
#include "vfs/path.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "agentvfs_bench_store: %s\n", what.c_str());
  std::exit(1);
}

[[noreturn]] void DieErrno(const std::string& what) {
  Die(what + ": " + std::strerror(errno));
}

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Accumulates time spent inside the timed sections only.
class Stopwatch {
 public:
  void Start() { t0_ = Clock::now(); }
  void Stop() { total_ += Clock::now() - t0_; }
  double seconds() const { return Seconds(total_); }

 private:
  Clock::time_point t0_;
  Clock::duration total_{};
};

struct Options {
  std::string op;
  std::string dir;
  std::string db;
  std::string user = "bench";
  std::string token_file;
  std::string under = "tree";
  std::string sync = "full";
  std::string table = "files";
  uint64_t files = 1000;
  uint64_t dirs = 0;
  uint64_t per_dir = 0;
  uint64_t size = 4096;
  uint64_t block = 1 << 20;
  uint64_t samples = 1000;
  uint64_t seed = 42;
  bool fsync = false;
  bool stat = false;
  std::vector<std::string> argv;
  std::vector<std::string> trees;  // statlat: DIR:NDIRS
};

// One JSON line: the op, its seconds and whatever else it measured.
void Report(const Options& o, double seconds, uint64_t ops, uint64_t bytes,
            const std::string& extra = "") {
  double s = seconds > 0 ? seconds : 1e-9;
  std::printf(
      "{\"op\":\"%s\",\"seconds\":%.6f,\"ops\":%llu,\"bytes\":%llu,"
      "\"ops_per_s\":%.3f,\"mib_per_s\":%.3f%s%s}\n",
      o.op.c_str(), seconds, static_cast<unsigned long long>(ops),
      static_cast<unsigned long long>(bytes), static_cast<double>(ops) / s,
      static_cast<double>(bytes) / (1 << 20) / s, extra.empty() ? "" : ",",
      extra.c_str());
}

// --- content ---------------------------------------------------------------

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The content of file `index`: a seeded pseudo-random stream, distinct for
// every (seed, index), so that no two files deduplicate.
void Fill(std::string& buf, uint64_t seed, uint64_t index) {
  uint64_t s = seed * 0x100000001b3ull ^ (index + 1) * 0x9e3779b97f4a7c15ull;
  size_t i = 0;
  for (; i + 8 <= buf.size(); i += 8) {
    uint64_t w = SplitMix(s);
    std::memcpy(buf.data() + i, &w, 8);
  }
  for (; i < buf.size(); ++i) buf[i] = static_cast<char>(SplitMix(s));
}

// The name of file `i` of a tree with `per_dir` files per directory
// (relative; 0 = flat).
std::string TreeName(uint64_t i, uint64_t per_dir) {
  char name[48];
  if (per_dir == 0) {
    std::snprintf(name, sizeof name, "f%07llu",
                  static_cast<unsigned long long>(i));
  } else {
    std::snprintf(name, sizeof name, "d%04llu/f%07llu",
                  static_cast<unsigned long long>(i / per_dir),
                  static_cast<unsigned long long>(i));
  }
  return name;
}

std::string DirName(uint64_t d) {
  char name[32];
  std::snprintf(name, sizeof name, "d%04llu",
                static_cast<unsigned long long>(d));
  return name;
}

std::string FileName(uint64_t f) {
  char name[32];
  std::snprintf(name, sizeof name, "f%06llu",
                static_cast<unsigned long long>(f));
  return name;
}

void WriteAll(int fd, const char* buf, size_t len, const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::write(fd, buf + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      DieErrno("write " + path);
    }
    if (n == 0) Die("write " + path + ": wrote nothing");
    done += static_cast<size_t>(n);
  }
}

// --- setup -----------------------------------------------------------------

void Setup(const Options& o) {
  auto t0 = Clock::now();
  auto admin_token = agentvfs::store::InitStore(o.db, "admin");
  if (!admin_token) Die("init " + o.db + ": " + admin_token.error().message);
  auto engine = agentvfs::store::Engine::Open(o.db, false);
  if (!engine) Die("open " + o.db + ": " + engine.error().message);
  auto token = agentvfs::store::AddUser(**engine, "admin", o.user, {});
  if (!token) Die("add user " + o.user + ": " + token.error().message);
  int fd = ::open(o.token_file.c_str(),
                  O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) DieErrno("open " + o.token_file);
  std::string line = *token + "\n";
  WriteAll(fd, line.data(), line.size(), o.token_file);
  ::close(fd);
  Report(o, Seconds(Clock::now() - t0), 1, 0);
}

void Populate(const Options& o) {
  using agentvfs::store::Inode;
  using agentvfs::store::Txn;
  namespace store = agentvfs::store;
  auto engine = store::Engine::Open(o.db, false);
  if (!engine) Die("open " + o.db + ": " + engine.error().message);
  std::string base = "/memories/users/" + o.user + "/" + o.under;
  int64_t uid = ::geteuid(), gid = ::getegid();
  uint64_t made = 0;
  auto t0 = Clock::now();
  auto ok = (*engine)->Write(
      store::Durability::kFull, [&](Txn& txn) -> agentvfs::vfs::Status {
        int64_t now = store::NowNs();
        if (auto ok = store::MakeDirs(txn, base, now); !ok) return ok;
        auto w = store::Walk(txn, base, true);
        if (!w) return std::unexpected(w.error());
        if (!w->node || !w->node->IsDir()) {
          return agentvfs::vfs::Fail(ENOTDIR, base + " is not a directory");
        }
        auto add_files = [&](const Inode& dir) -> agentvfs::vfs::Status {
          for (uint64_t f = 0; f < o.files; ++f) {
            auto n = store::CreateNode(txn, dir, FileName(f), S_IFREG, 0644,
                                       uid, gid, "", now);
            if (!n) return std::unexpected(n.error());
            ++made;
          }
          return {};
        };
        if (o.dirs == 0) return add_files(*w->node);
        for (uint64_t d = 0; d < o.dirs; ++d) {
          auto dir = store::CreateNode(txn, *w->node, DirName(d), S_IFDIR, 0755,
                                       uid, gid, "", now);
          if (!dir) return std::unexpected(dir.error());
          if (auto ok = add_files(*dir); !ok) return ok;
        }
        return {};
      });
  if (!ok) Die("populate " + o.db + ": " + ok.error().message);
  engine->reset();  // the last connection's close checkpoints the log
  Report(o, Seconds(Clock::now() - t0), made, 0);
}

// --- file system measurements ----------------------------------------------

void Commit(const Options& o) {
  std::string buf(o.size, '\0');
  // Directories first, untimed: the measurement is file commits.
  if (o.per_dir > 0) {
    for (uint64_t d = 0; d * o.per_dir < o.files; ++d) {
      std::string dir = o.dir + "/" + DirName(d);
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        DieErrno("mkdir " + dir);
      }
    }
  }
  std::vector<double> lat;
  lat.reserve(o.files);
  Stopwatch sw;
  // Where each file's time goes: open (through the mount: the directory's
  // GETATTR, LOOKUP, CREATE), write (+ fsync), close (FLUSH: the commit).
  Stopwatch open_sw, write_sw, close_sw;
  for (uint64_t i = 0; i < o.files; ++i) {
    std::string path = o.dir + "/" + TreeName(i, o.per_dir);
    Fill(buf, o.seed, i);
    auto t0 = Clock::now();
    sw.Start();
    open_sw.Start();
    int fd =
        ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) DieErrno("open " + path);
    open_sw.Stop();
    write_sw.Start();
    WriteAll(fd, buf.data(), buf.size(), path);
    if (o.fsync && ::fsync(fd) != 0) DieErrno("fsync " + path);
    write_sw.Stop();
    close_sw.Start();
    if (::close(fd) != 0) DieErrno("close " + path);
    close_sw.Stop();
    sw.Stop();
    lat.push_back(Seconds(Clock::now() - t0) * 1e6);
  }
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat.empty() ? 0.0
                       : lat[std::min(lat.size() - 1,
                                      static_cast<size_t>(p * lat.size()))];
  };
  double n = static_cast<double>(std::max<uint64_t>(o.files, 1));
  char extra[192];
  std::snprintf(extra, sizeof extra,
                "\"p50_us\":%.1f,\"p99_us\":%.1f,\"open_us\":%.1f,"
                "\"write_us\":%.1f,\"close_us\":%.1f",
                pct(0.5), pct(0.99), open_sw.seconds() / n * 1e6,
                write_sw.seconds() / n * 1e6, close_sw.seconds() / n * 1e6);
  Report(o, sw.seconds(), o.files, o.files * o.size, extra);
}

void Read(const Options& o) {
  std::string buf(o.block, '\0');
  std::string want(o.size, '\0');
  Stopwatch sw;
  uint64_t total = 0;
  for (uint64_t i = 0; i < o.files; ++i) {
    std::string path = o.dir + "/" + TreeName(i, o.per_dir);
    sw.Start();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    sw.Stop();
    if (fd < 0) DieErrno("open " + path);
    Fill(want, o.seed, i);
    uint64_t off = 0;
    for (;;) {
      sw.Start();
      ssize_t n = ::read(fd, buf.data(), buf.size());
      sw.Stop();
      if (n < 0) {
        if (errno == EINTR) continue;
        DieErrno("read " + path);
      }
      if (n == 0) break;
      if (off + n > want.size() ||
          std::memcmp(buf.data(), want.data() + off, n) != 0) {
        Die(path + ": wrong data at offset " + std::to_string(off));
      }
      off += static_cast<uint64_t>(n);
    }
    sw.Start();
    ::close(fd);
    sw.Stop();
    if (off != o.size) {
      Die(path + ": read " + std::to_string(off) + " bytes, expected " +
          std::to_string(o.size));
    }
    total += off;
  }
  Report(o, sw.seconds(), o.files, total);
}

void List(const Options& o) {
  uint64_t entries = 0;
  auto t0 = Clock::now();
  DIR* d = ::opendir(o.dir.c_str());
  if (d == nullptr) DieErrno("opendir " + o.dir);
  int dfd = ::dirfd(d);
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) {
      continue;
    }
    if (o.stat) {
      struct stat st;
      if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        DieErrno(std::string("stat ") + e->d_name);
      }
    }
    ++entries;
  }
  if (errno != 0) DieErrno("readdir " + o.dir);
  ::closedir(d);
  double secs = Seconds(Clock::now() - t0);
  if (o.files > 0 && entries != o.files) {
    Die(o.dir + ": listed " + std::to_string(entries) + " entries, expected " +
        std::to_string(o.files));
  }
  Report(o, secs, entries, 0);
}

// One tree of `statlat`: its files picked at random, its directories open.
struct StatTree {
  std::string dir;
  uint64_t dirs = 0;
  std::vector<uint64_t> picks;  // file indices, distinct
  std::map<uint64_t, int> fds;  // directory index -> open fd
  std::vector<double> lat;      // microseconds
};

void StatLatency(const Options& o) {
  // Enough descriptors for one per directory.
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  std::vector<StatTree> trees;
  for (const std::string& spec : o.trees) {
    StatTree t;
    auto colon = spec.rfind(':');
    if (colon == std::string::npos) Die("--tree wants DIR:NDIRS, not " + spec);
    t.dir = spec.substr(0, colon);
    t.dirs = std::stoull(spec.substr(colon + 1));
    uint64_t total = std::max<uint64_t>(t.dirs, 1) * o.files;
    uint64_t n = std::min(o.samples, total);
    // Distinct random files (a partial Fisher-Yates over the indices).
    std::mt19937_64 rng(o.seed + trees.size());
    std::map<uint64_t, uint64_t> swapped;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t j = i + rng() % (total - i);
      uint64_t vi = swapped.count(i) ? swapped[i] : i;
      uint64_t vj = swapped.count(j) ? swapped[j] : j;
      swapped[j] = vi;
      t.picks.push_back(vj);
    }
    // Directory fds, opened untimed; O_PATH: a lookup only (no OPENDIR,
    // which would list the directory in the daemon).
    for (uint64_t p : t.picks) {
      uint64_t d = t.dirs == 0 ? 0 : p / o.files;
      if (t.fds.count(d)) continue;
      std::string dir = t.dirs == 0 ? t.dir : t.dir + "/" + DirName(d);
      int fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) DieErrno("open " + dir);
      t.fds[d] = fd;
    }
    t.lat.reserve(n);
    trees.push_back(std::move(t));
  }
  // Interleaved, so that every tree sees the same machine (wake-up
  // latencies on a VM drift over seconds).
  double sum = 0;
  uint64_t done = 0;
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (StatTree& t : trees) {
      if (i >= t.picks.size()) continue;
      any = true;
      uint64_t p = t.picks[i];
      uint64_t d = t.dirs == 0 ? 0 : p / o.files;
      std::string name = FileName(p % o.files);
      struct stat st;
      auto t0 = Clock::now();
      int rc = ::fstatat(t.fds[d], name.c_str(), &st, AT_SYMLINK_NOFOLLOW);
      double us = Seconds(Clock::now() - t0) * 1e6;
      if (rc != 0) DieErrno("stat " + t.dir + "/" + DirName(d) + "/" + name);
      if (!S_ISREG(st.st_mode)) Die(name + " is not a regular file");
      t.lat.push_back(us);
      sum += us;
      ++done;
    }
    if (!any) break;
  }
  std::string extra;
  for (size_t k = 0; k < trees.size(); ++k) {
    StatTree& t = trees[k];
    for (auto& [d, fd] : t.fds) ::close(fd);
    std::sort(t.lat.begin(), t.lat.end());
    auto pct = [&](double q) {
      return t.lat.empty()
                 ? 0.0
                 : t.lat[std::min(t.lat.size() - 1,
                                  static_cast<size_t>(q * t.lat.size()))];
    };
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "%s\"p50_us_%zu\":%.2f,\"p90_us_%zu\":%.2f,"
                  "\"p99_us_%zu\":%.2f,\"samples_%zu\":%zu",
                  k == 0 ? "" : ",", k, pct(0.5), k, pct(0.9), k, pct(0.99), k,
                  t.lat.size());
    extra += buf;
  }
  Report(o, sum / 1e6, done, 0, extra);
}

void Exec(const Options& o) {
  if (o.argv.empty()) Die("exec needs a command after --");
  std::vector<char*> args;
  for (const std::string& a : o.argv) {
    args.push_back(const_cast<char*>(a.c_str()));
  }
  args.push_back(nullptr);
  std::fflush(stdout);
  auto t0 = Clock::now();
  pid_t pid = ::fork();
  if (pid < 0) DieErrno("fork");
  if (pid == 0) {
    if (::chdir(o.dir.c_str()) != 0) _exit(127);
    ::execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) DieErrno("waitpid");
  }
  double secs = Seconds(Clock::now() - t0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("command `" + o.argv[0] + "` failed (status " + std::to_string(status) +
        ")");
  }
  Report(o, secs, 1, 0);
}

void ApiCommit(const Options& o) {
  namespace store = agentvfs::store;
  namespace vfs = agentvfs::vfs;
  std::string token;
  {
    std::ifstream in(o.token_file);
    std::getline(in, token);
  }
  if (token.empty()) Die("no token in " + o.token_file);
  store::StoreOptions options;
  if (o.sync == "normal") {
    options.commit_durability = store::Durability::kProcess;
  } else if (o.sync != "full") {
    Die("--sync must be full or normal");
  }
  auto backend = store::StoreBackend::Open(o.db, options);
  if (!backend) Die("open " + o.db + ": " + backend.error().message);
  store::StoreBackend& b = **backend;
  auto user = store::Authenticate(b.engine(), token);
  if (!user) Die("token: " + user.error().message);
  vfs::Caller c;
  c.user = *user;
  c.session = "bench-api";
  c.uid = ::geteuid();
  c.gid = ::getegid();
  auto base = vfs::Path::Parse(o.dir);
  if (!base) Die(o.dir + ": " + base.error().message);
  auto parse = [&](const std::string& rel) {
    auto p = vfs::Path::Parse(o.dir + "/" + rel);
    if (!p) Die(rel + ": " + p.error().message);
    return *p;
  };
  if (auto ok = b.Mkdir(c, *base, 0755); !ok && ok.error().code != EEXIST) {
    Die("mkdir " + o.dir + ": " + ok.error().message);
  }
  if (o.per_dir > 0) {
    for (uint64_t d = 0; d * o.per_dir < o.files; ++d) {
      if (auto ok = b.Mkdir(c, parse(DirName(d)), 0755); !ok) {
        Die("mkdir " + DirName(d) + ": " + ok.error().message);
      }
    }
  }
  std::string buf(o.size, '\0');
  Stopwatch sw;
  // Each call's share: lookup, create, write, getattr, commit, release.
  std::array<Stopwatch, 6> call;
  for (uint64_t i = 0; i < o.files; ++i) {
    vfs::Path path = parse(TreeName(i, o.per_dir));
    Fill(buf, o.seed, i);
    sw.Start();
    call[0].Start();
    if (b.Stat(c, path)) Die(path.str() + " exists");  // the LOOKUP
    call[0].Stop();
    call[1].Start();
    auto h = b.Open(c, path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (!h) Die("create " + path.str() + ": " + h.error().message);
    if (!(*h)->AttrsAtOpen()) {  // the create reply's attributes
      if (auto st = (*h)->Stat(); !st) Die("stat: " + st.error().message);
    }
    call[1].Stop();
    call[2].Start();
    auto n = (*h)->Write(buf.data(), buf.size(), 0);
    if (!n || *n != buf.size()) Die("write " + path.str());
    call[2].Stop();
    call[3].Start();
    if (auto st = b.Stat(c, path); !st) Die("getattr: " + st.error().message);
    call[3].Stop();
    call[4].Start();
    if (auto ok = (*h)->Flush(); !ok) Die("commit: " + ok.error().message);
    call[4].Stop();
    call[5].Start();
    h->reset();  // the RELEASE
    call[5].Stop();
    sw.Stop();
  }
  double files = static_cast<double>(std::max<uint64_t>(o.files, 1));
  auto us = [&](size_t k) { return call[k].seconds() / files * 1e6; };
  char extra[256];
  std::snprintf(extra, sizeof extra,
                "\"lookup_us\":%.1f,\"create_us\":%.1f,\"write_us\":%.1f,"
                "\"getattr_us\":%.1f,\"commit_us\":%.1f,\"release_us\":%.1f",
                us(0), us(1), us(2), us(3), us(4), us(5));
  Report(o, sw.seconds(), o.files, o.files * o.size, extra);
}

// Latency of StoreBackend::Stat of random files of a `populate` tree, in
// this process (no FUSE): the store's own share of a stat through the mount.
void ApiStatLatency(const Options& o) {
  namespace store = agentvfs::store;
  namespace vfs = agentvfs::vfs;
  std::string token;
  {
    std::ifstream in(o.token_file);
    std::getline(in, token);
  }
  auto backend = store::StoreBackend::Open(o.db);
  if (!backend) Die("open " + o.db + ": " + backend.error().message);
  store::StoreBackend& b = **backend;
  auto user = store::Authenticate(b.engine(), token);
  if (!user) Die("token: " + user.error().message);
  vfs::Caller c;
  c.user = *user;
  c.session = "bench-api";
  uint64_t total = std::max<uint64_t>(o.dirs, 1) * o.files;
  std::mt19937_64 rng(o.seed);
  std::vector<vfs::Path> paths;
  for (uint64_t i = 0; i < o.samples; ++i) {
    uint64_t p = rng() % total;
    std::string rel = o.dirs == 0
                          ? FileName(p)
                          : DirName(p / o.files) + "/" + FileName(p % o.files);
    auto path = vfs::Path::Parse("/memories/users/" + c.user + "/" + o.under +
                                 "/" + rel);
    if (!path) Die(rel + ": " + path.error().message);
    paths.push_back(*path);
  }
  std::vector<double> lat;
  lat.reserve(paths.size());
  double sum = 0;
  for (const vfs::Path& path : paths) {
    auto t0 = Clock::now();
    auto st = b.Stat(c, path);
    double us = Seconds(Clock::now() - t0) * 1e6;
    if (!st) Die("stat " + path.str() + ": " + st.error().message);
    lat.push_back(us);
    sum += us;
  }
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double q) {
    return lat.empty() ? 0.0
                       : lat[std::min(lat.size() - 1,
                                      static_cast<size_t>(q * lat.size()))];
  };
  char extra[96];
  std::snprintf(extra, sizeof extra, "\"p50_us\":%.2f,\"p99_us\":%.2f",
                pct(0.5), pct(0.99));
  Report(o, sum / 1e6, lat.size(), 0, extra);
}

// --- raw SQLite ------------------------------------------------------------

// A raw SQLite connection with a checked exec; closes on scope exit.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db_,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                        nullptr) != SQLITE_OK) {
      Die("sqlite open " + path + ": " + sqlite3_errmsg(db_));
    }
    sqlite3_busy_timeout(db_, 30000);
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  sqlite3* get() const { return db_; }
  void Run(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err != nullptr ? err : sqlite3_errmsg(db_);
      sqlite3_free(err);
      Die("sqlite `" + sql + "`: " + msg);
    }
  }
  sqlite3_stmt* Prepare(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      Die("sqlite prepare `" + sql + "`: " + sqlite3_errmsg(db_));
    }
    return stmt;
  }

 private:
  sqlite3* db_ = nullptr;
};

std::string SyncPragma(const std::string& sync) {
  if (sync != "full" && sync != "normal" && sync != "off" && sync != "extra") {
    Die("--sync must be full, normal, off or extra");
  }
  return "PRAGMA synchronous=" + sync;
}

// One INSERT per file: one transaction each when `per_commit`, else all in
// one. Returns the seconds of the timed part.
double InsertRows(const Options& o, bool per_commit, std::vector<double>* lat) {
  RawDb db(o.db);
  db.Run("PRAGMA journal_mode=WAL");
  db.Run(SyncPragma(o.sync));
  db.Run("CREATE TABLE IF NOT EXISTS " + o.table +
         "(name TEXT PRIMARY KEY, data BLOB)");
  sqlite3_stmt* begin = db.Prepare("BEGIN IMMEDIATE");
  sqlite3_stmt* commit = db.Prepare("COMMIT");
  sqlite3_stmt* ins =
      db.Prepare("INSERT INTO " + o.table + "(name, data) VALUES(?, ?)");
  auto step = [&](sqlite3_stmt* s) {
    if (sqlite3_step(s) != SQLITE_DONE) {
      Die(std::string("sqlite step: ") + sqlite3_errmsg(db.get()));
    }
    sqlite3_reset(s);
  };
  std::string buf(o.size, '\0');
  Stopwatch sw;
  if (!per_commit) step(begin);
  for (uint64_t i = 0; i < o.files; ++i) {
    std::string name = TreeName(i, o.per_dir);
    Fill(buf, o.seed, i);
    auto t0 = Clock::now();
    sw.Start();
    if (per_commit) step(begin);
    sqlite3_bind_text(ins, 1, name.data(), static_cast<int>(name.size()),
                      SQLITE_STATIC);
    sqlite3_bind_blob(ins, 2, buf.data(), static_cast<int>(buf.size()),
                      SQLITE_STATIC);
    step(ins);
    if (per_commit) step(commit);
    sw.Stop();
    if (lat != nullptr) lat->push_back(Seconds(Clock::now() - t0) * 1e6);
  }
  if (!per_commit) step(commit);
  sqlite3_finalize(begin);
  sqlite3_finalize(commit);
  sqlite3_finalize(ins);
  return sw.seconds();
}

// Reports one commit per file with the latency percentiles of `lat` (us).
void ReportCommits(const Options& o, double secs, std::vector<double>& lat) {
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double q) {
    return lat.empty() ? 0.0
                       : lat[std::min(lat.size() - 1,
                                      static_cast<size_t>(q * lat.size()))];
  };
  char extra[96];
  std::snprintf(extra, sizeof extra, "\"p50_us\":%.1f,\"p99_us\":%.1f",
                pct(0.5), pct(0.99));
  Report(o, secs, o.files, o.files * o.size, extra);
}

void SqliteCommit(const Options& o) {
  std::vector<double> lat;
  lat.reserve(o.files);
  double secs = InsertRows(o, true, &lat);
  ReportCommits(o, secs, lat);
}

void SqliteFill(const Options& o) {
  double secs = InsertRows(o, false, nullptr);
  Report(o, secs, o.files, o.files * o.size);
}

void SqliteRead(const Options& o) {
  std::string want(o.size, '\0');
  std::string buf(o.block, '\0');
  Stopwatch sw;
  sw.Start();
  RawDb db(o.db);
  sqlite3_stmt* find =
      db.Prepare("SELECT rowid FROM " + o.table + " WHERE name = ?");
  sw.Stop();
  uint64_t total = 0;
  for (uint64_t i = 0; i < o.files; ++i) {
    std::string name = TreeName(i, o.per_dir);
    Fill(want, o.seed, i);
    sw.Start();
    sqlite3_bind_text(find, 1, name.data(), static_cast<int>(name.size()),
                      SQLITE_STATIC);
    if (sqlite3_step(find) != SQLITE_ROW) Die("no row " + name);
    int64_t rowid = sqlite3_column_int64(find, 0);
    sqlite3_reset(find);
    sqlite3_blob* blob = nullptr;
    if (sqlite3_blob_open(db.get(), "main", o.table.c_str(), "data", rowid, 0,
                          &blob) != SQLITE_OK) {
      Die("blob open " + name + ": " + sqlite3_errmsg(db.get()));
    }
    int bytes = sqlite3_blob_bytes(blob);
    sw.Stop();
    if (static_cast<uint64_t>(bytes) != o.size) Die(name + ": wrong size");
    for (int off = 0; off < bytes;) {
      int n = std::min<int>(static_cast<int>(buf.size()), bytes - off);
      sw.Start();
      int rc = sqlite3_blob_read(blob, buf.data(), n, off);
      sw.Stop();
      if (rc != SQLITE_OK) Die("blob read " + name);
      if (std::memcmp(buf.data(), want.data() + off, n) != 0) {
        Die(name + ": wrong data at offset " + std::to_string(off));
      }
      off += n;
    }
    sw.Start();
    sqlite3_blob_close(blob);
    sw.Stop();
    total += static_cast<uint64_t>(bytes);
  }
  sqlite3_finalize(find);
  Report(o, sw.seconds(), o.files, total);
}

void SqliteList(const Options& o) {
  auto t0 = Clock::now();
  uint64_t rows = 0;
  {
    RawDb db(o.db);
    sqlite3_stmt* sel = db.Prepare("SELECT name FROM " + o.table);
    int rc;
    while ((rc = sqlite3_step(sel)) == SQLITE_ROW) {
      if (sqlite3_column_bytes(sel, 0) > 0) ++rows;
    }
    if (rc != SQLITE_DONE)
      Die(std::string("select: ") + sqlite3_errmsg(db.get()));
    sqlite3_finalize(sel);
  }
  double secs = Seconds(Clock::now() - t0);
  if (o.files > 0 && rows != o.files) {
    Die("listed " + std::to_string(rows) + " rows, expected " +
        std::to_string(o.files));
  }
  Report(o, secs, rows, 0);
}

// --- raw PostgreSQL --------------------------------------------------------

class RawPg {
 public:
  explicit RawPg(const std::string& uri) : conn_(PQconnectdb(uri.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) {
      Die("connect " + uri + ": " + PQerrorMessage(conn_));
    }
    Run("SET client_min_messages = warning");
  }
  ~RawPg() { PQfinish(conn_); }
  RawPg(const RawPg&) = delete;
  RawPg& operator=(const RawPg&) = delete;

  void Run(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    auto st = PQresultStatus(r);
    std::string err = PQresultErrorMessage(r);
    PQclear(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      Die("postgresql `" + sql + "`: " + err);
    }
  }
  void Prepare(const std::string& name, const std::string& sql) {
    PGresult* r = PQprepare(conn_, name.c_str(), sql.c_str(), 0, nullptr);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      Die("postgresql prepare `" + sql + "`: " + PQresultErrorMessage(r));
    }
    PQclear(r);
  }
  // Runs prepared `name` with text and binary parameters; the result
  // (binary format), owned by the caller.
  PGresult* Exec(const std::string& name, const std::string& text,
                 const std::string* bytes) {
    const char* values[2] = {text.c_str(), bytes ? bytes->data() : nullptr};
    int lengths[2] = {0, bytes ? static_cast<int>(bytes->size()) : 0};
    int formats[2] = {0, 1};
    PGresult* r = PQexecPrepared(conn_, name.c_str(), bytes ? 2 : 1, values,
                                 lengths, formats, 1);
    auto st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      Die("postgresql " + name + ": " + PQresultErrorMessage(r));
    }
    return r;
  }

 private:
  PGconn* conn_;
};

double PgInsertRows(const Options& o, bool per_commit, std::vector<double>* lat) {
  if (o.sync != "full" && o.sync != "normal") Die("--sync must be full or normal");
  RawPg db(o.db);
  db.Run(std::string("SET synchronous_commit = ") +
         (o.sync == "full" ? "on" : "off"));
  db.Run("CREATE TABLE IF NOT EXISTS " + o.table +
         "(name TEXT PRIMARY KEY, data BYTEA)");
  db.Prepare("ins", "INSERT INTO " + o.table + "(name, data) VALUES($1, $2)");
  std::string buf(o.size, '\0');
  Stopwatch sw;
  if (!per_commit) db.Run("BEGIN");
  for (uint64_t i = 0; i < o.files; ++i) {
    std::string name = TreeName(i, o.per_dir);
    Fill(buf, o.seed, i);
    auto t0 = Clock::now();
    sw.Start();
    if (per_commit) db.Run("BEGIN");
    PQclear(db.Exec("ins", name, &buf));
    if (per_commit) db.Run("COMMIT");
    sw.Stop();
    if (lat != nullptr) lat->push_back(Seconds(Clock::now() - t0) * 1e6);
  }
  if (!per_commit) db.Run("COMMIT");
  return sw.seconds();
}

void PgCommit(const Options& o) {
  std::vector<double> lat;
  lat.reserve(o.files);
  double secs = PgInsertRows(o, true, &lat);
  ReportCommits(o, secs, lat);
}

void PgFill(const Options& o) {
  double secs = PgInsertRows(o, false, nullptr);
  Report(o, secs, o.files, o.files * o.size);
}

void PgRead(const Options& o) {
  std::string want(o.size, '\0');
  Stopwatch sw;
  sw.Start();
  RawPg db(o.db);
  db.Prepare("get", "SELECT data FROM " + o.table + " WHERE name = $1");
  sw.Stop();
  uint64_t total = 0;
  for (uint64_t i = 0; i < o.files; ++i) {
    std::string name = TreeName(i, o.per_dir);
    Fill(want, o.seed, i);
    sw.Start();
    PGresult* r = db.Exec("get", name, nullptr);
    sw.Stop();
    if (PQntuples(r) != 1) Die("no row " + name);
    size_t n = static_cast<size_t>(PQgetlength(r, 0, 0));
    if (n != o.size || std::memcmp(PQgetvalue(r, 0, 0), want.data(), n) != 0) {
      Die(name + ": wrong data");
    }
    PQclear(r);
    total += n;
  }
  Report(o, sw.seconds(), o.files, total);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"agentvfs_bench_store: one timed step of scripts/bench-store"};
  app.require_subcommand(1);
  auto dir = [&](CLI::App* c) {
    c->add_option("dir", o.dir, "Directory to work in")->required();
  };
  auto db = [&](CLI::App* c) {
    c->add_option("--db", o.db, "Database file")->required();
  };
  auto files = [&](CLI::App* c) {
    c->add_option("--files", o.files, "Number of files (or rows)");
  };
  auto size = [&](CLI::App* c) {
    c->add_option("--size", o.size, "Bytes per file");
  };
  auto per_dir = [&](CLI::App* c) {
    c->add_option("--per-dir", o.per_dir,
                  "Files per directory dNNNN (0: all in one directory)");
  };
  auto seed = [&](CLI::App* c) {
    c->add_option("--seed", o.seed, "Content and sampling seed");
  };
  auto table = [&](CLI::App* c) {
    c->add_option("--table", o.table, "Table name");
  };

  auto* setup = app.add_subcommand("setup", "Create a store with one user");
  db(setup);
  setup->add_option("--user", o.user, "User to add");
  setup->add_option("--token-file", o.token_file, "Where the token goes")
      ->required();

  auto* populate =
      app.add_subcommand("populate", "Insert an empty-file tree directly");
  db(populate);
  files(populate);
  populate->add_option("--user", o.user, "Owner of the home directory");
  populate->add_option("--under", o.under,
                       "Directory under /memories/users/<user>");
  populate->add_option("--dirs", o.dirs,
                       "Directories dNNNN of --files each (0: flat)");

  auto* commit = app.add_subcommand("commit", "Write new files, one by one");
  dir(commit);
  files(commit);
  size(commit);
  per_dir(commit);
  seed(commit);
  commit->add_flag("--fsync", o.fsync, "fsync each file before close");

  auto* read = app.add_subcommand("read", "Read the files made by commit");
  dir(read);
  files(read);
  size(read);
  per_dir(read);
  seed(read);
  read->add_option("--block", o.block, "Bytes per read");

  auto* list = app.add_subcommand("list", "List a directory");
  dir(list);
  list->add_option("--files", o.files, "Expected entries (0: any)");
  list->add_flag("--stat", o.stat, "Also stat every entry (like ls -l)");

  auto* statlat =
      app.add_subcommand("statlat", "Stat latency of trees, interleaved");
  statlat
      ->add_option("tree", o.trees,
                   "DIR:NDIRS, a tree of NDIRS directories dNNNN of --files "
                   "files (0: files in DIR)")
      ->required();
  files(statlat);
  seed(statlat);
  statlat->add_option("--samples", o.samples, "Files to stat per tree");

  auto* exec = app.add_subcommand("exec", "Time a command run in <dir>");
  dir(exec);
  exec->add_option("cmd", o.argv, "Command and arguments (after --)")
      ->required();

  auto* api_commit = app.add_subcommand(
      "api-commit", "Commit files through the StoreBackend API (no FUSE)");
  db(api_commit);
  files(api_commit);
  size(api_commit);
  per_dir(api_commit);
  seed(api_commit);
  api_commit->add_option("dir", o.dir, "Store directory, e.g. /memories/...")
      ->required();
  api_commit->add_option("--token-file", o.token_file, "The user's token")
      ->required();
  api_commit->add_option("--sync", o.sync, "Commit durability: full, normal");

  auto* api_stat = app.add_subcommand(
      "api-statlat", "Stat latency through the StoreBackend API (no FUSE)");
  db(api_stat);
  files(api_stat);
  seed(api_stat);
  api_stat->add_option("--token-file", o.token_file, "The user's token")
      ->required();
  api_stat->add_option("--under", o.under,
                       "Directory under /memories/users/<user>");
  api_stat->add_option("--dirs", o.dirs, "Directories of the tree (0: flat)");
  api_stat->add_option("--samples", o.samples, "Files to stat");

  auto* sq_commit = app.add_subcommand(
      "sqlite-commit", "Raw SQLite: one INSERT + COMMIT per file");
  db(sq_commit);
  files(sq_commit);
  size(sq_commit);
  per_dir(sq_commit);
  seed(sq_commit);
  table(sq_commit);
  sq_commit->add_option("--sync", o.sync, "PRAGMA synchronous (full, normal)");

  auto* sq_fill =
      app.add_subcommand("sqlite-fill", "Raw SQLite: rows in one transaction");
  db(sq_fill);
  files(sq_fill);
  size(sq_fill);
  per_dir(sq_fill);
  seed(sq_fill);
  table(sq_fill);

  auto* sq_read = app.add_subcommand("sqlite-read", "Raw SQLite: read blobs");
  db(sq_read);
  files(sq_read);
  size(sq_read);
  per_dir(sq_read);
  seed(sq_read);
  table(sq_read);
  sq_read->add_option("--block", o.block, "Bytes per sqlite3_blob_read");

  auto* sq_list =
      app.add_subcommand("sqlite-list", "Raw SQLite: SELECT every name");
  db(sq_list);
  table(sq_list);
  sq_list->add_option("--files", o.files, "Expected rows (0: any)");

  auto* pg_commit = app.add_subcommand(
      "pg-commit", "Raw PostgreSQL: one INSERT + COMMIT per file");
  db(pg_commit);
  files(pg_commit);
  size(pg_commit);
  per_dir(pg_commit);
  seed(pg_commit);
  table(pg_commit);
  pg_commit->add_option("--sync", o.sync,
                        "full (synchronous_commit on) or normal (off)");

  auto* pg_fill = app.add_subcommand("pg-fill",
                                     "Raw PostgreSQL: rows in one transaction");
  db(pg_fill);
  files(pg_fill);
  size(pg_fill);
  per_dir(pg_fill);
  seed(pg_fill);
  table(pg_fill);

  auto* pg_read = app.add_subcommand("pg-read", "Raw PostgreSQL: read rows");
  db(pg_read);
  files(pg_read);
  size(pg_read);
  per_dir(pg_read);
  seed(pg_read);
  table(pg_read);

  CLI11_PARSE(app, argc, argv);
  if (o.block == 0) Die("--block must be positive");
  o.op = app.get_subcommands().front()->get_name();
  if (o.op == "setup") {
    Setup(o);
  } else if (o.op == "populate") {
    Populate(o);
  } else if (o.op == "commit") {
    Commit(o);
  } else if (o.op == "read") {
    Read(o);
  } else if (o.op == "list") {
    List(o);
  } else if (o.op == "statlat") {
    StatLatency(o);
  } else if (o.op == "exec") {
    Exec(o);
  } else if (o.op == "api-commit") {
    ApiCommit(o);
  } else if (o.op == "api-statlat") {
    ApiStatLatency(o);
  } else if (o.op == "sqlite-commit") {
    SqliteCommit(o);
  } else if (o.op == "sqlite-fill") {
    SqliteFill(o);
  } else if (o.op == "sqlite-read") {
    SqliteRead(o);
  } else if (o.op == "sqlite-list") {
    SqliteList(o);
  } else if (o.op == "pg-commit") {
    PgCommit(o);
  } else if (o.op == "pg-fill") {
    PgFill(o);
  } else if (o.op == "pg-read") {
    PgRead(o);
  }
  return 0;
}
