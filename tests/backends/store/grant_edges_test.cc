// Grants at their edges, through the API, on each engine: what the auth
// matrix (tests/conformance) does not reach because it needs a file to move,
// a symlink to lead elsewhere, a handle to outlive a grant, or a token to be
// replaced. Users: alice and bob (team eng), carol (team ops, admin on
// /skills/tool).
#include <fcntl.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "backends/store/admin.h"
#include "backends/store/auth.h"
#include "backends/store/store.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using testing::StoreFixture;

class GrantEdgesTest : public ::testing::TestWithParam<testing::StoreEngine> {
 protected:
  void SetUp() override {
    auto f = StoreFixture::Create(
        {"alice", "bob", "carol"},
        {{"alice", {"eng"}}, {"bob", {"eng"}}, {"carol", {"ops"}}}, GetParam());
    ASSERT_TRUE(f.has_value()) << f.error().ToString();
    fixture_ = std::move(*f);
    // Grants are read afresh on every call, so that a change shows at once.
    StoreOptions options;
    options.auth_ttl = std::chrono::milliseconds(0);
    backend_ = fixture_->OpenBackend(options);
    ASSERT_NE(backend_, nullptr);
    alice_ = fixture_->CallerFor("alice");
    bob_ = fixture_->CallerFor("bob");
    carol_ = fixture_->CallerFor("carol");
    admin_ = fixture_->CallerFor("admin");
    ASSERT_OK(Grant(backend_->engine(), "admin", "/skills/tool",
                    Subject{"user", "carol"}, Level::kAdmin));
  }

  vfs::Path P(const std::string& p) { return *vfs::Path::Parse(p); }

  vfs::Status Put(const vfs::Caller& c, const std::string& path,
                  const std::string& data) {
    auto f = backend_->Open(c, P(path), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!f) return std::unexpected(f.error());
    auto n = (*f)->Write(data.data(), data.size(), 0);
    if (!n) return std::unexpected(n.error());
    return (*f)->Flush();
  }

  std::string Get(const vfs::Caller& c, const std::string& path) {
    auto f = backend_->Open(c, P(path), O_RDONLY, 0);
    if (!f) return "<" + vfs::ErrnoName(f.error().code) + ">";
    std::string out(4096, '\0');
    auto n = (*f)->Read(out.data(), out.size(), 0);
    if (!n) return "<" + vfs::ErrnoName(n.error().code) + ">";
    out.resize(*n);
    return out;
  }

  // The errno of opening `path` as `c` with `flags` (0 for success).
  int OpenErrno(const vfs::Caller& c, const std::string& path, int flags) {
    auto f = backend_->Open(c, P(path), flags, 0644);
    return f ? 0 : f.error().code;
  }

  std::unique_ptr<StoreFixture> fixture_;
  std::unique_ptr<StoreBackend> backend_;
  vfs::Caller alice_, bob_, carol_, admin_;
};

