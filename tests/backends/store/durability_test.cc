// Kill -9 durability of the store (issue 3, acceptance point 1): a commit
// that was acknowledged -- Flush (close) or Sync (fsync) returned 0 --
// survives the death of its process at any moment. Each round forks a writer
// process that creates, overwrites (0 to 2.5 MiB, so several 1 MiB chunks,
// some of them holes), renames and unlinks files as fast as it can and
// reports each step through a pipe once the store acknowledged it; the test
// kills it at a random moment and reopens the store. The files must then be
// exactly as the acknowledged steps left them, or exactly one step newer
// (the step the writer was in may have reached the database before its
// acknowledgement was written) -- never a mix, never older. Every committed
// version must be whole in History, no lease of the dead writer may block a
// new one, and SQLite's integrity check must pass.
//
// The seed is printed; AGENTVFS_DURABILITY_SEED=<n> replays a run (the kill
// moments differ, the operations do not).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/store/engine.h"
#include "backends/store/namespace.h"
#include "backends/store/store.h"
#include "tests/backends/store/process_test_util.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using test_util::Mismatch;
using test_util::P;
using test_util::ReadPath;
using test_util::ReadVersion;
using test_util::SendLine;

constexpr int kRounds = 36;
constexpr size_t kMaxLive = 6;  // files the writer keeps at most
constexpr char kDir[] = "/memories/users/w";

