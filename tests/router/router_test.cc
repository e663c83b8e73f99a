// Tests for the Router: which backend receives which inner path, the
// synthesised read-only directories above the mounts, and the checks the
// router makes once for every backend (EXDEV across mounts, EBUSY on mount
// points, EACCES in the top level, EROFS on read-only mounts).
//
// The backends are a small in-memory fake that records every call: these
// tests are about routing, and a fake makes "which backend saw which path"
// directly observable. Storage semantics are the conformance suite's job.
#include "router/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/result_matchers.h"

namespace agentvfs::router {
namespace {

using vfs::Attr;
using vfs::Caller;
using vfs::DirEntry;
using vfs::Fail;
using vfs::Path;
using vfs::Result;
using vfs::Status;

Path P(std::string_view text) {
  auto p = Path::Parse(text);
  EXPECT_TRUE(p.has_value())
      << "Parse(\"" << text << "\") failed: " << p.error().ToString();
  return p.value_or(Path());
}

class FakeHandle final : public vfs::FileHandle {
 public:
  explicit FakeHandle(std::string content) : content_(std::move(content)) {}
  Result<size_t> Read(void* buf, size_t size, off_t offset) override {
    if (static_cast<size_t>(offset) >= content_.size()) return 0;
    size_t n = std::min(size, content_.size() - offset);
    std::copy_n(content_.data() + offset, n, static_cast<char*>(buf));
    return n;
  }
  Result<size_t> Write(const void*, size_t size, off_t) override {
    return size;
  }
  Result<Attr> Stat() override { return Attr{}; }
  Status Truncate(off_t) override { return {}; }
  Status Sync(bool) override { return {}; }

 private:
  std::string content_;
};

// A map of path -> node that answers every Backend call and records it as
// "Op /inner/path" (two paths for Link and Rename).
class FakeBackend final : public vfs::Backend {
 public:
  explicit FakeBackend(unsigned long id) : id_(id) {
    nodes_["/"] = Node{S_IFDIR | 0755, ""};
  }

  void AddFile(const std::string& path, std::string content = "") {
    nodes_[path] = Node{S_IFREG | 0644, std::move(content)};
  }
  void AddDir(const std::string& path) {
    nodes_[path] = Node{S_IFDIR | 0755, ""};
  }
  bool Has(const std::string& path) const { return nodes_.count(path) > 0; }

  const std::vector<std::string>& calls() const { return calls_; }
  std::string LastCall() const {
    return calls_.empty() ? "<none>" : calls_.back();
  }
  void ClearCalls() { calls_.clear(); }
  unsigned long id() const { return id_; }

  // The change feed: remembers the one registered listener; Fire() reports a
  // change of `path` (in this backend's terms) to it, as a store would.
  void SetChangeListener(vfs::ChangeListener* listener) override {
    listener_ = listener;
    if (listener != nullptr) ++listener_registrations_;
  }
  bool HasListener() const { return listener_ != nullptr; }
  int listener_registrations() const { return listener_registrations_; }
  void Fire(std::string_view path) {
    if (listener_ != nullptr) listener_->Changed(P(path));
  }