INSTANTIATE_TEST_SUITE_P(Engines, GrantEdgesTest,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

TEST_P(GrantEdgesTest, HistoryDoesNotFollowAFileToWhereTheCallerCannotRead) {
  const std::string shared = "/memories/teams/eng/plan.md";
  const std::string mine = "/memories/users/bob/plan.md";
  ASSERT_OK(Put(bob_, shared, "team plan\n"));
  ASSERT_OK(backend_->Rename(bob_, P(shared), P(mine), 0));
  ASSERT_OK(Put(bob_, mine, "bob's private plan\n"));

  // Nothing is at the team path now, and no deleted file was there.
  EXPECT_ERRNO(backend_->History(alice_, P(shared)), ENOENT);
  EXPECT_ERRNO(backend_->OpenVersion(alice_, P(shared), 2), ENOENT);
  EXPECT_ERRNO(backend_->Restore(alice_, P(shared), 2), ENOENT);
  EXPECT_EQ(Get(alice_, shared), "<ENOENT>");
  // Bob, at the file's place, sees all of it.
  ASSERT_OK_AND_ASSIGN(auto history, backend_->History(bob_, P(mine)));
  EXPECT_EQ(history.size(), 2u);
}

// A deleted file that is restored comes back holding the version restored,
// from the moment it has a name again: never, not even between two steps
// of the restore, with the content it had when it was deleted, which may
// have been written where the restorer cannot read.
TEST_P(GrantEdgesTest, ARestoredFileNeverShowsAVersionTheRestorerCannotRead) {
  const std::string shared = "/memories/teams/eng/plan.md";
  const std::string mine = "/memories/users/alice/plan.md";
  ASSERT_OK(Put(alice_, shared, "team plan\n"));  // version 1, the team's
  ASSERT_OK(backend_->Rename(alice_, P(shared), P(mine), 0));
  ASSERT_OK(Put(alice_, mine, "alice's private plan\n"));  // version 2
  // Alice still holds it open for writing when she deletes it (version 3).
  ASSERT_OK_AND_ASSIGN(auto held, backend_->Open(alice_, P(mine), O_WRONLY, 0));
  ASSERT_OK(backend_->Unlink(alice_, P(mine)));
  ASSERT_OK_AND_ASSIGN(auto seen, backend_->History(bob_, P(shared)));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].n, 1);

  // Her lease makes the restore fail, and it leaves nothing behind.
  EXPECT_ERRNO(backend_->Restore(bob_, P(shared), 1), EBUSY);
  EXPECT_EQ(Get(bob_, shared), "<ENOENT>");
  EXPECT_EQ(Get(alice_, shared), "<ENOENT>");
  ASSERT_OK(held->Flush());
  held.reset();

  ASSERT_OK_AND_ASSIGN(auto restored, backend_->Restore(bob_, P(shared), 1));
  EXPECT_EQ(restored.path, shared);
  EXPECT_EQ(restored.author, "bob");
  EXPECT_EQ(Get(bob_, shared), "team plan\n");
  ASSERT_OK_AND_ASSIGN(auto after, backend_->History(bob_, P(shared)));
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[1].n, restored.n);
  EXPECT_EQ(after[1].content_hash, after[0].content_hash);
  // Its mode is the version's, and a reader sees its size at once.
  ASSERT_OK_AND_ASSIGN(auto st, backend_->Stat(bob_, P(shared)));
  EXPECT_EQ(st.st_size, 10);
  EXPECT_EQ(st.st_mode & 07777, 0644);
}

// history, cat --version and restore through a symlink into a folder the
// caller cannot read say of every name there what they say of a missing
// one: not whether it is a directory, a symlink, a file or nothing.
TEST_P(GrantEdgesTest, HistoryThroughALinkTellsNothingOfAHiddenFolder) {
  ASSERT_OK(backend_->Mkdir(alice_, P("/memories/users/alice/dir"), 0755));
  ASSERT_OK(Put(alice_, "/memories/users/alice/file.md", "alice's\n"));
  ASSERT_OK(
      backend_->Symlink(alice_, "file.md", P("/memories/users/alice/link")));
  ASSERT_OK(backend_->Symlink(bob_, "/memories/users/alice",
                              P("/memories/users/bob/l")));
  const std::string base = "/memories/users/bob/l/";
  auto answer = [&](const std::string& name, int which) {
    const std::string path = base + name;
    vfs::Error e;
    if (which == 0) {
      auto r = backend_->History(bob_, P(path));
      if (r) return std::string("<ok>");
      e = r.error();
    } else if (which == 1) {
      auto r = backend_->OpenVersion(bob_, P(path), 1);
      if (r) return std::string("<ok>");
      e = r.error();
    } else {
      auto r = backend_->Restore(bob_, P(path), 1);
      if (r) return std::string("<ok>");
      e = r.error();
    }
    std::string m = e.message;
    for (size_t at; (at = m.find(path)) != std::string::npos;)
      m.replace(at, path.size(), "PATH");
    return vfs::ErrnoName(e.code) + " " + m;
  };
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which == 0 ? "history" : which == 1 ? "version" : "restore");
    const std::string missing = answer("missing", which);
    EXPECT_EQ(missing.rfind("ENOENT", 0), 0u) << missing;
    for (const char* name : {"dir", "link", "file.md", "file.md/x", "dir/x"})
      EXPECT_EQ(answer(name, which), missing) << name;
  }
}

