// The directory-path cache (namespace.h): a walk that starts at a cached
// directory, and a directory path taken from the cache, are right even after
// another process (here: another StoreBackend with its own connections and
// cache) renamed or removed the directories, because such changes bump the
// store's directory generation in their own transaction.
#include <fcntl.h>
#include <sqlite3.h>

#include <string>

#include "backends/store/namespace.h"
#include "backends/store/store.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/pg_server.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using testing::StoreFixture;

TEST(DirCacheTest, EntriesHoldForOneGenerationOnly) {
  DirCache cache;
  cache.Put(3, "/memories/a", 10);
  EXPECT_EQ(cache.Ino(3, "/memories/a"), 10);
  EXPECT_EQ(cache.PathOf(3, 10), "/memories/a");
  // A transaction on an older snapshot neither uses nor fills the cache.
  EXPECT_EQ(cache.Ino(2, "/memories/a"), std::nullopt);
  cache.Put(2, "/memories/old", 11);
  EXPECT_EQ(cache.Ino(3, "/memories/old"), std::nullopt);
  // A newer generation drops everything before it.
  cache.Put(4, "/memories/b", 12);
  EXPECT_EQ(cache.Ino(4, "/memories/a"), std::nullopt);
  EXPECT_EQ(cache.PathOf(4, 10), std::nullopt);
  EXPECT_EQ(cache.Ino(4, "/memories/b"), 12);
  EXPECT_EQ(cache.Ino(3, "/memories/b"), std::nullopt);
}

// Walks and creates through the namespace functions on one engine.
class DirCacheEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::Open(dir_.Sub("s.db"), true);
    ASSERT_TRUE(e.has_value()) << e.error().ToString();
    engine_ = std::move(*e);
  }

  // Makes directory `name` under the root.
  vfs::Result<Inode> MakeDir(Txn& txn, const std::string& name) {
    auto root = LoadInode(txn, kRootIno);
    if (!root) return std::unexpected(root.error());
    return CreateNode(txn, **root, name, S_IFDIR, 0755, 0, 0, "", NowNs());
  }

  // The inode `path` leads to (0: none).
  int64_t InoOf(const std::string& path) {
    int64_t ino = -1;
    auto ok = engine_->Read([&](Txn& txn) -> vfs::Status {
      auto w = Walk(txn, path, true);
      if (!w) return std::unexpected(w.error());
      ino = w->node ? w->node->ino : 0;
      return {};
    });
    return ok ? ino : -1;
  }

  testing::TempDir dir_{"agentvfs-dircache"};
  std::unique_ptr<Engine> engine_;
};

TEST_F(DirCacheEngineTest, AWriteThatRolledBackLeavesNothingCached) {
  // The walk inside the failed transaction cached /x, whose inode number
  // the next transaction gives out again.
  int64_t x = 0;
  auto failed = engine_->Write(Durability::kProcess, [&](Txn& txn) -> vfs::Status {
    auto made = MakeDir(txn, "x");
    if (!made) return std::unexpected(made.error());
    x = made->ino;
    auto w = Walk(txn, "/x/y", true);
    if (!w) return std::unexpected(w.error());
    return vfs::Fail(EIO, "the transaction fails after its walk");
  });
  ASSERT_ERRNO(failed, EIO);
  int64_t w = 0;
  ASSERT_OK(engine_->Write(Durability::kProcess, [&](Txn& txn) -> vfs::Status {
    auto made = MakeDir(txn, "w");
    if (!made) return std::unexpected(made.error());
    w = made->ino;
    return {};
  }));
  ASSERT_EQ(w, x) << "the inode number was given out again";
  EXPECT_EQ(InoOf("/x/y"), -1) << "/x does not exist: ENOENT";
  EXPECT_EQ(InoOf("/w/y"), 0);
}

TEST_F(DirCacheEngineTest, ADirectoryMovedBySomeOtherProgramIsNotFoundAtItsOldPath) {
  ASSERT_OK(engine_->Write(Durability::kProcess, [&](Txn& txn) -> vfs::Status {
    auto a = MakeDir(txn, "a");
    if (!a) return std::unexpected(a.error());
    auto f = CreateNode(txn, *a, "f", S_IFREG, 0644, 0, 0, "", NowNs());
    if (!f) return std::unexpected(f.error());
    return {};
  }));
  int64_t f = InoOf("/a/f");
  ASSERT_GT(f, 0);  // /a is cached now
  // Another program (the sqlite3 shell, an older tool) renames /a to /b
  // with plain SQL: the schema's triggers still bump the generation.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir_.Sub("s.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "UPDATE dentries SET name = 'b' WHERE parent = 1 AND "
                         "name = 'a'",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  EXPECT_EQ(InoOf("/a/f"), -1);
  EXPECT_EQ(InoOf("/b/f"), f);
}

// Runs on each engine (PostgreSQL keeps no cache; the behaviour must be the
// same).
class DirCacheStoreTest
    : public ::testing::TestWithParam<testing::StoreEngine> {
 protected:
  void SetUp() override {
    auto f = StoreFixture::Create({"dev"}, {}, GetParam());
    ASSERT_TRUE(f.has_value()) << f.error().ToString();
    fixture_ = std::move(*f);
    a_ = fixture_->OpenBackend();
    b_ = fixture_->OpenBackend();
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    ca_ = fixture_->CallerFor("dev");
    cb_ = fixture_->CallerFor("dev");
  }

  static vfs::Path P(const std::string& rel) {
    return *vfs::Path::Parse("/memories/users/dev/" + rel);
  }

  static vfs::Status Put(StoreBackend& b, const vfs::Caller& c,
                         const std::string& rel, const std::string& data) {
    auto f = b.Open(c, P(rel), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!f) return std::unexpected(f.error());
    auto n = (*f)->Write(data.data(), data.size(), 0);
    if (!n) return std::unexpected(n.error());
    return (*f)->Flush();
  }

  static std::string Get(StoreBackend& b, const vfs::Caller& c,
                         const std::string& rel) {
    auto f = b.Open(c, P(rel), O_RDONLY, 0);
    if (!f) return "<" + f.error().ToString() + ">";
    std::string out(4096, '\0');
    auto n = (*f)->Read(out.data(), out.size(), 0);
    if (!n) return "<" + n.error().ToString() + ">";
    out.resize(*n);
    return out;
  }

  std::unique_ptr<StoreFixture> fixture_;
  std::unique_ptr<StoreBackend> a_, b_;
  vfs::Caller ca_, cb_;
};