  Result<Attr> Stat(const Caller&, const Path& path) override {
    Record("Stat", path);
    auto it = nodes_.find(path.str());
    if (it == nodes_.end()) return Fail(ENOENT, "fake: no " + path.str());
    Attr st{};
    st.st_mode = it->second.mode;
    st.st_size = static_cast<off_t>(it->second.content.size());
    st.st_dev = id_;
    return st;
  }
  Result<std::vector<DirEntry>> ReadDir(const Caller&,
                                        const Path& path) override {
    Record("ReadDir", path);
    auto it = nodes_.find(path.str());
    if (it == nodes_.end()) return Fail(ENOENT, "fake: no " + path.str());
    if (!S_ISDIR(it->second.mode)) return Fail(ENOTDIR, "fake: not a dir");
    std::vector<DirEntry> out;
    for (const auto& [p, node] : nodes_) {
      auto child = Path::Parse(p);
      if (!child || child->IsRoot() || child->Parent() != path) continue;
      out.push_back(
          DirEntry{std::string(child->Name()), 0, node.mode & S_IFMT});
    }
    return out;
  }
  Result<std::unique_ptr<vfs::FileHandle>> Open(const Caller&, const Path& path,
                                                int flags, mode_t) override {
    Record("Open", path);
    auto it = nodes_.find(path.str());
    if (it == nodes_.end()) {
      if (!(flags & O_CREAT)) return Fail(ENOENT, "fake: no " + path.str());
      AddFile(path.str());
      it = nodes_.find(path.str());
    }
    return std::make_unique<FakeHandle>(it->second.content);
  }
  Status Mkdir(const Caller&, const Path& path, mode_t) override {
    Record("Mkdir", path);
    AddDir(path.str());
    return {};
  }
  Status Mknod(const Caller&, const Path& path, mode_t, dev_t) override {
    Record("Mknod", path);
    AddFile(path.str());
    return {};
  }
  Status Unlink(const Caller&, const Path& path) override {
    Record("Unlink", path);
    return Erase(path);
  }
  Status Rmdir(const Caller&, const Path& path) override {
    Record("Rmdir", path);
    return Erase(path);
  }
  Status Symlink(const Caller&, const std::string& target,
                 const Path& link) override {
    Record("Symlink", link);
    nodes_[link.str()] = Node{S_IFLNK | 0777, target};
    return {};
  }
  Result<std::string> Readlink(const Caller&, const Path& path) override {
    Record("Readlink", path);
    auto it = nodes_.find(path.str());
    if (it == nodes_.end()) return Fail(ENOENT, "fake: no " + path.str());
    return it->second.content;
  }
  Status Link(const Caller&, const Path& from, const Path& to) override {
    Record("Link", from, to);
    auto it = nodes_.find(from.str());
    if (it == nodes_.end()) return Fail(ENOENT, "fake: no " + from.str());
    nodes_[to.str()] = it->second;
    return {};
  }
  Status Rename(const Caller&, const Path& from, const Path& to,
                unsigned) override {
    Record("Rename", from, to);
    auto it = nodes_.find(from.str());
    if (it == nodes_.end()) return Fail(ENOENT, "fake: no " + from.str());
    Node node = it->second;
    nodes_.erase(it);
    nodes_[to.str()] = node;
    return {};
  }
  Status Chmod(const Caller&, const Path& path, mode_t) override {
    Record("Chmod", path);
    return Exists(path);
  }
  Status Chown(const Caller&, const Path& path, uid_t, gid_t) override {
    Record("Chown", path);
    return Exists(path);
  }
  Status Utimens(const Caller&, const Path& path,
                 const struct timespec[2]) override {
    Record("Utimens", path);
    return Exists(path);
  }
  Status Truncate(const Caller&, const Path& path, off_t) override {
    Record("Truncate", path);
    return Exists(path);
  }
  Result<struct statvfs> StatFs(const Caller&, const Path& path) override {
    Record("StatFs", path);
    struct statvfs st {};
    st.f_bsize = 4096;
    st.f_fsid = id_;
    return st;
  }
  Result<std::string> GetXattr(const Caller&, const Path& path,
                               const std::string&) override {
    Record("GetXattr", path);
    if (auto ok = Exists(path); !ok) return std::unexpected(ok.error());
    return std::string("value");
  }
  Status SetXattr(const Caller&, const Path& path, const std::string&,
                  const std::string&, int) override {
    Record("SetXattr", path);
    return Exists(path);
  }
  Result<std::vector<std::string>> ListXattr(const Caller&,
                                             const Path& path) override {
    Record("ListXattr", path);
    if (auto ok = Exists(path); !ok) return std::unexpected(ok.error());
    return std::vector<std::string>{"user.x"};
  }
  Status RemoveXattr(const Caller&, const Path& path,
                     const std::string&) override {
    Record("RemoveXattr", path);
    return Exists(path);
  }

 private:
  struct Node {
    mode_t mode;
    std::string content;  // file data, or a symlink's target
  };

  void Record(const char* op, const Path& p) {
    calls_.push_back(std::string(op) + " " + p.str());
  }
  void Record(const char* op, const Path& a, const Path& b) {
    calls_.push_back(std::string(op) + " " + a.str() + " " + b.str());
  }
  Status Exists(const Path& p) const {
    if (!Has(p.str())) return Fail(ENOENT, "fake: no " + p.str());
    return {};
  }
  Status Erase(const Path& p) {
    if (nodes_.erase(p.str()) == 0) return Fail(ENOENT, "fake: no " + p.str());
    return {};
  }

  unsigned long id_;
  std::map<std::string, Node> nodes_;
  std::vector<std::string> calls_;
  vfs::ChangeListener* listener_ = nullptr;
  int listener_registrations_ = 0;  // non-null registrations
};

// Records the view paths a router forwards.
class RecordingListener final : public vfs::ChangeListener {
 public:
  void Changed(const Path& path) override { paths.push_back(path.str()); }
  std::vector<std::string> Take() { return std::exchange(paths, {}); }
  std::vector<std::string> paths;
};

std::set<std::string> Names(const std::vector<DirEntry>& entries) {
  std::set<std::string> out;
  for (const auto& e : entries) out.insert(e.name);
  return out;
}

std::string ReadAll(vfs::FileHandle& h) {
  char buf[256];
  auto n = h.Read(buf, sizeof buf, 0);
  if (!n) return "<error " + n.error().ToString() + ">";
  return std::string(buf, *n);
}

// A router with the standard layout: /workspace (strip_prefix), and one store
// serving /memories and /skills with full paths.
class RouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ws_ = Fake(1);
    store_ = Fake(2);
    ws_->AddFile("/a.txt", "workspace a");
    ws_->AddDir("/src");
    store_->AddDir("/memories");
    store_->AddDir("/skills");
    store_->AddFile("/memories/note.md", "a note");
    store_->AddFile("/skills/skill.md", "a skill");
    ASSERT_OK(router_.Mount("/workspace", ws_));
    ASSERT_OK(router_.Mount("/memories", store_, {.strip_prefix = false}));
    ASSERT_OK(router_.Mount("/skills", store_, {.strip_prefix = false}));
  }

  FakeBackend* Fake(unsigned long id) {
    auto fake = std::make_unique<FakeBackend>(id);
    FakeBackend* raw = fake.get();
    router_.Adopt(std::move(fake));
    return raw;
  }

  void ClearCalls() {
    ws_->ClearCalls();
    store_->ClearCalls();
  }
  bool NoBackendCalled() const {
    return ws_->calls().empty() && store_->calls().empty();
  }