// Every operation through a symlink into a folder the caller cannot see
// fails there as it would for a missing name: a file, a symlink loop or a
// link out of the store in the middle of the path (ENOTDIR, ELOOP, EACCES
// where the caller could see) tells nothing.
TEST_P(GrantEdgesTest, APathThroughAHiddenFolderFailsAsAMissingOne) {
  ASSERT_OK(Put(alice_, "/memories/users/alice/file.md", "alice's\n"));
  ASSERT_OK(backend_->Symlink(alice_, "loop", P("/memories/users/alice/loop")));
  ASSERT_OK(backend_->Symlink(alice_, "/etc", P("/memories/users/alice/out")));
  ASSERT_OK(backend_->Symlink(bob_, "/memories/users/alice",
                              P("/memories/users/bob/l")));
  const std::string base = "/memories/users/bob/l/";
  auto errno_of = [](const auto& r) {
    return r ? std::string("<ok>") : vfs::ErrnoName(r.error().code);
  };
  auto answers = [&](const std::string& name) {
    const std::string p = base + name + "/x";
    std::vector<std::string> out;
    out.push_back(errno_of(backend_->Stat(bob_, P(p))));
    out.push_back(errno_of(backend_->ReadDir(bob_, P(p))));
    out.push_back(errno_of(backend_->Open(bob_, P(p), O_RDONLY, 0)));
    out.push_back(
        errno_of(backend_->Open(bob_, P(p), O_WRONLY | O_CREAT, 0644)));
    out.push_back(errno_of(backend_->Mkdir(bob_, P(p), 0755)));
    out.push_back(errno_of(backend_->Unlink(bob_, P(p))));
    out.push_back(errno_of(backend_->Rmdir(bob_, P(p))));
    out.push_back(errno_of(backend_->Symlink(bob_, "t", P(p))));
    out.push_back(errno_of(backend_->Truncate(bob_, P(p), 0)));
    out.push_back(errno_of(
        backend_->Rename(bob_, P(p), P("/memories/users/bob/moved"), 0)));
    out.push_back(
        errno_of(backend_->Rename(bob_, P("/memories/users/bob/l"), P(p), 0)));
    return out;
  };
  const auto missing = answers("missing");
  for (const auto& e : missing) EXPECT_EQ(e, "ENOENT");
  for (const char* name : {"file.md", "loop", "out"})
    EXPECT_EQ(answers(name), missing) << name;
  // Nor do the messages: through a link to a folder that does not exist
  // and through one to a hidden folder, the same words.
  ASSERT_OK(backend_->Symlink(bob_, "/memories/users/nobody",
                              P("/memories/users/bob/gone")));
  auto message = [&](const std::string& p) {
    auto r = backend_->Open(bob_, P(p), O_RDONLY, 0);
    if (r) return std::string("<ok>");
    std::string m = r.error().ToString();
    for (size_t at; (at = m.find(p)) != std::string::npos;)
      m.replace(at, p.size(), "PATH");
    return m;
  };
  EXPECT_EQ(message("/memories/users/bob/gone/x.md"),
            message("/memories/users/bob/l/x.md"));
  // Where the caller sees, the same paths keep their precise errors.
  ASSERT_OK(Put(bob_, "/memories/users/bob/mine.md", "bob's\n"));
  EXPECT_ERRNO(backend_->Stat(bob_, P("/memories/users/bob/mine.md/x")),
               ENOTDIR);
}