std::string WriterSession(int round) {
  return "writer-" + std::to_string(round);
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The bytes operation `seq` of round `round` writes: a function of (round,
// seq, offset) only, so what an fsync half way commits is a prefix of the
// whole. Every fourth operation has an all-zero second MiB, which the store
// keeps as a hole.
std::string Content(int round, int seq, int64_t size) {
  std::string out(static_cast<size_t>(size), '\0');
  uint64_t base = SplitMix((static_cast<uint64_t>(round) << 32) ^
                           static_cast<uint64_t>(seq));
  for (size_t off = 0; off < out.size(); off += 8) {
    uint64_t w = SplitMix(base + off);
    memcpy(out.data() + off, &w, std::min<size_t>(8, out.size() - off));
  }
  if (seq % 4 == 0 && out.size() > kChunkSize) {
    memset(out.data() + kChunkSize, 0,
           std::min(out.size(), 2 * kChunkSize) - kChunkSize);
  }
  return out;
}

// --- the writer's protocol ------------------------------------------------
//
// Before an operation the writer sends its intent, "I <seq> <kind> <path>
// <to> <size> <sync_at> <in_place> <end_sync>"; after each step of it that
// the store acknowledged it sends "A <seq> <step>". An unexpected failure is
// "E <text>" and ends the writer.

struct Op {
  int seq = 0;
  char kind = 'C';  // C create, W overwrite, R rename, U unlink
  std::string path;
  std::string to = "-";
  int64_t size = 0;
  int64_t sync_at = 0;  // > 0: fsync once the first sync_at bytes are written
  int in_place = 0;     // W: O_RDWR without O_TRUNC, then ftruncate
  int end_sync = 0;     // fsync, then close
};

std::string IntentLine(const Op& op) {
  std::ostringstream out;
  out << "I " << op.seq << ' ' << op.kind << ' ' << op.path << ' ' << op.to
      << ' ' << op.size << ' ' << op.sync_at << ' ' << op.in_place << ' '
      << op.end_sync << '\n';
  return out.str();
}

std::optional<Op> ParseIntent(const std::string& line) {
  std::istringstream in(line);
  std::string tag;
  Op op;
  if (!(in >> tag >> op.seq >> op.kind >> op.path >> op.to >> op.size >>
        op.sync_at >> op.in_place >> op.end_sync) ||
      tag != "I") {
    return std::nullopt;
  }
  return op;
}

// The atomic state changes an operation makes, each acknowledged apart.
struct Step {
  enum Kind { kCreate, kCommit, kRename, kUnlink } kind;
  std::string path;
  std::string to;
  int64_t size = 0;  // kCommit: bytes committed
};

std::string StepName(Step::Kind kind) {
  static constexpr const char* kNames[] = {"create", "commit", "rename",
                                           "unlink"};
  return kNames[kind];
}

std::string Describe(const Step& s) {
  std::string out = StepName(s.kind) + " " + s.path;
  if (s.kind == Step::kRename) out += " -> " + s.to;
  if (s.kind == Step::kCommit) out += " (" + std::to_string(s.size) + " bytes)";
  return out;
}

std::vector<Step> StepsOf(const Op& op) {
  std::vector<Step> steps;
  switch (op.kind) {
    case 'C':
      // open(O_CREAT) makes the (empty) file at once.
      steps.push_back({Step::kCreate, op.path, "", 0});
      [[fallthrough]];
    case 'W':
      if (op.sync_at > 0) {
        steps.push_back({Step::kCommit, op.path, "", op.sync_at});
      }
      steps.push_back({Step::kCommit, op.path, "", op.size});
      break;
    case 'R':
      steps.push_back({Step::kRename, op.path, op.to, 0});
      break;
    case 'U':
      steps.push_back({Step::kUnlink, op.path, "", 0});
      break;
  }
  return steps;
}

// --- the writer (runs in the forked child) --------------------------------

class Writer {
 public:
  Writer(StoreBackend& backend, int round, uint64_t seed, int out)
      : backend_(backend), round_(round), rng_(seed), out_(out) {
    caller_.user = "w";
    caller_.session = WriterSession(round);
  }

  [[noreturn]] void Run() {
    auto entries = backend_.ReadDir(caller_, P(kDir));
    if (!entries) Die("readdir", entries.error());
    for (const auto& e : *entries)
      live_.push_back(std::string(kDir) + "/" + e.name);
    for (int seq = 0; seq < 1'000'000; ++seq) {
      Op op = Choose(seq);
      SendLine(out_, IntentLine(op));
      Perform(op);
    }
    _exit(0);
  }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  int64_t PickSize() {
    int64_t kind = Uniform(0, 19);
    if (kind == 0) return 0;
    if (kind < 9) return Uniform(1, 4096);
    if (kind < 15) return Uniform(4097, 256 << 10);
    return Uniform((256 << 10) + 1, (5 << 20) / 2);
  }

  std::string Fresh(char prefix, int seq) const {
    return std::string(kDir) + "/" + prefix + std::to_string(round_) + "_" +
           std::to_string(seq);
  }

  Op Choose(int seq) {
    Op op;
    op.seq = seq;
    int64_t r = Uniform(0, 99);
    if (live_.empty() || (live_.size() < kMaxLive && r < 25)) {
      op.kind = 'C';
      op.path = Fresh('n', seq);
    } else if (r < 65 || live_.size() == 1) {
      op.kind = 'W';
      op.path = live_[Uniform(0, live_.size() - 1)];
      op.in_place = Uniform(0, 2) == 0;
    } else if (r < 83) {
      op.kind = 'R';
      op.path = live_[Uniform(0, live_.size() - 1)];
      // Onto an existing file half of the time; but never onto one written
      // in this round, whose versions the test has not yet checked (a file
      // replaced this way has no path left to ask History about).
      std::vector<std::string> victims;
      for (const auto& p : live_) {
        if (p != op.path && !touched_.count(p)) victims.push_back(p);
      }
      op.to = !victims.empty() && Uniform(0, 1) == 0
                  ? victims[Uniform(0, victims.size() - 1)]
                  : Fresh('m', seq);
    } else {
      op.kind = 'U';
      op.path = live_[Uniform(0, live_.size() - 1)];
    }
    if (op.kind == 'C' || op.kind == 'W') {
      op.size = PickSize();
      if (op.size >= 2 && Uniform(0, 3) == 0)
        op.sync_at = Uniform(1, op.size - 1);
      op.end_sync = Uniform(0, 3) == 0;
    }
    return op;
  }

  void Ack(int seq, int step) {
    SendLine(out_,
             "A " + std::to_string(seq) + " " + std::to_string(step) + "\n");
  }

  [[noreturn]] void Die(const std::string& what, const vfs::Error& e) {
    std::string line = "E " + what + ": " + e.ToString();
    line = line.substr(0, 1000);
    std::replace(line.begin(), line.end(), '\n', ' ');
    SendLine(out_, line + "\n");
    _exit(3);
  }

  void Perform(const Op& op) {
    switch (op.kind) {
      case 'C':
      case 'W':
        Write(op);
        touched_.insert(op.path);
        if (op.kind == 'C') live_.push_back(op.path);
        return;
      case 'R': {
        if (auto ok = backend_.Rename(caller_, P(op.path), P(op.to), 0); !ok) {
          Die("rename " + op.path + " " + op.to, ok.error());
        }
        Ack(op.seq, 0);
        live_.erase(std::find(live_.begin(), live_.end(), op.path));
        if (std::find(live_.begin(), live_.end(), op.to) == live_.end()) {
          live_.push_back(op.to);
        }
        if (touched_.erase(op.path) > 0) touched_.insert(op.to);
        return;
      }
      case 'U':
        if (auto ok = backend_.Unlink(caller_, P(op.path)); !ok) {
          Die("unlink " + op.path, ok.error());
        }
        Ack(op.seq, 0);
        live_.erase(std::find(live_.begin(), live_.end(), op.path));
        touched_.erase(op.path);
        return;
    }
  }

  void Write(const Op& op) {
    int flags = op.kind == 'C' ? O_WRONLY | O_CREAT | O_EXCL
                : op.in_place  ? O_RDWR
                               : O_WRONLY | O_TRUNC;
    auto file = backend_.Open(caller_, P(op.path), flags, 0644);
    if (!file) Die("open " + op.path, file.error());
    vfs::FileHandle& f = **file;
    int step = 0;
    if (op.kind == 'C') Ack(op.seq, step++);
    std::string data = Content(round_, op.seq, op.size);
    int64_t written = 0;
    auto write_to = [&](int64_t end) {
      while (written < end) {
        int64_t n = std::min<int64_t>(end - written, Uniform(1, 256 << 10));
        auto put = f.Write(data.data() + written, static_cast<size_t>(n),
                           static_cast<off_t>(written));
        if (!put) Die("write " + op.path, put.error());
        if (static_cast<int64_t>(*put) != n) {
          Die("write " + op.path, vfs::Error{EIO, "short write"});
        }
        written += n;
      }
    };
    auto truncate_to = [&](int64_t size) {
      if (!op.in_place) return;
      if (auto ok = f.Truncate(static_cast<off_t>(size)); !ok) {
        Die("ftruncate " + op.path, ok.error());
      }
    };
    auto sync = [&] {
      if (auto ok = f.Sync(Uniform(0, 1) == 0); !ok) {
        Die("fsync " + op.path, ok.error());
      }
      Ack(op.seq, step++);
    };
    if (op.sync_at > 0) {
      write_to(op.sync_at);
      truncate_to(op.sync_at);
      sync();
    }
    write_to(op.size);
    truncate_to(op.size);
    if (op.end_sync) sync();
    if (auto ok = f.Flush(); !ok) Die("close " + op.path, ok.error());
    if (!op.end_sync) Ack(op.seq, step++);
  }

  StoreBackend& backend_;
  int round_;
  std::mt19937_64 rng_;
  int out_;
  vfs::Caller caller_;
  std::vector<std::string> live_;  // paths of the files there are
  std::set<std::string> touched_;  // of those, written in this round
};

[[noreturn]] void RunWriter(const std::string& db, int round, uint64_t seed,
                            int out) {
  // Even rounds commit with the default durability (kFull: fsynced); odd
  // ones with kProcess, which promises the same against kill -9.
  StoreOptions options;
  if (round % 2 == 1) options.commit_durability = Durability::kProcess;
  auto backend = StoreBackend::Open(db, options);
  if (!backend) {
    SendLine(out, "E open store: " + backend.error().ToString() + "\n");
    _exit(3);
  }
  Writer(**backend, round, seed, out).Run();
}

// --- the test's model of the store ------------------------------------------

struct Commit {
  int round = 0;
  int seq = 0;
  int64_t size = 0;
};

struct FileModel {
  std::string path;  // where it is, or was last
  bool alive = true;
  // Once not alive: when its last name went (by unlink, or by a rename over
  // it), 1, 2, ... in order. History(path) lists such files in that order,
  // each closed by its tombstone, then the file there now.
  int ended = 0;
  std::vector<Commit> commits;      // every commit, acknowledged or proven
  size_t verified = 0;              // commits already found in History
  std::vector<std::string> hashes;  // content_hash of the verified ones
};

struct Model {
  std::vector<FileModel> files;
  std::map<std::string, size_t> at;  // path -> index into files (alive)
  int ends = 0;                      // files whose last name went

  // Applies one step; an error text when it cannot apply (the writer broke
  // its own protocol, or the test's bookkeeping is wrong).
  std::string Apply(const Step& s, int round, int seq) {
    switch (s.kind) {
      case Step::kCreate:
        if (at.count(s.path)) return "create of existing " + s.path;
        at[s.path] = files.size();
        files.push_back(FileModel{s.path});
        return "";
      case Step::kCommit:
        if (!at.count(s.path)) return "commit to missing " + s.path;
        files[at[s.path]].commits.push_back(Commit{round, seq, s.size});
        return "";
      case Step::kRename: {
        if (!at.count(s.path)) return "rename of missing " + s.path;
        size_t moving = at[s.path];
        if (auto it = at.find(s.to); it != at.end()) {
          files[it->second].alive = false;  // replaced: a tombstone
          files[it->second].ended = ++ends;
        }
        at.erase(s.path);
        at[s.to] = moving;
        files[moving].path = s.to;
        return "";
      }
      case Step::kUnlink: {
        if (!at.count(s.path)) return "unlink of missing " + s.path;
        FileModel& f = files[at[s.path]];
        f.alive = false;
        f.ended = ++ends;
        at.erase(s.path);
        return "";
      }
    }
    return "bad step";
  }

  // How many versions History(path) lists: the commits of every file that
  // is at `path` or whose last name went there, and their tombstones.
  size_t HistoryLengthOf(const std::string& path) const {
    size_t n = 0;
    for (const auto& f : files) {
      if (f.path == path) n += f.commits.size() + (f.alive ? 0 : 1);
    }
    return n;
  }

  std::string ContentOf(size_t file) const {
    const auto& c = files[file].commits;
    if (c.empty()) return "";
    return Content(c.back().round, c.back().seq, c.back().size);
  }

  // "" when `actual` (path -> content) is exactly this state.
  std::string Diff(const std::map<std::string, std::string>& actual) const {
    std::string out;
    for (const auto& [path, file] : at) {
      auto it = actual.find(path);
      if (it == actual.end()) {
        out += "\n  " + path + " is missing";
      } else if (auto m = Mismatch(it->second, ContentOf(file)); !m.empty()) {
        out += "\n  " + path + ": " + m;
      }
    }
    for (const auto& [path, content] : actual) {
      if (!at.count(path)) out += "\n  " + path + " should not exist";
    }
    return out;
  }
};

// What one writer reported.
struct Report {
  std::vector<std::pair<Op, int>> acked;  // each op with its acked steps
  std::string error;                      // an "E" line, or a protocol error
};

Report ParseReport(const std::string& text) {
  Report r;
  auto fail = [&r](std::string why) {
    r.error = std::move(why);
    return r;
  };
  for (const auto& line : test_util::SplitLines(text)) {
    if (line.rfind("I ", 0) == 0) {
      auto op = ParseIntent(line);
      if (!op) return fail("bad line: " + line);
      if (!r.acked.empty() && static_cast<size_t>(r.acked.back().second) !=
                                  StepsOf(r.acked.back().first).size()) {
        return fail("new operation before the last was done: " + line);
      }
      r.acked.emplace_back(*op, 0);
    } else if (line.rfind("A ", 0) == 0) {
      std::istringstream in(line.substr(2));
      int seq = -1, step = -1;
      in >> seq >> step;
      if (r.acked.empty() || r.acked.back().first.seq != seq ||
          r.acked.back().second != step) {
        return fail("acknowledgement out of order: " + line);
      }
      ++r.acked.back().second;
    } else {
      return fail(line);  // an "E" line from the writer
    }
  }
  return r;
}

::testing::AssertionResult IntegrityOk(const std::string& db) {
  auto engine = Engine::Open(db, false);
  if (!engine) {
    return ::testing::AssertionFailure()
           << "cannot open " << db << ": " << engine.error().ToString();
  }
  std::vector<std::string> lines;
  auto ok = (*engine)->Read([&](Txn& txn) -> vfs::Status {
    auto rows = txn.Query("PRAGMA integrity_check");
    if (!rows) return std::unexpected(rows.error());
    for (const auto& row : *rows) lines.push_back(AsText(row.at(0)));
    return {};
  });
  if (!ok) {
    return ::testing::AssertionFailure()
           << "integrity_check failed to run: " << ok.error().ToString();
  }
  if (lines != std::vector<std::string>{"ok"}) {
    auto f = ::testing::AssertionFailure() << "integrity_check:";
    for (const auto& l : lines) f << "\n  " << l;
    return f;
  }
  return ::testing::AssertionSuccess();
}

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("AGENTVFS_DURABILITY_SEED");
    seed_ = env != nullptr ? std::strtoull(env, nullptr, 10)
                           : std::random_device{}();
    std::printf(
        "durability seed %llu (AGENTVFS_DURABILITY_SEED=%llu replays)\n",
        static_cast<unsigned long long>(seed_),
        static_cast<unsigned long long>(seed_));
    RecordProperty("seed", std::to_string(seed_));
    ASSERT_OK_AND_ASSIGN(fx_, testing::StoreFixture::Create({"w"}));
  }

  // Forks a writer for `round`, kills it after `delay`, and returns what it
  // reported. The parent holds no store open across the fork.
  Report RunAndKill(int round, uint64_t seed, std::chrono::milliseconds delay) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return Report{{}, "pipe failed"};
    (void)fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
    pid_t pid = fork();
    if (pid < 0) return Report{{}, "fork failed"};
    if (pid == 0) {
      close(fds[0]);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      RunWriter(fx_->db(), round, seed, fds[1]);
    }
    close(fds[1]);
    std::this_thread::sleep_for(delay);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    bool timed_out = false;
    auto text =
        test_util::ReadUntilEof({fds[0]}, std::chrono::seconds(30), &timed_out);
    close(fds[0]);
    Report r = ParseReport(text[0]);
    if (r.error.empty() && timed_out) r.error = "the writer's pipe stayed open";
    if (r.error.empty() &&
        !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
      r.error = "the writer ended by itself (status " + std::to_string(status) +
                ") before it was killed";
    }
    return r;
  }

  // Checks the store after a kill and brings `model_` up to date with it.
  void CheckAfterKill(int round, const Report& report) {
    std::optional<Step> pending;  // the step the writer was in
    int pending_seq = 0;
    for (const auto& [op, acked] : report.acked) {
      auto steps = StepsOf(op);
      for (int k = 0; k < acked; ++k) {
        auto e = model_.Apply(steps[k], round, op.seq);
        ASSERT_EQ(e, "") << "op " << IntentLine(op);
      }
      ++stats_.ops;
      stats_.steps += acked;
      if (static_cast<size_t>(acked) < steps.size()) {
        pending = steps[acked];
        pending_seq = op.seq;
      }
    }

    // A dead writer's lease must not hold anyone up: every file opens for
    // writing at once (the lease time is 15 s; the busy timeout 30 s).
    ASSERT_OK_AND_ASSIGN(int64_t dead_leases, CountLeases());
    if (dead_leases > 0) ++stats_.dead_leases;
    auto backend = fx_->OpenBackend();
    ASSERT_NE(backend, nullptr);
    vfs::Caller c;
    c.user = "w";
    c.session = "check-" + std::to_string(round);
    ASSERT_OK_AND_ASSIGN(auto entries, backend->ReadDir(c, P(kDir)));
    std::map<std::string, std::string> actual;
    for (const auto& e : entries) {
      std::string path = std::string(kDir) + "/" + e.name;
      auto start = std::chrono::steady_clock::now();
      {
        ASSERT_OK_AND_ASSIGN(auto file, backend->Open(c, P(path), O_WRONLY, 0));
        ASSERT_OK(file->Flush());
      }
      auto took = std::chrono::steady_clock::now() - start;
      EXPECT_LT(took, std::chrono::seconds(1))
          << "opening " << path << " for writing after the writer died";
      ASSERT_OK_AND_ASSIGN(actual[path], ReadPath(*backend, c, path));
    }
    ASSERT_OK_AND_ASSIGN(int64_t leases_left, CountLeases());
    EXPECT_EQ(leases_left, 0) << "leases left after every writer closed";

    // Exactly the acknowledged state, or the pending step on top of it.
    std::string diff_acked = model_.Diff(actual);
    std::string diff_next = "(no step was pending)";
    Model next = model_;
    if (pending) {
      ASSERT_EQ(next.Apply(*pending, round, pending_seq), "");
      diff_next = next.Diff(actual);
    }
    bool took_next = false;
    if (pending && diff_next.empty()) {
      // Both states may have the same bytes (an empty file committed
      // empty); then the number of versions tells them apart.
      took_next =
          !diff_acked.empty() || HistoryLength(*backend, c, pending->path) ==
                                     next.HistoryLengthOf(pending->path);
    }
    ASSERT_TRUE(diff_acked.empty() || took_next)
        << "after the kill the store is neither the acknowledged state:"
        << diff_acked << "\nnor that plus the pending step "
        << (pending ? Describe(*pending) : "") << ":" << diff_next;
    if (took_next) model_ = std::move(next);
    if (pending) {
      std::string fate = took_next ? "committed " : "not committed ";
      ++stats_.pending[fate + StepName(pending->kind)];
    }
    VerifyVersions(*backend, c, /*reread_all=*/false);
  }

  // Rows in the store's lease table (one per file open for writing, dead
  // holders included until someone takes the file over). Read from the
  // schema directly: only to know that some writers did die holding one.
  vfs::Result<int64_t> CountLeases() {
    auto engine = Engine::Open(fx_->db(), false);
    if (!engine) return std::unexpected(engine.error());
    int64_t n = 0;
    auto ok = (*engine)->Read([&](Txn& txn) -> vfs::Status {
      auto rows = txn.Query("SELECT COUNT(*) FROM leases");
      if (!rows) return std::unexpected(rows.error());
      n = AsInt(rows->at(0).at(0));
      return {};
    });
    if (!ok) return std::unexpected(ok.error());
    return n;
  }

  size_t HistoryLength(StoreBackend& backend, const vfs::Caller& c,
                       const std::string& path) {
    auto h = backend.History(c, P(path));
    return h ? h->size() : 0;
  }

  // Every commit of the model is exactly one version in History, in order,
  // byte-identical, and every file whose last name went has its tombstone
  // there; nothing else is. History(path) holds the files whose last name
  // went at the path, in the order they went, then the file there now.
  // Content of versions checked before is read again only when
  // `reread_all`.
  void VerifyVersions(StoreBackend& backend, const vfs::Caller& c,
                      bool reread_all) {
    std::vector<size_t> order(model_.files.size());
    std::iota(order.begin(), order.end(), size_t{0});
    auto rank = [&](size_t i) {
      const FileModel& f = model_.files[i];
      return f.alive ? std::numeric_limits<int>::max() : f.ended;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return rank(a) < rank(b); });
    std::map<std::string, std::vector<size_t>> timelines;
    for (size_t i : order) timelines[model_.files[i].path].push_back(i);
    for (const auto& [path, files] : timelines) {
      size_t expected = 0;
      bool checked = true;
      for (size_t i : files) {
        const FileModel& f = model_.files[i];
        size_t versions = f.commits.size() + (f.alive ? 0 : 1);
        expected += versions;
        checked = checked && f.verified == f.commits.size() &&
                  f.hashes.size() == versions;
      }
      if (!reread_all && checked) continue;
      SCOPED_TRACE(path);
      ASSERT_OK_AND_ASSIGN(auto history, backend.History(c, P(path)));
      std::string listing;
      for (const auto& v : history) {
        listing += "\n  n=" + std::to_string(v.n) +
                   " size=" + std::to_string(v.size) + " session=" + v.session +
                   (v.deleted ? " deleted" : "");
      }
      ASSERT_EQ(history.size(), expected)
          << "versions of " << path << " (" << expected
          << " expected: the commits of " << files.size()
          << " file(s), and a tombstone for each that went):" << listing;
      size_t at = 0;  // where the file's versions start in `history`
      for (size_t i : files) {
        FileModel& f = model_.files[i];
        for (size_t k = 0; k < f.commits.size(); ++k) {
          const Commit& want = f.commits[k];
          const VersionInfo& v = history[at + k];
          SCOPED_TRACE("version n=" + std::to_string(v.n));
          EXPECT_EQ(v.n, static_cast<int64_t>(at + k + 1));
          EXPECT_FALSE(v.deleted);
          EXPECT_EQ(v.size, want.size);
          EXPECT_EQ(v.author, "w");
          EXPECT_EQ(v.session, WriterSession(want.round));
          if (k < f.hashes.size()) {
            EXPECT_EQ(v.content_hash, f.hashes[k])
                << "a checked version changed";
          }
          if (k >= f.verified || reread_all) {
            ASSERT_OK_AND_ASSIGN(auto got, ReadVersion(backend, c, path, v.n));
            EXPECT_EQ(Mismatch(got, Content(want.round, want.seq, want.size)),
                      "");
            ++stats_.versions_read;
          }
        }
        size_t versions = f.commits.size() + (f.alive ? 0 : 1);
        if (!f.alive) {
          EXPECT_TRUE(history[at + f.commits.size()].deleted)
              << "no tombstone:" << listing;
        }
        f.verified = f.commits.size();
        f.hashes.clear();
        for (size_t k = 0; k < versions; ++k) {
          f.hashes.push_back(history[at + k].content_hash);
        }
        at += versions;
      }
    }
  }

  struct Stats {
    int ops = 0;
    int steps = 0;
    int dead_leases = 0;  // rounds whose writer died holding a lease
    std::map<std::string, int> pending;  // pending steps, by fate and kind
    int versions_read = 0;
  };

  uint64_t seed_ = 0;
  std::unique_ptr<testing::StoreFixture> fx_;
  Model model_;
  Stats stats_;
};