  const Caller c_ = Caller::Local();
  Router router_;
  FakeBackend* ws_ = nullptr;
  FakeBackend* store_ = nullptr;
};

// --- Routing ---------------------------------------------------------------

TEST_F(RouterTest, StripPrefixGivesBackendPathsBelowTheMount) {
  ASSERT_OK_AND_ASSIGN(Attr st, router_.Stat(c_, P("/workspace/a.txt")));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_dev, 1u);
  EXPECT_EQ(ws_->LastCall(), "Stat /a.txt");

  ASSERT_OK(router_.Stat(c_, P("/workspace")));
  EXPECT_EQ(ws_->LastCall(), "Stat /");

  ASSERT_OK_AND_ASSIGN(auto h,
                       router_.Open(c_, P("/workspace/a.txt"), O_RDONLY, 0644));
  EXPECT_EQ(ReadAll(*h), "workspace a");
  EXPECT_EQ(ws_->LastCall(), "Open /a.txt");
  EXPECT_TRUE(store_->calls().empty());
}

TEST_F(RouterTest, KeptPrefixGivesBackendFullPaths) {
  ASSERT_OK_AND_ASSIGN(
      auto h, router_.Open(c_, P("/memories/note.md"), O_RDONLY, 0644));
  EXPECT_EQ(ReadAll(*h), "a note");
  EXPECT_EQ(store_->LastCall(), "Open /memories/note.md");

  ASSERT_OK(router_.Stat(c_, P("/skills")));
  EXPECT_EQ(store_->LastCall(), "Stat /skills");

  ASSERT_OK(router_.Mkdir(c_, P("/skills/new"), 0755));
  EXPECT_EQ(store_->LastCall(), "Mkdir /skills/new");
  EXPECT_TRUE(store_->Has("/skills/new"));
  EXPECT_TRUE(ws_->calls().empty());
}

TEST_F(RouterTest, EveryOperationIsRoutedWithTheInnerPath) {
  struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  ASSERT_OK(router_.ReadDir(c_, P("/workspace/src")));
  EXPECT_EQ(ws_->LastCall(), "ReadDir /src");
  ASSERT_OK(router_.Mkdir(c_, P("/workspace/src/d"), 0755));
  EXPECT_EQ(ws_->LastCall(), "Mkdir /src/d");
  ASSERT_OK(router_.Rmdir(c_, P("/workspace/src/d")));
  EXPECT_EQ(ws_->LastCall(), "Rmdir /src/d");
  ASSERT_OK(router_.Mknod(c_, P("/workspace/fifo"), S_IFIFO | 0644, 0));
  EXPECT_EQ(ws_->LastCall(), "Mknod /fifo");
  ASSERT_OK(router_.Symlink(c_, "a.txt", P("/workspace/ln")));
  EXPECT_EQ(ws_->LastCall(), "Symlink /ln");
  ASSERT_OK_AND_ASSIGN(std::string target,
                       router_.Readlink(c_, P("/workspace/ln")));
  EXPECT_EQ(target, "a.txt");
  EXPECT_EQ(ws_->LastCall(), "Readlink /ln");
  ASSERT_OK(router_.Chmod(c_, P("/workspace/a.txt"), 0600));
  EXPECT_EQ(ws_->LastCall(), "Chmod /a.txt");
  ASSERT_OK(router_.Chown(c_, P("/workspace/a.txt"), vfs::kKeepUid, 0));
  EXPECT_EQ(ws_->LastCall(), "Chown /a.txt");
  ASSERT_OK(router_.Utimens(c_, P("/workspace/a.txt"), times));
  EXPECT_EQ(ws_->LastCall(), "Utimens /a.txt");
  ASSERT_OK(router_.Truncate(c_, P("/workspace/a.txt"), 0));
  EXPECT_EQ(ws_->LastCall(), "Truncate /a.txt");
  ASSERT_OK(router_.SetXattr(c_, P("/workspace/a.txt"), "user.x", "v", 0));
  EXPECT_EQ(ws_->LastCall(), "SetXattr /a.txt");
  ASSERT_OK(router_.GetXattr(c_, P("/workspace/a.txt"), "user.x"));
  EXPECT_EQ(ws_->LastCall(), "GetXattr /a.txt");
  ASSERT_OK(router_.ListXattr(c_, P("/workspace/a.txt")));
  EXPECT_EQ(ws_->LastCall(), "ListXattr /a.txt");
  ASSERT_OK(router_.RemoveXattr(c_, P("/workspace/a.txt"), "user.x"));
  EXPECT_EQ(ws_->LastCall(), "RemoveXattr /a.txt");
  ASSERT_OK(router_.Link(c_, P("/workspace/a.txt"), P("/workspace/b.txt")));
  EXPECT_EQ(ws_->LastCall(), "Link /a.txt /b.txt");
  ASSERT_OK(
      router_.Rename(c_, P("/workspace/b.txt"), P("/workspace/c.txt"), 0));
  EXPECT_EQ(ws_->LastCall(), "Rename /b.txt /c.txt");
  ASSERT_OK(router_.Unlink(c_, P("/workspace/c.txt")));
  EXPECT_EQ(ws_->LastCall(), "Unlink /c.txt");
  ASSERT_OK(router_.StatFs(c_, P("/workspace/src")));
  EXPECT_EQ(ws_->LastCall(), "StatFs /src");
  EXPECT_TRUE(store_->calls().empty());
}

