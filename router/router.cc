// The mount table: resolution of a namespace path to (backend, inner path)
// and the synthesised read-only directories above the mounts.
#include "router/router.h"

#include <algorithm>
#include <set>

namespace agentvfs::router {

using vfs::Attr;
using vfs::Caller;
using vfs::Fail;
using vfs::Path;
using vfs::Result;
using vfs::Status;

namespace {

std::string Quote(const Path& p) { return "'" + p.str() + "'"; }

// Stable inode numbers for synthesised directories, in a range (top bit set)
// that host filesystems do not hand out, so tools that compare (dev, ino)
// never mistake one for a backend's file.
uint64_t SyntheticIno(const Path& p) {
  constexpr uint64_t kBase = 1ull << 63;
  if (p.IsRoot()) return kBase | 1;
  return kBase | (2 + std::hash<std::string>{}(p.str()) % (1ull << 40));
}

}  // namespace

// Receives one backend's change feed and passes it on in view paths. Reads
// mounts_ without a lock: the table is fixed before the router is shared.
class Router::ChangeAdapter final : public vfs::ChangeListener {
 public:
  ChangeAdapter(const Router& router, vfs::Backend* backend,
                vfs::ChangeListener* to)
      : router_(router), backend_(backend), to_(to) {}

  vfs::Backend* backend() const { return backend_; }

  void Changed(const Path& path) override {
    for (const auto& m : router_.mounts_) {
      if (m.backend != backend_) continue;
      Path view;
      if (m.options.strip_prefix) {
        view = m.prefix.Join(path);
      } else if (path.HasPrefix(m.prefix)) {
        view = path;
      } else {
        continue;  // the backend's path is not visible through this mount
      }
      // A nested mount hides this name; the path is visible through at
      // most one mount, which also keeps a path from being sent twice.
      if (router_.OwnerOf(view) != &m) continue;
      to_->Changed(view);
    }
  }

