// The store's command line as a team lead and an engineer use it, with the
// real `agentvfs` binary on real SQLite files: init prints a token once and
// keeps only its hash; users, teams and grants are an admin's business;
// history / cat / restore / purge; skills import (validated), export and a
// mount that serves the imported skill with its script runnable.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/store/store.h"
#include "tests/e2e/e2e_support.h"

namespace agentvfs::e2e {
namespace {

using testing::CommandOptions;
using testing::CommandResult;
using testing::MountedView;
using testing::RunCommand;
using testing::TempDir;

const std::regex kTokenPattern("avfs_[0-9a-f]{64}");

// The first token in `text`, or "" when there is none.
std::string FindToken(const std::string& text) {
  std::smatch m;
  return std::regex_search(text, m, kTokenPattern) ? m.str() : "";
}

std::string RandomHex(size_t digits) {
  std::random_device rd;
  std::string out;
  while (out.size() < digits) out += "0123456789abcdef"[rd() % 16];
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// SHA-256 of `data` as hex, computed by coreutils (not by the code under
// test).
std::string Sha256Sum(const std::string& data) {
  CommandResult r =
      RunCommand({"sh", "-c", "printf %s \"$0\" | sha256sum", data});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  return r.output.substr(0, 64);
}

// Every byte of every file in `dir` (the database, its -wal and -shm files,
// and any draft left next to them), for grepping.
std::string AllFileBytes(const std::string& dir) {
  std::string all;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    all += ReadFile(e.path().string()).value_or("");
  }
  return all;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class StoreCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_dir_ = std::make_unique<TempDir>("agentvfs-cli-store");
    work_ = std::make_unique<TempDir>("agentvfs-cli-work");
    db_ = store_dir_->Sub("team.db");
  }

  // Runs `agentvfs ARGS` with no store and no token from the test's own
  // environment (nor from a config file) unless `env` gives them.
  CommandResult Cli(const std::vector<std::string>& args,
                    std::map<std::string, std::string> env = {}) {
    std::map<std::string, std::string> full = {
        {"AGENTVFS_STORE", ""},
        {"AGENTVFS_TOKEN", ""},
        {"AGENTVFS_CONFIG", work_->Sub("no-such-config.yaml")}};
    for (auto& [k, v] : env) full[k] = v;
    std::vector<std::string> argv = {AGENTVFS_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, CommandOptions{.env = full});
  }

  // `agentvfs ARGS` on this test's store as the owner of `token`.
  CommandResult As(const std::string& token,
                   const std::vector<std::string>& args) {
    return Cli(args, {{"AGENTVFS_STORE", db_}, {"AGENTVFS_TOKEN", token}});
  }

  // As(), failing the test unless the command exits 0; returns its output.
  std::string MustAs(const std::string& token,
                     const std::vector<std::string>& args) {
    CommandResult r = As(token, args);
    std::string cmd;
    for (const auto& a : args) cmd += " " + a;
    EXPECT_EQ(r.exit_status, 0) << "agentvfs" << cmd << ":\n" << r.output;
    return r.output;
  }

  // As(), expecting a refusal: exit status not 0 and a message on the
  // command's behalf containing `message`.
  void ExpectRefused(const std::string& token,
                     const std::vector<std::string>& args,
                     const std::string& message) {
    CommandResult r = As(token, args);
    std::string cmd;
    for (const auto& a : args) cmd += " " + a;
    EXPECT_NE(r.exit_status, 0) << "agentvfs" << cmd << " succeeded:\n"
                                << r.output;
    EXPECT_TRUE(Contains(r.output, "agentvfs " + args[0]))
        << "agentvfs" << cmd << ":\n"
        << r.output;
    EXPECT_TRUE(Contains(r.output, message))
        << "agentvfs" << cmd << " should say \"" << message << "\":\n"
        << r.output;
  }

  // `agentvfs init --store DB --admin lead`; returns lead's token.
  std::string Init() {
    CommandResult r = Cli({"init", "--store", db_, "--admin", "lead"});
    EXPECT_EQ(r.exit_status, 0) << r.output;
    std::string token = FindToken(r.output);
    EXPECT_FALSE(token.empty()) << r.output;
    return token;
  }

  // `user add NAME ARGS...` as `admin`; returns the new user's token.
  std::string AddUser(const std::string& admin, const std::string& name,
                      std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"user", "add", name};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string out = MustAs(admin, args);
    std::string token = FindToken(out);
    EXPECT_FALSE(token.empty()) << out;
    return token;
  }

  // Writes `data` to the store file `path` through the API as `user` (one
  // commit), with the store closed again afterwards.
  ::testing::AssertionResult ApiWrite(const std::string& user,
                                      const std::string& path,
                                      const std::string& data) {
    auto backend = store::StoreBackend::Open(db_);
    if (!backend) {
      return ::testing::AssertionFailure() << backend.error().ToString();
    }
    vfs::Caller caller;
    caller.user = user;
    caller.session = "api-" + user;
    auto p = vfs::Path::Parse(path);
    if (!p) return ::testing::AssertionFailure() << p.error().ToString();
    auto file =
        (*backend)->Open(caller, *p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!file) return ::testing::AssertionFailure() << file.error().ToString();
    auto put = (*file)->Write(data.data(), data.size(), 0);
    if (!put || *put != data.size()) {
      return ::testing::AssertionFailure() << "short write to " << path;
    }
    if (auto ok = (*file)->Flush(); !ok) {
      return ::testing::AssertionFailure() << ok.error().ToString();
    }
    return ::testing::AssertionSuccess();
  }

  // `agentvfs mount` of this test's store as the owner of `token` (handed
  // over in a file only the owner can read), with the workspace `ws`, at
  // `mnt`; nullptr and `error` when it does not mount.
  std::unique_ptr<MountedView> MountAs(const std::string& token,
                                       const TempDir& ws, const TempDir& mnt,
                                       std::string* error) {
    const std::string file = work_->Sub("mount.token");
    if (!WriteFile(file, token + "\n", 0600)) {
      *error = "cannot write " + file;
      return nullptr;
    }
    return MountedView::Start(ws.path(), mnt.path(),
                              {"--store", db_, "--token-file", file}, error);
  }

  // The versions `history --json` prints.
  std::vector<nlohmann::json> History(const std::string& token,
                                      const std::string& path) {
    std::vector<nlohmann::json> out;
    for (const auto& line : Lines(MustAs(token, {"history", path, "--json"}))) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
      if (!j.is_discarded()) out.push_back(std::move(j));
    }
    return out;
  }

  // A folder of two skills: pdf-tools (a script, a binary file, a private
  // reference folder, a symlink) and hello.
  std::string MakeSkills() {
    namespace fs = std::filesystem;
    const std::string root = work_->Sub("my-skills");
    const std::string pdf = root + "/pdf-tools";
    fs::create_directories(pdf + "/scripts");
    fs::create_directories(pdf + "/reference");
    fs::create_directories(root + "/hello");
    EXPECT_TRUE(WriteFile(pdf + "/SKILL.md",
                          "---\n"
                          "name: pdf-tools\n"
                          "description: |\n"
                          "  Extract text and tables from PDF files.\n"
                          "  Use it when the user mentions PDFs.\n"
                          "license: MIT\n"
                          "---\n"
                          "# PDF tools\n\nRun scripts/extract.sh FILE.\n"));
    EXPECT_TRUE(WriteFile(pdf + "/scripts/extract.sh",
                          "#!/bin/sh\necho \"extracted: $1\"\n", 0755));
    std::string binary;
    for (int i = 0; i < 300 * 1024; ++i) binary += static_cast<char>(i * 7);
    EXPECT_TRUE(WriteFile(pdf + "/reference/table.bin", binary, 0600));
    EXPECT_TRUE(WriteFile(pdf + "/reference/notes.md", "notes\n", 0640));
    EXPECT_EQ(chmod((pdf + "/reference").c_str(), 0750), 0);
    EXPECT_EQ(symlink("scripts/extract.sh", (pdf + "/extract").c_str()), 0);
    EXPECT_TRUE(WriteFile(root + "/hello/SKILL.md",
                          "---\nname: hello\ndescription: Say hello.\n---\n"));
    // Not a skill: skipped by `skills import`.
    EXPECT_TRUE(WriteFile(root + "/README.md", "my skills\n"));
    return root;
  }

  std::unique_ptr<TempDir> store_dir_;
  std::unique_ptr<TempDir> work_;
  std::string db_;
};