// A link that leads to a name in a hidden folder (a chain of links, when
// that name is a link too) answers as a link to a missing name does, even
// when the chain comes back where the caller sees: the kernel's walk
// through a mount would stop at the hidden folder.
TEST_P(GrantEdgesTest, ALinkToANameInAHiddenFolderTellsNothingOfIt) {
  ASSERT_OK(Put(alice_, "/memories/users/alice/file.md", "alice's\n"));
  ASSERT_OK(backend_->Symlink(alice_, "loop", P("/memories/users/alice/loop")));
  ASSERT_OK(backend_->Symlink(alice_, "/etc", P("/memories/users/alice/out")));
  ASSERT_OK(backend_->Symlink(alice_, "/memories/users/bob",
                              P("/memories/users/alice/back")));
  ASSERT_OK(backend_->Mkdir(alice_, P("/memories/users/alice/dir"), 0755));
  ASSERT_OK(Put(bob_, "/memories/users/bob/x", "bob's\n"));
  auto errno_of = [](const auto& r) {
    return r ? std::string("<ok>") : vfs::ErrnoName(r.error().code);
  };
  // What bob learns from paths through his link to alice's `name`.
  auto answers = [&](const std::string& name) {
    const std::string link = "/memories/users/bob/to-" + name;
    EXPECT_OK(
        backend_->Symlink(bob_, "/memories/users/alice/" + name, P(link)));
    const std::string p = link + "/x";
    std::vector<std::string> out;
    out.push_back(errno_of(backend_->Stat(bob_, P(p))));
    out.push_back(errno_of(backend_->ReadDir(bob_, P(p))));
    // ReadDir does not follow a link in the last place: the same answer
    // whatever it names.
    EXPECT_ERRNO(backend_->ReadDir(bob_, P(link)), ENOTDIR) << name;
    out.push_back(errno_of(backend_->Open(bob_, P(link), O_RDONLY, 0)));
    out.push_back(errno_of(backend_->Open(bob_, P(p), O_RDONLY, 0)));
    out.push_back(
        errno_of(backend_->Open(bob_, P(p), O_WRONLY | O_CREAT, 0644)));
    out.push_back(errno_of(backend_->Mkdir(bob_, P(p), 0755)));
    out.push_back(errno_of(backend_->Unlink(bob_, P(p))));
    out.push_back(errno_of(backend_->Truncate(bob_, P(p), 0)));
    out.push_back(errno_of(backend_->History(bob_, P(p))));
    return out;
  };
  const auto missing = answers("missing");
  for (const auto& e : missing) EXPECT_EQ(e, "ENOENT");
  for (const char* name : {"file.md", "loop", "out", "back", "dir"})
    EXPECT_EQ(answers(name), missing) << name;
  // Chains through folders the caller sees resolve as before.
  ASSERT_OK(backend_->Mkdir(alice_, P("/memories/teams/eng/shared"), 0755));
  ASSERT_OK(backend_->Symlink(alice_, "shared", P("/memories/teams/eng/link")));
  ASSERT_OK(backend_->Symlink(bob_, "/memories/teams/eng/link",
                              P("/memories/users/bob/to-team")));
  EXPECT_OK(backend_->Mkdir(bob_, P("/memories/users/bob/to-team/sub"), 0755));
  EXPECT_OK(backend_->Stat(alice_, P("/memories/teams/eng/shared/sub")));
  ASSERT_OK(backend_->Symlink(alice_, "/memories/users/alice/dir",
                              P("/memories/users/alice/to-dir")));
  EXPECT_OK(
      backend_->Mkdir(alice_, P("/memories/users/alice/to-dir/sub"), 0755));
  EXPECT_OK(backend_->Stat(alice_, P("/memories/users/alice/dir/sub")));
  // A listing goes through links on the way, not through one in the last
  // place (the Backend contract; the workspace backend does the same).
  EXPECT_OK(backend_->ReadDir(alice_, P("/memories/users/alice/to-dir/sub")));
  EXPECT_ERRNO(backend_->ReadDir(alice_, P("/memories/users/alice/to-dir")),
               ENOTDIR);
  // `..` or `.` after a file in a link's target is ENOTDIR, as in the
  // kernel, not a way up.
  ASSERT_OK(backend_->Symlink(alice_, "file.md/../dir",
                              P("/memories/users/alice/via-file")));
  ASSERT_OK(backend_->Symlink(alice_, "file.md/.",
                              P("/memories/users/alice/file-dot")));
  ASSERT_OK(Put(alice_, "/memories/users/alice/dir/x", "x\n"));
  EXPECT_ERRNO(backend_->Stat(alice_, P("/memories/users/alice/via-file/x")),
               ENOTDIR);
  EXPECT_ERRNO(
      backend_->Open(alice_, P("/memories/users/alice/file-dot"), O_RDONLY, 0),
      ENOTDIR);
}

