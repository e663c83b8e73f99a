// SessionLog: the harness's durable sessions in the store's database
// (tables `sessions` and `events`, schema version 2). Every model call, tool
// call (started, finished) and stop is an event, appended in its own
// synchronous commit, so that after kill -9 of the harness at any point the
// session can be resumed from what was recorded.
//
// A session belongs to the user who started it: Get, Events and List answer
// only for that user (ENOENT otherwise, as for a file they may not read).
//
// Thread safety: as the engine (any thread).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/store/engine.h"
#include "vfs/error.h"

namespace agentvfs::harness {

struct SessionInfo {
  std::string id, user, state, reason, task;
  nlohmann::json config;
  int64_t created_ns = 0, updated_ns = 0;
  int64_t steps = 0, input_tokens = 0, output_tokens = 0;
  int64_t cost_micros = 0;  // US dollars x 1e6
  int64_t elapsed_ms = 0;   // wall time spent running, over all resumes
};

struct Event {
  int64_t seq = 0;
  int64_t time_ns = 0;
  std::string kind;
  nlohmann::json data;
};

class SessionLog {
 public:
  explicit SessionLog(store::Engine& engine) : engine_(engine) {}

  vfs::Status Create(const SessionInfo& info);
  vfs::Result<SessionInfo> Get(const std::string& user, const std::string& id);
  vfs::Result<std::vector<SessionInfo>> List(const std::string& user);
  // Appends one event (synchronously durable); returns its sequence number.
  vfs::Result<int64_t> Append(const std::string& id, const std::string& kind,
                              const nlohmann::json& data);
  vfs::Result<std::vector<Event>> Events(const std::string& user,
                                         const std::string& id);
  // Saves state, reason and totals.
  vfs::Status Update(const SessionInfo& info);
  // Update, but only if the session was not updated since `info` was read
  // (its updated_ns): EBUSY otherwise. Two harnesses resuming one session
  // at once: the second is refused before it runs anything.
  vfs::Status Claim(SessionInfo& info);

 private:
  store::Engine& engine_;
};

}  // namespace agentvfs::harness