TEST_F(StoreCliTest, InitPrintsATokenOnceAndKeepsOnlyItsHash) {
  // stdout and stderr apart: the token goes to stdout only.
  const std::string err = work_->Sub("init.err");
  CommandResult r =
      RunCommand({"sh", "-c", "exec \"$@\" 2>\"$0\"", err, AGENTVFS_BINARY,
                  "init", "--store", db_, "--admin", "lead"});
  ASSERT_EQ(r.exit_status, 0) << r.output << ReadFile(err).value_or("");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(
      r.output, m,
      std::regex(
          R"(token for lead \(shown once; keep it\): (avfs_[0-9a-f]{64})\n)")))
      << "stdout: " << r.output;
  const std::string token = m[1].str();
  const std::string hint = ReadFile(err).value_or("");
  EXPECT_TRUE(Contains(hint, "AGENTVFS_TOKEN")) << hint;
  EXPECT_FALSE(Contains(hint, token)) << "the token is shown once";

  struct stat st;
  ASSERT_EQ(stat(db_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the store holds everyone's memories";
  if (stat((db_ + "-wal").c_str(), &st) == 0) {
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  const std::string bytes = AllFileBytes(store_dir_->path());
  EXPECT_FALSE(Contains(bytes, token)) << "the token is in the store in clear";
  const std::string hash = Sha256Sum(token);
  EXPECT_TRUE(Contains(bytes, hash)) << "its SHA-256 " << hash << " is not";

  // The token works; a second init is refused and changes nothing.
  EXPECT_TRUE(Contains(MustAs(token, {"user", "list"}), "lead"));
  CommandResult again = Cli({"init", "--store", db_, "--admin", "other"});
  EXPECT_NE(again.exit_status, 0) << again.output;
  EXPECT_TRUE(Contains(again.output, "agentvfs init:")) << again.output;
  EXPECT_TRUE(Contains(again.output, "already")) << again.output;
  EXPECT_TRUE(FindToken(again.output).empty()) << again.output;
  EXPECT_FALSE(Contains(MustAs(token, {"user", "list"}), "other"));
}

TEST_F(StoreCliTest, AWrongOrMissingTokenIsRefusedAndMountsNothing) {
  const std::string token = Init();
  const std::string wrong = "avfs_" + std::string(64, '0');
  ExpectRefused(wrong, {"user", "list"}, "token is not valid");
  ExpectRefused(wrong, {"history", "/memories/org/x"}, "token is not valid");
  ExpectRefused("", {"user", "list"}, "AGENTVFS_TOKEN");
  CommandResult no_file = Cli({"user", "list", "--store", db_, "--token-file",
                               work_->Sub("missing.token")});
  EXPECT_NE(no_file.exit_status, 0);
  EXPECT_TRUE(Contains(no_file.output, "missing.token")) << no_file.output;

  // A token file works like the variable, and wins over it.
  ASSERT_TRUE(WriteFile(work_->Sub("lead.token"), token + "\n", 0600));
  CommandResult from_file = Cli({"user", "list", "--store", db_, "--token-file",
                                 work_->Sub("lead.token")},
                                {{"AGENTVFS_TOKEN", wrong}});
  EXPECT_EQ(from_file.exit_status, 0) << from_file.output;

  // mount with a wrong token: refused before anything is mounted.
  TempDir ws("agentvfs-cli-ws"), mnt("agentvfs-cli-mnt");
  testing::UnmountAtExit(mnt.path());  // in case it mounts after all
  CommandResult mounted =
      RunCommand({AGENTVFS_BINARY, "mount", "--store", db_, "--workspace",
                  ws.path(), mnt.path()},
                 CommandOptions{.env = {{"AGENTVFS_TOKEN", wrong}},
                                .timeout = std::chrono::seconds(30)});
  EXPECT_FALSE(mounted.timed_out) << "mount kept running with a wrong token";
  EXPECT_NE(mounted.exit_status, 0) << mounted.output;
  EXPECT_TRUE(Contains(mounted.output, "token is not valid")) << mounted.output;
  EXPECT_FALSE(MountedView::IsMounted(mnt.path()));
  if (MountedView::IsMounted(mnt.path())) testing::LazyUnmount(mnt.path());
}

// A token on the command line is refused with where to put it instead, and
// never echoed: not by the refusal, nor by a usage error quoting arguments.
TEST_F(StoreCliTest, ATokenOnTheCommandLineIsRefusedAndNotEchoed) {
  const std::string token = Init();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"cat", "--token=" + token, "/memories/org"},
           {"mount", "--token", token, work_->Sub("view")},
           {"user", "list", "--token", token}}) {
    CommandResult r = Cli(args, {{"AGENTVFS_STORE", db_}});
    EXPECT_EQ(r.exit_status, 2) << r.output;
    EXPECT_TRUE(Contains(r.output, "AGENTVFS_TOKEN")) << r.output;
    EXPECT_TRUE(Contains(r.output, "--token-file")) << r.output;
    EXPECT_FALSE(Contains(r.output, token.substr(5))) << r.output;
  }
  CommandResult stray =
      Cli({"cat", "/memories/org", token}, {{"AGENTVFS_STORE", db_}});
  EXPECT_EQ(stray.exit_status, 2) << stray.output;
  EXPECT_TRUE(Contains(stray.output, "not expected")) << stray.output;
  EXPECT_FALSE(Contains(stray.output, token.substr(5))) << stray.output;
  // After `--`, arguments are a sandboxed command's own.
  CommandResult parsed = Cli({"exec", "--help", "--", "echo", "--token"});
  EXPECT_EQ(parsed.exit_status, 0) << parsed.output;
}

