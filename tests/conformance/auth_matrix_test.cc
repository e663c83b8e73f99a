// The store's authorisation, operation by operation: three users, four areas
// with different grants, every operation expected to succeed or to fail with
// the documented errno (unreadable -> ENOENT and never listed; readable but
// not writable -> EACCES). Run through the vfs API (a Router over the store,
// as the harness's tools call it) and through real FUSE mounts, one per user,
// with real syscalls. Also: revoking a grant and disabling a user reach a
// live mount within seconds.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "backends/store/admin.h"
#include "tests/conformance/fs_ops.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::conformance {
namespace {

using testing::MountedView;
using testing::StoreFixture;
using testing::TempDir;

// Areas of the default layout and what each user may do there.
//   alice (team eng), bob (team eng), carol (team ops; maintains skill "tool")
struct Area {
  std::string dir;                    // store path without the leading '/'
  std::map<std::string, char> level;  // user -> 'n'one, 'r'ead, 'w'rite
};

const std::vector<Area>& Areas() {
  static const std::vector<Area> areas = {
      {"memories/users/alice", {{"alice", 'w'}, {"bob", 'n'}, {"carol", 'n'}}},
      {"memories/teams/eng", {{"alice", 'w'}, {"bob", 'w'}, {"carol", 'n'}}},
      {"memories/org", {{"alice", 'r'}, {"bob", 'r'}, {"carol", 'r'}}},
      {"skills/tool", {{"alice", 'r'}, {"bob", 'r'}, {"carol", 'w'}}},
  };
  return areas;
}

const std::vector<std::string> kUsers = {"alice", "bob", "carol"};

// The operations, each on its own target so that they do not interfere.
// Returns the errno (0 for success).
using Op =
    std::function<int(FsOps&, const std::string& dir, const std::string& user)>;

int Code(const Status& s) { return s ? 0 : s.error().code; }
template <typename T>
int Code(const Result<T>& r) {
  return r ? 0 : r.error().code;
}

int WriteWith(FsOps& fs, const std::string& path, int flags) {
  auto fd = fs.Open(path, flags, 0644);
  if (!fd) return fd.error().code;
  auto n = fs.Write(*fd, "data\n", 5);
  auto closed = fs.Close(*fd);
  if (!n) return n.error().code;
  return Code(closed);
}

const std::vector<std::pair<std::string, Op>>& Ops() {
  static const std::vector<std::pair<std::string, Op>> ops = {
      {"stat",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(fs.Stat(d + "/" + u + "-stat"));
       }},
      {"read",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         auto fd = fs.Open(d + "/" + u + "-read", O_RDONLY);
         if (!fd) return fd.error().code;
         char buf[64];
         auto n = fs.Read(*fd, buf, sizeof buf);
         (void)fs.Close(*fd);
         if (!n) return n.error().code;
         return std::string(buf, *n) == "seed\n" ? 0 : EIO;
       }},
      {"list",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         auto names = fs.ReadDir(d);
         if (!names) return names.error().code;
         for (const auto& n : *names) {
           if (n == u + "-list") return 0;
         }
         return ENOENT;
       }},
      {"list-parent",
       [](FsOps& fs, const std::string& d, const std::string&) {
         auto slash = d.rfind('/');
         auto names = fs.ReadDir(d.substr(0, slash));
         if (!names) return names.error().code;
         for (const auto& n : *names) {
           if (n == d.substr(slash + 1)) return 0;
         }
         return ENOENT;
       }},
      {"overwrite",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return WriteWith(fs, d + "/" + u + "-overwrite", O_WRONLY | O_TRUNC);
       }},
      {"read-truncate",  // on Linux O_RDONLY|O_TRUNC truncates: a write
       [](FsOps& fs, const std::string& d, const std::string& u) {
         auto fd = fs.Open(d + "/" + u + "-read-truncate", O_RDONLY | O_TRUNC);
         if (!fd) return fd.error().code;
         char buf[64];
         auto n = fs.Read(*fd, buf, sizeof buf);
         (void)fs.Close(*fd);
         if (!n) return n.error().code;
         return *n == 0 ? 0 : EIO;
       }},
      {"append",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return WriteWith(fs, d + "/" + u + "-append", O_WRONLY | O_APPEND);
       }},
      {"create",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return WriteWith(fs, d + "/" + u + "-new",
                          O_WRONLY | O_CREAT | O_EXCL);
       }},
      {"mkdir",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(fs.Mkdir(d + "/" + u + "-newdir"));
       }},
      {"rmdir",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(fs.Rmdir(d + "/" + u + "-rmdir"));
       }},
      {"unlink",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(fs.Unlink(d + "/" + u + "-unlink"));
       }},
      {"rename",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(
             fs.Rename(d + "/" + u + "-rename", d + "/" + u + "-renamed"));
       }},
      {"truncate",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(fs.Truncate(d + "/" + u + "-truncate", 1));
       }},
      {"chmod",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(fs.Chmod(d + "/" + u + "-chmod", 0600));
       }},
      {"utimens",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         struct timespec t[2] = {{1000, 0}, {2000, 0}};
         return Code(fs.Utimens(d + "/" + u + "-utimens", t));
       }},
      {"symlink",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(fs.Symlink("target", d + "/" + u + "-symlink"));
       }},
      {"link",
       [](FsOps& fs, const std::string& d, const std::string& u) {
         return Code(fs.Link(d + "/" + u + "-link", d + "/" + u + "-linked"));
       }},
  };
  return ops;
}