TEST_F(RouterTest, RenameWithinOneMountOfASharedBackendWorks) {
  ASSERT_OK(
      router_.Rename(c_, P("/memories/note.md"), P("/memories/old.md"), 0));
  EXPECT_EQ(store_->LastCall(), "Rename /memories/note.md /memories/old.md");
  EXPECT_TRUE(store_->Has("/memories/old.md"));
}

// Mounting order must not matter: the deepest mount owns its subtree.
class NestedMountTest : public ::testing::TestWithParam<bool> {};

TEST_P(NestedMountTest, LongestPrefixOnWholeComponentsWins) {
  Router router;
  auto* outer =
      static_cast<FakeBackend*>(router.Adopt(std::make_unique<FakeBackend>(1)));
  auto* inner =
      static_cast<FakeBackend*>(router.Adopt(std::make_unique<FakeBackend>(2)));
  outer->AddFile("/deeper");
  outer->AddFile("/x");
  outer->AddDir("/deep");  // hidden by the inner mount
  inner->AddFile("/x");
  if (GetParam()) {
    ASSERT_OK(router.Mount("/workspace", outer));
    ASSERT_OK(router.Mount("/workspace/deep", inner));
  } else {
    ASSERT_OK(router.Mount("/workspace/deep", inner));
    ASSERT_OK(router.Mount("/workspace", outer));
  }
  const Caller c = Caller::Local();

  ASSERT_OK_AND_ASSIGN(Attr st, router.Stat(c, P("/workspace/deep/x")));
  EXPECT_EQ(st.st_dev, 2u);
  EXPECT_EQ(inner->LastCall(), "Stat /x");

  ASSERT_OK(router.Stat(c, P("/workspace/deep")));
  EXPECT_EQ(inner->LastCall(), "Stat /");

  ASSERT_OK_AND_ASSIGN(st, router.Stat(c, P("/workspace/x")));
  EXPECT_EQ(st.st_dev, 1u);
  EXPECT_EQ(outer->LastCall(), "Stat /x");

  // "deeper" shares a string prefix with "deep" but is not below it.
  ASSERT_OK(router.Stat(c, P("/workspace/deeper")));
  EXPECT_EQ(outer->LastCall(), "Stat /deeper");
  EXPECT_EQ(inner->calls().size(), 2u);

  // Nor is /workspacefoo below /workspace.
  outer->ClearCalls();
  inner->ClearCalls();
  EXPECT_ERRNO(router.Stat(c, P("/workspacefoo")), ENOENT);
  EXPECT_ERRNO(router.Stat(c, P("/workspacefoo/x")), ENOENT);
  EXPECT_TRUE(outer->calls().empty());
  EXPECT_TRUE(inner->calls().empty());
}

TEST_P(NestedMountTest, OuterListingShowsTheNestedMountPoint) {
  Router router;
  auto* outer =
      static_cast<FakeBackend*>(router.Adopt(std::make_unique<FakeBackend>(1)));
  auto* inner =
      static_cast<FakeBackend*>(router.Adopt(std::make_unique<FakeBackend>(2)));
  outer->AddFile("/file");
  if (GetParam()) {
    ASSERT_OK(router.Mount("/workspace", outer));
    ASSERT_OK(router.Mount("/workspace/deep", inner));
  } else {
    ASSERT_OK(router.Mount("/workspace/deep", inner));
    ASSERT_OK(router.Mount("/workspace", outer));
  }
  const Caller c = Caller::Local();
  ASSERT_OK_AND_ASSIGN(auto entries, router.ReadDir(c, P("/workspace")));
  EXPECT_EQ(Names(entries), (std::set<std::string>{"file", "deep"}));
  for (const auto& e : entries) {
    if (e.name == "deep") {
      EXPECT_EQ(e.type, static_cast<mode_t>(S_IFDIR));
    }
  }
  // The root lists only the top component.
  ASSERT_OK_AND_ASSIGN(auto top, router.ReadDir(c, Path()));
  EXPECT_EQ(Names(top), (std::set<std::string>{"workspace"}));
}

INSTANTIATE_TEST_SUITE_P(MountOrder, NestedMountTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "OuterFirst" : "InnerFirst";
                         });

// --- Change feed -----------------------------------------------------------

using Paths = std::vector<std::string>;

TEST_F(RouterTest, ChangesOfAStrippedMountArriveUnderItsPrefix) {
  RecordingListener view;
  router_.SetChangeListener(&view);
  ws_->Fire("/src/a.cc");
  EXPECT_EQ(view.Take(), (Paths{"/workspace/src/a.cc"}));
  ws_->Fire("/");  // the backend's root is the mount point
  EXPECT_EQ(view.Take(), (Paths{"/workspace"}));
}

TEST_F(RouterTest, ChangesOfAFullPathMountArriveAsIsUnderItsPrefixesOnly) {
  RecordingListener view;
  router_.SetChangeListener(&view);
  // One store at /memories and /skills: registered once, each path once.
  EXPECT_EQ(store_->listener_registrations(), 1);
  store_->Fire("/memories/note.md");
  EXPECT_EQ(view.Take(), (Paths{"/memories/note.md"}));
  store_->Fire("/skills");
  EXPECT_EQ(view.Take(), (Paths{"/skills"}));
  // Not under any of the store's mounts: nothing in the view changed.
  store_->Fire("/secrets/key");
  store_->Fire("/memoriesx/a");
  store_->Fire("/");
  EXPECT_EQ(view.Take(), Paths{});
  EXPECT_TRUE(ws_->HasListener());
}

