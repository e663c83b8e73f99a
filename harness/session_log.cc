// Durable sessions in the store's database (see session_log.h).
#include "harness/session_log.h"

#include <chrono>

#include "backends/store/namespace.h"

namespace agentvfs::harness {

using nlohmann::json;
using store::AsInt;
using store::AsText;
using store::Durability;
using store::NowNs;
using store::Txn;
using vfs::Fail;

namespace {

constexpr const char* kColumns =
    "id, \"user\", state, reason, task, config, created_ns, updated_ns, steps, "
    "input_tokens, output_tokens, cost_micros, elapsed_ms";

SessionInfo FromRow(const store::Row& r) {
  SessionInfo s;
  s.id = AsText(r[0]);
  s.user = AsText(r[1]);
  s.state = AsText(r[2]);
  s.reason = AsText(r[3]);
  s.task = AsText(r[4]);
  s.config = json::parse(AsText(r[5]), nullptr, false);
  s.created_ns = AsInt(r[6]);
  s.updated_ns = AsInt(r[7]);
  s.steps = AsInt(r[8]);
  s.input_tokens = AsInt(r[9]);
  s.output_tokens = AsInt(r[10]);
  s.cost_micros = AsInt(r[11]);
  s.elapsed_ms = AsInt(r[12]);
  return s;
}

}  // namespace

vfs::Status SessionLog::Create(const SessionInfo& info) {
  int64_t now = NowNs();
  return engine_.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    auto r = txn.Exec(
        "INSERT INTO sessions(id, \"user\", created_ns, updated_ns, state, task, "
        "config) VALUES(?, ?, ?, ?, ?, ?, ?)",
        {info.id, info.user, now, now, info.state, info.task,
         info.config.dump(-1, ' ', false,
                          nlohmann::json::error_handler_t::replace)});
    if (!r) return std::unexpected(r.error());
    return {};
  });
}

vfs::Result<SessionInfo> SessionLog::Get(const std::string& user,
                                         const std::string& id) {
  SessionInfo out;
  auto ok = engine_.Read([&](Txn& txn) -> vfs::Status {
    auto rows = txn.Query(std::string("SELECT ") + kColumns +
                              " FROM sessions WHERE id = ? AND \"user\" = ?",
                          {id, user});
    if (!rows) return std::unexpected(rows.error());
    if (rows->empty())
      return Fail(ENOENT, "no session '" + id + "' of user '" + user +
                              "'; `agentvfs sessions` lists yours");
    out = FromRow((*rows)[0]);
    return {};
  });
  if (!ok) return std::unexpected(ok.error());
  return out;
}

vfs::Result<std::vector<SessionInfo>> SessionLog::List(
    const std::string& user) {
  std::vector<SessionInfo> out;
  auto ok = engine_.Read([&](Txn& txn) -> vfs::Status {
    auto rows = txn.Query(std::string("SELECT ") + kColumns +
                              " FROM sessions WHERE \"user\" = ? "
                              "ORDER BY created_ns",
                          {user});
    if (!rows) return std::unexpected(rows.error());
    for (const auto& r : *rows) out.push_back(FromRow(r));
    return {};
  });
  if (!ok) return std::unexpected(ok.error());
  return out;
}

vfs::Result<int64_t> SessionLog::Append(const std::string& id,
                                        const std::string& kind,
                                        const json& data) {
  int64_t seq = 0;
  int64_t now = NowNs();
  auto ok = engine_.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    auto rows = txn.Query(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session = ?", {id});
    if (!rows) return std::unexpected(rows.error());
    seq = AsInt((*rows)[0][0]);
    auto r = txn.Exec(
        "INSERT INTO events(session, seq, time_ns, kind, data) "
        "VALUES(?, ?, ?, ?, ?)",
        {id, seq, now, kind,
         data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
    if (!r) return std::unexpected(r.error());
    auto u =
        txn.Exec("UPDATE sessions SET updated_ns = ? WHERE id = ?", {now, id});
    if (!u) return std::unexpected(u.error());
    return {};
  });
  if (!ok) return std::unexpected(ok.error());
  return seq;
}

vfs::Result<std::vector<Event>> SessionLog::Events(const std::string& user,
                                                   const std::string& id) {
  if (auto s = Get(user, id); !s) return std::unexpected(s.error());
  std::vector<Event> out;
  auto ok = engine_.Read([&](Txn& txn) -> vfs::Status {
    auto rows = txn.Query(
        "SELECT seq, time_ns, kind, data FROM events WHERE session = ? "
        "ORDER BY seq",
        {id});
    if (!rows) return std::unexpected(rows.error());
    for (const auto& r : *rows)
      out.push_back({AsInt(r[0]), AsInt(r[1]), AsText(r[2]),
                     json::parse(AsText(r[3]), nullptr, false)});
    return {};
  });
  if (!ok) return std::unexpected(ok.error());
  return out;
}

vfs::Status SessionLog::Update(const SessionInfo& s) {
  return engine_.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    auto r = txn.Exec(
        "UPDATE sessions SET state = ?, reason = ?, updated_ns = ?, steps = ?, "
        "input_tokens = ?, output_tokens = ?, cost_micros = ?, elapsed_ms = ?, "
        "config = ? WHERE id = ?",
        {s.state, s.reason, NowNs(), s.steps, s.input_tokens, s.output_tokens,
         s.cost_micros, s.elapsed_ms,
         s.config.dump(-1, ' ', false,
                       nlohmann::json::error_handler_t::replace),
         s.id});
    if (!r) return std::unexpected(r.error());
    return {};
  });
}

vfs::Status SessionLog::Claim(SessionInfo& s) {
  const int64_t now = NowNs();
  auto ok = engine_.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    auto r = txn.Exec(
        "UPDATE sessions SET state = ?, reason = ?, updated_ns = ?, "
        "config = ? WHERE id = ? AND updated_ns = ?",
        {s.state, s.reason, now,
         s.config.dump(-1, ' ', false,
                       nlohmann::json::error_handler_t::replace),
         s.id, s.updated_ns});
    if (!r) return std::unexpected(r.error());
    if (*r == 0)
      return vfs::Fail(EBUSY, "session " + s.id +
                                  " was taken by another harness just now; "
                                  "wait for it to end, or stop it first");
    return {};
  });
  if (ok) s.updated_ns = now;
  return ok;
}

}  // namespace agentvfs::harness