bool IsReadOp(const std::string& op) {
  return op == "stat" || op == "read" || op == "list" || op == "list-parent";
}

// What an operation must give for a user with `level` on its area.
int Expected(const std::string& op, char level) {
  if (level == 'n') return ENOENT;
  if (level == 'r') return IsReadOp(op) ? 0 : EACCES;
  return 0;
}

// A store with the users, grants and one target per (area, user, op),
// created by the admin through the API.
std::unique_ptr<StoreFixture> MakeStore(testing::StoreEngine kind) {
  auto fixture = StoreFixture::Create(
      kUsers, {{"alice", {"eng"}}, {"bob", {"eng"}}, {"carol", {"ops"}}},
      kind);
  if (!fixture) {
    ADD_FAILURE() << fixture.error().ToString();
    return nullptr;
  }
  auto engine = store::Engine::Open((*fixture)->db(), false);
  EXPECT_TRUE(engine.has_value());
  EXPECT_OK(store::Grant(**engine, "admin", "/skills/tool",
                         store::Subject{"user", "carol"},
                         store::Level::kWrite));

  auto router = (*fixture)->MakeRouter();
  auto admin =
      MakeBackendOps(router.get(), "", nullptr, (*fixture)->CallerFor("admin"));
  EXPECT_OK(admin->Mkdir("skills/tool"));
  for (const auto& area : Areas()) {
    for (const auto& user : kUsers) {
      for (const auto& [op, fn] : Ops()) {
        std::string base = area.dir + "/" + user + "-";
        if (op == "rmdir") {
          EXPECT_OK(admin->Mkdir(base + "rmdir"));
          continue;
        }
        if (op == "create" || op == "mkdir" || op == "symlink" ||
            op == "list-parent") {
          continue;
        }
        auto fd = admin->Open(base + op, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        EXPECT_TRUE(fd.has_value()) << base + op;
        if (!fd) continue;
        EXPECT_TRUE(admin->Write(*fd, "seed\n", 5).has_value());
        EXPECT_OK(admin->Close(*fd));
      }
    }
  }
  return std::move(*fixture);
}

// Runs every operation as every user and compares with Expected().
void RunMatrix(const std::map<std::string, FsOps*>& as_user) {
  int checked = 0;
  for (const auto& area : Areas()) {
    for (const auto& user : kUsers) {
      char level = area.level.at(user);
      for (const auto& [op, fn] : Ops()) {
        int got = fn(*as_user.at(user), area.dir, user);
        int want = Expected(op, level);
        EXPECT_EQ(vfs::ErrnoName(got), vfs::ErrnoName(want))
            << user << " " << op << " in /" << area.dir << " (level " << level
            << ")";
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked,
            static_cast<int>(Areas().size() * kUsers.size() * Ops().size()));
}

// The whole matrix on each engine.
class AuthMatrixTest : public ::testing::TestWithParam<testing::StoreEngine> {};
INSTANTIATE_TEST_SUITE_P(Engines, AuthMatrixTest,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

TEST_P(AuthMatrixTest, ThroughTheApi) {
  auto fixture = MakeStore(GetParam());
  ASSERT_NE(fixture, nullptr);
  auto router = fixture->MakeRouter();
  std::map<std::string, std::unique_ptr<FsOps>> ops;
  std::map<std::string, FsOps*> as_user;
  for (const auto& user : kUsers) {
    ops[user] =
        MakeBackendOps(router.get(), "", nullptr, fixture->CallerFor(user));
    as_user[user] = ops[user].get();
  }
  RunMatrix(as_user);
}

TEST_P(AuthMatrixTest, ThroughRealMounts) {
  auto fixture = MakeStore(GetParam());
  ASSERT_NE(fixture, nullptr);
  std::vector<std::unique_ptr<TempDir>> dirs;
  std::vector<std::unique_ptr<MountedView>> views;
  std::map<std::string, std::unique_ptr<FsOps>> ops;
  std::map<std::string, FsOps*> as_user;
  for (const auto& user : kUsers) {
    dirs.push_back(std::make_unique<TempDir>("agentvfs-ws"));
    auto ws = dirs.back()->path();
    dirs.push_back(std::make_unique<TempDir>("agentvfs-mnt"));
    std::string error;
    views.push_back(MountedView::Start(ws, dirs.back()->path(),
                                       fixture->MountArgs(user), &error));
    ASSERT_NE(views.back(), nullptr) << error;
    ASSERT_OK_AND_ASSIGN(auto fs,
                         MakeSyscallOps(views.back()->mountpoint(), nullptr));
    ops[user] = std::move(fs);
    as_user[user] = ops[user].get();
  }
  RunMatrix(as_user);
  ops.clear();
  for (auto& v : views) EXPECT_EQ(v->Stop(), 0) << v->Log();
}

// Polls `fn` until it returns `want` or `limit` passes; returns the time it
// took, or nullopt.
std::optional<double> SecondsUntil(const std::function<int()>& fn, int want,
                                   std::chrono::milliseconds limit) {
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < limit) {
    if (fn() == want) {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                           start)
          .count();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

// Also with a long cache timeout: names and attributes the kernel cached
// stop answering (stat) as soon as opens do.
TEST_P(AuthMatrixTest, RevokingAndDisablingReachALiveMountWithinSeconds) {
  auto fixture = MakeStore(GetParam());
  ASSERT_NE(fixture, nullptr);
  TempDir ws("agentvfs-ws"), mnt("agentvfs-mnt");
  std::string error;
  auto args = fixture->MountArgs("bob");
  args.insert(args.end(), {"--cache-timeout", "600"});
  auto view = MountedView::Start(ws.path(), mnt.path(), args, &error);
  ASSERT_NE(view, nullptr) << error;
  ASSERT_OK_AND_ASSIGN(auto fs, MakeSyscallOps(view->mountpoint(), nullptr));
  auto read_plan = [&] {
    auto fd = fs->Open("memories/teams/eng/bob-read", O_RDONLY);
    if (!fd) return fd.error().code;
    (void)fs->Close(*fd);
    return 0;
  };
  auto stat_plan = [&] {
    auto st = fs->Stat("memories/teams/eng/bob-stat");
    return st ? 0 : st.error().code;
  };
  ASSERT_EQ(read_plan(), 0);
  ASSERT_EQ(stat_plan(), 0);
  ASSERT_OK_AND_ASSIGN(auto engine, store::Engine::Open(fixture->db(), false));
  ASSERT_OK(store::RemoveMember(*engine, "admin", "eng", "bob"));
  // stat first: a refused open makes the kernel look the whole path up again.
  auto unseen = SecondsUntil(stat_plan, ENOENT, std::chrono::seconds(6));
  ASSERT_TRUE(unseen.has_value()) << "bob still stats eng's files 6 s later";
  std::printf("revocation reached the mount after %.2f s\n", *unseen);
  EXPECT_LT(*unseen, 4.0);
  EXPECT_EQ(read_plan(), ENOENT);

  auto read_own = [&] {
    auto st = fs->Stat("memories/users/bob");
    return st ? 0 : st.error().code;
  };
  ASSERT_EQ(read_own(), 0);
  ASSERT_OK(store::SetUserDisabled(*engine, "admin", "bob", true));
  auto disabled = SecondsUntil(read_own, EACCES, std::chrono::seconds(6));
  ASSERT_TRUE(disabled.has_value()) << "a disabled user still works 6 s later";
  std::printf("disabling reached the mount after %.2f s\n", *disabled);
  fs.reset();
  EXPECT_EQ(view->Stop(), 0) << view->Log();
}

// A file opened before its writer lost the grant commits nothing at close,
// and a token replaced with `agentvfs user token` stops the mount that
// signed in with it.
TEST_P(AuthMatrixTest, AnOpenFileAndAReplacedTokenLoseAccessOnALiveMount) {
  auto fixture = MakeStore(GetParam());
  ASSERT_NE(fixture, nullptr);
  TempDir ws("agentvfs-ws"), mnt("agentvfs-mnt");
  std::string error;
  auto view = MountedView::Start(ws.path(), mnt.path(),
                                 fixture->MountArgs("bob"), &error);
  ASSERT_NE(view, nullptr) << error;
  ASSERT_OK_AND_ASSIGN(auto fs, MakeSyscallOps(view->mountpoint(), nullptr));
  ASSERT_OK_AND_ASSIGN(auto fd, fs->Open("memories/teams/eng/bob-overwrite",
                                         O_WRONLY | O_TRUNC));
  ASSERT_TRUE(fs->Write(fd, "late\n", 5).has_value());
  ASSERT_OK_AND_ASSIGN(auto engine, store::Engine::Open(fixture->db(), false));
  ASSERT_OK(store::RemoveMember(*engine, "admin", "eng", "bob"));
  auto gone = SecondsUntil(
      [&] {
        auto st = fs->Stat("memories/teams/eng/bob-read");
        return st ? 0 : st.error().code;
      },
      ENOENT, std::chrono::seconds(6));
  ASSERT_TRUE(gone.has_value()) << "bob still sees eng's files 6 s later";
  auto closed = fs->Close(fd);
  EXPECT_FALSE(closed.has_value()) << "the close committed after the revoke";
  auto backend = fixture->OpenBackend();
  ASSERT_OK_AND_ASSIGN(
      auto history,
      backend->History(fixture->CallerFor("alice"),
                       *vfs::Path::Parse("/memories/teams/eng/bob-overwrite")));
  EXPECT_EQ(history.size(), 1u) << "only the admin's seed";

  auto stat_own = [&] {
    auto st = fs->Stat("memories/users/bob");
    return st ? 0 : st.error().code;
  };
  ASSERT_EQ(stat_own(), 0);
  ASSERT_OK(store::RotateToken(*engine, "admin", "bob"));
  auto stopped = SecondsUntil(stat_own, EACCES, std::chrono::seconds(6));
  ASSERT_TRUE(stopped.has_value())
      << "a mount signed in with a replaced token still works 6 s later";
  std::printf("a replaced token stopped the mount after %.2f s\n", *stopped);
  fs.reset();
  EXPECT_EQ(view->Stop(), 0) << view->Log();
}

}  // namespace
}  // namespace agentvfs::conformance