TEST_P(DirCacheStoreTest, ARenamedDirectoryIsFoundAtItsNewPathOnly) {
  ASSERT_OK(a_->Mkdir(ca_, P("a"), 0755));
  ASSERT_OK(a_->Mkdir(ca_, P("a/b"), 0755));
  ASSERT_OK(Put(*a_, ca_, "a/b/f", "first"));
  ASSERT_OK(a_->Stat(ca_, P("a/b/f")));  // a/b is cached in a_

  // Another process moves the tree away and makes a new one at the old path.
  ASSERT_OK(b_->Rename(cb_, P("a"), P("z"), 0));
  ASSERT_OK(b_->Mkdir(cb_, P("a"), 0755));
  ASSERT_OK(b_->Mkdir(cb_, P("a/b"), 0755));
  ASSERT_OK(Put(*b_, cb_, "a/b/g", "new tree"));

  EXPECT_ERRNO(a_->Stat(ca_, P("a/b/f")), ENOENT);
  EXPECT_EQ(Get(*a_, ca_, "z/b/f"), "first");
  EXPECT_EQ(Get(*a_, ca_, "a/b/g"), "new tree");
  // A create through the old cache's process lands in the new directory.
  ASSERT_OK(Put(*a_, ca_, "a/b/h", "made by a"));
  EXPECT_EQ(Get(*b_, cb_, "a/b/h"), "made by a");
  EXPECT_ERRNO(b_->Stat(cb_, P("z/b/h")), ENOENT);
}

TEST_P(DirCacheStoreTest, ADirectoryRemovedAndMadeAgainIsTheNewOne) {
  ASSERT_OK(a_->Mkdir(ca_, P("d"), 0755));
  ASSERT_OK(Put(*a_, ca_, "d/x", "old"));
  ASSERT_OK(a_->Stat(ca_, P("d/x")));

  ASSERT_OK(b_->Unlink(cb_, P("d/x")));
  ASSERT_OK(b_->Rmdir(cb_, P("d")));
  ASSERT_OK(b_->Mkdir(cb_, P("d"), 0700));

  ASSERT_OK_AND_ASSIGN(auto st, a_->Stat(ca_, P("d")));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_ERRNO(a_->Stat(ca_, P("d/x")), ENOENT);
  ASSERT_OK(Put(*a_, ca_, "d/y", "in the new d"));
  EXPECT_EQ(Get(*b_, cb_, "d/y"), "in the new d");
}

TEST_P(DirCacheStoreTest, ACommitRecordsThePathAfterItsDirectoryMoved) {
  ASSERT_OK(a_->Mkdir(ca_, P("p"), 0755));
  ASSERT_OK(a_->Mkdir(ca_, P("p/q"), 0755));
  ASSERT_OK_AND_ASSIGN(
      auto f, a_->Open(ca_, P("p/q/file"), O_RDWR | O_CREAT | O_TRUNC, 0644));
  ASSERT_OK(f->Write("one", 3, 0));
  ASSERT_OK(f->Flush());  // the path of p/q is now cached in a_

  // Another process renames the parent of the open file's directory.
  ASSERT_OK(b_->Rename(cb_, P("p"), P("p2"), 0));

  ASSERT_OK(f->Write("two", 3, 0));
  ASSERT_OK(f->Flush());
  ASSERT_OK_AND_ASSIGN(auto versions, a_->History(ca_, P("p2/q/file")));
  ASSERT_EQ(versions.size(), 2u);
  EXPECT_EQ(versions.back().path, "/memories/users/dev/p2/q/file");
  EXPECT_EQ(versions.front().path, "/memories/users/dev/p/q/file");
}

TEST_P(DirCacheStoreTest, ASymlinkInThePathIsFollowedEveryTime) {
  ASSERT_OK(a_->Mkdir(ca_, P("one"), 0755));
  ASSERT_OK(a_->Mkdir(ca_, P("two"), 0755));
  ASSERT_OK(Put(*a_, ca_, "one/f", "in one"));
  ASSERT_OK(Put(*a_, ca_, "two/f", "in two"));
  ASSERT_OK(a_->Symlink(ca_, "one", P("link")));
  EXPECT_EQ(Get(*a_, ca_, "link/f"), "in one");
  // Re-pointing the link is no directory move; the walk must still see it.
  ASSERT_OK(b_->Unlink(cb_, P("link")));
  ASSERT_OK(b_->Symlink(cb_, "two", P("link")));
  EXPECT_EQ(Get(*a_, ca_, "link/f"), "in two");
  ASSERT_OK(b_->Unlink(cb_, P("link")));
  ASSERT_OK(b_->Symlink(cb_, "../dev/one/.", P("link")));
  EXPECT_EQ(Get(*a_, ca_, "link/f"), "in one");
}

INSTANTIATE_TEST_SUITE_P(Engines, DirCacheStoreTest,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

}  // namespace
}  // namespace agentvfs::store