 private:
  const Router& router_;
  vfs::Backend* const backend_;
  vfs::ChangeListener* const to_;
};

Router::Router() = default;
Router::~Router() { SetChangeListener(nullptr); }

vfs::Backend* Router::Adopt(std::unique_ptr<vfs::Backend> backend) {
  owned_.push_back(std::move(backend));
  return owned_.back().get();
}

Status Router::Mount(const std::string& prefix, vfs::Backend* backend,
                     MountOptions options) {
  auto path = Path::Parse(prefix);
  // Parse says ENOENT for "" (as lookups must); as a mount prefix it is
  // simply invalid, which router.h documents as EINVAL.
  if (!path)
    return Fail(EINVAL, "invalid mount prefix: " + path.error().message);
  if (path->IsRoot())
    return Fail(EINVAL, "cannot mount at '/': the root lists the mounts");
  if (backend == nullptr) return Fail(EINVAL, "no backend to mount");
  for (const auto& m : mounts_)
    if (m.prefix == *path)
      return Fail(EEXIST, Quote(*path) + " is already mounted");
  mounts_.push_back(MountEntry{*path, backend, options});
  std::stable_sort(mounts_.begin(), mounts_.end(),
                   [](const auto& a, const auto& b) {
                     return a.prefix.str().size() > b.prefix.str().size();
                   });
  return {};
}

std::vector<Path> Router::MountPoints() const {
  std::vector<Path> out;
  for (const auto& m : mounts_) out.push_back(m.prefix);
  std::sort(out.begin(), out.end());
  return out;
}

void Router::SetChangeListener(vfs::ChangeListener* listener) {
  std::lock_guard lock(listener_mu_);
  // Every backend stops first: only once SetChangeListener(nullptr) has
  // returned may an adapter it was calling be destroyed.
  for (const auto& a : adapters_) a->backend()->SetChangeListener(nullptr);
  adapters_.clear();
  if (listener == nullptr) return;
  for (const auto& m : mounts_) {
    const bool seen =
        std::any_of(adapters_.begin(), adapters_.end(),
                    [&](const auto& a) { return a->backend() == m.backend; });
    if (seen) continue;
    adapters_.push_back(
        std::make_unique<ChangeAdapter>(*this, m.backend, listener));
    m.backend->SetChangeListener(adapters_.back().get());
  }
}

bool Router::IsSynthetic(const Path& path) const {
  // A proper ancestor of some mount point that no mount owns.
  for (const auto& m : mounts_)
    if (m.prefix.HasPrefix(path) && !(m.prefix == path)) return true;
  return false;
}

const Router::MountEntry* Router::OwnerOf(const Path& path) const {
  // mounts_ is sorted longest prefix first, so the first match is the owner.
  for (const auto& m : mounts_)
    if (path.HasPrefix(m.prefix)) return &m;
  return nullptr;
}

Result<Router::Target> Router::Resolve(const Path& path, Access access) const {
  if (const MountEntry* owner = OwnerOf(path); owner != nullptr) {
    const MountEntry& m = *owner;
    if (access == Access::kWrite && m.options.read_only)
      return Fail(EROFS, Quote(m.prefix) + " is mounted read-only");
    Target t;
    t.mount = &m;
    t.inner = m.options.strip_prefix ? path.StripPrefix(m.prefix) : path;
    t.is_mount_point = (path == m.prefix);
    return t;
  }
  if (IsSynthetic(path)) return Target{};
  return Fail(ENOENT, "no such file or directory: " + Quote(path) +
                          " (the top level holds only the mounts)");
}

Result<Router::Target> Router::ResolveForCreate(const Path& path) const {
  auto t = Resolve(path, Access::kWrite);
  if (!t) {
    // Creating a new name in a synthesised directory: refused, not ENOENT.
    if (t.error().code == ENOENT && IsSynthetic(path.Parent()))
      return Fail(EACCES,
                  "cannot create " + Quote(path) +
                      ": the top level is read-only; write inside a mount "
                      "such as /workspace");
    return t;
  }
  if (t->mount == nullptr || t->is_mount_point)
    return Fail(EEXIST, Quote(path) + " already exists (it is a mount point)");
  return t;
}

Result<Router::Target> Router::ResolveForChange(const Path& path) const {
  auto t = Resolve(path, Access::kWrite);
  if (t && t->mount == nullptr)
    return Fail(EACCES, "the top level is read-only");
  return t;
}

Result<Router::Target> Router::ResolveForRemove(const Path& path) const {
  auto t = Resolve(path, Access::kWrite);
  if (!t) return t;
  if (t->mount == nullptr)
    return Fail(EACCES, "cannot change " + Quote(path) +
                            ": the top level is read-only");
  if (t->is_mount_point)
    return Fail(
        EBUSY,
        Quote(path) + " is a mount point and cannot be removed or renamed");
  return t;
}

Result<Attr> Router::SyntheticStat(const Path& path) const {
  Attr st{};
  st.st_mode = S_IFDIR | 0555;
  st.st_nlink = 2;
  st.st_uid = 0;
  st.st_gid = 0;
  st.st_blksize = 4096;
  st.st_ino = SyntheticIno(path);
  return st;
}

std::vector<vfs::DirEntry> Router::SyntheticList(const Path& path) const {
  std::set<std::string> names;
  const size_t depth = path.Components().size();
  for (const auto& m : mounts_) {
    if (!m.prefix.HasPrefix(path) || m.prefix == path) continue;
    names.insert(std::string(m.prefix.Components()[depth]));
  }
  std::vector<vfs::DirEntry> out;
  for (const auto& n : names) {
    auto child = path.Child(n);
    out.push_back(vfs::DirEntry{n, child ? SyntheticIno(*child) : 0, S_IFDIR});
  }
  return out;
}

Result<Attr> Router::Stat(const Caller& c, const Path& path) {
  auto t = Resolve(path, Access::kRead);
  if (!t) return std::unexpected(t.error());
  if (t->mount == nullptr) return SyntheticStat(path);
  return t->mount->backend->Stat(c, t->inner);
}

Result<std::vector<vfs::DirEntry>> Router::ReadDir(const Caller& c,
                                                   const Path& path) {
  auto t = Resolve(path, Access::kRead);
  if (!t) return std::unexpected(t.error());
  if (t->mount == nullptr) return SyntheticList(path);
  auto entries = t->mount->backend->ReadDir(c, t->inner);
  if (!entries) return entries;
  // A mount nested inside another mount hides the backend's entry of that
  // name and appears as a directory.
  for (const auto& m : mounts_) {
    if (m.prefix == path || !m.prefix.HasPrefix(path)) continue;
    if (m.prefix.Parent() != path) continue;
    std::string name(m.prefix.Name());
    auto it = std::find_if(entries->begin(), entries->end(),
                           [&](const auto& e) { return e.name == name; });
    if (it == entries->end())
      entries->push_back(vfs::DirEntry{name, 0, S_IFDIR});
    else
      it->type = S_IFDIR;
  }
  return entries;
}

Result<std::unique_ptr<vfs::FileHandle>> Router::Open(const Caller& c,
                                                      const Path& path,
                                                      int flags, mode_t mode) {
  const bool writes =
      (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC));
  if (writes && (flags & O_ACCMODE) == O_RDONLY && !(flags & O_TRUNC)) {
    // Only O_CREAT writes. On a read-only mount, as on a read-only
    // filesystem, that opens an existing file; EROFS is for creating one.
    if (const MountEntry* m = OwnerOf(path); m && m->options.read_only)
      return OpenExistingReadOnly(c, path, flags);
  }
  auto t = Resolve(path, writes ? Access::kWrite : Access::kRead);
  if (!t) {
    if (t.error().code == ENOENT && (flags & O_CREAT) &&
        IsSynthetic(path.Parent()))
      return Fail(EACCES,
                  "cannot create " + Quote(path) +
                      ": the top level is read-only; write inside a mount "
                      "such as /workspace");
    return std::unexpected(t.error());
  }
  if (t->mount == nullptr) {
    if ((flags & O_CREAT) && (flags & O_EXCL))
      return Fail(EEXIST, Quote(path) + " already exists");
    return Fail(EISDIR, Quote(path) + " is a directory");
  }
  return t->mount->backend->Open(c, t->inner, flags, mode);
}