TEST(RouterChanges, BackendMountedTwiceWithStripPrefixReportsBoth) {
  Router router;
  auto* b =
      static_cast<FakeBackend*>(router.Adopt(std::make_unique<FakeBackend>(1)));
  ASSERT_OK(router.Mount("/a", b));
  ASSERT_OK(router.Mount("/b/c", b));
  RecordingListener view;
  router.SetChangeListener(&view);
  EXPECT_EQ(b->listener_registrations(), 1);
  b->Fire("/f");
  Paths got = view.Take();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (Paths{"/a/f", "/b/c/f"}));
}

TEST_P(NestedMountTest, ChangesHiddenByANestedMountAreDropped) {
  Router router;
  auto* outer =
      static_cast<FakeBackend*>(router.Adopt(std::make_unique<FakeBackend>(1)));
  auto* inner =
      static_cast<FakeBackend*>(router.Adopt(std::make_unique<FakeBackend>(2)));
  if (GetParam()) {
    ASSERT_OK(router.Mount("/workspace", outer));
    ASSERT_OK(router.Mount("/workspace/deep", inner));
  } else {
    ASSERT_OK(router.Mount("/workspace/deep", inner));
    ASSERT_OK(router.Mount("/workspace", outer));
  }
  RecordingListener view;
  router.SetChangeListener(&view);
  outer->Fire("/deep/x");  // the view shows the inner backend there
  outer->Fire("/deep");
  EXPECT_EQ(view.Take(), Paths{});
  outer->Fire("/deeper");
  EXPECT_EQ(view.Take(), (Paths{"/workspace/deeper"}));
  inner->Fire("/x");
  EXPECT_EQ(view.Take(), (Paths{"/workspace/deep/x"}));
}

TEST_F(RouterTest, NullListenerUnregistersFromEveryBackend) {
  RecordingListener view;
  router_.SetChangeListener(&view);
  ASSERT_TRUE(ws_->HasListener());
  ASSERT_TRUE(store_->HasListener());
  router_.SetChangeListener(nullptr);
  EXPECT_FALSE(ws_->HasListener());
  EXPECT_FALSE(store_->HasListener());
  ws_->Fire("/a.txt");
  store_->Fire("/memories/note.md");
  EXPECT_EQ(view.Take(), Paths{});
}

TEST_F(RouterTest, ANewListenerReplacesTheOldOne) {
  RecordingListener first, second;
  router_.SetChangeListener(&first);
  router_.SetChangeListener(&second);
  ws_->Fire("/a.txt");
  store_->Fire("/skills/skill.md");
  EXPECT_EQ(first.Take(), Paths{});
  EXPECT_EQ(second.Take(), (Paths{"/workspace/a.txt", "/skills/skill.md"}));
}

TEST(RouterChanges, DestroyingTheRouterUnregisters) {
  FakeBackend outlives(1);  // mounted, not owned by the router
  RecordingListener view;
  {
    Router router;
    ASSERT_OK(router.Mount("/workspace", &outlives));
    router.SetChangeListener(&view);
    ASSERT_TRUE(outlives.HasListener());
  }
  EXPECT_FALSE(outlives.HasListener());
  outlives.Fire("/a");
  EXPECT_EQ(view.Take(), Paths{});
}

// --- Cross-mount operations ------------------------------------------------

TEST_F(RouterTest, RenameBetweenTwoMountsOfOneBackendIsExdev) {
  EXPECT_ERRNO(
      router_.Rename(c_, P("/memories/note.md"), P("/skills/note.md"), 0),
      EXDEV);
  EXPECT_ERRNO(router_.Link(c_, P("/memories/note.md"), P("/skills/note.md")),
               EXDEV);
  EXPECT_TRUE(store_->calls().empty()) << store_->LastCall();
  EXPECT_TRUE(store_->Has("/memories/note.md"));
  EXPECT_FALSE(store_->Has("/skills/note.md"));
}

TEST_F(RouterTest, RenameAndLinkAcrossBackendsIsExdev) {
  EXPECT_ERRNO(
      router_.Rename(c_, P("/workspace/a.txt"), P("/memories/a.txt"), 0),
      EXDEV);
  EXPECT_ERRNO(
      router_.Rename(c_, P("/memories/note.md"), P("/workspace/note.md"), 0),
      EXDEV);
  EXPECT_ERRNO(router_.Link(c_, P("/workspace/a.txt"), P("/memories/a.txt")),
               EXDEV);
  EXPECT_TRUE(NoBackendCalled());
  EXPECT_TRUE(ws_->Has("/a.txt"));
}

// --- The synthesised root ----------------------------------------------------

TEST_F(RouterTest, RootIsAReadOnlyDirectory) {
  ASSERT_OK_AND_ASSIGN(Attr st, router_.Stat(c_, Path()));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0555u);
  EXPECT_TRUE(NoBackendCalled());
}

TEST_F(RouterTest, RootListsExactlyTheMountNames) {
  ASSERT_OK_AND_ASSIGN(auto entries, router_.ReadDir(c_, Path()));
  EXPECT_EQ(entries.size(), 3u);
  EXPECT_EQ(Names(entries),
            (std::set<std::string>{"memories", "skills", "workspace"}));
  for (const auto& e : entries)
    EXPECT_EQ(e.type, static_cast<mode_t>(S_IFDIR)) << e.name;
  EXPECT_TRUE(NoBackendCalled());
}