TEST_F(StoreCliTest, UsersTeamsAndGrantsAreAnAdminsBusiness) {
  const std::string lead = Init();
  std::string dev = AddUser(lead, "dev", {"--team", "eng"});
  const std::string ops = AddUser(lead, "ops");
  EXPECT_NE(dev, ops);
  MustAs(lead, {"grant", "write", "/memories/teams/eng", "--to", "team:eng"});

  std::string users = MustAs(lead, {"user", "list"});
  EXPECT_TRUE(std::regex_search(users, std::regex(R"(\ndev +enabled +eng\n)")))
      << users;
  std::string grants = MustAs(lead, {"grants"});
  EXPECT_TRUE(std::regex_search(
      grants, std::regex(R"(/memories/teams/eng +team:eng +write)")))
      << grants;

  // dev is no admin: every administrative command is refused.
  ExpectRefused(dev, {"user", "add", "eve"}, "needs admin");
  ExpectRefused(dev, {"user", "list"}, "needs admin");
  ExpectRefused(dev, {"user", "token", "ops"}, "needs admin");
  ExpectRefused(dev, {"user", "disable", "ops"}, "needs admin");
  ExpectRefused(dev, {"team", "add", "rogue"}, "needs admin");
  ExpectRefused(dev, {"team", "member", "add", "eng", "ops"}, "needs admin");
  ExpectRefused(dev, {"grant", "write", "/memories/org", "--to", "user:dev"},
                "needs admin");
  ExpectRefused(dev, {"revoke", "/memories/teams/eng", "--from", "team:eng"},
                "needs admin");
  ExpectRefused(dev, {"grants"}, "needs admin");
  EXPECT_EQ(FindToken(As(dev, {"user", "add", "eve"}).output), "");
  EXPECT_FALSE(Contains(MustAs(lead, {"user", "list"}), "eve"));

  // What a grant gives, a revoke takes away.
  const std::string notes = work_->Sub("notes");
  std::filesystem::create_directories(notes);
  ASSERT_TRUE(WriteFile(notes + "/oncall.md", "dev is on call\n"));
  ExpectRefused(dev, {"import", notes, "/memories/org/notes"}, "");
  MustAs(lead, {"grant", "write", "/memories/org", "--to", "user:dev"});
  MustAs(dev, {"import", notes, "/memories/org/notes"});
  EXPECT_EQ(MustAs(ops, {"cat", "/memories/org/notes/oncall.md"}),
            "dev is on call\n");
  MustAs(lead, {"revoke", "/memories/org", "--from", "user:dev"});
  ExpectRefused(lead, {"revoke", "/memories/org", "--from", "user:dev"}, "");
  // Grants reach other processes at once (each command is a new process).
  ASSERT_TRUE(WriteFile(notes + "/oncall.md", "changed\n"));
  ExpectRefused(dev, {"import", notes, "/memories/org/notes"}, "");
  ExpectRefused(lead, {"grant", "sudo", "/memories", "--to", "user:dev"},
                "read, write or admin");
  ExpectRefused(lead, {"grant", "read", "/memories", "--to", "dev"},
                "user:NAME");
  ExpectRefused(lead, {"grant", "read", "/workspace", "--to", "user:dev"},
                "outside the store");

  // Teams: members write the team's folder.
  MustAs(lead, {"team", "add", "sre"});
  ExpectRefused(ops, {"import", notes, "/memories/teams/sre/notes"}, "");
  MustAs(lead, {"team", "member", "add", "sre", "ops"});
  MustAs(ops, {"import", notes, "/memories/teams/sre/notes"});
  users = MustAs(lead, {"user", "list"});
  EXPECT_TRUE(std::regex_search(users, std::regex(R"(\nops +enabled +sre\n)")))
      << users;
  MustAs(lead, {"team", "member", "remove", "sre", "ops"});
  ExpectRefused(ops, {"import", notes, "/memories/teams/sre/notes"}, "");

  // Disabling stops the token; enabling brings it back; a new token
  // replaces the old one.
  MustAs(lead, {"user", "disable", "dev"});
  ExpectRefused(dev, {"history", "/memories/org/notes/oncall.md"}, "disabled");
  EXPECT_TRUE(std::regex_search(MustAs(lead, {"user", "list"}),
                                std::regex(R"(\ndev +disabled)")));
  MustAs(lead, {"user", "enable", "dev"});
  MustAs(dev, {"history", "/memories/org/notes/oncall.md"});
  const std::string new_dev = FindToken(MustAs(lead, {"user", "token", "dev"}));
  ASSERT_FALSE(new_dev.empty());
  EXPECT_NE(new_dev, dev);
  ExpectRefused(dev, {"history", "/memories/org/notes/oncall.md"},
                "token is not valid");
  MustAs(new_dev, {"history", "/memories/org/notes/oncall.md"});

  // The last admin on / may not revoke or lower that grant, nor leave the
  // team that gives it: nobody could manage the store after. With another
  // admin, they may step down.
  const std::string none = "no user with admin on /";
  ExpectRefused(lead, {"revoke", "/", "--from", "user:lead"}, none);
  ExpectRefused(lead, {"grant", "read", "/", "--to", "user:lead"}, none);
  MustAs(lead, {"user", "list"});
  MustAs(lead, {"grant", "admin", "/", "--to", "user:ops"});
  MustAs(lead, {"revoke", "/", "--from", "user:lead"});
  ExpectRefused(lead, {"user", "list"}, "needs admin");
  MustAs(ops, {"team", "add", "root"});
  MustAs(ops, {"team", "member", "add", "root", "ops"});
  MustAs(ops, {"grant", "admin", "/", "--to", "team:root"});
  MustAs(ops, {"revoke", "/", "--from", "user:ops"});
  ExpectRefused(ops, {"team", "member", "remove", "root", "ops"}, none);
  MustAs(ops, {"user", "list"});
}

TEST_F(StoreCliTest, HistoryCatAndRestore) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  MustAs(lead, {"grant", "write", "/memories/org", "--to", "user:dev"});
  const std::string file = "/memories/org/oncall.md";
  const std::string v1 = "on call: alice\n", v2 = "on call: bob\n",
                    v3 = "on call: carol (until friday)\n";

  // Version 1 through the API, 2 and 3 through `import` as dev.
  ASSERT_TRUE(ApiWrite("lead", file, v1));
  const std::string host = work_->Sub("org");
  std::filesystem::create_directories(host);
  ASSERT_TRUE(WriteFile(host + "/oncall.md", v2));
  ASSERT_TRUE(WriteFile(host + "/run.sh", "#!/bin/sh\n", 0755));
  ASSERT_TRUE(WriteFile(host + "/ro.txt", "fixed\n", 0444));
  MustAs(dev, {"import", host, "/memories/org"});
  ASSERT_TRUE(WriteFile(host + "/oncall.md", v3));
  MustAs(dev, {"import", host, "/memories/org"});
  // Every version records the host file's mode: a new file's first one
  // too, and a read-only file's (which the import makes writable while it
  // writes it). The second import left the unchanged files alone.
  for (const auto& [name, mode] :
       {std::pair{"run.sh", "0755"}, std::pair{"ro.txt", "0444"}}) {
    auto imported = History(dev, std::string("/memories/org/") + name);
    ASSERT_EQ(imported.size(), 1u) << name;
    for (const auto& v : imported) EXPECT_EQ(v.at("mode"), mode) << name;
  }

  auto versions = History(dev, file);
  ASSERT_EQ(versions.size(), 3u);
  const std::vector<std::string> contents = {v1, v2, v3};
  const std::vector<std::string> authors = {"lead", "dev", "dev"};
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("version " + std::to_string(i + 1));
    EXPECT_EQ(versions[i].at("version"), static_cast<int64_t>(i + 1));
    EXPECT_EQ(versions[i].at("author"), authors[i]);
    EXPECT_EQ(versions[i].at("size"), contents[i].size());
    EXPECT_TRUE(std::regex_match(versions[i].at("hash").get<std::string>(),
                                 std::regex("[0-9a-f]{64}")));
    EXPECT_EQ(versions[i].at("deleted"), false);
    EXPECT_TRUE(
        std::regex_match(versions[i].at("time").get<std::string>(),
                         std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  }
  // The hash identifies the content: three contents, three hashes.
  EXPECT_NE(versions[0].at("hash"), versions[1].at("hash"));
  EXPECT_NE(versions[1].at("hash"), versions[2].at("hash"));
  EXPECT_EQ(versions[0].at("session"), "api-lead");
  EXPECT_TRUE(
      versions[1].at("session").get<std::string>().starts_with("cli-import-"));

  // The table says the same for people.
  auto table = Lines(MustAs(dev, {"history", file}));
  ASSERT_EQ(table.size(), 4u) << MustAs(dev, {"history", file});
  EXPECT_TRUE(table[0].starts_with("VERSION")) << table[0];
  EXPECT_TRUE(Contains(table[0], "AUTHOR")) << table[0];
  EXPECT_TRUE(std::regex_search(
      table[2],
      std::regex("^2 +\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d +dev +"
                 "cli-import-[0-9a-f]{16} +" +
                 std::to_string(v2.size()) + " +" +
                 versions[1].at("hash").get<std::string>().substr(0, 12) +
                 "$")))
      << table[2];

  // cat: the current content, or any version.
  EXPECT_EQ(MustAs(dev, {"cat", file}), v3);
  EXPECT_EQ(MustAs(dev, {"cat", file, "--version", "1"}), v1);
  EXPECT_EQ(MustAs(dev, {"cat", file, "--version", "2"}), v2);
  ExpectRefused(dev, {"cat", file, "--version", "9"}, "no version 9");

  // restore: a new version with the old content.
  std::string out = MustAs(dev, {"restore", file, "--version", "1"});
  EXPECT_TRUE(Contains(out, "as version 4")) << out;
  EXPECT_EQ(MustAs(dev, {"cat", file}), v1);
  versions = History(dev, file);
  ASSERT_EQ(versions.size(), 4u);
  EXPECT_EQ(versions[3].at("author"), "dev");
  EXPECT_EQ(versions[3].at("hash"), versions[0].at("hash"));
  EXPECT_EQ(MustAs(dev, {"cat", file, "--version", "3"}), v3);

  // A deleted file keeps its history and can be restored.
  {
    auto backend = store::StoreBackend::Open(db_);
    ASSERT_TRUE(backend.has_value());
    vfs::Caller c;
    c.user = "dev";
    c.session = "api-dev";
    ASSERT_TRUE((*backend)->Unlink(c, *vfs::Path::Parse(file)).has_value());
  }
  ExpectRefused(dev, {"cat", file}, "");
  table = Lines(MustAs(dev, {"history", file}));
  ASSERT_EQ(table.size(), 6u);
  EXPECT_TRUE(std::regex_search(table[5], std::regex("^5 .* deleted$")))
      << table[5];
  const std::string v2_hash = versions[1].at("hash");
  out = MustAs(dev, {"restore", file, "--version", "2"});
  EXPECT_TRUE(Contains(out, "restored version 2 of " + file)) << out;
  EXPECT_EQ(MustAs(dev, {"cat", file}), v2);
  versions = History(dev, file);
  ASSERT_FALSE(versions.empty());
  EXPECT_EQ(versions.back().at("hash"), v2_hash);

  // Someone who cannot read the file sees no history; read-only cannot
  // restore.
  const std::string ops = AddUser(lead, "ops");
  ExpectRefused(ops, {"history", "/memories/users/dev/x"}, "");
  const size_t before = History(dev, file).size();
  ExpectRefused(ops, {"restore", file, "--version", "1"}, "");
  EXPECT_EQ(History(dev, file).size(), before);
  EXPECT_EQ(MustAs(dev, {"cat", file}), v2);

  // Paths outside the store are refused before anything else happens.
  ExpectRefused(dev, {"history", "/workspace/x"}, "not in the store");
  ExpectRefused(dev, {"cat", "memories/org/oncall.md"}, "not a store path");
  ExpectRefused(dev, {"restore", "/etc/passwd", "--version", "1"},
                "/memories or /skills");
}