Result<std::unique_ptr<vfs::FileHandle>> Router::OpenExistingReadOnly(
    const Caller& c, const Path& path, int flags) {
  auto t = Resolve(path, Access::kRead);
  if (!t) return std::unexpected(t.error());
  vfs::Backend& b = *t->mount->backend;
  auto would_create = [&] {
    return Fail(EROFS, "cannot create " + Quote(path) + ": " +
                           Quote(t->mount->prefix) + " is mounted read-only");
  };
  auto st = b.Stat(c, t->inner);  // the name itself, as O_EXCL looks at it
  if (!st) {
    if (st.error().code != ENOENT) return std::unexpected(st.error());
    // Missing: EROFS if it could be created there, else why not.
    auto dir = b.Stat(c, t->inner.Parent());
    if (!dir) return std::unexpected(dir.error());
    // (A symlink there most likely leads to a directory: EROFS, as Linux.)
    if (!S_ISDIR(dir->st_mode) && !S_ISLNK(dir->st_mode))
      return Fail(ENOTDIR, Quote(path.Parent()) + " is not a directory");
    return would_create();
  }
  if (flags & O_EXCL) return Fail(EEXIST, Quote(path) + " already exists");
  if (t->is_mount_point || S_ISDIR(st->st_mode))
    return Fail(EISDIR, Quote(path) + " is a directory");
  auto h = b.Open(c, t->inner, flags & ~(O_CREAT | O_EXCL), 0);
  if (!h) {
    // A dangling symlink: opening it with O_CREAT would create its target.
    if (h.error().code == ENOENT) return would_create();
    return h;
  }
  auto opened = (*h)->Stat();
  if (opened && S_ISDIR(opened->st_mode))
    return Fail(EISDIR, Quote(path) + " leads to a directory");
  return h;
}

Status Router::Mkdir(const Caller& c, const Path& path, mode_t mode) {
  auto t = ResolveForCreate(path);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->Mkdir(c, t->inner, mode);
}

Status Router::Mknod(const Caller& c, const Path& path, mode_t mode,
                     dev_t rdev) {
  auto t = ResolveForCreate(path);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->Mknod(c, t->inner, mode, rdev);
}

Status Router::Symlink(const Caller& c, const std::string& target,
                       const Path& link) {
  auto t = ResolveForCreate(link);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->Symlink(c, target, t->inner);
}

Status Router::Unlink(const Caller& c, const Path& path) {
  auto t = ResolveForRemove(path);
  if (!t) {
    if (t.error().code == EBUSY || t.error().code == EACCES) {
      // unlink(2) of a directory says EISDIR before anything else.
      if (auto r = Resolve(path, Access::kRead);
          r && (r->mount == nullptr || r->is_mount_point))
        return Fail(EISDIR, Quote(path) + " is a directory");
    }
    return std::unexpected(t.error());
  }
  return t->mount->backend->Unlink(c, t->inner);
}

Status Router::Rmdir(const Caller& c, const Path& path) {
  auto t = ResolveForRemove(path);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->Rmdir(c, t->inner);
}

Result<std::string> Router::Readlink(const Caller& c, const Path& path) {
  auto t = Resolve(path, Access::kRead);
  if (!t) return std::unexpected(t.error());
  if (t->mount == nullptr)
    return Fail(EINVAL, Quote(path) + " is not a symlink");
  return t->mount->backend->Readlink(c, t->inner);
}