TEST(RouterSynthetic, NestedMountSynthesisesEachLevel) {
  Router router;
  auto* b = router.Adopt(std::make_unique<FakeBackend>(1));
  ASSERT_OK(router.Mount("/a/b", b));
  const Caller c = Caller::Local();

  ASSERT_OK_AND_ASSIGN(auto root, router.ReadDir(c, Path()));
  EXPECT_EQ(Names(root), (std::set<std::string>{"a"}));
  ASSERT_OK_AND_ASSIGN(auto a, router.ReadDir(c, P("/a")));
  EXPECT_EQ(Names(a), (std::set<std::string>{"b"}));

  ASSERT_OK_AND_ASSIGN(Attr st, router.Stat(c, P("/a")));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0555u);

  EXPECT_ERRNO(router.Stat(c, P("/a/c")), ENOENT);
  EXPECT_ERRNO(router.Mkdir(c, P("/a/c"), 0755), EACCES);
  EXPECT_ERRNO(router.Open(c, P("/a/c"), O_CREAT | O_WRONLY, 0644), EACCES);
  EXPECT_ERRNO(router.Open(c, P("/a"), O_RDONLY, 0), EISDIR);
  EXPECT_TRUE(static_cast<FakeBackend*>(b)->calls().empty());
}

TEST_F(RouterTest, UnknownTopLevelNamesDoNotExist) {
  for (const char* p : {"/nope", "/nope/deeper", "/workspacefoo", "/memory"}) {
    SCOPED_TRACE(p);
    EXPECT_ERRNO(router_.Stat(c_, P(p)), ENOENT);
    EXPECT_ERRNO(router_.Open(c_, P(p), O_RDONLY, 0), ENOENT);
    EXPECT_ERRNO(router_.ReadDir(c_, P(p)), ENOENT);
    EXPECT_ERRNO(router_.Readlink(c_, P(p)), ENOENT);
  }
  EXPECT_TRUE(NoBackendCalled());
}

TEST_F(RouterTest, CreatingInTheRootIsEacces) {
  EXPECT_ERRNO(router_.Open(c_, P("/newname"), O_CREAT | O_WRONLY, 0644),
               EACCES);
  EXPECT_ERRNO(router_.Open(c_, P("/newname"), O_CREAT | O_EXCL | O_RDWR, 0644),
               EACCES);
  EXPECT_ERRNO(router_.Mkdir(c_, P("/newname"), 0755), EACCES);
  EXPECT_ERRNO(router_.Symlink(c_, "/workspace", P("/newname")), EACCES);
  EXPECT_ERRNO(router_.Mknod(c_, P("/newname"), S_IFIFO | 0644, 0), EACCES);
  EXPECT_ERRNO(router_.Link(c_, P("/workspace/a.txt"), P("/newname")), EACCES);
  EXPECT_ERRNO(router_.Rename(c_, P("/workspace/a.txt"), P("/newname"), 0),
               EACCES);
  EXPECT_TRUE(NoBackendCalled()) << ws_->LastCall();
  EXPECT_TRUE(ws_->Has("/a.txt"));
  EXPECT_ERRNO(router_.Stat(c_, P("/newname")), ENOENT);
}

TEST_F(RouterTest, RootIsNotWritable) {
  struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  EXPECT_ERRNO(router_.Chmod(c_, Path(), 0777), EACCES);
  EXPECT_ERRNO(router_.Chown(c_, Path(), 0, 0), EACCES);
  EXPECT_ERRNO(router_.Utimens(c_, Path(), times), EACCES);
  EXPECT_ERRNO(router_.SetXattr(c_, Path(), "user.x", "v", 0), EACCES);
  EXPECT_ERRNO(router_.RemoveXattr(c_, Path(), "user.x"), EACCES);
  EXPECT_ERRNO(router_.Rmdir(c_, Path()), EACCES);
  EXPECT_ERRNO(router_.Unlink(c_, Path()), EISDIR);
  EXPECT_ERRNO(router_.Truncate(c_, Path(), 0), EISDIR);
  EXPECT_ERRNO(router_.Mkdir(c_, Path(), 0755), EEXIST);
  EXPECT_TRUE(NoBackendCalled());
}

TEST_F(RouterTest, OpeningTheRootIsEisdir) {
  EXPECT_ERRNO(router_.Open(c_, Path(), O_RDONLY, 0), EISDIR);
  EXPECT_ERRNO(router_.Open(c_, Path(), O_WRONLY, 0), EISDIR);
  EXPECT_ERRNO(router_.Open(c_, Path(), O_RDWR | O_CREAT, 0644), EISDIR);
  EXPECT_TRUE(NoBackendCalled());
}

TEST_F(RouterTest, StatFsOfTheRootIsAnswered) {
  ASSERT_OK_AND_ASSIGN(struct statvfs st, router_.StatFs(c_, Path()));
  EXPECT_EQ(st.f_bsize, 4096u);
  // Answered by one of the mounted backends.
  EXPECT_TRUE(st.f_fsid == ws_->id() || st.f_fsid == store_->id()) << st.f_fsid;
  EXPECT_EQ(ws_->calls().size() + store_->calls().size(), 1u);
}

// --- Mount points
// --------------------------------------------------------------