TEST_F(StoreCliTest, PurgeErasesVersionsAndTheirBytes) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  const std::string file = "/memories/users/dev/secret.md";
  const std::string old_secret = "leaked-password-" + RandomHex(32);
  const std::string current = "rotated-" + RandomHex(32);
  ASSERT_TRUE(ApiWrite("dev", file, old_secret));
  ASSERT_TRUE(ApiWrite("dev", file, current));
  ASSERT_EQ(History(dev, file).size(), 2u);
  // The bytes are there to be found before the purge.
  ASSERT_TRUE(Contains(AllFileBytes(store_dir_->path()), old_secret));

  ExpectRefused(dev, {"purge", file, "--keep-current"}, "admin");
  EXPECT_EQ(History(dev, file).size(), 2u);

  std::string out = MustAs(lead, {"purge", file, "--keep-current"});
  EXPECT_TRUE(Contains(out, "1 version(s)")) << out;
  auto versions = History(dev, file);
  ASSERT_EQ(versions.size(), 1u);
  EXPECT_EQ(versions[0].at("version"), 2);
  EXPECT_EQ(MustAs(dev, {"cat", file}), current);
  ExpectRefused(dev, {"cat", file, "--version", "1"}, "no version 1");
  std::string bytes = AllFileBytes(store_dir_->path());
  EXPECT_FALSE(Contains(bytes, old_secret))
      << "purged content is still in the store's files";
  EXPECT_TRUE(Contains(bytes, current));

  // Without --keep-current the file goes too.
  out = MustAs(lead, {"purge", file});
  EXPECT_TRUE(Contains(out, "1 file(s)")) << out;
  ExpectRefused(dev, {"cat", file}, "");
  ExpectRefused(dev, {"history", file}, "");
  EXPECT_FALSE(Contains(AllFileBytes(store_dir_->path()), current));
  EXPECT_TRUE(Contains(out, "byte(s) of content")) << out;

  // An admin of a prefix is not told how much content went: contents are
  // shared across the store, so it would tell whether a file they cannot
  // see holds the bytes they guessed. The hidden file keeps them.
  const std::string hidden = "/memories/users/lead/pin.md";
  const std::string guess = "pin-" + RandomHex(16);
  ASSERT_TRUE(ApiWrite("lead", hidden, guess));
  MustAs(lead, {"grant", "admin", "/memories/users/dev", "--to", "user:dev"});
  ASSERT_TRUE(ApiWrite("dev", file, guess));
  out = MustAs(dev, {"purge", file});
  EXPECT_TRUE(Contains(out, "1 file(s)")) << out;
  EXPECT_FALSE(Contains(out, "chunk")) << out;
  EXPECT_FALSE(Contains(out, "byte")) << out;
  EXPECT_EQ(MustAs(lead, {"cat", hidden}), guess);
}

// A purge whose compaction could not finish (another process kept a read
// open, so the log could not be folded in) is committed and says so; once
// the reader is gone, `compact` removes the bytes from the files.
TEST_F(StoreCliTest, CompactFinishesAPurgeWhoseCompactionFailed) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  const std::string file = "/memories/users/dev/secret.md";
  const std::string secret = "leaked-password-" + RandomHex(32);
  ASSERT_TRUE(ApiWrite("dev", file, secret));
  ASSERT_TRUE(ApiWrite("dev", file, "rotated\n"));

  sqlite3* reader = nullptr;
  ASSERT_EQ(
      sqlite3_open_v2(db_.c_str(), &reader, SQLITE_OPEN_READONLY, nullptr),
      SQLITE_OK);
  struct Closer {
    sqlite3* db;
    ~Closer() { sqlite3_close(db); }
  } closer{reader};
  ASSERT_EQ(sqlite3_exec(reader,
                         "BEGIN; SELECT COUNT(*) FROM versions; "
                         "SELECT COUNT(*) FROM inodes",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  CommandResult r = As(lead, {"purge", file, "--keep-current"});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_TRUE(Contains(r.output, "the purge is committed")) << r.output;
  EXPECT_TRUE(Contains(r.output, "agentvfs compact")) << r.output;
  ExpectRefused(dev, {"cat", file, "--version", "1"}, "no version 1");
  ASSERT_EQ(sqlite3_exec(reader, "COMMIT", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(reader);
  closer.db = nullptr;

  // Until then, every command tells an admin of / (the one who can finish
  // it), also when the purge was killed and said nothing.
  const std::string pending = "did not finish erasing";
  EXPECT_TRUE(Contains(MustAs(lead, {"grants"}), pending));
  EXPECT_FALSE(Contains(As(dev, {"cat", file}).output, pending));
  ExpectRefused(dev, {"compact"}, "admin");
  std::string out = MustAs(lead, {"compact"});
  EXPECT_TRUE(Contains(out, "compacted")) << out;
  EXPECT_FALSE(Contains(AllFileBytes(store_dir_->path()), secret))
      << "purged content is still in the store's files";
  EXPECT_EQ(MustAs(dev, {"cat", file}), "rotated\n");
  EXPECT_FALSE(Contains(MustAs(lead, {"grants"}), pending));
}

TEST_F(StoreCliTest, SkillsImportListAndExportRoundTrip) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  const std::string skills = MakeSkills();

  ExpectRefused(dev, {"skills", "import", skills}, "");
  std::string out = MustAs(lead, {"skills", "import", skills});
  EXPECT_EQ(Lines(out), (std::vector<std::string>{
                            "imported hello: Say hello.",
                            "imported pdf-tools: Extract text and tables from "
                            "PDF files."}))
      << out;
  EXPECT_EQ(Lines(MustAs(dev, {"skills", "list"})),
            (std::vector<std::string>{
                "hello: Say hello.",
                "pdf-tools: Extract text and tables from PDF files."}));
  EXPECT_EQ(MustAs(dev, {"cat", "/skills/pdf-tools/scripts/extract.sh"}),
            "#!/bin/sh\necho \"extracted: $1\"\n");

  // Export: byte for byte, with modes, symlinks and mtimes.
  const std::string backup = work_->Sub("backup");
  out = MustAs(dev, {"export", "/skills", backup});
  EXPECT_EQ(ListDir(backup), (std::vector<std::string>{"hello", "pdf-tools"}));
  for (const char* skill : {"hello", "pdf-tools"}) {
    EXPECT_EQ(CompareTrees(skills + "/" + skill, backup + "/" + skill),
              std::vector<std::string>{})
        << skill;
  }
  // Into a non-empty directory only when asked; what is there stays.
  ExpectRefused(dev, {"export", "/skills", backup}, "not empty");
  EXPECT_EQ(CompareTrees(skills + "/pdf-tools", backup + "/pdf-tools"),
            std::vector<std::string>{});
  ASSERT_TRUE(WriteFile(backup + "/mine.txt", "keep me"));
  MustAs(dev, {"export", "/skills", backup, "--merge"});
  EXPECT_EQ(ReadFile(backup + "/mine.txt"), "keep me");
  // A failed export into a new directory leaves nothing behind.
  ExpectRefused(dev, {"export", "/skills/pdf-tools/SKILL.md", work_->Sub("x")},
                "");
  EXPECT_FALSE(std::filesystem::exists(work_->Sub("x")));

  // Re-importing a changed skill updates it (and drops deleted files);
  // the old content stays in the history.
  ASSERT_TRUE(
      WriteFile(skills + "/hello/SKILL.md",
                "---\nname: hello\ndescription: Say hello twice.\n---\n"));
  MustAs(lead, {"skills", "import", skills + "/hello"});
  EXPECT_EQ(Lines(MustAs(dev, {"skills", "list"})),
            (std::vector<std::string>{
                "hello: Say hello twice.",
                "pdf-tools: Extract text and tables from PDF files."}));
  EXPECT_EQ(History(dev, "/skills/hello/SKILL.md").size(), 2u);

  // A folder of /skills without SKILL.md is skipped, saying so.
  const std::string notes = work_->Sub("notes");
  std::filesystem::create_directories(notes);
  ASSERT_TRUE(WriteFile(notes + "/readme.md", "notes\n"));
  MustAs(lead, {"import", notes, "/skills/notes"});
  CommandResult listed = As(dev, {"skills", "list"});
  EXPECT_EQ(listed.exit_status, 0) << listed.output;
  EXPECT_TRUE(
      Contains(listed.output, "skipping /skills/notes: holds no SKILL.md"))
      << listed.output;
}

TEST_F(StoreCliTest, SkillsImportRejectsABadSkillAndImportsNothing) {
  const std::string lead = Init();
  const std::string skills = MakeSkills();
  std::filesystem::create_directories(skills + "/broken");
  ASSERT_TRUE(WriteFile(skills + "/broken/SKILL.md",
                        "---\nname: broken\ndescription: \"\"\n---\n"));
  CommandResult r = As(lead, {"skills", "import", skills});
  EXPECT_NE(r.exit_status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "agentvfs skills import:")) << r.output;
  EXPECT_TRUE(Contains(r.output, "broken/SKILL.md")) << r.output;
  EXPECT_TRUE(Contains(r.output, "description")) << r.output;
  EXPECT_EQ(MustAs(lead, {"skills", "list"}), "") << "nothing is imported";
  const std::string empty = work_->Sub("empty");
  MustAs(lead, {"export", "/skills", empty});
  EXPECT_EQ(ListDir(empty), std::vector<std::string>{});

  // A name that does not match its folder is named too.
  ASSERT_TRUE(WriteFile(skills + "/broken/SKILL.md",
                        "---\nname: Broken\ndescription: ok\n---\n"));
  r = As(lead, {"skills", "import", skills + "/broken"});
  EXPECT_NE(r.exit_status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "SKILL.md")) << r.output;
  EXPECT_TRUE(Contains(r.output, "'name'")) << r.output;
  EXPECT_EQ(MustAs(lead, {"skills", "list"}), "");
}

