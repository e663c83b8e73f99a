// Concurrent writers of the store (issue 3, acceptance point 4): eight
// processes, each with its own StoreBackend and session, append to and
// overwrite the same shared memories at once. Every commit a writer was told
// succeeded is in History exactly once, as that writer's change on top of
// the version before it (no lost update, no mix); every rejection reached
// the writer that lost, as EBUSY or ESTALE with a message naming the file
// and the other writer; nothing a writer was not told about was committed;
// the current content is the last version. Writers that retry until they
// succeed get every record in, exactly once. Also the same rules between two
// sessions of one process, step by step.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backends/store/admin.h"
#include "backends/store/engine.h"
#include "backends/store/namespace.h"
#include "backends/store/store.h"
#include "tests/backends/store/process_test_util.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using test_util::P;
using test_util::Quote;
using test_util::ReadPath;
using test_util::ReadVersion;
using test_util::SendLine;

const std::vector<std::string> kUsers = {"a", "b", "c", "d",
                                         "e", "f", "g", "h"};
constexpr char kShared[] = "/memories/org/shared";
const std::string kLog = std::string(kShared) + "/log.md";      // appends
const std::string kNotes = std::string(kShared) + "/notes.md";  // both
const std::string kRetry = std::string(kShared) + "/retry.md";  // appends
constexpr char kInit[] = "init\n";

// One write a writer attempted, and what the store told it.
struct Attempt {
  std::string path;
  std::string user;
  int j = 0;        // the writer's operation number
  char kind = 'a';  // 'a' append, 'o' overwrite
  bool ok = false;
  std::string stage;  // where it failed: open, write, flush
  int err = 0;
  std::string message;
};

// The record a write puts in the file: unique per (user, j, kind).
std::string Record(const std::string& user, int j, char kind) {
  return user + " " + std::to_string(j) + " " + kind + "\n";
}

struct Plan {
  std::string user;
  std::string session;
  std::vector<std::string> files;
  int ops = 0;
  bool retry = false;  // retry each write until it is committed
  uint64_t seed = 0;
};

// --- the writer (runs in a forked child) ------------------------------------
//
// Reports, one line each: "K <path> <j> <kind>" committed; "X <path> <j>
// <kind> <stage> <errno> <message>" rejected; "E <text>" gave up.

class Child {
 public:
  Child(StoreBackend& backend, const Plan& plan, int out)
      : backend_(backend), plan_(plan), rng_(plan.seed), out_(out) {
    caller_.user = plan.user;
    caller_.session = plan.session;
  }