// Restore makes the missing directories above a deleted file only where
// the restorer may create them.
TEST_P(GrantEdgesTest, RestoreMakesNoDirectoryTheCallerCouldNotMake) {
  const std::string dir = "/memories/org/runbooks";
  const std::string file = dir + "/oncall.md";
  ASSERT_OK(backend_->Mkdir(admin_, P(dir), 0755));
  ASSERT_OK(Put(admin_, file, "page the lead\n"));
  ASSERT_OK(Grant(backend_->engine(), "admin", file, Subject{"user", "bob"},
                  Level::kWrite));
  ASSERT_OK(backend_->Unlink(admin_, P(file)));
  ASSERT_OK(backend_->Rmdir(admin_, P(dir)));

  EXPECT_ERRNO(backend_->Restore(bob_, P(file), 1), EACCES);
  EXPECT_ERRNO(backend_->Stat(admin_, P(dir)), ENOENT);
  // Once the directory is there again, bob restores the file he may write.
  ASSERT_OK(backend_->Mkdir(admin_, P(dir), 0755));
  ASSERT_OK(backend_->Restore(bob_, P(file), 1));
  EXPECT_EQ(Get(bob_, file), "page the lead\n");
}

TEST_P(GrantEdgesTest, VersionsMadeWhereTheCallerCannotReadStayHidden) {
  const std::string draft = "/memories/users/bob/draft.md";
  const std::string shared = "/memories/teams/eng/draft.md";
  ASSERT_OK(Put(bob_, draft, "private first thoughts\n"));
  ASSERT_OK(backend_->Rename(bob_, P(draft), P(shared), 0));
  ASSERT_OK(Put(bob_, shared, "for the team\n"));

  ASSERT_OK_AND_ASSIGN(auto seen, backend_->History(alice_, P(shared)));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].n, 2);
  EXPECT_EQ(seen[0].path, shared);
  EXPECT_ERRNO(backend_->OpenVersion(alice_, P(shared), 1), ENOENT);
  EXPECT_ERRNO(backend_->Restore(alice_, P(shared), 1), ENOENT);
  EXPECT_EQ(Get(alice_, shared), "for the team\n");
  ASSERT_OK_AND_ASSIGN(auto all, backend_->History(bob_, P(shared)));
  EXPECT_EQ(all.size(), 2u);
}

TEST_P(GrantEdgesTest, PurgeNeedsAdminWhereTheFileIsNotWhereThePathLeads) {
  const std::string bobs = "/memories/users/bob/notes.md";
  ASSERT_OK(Put(bob_, bobs, "bob's notes\n"));
  ASSERT_OK(backend_->Mkdir(carol_, P("/skills/tool"), 0755));
  // Carol is admin below /skills/tool; the link there leads to bob's folder.
  ASSERT_OK(
      backend_->Symlink(carol_, "/memories/users/bob", P("/skills/tool/l")));
  auto purged = backend_->Purge(carol_, P("/skills/tool/l/notes.md"), false);
  ASSERT_FALSE(purged.has_value());
  EXPECT_TRUE(purged.error().code == ENOENT || purged.error().code == EACCES)
      << purged.error().ToString();
  EXPECT_EQ(Get(bob_, bobs), "bob's notes\n");
  ASSERT_OK_AND_ASSIGN(auto history, backend_->History(bob_, P(bobs)));
  EXPECT_EQ(history.size(), 1u);

  // Nor may she erase versions made where she is not admin: a file of
  // team eng that she (as a member) moved into her own area.
  ASSERT_OK(AddMember(backend_->engine(), "admin", "eng", "carol"));
  ASSERT_OK(Put(carol_, "/memories/teams/eng/plan.md", "eng's plan\n"));
  ASSERT_OK(backend_->Rename(carol_, P("/memories/teams/eng/plan.md"),
                             P("/skills/tool/plan.md"), 0));
  EXPECT_ERRNO(backend_->Purge(carol_, P("/skills/tool/plan.md"), false),
               EACCES);
  ASSERT_OK_AND_ASSIGN(auto kept,
                       backend_->History(admin_, P("/skills/tool/plan.md")));
  EXPECT_EQ(kept.size(), 1u);
  // Her own files she may purge.
  ASSERT_OK(Put(carol_, "/skills/tool/old.md", "old\n"));
  ASSERT_OK_AND_ASSIGN(
      auto report, backend_->Purge(carol_, P("/skills/tool/old.md"), false));
  EXPECT_EQ(report.files, 1);
}