TEST_F(StoreCliTest, MountServesTheStoreAsTheUser) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev", {"--team", "eng"});
  MustAs(lead, {"skills", "import", MakeSkills()});
  ASSERT_TRUE(ApiWrite("lead", "/memories/users/lead/private.md", "mine"));
  ASSERT_TRUE(ApiWrite("lead", "/memories/org/oncall.md", "alice\n"));

  TempDir ws("agentvfs-cli-ws"), mnt("agentvfs-cli-mnt");
  std::string error;
  auto view = MountAs(dev, ws, mnt, &error);
  ASSERT_NE(view, nullptr) << error;
  const std::string root = view->mountpoint();
  EXPECT_EQ(ListDir(root),
            (std::vector<std::string>{"memories", "skills", "workspace"}));
  EXPECT_EQ(ListDir(root + "/skills"),
            (std::vector<std::string>{"hello", "pdf-tools"}));
  EXPECT_EQ(ReadFile(root + "/memories/org/oncall.md"), "alice\n");
  EXPECT_EQ(ListDir(root + "/memories/users"), std::vector<std::string>{"dev"})
      << "dev sees only their own folder";
  EXPECT_EQ(ReadFile(root + "/memories/users/lead/private.md"), std::nullopt);

  // The imported skill: its SKILL.md reads as written, its script runs.
  const std::string skill = root + "/skills/pdf-tools";
  EXPECT_EQ(ReadFile(skill + "/SKILL.md"),
            ReadFile(work_->Sub("my-skills/pdf-tools/SKILL.md")));
  const std::string script = skill + "/scripts/extract.sh";
  struct stat st;
  ASSERT_EQ(stat(script.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  EXPECT_EQ(access(script.c_str(), X_OK), 0);
  CommandResult ran = RunCommand({"/bin/sh", script, "report.pdf"});
  EXPECT_EQ(ran.exit_status, 0) << ran.output;
  EXPECT_EQ(ran.output, "extracted: report.pdf\n");
  ran = RunCommand({script, "direct.pdf"});
  EXPECT_EQ(ran.output, "extracted: direct.pdf\n");
  EXPECT_EQ(ReadFile(skill + "/reference/table.bin"),
            ReadFile(work_->Sub("my-skills/pdf-tools/reference/table.bin")));

  // What dev writes through the mount is a version by dev.
  ASSERT_TRUE(WriteFile(root + "/memories/users/dev/note.md", "remember\n"));
  ASSERT_TRUE(WriteFile(root + "/memories/teams/eng/plan.md", "ship it\n"));
  EXPECT_EQ(view->Stop(), 0) << view->Log();
  EXPECT_FALSE(MountedView::IsMounted(mnt.path()));
  auto versions = History(dev, "/memories/users/dev/note.md");
  ASSERT_EQ(versions.size(), 1u);
  EXPECT_EQ(versions[0].at("author"), "dev");
  EXPECT_TRUE(
      versions[0].at("session").get<std::string>().starts_with("mount-"));
  EXPECT_EQ(MustAs(lead, {"cat", "/memories/teams/eng/plan.md"}), "ship it\n");
}

// Store files and workspace files never share an inode number in the view,
// where both show on the mount's one device: tar would store one as a hard
// link of the other (its bytes lost on extraction), du would count one and
// skip the other. A tmpfs workspace numbers its inodes from 2 up, as the
// store does.
TEST_F(StoreCliTest, StoreAndWorkspaceFilesNeverShareAnInodeNumber) {
  const std::string lead = Init();
  TempDir ws("agentvfs-cli-ws"), mnt("agentvfs-cli-mnt");
  ASSERT_EQ(::mount("tmpfs", ws.path().c_str(), "tmpfs", 0, "size=4m"), 0)
      << std::strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{ws.path()};
  for (int i = 0; i < 30; ++i) {
    // (Appended, not "w" + to_string: GCC 12 warns wrongly, -Wrestrict.)
    std::string n = std::to_string(i);
    ASSERT_TRUE(WriteFile(ws.Sub(std::string("w").append(n)), "workspace\n"));
    ASSERT_TRUE(
        ApiWrite("lead", std::string("/memories/org/s").append(n), "store\n"));
  }
  std::string error;
  auto view = MountAs(lead, ws, mnt, &error);
  ASSERT_NE(view, nullptr) << error;
  std::map<ino_t, std::string> seen;
  for (const auto& dir : {std::string("/workspace"), std::string("/memories"),
                          std::string("/memories/org")}) {
    const std::string at = view->mountpoint() + dir;
    for (const auto& name : ListDir(at).value_or(std::vector<std::string>{})) {
      struct stat st {};
      ASSERT_EQ(lstat((at + "/" + name).c_str(), &st), 0) << name;
      auto [it, fresh] = seen.emplace(st.st_ino, dir + "/" + name);
      EXPECT_TRUE(fresh) << dir + "/" + name << " has the inode number of "
                         << it->second;
    }
  }
  EXPECT_GE(seen.size(), 60u);
  EXPECT_EQ(view->Stop(), 0) << view->Log();
}

// `sed -i` through a mount writes a new file and renames it over the old
// one; `history` still lists the file's earlier versions, and `cat` and
// `restore` reach them by the numbers it shows.
// Exporting a store directory into itself, or importing into a directory
// inside the source, through a mount of the store, would copy the copy
// without end (2,027 levels, each with versions): refused, like cp does,
// and nothing is left behind.
TEST_F(StoreCliTest, ACopyIntoItselfThroughAMountIsRefused) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  TempDir ws("agentvfs-cli-ws"), mnt("agentvfs-cli-mnt");
  std::string error;
  auto view = MountAs(dev, ws, mnt, &error);
  ASSERT_NE(view, nullptr) << error;
  const std::string rec = "/memories/users/dev/rec";
  ASSERT_EQ(mkdir((view->mountpoint() + rec).c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(view->mountpoint() + rec + "/a.md", "a\n"));

  CommandResult out =
      As(dev, {"export", rec, view->mountpoint() + rec + "/out"});
  EXPECT_NE(out.exit_status, 0);
  EXPECT_THAT(out.output, HasSubstr("cannot be copied into itself"));
  CommandResult in = As(dev, {"import", view->mountpoint() + rec, rec + "/in"});
  EXPECT_NE(in.exit_status, 0);
  EXPECT_THAT(in.output, HasSubstr("cannot be copied into itself"));
  EXPECT_EQ(view->Stop(), 0) << view->Log();
  EXPECT_EQ(MustAs(dev, {"cat", rec + "/a.md"}), "a\n");
  for (const char* gone : {"/out/a.md", "/in/a.md", "/out", "/in"}) {
    CommandResult r = As(dev, {"cat", rec + gone});
    EXPECT_NE(r.exit_status, 0) << gone << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("no such file")) << gone;
  }
}