  [[noreturn]] void Run() {
    for (int j = 0; j < plan_.ops; ++j) {
      const std::string& path =
          plan_.files[Uniform(0, static_cast<int>(plan_.files.size()) - 1)];
      char kind = path == kNotes && Uniform(0, 1) == 0 ? 'o' : 'a';
      for (int attempt = 0;; ++attempt) {
        if (attempt > 100'000) Die("no progress on " + path);
        if (Try(path, j, kind) || !plan_.retry) break;
      }
    }
    _exit(0);
  }

 private:
  int Uniform(int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }

  [[noreturn]] void Die(const std::string& why) {
    SendLine(out_, ("E " + plan_.user + ": " + why).substr(0, 1000) + "\n");
    _exit(3);
  }

  // One attempt; true when committed. After ESTALE the writer reads the
  // file again (as an agent would), so that its next attempt may succeed.
  bool Try(const std::string& path, int j, char kind) {
    std::string head = path + " " + std::to_string(j) + " " + kind;
    std::string record = Record(plan_.user, j, kind);
    std::string stage = "open";
    vfs::Status result;
    {
      int flags = O_WRONLY | (kind == 'a' ? O_APPEND : O_TRUNC);
      auto file = backend_.Open(caller_, P(path), flags, 0644);
      if (!file) {
        result = std::unexpected(file.error());
      } else {
        stage = "write";
        auto put = (*file)->Write(record.data(), record.size(), 0);
        if (!put) {
          result = std::unexpected(put.error());
        } else if (*put != record.size()) {
          result = vfs::Fail(EIO, "short write");
        } else {
          // Now and then keep the file open a little, so that others find
          // it busy.
          if (Uniform(0, 2) == 0) {
            std::this_thread::sleep_for(
                std::chrono::microseconds(Uniform(0, 1000)));
          }
          stage = "flush";
          result = (*file)->Flush();
        }
      }
    }
    if (result) {
      SendLine(out_, "K " + head + "\n");
      return true;
    }
    std::string message = result.error().message;
    for (char& ch : message) {
      if (ch == '\n') ch = ' ';
    }
    SendLine(out_, ("X " + head + " " + stage + " " +
                    std::to_string(result.error().code) + " " + message)
                           .substr(0, 2000) +
                       "\n");
    if (result.error().code == ESTALE) {
      if (auto again = ReadPath(backend_, caller_, path); !again) {
        Die("re-reading " + path + ": " + again.error().ToString());
      }
    } else if (result.error().code == EBUSY) {
      std::this_thread::sleep_for(std::chrono::microseconds(Uniform(0, 2000)));
    }
    return false;
  }

  StoreBackend& backend_;
  const Plan& plan_;
  std::mt19937 rng_;
  int out_;
  vfs::Caller caller_;
};

std::vector<Attempt> ParseAttempts(const std::string& user,
                                   const std::string& text,
                                   std::vector<std::string>* errors) {
  std::vector<Attempt> out;
  for (const auto& line : test_util::SplitLines(text)) {
    std::istringstream in(line);
    std::string tag;
    Attempt a;
    a.user = user;
    in >> tag >> a.path >> a.j >> a.kind;
    if (tag == "K" && in) {
      a.ok = true;
    } else if (tag == "X" && (in >> a.stage >> a.err)) {
      std::getline(in, a.message);
      if (!a.message.empty() && a.message[0] == ' ') a.message.erase(0, 1);
    } else {
      errors->push_back(user + ": " + line);
      continue;
    }
    out.push_back(std::move(a));
  }
  return out;
}

// Every test here runs on each engine.
class ConcurrentWritersTest
    : public ::testing::TestWithParam<testing::StoreEngine> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(fx_,
                         testing::StoreFixture::Create(kUsers, {}, GetParam()));
    {
      ASSERT_OK_AND_ASSIGN(auto engine, Engine::Open(fx_->db(), false));
      ASSERT_OK(Grant(*engine, "admin", "/memories/org",
                      Subject{"everyone", ""}, Level::kWrite));
    }
    auto backend = fx_->OpenBackend();
    ASSERT_NE(backend, nullptr);
    vfs::Caller admin = fx_->CallerFor("admin", "setup");
    ASSERT_OK(backend->Mkdir(admin, P(kShared), 0755));
    for (const auto& path : {kLog, kNotes, kRetry}) {
      ASSERT_OK_AND_ASSIGN(
          auto file,
          backend->Open(admin, P(path), O_WRONLY | O_CREAT | O_EXCL, 0644));
      ASSERT_OK(file->Write(kInit, sizeof kInit - 1, 0));
      ASSERT_OK(file->Flush());
    }
    // The backend (and its thread) goes before any fork.
  }

  // Forks one writer per plan, starts them together, and collects what
  // they report. The parent holds no store open across the forks.
  std::vector<Attempt> RunWriters(const std::vector<Plan>& plans) {
    std::vector<Attempt> attempts;
    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0) {
      ADD_FAILURE() << "pipe failed";
      return attempts;
    }
    std::vector<std::array<int, 2>> out(plans.size());
    for (auto& p : out) {
      if (pipe(p.data()) != 0) {
        ADD_FAILURE() << "pipe failed";
        return attempts;
      }
      (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    }
    std::vector<pid_t> pids;
    for (size_t i = 0; i < plans.size(); ++i) {
      pid_t pid = fork();
      if (pid < 0) {
        ADD_FAILURE() << "fork failed";
        break;
      }
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(ready[0]);
        close(go[1]);
        for (size_t k = 0; k < out.size(); ++k) {
          close(out[k][0]);
          if (k != i) close(out[k][1]);
        }
        auto backend = StoreBackend::Open(fx_->db());
        if (!backend) {
          SendLine(out[i][1],
                   "E open store: " + backend.error().ToString() + "\n");
          _exit(3);
        }
        // Ready; then wait until the parent lets everyone go at once.
        SendLine(ready[1], "r");
        char byte;
        while (read(go[0], &byte, 1) < 0 && errno == EINTR) {
        }
        Child(**backend, plans[i], out[i][1]).Run();
      }
      pids.push_back(pid);
    }
    close(ready[1]);
    close(go[0]);
    std::vector<int> fds;
    for (auto& p : out) {
      close(p[1]);
      fds.push_back(p[0]);
    }
    size_t ready_count = 0;
    char buf[64];
    while (ready_count < pids.size()) {
      ssize_t n = read(ready[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      ready_count += static_cast<size_t>(n);
    }
    close(ready[0]);
    EXPECT_EQ(ready_count, plans.size()) << "not every writer got ready";
    close(go[1]);  // go

    bool timed_out = false;
    auto texts =
        test_util::ReadUntilEof(fds, std::chrono::seconds(240), &timed_out);
    for (int fd : fds) close(fd);
    EXPECT_FALSE(timed_out) << "the writers did not finish in time";
    for (pid_t pid : pids) {
      if (timed_out) kill(pid, SIGKILL);
      int status = 0;
      waitpid(pid, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "writer " << pid << " ended with status " << status;
    }
    std::vector<std::string> errors;
    for (size_t i = 0; i < plans.size(); ++i) {
      auto some = ParseAttempts(plans[i].user, texts[i], &errors);
      attempts.insert(attempts.end(), some.begin(), some.end());
    }
    for (const auto& e : errors) ADD_FAILURE() << "writer reported: " << e;
    return attempts;
  }

  // Rejections are EBUSY or ESTALE, each with a message that names the file
  // and the other writer.
  void CheckRejections(const std::vector<Attempt>& attempts) {
    std::map<std::string, int> counts;
    for (const auto& a : attempts) {
      if (a.ok) {
        ++counts["committed"];
        continue;
      }
      ++counts[vfs::ErrnoName(a.err) + " at " + a.stage];
      std::string what = a.user + " " + std::to_string(a.j) + " " + a.kind +
                         " on " + a.path + ": " + vfs::ErrnoName(a.err) +
                         " at " + a.stage + ": " + Quote(a.message, 400);
      EXPECT_TRUE(a.err == EBUSY || a.err == ESTALE) << what;
      EXPECT_NE(a.message.find(a.path), std::string::npos)
          << "the message does not name the file: " << what;
      EXPECT_NE(a.message.find("user '"), std::string::npos)
          << "the message does not name the other writer: " << what;
      EXPECT_EQ(a.message.find("user '" + a.user + "'"), std::string::npos)
          << "the writer is told about itself: " << what;
    }
    std::string summary;
    for (const auto& [k, n] : counts) {
      summary += " " + k + ": " + std::to_string(n) + ";";
    }
    std::printf("attempts:%s\n", summary.c_str());
  }

  // History of `path` against what the writers were told: returns the
  // final content.
  std::string CheckHistory(const std::string& path,
                           const std::vector<Attempt>& attempts,
                           const std::map<std::string, std::string>& sessions) {
    SCOPED_TRACE(path);
    using Key = std::tuple<std::string, int, char>;
    std::map<Key, const Attempt*> acked, rejected;
    for (const auto& a : attempts) {
      if (a.path != path) continue;
      (a.ok ? acked : rejected)[Key{a.user, a.j, a.kind}] = &a;
    }
    auto backend = fx_->OpenBackend();
    if (backend == nullptr) return "";
    vfs::Caller admin = fx_->CallerFor("admin", "check");
    auto history = backend->History(admin, P(path));
    if (!history) {
      ADD_FAILURE() << "History: " << history.error().ToString();
      return "";
    }
    if (history->empty()) {
      ADD_FAILURE() << "no versions";
      return "";
    }
    std::string prev;
    std::set<Key> found;
    for (const auto& v : *history) {
      SCOPED_TRACE("version " + std::to_string(v.n) + " by session " +
                   v.session);
      EXPECT_FALSE(v.deleted);
      auto got = ReadVersion(*backend, admin, path, v.n);
      if (!got) {
        ADD_FAILURE() << "reading it: " << got.error().ToString();
        return "";
      }
      const std::string& content = *got;
      EXPECT_EQ(v.size, static_cast<int64_t>(content.size()));
      if (&v == &history->front()) {
        EXPECT_EQ(content, kInit);
        EXPECT_EQ(v.session, "setup");
        prev = content;
        continue;
      }
      // One record on top of the version before (append), or one record
      // alone (overwrite); anything else lost or mixed someone's data.
      auto one_line = [](std::string_view s) {
        return !s.empty() && s.back() == '\n' && s.find('\n') == s.size() - 1;
      };
      std::string record;
      char as = 0;
      if (content.size() > prev.size() && content.starts_with(prev) &&
          one_line(std::string_view(content).substr(prev.size()))) {
        record = content.substr(prev.size());
        as = 'a';
      } else if (one_line(content)) {
        record = content;
        as = 'o';
      } else {
        ADD_FAILURE() << "neither one record appended to the previous "
                         "version nor one record alone: "
                      << Quote(content) << "\nprevious: " << Quote(prev);
        prev = content;
        continue;
      }
      std::istringstream in(record);
      Key key;
      in >> std::get<0>(key) >> std::get<1>(key) >> std::get<2>(key);
      EXPECT_EQ(std::get<2>(key), as)
          << "record " << Quote(record) << " is in the file as "
          << (as == 'a' ? "an append" : "an overwrite")
          << ": the data before it was lost";
      EXPECT_EQ(record,
                Record(std::get<0>(key), std::get<1>(key), std::get<2>(key)));
      EXPECT_EQ(v.author, std::get<0>(key));
      auto session = sessions.find(std::get<0>(key));
      EXPECT_TRUE(session != sessions.end() && v.session == session->second)
          << "committed by session " << v.session << " for user "
          << std::get<0>(key);
      EXPECT_TRUE(found.insert(key).second)
          << "record " << Quote(record) << " committed twice";
      if (!acked.count(key)) {
        auto r = rejected.find(key);
        if (r != rejected.end()) {
          ADD_FAILURE() << "committed although its writer was told it "
                           "failed ("
                        << vfs::ErrnoName(r->second->err) << " at "
                        << r->second->stage << ": " << r->second->message
                        << "): " << Quote(record);
        } else {
          ADD_FAILURE() << "committed but no writer attempted it: "
                        << Quote(record);
        }
      }
      prev = content;
    }
    for (const auto& [key, a] : acked) {
      EXPECT_TRUE(found.count(key))
          << "lost: acknowledged to " << a->user
          << " but in no version: " << Quote(Record(a->user, a->j, a->kind));
    }
    EXPECT_EQ(history->size(), acked.size() + 1)
        << "versions vs acknowledged commits (+1 for the initial one)";
    auto now = ReadPath(*backend, fx_->CallerFor("admin", "final"), path);
    EXPECT_TRUE(now.has_value());
    if (now) {
      EXPECT_EQ(*now, prev) << "the current content is not the last version";
    }
    return prev;
  }

  std::vector<Plan> Plans(const std::string& prefix,
                          const std::vector<std::string>& files, int ops,
                          bool retry) {
    std::random_device seed;
    std::vector<Plan> plans;
    for (const auto& user : kUsers) {
      plans.push_back(Plan{user, prefix + user, files, ops, retry, seed()});
    }
    return plans;
  }

  std::map<std::string, std::string> Sessions(const std::vector<Plan>& plans) {
    std::map<std::string, std::string> out{{"admin", "setup"}};
    for (const auto& p : plans) out[p.user] = p.session;
    return out;
  }

  std::unique_ptr<testing::StoreFixture> fx_;
};

TEST_P(ConcurrentWritersTest, EightProcessesLoseNoAcknowledgedCommit) {
  auto plans = Plans("cw-", {kLog, kNotes}, 50, /*retry=*/false);
  auto attempts = RunWriters(plans);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(attempts.size(), plans.size() * 50);
  CheckRejections(attempts);
  size_t rejected = 0, acked = 0;
  for (const auto& a : attempts) (a.ok ? acked : rejected)++;
  // Otherwise this run tested no conflict at all (or no commit).
  EXPECT_GT(rejected, 0u);
  EXPECT_GT(acked, 0u);
  auto sessions = Sessions(plans);
  CheckHistory(kLog, attempts, sessions);
  CheckHistory(kNotes, attempts, sessions);
}

TEST_P(ConcurrentWritersTest, RetryingWritersGetEveryRecordInExactlyOnce) {
  constexpr int kOps = 25;
  auto plans = Plans("rw-", {kRetry}, kOps, /*retry=*/true);
  auto attempts = RunWriters(plans);
  ASSERT_FALSE(HasFailure());
  CheckRejections(attempts);
  std::string final_content = CheckHistory(kRetry, attempts, Sessions(plans));
  std::map<std::string, int> lines;
  for (const auto& line : test_util::SplitLines(final_content)) ++lines[line];
  std::map<std::string, int> want{{"init", 1}};
  for (const auto& user : kUsers) {
    for (int j = 0; j < kOps; ++j)
      want[user + " " + std::to_string(j) + " a"] = 1;
  }
  EXPECT_EQ(lines, want);
}

INSTANTIATE_TEST_SUITE_P(Engines, ConcurrentWritersTest,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

// --- two sessions of one process ---------------------------------------------

// Users a and b, both of team t, in a store of the engine under test.
class StoreConflictsInOneProcess
    : public ::testing::TestWithParam<testing::StoreEngine> {
 protected:
  void SetUp() override {
    auto f = testing::StoreFixture::Create(
        {"a", "b"}, {{"a", {"t"}}, {"b", {"t"}}}, GetParam());
    ASSERT_TRUE(f.has_value()) << f.error().ToString();
    fx_ = std::move(*f);
  }

  // Leases of 600 ms, renewed every 20 ms: a lease nobody renews is gone
  // within two lease lengths.
  static StoreOptions QuickLeases() {
    StoreOptions quick;
    quick.lease_ttl = std::chrono::milliseconds(600);
    quick.poll_interval = std::chrono::milliseconds(20);
    return quick;
  }

  std::unique_ptr<testing::StoreFixture> fx_;
};
INSTANTIATE_TEST_SUITE_P(Engines, StoreConflictsInOneProcess,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

TEST_P(StoreConflictsInOneProcess, LeaseStaleWriterAndExclusiveCreate) {
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string path = "/memories/teams/t/plan.md";
  auto write = [&](const vfs::Caller& c, int flags, const std::string& data) {
    auto file = backend->Open(c, P(path), flags, 0644);
    if (!file) return vfs::Status(std::unexpected(file.error()));
    auto put = (*file)->Write(data.data(), data.size(), 0);
    if (!put) return vfs::Status(std::unexpected(put.error()));
    return (*file)->Flush();
  };

  // A is writing (holds the lease): B may not write, truncate or unlink.
  ASSERT_OK_AND_ASSIGN(
      auto held, backend->Open(a, P(path), O_WRONLY | O_CREAT | O_EXCL, 0644));
  ASSERT_OK(held->Write("a1\n", 3, 0));
  auto busy = backend->Open(b, P(path), O_WRONLY, 0);
  ASSERT_ERRNO(busy, EBUSY);
  EXPECT_NE(busy.error().message.find("user 'a'"), std::string::npos)
      << busy.error().message;
  EXPECT_ERRNO(backend->Open(b, P(path), O_WRONLY | O_TRUNC, 0), EBUSY);
  EXPECT_ERRNO(backend->Truncate(b, P(path), 0), EBUSY);
  EXPECT_ERRNO(backend->Unlink(b, P(path)), EBUSY);
  EXPECT_ERRNO(backend->Open(b, P(path), O_WRONLY | O_CREAT | O_EXCL, 0644),
               EEXIST);
  ASSERT_OK(held->Flush());  // version 1
  held.reset();

  // A closed: B (who never read the file) writes.
  ASSERT_OK(write(b, O_WRONLY | O_TRUNC, "b2\n"));  // version 2

  // A reads version 2; B commits version 3; A may not write what it read.
  ASSERT_OK_AND_ASSIGN(auto seen, ReadPath(*backend, a, path));
  EXPECT_EQ(seen, "b2\n");
  ASSERT_OK(write(b, O_WRONLY | O_TRUNC, "b3\n"));
  auto stale = backend->Open(a, P(path), O_WRONLY, 0);
  ASSERT_ERRNO(stale, ESTALE);
  EXPECT_NE(stale.error().message.find("user 'b'"), std::string::npos)
      << stale.error().message;
  EXPECT_NE(stale.error().message.find("version 3"), std::string::npos)
      << stale.error().message;
  EXPECT_ERRNO(backend->Open(a, P(path), O_WRONLY | O_APPEND, 0), ESTALE);
  EXPECT_ERRNO(backend->Truncate(a, P(path), 0), ESTALE);
  EXPECT_ERRNO(backend->Unlink(a, P(path)), ESTALE);
  const std::string other = "/memories/teams/t/other.md";
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(a, P(other), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Flush());
  }
  EXPECT_ERRNO(backend->Rename(a, P(other), P(path), 0), ESTALE);
  ASSERT_OK_AND_ASSIGN(auto unchanged, ReadPath(*backend, b, path));
  EXPECT_EQ(unchanged, "b3\n");

  // A reads it again; now A's write goes through.
  ASSERT_OK_AND_ASSIGN(auto reread, ReadPath(*backend, a, path));
  EXPECT_EQ(reread, "b3\n");
  ASSERT_OK(write(a, O_WRONLY | O_TRUNC, "a4\n"));

  ASSERT_OK_AND_ASSIGN(auto history, backend->History(a, P(path)));
  std::vector<std::pair<std::string, std::string>> got,
      want = {{a.session, "a1\n"},
              {b.session, "b2\n"},
              {b.session, "b3\n"},
              {a.session, "a4\n"}};
  for (const auto& v : history) {
    ASSERT_OK_AND_ASSIGN(auto content, ReadVersion(*backend, a, path, v.n));
    got.emplace_back(v.session, content);
  }
  EXPECT_EQ(got, want);

  // Racing exclusive creates of one name: one wins, the other gets EEXIST;
  // the file holds the winner's data and nothing else.
  for (int i = 0; i < 40; ++i) {
    std::string name = "/memories/teams/t/race-" + std::to_string(i);
    std::latch start(2);
    vfs::Status result[2];
    std::thread racers[2];
    const vfs::Caller* callers[2] = {&a, &b};
    for (int k = 0; k < 2; ++k) {
      racers[k] = std::thread([&, k] {
        start.arrive_and_wait();
        auto file = backend->Open(*callers[k], P(name),
                                  O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (!file) {
          result[k] = std::unexpected(file.error());
          return;
        }
        std::string data = callers[k]->user + "\n";
        auto put = (*file)->Write(data.data(), data.size(), 0);
        result[k] =
            put ? (*file)->Flush() : vfs::Status(std::unexpected(put.error()));
      });
    }
    for (auto& t : racers) t.join();
    SCOPED_TRACE(name);
    ASSERT_NE(result[0].has_value(), result[1].has_value())
        << "a: " << (result[0] ? "ok" : result[0].error().ToString())
        << "; b: " << (result[1] ? "ok" : result[1].error().ToString());
    int winner = result[0] ? 0 : 1;
    EXPECT_ERRNO(result[1 - winner], EEXIST);
    ASSERT_OK_AND_ASSIGN(auto content, ReadPath(*backend, a, name));
    EXPECT_EQ(content, callers[winner]->user + "\n");
    ASSERT_OK_AND_ASSIGN(auto versions, backend->History(a, P(name)));
    ASSERT_EQ(versions.size(), 1u);
    EXPECT_EQ(versions[0].session, callers[winner]->session);
  }
}

// A Flush that fails with EBUSY because the session's lease ran out says
// "nothing was committed; read it again and redo the change": the handle's
// release must not commit the draft later anyway (a writer that redoes its
// append, as it was told, would get it in twice).
TEST_P(StoreConflictsInOneProcess, RejectedFlushCommitsNothingAtRelease) {
  StoreOptions unrenewed;  // A's lease runs out: it is never renewed
  unrenewed.lease_ttl = std::chrono::milliseconds(200);
  unrenewed.poll_interval = std::chrono::hours(1);
  auto backend_a = fx_->OpenBackend(unrenewed);
  auto backend_b = fx_->OpenBackend();
  ASSERT_TRUE(backend_a != nullptr && backend_b != nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string path = "/memories/teams/t/log.md";
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend_b->Open(b, P(path), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Write(kInit, sizeof kInit - 1, 0));
    ASSERT_OK(f->Flush());  // version 1
  }
  ASSERT_OK_AND_ASSIGN(auto late,
                       backend_a->Open(a, P(path), O_WRONLY | O_APPEND, 0));
  ASSERT_OK(late->Write("a\n", 2, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  // B takes the file over (A's lease ran out) and holds it.
  ASSERT_OK_AND_ASSIGN(auto holder, backend_b->Open(b, P(path), O_WRONLY, 0));
  auto rejected = late->Flush();
  ASSERT_ERRNO(rejected, EBUSY);
  EXPECT_NE(rejected.error().message.find("nothing was committed"),
            std::string::npos)
      << rejected.error().message;
  ASSERT_OK(holder->Flush());  // B closes without writing
  holder.reset();
  late.reset();  // A's close(2) already failed; the release commits nothing
  ASSERT_OK_AND_ASSIGN(auto history, backend_b->History(b, P(path)));
  EXPECT_EQ(history.size(), 1u)
      << "a version appeared after its writer was told nothing was committed";
  ASSERT_OK_AND_ASSIGN(auto now, ReadPath(*backend_b, b, path));
  EXPECT_EQ(now, kInit);
}

}  // namespace
}  // namespace agentvfs::store

namespace agentvfs::store {
namespace {

// fsync(2) of any descriptor acknowledges what the session wrote: the draft
// is shared by the session's handles, so a read-only one commits it too.
TEST_P(StoreConflictsInOneProcess, FsyncOfAReadHandleCommitsTheSessionsWrites) {
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string path = "/memories/teams/t/synced.md";
  ASSERT_OK_AND_ASSIGN(auto w,
                       backend->Open(a, P(path), O_WRONLY | O_CREAT, 0644));
  ASSERT_OK(w->Write("kept\n", 5, 0));
  ASSERT_OK_AND_ASSIGN(auto r, backend->Open(a, P(path), O_RDONLY, 0));
  ASSERT_OK(r->Sync(false));
  ASSERT_OK_AND_ASSIGN(auto history, backend->History(b, P(path)));
  EXPECT_FALSE(history.empty()) << "fsync returned 0 and nothing was committed";
  ASSERT_OK_AND_ASSIGN(auto seen, ReadPath(*backend, b, path));
  EXPECT_EQ(seen, "kept\n");
}

// Staleness follows the path too: a file saved over by rename (as editors
// and `sed -i` do), or removed and made again, is not overwritten by a
// session that read the file it replaced, neither by an open with O_TRUNC
// nor by a rename onto it. Reading it again clears that.
TEST_P(StoreConflictsInOneProcess,
       AReplacedFileIsNotOverwrittenByAStaleReader) {
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string dir = "/memories/teams/t/";
  auto write = [&](const vfs::Caller& who, const std::string& name,
                   const std::string& data) -> vfs::Status {
    auto f =
        backend->Open(who, P(dir + name), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!f) return std::unexpected(f.error());
    if (auto w = (*f)->Write(data.data(), data.size(), 0); !w)
      return std::unexpected(w.error());
    return (*f)->Flush();
  };
  ASSERT_OK(write(b, "x", "b1\n"));
  ASSERT_OK_AND_ASSIGN(auto read, ReadPath(*backend, a, dir + "x"));  // A reads
  ASSERT_EQ(read, "b1\n");
  // B saves x by writing a new file and renaming it over x.
  ASSERT_OK(write(b, ".x.tmp", "b2\n"));
  ASSERT_OK(backend->Rename(b, P(dir + ".x.tmp"), P(dir + "x"), 0));
  EXPECT_ERRNO(backend->Open(a, P(dir + "x"), O_WRONLY | O_TRUNC, 0), ESTALE);
  ASSERT_OK(write(a, ".a.tmp", "a1\n"));
  EXPECT_ERRNO(backend->Rename(a, P(dir + ".a.tmp"), P(dir + "x"), 0), ESTALE);
  ASSERT_OK_AND_ASSIGN(auto now, ReadPath(*backend, b, dir + "x"));
  EXPECT_EQ(now, "b2\n") << "B's save was overwritten";
  // B removes x and makes it again.
  ASSERT_OK_AND_ASSIGN(read, ReadPath(*backend, a, dir + "x"));
  ASSERT_OK(backend->Unlink(b, P(dir + "x")));
  ASSERT_OK(write(b, "x", "b3\n"));
  EXPECT_ERRNO(backend->Open(a, P(dir + "x"), O_WRONLY | O_TRUNC, 0), ESTALE);
  // Having read what is there now, A may write it.
  ASSERT_OK_AND_ASSIGN(read, ReadPath(*backend, a, dir + "x"));
  EXPECT_EQ(read, "b3\n");
  EXPECT_OK(write(a, "x", "a2\n"));
  // A session replacing a file it read itself is not stale.
  ASSERT_OK(write(a, ".a.tmp", "a3\n"));
  EXPECT_OK(backend->Rename(a, P(dir + ".a.tmp"), P(dir + "x"), 0));
  EXPECT_OK(write(a, "x", "a4\n"));
}

// RENAME_EXCHANGE gives each name the other file, like a rename onto it:
// not while another session holds either file open for writing.
TEST_P(StoreConflictsInOneProcess, AnExchangeRespectsTheLeasesOfBothFiles) {
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string x = "/memories/teams/t/x", y = "/memories/teams/t/y";
  for (const auto& path : {x, y}) {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(b, P(path), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Flush());
  }
  for (const auto& held : {x, y}) {
    SCOPED_TRACE(held);
    ASSERT_OK_AND_ASSIGN(auto holder, backend->Open(a, P(held), O_WRONLY, 0));
    EXPECT_ERRNO(backend->Rename(b, P(y), P(x), RENAME_EXCHANGE), EBUSY);
    ASSERT_OK(holder->Flush());
  }
  EXPECT_OK(backend->Rename(b, P(y), P(x), RENAME_EXCHANGE));
}

// Two handles of one session: one closing while the other opens. The close
// that finds itself the last holder must not end the lease the opening
// handle's transaction has just taken (it registers as a holder a moment
// later), or another session writes while this one holds the file open.
TEST_P(StoreConflictsInOneProcess,
       AHandleClosingWhileAnotherOfItsSessionOpensKeepsTheLease) {
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string path = "/memories/teams/t/shared.md";
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(a, P(path), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Write("x\n", 2, 0));
    ASSERT_OK(f->Flush());
  }
  // b has read the file: its opens are never stale (nobody writes it).
  { ASSERT_OK_AND_ASSIGN(auto f, backend->Open(b, P(path), O_RDONLY, 0)); }
  constexpr int kRounds = 3000;
  std::atomic<int> a_open{0};  // a's handles open right now
  std::atomic<bool> done{false};
  std::atomic<int> b_wins{0}, overlaps{0}, other_errors{0};
  std::string first_error;
  std::mutex error_mu;
  auto note_error = [&](const vfs::Error& e) {
    ++other_errors;
    std::lock_guard lock(error_mu);
    if (first_error.empty()) first_error = e.ToString();
  };
  auto a_loop = [&] {
    for (int i = 0; i < kRounds && !done; ++i) {
      auto f = backend->Open(a, P(path), O_WRONLY, 0);
      if (!f) {
        if (f.error().code != EBUSY) note_error(f.error());
        continue;
      }
      ++a_open;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      --a_open;
      auto flushed = (*f)->Flush();
      if (!flushed) note_error(flushed.error());
    }
  };
  auto b_loop = [&] {
    while (!done) {
      auto f = backend->Open(b, P(path), O_WRONLY, 0);
      if (!f) {
        if (f.error().code != EBUSY) note_error(f.error());
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      // While b holds the lease, a cannot open: a handle of a's open now
      // was opened before b's, and b took the file away from it.
      if (a_open.load() > 0) ++overlaps;
      ++b_wins;
      auto flushed = (*f)->Flush();
      if (!flushed) note_error(flushed.error());
    }
  };
  std::thread a1(a_loop), a2(a_loop), b1(b_loop);
  a1.join();
  a2.join();
  done = true;
  b1.join();
  EXPECT_EQ(overlaps.load(), 0)
      << "b opened the file for writing while a held it open, "
      << overlaps.load() << " times (b won " << b_wins.load() << " times)";
  EXPECT_EQ(other_errors.load(), 0) << first_error;
  // a closed every handle: its lease is gone, not left behind.
  EXPECT_OK(backend->Open(b, P(path), O_WRONLY, 0));
}

// Renewal extends the leases this process holds, and only those. A lease
// row of this process that no handle holds (its release's transaction
// failed; here copied in by hand) runs out on its own, even after a
// session opened a file twice for writing.
TEST_P(StoreConflictsInOneProcess, ALeaseNoHandleHoldsIsNotRenewed) {
  auto backend = fx_->OpenBackend(QuickLeases());
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string held = "/memories/teams/t/held.md";
  const std::string orphan = "/memories/teams/t/orphan.md";
  for (const auto& path : {held, orphan}) {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(b, P(path), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Flush());
  }
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Open(fx_->db(), false));
  auto copy_lease = [&] {
    return engine->Write(Durability::kProcess, [&](Txn& t) -> vfs::Status {
      auto r = t.Exec(
          "INSERT INTO leases(ino, session, \"user\", host, pid, pid_start, "
          "expires_ns) SELECT o.ino, l.session, l.\"user\", l.host, l.pid, "
          "l.pid_start, l.expires_ns FROM leases l, dentries h, dentries o "
          "WHERE l.ino = h.ino AND h.name = 'held.md' AND o.name = "
          "'orphan.md'");
      if (!r) return std::unexpected(r.error());
      if (*r != 1) return vfs::Fail(EIO, "no lease of held.md to copy");
      return {};
    });
  };
  {
    ASSERT_OK_AND_ASSIGN(auto f1, backend->Open(a, P(held), O_WRONLY, 0));
    ASSERT_OK_AND_ASSIGN(auto f2, backend->Open(a, P(held), O_WRONLY, 0));
    ASSERT_OK(copy_lease());
    EXPECT_ERRNO(backend->Open(b, P(orphan), O_WRONLY, 0), EBUSY);
    ASSERT_OK(f1->Flush());
    ASSERT_OK(f2->Flush());
  }
  EXPECT_OK(backend->Open(b, P(held), O_WRONLY, 0));
  // Two lease lengths: long enough for the copy to run out unless renewed.
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  EXPECT_OK(backend->Open(b, P(orphan), O_WRONLY, 0));
}

// A holder whose user may no longer write the file (left the team, was
// disabled) gives its lease up at the next renewal: its open handle no
// longer keeps everyone else, admins included, out of the file, and what it
// wrote is not committed.
TEST_P(StoreConflictsInOneProcess, ALeaseEndsWhenItsHolderMayNoLongerWrite) {
  StoreOptions options = QuickLeases();
  options.auth_ttl = std::chrono::milliseconds(50);
  auto backend = fx_->OpenBackend(options);
  ASSERT_NE(backend, nullptr);
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Open(fx_->db(), false));
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  vfs::Caller admin = fx_->CallerFor("admin");
  const std::string path = "/memories/teams/t/plan.md";
  {
    ASSERT_OK_AND_ASSIGN(
        auto f, backend->Open(admin, P(path), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Write("v1\n", 3, 0));
    ASSERT_OK(f->Flush());
  }
  // Waits (up to 5 s, far beyond a renewal) until `c` may open the file for
  // writing, then writes `data` through that open (having read it first, so
  // as not to be a stale writer).
  auto write_once_free = [&](const vfs::Caller& c, const std::string& data) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    if (auto seen = ReadPath(*backend, c, path); !seen) {
      return vfs::Status(std::unexpected(seen.error()));
    }
    for (;;) {
      auto f = backend->Open(c, P(path), O_WRONLY | O_TRUNC, 0);
      if (f) {
        auto put = (*f)->Write(data.data(), data.size(), 0);
        if (!put) return vfs::Status(std::unexpected(put.error()));
        return (*f)->Flush();
      }
      if (f.error().code != EBUSY ||
          std::chrono::steady_clock::now() > deadline) {
        return vfs::Status(std::unexpected(f.error()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };

  // a leaves the team while writing.
  ASSERT_OK_AND_ASSIGN(auto held_a, backend->Open(a, P(path), O_WRONLY, 0));
  ASSERT_OK(held_a->Write("a2\n", 3, 0));
  EXPECT_ERRNO(backend->Open(b, P(path), O_WRONLY, 0), EBUSY);
  ASSERT_OK(store::RemoveMember(*engine, "admin", "t", "a"));
  ASSERT_OK(write_once_free(b, "b2\n"));
  EXPECT_FALSE(held_a->Flush().has_value());
  held_a.reset();
  ASSERT_OK_AND_ASSIGN(auto after_a, ReadPath(*backend, b, path));
  EXPECT_EQ(after_a, "b2\n");

  // b is disabled while writing.
  ASSERT_OK_AND_ASSIGN(auto held_b, backend->Open(b, P(path), O_WRONLY, 0));
  ASSERT_OK(held_b->Write("b3\n", 3, 0));
  EXPECT_ERRNO(backend->Open(admin, P(path), O_WRONLY, 0), EBUSY);
  ASSERT_OK(store::SetUserDisabled(*engine, "admin", "b", true));
  ASSERT_OK(write_once_free(admin, "admin3\n"));
  EXPECT_FALSE(held_b->Flush().has_value());
  held_b.reset();
  ASSERT_OK_AND_ASSIGN(auto after_b, ReadPath(*backend, admin, path));
  EXPECT_EQ(after_b, "admin3\n");
}

// A session that found no file at a name (the kernel looks a name up
// before it creates, renames or links there) and then writes the file
// another session made there since, unread, is the second of two creates:
// EEXIST. A file the session moved or linked there itself is no such
// thing: it knows what it put there.
TEST_P(StoreConflictsInOneProcess,
       ABlindCreateIsRefusedButNotAFileTheSessionPlaced) {
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string dir = "/memories/teams/t/";
  auto make = [&](const vfs::Caller& c, const std::string& name) {
    auto f = backend->Open(c, P(dir + name), O_WRONLY | O_CREAT, 0644);
    if (!f) return vfs::Status(std::unexpected(f.error()));
    auto put = (*f)->Write("made by b\n", 10, 0);
    if (!put) return vfs::Status(std::unexpected(put.error()));
    return (*f)->Flush();
  };
  EXPECT_ERRNO(backend->Stat(a, P(dir + "new")), ENOENT);
  ASSERT_OK(make(b, "new"));
  auto blind = backend->Open(a, P(dir + "new"), O_WRONLY | O_CREAT, 0644);
  ASSERT_ERRNO(blind, EEXIST);
  EXPECT_NE(blind.error().message.find("user 'b'"), std::string::npos)
      << blind.error().message;
  EXPECT_ERRNO(backend->Unlink(a, P(dir + "new")), ESTALE);
  ASSERT_OK_AND_ASSIGN(auto seen, ReadPath(*backend, a, dir + "new"));
  EXPECT_EQ(seen, "made by b\n");
  EXPECT_OK(backend->Open(a, P(dir + "new"), O_WRONLY | O_APPEND, 0));
  // An append replaces nothing: it goes through.
  EXPECT_ERRNO(backend->Stat(a, P(dir + "log")), ENOENT);
  ASSERT_OK(make(b, "log"));
  EXPECT_OK(
      backend->Open(a, P(dir + "log"), O_WRONLY | O_CREAT | O_APPEND, 0644));

  ASSERT_OK(make(b, "moved"));
  ASSERT_OK(make(b, "linked"));
  for (const char* name : {"moved-here", "linked-here"})
    EXPECT_ERRNO(backend->Stat(a, P(dir + name)), ENOENT);
  ASSERT_OK(backend->Rename(a, P(dir + "moved"), P(dir + "moved-here"), 0));
  ASSERT_OK(backend->Link(a, P(dir + "linked"), P(dir + "linked-here")));
  EXPECT_OK(backend->Open(a, P(dir + "moved-here"), O_WRONLY | O_APPEND, 0));
  EXPECT_OK(backend->Open(a, P(dir + "linked-here"), O_WRONLY | O_APPEND, 0));
}

// A release whose transaction fails leaves the lease's row behind; the
// process no longer renews it, so it runs out instead of blocking the file
// for as long as the process lives.
TEST_P(StoreConflictsInOneProcess, ALeaseWhoseReleaseFailedRunsOut) {
  auto backend = fx_->OpenBackend(QuickLeases());
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string path = "/memories/teams/t/held.md";
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(b, P(path), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Flush());
  }
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Open(fx_->db(), false));
  const bool pg = GetParam() == testing::StoreEngine::kPostgres;
  auto exec = [&](const std::string& sql) {
    return engine->Write(Durability::kProcess, [&](Txn& t) -> vfs::Status {
      auto r = t.Exec(sql);
      if (!r) return std::unexpected(r.error());
      return {};
    });
  };
  // Every DELETE of a lease fails while the trigger is there.
  if (pg) {
    ASSERT_OK(exec(
        "CREATE FUNCTION keep_leases() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'leases are kept'; END $$"));
    ASSERT_OK(
        exec("CREATE TRIGGER keep_leases BEFORE DELETE ON leases FOR "
             "EACH ROW EXECUTE FUNCTION keep_leases()"));
  } else {
    ASSERT_OK(
        exec("CREATE TRIGGER keep_leases BEFORE DELETE ON leases "
             "BEGIN SELECT RAISE(ABORT, 'leases are kept'); END"));
  }
  {
    ASSERT_OK_AND_ASSIGN(auto f, backend->Open(a, P(path), O_WRONLY, 0));
    EXPECT_FALSE(f->Flush().has_value()) << "the release should have failed";
  }
  ASSERT_OK(
      exec("DROP TRIGGER keep_leases" + std::string(pg ? " ON leases" : "")));
  EXPECT_ERRNO(backend->Open(b, P(path), O_WRONLY, 0), EBUSY);
  // Two lease lengths: long enough for the row to run out unless renewed.
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  EXPECT_OK(backend->Open(b, P(path), O_WRONLY, 0));
}

// An engine that passes everything on to a real one, except that it can
// lose the acknowledgement of one write: the transaction commits, and the
// caller is told it failed, as when the connection to PostgreSQL breaks
// while the server commits.
class LostAckEngine final : public Engine {
 public:
  explicit LostAckEngine(std::unique_ptr<Engine> real)
      : real_(std::move(real)) {}
  // The next write made on the calling thread.
  void LoseNextAckOnThisThread() { victim_ = std::this_thread::get_id(); }
  // The next write made on the calling thread fails before it commits
  // anything, as when the server is down.
  void FailNextOnThisThread() { failing_ = std::this_thread::get_id(); }

  vfs::Status Write(Durability d, const TxnFn& fn) override {
    if (failing_.load() == std::this_thread::get_id()) {
      failing_ = std::thread::id();
      return vfs::Fail(EIO, "the server is down");
    }
    auto done = real_->Write(d, fn);
    if (done && victim_.load() == std::this_thread::get_id()) {
      victim_ = std::thread::id();
      return vfs::Fail(EIO, "the connection broke while committing");
    }
    return done;
  }
  vfs::Status Read(const TxnFn& fn) override { return real_->Read(fn); }
  vfs::Status Barrier() override { return real_->Barrier(); }
  int SchemaVersion() const override { return real_->SchemaVersion(); }
  std::string Describe() const override { return real_->Describe(); }
  std::string ScratchDir() const override { return real_->ScratchDir(); }
  vfs::Status Compact() override { return real_->Compact(); }
  void WatchChanges(std::function<void()> on_change) override {
    real_->WatchChanges(std::move(on_change));
  }

 private:
  std::unique_ptr<Engine> real_;
  std::atomic<std::thread::id> victim_{};
  std::atomic<std::thread::id> failing_{};
};

// Two descriptors of one session write a file (their writes share the
// session's draft). When the commit at one's close fails, what the other
// wrote was in it too: its close fails as well, where it returned 0 and
// its bytes were gone. Nothing of the failed draft is committed later.
TEST_P(StoreConflictsInOneProcess, AFailedCommitIsToldToEveryDescriptorInIt) {
  ASSERT_OK_AND_ASSIGN(auto real, Engine::Open(fx_->db(), false));
  auto lossy = std::make_unique<LostAckEngine>(std::move(real));
  LostAckEngine* engine = lossy.get();
  auto backend = StoreBackend::Serve(std::move(lossy), QuickLeases());
  vfs::Caller a = fx_->CallerFor("a");
  const std::string path = "/memories/teams/t/shared.md";
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(a, P(path), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Write("base\n", 5, 0));
    ASSERT_OK(f->Flush());
  }
  ASSERT_OK_AND_ASSIGN(auto p2,
                       backend->Open(a, P(path), O_WRONLY | O_APPEND, 0));
  ASSERT_OK_AND_ASSIGN(auto p3,
                       backend->Open(a, P(path), O_WRONLY | O_APPEND, 0));
  ASSERT_OK(p2->Write("p2\n", 3, 0));
  ASSERT_OK(p3->Write("p3\n", 3, 0));
  engine->FailNextOnThisThread();
  EXPECT_ERRNO(p3->Flush(), EIO);
  auto told = p2->Flush();
  ASSERT_ERRNO(told, EIO);
  EXPECT_NE(told.error().message.find("was not committed"), std::string::npos)
      << told.error().message;
  // Every close and fsync of the descriptor says so (a child's close of
  // a shared descriptor must not use the error up), and so does the
  // descriptor whose commit failed; the next write is told, and clears it.
  EXPECT_ERRNO(p2->Flush(), EIO);
  EXPECT_ERRNO(p2->Sync(false), EIO);
  EXPECT_ERRNO(p3->Flush(), EIO);
  EXPECT_ERRNO(p3->Write("p3\n", 3, 0), EIO);
  ASSERT_OK(p3->Flush());
  ASSERT_OK_AND_ASSIGN(auto now, ReadPath(*backend, a, path));
  EXPECT_EQ(now, "base\n");
  // Writing on: a fresh draft of the file as committed, without the lost
  // lines.
  EXPECT_ERRNO(p2->Write("again\n", 6, 0), EIO);
  ASSERT_OK(p2->Write("again\n", 6, 0));
  ASSERT_OK(p2->Flush());
  ASSERT_OK_AND_ASSIGN(now, ReadPath(*backend, a, path));
  EXPECT_EQ(now, "base\nagain\n");
  // A descriptor that writes again before it flushes is told at that write.
  ASSERT_OK(p2->Write("p2b\n", 4, 0));
  ASSERT_OK(p3->Write("p3b\n", 4, 0));
  engine->FailNextOnThisThread();
  EXPECT_ERRNO(p3->Flush(), EIO);
  EXPECT_ERRNO(p2->Write("p2c\n", 4, 0), EIO);
  EXPECT_OK(p2->Flush());  // told at that write
  p2.reset();
  p3.reset();
  ASSERT_OK_AND_ASSIGN(now, ReadPath(*backend, a, path));
  EXPECT_EQ(now, "base\nagain\n");
  ASSERT_OK_AND_ASSIGN(auto history, backend->History(a, P(path)));
  EXPECT_EQ(history.size(), 2u);

  // A failed fsync keeps the draft: the retry commits it.
  ASSERT_OK_AND_ASSIGN(auto s1,
                       backend->Open(a, P(path), O_WRONLY | O_APPEND, 0));
  ASSERT_OK(s1->Write("synced\n", 7, 0));
  engine->FailNextOnThisThread();
  EXPECT_ERRNO(s1->Sync(false), EIO);
  ASSERT_OK(s1->Sync(false));
  ASSERT_OK(s1->Flush());
  ASSERT_OK_AND_ASSIGN(now, ReadPath(*backend, a, path));
  EXPECT_EQ(now, "base\nagain\nsynced\n");

  // A descriptor whose write more failed commits than are kept about went
  // into is told its bytes may not have been committed, not that they
  // were.
  ASSERT_OK_AND_ASSIGN(auto old,
                       backend->Open(a, P(path), O_WRONLY | O_APPEND, 0));
  ASSERT_OK(old->Write("old\n", 4, 0));
  for (int i = 0; i < 17; ++i) {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(a, P(path), O_WRONLY | O_APPEND, 0));
    ASSERT_OK(f->Write("x\n", 2, 0));
    engine->FailNextOnThisThread();
    ASSERT_ERRNO(f->Flush(), EIO);
  }
  auto maybe = old->Flush();
  ASSERT_ERRNO(maybe, EIO);
  EXPECT_NE(maybe.error().message.find("may not have been committed"),
            std::string::npos)
      << maybe.error().message;
  old.reset();

  // Dropping the session's changes (a failed edit of the harness) is told
  // to the other descriptors that wrote into them.
  ASSERT_OK_AND_ASSIGN(auto edit, backend->Open(a, P(path), O_RDWR, 0));
  ASSERT_OK_AND_ASSIGN(auto bash,
                       backend->Open(a, P(path), O_WRONLY | O_APPEND, 0));
  ASSERT_OK(bash->Write("from bash\n", 10, 0));
  ASSERT_OK(edit->Write("E", 1, 0));
  edit->Discard();
  EXPECT_ERRNO(bash->Flush(), EIO);
  edit.reset();
  bash.reset();
  ASSERT_OK_AND_ASSIGN(now, ReadPath(*backend, a, path));
  EXPECT_EQ(now, "base\nagain\nsynced\n");
}

// A descriptor kept open after its flush (dup(2), a child) keeps the
// session's handle of the file; the lease ends at that flush, so another
// session may commit. The first session then reads what was committed
// (not its old draft), and its next write is refused as stale, at once,
// not after the bytes were written.
TEST_P(StoreConflictsInOneProcess, AFlushedDraftDoesNotOutliveTheLease) {
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string path = "/memories/teams/t/kept.md";
  ASSERT_OK_AND_ASSIGN(
      auto kept, backend->Open(a, P(path), O_RDWR | O_CREAT | O_APPEND, 0644));
  ASSERT_OK(kept->Write("a1\n", 3, 0));
  ASSERT_OK(kept->Flush());  // committed; the handle stays
  ASSERT_OK(ReadPath(*backend, b, path));
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(b, P(path), O_WRONLY | O_APPEND, 0));
    ASSERT_OK(f->Write("b1\n", 3, 0));
    ASSERT_OK(f->Flush());
  }
  ASSERT_OK_AND_ASSIGN(auto seen, ReadPath(*backend, a, path));
  EXPECT_EQ(seen, "a1\nb1\n");
  EXPECT_ERRNO(kept->Write("a2\n", 3, 0), ESTALE);
  // Having read it, the session appends through a new descriptor.
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(a, P(path), O_WRONLY | O_APPEND, 0));
    ASSERT_OK(f->Write("a2\n", 3, 0));
    ASSERT_OK(f->Flush());
  }
  kept.reset();
  ASSERT_OK_AND_ASSIGN(seen, ReadPath(*backend, b, path));
  EXPECT_EQ(seen, "a1\nb1\na2\n");
}