TEST_F(RouterTest, MountPointsCannotBeRemovedOrRenamed) {
  EXPECT_ERRNO(router_.Rmdir(c_, P("/workspace")), EBUSY);
  EXPECT_ERRNO(router_.Rmdir(c_, P("/memories")), EBUSY);
  // unlink(2) of a directory reports EISDIR before anything else.
  EXPECT_ERRNO(router_.Unlink(c_, P("/workspace")), EISDIR);
  EXPECT_ERRNO(router_.Rename(c_, P("/workspace"), P("/memories/ws"), 0),
               EBUSY);
  EXPECT_ERRNO(router_.Rename(c_, P("/skills"), P("/skills/x"), 0), EBUSY);
  // Nor replaced by a rename onto them.
  EXPECT_ERRNO(router_.Rename(c_, P("/memories/note.md"), P("/skills"), 0),
               EBUSY);
  EXPECT_TRUE(NoBackendCalled()) << ws_->LastCall() << store_->LastCall();
}

TEST_F(RouterTest, MountPointsCannotBeCreatedOver) {
  EXPECT_ERRNO(router_.Mkdir(c_, P("/workspace"), 0755), EEXIST);
  EXPECT_ERRNO(router_.Symlink(c_, "x", P("/memories")), EEXIST);
  EXPECT_ERRNO(router_.Link(c_, P("/workspace/a.txt"), P("/workspace")),
               EEXIST);
  EXPECT_ERRNO(router_.Link(c_, P("/workspace"), P("/workspace/w")), EPERM);
  EXPECT_TRUE(NoBackendCalled());
}

// --- Read-only mounts
// ----------------------------------------------------------

class ReadOnlyMountTest : public RouterTest {
 protected:
  void SetUp() override {
    RouterTest::SetUp();
    ro_ = Fake(3);
    ro_->AddFile("/f", "read me");
    ro_->AddDir("/d");
    ro_->AddDir("/empty");
    ro_->Symlink(c_, "f", P("/ln"));
    ro_->ClearCalls();
    ASSERT_OK(router_.Mount("/ro", ro_, {.read_only = true}));
  }
  FakeBackend* ro_ = nullptr;
};

TEST_F(ReadOnlyMountTest, EveryWriteIsErofs) {
  struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  for (int flags : {O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC, O_WRONLY | O_APPEND,
                    O_CREAT | O_WRONLY}) {
    EXPECT_ERRNO(router_.Open(c_, P("/ro/f"), flags, 0644), EROFS) << flags;
  }
  EXPECT_ERRNO(router_.Open(c_, P("/ro/new"), O_CREAT | O_RDWR, 0644), EROFS);
  EXPECT_ERRNO(router_.Mkdir(c_, P("/ro/newdir"), 0755), EROFS);
  EXPECT_ERRNO(router_.Mknod(c_, P("/ro/fifo"), S_IFIFO | 0644, 0), EROFS);
  EXPECT_ERRNO(router_.Symlink(c_, "f", P("/ro/ln2")), EROFS);
  EXPECT_ERRNO(router_.Unlink(c_, P("/ro/f")), EROFS);
  EXPECT_ERRNO(router_.Rmdir(c_, P("/ro/empty")), EROFS);
  EXPECT_ERRNO(router_.Link(c_, P("/ro/f"), P("/ro/g")), EROFS);
  EXPECT_ERRNO(router_.Rename(c_, P("/ro/f"), P("/ro/g"), 0), EROFS);
  EXPECT_ERRNO(router_.Rename(c_, P("/workspace/a.txt"), P("/ro/a.txt"), 0),
               EROFS);
  EXPECT_ERRNO(router_.Rename(c_, P("/ro/f"), P("/workspace/f"), 0), EROFS);
  EXPECT_ERRNO(router_.Chmod(c_, P("/ro/f"), 0600), EROFS);
  EXPECT_ERRNO(router_.Chown(c_, P("/ro/f"), 0, 0), EROFS);
  EXPECT_ERRNO(router_.Utimens(c_, P("/ro/f"), times), EROFS);
  EXPECT_ERRNO(router_.Truncate(c_, P("/ro/f"), 0), EROFS);
  EXPECT_ERRNO(router_.SetXattr(c_, P("/ro/f"), "user.x", "v", 0), EROFS);
  EXPECT_ERRNO(router_.RemoveXattr(c_, P("/ro/f"), "user.x"), EROFS);
  EXPECT_TRUE(ro_->calls().empty()) << ro_->LastCall();
  EXPECT_TRUE(ws_->calls().empty()) << ws_->LastCall();
  EXPECT_TRUE(ro_->Has("/f"));
  EXPECT_TRUE(ro_->Has("/empty"));
}