TEST_F(StoreCliTest, SedInPlaceThroughAMountKeepsTheHistory) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  TempDir ws("agentvfs-cli-ws"), mnt("agentvfs-cli-mnt");
  std::string error;
  auto view = MountAs(dev, ws, mnt, &error);
  ASSERT_NE(view, nullptr) << error;
  const std::string file = "/memories/users/dev/plan.md";
  const std::string mounted = view->mountpoint() + file;
  // A shell's redirection closes a descriptor of the new file before it
  // writes: that close commits no empty version.
  CommandResult made =
      RunCommand({"/bin/sh", "-c", "echo 'step one' > \"$0\"", mounted});
  ASSERT_EQ(made.exit_status, 0) << made.output;
  // A file closed with nothing written has its empty first version.
  const std::string empty = "/memories/users/dev/empty.md";
  CommandResult touched = RunCommand({"touch", view->mountpoint() + empty});
  ASSERT_EQ(touched.exit_status, 0) << touched.output;
  for (const char* edit : {"s/one/two/", "s/two/three/"}) {
    CommandResult sed = RunCommand({"sed", "-i", edit, mounted});
    ASSERT_EQ(sed.exit_status, 0) << sed.output;
  }
  EXPECT_EQ(ReadFile(mounted), "step three\n");
  EXPECT_EQ(view->Stop(), 0) << view->Log();
  auto touched_versions = History(dev, empty);
  ASSERT_EQ(touched_versions.size(), 1u) << MustAs(dev, {"history", empty});
  EXPECT_EQ(touched_versions[0].at("size"), 0);

  // one, its end, two (written under sed's temporary name), its end, three.
  auto versions = History(dev, file);
  ASSERT_EQ(versions.size(), 5u) << MustAs(dev, {"history", file});
  for (size_t i = 0; i < versions.size(); ++i) {
    EXPECT_EQ(versions[i].at("version"), static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(versions[1].at("deleted"), true);
  EXPECT_EQ(versions[3].at("deleted"), true);
  EXPECT_NE(versions[2].at("path"), file);
  EXPECT_EQ(MustAs(dev, {"cat", file, "--version", "1"}), "step one\n");
  EXPECT_EQ(MustAs(dev, {"cat", file, "--version", "3"}), "step two\n");
  // The table says where a version was written when not at the path.
  std::string table = MustAs(dev, {"history", file});
  EXPECT_TRUE(Contains(table, "deleted")) << table;
  EXPECT_TRUE(Contains(table, "at /memories/users/dev/")) << table;
  EXPECT_TRUE(Contains(MustAs(dev, {"restore", file, "--version", "1"}),
                       "as version 6"));
  EXPECT_EQ(MustAs(dev, {"cat", file}), "step one\n");
}

TEST_F(StoreCliTest, TheStoreIsNamedByFlagVariableOrConfigFile) {
  const std::string lead = Init();
  CommandResult r = Cli({"user", "list"}, {{"AGENTVFS_TOKEN", lead}});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_TRUE(Contains(r.output, "no store given")) << r.output;
  EXPECT_TRUE(Contains(r.output, "AGENTVFS_STORE")) << r.output;

  r = Cli({"user", "list", "--store", db_}, {{"AGENTVFS_TOKEN", lead}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  r = Cli({"user", "list"},
          {{"AGENTVFS_TOKEN", lead}, {"AGENTVFS_STORE", db_}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  const std::string config = work_->Sub("config.yaml");
  ASSERT_TRUE(WriteFile(config, "store: " + db_ + "\n"));
  r = Cli({"user", "list"},
          {{"AGENTVFS_TOKEN", lead}, {"AGENTVFS_CONFIG", config}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "lead")) << r.output;

  // A store that does not exist is not created by anything but init.
  r = Cli({"user", "list", "--store", work_->Sub("nope.db")},
          {{"AGENTVFS_TOKEN", lead}});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_TRUE(Contains(r.output, "agentvfs init")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(work_->Sub("nope.db")));
  // An empty `store:` in the config is an error, not a store named "null".
  ASSERT_TRUE(WriteFile(config, "store:\n"));
  r = Cli({"user", "list"},
          {{"AGENTVFS_TOKEN", lead}, {"AGENTVFS_CONFIG", config}});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_TRUE(Contains(r.output, "`store:` must name the store")) << r.output;

  // A relative `store:` is the file next to the config file, wherever the
  // command runs; a config "file" that is a directory is named as such.
  ASSERT_TRUE(WriteFile(store_dir_->Sub("config.yaml"), "store: team.db\n"));
  r = RunCommand({AGENTVFS_BINARY, "user", "list"},
                 CommandOptions{.cwd = work_->path(),
                                .env = {{"AGENTVFS_STORE", ""},
                                        {"AGENTVFS_TOKEN", lead},
                                        {"AGENTVFS_CONFIG",
                                         store_dir_->Sub("config.yaml")}}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "lead")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(work_->Sub("team.db")));
  // sqlite:FILE the same; another scheme is left alone (and a PostgreSQL
  // name without its // is refused, not made a file).
  for (const std::string& name :
       {std::string("sqlite:team.db"), "sqlite:" + db_,
        std::string("postgresql:lead@localhost")}) {
    ASSERT_TRUE(
        WriteFile(store_dir_->Sub("config.yaml"), "store: '" + name + "'\n"));
    r = RunCommand({AGENTVFS_BINARY, "user", "list"},
                   CommandOptions{.cwd = work_->path(),
                                  .env = {{"AGENTVFS_STORE", ""},
                                          {"AGENTVFS_TOKEN", lead},
                                          {"AGENTVFS_CONFIG",
                                           store_dir_->Sub("config.yaml")}}});
    if (name.starts_with("sqlite:")) {
      EXPECT_EQ(r.exit_status, 0) << name << ": " << r.output;
    } else {
      EXPECT_TRUE(Contains(r.output, "is not a URI")) << r.output;
    }
  }
  for (const auto& dir : {store_dir_->path(), work_->path()}) {
    EXPECT_FALSE(std::filesystem::exists(dir + "/postgresql:lead@localhost"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/sqlite:team.db"));
  }
  r = Cli({"user", "list"},
          {{"AGENTVFS_TOKEN", lead}, {"AGENTVFS_CONFIG", work_->path()}});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_TRUE(
      Contains(r.output, "the config file " + work_->path() + " is not a file"))
      << r.output;
  // With no store anywhere, the message names the config file in use.
  r = Cli({"user", "list"}, {{"AGENTVFS_TOKEN", lead}});
  EXPECT_TRUE(Contains(
      r.output, "put `store: PATH` in " + work_->Sub("no-such-config.yaml")))
      << r.output;
}

// `agentvfs ARGS > /dev/full` with the test's store and `token`.
CommandResult ToFullDisk(const std::string& db, const std::string& token,
                         const std::vector<std::string>& args,
                         const std::string& config) {
  std::vector<std::string> argv = {"sh", "-c", "exec \"$@\" > /dev/full", "sh",
                                   AGENTVFS_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, CommandOptions{.env = {{"AGENTVFS_STORE", db},
                                                 {"AGENTVFS_TOKEN", token},
                                                 {"AGENTVFS_CONFIG", config}}});
}

// A token that cannot be written out is a failure: init then makes no store
// (its only admin would have no token, and init refuses a store with
// users); user add says the token is lost and how to make a new one. Any
// output that cannot be written makes the exit status non-zero.
TEST_F(StoreCliTest, ATokenThatCannotBeWrittenIsAFailure) {
  const std::string none = work_->Sub("no-such-config.yaml");
  CommandResult r = ToFullDisk(db_, "", {"init", "--admin", "lead"}, none);
  EXPECT_NE(r.exit_status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output,
                       "could not be written to standard output; "
                       "no store was made"))
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(db_));
  const std::string lead = Init();  // the same init, with a terminal, works
  r = ToFullDisk(db_, lead, {"user", "add", "dev"}, none);
  EXPECT_NE(r.exit_status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output,
                       "so it is lost; make a new one with "
                       "`agentvfs user token dev`"))
      << r.output;
  std::string dev = FindToken(MustAs(lead, {"user", "token", "dev"}));
  EXPECT_FALSE(dev.empty());
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"grants"}, {"user", "list"}, {"history", "/memories/org"}}) {
    r = ToFullDisk(db_, lead, args, none);
    EXPECT_NE(r.exit_status, 0) << args[0] << ": " << r.output;
  }
}

// A store name that finds a database of another program never changes it,
// and a store made in an existing empty file is private like a new one.
TEST_F(StoreCliTest, ADatabaseOfAnotherProgramIsNeverTurnedIntoAStore) {
  const std::string foreign = work_->Sub("notes.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE notes(x); INSERT INTO notes "
                           "VALUES('mine')",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  const std::string before = ReadFile(foreign).value_or("");
  CommandResult r = Cli({"history", "/memories/x", "--store", foreign},
                        {{"AGENTVFS_TOKEN", "avfs_x"}});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_TRUE(Contains(r.output, "no agentvfs store in " + foreign))
      << r.output;
  r = Cli({"init", "--store", foreign, "--admin", "lead"});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_TRUE(Contains(r.output, "is a database of another program"))
      << r.output;
  r = Cli({"migrate", "--from", foreign, "--to", work_->Sub("copy.db")});
  EXPECT_NE(r.exit_status, 0) << r.output;
  EXPECT_EQ(ReadFile(foreign).value_or(""), before) << "notes.db was changed";
  EXPECT_FALSE(std::filesystem::exists(foreign + "-wal"));

  const std::string empty = work_->Sub("empty.db");
  ASSERT_TRUE(WriteFile(empty, "", 0644));
  r = Cli({"history", "/memories/x", "--store", empty},
          {{"AGENTVFS_TOKEN", "avfs_x"}});
  EXPECT_TRUE(Contains(r.output, "no agentvfs store in")) << r.output;
  r = Cli({"init", "--store", empty, "--admin", "lead"});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  struct stat st;
  ASSERT_EQ(stat(empty.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// What `cat`, `history`, `team`, `grant`, `skills` and token files make of
// odd but plausible input: a clear answer, never a crash or a quiet no-op.
TEST_F(StoreCliTest, OddInputGetsAClearAnswer) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev", {"--team", "eng"});
  ASSERT_TRUE(ApiWrite("lead", "/memories/users/lead/a.md", "hello\n"));
  CommandResult r0;
  // A path that is not UTF-8, as JSON.
  const std::string odd =
      "/memories/users/lead/bad\xff"
      "name.md";
  ASSERT_TRUE(ApiWrite("lead", odd, "x\n"));
  auto versions = History(lead, odd);
  ASSERT_EQ(versions.size(), 1u);
  EXPECT_EQ(versions[0]["path"], "/memories/users/lead/bad\xef\xbf\xbdname.md");
  // cat: a directory is an error; a symlink in the store is followed; a
  // missing file is named.
  ExpectRefused(lead, {"cat", "/memories/users/lead"}, "is a directory");
  {
    auto backend = store::StoreBackend::Open(db_);
    ASSERT_TRUE(backend.has_value());
    vfs::Caller c;
    c.user = "lead";
    c.session = "api-lead";
    ASSERT_TRUE((*backend)->Symlink(
        c, "a.md", *vfs::Path::Parse("/memories/users/lead/link.md")));
  }
  EXPECT_EQ(MustAs(lead, {"cat", "/memories/users/lead/link.md"}), "hello\n");
  ExpectRefused(lead, {"cat", "/memories/users/lead/nope.md"},
                "/memories/users/lead/nope.md: ");
  // A trailing / names a directory, as for cat(1); purge names the path it
  // found nothing at; with /skills hidden, skills list lists nothing.
  ExpectRefused(lead, {"cat", "/memories/users/lead/a.md/"},
                "/memories/users/lead/a.md is not a directory");
  ExpectRefused(dev, {"purge", "/memories/users/lead/a.md"},
                "/memories/users/lead/a.md: ");
  MustAs(lead, {"revoke", "/skills", "--from", "everyone"});
  r0 = As(dev, {"skills", "list"});
  EXPECT_EQ(r0.exit_status, 0) << r0.output;
  EXPECT_EQ(r0.output, "");
  CommandResult r =
      As(lead, {"cat", "/memories/users/lead/a.md", "--version", "0"});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_TRUE(Contains(r.output,
                       "give a version number as `agentvfs "
                       "history` lists them (1, 2, ...), not '0'"))
      << r.output;
  // Teams: no silent no-op, no team made by a typo.
  ExpectRefused(lead, {"team", "add", "eng"}, "team 'eng' exists");
  ExpectRefused(lead, {"team", "member", "add", "engg", "dev"},
                "no team 'engg'; add it with `agentvfs team add engg`");
  EXPECT_FALSE(Contains(MustAs(lead, {"user", "list"}), "engg"));
  // A grant is echoed as stored.
  EXPECT_EQ(MustAs(lead, {"grant", "read", "/skills/../memories/org/x", "--to",
                          "user:dev"}),
            "granted read on /memories/org/x to user:dev\n");
  // Token files: blanks around the token are not part of it; a file with
  // no token, or a directory, says so.
  const std::string tok = work_->Sub("dev.token");
  ASSERT_TRUE(WriteFile(tok, "  " + dev + "\t\n", 0600));
  r = Cli({"skills", "list", "--store", db_, "--token-file", tok});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  ASSERT_TRUE(WriteFile(tok, "\n" + dev + "\n", 0600));
  r = Cli({"skills", "list", "--store", db_, "--token-file", tok});
  EXPECT_TRUE(Contains(r.output, "holds no token on its first line"))
      << r.output;
  r = Cli({"skills", "list", "--store", db_, "--token-file", work_->path()});
  EXPECT_TRUE(Contains(r.output, "(a directory)")) << r.output;
  ASSERT_TRUE(WriteFile(tok, dev + "\n", 0644));
  ASSERT_EQ(chmod(tok.c_str(), 0644), 0);
  r = Cli({"skills", "list", "--store", db_, "--token-file", tok});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "can be read by others (mode 644)"))
      << r.output;
}

// A skills import the user may not write in full imports nothing (before,
// the skills before the refused one went in); descriptions reach the
// terminal without control characters.
TEST_F(StoreCliTest, SkillsImportChecksEveryPlaceFirst) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  namespace fs = std::filesystem;
  const std::string root = work_->Sub("two");
  fs::create_directories(root + "/gamma");
  fs::create_directories(root + "/zeta");
  ASSERT_TRUE(WriteFile(root + "/gamma/SKILL.md",
                        "---\nname: gamma\ndescription: \"G \\e[2J\\e[31m"
                        "red\"\n---\n"));
  ASSERT_TRUE(WriteFile(root + "/zeta/SKILL.md",
                        "---\nname: zeta\ndescription: Z\n---\n"));
  MustAs(lead, {"grant", "write", "/skills/gamma", "--to", "user:dev"});
  ExpectRefused(dev, {"skills", "import", root},
                "may not write /skills/zeta; nothing was imported");
  EXPECT_EQ(MustAs(dev, {"skills", "list"}), "");
  std::string out = MustAs(lead, {"skills", "import", root});
  EXPECT_EQ(out, "imported gamma: G ?[2J?[31mred\nimported zeta: Z\n");
  EXPECT_EQ(MustAs(dev, {"skills", "list"}),
            "gamma: G ?[2J?[31mred\nzeta: Z\n");
}

// A store mount made with --background holds the store as a foreground one
// does: the daemon (not the parent that exited) holds its write leases, so
// another mount's writer gets EBUSY and nothing is lost; and it follows the
// change feed, so another mount's commit shows despite long cache timeouts.
TEST_F(StoreCliTest, ABackgroundMountKeepsLeasesAndTheChangeFeed) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  ASSERT_TRUE(WriteFile(work_->Sub("dev.token"), dev + "\n", 0600));
  ASSERT_TRUE(ApiWrite("dev", "/memories/users/dev/x.md", "v1\n"));
  TempDir ws("agentvfs-cli-ws"), bg("agentvfs-cli-bg"), fg("agentvfs-cli-fg");
  testing::UnmountAtExit(bg.path());
  const std::string bg_log = work_->Sub("bg.log");
  CommandResult r = RunCommand(
      {AGENTVFS_BINARY, "mount", "--store", db_, "--token-file",
       work_->Sub("dev.token"), "--cache-timeout", "60", "--background",
       "--log-file", bg_log, bg.path()},
      CommandOptions{.env = {{"AGENTVFS_CONFIG", work_->Sub("none.yaml")}},
                     .timeout = std::chrono::seconds(15)});
  ASSERT_EQ(r.exit_status, 0) << r.output;
  struct Unmount {
    std::string path;
    ~Unmount() { testing::LazyUnmount(path); }
  } unmount{bg.path()};
  std::string error;
  auto view =
      MountedView::Start(ws.path(), fg.path(),
                         {"--store", db_, "--token-file",
                          work_->Sub("dev.token"), "--cache-timeout", "60"},
                         &error);
  ASSERT_NE(view, nullptr) << error;
  const std::string in_bg = bg.path() + "/memories/users/dev/x.md";
  const std::string in_fg = fg.path() + "/memories/users/dev/x.md";
  ASSERT_EQ(ReadFile(in_bg), "v1\n");  // cached for 60 s from now on
  ASSERT_EQ(ReadFile(in_fg), "v1\n");

  // The background daemon writes: the foreground mount must wait.
  int held = open(in_bg.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(held, 0) << strerror(errno);
  int other = open(in_fg.c_str(), O_WRONLY | O_APPEND);
  EXPECT_EQ(other, -1) << "a second writer got in while the first held it";
  EXPECT_EQ(errno, EBUSY);
  if (other >= 0) close(other);
  // The refused mount's log says why (its user saw only EBUSY).
  EXPECT_TRUE(Contains(view->Log(), "refused: EBUSY")) << view->Log();
  EXPECT_TRUE(Contains(view->Log(), "is open for writing by user 'dev'"))
      << view->Log();
  ASSERT_EQ(write(held, "from bg\n", 8), 8);
  ASSERT_EQ(close(held), 0) << strerror(errno);  // committed, not ESTALE

  // The foreground mount reads that version (else its write would be a
  // stale one), then commits; the background one sees it soon.
  std::optional<std::string> seen;
  for (int i = 0; i < 50; ++i) {
    seen = ReadFile(in_fg);
    if (seen == "v1\nfrom bg\n") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(seen, "v1\nfrom bg\n");
  // Now the foreground mount writes: the background one is refused, and
  // its --log-file says why (its stderr is gone).
  held = open(in_fg.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(held, 0) << strerror(errno);
  other = open(in_bg.c_str(), O_WRONLY | O_APPEND);
  EXPECT_EQ(other, -1) << "a second writer got in while the first held it";
  EXPECT_EQ(errno, EBUSY);
  if (other >= 0) close(other);
  ASSERT_EQ(close(held), 0) << strerror(errno);
  std::string logged = ReadFile(bg_log).value_or("<no log file>");
  EXPECT_TRUE(Contains(logged, "is open for writing by user 'dev'")) << logged;
  struct stat log_st {};
  ASSERT_EQ(stat(bg_log.c_str(), &log_st), 0);
  EXPECT_EQ(log_st.st_mode & 0777, 0600u);
  ASSERT_TRUE(WriteFile(in_fg, "v3 from the foreground mount\n"));
  for (int i = 0; i < 50; ++i) {
    seen = ReadFile(in_bg);
    if (seen == "v3 from the foreground mount\n") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(seen, "v3 from the foreground mount\n");
  EXPECT_EQ(view->Stop(), 0) << view->Log();
  auto versions = History(dev, "/memories/users/dev/x.md");
  ASSERT_EQ(versions.size(), 3u);
  EXPECT_EQ(versions[1].at("size"), 11);  // "v1\nfrom bg\n"
}

// --background with relative paths (as the README writes them): the daemon
// runs in "/", so they are made absolute before it starts (before, it exited
// 0 and left a dead mount).
TEST_F(StoreCliTest, ABackgroundMountTakesRelativePaths) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  ASSERT_TRUE(ApiWrite("dev", "/memories/users/dev/x.md", "relative\n"));
  ASSERT_TRUE(WriteFile(store_dir_->Sub("dev.token"), dev + "\n", 0600));
  ASSERT_EQ(mkdir(store_dir_->Sub("mnt").c_str(), 0755), 0);
  testing::UnmountAtExit(store_dir_->Sub("mnt"));
  CommandResult r = RunCommand(
      {AGENTVFS_BINARY, "mount", "--store", "team.db", "--token-file",
       "dev.token", "--background", "mnt"},
      CommandOptions{.cwd = store_dir_->path(),
                     .env = {{"AGENTVFS_CONFIG", work_->Sub("none.yaml")}},
                     .timeout = std::chrono::seconds(15)});
  ASSERT_EQ(r.exit_status, 0) << r.output;
  EXPECT_EQ(ReadFile(store_dir_->Sub("mnt/memories/users/dev/x.md")),
            "relative\n");
  EXPECT_TRUE(testing::LazyUnmount(store_dir_->Sub("mnt")));
}

// A file open in one mount keeps its size and bytes when another mount
// replaces it by a rename (as editors and sed -i save): fstat and reads of
// the open file answer for it, not for the file now at its name (before,
// the reader's fstat showed the new file and its reads stopped at the new,
// smaller size).
TEST_F(StoreCliTest, AFileOpenInOneMountSurvivesItsReplacementInAnother) {
  const std::string lead = Init();
  const std::string dev = AddUser(lead, "dev");
  ASSERT_TRUE(WriteFile(work_->Sub("dev.token"), dev + "\n", 0600));
  const std::string big(100000, 'Y');
  ASSERT_TRUE(ApiWrite("dev", "/memories/users/dev/w.txt", big));
  TempDir ws("agentvfs-cli-ws"), ma("agentvfs-cli-ma"), mb("agentvfs-cli-mb");
  std::string error;
  const std::vector<std::string> as_dev = {"--store", db_, "--token-file",
                                           work_->Sub("dev.token")};
  auto a = MountedView::Start(ws.path(), ma.path(), as_dev, &error);
  ASSERT_NE(a, nullptr) << error;
  auto b = MountedView::Start(ws.path(), mb.path(), as_dev, &error);
  ASSERT_NE(b, nullptr) << error;
  const std::string in_b = mb.path() + "/memories/users/dev/w.txt";
  int fd = open(in_b.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << strerror(errno);
  struct stat before;
  ASSERT_EQ(fstat(fd, &before), 0);
  ASSERT_EQ(before.st_size, 100000);
  // Mount a saves a new, short version the editor way.
  const std::string dir_a = ma.path() + "/memories/users/dev/";
  ASSERT_TRUE(WriteFile(dir_a + "w.tmp", "short\n"));
  ASSERT_EQ(rename((dir_a + "w.tmp").c_str(), (dir_a + "w.txt").c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // feed
  struct stat after;
  ASSERT_EQ(fstat(fd, &after), 0);
  EXPECT_EQ(after.st_size, 100000) << "fstat answered for the new file";
  EXPECT_EQ(after.st_ino, before.st_ino);
  std::string got(200000, '\0');
  ssize_t n = pread(fd, got.data(), got.size(), 0);
  EXPECT_EQ(n, 100000) << "the open file's reads were cut short";
  close(fd);
  // The name itself shows the new file in both mounts.
  EXPECT_EQ(ReadFile(in_b), "short\n");
  EXPECT_EQ(b->Stop(), 0) << b->Log();
  EXPECT_EQ(a->Stop(), 0) << a->Log();
}

}  // namespace
}  // namespace agentvfs::e2e