// An open for writing whose transaction took the lease but whose
// acknowledgement was lost fails (EIO), and leaves no lease behind: before,
// the process renewed the row for as long as it lived, and every other
// session got EBUSY for a file nobody had open.
TEST_P(StoreConflictsInOneProcess,
       AnOpenWhoseCommitWasNotAcknowledgedHoldsNoLease) {
  ASSERT_OK_AND_ASSIGN(auto real, Engine::Open(fx_->db(), false));
  auto lossy = std::make_unique<LostAckEngine>(std::move(real));
  LostAckEngine* engine = lossy.get();
  auto backend = StoreBackend::Serve(std::move(lossy), QuickLeases());
  vfs::Caller a = fx_->CallerFor("a");
  vfs::Caller b = fx_->CallerFor("b");
  const std::string made = "/memories/teams/t/made.md";
  const std::string old = "/memories/teams/t/old.md";
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(b, P(old), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Flush());
  }
  engine->LoseNextAckOnThisThread();
  EXPECT_ERRNO(backend->Open(a, P(made), O_WRONLY | O_CREAT, 0644), EIO);
  engine->LoseNextAckOnThisThread();
  EXPECT_ERRNO(backend->Open(a, P(old), O_WRONLY, 0), EIO);
  EXPECT_OK(backend->Stat(b, P(made))) << "the create was committed";
  // Longer than a lease: a renewed row would still be there.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  for (const auto& path : {made, old}) {
    ASSERT_OK_AND_ASSIGN(auto f, backend->Open(b, P(path), O_WRONLY, 0));
    ASSERT_OK(f->Flush());
  }
  // A session that still holds the file through another handle keeps its
  // lease when a second open of it loses its acknowledgement.
  ASSERT_OK_AND_ASSIGN(auto kept, backend->Open(a, P(old), O_WRONLY, 0));
  engine->LoseNextAckOnThisThread();
  EXPECT_ERRNO(backend->Open(a, P(old), O_WRONLY, 0), EIO);
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  EXPECT_ERRNO(backend->Open(b, P(old), O_WRONLY, 0), EBUSY);
  ASSERT_OK(kept->Flush());
  EXPECT_OK(backend->Open(b, P(old), O_WRONLY, 0));
}