// As on a read-only filesystem, O_CREAT without a write access or O_TRUNC
// opens an existing file (shells and editors open with O_CREAT by habit);
// only an open that would create is EROFS.
TEST_F(ReadOnlyMountTest, CreateFlagOpensAnExistingFileForReading) {
  ASSERT_OK_AND_ASSIGN(auto h, router_.Open(c_, P("/ro/f"), O_CREAT, 0644));
  EXPECT_EQ(ReadAll(*h), "read me");
  EXPECT_ERRNO(router_.Open(c_, P("/ro/f"), O_CREAT | O_EXCL, 0644), EEXIST);
  EXPECT_ERRNO(router_.Open(c_, P("/ro/new"), O_CREAT, 0644), EROFS);
  EXPECT_ERRNO(router_.Open(c_, P("/ro/new"), O_CREAT | O_EXCL, 0644), EROFS);
  EXPECT_ERRNO(router_.Open(c_, P("/ro/d"), O_CREAT, 0644), EISDIR);
  EXPECT_ERRNO(router_.Open(c_, P("/ro"), O_CREAT, 0644), EISDIR);
  EXPECT_ERRNO(router_.Open(c_, P("/ro/nodir/x"), O_CREAT, 0644), ENOENT);
  EXPECT_ERRNO(router_.Open(c_, P("/ro/f/x"), O_CREAT, 0644), ENOTDIR);
  for (const auto& call : ro_->calls())
    EXPECT_TRUE(call.rfind("Stat ", 0) == 0 || call.rfind("Open ", 0) == 0)
        << call;
  EXPECT_FALSE(ro_->Has("/new"));
}

TEST_F(ReadOnlyMountTest, ReadsPass) {
  ASSERT_OK(router_.Stat(c_, P("/ro/f")));
  ASSERT_OK(router_.Stat(c_, P("/ro")));
  ASSERT_OK_AND_ASSIGN(auto entries, router_.ReadDir(c_, P("/ro")));
  EXPECT_EQ(Names(entries), (std::set<std::string>{"f", "d", "empty", "ln"}));
  ASSERT_OK_AND_ASSIGN(auto h, router_.Open(c_, P("/ro/f"), O_RDONLY, 0));
  EXPECT_EQ(ReadAll(*h), "read me");
  ASSERT_OK_AND_ASSIGN(std::string target, router_.Readlink(c_, P("/ro/ln")));
  EXPECT_EQ(target, "f");
  ASSERT_OK(router_.StatFs(c_, P("/ro/d")));
  ASSERT_OK(router_.GetXattr(c_, P("/ro/f"), "user.x"));
  ASSERT_OK(router_.ListXattr(c_, P("/ro/f")));
  EXPECT_EQ(ro_->calls(),
            (std::vector<std::string>{"Stat /f", "Stat /", "ReadDir /",
                                      "Open /f", "Readlink /ln", "StatFs /d",
                                      "GetXattr /f", "ListXattr /f"}));
  // The read-only mount is listed in the root like any other.
  ASSERT_OK_AND_ASSIGN(auto root, router_.ReadDir(c_, Path()));
  EXPECT_EQ(Names(root).count("ro"), 1u);
}

TEST_F(ReadOnlyMountTest, OtherMountsStayWritable) {
  ASSERT_OK(router_.Mkdir(c_, P("/workspace/newdir"), 0755));
  EXPECT_EQ(ws_->LastCall(), "Mkdir /newdir");
}

// --- The mount table
// -----------------------------------------------------------

TEST(RouterMount, RejectsRootAndInvalidPrefixes) {
  Router router;
  auto* b = router.Adopt(std::make_unique<FakeBackend>(1));
  EXPECT_ERRNO(router.Mount("/", b), EINVAL);
  EXPECT_ERRNO(router.Mount("//", b), EINVAL);
  EXPECT_ERRNO(router.Mount("/a/..", b), EINVAL);
  EXPECT_ERRNO(router.Mount("", b), EINVAL);
  EXPECT_ERRNO(router.Mount("workspace", b), EINVAL);
  EXPECT_ERRNO(router.Mount(std::string("/a\0b", 4), b), EINVAL);
  EXPECT_ERRNO(router.Mount("/ok", nullptr), EINVAL);
  EXPECT_TRUE(router.MountPoints().empty());
}

TEST(RouterMount, SamePrefixTwiceIsEexist) {
  Router router;
  auto* a = router.Adopt(std::make_unique<FakeBackend>(1));
  auto* b = router.Adopt(std::make_unique<FakeBackend>(2));
  ASSERT_OK(router.Mount("/workspace", a));
  EXPECT_ERRNO(router.Mount("/workspace", b), EEXIST);
  EXPECT_ERRNO(router.Mount("/workspace/", a), EEXIST);
  EXPECT_ERRNO(router.Mount("//workspace/./", b), EEXIST);
  EXPECT_EQ(router.MountPoints(), (std::vector<Path>{P("/workspace")}));
  // The first mount still serves.
  ASSERT_OK_AND_ASSIGN(Attr st, router.Stat(Caller::Local(), P("/workspace")));
  EXPECT_EQ(st.st_dev, 1u);
}

TEST(RouterMount, MountPointsAreSortedAndNormalised) {
  Router router;
  auto* b = router.Adopt(std::make_unique<FakeBackend>(1));
  ASSERT_OK(router.Mount("/workspace", b));
  ASSERT_OK(router.Mount("/skills/", b));
  ASSERT_OK(router.Mount("/a/b", b));
  ASSERT_OK(router.Mount("/memories", b));
  ASSERT_OK(router.Mount("/workspace/deep", b));
  EXPECT_EQ(router.MountPoints(),
            (std::vector<Path>{P("/a/b"), P("/memories"), P("/skills"),
                               P("/workspace"), P("/workspace/deep")}));
}

TEST(RouterMount, EmptyRouterHasNothing) {
  Router router;
  EXPECT_TRUE(router.MountPoints().empty());
  EXPECT_ERRNO(router.Stat(Caller::Local(), P("/x")), ENOENT);
}

}  // namespace
}  // namespace agentvfs::router
