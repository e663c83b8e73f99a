// Inode rows, directory entries and path walks (see namespace.h).
#include "backends/store/namespace.h"

#include <time.h>

#include <cstdlib>

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "vfs/path.h"

namespace agentvfs::store {

int64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

namespace {

struct timespec ToTimespec(int64_t ns) {
  struct timespec ts;
  ts.tv_sec = ns / 1'000'000'000;
  ts.tv_nsec = ns % 1'000'000'000;
  if (ts.tv_nsec < 0) {
    ts.tv_nsec += 1'000'000'000;
    ts.tv_sec -= 1;
  }
  return ts;
}

}  // namespace

vfs::Attr Inode::ToAttr() const {
  vfs::Attr st{};
  st.st_dev = kStoreDev;
  st.st_ino = static_cast<ino_t>(static_cast<uint64_t>(ino) | kStoreInoBit);
  st.st_mode = kind | (mode & 07777);
  st.st_nlink = static_cast<nlink_t>(nlink);
  st.st_uid = static_cast<uid_t>(uid);
  st.st_gid = static_cast<gid_t>(gid);
  st.st_size = size;
  st.st_blksize = 4096;
  st.st_blocks = (stored + 511) / 512;
  st.st_atim = ToTimespec(atime_ns);
  st.st_mtim = ToTimespec(mtime_ns);
  st.st_ctim = ToTimespec(ctime_ns);
  return st;
}

const char* const kInodeColumns =
    "i.ino, i.kind, i.mode, i.uid, i.gid, i.nlink, i.size, i.atime_ns, "
    "i.mtime_ns, i.ctime_ns, i.version, i.content, i.target, i.deleted_ns, "
    "i.blocks";

Inode InodeFromRow(const Row& r, size_t f) {
  Inode n;
  n.ino = AsInt(r[f + 0]);
  n.kind = static_cast<mode_t>(AsInt(r[f + 1]));
  n.mode = static_cast<mode_t>(AsInt(r[f + 2]));
  n.uid = AsInt(r[f + 3]);
  n.gid = AsInt(r[f + 4]);
  n.nlink = AsInt(r[f + 5]);
  n.size = AsInt(r[f + 6]);
  n.atime_ns = AsInt(r[f + 7]);
  n.mtime_ns = AsInt(r[f + 8]);
  n.ctime_ns = AsInt(r[f + 9]);
  n.version = AsInt(r[f + 10]);
  n.content = AsText(r[f + 11]);
  n.target = AsText(r[f + 12]);
  n.deleted = !IsNull(r[f + 13]);
  n.stored = AsInt(r[f + 14]);
  return n;
}

vfs::Result<std::optional<Inode>> LoadInode(Txn& txn, int64_t ino) {
  static const std::string sql =
      std::string("SELECT ") + kInodeColumns + " FROM inodes i WHERE i.ino = ?";
  auto rows = txn.Query(sql, {ino});
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) return std::optional<Inode>{};
  return std::optional<Inode>{InodeFromRow((*rows)[0])};
}

vfs::Result<std::optional<int64_t>> LookupName(Txn& txn, int64_t parent,
                                               std::string_view name) {
  auto rows =
      txn.Query("SELECT ino FROM dentries WHERE parent = ? AND name = ?",
                {parent, std::string(name)});
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) return std::optional<int64_t>{};
  return std::optional<int64_t>{AsInt((*rows)[0][0])};
}

namespace {

// Lookup joined with the inode row, one statement per component.
vfs::Result<std::optional<Inode>> LookupNode(Txn& txn, int64_t parent,
                                             std::string_view name) {
  static const std::string sql =
      std::string("SELECT ") + kInodeColumns +
      " FROM dentries d JOIN inodes i ON i.ino = d.ino"
      " WHERE d.parent = ? AND d.name = ?";
  auto rows = txn.Query(sql, {parent, std::string(name)});
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) return std::optional<Inode>{};
  return std::optional<Inode>{InodeFromRow((*rows)[0])};
}

// Directory entries already looked up in this walk: (parent, name) -> the
// inode, or nullopt when the name is known to be missing.
using LookupCache =
    std::map<std::pair<int64_t, std::string>, std::optional<Inode>>;

constexpr size_t kPrefetchMax = 32;