Status Router::Link(const Caller& c, const Path& from, const Path& to) {
  auto src = Resolve(from, Access::kWrite);
  if (!src) return std::unexpected(src.error());
  if (src->mount == nullptr || src->is_mount_point)
    return Fail(
        EPERM,
        Quote(from) + " is a directory; directories cannot be hard-linked");
  auto dst = ResolveForCreate(to);
  if (!dst) return std::unexpected(dst.error());
  if (src->mount != dst->mount)
    return Fail(EXDEV, "cannot link across mounts (" +
                           src->mount->prefix.str() + " and " +
                           dst->mount->prefix.str() +
                           "); copy the file instead");
  return src->mount->backend->Link(c, src->inner, dst->inner);
}

Status Router::Rename(const Caller& c, const Path& from, const Path& to,
                      unsigned flags) {
  auto src = ResolveForRemove(from);
  if (!src) return std::unexpected(src.error());
  auto dst = Resolve(to, Access::kWrite);
  if (!dst) {
    if (dst.error().code == ENOENT && IsSynthetic(to.Parent()))
      return Fail(EACCES,
                  "cannot rename into the top level, which is read-only");
    return std::unexpected(dst.error());
  }
  if (dst->mount == nullptr)
    return Fail(EACCES, "cannot rename onto " + Quote(to) +
                            ": the top level is read-only");
  if (dst->is_mount_point)
    return Fail(EBUSY, Quote(to) + " is a mount point and cannot be replaced");
  if (src->mount != dst->mount)
    return Fail(EXDEV, "cannot move across mounts (" +
                           src->mount->prefix.str() + " and " +
                           dst->mount->prefix.str() +
                           "); copy then delete instead");
  return src->mount->backend->Rename(c, src->inner, dst->inner, flags);
}

Status Router::Chmod(const Caller& c, const Path& path, mode_t mode) {
  auto t = ResolveForChange(path);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->Chmod(c, t->inner, mode);
}

Status Router::Chown(const Caller& c, const Path& path, uid_t uid, gid_t gid) {
  auto t = ResolveForChange(path);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->Chown(c, t->inner, uid, gid);
}

Status Router::Utimens(const Caller& c, const Path& path,
                       const struct timespec times[2]) {
  auto t = ResolveForChange(path);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->Utimens(c, t->inner, times);
}

Status Router::Truncate(const Caller& c, const Path& path, off_t size) {
  auto t = Resolve(path, Access::kWrite);
  if (!t) return std::unexpected(t.error());
  if (t->mount == nullptr) return Fail(EISDIR, Quote(path) + " is a directory");
  return t->mount->backend->Truncate(c, t->inner, size);
}

Result<struct statvfs> Router::StatFs(const Caller& c, const Path& path) {
  auto t = Resolve(path, Access::kRead);
  if (!t) return std::unexpected(t.error());
  if (t->mount == nullptr) {
    // The root reports the first mount's filesystem, so `df` on the view works.
    if (mounts_.empty()) return Fail(ENOENT, "nothing is mounted");
    const auto& m = mounts_.back();
    return m.backend->StatFs(c, m.options.strip_prefix ? Path() : m.prefix);
  }
  return t->mount->backend->StatFs(c, t->inner);
}

Result<std::string> Router::GetXattr(const Caller& c, const Path& path,
                                     const std::string& name) {
  auto t = Resolve(path, Access::kRead);
  if (!t) return std::unexpected(t.error());
  if (t->mount == nullptr) return Fail(ENODATA, "no such attribute");
  return t->mount->backend->GetXattr(c, t->inner, name);
}

Status Router::SetXattr(const Caller& c, const Path& path,
                        const std::string& name, const std::string& value,
                        int flags) {
  auto t = ResolveForChange(path);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->SetXattr(c, t->inner, name, value, flags);
}

Result<std::vector<std::string>> Router::ListXattr(const Caller& c,
                                                   const Path& path) {
  auto t = Resolve(path, Access::kRead);
  if (!t) return std::unexpected(t.error());
  if (t->mount == nullptr) return std::vector<std::string>{};
  return t->mount->backend->ListXattr(c, t->inner);
}

Status Router::RemoveXattr(const Caller& c, const Path& path,
                           const std::string& name) {
  auto t = ResolveForChange(path);
  if (!t) return std::unexpected(t.error());
  return t->mount->backend->RemoveXattr(c, t->inner, name);
}

}  // namespace agentvfs::router
