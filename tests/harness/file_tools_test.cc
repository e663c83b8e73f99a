// The text-editor and memory tools through a real router (local_dir at
// /workspace, the SQLite store at /memories and /skills), as a store user.
#include "harness/file_tools.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "backends/local_dir/local_dir.h"
#include "backends/store/admin.h"
#include "backends/store/skills.h"
#include "harness/prompt.h"
#include "tests/support/files.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::testing {
namespace {

using harness::FileTools;
using harness::ToolResult;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

class FileToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = StoreFixture::Create({"alice", "bob"},
                                      {{"alice", {"eng"}}, {"bob", {"eng"}}});
    ASSERT_TRUE(store.has_value()) << store.error().message;
    store_ = std::move(*store);
    ws_ = std::make_unique<TempDir>("agentvfs-tools-ws");
    router_ = store_->MakeRouter();
    auto local = backends::LocalDirBackend::Open(ws_->path());
    ASSERT_TRUE(local.has_value());
    ASSERT_TRUE(
        router_->Mount("/workspace", router_->Adopt(std::move(*local))));
    alice_ = std::make_unique<FileTools>(*router_,
                                         store_->CallerFor("alice", "s-a"));
  }
  ToolResult Edit(const json& input) { return alice_->Editor(input); }
  ToolResult Mem(const json& input) { return alice_->Memory(input); }
  std::string Host(const std::string& rel) {
    return ReadFile(ws_->Sub(rel)).value_or("<missing>");
  }

  std::unique_ptr<StoreFixture> store_;
  std::unique_ptr<TempDir> ws_;
  std::unique_ptr<router::Router> router_;
  std::unique_ptr<FileTools> alice_;
};