TEST_P(GrantEdgesTest, CreatingOverAHiddenNameAnswersAsAMissingOneWould) {
  ASSERT_OK(Put(bob_, "/memories/users/bob/notes.md", "bob's\n"));
  ASSERT_OK(backend_->Symlink(bob_, "x", P("/memories/users/bob/s")));
  // A hidden directory and a missing one look alike.
  int hidden = OpenErrno(alice_, "/memories/users/bob", O_WRONLY | O_CREAT);
  int missing = OpenErrno(alice_, "/memories/users/nobody", O_WRONLY | O_CREAT);
  EXPECT_EQ(vfs::ErrnoName(hidden), vfs::ErrnoName(missing));
  EXPECT_EQ(vfs::ErrnoName(missing), "EACCES");

  // So do a hidden file and a missing one, reached through alice's own link.
  ASSERT_OK(backend_->Symlink(alice_, "/memories/users/bob",
                              P("/memories/users/alice/l")));
  for (int flags :
       {O_WRONLY | O_CREAT | O_EXCL, O_WRONLY | O_CREAT, O_RDONLY | O_CREAT}) {
    EXPECT_EQ(vfs::ErrnoName(
                  OpenErrno(alice_, "/memories/users/alice/l/notes.md", flags)),
              vfs::ErrnoName(
                  OpenErrno(alice_, "/memories/users/alice/l/none.md", flags)))
        << "flags " << flags;
  }
  // And a hidden symlink opened with O_NOFOLLOW, and a missing name.
  EXPECT_EQ(vfs::ErrnoName(OpenErrno(alice_, "/memories/users/alice/l/s",
                                     O_RDONLY | O_NOFOLLOW)),
            "ENOENT");
  EXPECT_EQ(Get(bob_, "/memories/users/bob/notes.md"), "bob's\n");
}

TEST_P(GrantEdgesTest, AHandleOpenedBeforeAGrantWentCommitsNothingAfter) {
  const std::string plan = "/memories/teams/eng/plan.md";
  ASSERT_OK(Put(alice_, plan, "v1\n"));
  ASSERT_OK_AND_ASSIGN(auto f,
                       backend_->Open(alice_, P(plan), O_WRONLY | O_TRUNC, 0));
  ASSERT_OK(f->Write("from an old handle\n", 19, 0));
  ASSERT_OK_AND_ASSIGN(auto attrs,
                       backend_->Open(alice_, P(plan), O_RDONLY, 0));
  ASSERT_OK(RemoveMember(backend_->engine(), "admin", "eng", "alice"));
  // Nor does it change modes or times.
  EXPECT_ERRNO(attrs->Chmod(0600), ENOENT);
  struct timespec times[2] = {{0, UTIME_OMIT}, {1000, 0}};
  EXPECT_ERRNO(attrs->Utimens(times), ENOENT);
  attrs.reset();
  ASSERT_OK_AND_ASSIGN(auto st, backend_->Stat(bob_, P(plan)));
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_NE(st.st_mtim.tv_sec, 1000);
  // The team's folder is out of her sight now: ENOENT, as for any path.
  auto flushed = f->Flush();
  ASSERT_FALSE(flushed.has_value());
  EXPECT_EQ(flushed.error().code, ENOENT) << flushed.error().ToString();
  EXPECT_NE(flushed.error().message.find("nothing was committed"),
            std::string::npos)
      << flushed.error().message;
  // The next write is told too; the one after goes into a new draft,
  // which commits nothing either.
  EXPECT_ERRNO(f->Write("again\n", 6, 0), ENOENT);
  ASSERT_OK(f->Write("again\n", 6, 0));
  EXPECT_ERRNO(f->Sync(false), ENOENT);
  f.reset();
  EXPECT_EQ(Get(bob_, plan), "v1\n");
  ASSERT_OK_AND_ASSIGN(auto history, backend_->History(bob_, P(plan)));
  EXPECT_EQ(history.size(), 1u);

  // A disabled user's open handle commits nothing either.
  ASSERT_OK_AND_ASSIGN(auto g,
                       backend_->Open(bob_, P(plan), O_WRONLY | O_TRUNC, 0));
  ASSERT_OK(g->Write("late\n", 5, 0));
  ASSERT_OK(SetUserDisabled(backend_->engine(), "admin", "bob", true));
  EXPECT_ERRNO(g->Flush(), EACCES);
  g.reset();
  ASSERT_OK_AND_ASSIGN(history, backend_->History(admin_, P(plan)));
  EXPECT_EQ(history.size(), 1u);
}