// Looks up the leading plain components of `comps` (up to the first "." or
// "..", at most kPrefetchMax) in one statement: a recursive walk from the
// root that follows entries while names match and stops at the first
// missing name or non-directory. Fills `cache` with every entry on the way
// (and the first missing name under a directory); returns the root.
// One round trip instead of one per component, which is what a walk costs
// on a database across a network. In-process engines skip it: there the
// recursive statement costs more than the plain lookups it replaces.
vfs::Result<std::optional<Inode>> Prefetch(Txn& txn,
                                           const std::vector<std::string>& comps,
                                           LookupCache& cache) {
  size_t n = 0;
  while (n < comps.size() && n < kPrefetchMax && comps[n] != "." &&
         comps[n] != "..") {
    ++n;
  }
  if (n == 0 || !txn.StatementsAreRoundTrips()) {
    return LoadInode(txn, kRootIno);
  }
  std::string sql = "WITH RECURSIVE comps(i, name) AS (VALUES ";
  std::vector<Value> params;
  for (size_t k = 0; k < n; ++k) {
    sql += (k ? ", (" : "(") + std::to_string(k + 1) + ", CAST(? AS TEXT))";
    params.emplace_back(comps[k]);
  }
  sql += "), walk(i, ino) AS (SELECT 0, CAST(" + std::to_string(kRootIno) +
         " AS BIGINT) UNION ALL SELECT c.i, d.ino FROM walk w "
         "JOIN comps c ON c.i = w.i + 1 "
         "JOIN dentries d ON d.parent = w.ino AND d.name = c.name) "
         "SELECT w.i, " +
         std::string(kInodeColumns) +
         " FROM walk w JOIN inodes i ON i.ino = w.ino ORDER BY w.i";
  auto rows = txn.Query(sql, params);
  if (!rows) return std::unexpected(rows.error());
  std::optional<Inode> root;
  std::optional<Inode> prev;
  for (const auto& r : *rows) {
    int64_t i = AsInt(r[0]);
    Inode node = InodeFromRow(r, 1);
    if (i == 0) {
      root = node;
    } else if (prev) {
      cache[{prev->ino, comps[static_cast<size_t>(i) - 1]}] = node;
    }
    prev = std::move(node);
  }
  size_t found = rows->empty() ? 0 : rows->size() - 1;
  if (prev && prev->IsDir() && found < n) {
    cache[{prev->ino, comps[found]}] = std::nullopt;
  }
  return root;
}

}  // namespace

