// Agent: the loop of one session. It asks the model, runs the tool calls it
// gets (files through FileTools as the session's user, `bash` in the
// sandbox), answers every call with its result, and goes on until the model
// stops calling tools or a budget runs out. Every step is an event in the
// SessionLog before and after it happens:
//   task {text}                   the person's request
//   model {message, usage, stop_reason, attempts}
//   tool_started {id, name, input}
//   tool_finished {id, name, result, is_error}
//   stopped {state, reason}       done | budget | failed | denied
// Resume() rebuilds the conversation from those events. A tool call that
// started and did not finish (the harness was killed meanwhile) is answered
// to the model as interrupted, and never run a second time; calls that had
// not started run now.
//
// Budgets are checked before each model call: steps (model calls), input
// and output tokens, wall time and cost (from the configured price per
// million tokens). Reaching one stops the session with that reason;
// Resume() with a larger budget goes on.
//
// Approvals: a call matching a rule (tool name, a regex over its command or
// path) runs only if a person says yes; a no becomes the tool result, and
// the loop goes on. `approve` asks a person who is there (at the terminal);
// when it answers nothing (nullopt), the session records
// approval_requested {id, summary}, shows as "waiting", and polls for the
// `approval` event that `agentvfs approve|deny SESSION CALL` appends from
// another terminal (RecordApproval), up to approval_timeout_s (then no).
//
// Thread safety: one Agent per session, used by one thread.
#pragma once

#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "harness/bash_tool.h"
#include "harness/file_tools.h"
#include "harness/model.h"
#include "harness/session_log.h"

namespace agentvfs::harness {

// Limits of a session over all its runs; 0 (or less) means no limit.
struct Budget {
  int64_t steps = 50;
  int64_t input_tokens = 5'000'000;
  int64_t output_tokens = 500'000;
  double seconds = 3600;
  double cost_usd = 10.0;  // 0: no cost limit
};

struct Price {
  double input_per_mtok = 0;   // US dollars per million input tokens
  double output_per_mtok = 0;  // ... per million output tokens
};

struct ApprovalRule {
  std::string tool;  // "bash", "memory", "str_replace_based_edit_tool"; "" any
  std::string pattern;  // ECMAScript regex over the command or path; "" any
};

struct AgentOptions {
  std::string system_prompt;
  Budget budget;
  Price price;
  int max_tokens = 8192;
  std::vector<ApprovalRule> approvals;
  // Asked for a call that matches a rule; `summary` says what it would do.
  // nullopt (or no function): wait for an answer from another terminal.
  std::function<std::optional<bool>(const std::string& summary)> approve;
  double approval_timeout_s = 900;
  // One readable line per step (tool, argument, result, tokens and cost).
  std::function<void(const std::string& line)> progress;
};

struct Outcome {
  std::string state;   // done, budget, failed, interrupted
  std::string reason;  // for people
  std::string final_text;
};

// Answers a waiting approval of call `call` in session `id` of `user`
// (yes or no), returning what the call is (the summary it was asked with,
// made printable). ENOENT when no such call is waiting.
vfs::Result<std::string> RecordApproval(SessionLog& log,
                                        const std::string& user,
                                        const std::string& id,
                                        const std::string& call, bool yes);

// Whether the harness process that last ran session `s` (its owner stamp:
// host, pid, start time) still runs; true when it cannot tell (another
// host) or the session has no owner.
bool HarnessAlive(const SessionInfo& s);

// `s` for a terminal, lines kept: control characters other than newline
// and tab (an escape sequence in a model's text or a command's output) are
// written as \xNN, and a backslash is doubled.
std::string TerminalText(const std::string& s);

// The tools the loop offers (bash, the text editor, the memory tool).
std::vector<ToolSpec> AgentTools();

class Agent {
 public:
  Agent(ModelClient& model, FileTools& files, BashTool& bash, SessionLog& log,
        SessionInfo session, AgentOptions options);

  // Records the task and runs.
  vfs::Result<Outcome> Start(const std::string& task);
  // Continues from the session's events.
  vfs::Result<Outcome> Resume();

  const SessionInfo& session() const { return session_; }

 private:
  vfs::Result<Outcome> Loop(std::vector<Message> messages);
  // Runs (or refuses) the calls of `assistant` not answered in `done`.
  // `run_missing`: run the calls not in `done` (false: answer them as
  // interrupted, for earlier turns of a replayed session).
  vfs::Result<Message> Answer(const Message& assistant,
                              const std::map<std::string, ToolResult>& done,
                              bool run_missing = true);
  // Asks for approval when a rule matches: a result when the call may not
  // run (denied, or the harness was interrupted while waiting).
  std::optional<ToolResult> Approve(const ContentBlock& call);
  ToolResult RunTool(const ContentBlock& call);
  vfs::Result<Outcome> StopInterrupted();
  int64_t ElapsedMs() const;  // over all runs of the session
  // The answer, or nullopt when none came in time.
  std::optional<bool> WaitForApproval(const std::string& call_id,
                                      const std::string& summary);
  std::optional<std::string> BudgetReached() const;
  vfs::Result<Outcome> Stop(const std::string& state, const std::string& reason,
                            const std::string& final_text = "");
  void Progress(const std::string& line);

  ModelClient& model_;
  FileTools& files_;
  BashTool& bash_;
  SessionLog& log_;
  SessionInfo session_;
  AgentOptions options_;
  std::chrono::steady_clock::time_point run_started_;
  int64_t elapsed_before_ms_ = 0;
};

}  // namespace agentvfs::harness