TEST_P(GrantEdgesTest, AReplacedTokenEndsTheSessionsThatSignedInWithIt) {
  backend_->auth().PinToken("alice", HashToken(fixture_->token("alice")));
  ASSERT_OK(backend_->Stat(alice_, P("/memories/users/alice")));
  ASSERT_OK(backend_->Stat(bob_, P("/memories/users/bob")));
  ASSERT_OK_AND_ASSIGN(auto fresh,
                       RotateToken(backend_->engine(), "alice", "alice"));
  auto st = backend_->Stat(alice_, P("/memories/users/alice"));
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ(st.error().code, EACCES);
  EXPECT_NE(st.error().message.find("replaced"), std::string::npos)
      << st.error().message;
  // Signing in again with the new token works; other users never noticed.
  ASSERT_OK_AND_ASSIGN(auto user, Authenticate(backend_->engine(), fresh));
  EXPECT_EQ(user, "alice");
  backend_->auth().PinToken("alice", HashToken(fresh));
  EXPECT_OK(backend_->Stat(alice_, P("/memories/users/alice")));
  EXPECT_OK(backend_->Stat(bob_, P("/memories/users/bob")));
}

TEST_P(GrantEdgesTest, TheDirectoryAGrantIsOnStaysWhereItIs) {
  const std::string team = "/memories/teams/eng";
  // Grantees change what is below it...
  ASSERT_OK(backend_->Mkdir(alice_, P(team + "/sub"), 0755));
  ASSERT_OK(backend_->Rename(alice_, P(team + "/sub"),
                             P("/memories/users/alice/sub"), 0));
  ASSERT_OK(backend_->Mkdir(alice_, P(team + "/gone"), 0755));
  ASSERT_OK(backend_->Rmdir(alice_, P(team + "/gone")));
  // ...but neither remove nor carry off the directory itself.
  EXPECT_ERRNO(
      backend_->Rename(alice_, P(team), P("/memories/users/alice/eng"), 0),
      EACCES);
  EXPECT_ERRNO(backend_->Rmdir(alice_, P(team)), EACCES);
  EXPECT_ERRNO(backend_->Rmdir(bob_, P("/memories/users/bob")), EACCES);
  // Nor replace it, or swap it, from their own folder.
  ASSERT_OK(backend_->Mkdir(alice_, P("/memories/users/alice/empty"), 0755));
  EXPECT_ERRNO(
      backend_->Rename(alice_, P("/memories/users/alice/empty"), P(team), 0),
      EACCES);
  EXPECT_ERRNO(backend_->Rename(alice_, P("/memories/users/alice/empty"),
                                P(team), RENAME_EXCHANGE),
               EACCES);
  EXPECT_OK(backend_->Stat(bob_, P(team)));
  // An admin may.
  EXPECT_OK(backend_->Rmdir(admin_, P(team)));
}