namespace {

// A walk's use of the DirCache: the cache and the generation its
// transaction sees.
struct CacheUse {
  DirCache* cache;
  int64_t gen;
};

std::string JoinPath(const std::vector<std::string>& names, size_t n) {
  std::string p;
  for (size_t i = 0; i < n; ++i) p += "/" + names[i];
  return p;
}

vfs::Result<Walked> WalkWith(Txn& txn, const std::string& path,
                             bool follow_last, const CacheUse* cu,
                             const SearchCheck* may_search) {
  std::vector<std::string> first;
  for (size_t i = 0; i < path.size();) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) first.emplace_back(path.substr(i, j - i));
    i = j + 1;
  }
  // Pending components, consumed from the front; symlink targets are
  // spliced in place of the link.
  std::vector<std::string> todo = first;
  auto push_path = [&todo](std::string_view p, size_t at) {
    std::vector<std::string> parts;
    size_t i = 0;
    while (i < p.size()) {
      size_t j = p.find('/', i);
      if (j == std::string_view::npos) j = p.size();
      if (j > i) parts.emplace_back(p.substr(i, j - i));
      i = j + 1;
    }
    todo.insert(todo.begin() + static_cast<long>(at), parts.begin(),
                parts.end());
  };

  std::vector<Inode> stack;        // directories from the root down
  std::vector<std::string> names;  // names of stack[1..]
  size_t pos = 0;
  // Started at a cached directory: `stack` then holds only that directory,
  // so anything that needs the ones above it (a "." or "..", a symlink)
  // walks again from the root.
  bool from_cache = false;
  LookupCache lookups;
  if (cu != nullptr && first.size() >= 2) {
    bool plain = true;
    for (size_t i = 0; i + 1 < first.size(); ++i) {
      plain = plain && first[i] != "." && first[i] != "..";
    }
    auto ino =
        plain ? cu->cache->Ino(cu->gen, JoinPath(first, first.size() - 1))
              : std::nullopt;
    if (ino) {
      auto dir = LoadInode(txn, *ino);
      if (!dir) return std::unexpected(dir.error());
      if (*dir && (*dir)->IsDir()) {
        stack.push_back(std::move(**dir));
        names.assign(first.begin(), first.end() - 1);
        pos = first.size() - 1;
        from_cache = true;
      }
    }
  }
  if (!from_cache) {
    auto root = Prefetch(txn, first, lookups);
    if (!root) return std::unexpected(root.error());
    if (!*root) return vfs::Fail(EIO, "the store has no root directory");
    stack.push_back(std::move(**root));
  }
  auto walk_again = [&] {
    return WalkWith(txn, path, follow_last, nullptr, may_search);
  };
  // No symlink followed and no "." or "..": stack and names are the plain
  // resolution of the path so far, which the cache may keep.
  bool plain = true;
  auto remember = [&](const std::string& dir_path, int64_t ino) {
    if (cu != nullptr && plain && !dir_path.empty()) {
      cu->cache->Put(cu->gen, dir_path, ino);
    }
  };

  int links = 0;
  Walked out;
  out.node = stack.back();
  while (pos < todo.size()) {
    const std::string comp = todo[pos];
    bool last = pos + 1 == todo.size();
    Inode& dir = stack.back();
    if (comp == "." || comp == "..") {
      if (from_cache) return walk_again();
      plain = false;
      // As the kernel: `file/..` in a link's target is no way back up (a
      // skill's `x -> file/../d/up/../..` reached past its folder).
      if (!dir.IsDir()) return vfs::Fail(ENOTDIR, "not a directory");
    }
    if (comp == ".") {
      ++pos;
      if (last) out.node = dir;
      continue;
    }
    if (comp == "..") {
      if (stack.size() > 1) {
        stack.pop_back();
        names.pop_back();
      }
      ++pos;
      if (last) out.node = stack.back();
      continue;
    }
    if (!dir.IsDir()) return vfs::Fail(ENOTDIR, "not a directory");
    if (!plain && may_search != nullptr && names.size() > 0 &&
        !(*may_search)(JoinPath(names, names.size()))) {
      return vfs::Fail(ENOENT, "no such file or directory");
    }
    vfs::Result<std::optional<Inode>> child;
    if (auto hit = lookups.find({dir.ino, comp}); hit != lookups.end()) {
      child = hit->second;
    } else {
      child = LookupNode(txn, dir.ino, comp);
    }
    if (!child) return std::unexpected(child.error());
    if (!*child) {
      if (!last) return vfs::Fail(ENOENT, "no such file or directory");
      std::string dir_path = JoinPath(names, names.size());
      remember(dir_path, dir.ino);
      out.parent = dir;
      out.name = comp;
      out.node.reset();
      out.path = dir_path + "/" + comp;
      return out;
    }
    if ((*child)->IsLink() && (!last || follow_last)) {
      if (from_cache) return walk_again();
      plain = false;
      if (++links > 40) return vfs::Fail(ELOOP, "too many symlinks");
      const std::string& target = (*child)->target;
      todo.erase(todo.begin() + static_cast<long>(pos));
      if (!target.empty() && target[0] == '/') {
        // Absolute targets name store paths (the view shows the store at
        // the same paths); anything else leaves the store.
        if (!target.starts_with("/memories") &&
            !target.starts_with("/skills")) {
          return vfs::Fail(EACCES, "symlink " + comp + " -> " + target +
                                       " leads out of the store");
        }
        stack.resize(1);
        names.clear();
      }
      push_path(target, pos);
      if (pos >= todo.size()) {  // the link pointed at a directory on the stack
        out.node = stack.back();
        break;
      }
      continue;
    }
    if (last) {
      std::string dir_path = JoinPath(names, names.size());
      remember(dir_path, dir.ino);
      out.parent = dir;
      out.name = comp;
      out.node = std::move(*child);
      out.path = dir_path + "/" + comp;
      if (out.node->IsDir()) remember(out.path, out.node->ino);
      return out;
    }
    stack.push_back(std::move(**child));
    names.push_back(comp);
    ++pos;
  }
  // The walk ended on a directory of the stack (root, "." or "..").
  out.node = stack.back();
  if (stack.size() > 1) {
    out.parent = stack[stack.size() - 2];
    out.name = names.back();
  }
  std::string p = JoinPath(names, names.size());
  out.path = p.empty() ? "/" : p;
  return out;
}

}  // namespace