// Processes in another pid namespace on the same machine (containers on
// one kernel) cannot be checked for life through this /proc: their lease
// lasts until it expires, instead of counting as dead at once.
TEST_P(StoreConflictsInOneProcess,
       ALeaseFromAnotherPidNamespaceHoldsUntilItExpires) {
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller b = fx_->CallerFor("b");
  const std::string path = "/memories/teams/t/contained.md";
  {
    ASSERT_OK_AND_ASSIGN(auto f,
                         backend->Open(b, P(path), O_WRONLY | O_CREAT, 0644));
    ASSERT_OK(f->Write("x\n", 2, 0));
    ASSERT_OK(f->Flush());
  }
  auto line = [](const char* file) {
    std::ifstream in(file);
    std::string s;
    std::getline(in, s);
    return s;
  };
  // Same machine and boot; a pid this namespace does not have.
  const std::string host =
      line("/etc/machine-id") + ":" + line("/proc/sys/kernel/random/boot_id");
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Open(fx_->db(), false));
  ASSERT_OK(engine->Write(Durability::kProcess, [&](Txn& t) -> vfs::Status {
    auto r = t.Exec(
        "INSERT INTO leases(ino, session, \"user\", host, pid, pid_start, "
        "expires_ns) SELECT d.ino, 'in-a-container', 'a', ?, 4194303, 1, ? "
        "FROM dentries d WHERE d.name = 'contained.md'",
        {host, NowNs() + int64_t{60'000'000'000}});
    if (!r) return std::unexpected(r.error());
    if (*r != 1) return vfs::Fail(EIO, "no such file in the store");
    return {};
  }));
  EXPECT_ERRNO(backend->Open(b, P(path), O_WRONLY, 0), EBUSY);
}

}  // namespace
}  // namespace agentvfs::store