TEST_F(DurabilityTest, AcknowledgedCommitsSurviveKill9AtAnyMoment) {
  std::mt19937_64 rng(seed_);
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round) + ", seed " +
                 std::to_string(seed_));
    uint64_t writer_seed = rng();
    auto delay = std::chrono::milliseconds(
        std::uniform_int_distribution<int>(5, 150)(rng));
    Report report = RunAndKill(round, writer_seed, delay);
    ASSERT_EQ(report.error, "") << "the writer failed";
    ASSERT_NO_FATAL_FAILURE(CheckAfterKill(round, report));
    if (round == kRounds / 2) {
      ASSERT_TRUE(IntegrityOk(fx_->db()));
    }
  }
  ASSERT_TRUE(IntegrityOk(fx_->db()));
  // Finally, from a fresh store: everything acknowledged over all rounds is
  // still whole.
  auto backend = fx_->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller c;
  c.user = "w";
  c.session = "final";
  ASSERT_OK_AND_ASSIGN(auto entries, backend->ReadDir(c, P(kDir)));
  std::map<std::string, std::string> actual;
  for (const auto& e : entries) {
    std::string path = std::string(kDir) + "/" + e.name;
    ASSERT_OK_AND_ASSIGN(actual[path], ReadPath(*backend, c, path));
  }
  EXPECT_EQ(model_.Diff(actual), "");
  VerifyVersions(*backend, c, /*reread_all=*/true);
  std::string pending;
  for (const auto& [what, n] : stats_.pending) {
    pending += " " + what + ": " + std::to_string(n) + ";";
  }
  std::printf(
      "%d rounds: %d operations, %d steps acknowledged, %d versions read "
      "back, %d writers died holding a lease; step in flight at the kill:%s\n",
      kRounds, stats_.ops, stats_.steps, stats_.versions_read,
      stats_.dead_leases, pending.c_str());
  // The test only means something if writers got work done before dying,
  // and some died holding a lease.
  EXPECT_GT(stats_.steps, kRounds);
  EXPECT_GT(stats_.dead_leases, 0);
}