void DirCache::ResetLocked(int64_t gen) {
  inos_.clear();
  paths_.clear();
  gen_ = gen;
}

bool DirCache::SyncLocked(int64_t gen) {
  if (gen < gen_) return false;
  if (gen > gen_ || inos_.size() >= kMaxEntries) ResetLocked(gen);
  return true;
}

std::optional<int64_t> DirCache::Ino(int64_t gen, const std::string& path) {
  std::lock_guard lock(mu_);
  if (gen != gen_) return std::nullopt;
  auto it = inos_.find(path);
  if (it == inos_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> DirCache::PathOf(int64_t gen, int64_t ino) {
  std::lock_guard lock(mu_);
  if (gen != gen_) return std::nullopt;
  auto it = paths_.find(ino);
  if (it == paths_.end()) return std::nullopt;
  return it->second;
}

void DirCache::Clear() {
  std::lock_guard lock(mu_);
  ResetLocked(-1);
}

void DirCache::Put(int64_t gen, const std::string& path, int64_t ino) {
  std::lock_guard lock(mu_);
  if (!SyncLocked(gen)) return;
  inos_[path] = ino;
  paths_[ino] = path;
}

vfs::Result<int64_t> DirGeneration(Txn& txn) {
  auto rows = txn.Query("SELECT value FROM meta WHERE key = 'dirgen'");
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) return int64_t{0};
  const std::string v = AsText((*rows)[0][0]);
  return static_cast<int64_t>(std::strtoll(v.c_str(), nullptr, 10));
}

vfs::Result<Walked> Walk(Txn& txn, const std::string& path, bool follow_last,
                         const SearchCheck* may_search) {
  DirCache* cache = txn.dir_cache();
  if (cache == nullptr)
    return WalkWith(txn, path, follow_last, nullptr, may_search);
  auto gen = DirGeneration(txn);
  if (!gen) return std::unexpected(gen.error());
  CacheUse cu{cache, *gen};
  return WalkWith(txn, path, follow_last, &cu, may_search);
}

vfs::Result<Inode> CreateNode(Txn& txn, const Inode& parent,
                              std::string_view name, mode_t kind, mode_t mode,
                              int64_t uid, int64_t gid,
                              const std::string& target, int64_t now_ns) {
  // setgid directories pass their group (and, to directories, the bit) on.
  if (parent.mode & S_ISGID) {
    gid = parent.gid;
    if (kind == S_IFDIR) mode |= S_ISGID;
  }
  int64_t nlink = kind == S_IFDIR ? 2 : 1;
  int64_t size = kind == S_IFLNK ? static_cast<int64_t>(target.size()) : 0;
  auto rows = txn.Query(
      "INSERT INTO inodes(kind, mode, uid, gid, nlink, size, atime_ns, "
      "mtime_ns, ctime_ns, target) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
      "RETURNING ino",
      {int64_t{kind}, int64_t{mode & 07777}, uid, gid, nlink, size, now_ns,
       now_ns, now_ns,
       kind == S_IFLNK ? Value{target} : Value{std::monostate{}}});
  if (!rows) return std::unexpected(rows.error());
  int64_t ino = AsInt((*rows)[0][0]);
  auto added =
      txn.Exec("INSERT INTO dentries(parent, name, ino) VALUES(?, ?, ?)",
               {parent.ino, std::string(name), ino});
  if (!added) return std::unexpected(added.error());
  auto touched = txn.Exec(
      "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ? "
      "WHERE ino = ?",
      {now_ns, now_ns, int64_t{kind == S_IFDIR ? 1 : 0}, parent.ino});
  if (!touched) return std::unexpected(touched.error());
  Inode n;
  n.ino = ino;
  n.kind = kind;
  n.mode = mode & 07777;
  n.uid = uid;
  n.gid = gid;
  n.nlink = nlink;
  n.size = size;
  n.atime_ns = n.mtime_ns = n.ctime_ns = now_ns;
  n.target = kind == S_IFLNK ? target : "";
  return n;
}

vfs::Status MarkCompactionPending(Txn& txn, bool pending) {
  auto r = pending ? txn.Exec(
                         "INSERT INTO meta(key, value) VALUES("
                         "'compaction_pending', '1') ON CONFLICT(key) DO "
                         "NOTHING")
                   : txn.Exec(
                         "DELETE FROM meta WHERE key = "
                         "'compaction_pending'");
  if (!r) return std::unexpected(r.error());
  return {};
}

vfs::Status TouchDir(Txn& txn, int64_t dir, int64_t now_ns) {
  auto ok =
      txn.Exec("UPDATE inodes SET mtime_ns = ?, ctime_ns = ? WHERE ino = ?",
               {now_ns, now_ns, dir});
  if (!ok) return std::unexpected(ok.error());
  return {};
}

vfs::Status RecordChange(Txn& txn, const std::string& path,
                         const std::string& session, int64_t now_ns,
                         const std::string& origin) {
  auto ok = txn.Exec(
      "INSERT INTO changes(path, session, origin, time_ns) VALUES(?, ?, ?, ?)",
      {path, session, origin, now_ns});
  if (!ok) return std::unexpected(ok.error());
  return {};
}

namespace {

// DirPath one entry at a time, for engines where a statement is cheap.
vfs::Result<std::string> DirPathStepwise(Txn& txn, int64_t dir,
                                         int max_depth) {
  std::vector<std::string> names;  // from `dir` up
  for (int depth = 0; dir != kRootIno; ++depth) {
    if (depth >= max_depth) {
      return vfs::Fail(EIO, "directory loop in the store");
    }
    auto rows = txn.Query(
        "SELECT parent, name FROM dentries WHERE ino = ? LIMIT 2", {dir});
    if (!rows) return std::unexpected(rows.error());
    if (rows->empty()) return std::string();  // an orphan
    if (rows->size() > 1) {
      return vfs::Fail(EIO, "a directory has more than one name in the store");
    }
    names.push_back(AsText((*rows)[0][1]));
    dir = AsInt((*rows)[0][0]);
  }
  std::string path;
  for (auto it = names.rbegin(); it != names.rend(); ++it) path += "/" + *it;
  return path;
}

vfs::Result<std::string> DirPathUncached(Txn& txn, int64_t dir) {
  // A directory has one entry; its ancestors, from `dir` up to a child of
  // the root, in one statement (one round trip on a networked database).
  constexpr int kMaxDepth = 4096;
  if (!txn.StatementsAreRoundTrips()) return DirPathStepwise(txn, dir, kMaxDepth);
  auto rows = txn.Query(
      "WITH RECURSIVE up(depth, parent, name) AS ("
      "SELECT 0, parent, name FROM dentries WHERE ino = ? "
      "UNION ALL SELECT u.depth + 1, d.parent, d.name FROM up u "
      "JOIN dentries d ON d.ino = u.parent "
      "WHERE u.parent != " +
          std::to_string(kRootIno) + " AND u.depth <= " +
          std::to_string(kMaxDepth) +
          ") SELECT depth, parent, name FROM up ORDER BY depth",
      {dir});
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) return std::string();
  if (rows->size() > kMaxDepth) {
    return vfs::Fail(EIO, "directory loop in the store");
  }
  for (size_t i = 0; i < rows->size(); ++i) {
    if (AsInt((*rows)[i][0]) != static_cast<int64_t>(i)) {
      return vfs::Fail(EIO, "a directory has more than one name in the store");
    }
  }
  // Not under the root: an orphan (its parent was removed).
  if (AsInt(rows->back()[1]) != kRootIno) return std::string();
  std::string path;
  for (const auto& r : *rows) path = "/" + AsText(r[2]) + path;
  return path;
}

}  // namespace

vfs::Result<std::string> DirPath(Txn& txn, int64_t dir) {
  if (dir == kRootIno) return std::string("/");
  if (DirCache* cache = txn.dir_cache()) {
    auto gen = DirGeneration(txn);
    if (!gen) return std::unexpected(gen.error());
    if (auto hit = cache->PathOf(*gen, dir)) return *hit;
    auto path = DirPathUncached(txn, dir);
    if (path && !path->empty()) cache->Put(*gen, *path, dir);
    return path;
  }
  return DirPathUncached(txn, dir);
}


vfs::Result<std::string> AnyPath(Txn& txn, int64_t ino) {
  if (ino == kRootIno) return std::string("/");
  auto rows = txn.Query(
      "SELECT parent, name FROM dentries WHERE ino = ? LIMIT 1", {ino});
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) return std::string();
  auto dir = DirPath(txn, AsInt((*rows)[0][0]));
  if (!dir) return dir;
  if (dir->empty()) return std::string();
  return (*dir == "/" ? "" : *dir) + "/" + AsText((*rows)[0][1]);
}

}  // namespace agentvfs::store