TEST_F(FileToolsTest, ViewNumbersLinesAndHonoursARange) {
  std::ofstream(ws_->Sub("a.txt")) << "one\ntwo\nthree\nfour\n";
  auto r = Edit({{"command", "view"}, {"path", "/workspace/a.txt"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(r.text,
            "Here's the content of /workspace/a.txt with line numbers:\n"
            "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n");
  r = Edit({{"command", "view"},
            {"path", "/workspace/a.txt"},
            {"view_range", {2, 3}}});
  EXPECT_THAT(r.text, HasSubstr("     2\ttwo\n     3\tthree\n"));
  EXPECT_THAT(r.text, Not(HasSubstr("four")));
  r = Edit({{"command", "view"},
            {"path", "/workspace/a.txt"},
            {"view_range", {3, -1}}});
  EXPECT_THAT(r.text, HasSubstr("     3\tthree\n     4\tfour\n"));
  r = Edit({{"command", "view"},
            {"path", "/workspace/a.txt"},
            {"view_range", {3, 9}}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("has 4 lines"));
}

TEST_F(FileToolsTest, ViewListsADirectoryTwoLevelsDeep) {
  for (const char* d :
       {"src", "src/deep", "src/deep/deeper", ".git", "node_modules"})
    ASSERT_EQ(mkdir(ws_->Sub(d).c_str(), 0755), 0);
  std::ofstream(ws_->Sub("src/main.py")) << "print(1)\n";
  std::ofstream(ws_->Sub("src/deep/deeper/hidden-by-depth.txt")) << "x";
  std::ofstream(ws_->Sub(".env")) << "SECRET=1";
  auto r = Edit({{"command", "view"}, {"path", "/workspace"}});
  ASSERT_FALSE(r.is_error) << r.text;
  EXPECT_THAT(r.text, HasSubstr("up to 2 levels deep in /workspace"));
  EXPECT_THAT(r.text, HasSubstr("9\t/workspace/src/main.py\n"));
  EXPECT_THAT(r.text, HasSubstr("/workspace/src/deep/\n"));
  EXPECT_THAT(r.text, Not(HasSubstr("deeper/")));
  EXPECT_THAT(r.text, Not(HasSubstr(".git")));
  EXPECT_THAT(r.text, Not(HasSubstr(".env")));
  EXPECT_THAT(r.text, Not(HasSubstr("/workspace/node_modules")));
}

TEST_F(FileToolsTest, CreateWritesTheFileEditorOverwritesMemoryDoesNot) {
  auto r = Edit({{"command", "create"},
                 {"path", "/workspace/new.md"},
                 {"file_text", "hello\n"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(Host("new.md"), "hello\n");
  r = Edit({{"command", "create"},
            {"path", "/workspace/new.md"},
            {"file_text", "again\n"}});
  EXPECT_FALSE(r.is_error);
  EXPECT_EQ(Host("new.md"), "again\n");
  // Both make missing folders.
  r = Edit({{"command", "create"},
            {"path", "/workspace/src/lib/util.py"},
            {"file_text", "x = 1\n"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(Host("src/lib/util.py"), "x = 1\n");
  // The memory tool never overwrites.
  r = Mem({{"command", "create"},
           {"path", "/memories/users/alice/projects/x/notes.md"},
           {"file_text", "first\n"}});
  EXPECT_FALSE(r.is_error) << r.text;
  r = Mem({{"command", "create"},
           {"path", "/memories/users/alice/projects/x/notes.md"},
           {"file_text", "second\n"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("already exists"));
  auto v = Mem({{"command", "view"},
                {"path", "/memories/users/alice/projects/x/notes.md"}});
  EXPECT_THAT(v.text, HasSubstr("     1\tfirst\n"));
}

// The memory tool stays in /memories: it follows no symlink, since one in
// /memories may lead anywhere in the store (here /skills). The editor tool
// follows links as any program does.
TEST_F(FileToolsTest, TheMemoryToolFollowsNoSymlink) {
  ASSERT_FALSE(Mem({{"command", "create"},
                    {"path", "/memories/users/alice/real.md"},
                    {"file_text", "one\n"}})
                   .is_error);
  auto alice = store_->CallerFor("alice", "s-a");
  ASSERT_TRUE(router_->Symlink(alice, "/memories/users/alice/real.md",
                               *vfs::Path::Parse("/memories/users/alice/l")));
  ASSERT_TRUE(router_->Symlink(alice, "/skills",
                               *vfs::Path::Parse("/memories/users/alice/up")));
  for (const json& in :
       {json{{"command", "str_replace"},
             {"path", "/memories/users/alice/l"},
             {"old_str", "one"},
             {"new_str", "two"}},
        json{{"command", "view"}, {"path", "/memories/users/alice/l"}},
        json{{"command", "view"}, {"path", "/memories/users/alice/up/x"}},
        json{{"command", "create"},
             {"path", "/memories/users/alice/up/new.md"},
             {"file_text", "x"}}}) {
    ToolResult r = Mem(in);
    EXPECT_TRUE(r.is_error) << in.dump();
    EXPECT_THAT(r.text, HasSubstr("is a symlink")) << in.dump();
  }
  ToolResult real =
      Mem({{"command", "view"}, {"path", "/memories/users/alice/real.md"}});
  EXPECT_THAT(real.text, HasSubstr("one"));
  EXPECT_THAT(real.text, Not(HasSubstr("two")));
  ToolResult via_editor =
      Edit({{"command", "view"}, {"path", "/memories/users/alice/l"}});
  EXPECT_FALSE(via_editor.is_error) << via_editor.text;
  EXPECT_THAT(via_editor.text, HasSubstr("one"));
}

TEST_F(FileToolsTest, StrReplaceNeedsExactlyOneVerbatimOccurrence) {
  std::ofstream(ws_->Sub("c.py")) << "a = 1\nb = 2\na = 1\nc = 3\n";
  auto r = Edit({{"command", "str_replace"},
                 {"path", "/workspace/c.py"},
                 {"old_str", "z = 9"},
                 {"new_str", "z = 10"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("did not appear verbatim in /workspace/c.py"));
  r = Edit({{"command", "str_replace"},
            {"path", "/workspace/c.py"},
            {"old_str", "a = 1"},
            {"new_str", "a = 5"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("Multiple occurrences"));
  EXPECT_THAT(r.text, HasSubstr("lines [1, 3]"));
  EXPECT_EQ(Host("c.py"), "a = 1\nb = 2\na = 1\nc = 3\n");  // untouched
  r = Edit({{"command", "str_replace"},
            {"path", "/workspace/c.py"},
            {"old_str", "b = 2\na = 1"},
            {"new_str", "b = 20\na = 10"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(Host("c.py"), "a = 1\nb = 20\na = 10\nc = 3\n");
  EXPECT_THAT(r.text, HasSubstr("     2\tb = 20\n     3\ta = 10\n"));
  // new_str may be omitted: the text is deleted.
  r = Edit({{"command", "str_replace"},
            {"path", "/workspace/c.py"},
            {"old_str", "c = 3\n"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(Host("c.py"), "a = 1\nb = 20\na = 10\n");
}

// A common old_str in a big file: the matches are counted in one pass and
// only the first lines are listed, so the refusal stays short (it goes to
// the model) and quick; a long old_str is echoed cut, at a character.
TEST_F(FileToolsTest, ARefusalListsAFewMatchesAndEchoesALongOldStrCut) {
  {
    std::ofstream f(ws_->Sub("big.txt"));
    for (int i = 0; i < 100000; ++i) f << "the lazy dog, the lazy cat\n";
  }
  auto r = Edit({{"command", "str_replace"},
                 {"path", "/workspace/big.txt"},
                 {"old_str", "the lazy"},
                 {"new_str", "a busy"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("Multiple occurrences (200000)"));
  EXPECT_THAT(r.text, HasSubstr("lines [1, 2, 3, "));
  EXPECT_THAT(r.text, HasSubstr(", 20, ...]"));
  EXPECT_LT(r.text.size(), 1024u) << r.text.substr(0, 300);
  // 1020 bytes of 'q' then two-byte characters: the cut at 1024 bytes
  // falls inside one and moves back to its start.
  std::string long_str = std::string(1021, 'q') + "\u00e9\u00e9\u00e9";
  r = Edit({{"command", "str_replace"},
            {"path", "/workspace/big.txt"},
            {"old_str", long_str},
            {"new_str", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text,
              HasSubstr(std::string(1021, 'q') + "\u00e9[... 4 more bytes]"));
}

// An edit that would take a file past what the tools handle is refused
// before anything is written.
TEST_F(FileToolsTest, AnEditThatWouldMakeTheFileTooBigIsRefused) {
  const std::string body(harness::kMaxToolFileBytes - 10, 'a');
  { std::ofstream(ws_->Sub("full.txt")) << body; }
  auto r = Edit({{"command", "insert"},
                 {"path", "/workspace/full.txt"},
                 {"insert_line", 0},
                 {"insert_text", std::string(64, 'b')}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("over the 16.0MB the file tools handle; "
                                "nothing was changed"));
  EXPECT_EQ(Host("full.txt").size(), body.size());
}

TEST_F(FileToolsTest, InsertPutsTextAfterTheGivenLine) {
  std::ofstream(ws_->Sub("i.txt")) << "one\ntwo";  // no final newline
  auto r = Edit({{"command", "insert"},
                 {"path", "/workspace/i.txt"},
                 {"insert_line", 0},
                 {"insert_text", "zero"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(Host("i.txt"), "zero\none\ntwo");
  r = Edit({{"command", "insert"},
            {"path", "/workspace/i.txt"},
            {"insert_line", 3},
            {"insert_text", "three\n"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(Host("i.txt"), "zero\none\ntwo\nthree\n");
  r = Edit({{"command", "insert"},
            {"path", "/workspace/i.txt"},
            {"insert_line", 2},
            {"new_str", "one and a half"}});  // the older argument name
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_EQ(Host("i.txt"), "zero\none\none and a half\ntwo\nthree\n");
  r = Edit({{"command", "insert"},
            {"path", "/workspace/i.txt"},
            {"insert_line", 9},
            {"insert_text", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("not within [0, 5]"));
}

TEST_F(FileToolsTest, TheMemoryToolDeletesAndRenamesInsideMemoriesOnly) {
  ASSERT_FALSE(Mem({{"command", "create"},
                    {"path", "/memories/users/alice/a/b.md"},
                    {"file_text", "b"}})
                   .is_error);
  auto r = Mem({{"command", "rename"},
                {"old_path", "/memories/users/alice/a/b.md"},
                {"new_path", "/memories/users/alice/c/d.md"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_THAT(
      Mem({{"command", "view"}, {"path", "/memories/users/alice/c/d.md"}}).text,
      HasSubstr("     1\tb\n"));
  r = Mem({{"command", "delete"}, {"path", "/memories/users/alice/c"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_TRUE(
      Mem({{"command", "view"}, {"path", "/memories/users/alice/c"}}).is_error);
  for (const json& outside : {json{{"command", "view"}, {"path", "/workspace"}},
                              json{{"command", "delete"}, {"path", "/skills"}},
                              json{{"command", "rename"},
                                   {"old_path", "/memories/users/alice/a"},
                                   {"new_path", "/workspace/a"}}}) {
    auto o = Mem(outside);
    EXPECT_TRUE(o.is_error) << outside.dump();
    EXPECT_THAT(o.text, HasSubstr("/memories only")) << outside.dump();
  }
  r = Mem({{"command", "delete"}, {"path", "/memories"}});
  EXPECT_TRUE(r.is_error);
}

TEST_F(FileToolsTest, ALineLongerThanTheViewShowsItsStart) {
  std::ofstream(ws_->Sub("min.js")) << std::string(300 * 1024, 'x') << "\n";
  auto r = Edit({{"command", "view"}, {"path", "/workspace/min.js"}});
  EXPECT_FALSE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("start of line 1"));
  EXPECT_THAT(r.text, HasSubstr("xxxxxxxx"));
}

TEST_F(FileToolsTest, MalformedInputBecomesAnErrorResult) {
  for (const json& bad :
       {json::array(), json{{"path", "/workspace/a"}},
        json{{"command", "explode"}, {"path", "/workspace/a"}},
        json{{"command", "view"}}, json{{"command", "view"}, {"path", 7}},
        json{{"command", "view"}, {"path", "relative/a.txt"}},
        json{{"command", "view"}, {"path", "/workspace/../../etc/passwd"}},
        json{{"command", "create"}, {"path", "/workspace/a"}},
        json{{"command", "insert"},
             {"path", "/workspace/a"},
             {"insert_line", "1"},
             {"insert_text", "x"}},
        json{{"command", "delete"}, {"path", "/workspace/a"}}}) {
    auto r = Edit(bad);
    EXPECT_TRUE(r.is_error) << bad.dump();
    EXPECT_THAT(r.text, HasSubstr("Error: ")) << bad.dump();
  }
}

// Errors name files as the model knows them (/workspace/...), never as
// the workspace backend does from its own root; a symlink's target is
// shown as it is.
TEST_F(FileToolsTest, ErrorsNameTheWorkspacePathsTheModelUsed) {
  auto r = Edit({{"command", "view"}, {"path", "/workspace/missing.txt"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("/workspace/missing.txt"));
  EXPECT_THAT(r.text, Not(HasSubstr(" /missing.txt")));
  ASSERT_TRUE(WriteFile(ws_->Sub("afile"), "a file\n"));
  r = Edit({{"command", "create"},
            {"path", "/workspace/afile/x.txt"},
            {"file_text", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("/workspace/afile/x.txt"));
  EXPECT_THAT(r.text, Not(HasSubstr(" /afile/x.txt")));
  ASSERT_EQ(symlink("/etc/passwd", ws_->Sub("esc").c_str()), 0);
  r = Edit({{"command", "view"}, {"path", "/workspace/esc"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("/workspace/esc"));
  EXPECT_THAT(r.text, Not(HasSubstr("/workspace/etc/passwd")));
  r = Edit({{"command", "create"}, {"path", "/workspace"}, {"file_text", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, Not(HasSubstr(" /:"))) << r.text;
  // A mount point's EBUSY is no write conflict: no advice to redo.
  r = Mem({{"command", "rename"},
           {"old_path", "/memories"},
           {"new_path", "/memories/users/alice/m"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("mount point"));
  EXPECT_THAT(r.text, Not(HasSubstr("was not saved")));
  // A file path cannot end with '/'.
  r = Edit(
      {{"command", "create"}, {"path", "/workspace/dir/"}, {"file_text", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("ends with '/', which names a directory"));
  EXPECT_NE(access(ws_->Sub("dir").c_str(), F_OK), 0);
  // Nor with '/.' or '/..' (normalised away, `a.txt/.` wrote a.txt).
  for (const char* p : {"/workspace/a.txt/.", "/workspace/b/.."}) {
    r = Edit({{"command", "create"}, {"path", p}, {"file_text", "x"}});
    EXPECT_TRUE(r.is_error) << p;
    EXPECT_THAT(r.text, HasSubstr("which names a directory")) << p;
  }
  EXPECT_NE(access(ws_->Sub("a.txt").c_str(), F_OK), 0);
}

// A symlink to a directory is listed as its directory; one that leads out
// of the view is refused as before.
TEST_F(FileToolsTest, ViewListsTheDirectoryASymlinkLeadsTo) {
  ASSERT_EQ(mkdir(ws_->Sub("real").c_str(), 0755), 0);
  std::ofstream(ws_->Sub("real/a.txt")) << "a\n";
  ASSERT_EQ(symlink("real", ws_->Sub("link").c_str()), 0);
  ASSERT_EQ(symlink("link", ws_->Sub("link2").c_str()), 0);
  for (const char* p : {"/workspace/link", "/workspace/link2"}) {
    auto r = Edit({{"command", "view"}, {"path", p}});
    EXPECT_FALSE(r.is_error) << r.text;
    EXPECT_THAT(r.text, HasSubstr("in /workspace/real (" + std::string(p) +
                                  " is a symlink to it)"));
    EXPECT_THAT(r.text, HasSubstr("/workspace/real/a.txt"));
  }
  ASSERT_EQ(symlink("/etc", ws_->Sub("out").c_str()), 0);
  auto r = Edit({{"command", "view"}, {"path", "/workspace/out"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, Not(HasSubstr("passwd")));
}

// A folder the caller may not remove (a grant starts there) is refused
// before anything in it is deleted.
TEST_F(FileToolsTest, ADeleteThatWouldBeRefusedDeletesNothing) {
  auto admin_backend = store_->OpenBackend();
  vfs::Caller admin = store_->CallerFor("admin", "s-admin");
  ASSERT_TRUE(store::Grant(admin_backend->engine(), "admin", "/memories/org/a",
                           store::Subject{"user", "alice"},
                           store::Level::kWrite));
  FileTools as_admin(*router_, admin);
  for (const char* f : {"/memories/org/a/c.md", "/memories/org/a/d/e.md"})
    ASSERT_FALSE(
        as_admin
            .Memory({{"command", "create"}, {"path", f}, {"file_text", "x"}})
            .is_error);
  auto r = Mem({{"command", "delete"}, {"path", "/memories/org/a"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("may not remove or move /memories/org/a"))
      << r.text;
  EXPECT_THAT(r.text, Not(HasSubstr("deleted before this")));
  for (const char* f : {"/memories/org/a/c.md", "/memories/org/a/d/e.md"})
    EXPECT_TRUE(router_->Stat(admin, *vfs::Path::Parse(f))) << f;
}

// Deleting a folder empties it first: when the removal of something in it
// is then refused (another session is writing a file there), the result
// says what is gone already.
TEST_F(FileToolsTest, AFailedDeleteSaysWhatItDeletedFirst) {
  auto admin_backend = store_->OpenBackend();
  vfs::Caller admin = store_->CallerFor("admin", "s-admin");
  ASSERT_TRUE(store::Grant(admin_backend->engine(), "admin", "/memories/org/a",
                           store::Subject{"user", "alice"},
                           store::Level::kWrite));
  FileTools as_admin(*router_, admin);
  for (const char* f : {"/memories/org/a/c.md", "/memories/org/a/d.md"})
    ASSERT_FALSE(
        as_admin
            .Memory({{"command", "create"}, {"path", f}, {"file_text", "x"}})
            .is_error);
  ASSERT_FALSE(as_admin
                   .Memory({{"command", "rename"},
                            {"old_path", "/memories/org/a/c.md"},
                            {"new_path", "/memories/org/a/b/a.md"}})
                   .is_error);
  // Another session has b/held.md open for writing (its lease: EBUSY).
  auto held =
      router_->Open(admin, *vfs::Path::Parse("/memories/org/a/b/held.md"),
                    O_WRONLY | O_CREAT, 0644);
  ASSERT_TRUE(held.has_value()) << held.error().message;
  auto r = Mem({{"command", "delete"}, {"path", "/memories/org/a/b"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("(1 entry inside /memories/org/a/b was "
                                "deleted before this"))
      << r.text;
  EXPECT_THAT(r.text, HasSubstr("held.md is open for writing"));
}

TEST_F(FileToolsTest, GrantsApplyAsForEveryOtherEntryPoint) {
  FileTools bob(*router_, store_->CallerFor("bob", "s-b"));
  ASSERT_FALSE(bob.Memory({{"command", "create"},
                           {"path", "/memories/users/bob/private.md"},
                           {"file_text", "bob only"}})
                   .is_error);
  auto r =
      Mem({{"command", "view"}, {"path", "/memories/users/bob/private.md"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, Not(HasSubstr("bob only")));
  r = Mem({{"command", "view"}, {"path", "/memories/users"}});
  EXPECT_THAT(r.text, Not(HasSubstr("bob")));
  EXPECT_THAT(r.text, HasSubstr("Here are the files"));  // it was listed
  r = Mem({{"command", "view"}, {"path", "/memories/users/bob/private.md"}});
  EXPECT_THAT(r.text, HasSubstr("no such file"));
  // The error names the path, as every other does.
  EXPECT_THAT(r.text, HasSubstr("/memories/users/bob/private.md"));
  // /skills exists and is readable, not writable, for alice.
  r = Edit(
      {{"command", "create"}, {"path", "/skills/mine.md"}, {"file_text", "x"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("may not create /skills/mine.md"));
}

TEST_F(FileToolsTest, AConflictSaysWhoHoldsTheFileAndToReadItAgain) {
  ASSERT_FALSE(Mem({{"command", "create"},
                    {"path", "/memories/teams/eng/plan.md"},
                    {"file_text", "step 1\n"}})
                   .is_error);
  // bob is writing the file right now (a handle open for writing).
  auto bob_backend = store_->OpenBackend();
  auto held = bob_backend->Open(
      store_->CallerFor("bob", "s-b2"),
      *vfs::Path::Parse("/memories/teams/eng/plan.md"), O_WRONLY | O_APPEND, 0);
  ASSERT_TRUE(held.has_value()) << held.error().message;
  auto r = Mem({{"command", "str_replace"},
                {"path", "/memories/teams/eng/plan.md"},
                {"old_str", "step 1"},
                {"new_str", "step 1 (done)"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("bob"));
  EXPECT_THAT(r.text, HasSubstr("View /memories/teams/eng/plan.md again"));
  held->reset();
  // Once bob is done, the same call goes through.
  r = Mem({{"command", "str_replace"},
           {"path", "/memories/teams/eng/plan.md"},
           {"old_str", "step 1"},
           {"new_str", "step 1 (done)"}});
  EXPECT_FALSE(r.is_error) << r.text;
}

}  // namespace
}  // namespace agentvfs::testing

namespace agentvfs::testing {
namespace {

TEST_F(FileToolsTest, TheSystemPromptListsReadableSkillsAndWritableMemories) {
  std::string here = __FILE__;
  std::string skills = here.substr(0, here.rfind("/harness/")) + "/data/skills";
  auto backend = store_->OpenBackend();
  ASSERT_TRUE(store::ImportSkills(*backend, store_->CallerFor("admin"), skills)
                  .has_value());
  std::string p = harness::BuildSystemPrompt(*router_, backend->engine(),
                                             store_->CallerFor("alice", "p"));
  EXPECT_THAT(p, HasSubstr("user 'alice'"));
  EXPECT_THAT(p, HasSubstr("- csv-report (/skills/csv-report/SKILL.md): "
                           "Summarise a CSV file"));
  EXPECT_THAT(p, HasSubstr("- /memories/users/alice\n"));
  EXPECT_THAT(p, HasSubstr("- /memories/teams/eng\n"));
  EXPECT_THAT(p, Not(HasSubstr("/memories/users/bob")));
}

}  // namespace
}  // namespace agentvfs::testing