// A writer that died but was not yet reaped by its parent (a zombie) holds
// no lease: its start time is still in /proc/<pid>/stat, but its state says
// it is dead.
TEST(StoreLeases, DeadButUnreapedWriterHoldsNoLease) {
  ASSERT_OK_AND_ASSIGN(auto fx, testing::StoreFixture::Create({"w"}));
  const std::string path = std::string(kDir) + "/held.md";
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    auto backend = StoreBackend::Open(fx->db());
    if (!backend) _exit(3);
    vfs::Caller c;
    c.user = "w";
    c.session = "holder";
    auto file = (*backend)->Open(c, P(path), O_WRONLY | O_CREAT, 0644);
    if (!file) _exit(4);
    SendLine(fds[1], "open\n");
    while (true) pause();
  }
  close(fds[1]);
  char buf[8];
  ASSERT_GT(read(fds[0], buf, sizeof buf), 0) << "the holder did not start";
  close(fds[0]);
  kill(pid, SIGKILL);
  siginfo_t info{};
  // Dead, not reaped.
  ASSERT_EQ(waitid(P_PID, pid, &info, WEXITED | WNOWAIT), 0);
  auto backend = fx->OpenBackend();
  ASSERT_NE(backend, nullptr);
  vfs::Caller c;
  c.user = "w";
  c.session = "next";
  auto start = std::chrono::steady_clock::now();
  auto file = backend->Open(c, P(path), O_WRONLY, 0);
  EXPECT_OK(file);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  waitpid(pid, nullptr, 0);
}

}  // namespace
}  // namespace agentvfs::store