TEST_P(GrantEdgesTest, HardLinksStayUnderTheSameGrants) {
  const std::string plan = "/memories/teams/eng/plan.md";
  ASSERT_OK(Put(alice_, plan, "team plan\n"));
  // Into her own folder: the link would outlive her membership.
  EXPECT_ERRNO(
      backend_->Link(alice_, P(plan), P("/memories/users/alice/plan.md")),
      EXDEV);
  // Within the team's folder, and within her own, links are fine.
  EXPECT_OK(backend_->Link(alice_, P(plan), P("/memories/teams/eng/plan2.md")));
  ASSERT_OK(Put(alice_, "/memories/users/alice/a.md", "a\n"));
  ASSERT_OK(backend_->Mkdir(alice_, P("/memories/users/alice/d"), 0755));
  EXPECT_OK(backend_->Link(alice_, P("/memories/users/alice/a.md"),
                           P("/memories/users/alice/d/b.md")));
  // Nor can a second name made inside the team's folder be moved out,
  // alone or in a directory.
  EXPECT_ERRNO(backend_->Rename(alice_, P("/memories/teams/eng/plan2.md"),
                                P("/memories/users/alice/plan.md"), 0),
               EXDEV);
  ASSERT_OK(backend_->Mkdir(alice_, P("/memories/teams/eng/kit"), 0755));
  ASSERT_OK(
      backend_->Link(alice_, P(plan), P("/memories/teams/eng/kit/plan.md")));
  EXPECT_ERRNO(backend_->Rename(alice_, P("/memories/teams/eng/kit"),
                                P("/memories/users/alice/kit"), 0),
               EXDEV);
  ASSERT_OK(backend_->Mkdir(alice_, P("/memories/users/alice/swap"), 0755));
  EXPECT_ERRNO(backend_->Rename(alice_, P("/memories/users/alice/swap"),
                                P("/memories/teams/eng/kit"), RENAME_EXCHANGE),
               EXDEV);
  // A file with one name, or one moved within the team, moves freely.
  ASSERT_OK(Put(alice_, "/memories/teams/eng/single.md", "one name\n"));
  EXPECT_OK(backend_->Rename(alice_, P("/memories/teams/eng/single.md"),
                             P("/memories/users/alice/single.md"), 0));
  EXPECT_OK(backend_->Rename(alice_, P("/memories/teams/eng/kit"),
                             P("/memories/teams/eng/kit2"), 0));
  // After alice leaves the team nothing of it stays with her.
  ASSERT_OK(RemoveMember(backend_->engine(), "admin", "eng", "alice"));
  EXPECT_EQ(Get(alice_, "/memories/users/alice/plan.md"), "<ENOENT>");
  EXPECT_EQ(Get(alice_, plan), "<ENOENT>");
}

// A directory bob only passes through shows nothing of what it holds:
// neither a link count nor a size nor times that change when a user's or a
// team's folder comes or goes.
TEST_P(GrantEdgesTest, ADirectoryOnlyPassedThroughTellsNothingOfItsEntries) {
  ASSERT_OK_AND_ASSIGN(auto before, backend_->Stat(bob_, P("/memories/users")));
  ASSERT_OK_AND_ASSIGN(auto admin_before,
                       backend_->Stat(admin_, P("/memories/users")));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_OK(AddUser(backend_->engine(), "admin", "dave", {}));
  ASSERT_OK(AddTeam(backend_->engine(), "admin", "sales"));
  for (const char* dir : {"/memories/users", "/memories/teams", "/memories"}) {
    ASSERT_OK_AND_ASSIGN(auto st, backend_->Stat(bob_, P(dir)));
    EXPECT_TRUE(S_ISDIR(st.st_mode)) << dir;
    EXPECT_EQ(st.st_nlink, 1u) << dir;
    EXPECT_EQ(st.st_size, 0) << dir;
    EXPECT_EQ(st.st_mtim.tv_sec, 0) << dir;
    EXPECT_EQ(st.st_ctim.tv_sec, 0) << dir;
  }
  ASSERT_OK_AND_ASSIGN(auto after, backend_->Stat(bob_, P("/memories/users")));
  EXPECT_EQ(after.st_nlink, before.st_nlink);
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  // Who may read the directory sees it as it is.
  ASSERT_OK_AND_ASSIGN(auto admin_after,
                       backend_->Stat(admin_, P("/memories/users")));
  EXPECT_EQ(admin_after.st_nlink, admin_before.st_nlink + 1);
  EXPECT_NE(admin_after.st_mtim.tv_nsec, admin_before.st_mtim.tv_nsec);
  // Bob's own folder, which he reads, is shown as it is.
  ASSERT_OK_AND_ASSIGN(auto own,
                       backend_->Stat(bob_, P("/memories/users/bob")));
  EXPECT_EQ(own.st_nlink, 2u);
  EXPECT_GT(own.st_mtim.tv_sec, 0);
}

}  // namespace
}  // namespace agentvfs::store
