// The agent loop (see agent.h).
#include "harness/agent.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace agentvfs::harness {

using nlohmann::json;
using vfs::Fail;

namespace {

std::string Short(std::string s, size_t n = 60) {
  for (char& c : s)
    if (c == '\n' || c == '\t') c = ' ';
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

// The invisible formatting character (bidirectional controls, zero-width
// and joining characters, line and paragraph separators, variation
// selectors, tags, the soft hyphen, the BOM) whose UTF-8 starts at s[i]:
// its code point and length in bytes, or {0, 0}.
std::pair<uint32_t, size_t> InvisibleFormat(const std::string& s, size_t i) {
  auto at = [&](size_t k) -> uint32_t {
    return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u;
  };
  uint32_t c = at(i);
  size_t len = c >= 0xC2 && c <= 0xDF   ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
  if (len == 0) return {0, 0};
  uint32_t cp = c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((at(i + k) >> 6) != 2) return {0, 0};
    cp = (cp << 6) | (at(i + k) & 0x3F);
  }
  const bool invisible =
      cp == 0x00ad || cp == 0x061c || cp == 0x180e ||
      (cp >= 0x200b && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202e) ||
      (cp >= 0x2060 && cp <= 0x2069) || (cp >= 0xfe00 && cp <= 0xfe0f) ||
      cp == 0xfeff || (cp >= 0xfff9 && cp <= 0xfffb) ||
      (cp >= 0xe0000 && cp <= 0xe007f);
  return invisible ? std::pair{cp, len} : std::pair<uint32_t, size_t>{0, 0};
}

// `s` as a person may safely see it on a terminal: control characters (C0,
// DEL, and C1 as UTF-8) written as \xNN (\n, \t, \r by name), and a
// backslash doubled, so a written "\n" never looks like a line break. Raw, a
// model's command could carry "\r\x1b[2K" and make an approval prompt or a
// progress line show something other than what runs. Invisible formatting
// characters (InvisibleFormat) are written as \uXXXX.
std::string Printable(const std::string& s, bool keep_lines = false) {
  std::string out;
  out.reserve(s.size());
  char hex[16];
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (keep_lines && (c == '\n' || c == '\t')) {
      out += static_cast<char>(c);
    } else if (c == '\\') {
      out += "\\\\";  // so that "\\n" is never taken for a newline
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else if (c == 0xC2 && i + 1 < s.size() &&
               static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9f) {
      // U+0080..U+009F: C1 controls (CSI is U+009B).
      std::snprintf(hex, sizeof hex, "\\u%04x",
                    static_cast<unsigned char>(s[i + 1]));
      out += hex;
      ++i;
    } else if (auto [cp, len] = InvisibleFormat(s, i); len > 0) {
      // Bidi overrides and isolates, zero-width characters: a command
      // that shows one way and runs another.
      std::snprintf(hex, sizeof hex, cp > 0xffff ? "\\U%08x" : "\\u%04x",
                    static_cast<unsigned>(cp));
      out += hex;
      i += len - 1;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// A call id a person can type: 1 to 128 printable ASCII characters, no
// space.
bool Typeable(const std::string& id) {
  return !id.empty() && id.size() <= 128 &&
         std::all_of(id.begin(), id.end(),
                     [](char c) { return c > 0x20 && c < 0x7f; });
}

// What a call does, in one line: the command, or the command and every
// path it names (normalised and, with a resolver, through the symlinks on
// its way, so that approval rules see what will be touched:
// /workspace//a/../b is /workspace/b, and /workspace/pp/x is
// /workspace/protected/x when pp links to protected).
std::string Argument(const ContentBlock& call,
                     const FileTools* resolver = nullptr) {
  const json& in = call.input;
  if (!in.is_object()) return "(bad input)";
  if (in.contains("command") && call.name == "bash" &&
      in["command"].is_string())
    return in["command"].get<std::string>();
  // The model chooses the input: a field of another type than the schema
  // says must not throw (the tool itself then says what is wrong).
  auto text = [&](const char* key) -> const std::string* {
    auto it = in.find(key);
    return it != in.end() && it->is_string() ? it->get_ptr<const std::string*>()
                                             : nullptr;
  };
  std::string what = text("command") ? *text("command") : std::string();
  for (const char* key : {"path", "old_path", "new_path"}) {
    const std::string* v = text(key);
    if (v == nullptr) continue;
    auto p = vfs::Path::Parse(*v);
    // What will be touched: through a symlink in the workspace
    // (`ln -s protected pp`), the place it leads to.
    what += " " + (p ? (resolver ? resolver->Resolve(*p) : *p).str() : *v);
  }
  if (auto r = in.find("restart");
      r != in.end() && r->is_boolean() && r->get<bool>())
    return "restart";
  return what;
}

// The last non-empty line of a tool result (where the exit code is).
std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

const json kStringProp = {{"type", "string"}};

const char* const kCutByMaxTokens =
    "Not run: your output reached max_tokens, so this call may be "
    "incomplete. Send it again, shorter (e.g. write long content in several "
    "steps).";

const char* const kInterrupted =
    "This call was interrupted (the harness stopped while it ran); it may "
    "or may not have taken effect. Check before you repeat it.";

}  // namespace

bool OwnerAlive(const std::string& stamp);  // below

std::string TerminalText(const std::string& s) {
  return Printable(s, /*keep_lines=*/true);
}

std::vector<ToolSpec> AgentTools() {
  json path = {{"type", "string"},
               {"description", "Absolute path, e.g. /workspace/a.py"}};
  json view_range = {{"type", "array"},
                     {"items", {{"type", "integer"}}},
                     {"description", "[start, end] lines; end -1: to the end"}};
  json editor_props = {
      {"command",
       {{"type", "string"},
        {"enum", {"view", "create", "str_replace", "insert"}}}},
      {"path", path},
      {"view_range", view_range},
      {"file_text", kStringProp},
      {"old_str", kStringProp},
      {"new_str", kStringProp},
      {"insert_line", {{"type", "integer"}}},
      {"insert_text", kStringProp}};
  json memory_props = editor_props;
  memory_props["command"]["enum"] = {"view",   "create", "str_replace",
                                     "insert", "delete", "rename"};
  memory_props["old_path"] = kStringProp;
  memory_props["new_path"] = kStringProp;
  return {
      {"bash",
       "Run a shell command in the sandbox (no network). Each call is a new "
       "bash at /workspace: files, /tmp and background processes carry "
       "over, cd and variables do not. /memories and /skills are there too.",
       {{"type", "object"},
        {"properties",
         {{"command", kStringProp}, {"restart", {{"type", "boolean"}}}}}},
       "bash_20250124"},
      {"str_replace_based_edit_tool",
       "View, create and edit files in /workspace, /memories and /skills.",
       {{"type", "object"},
        {"properties", editor_props},
        {"required", {"command", "path"}}},
       "text_editor_20250728"},
      {"memory",
       "Your memory in /memories: view, create, str_replace, insert, "
       "delete, rename. Read it at the start; keep what is worth keeping.",
       {{"type", "object"},
        {"properties", memory_props},
        {"required", {"command"}}},
       "memory_20250818"},
  };
}

Agent::Agent(ModelClient& model, FileTools& files, BashTool& bash,
             SessionLog& log, SessionInfo session, AgentOptions options)
    : model_(model),
      files_(files),
      bash_(bash),
      log_(log),
      session_(std::move(session)),
      options_(std::move(options)) {}

void Agent::Progress(const std::string& line) {
  if (options_.progress) options_.progress(line);
}

std::optional<std::string> Agent::BudgetReached() const {
  const Budget& b = options_.budget;
  auto elapsed = ElapsedMs();
  if (b.steps > 0 && session_.steps >= b.steps)
    return "step budget reached (" + std::to_string(session_.steps) +
           " model calls); resume with a larger --max-steps";
  if (b.input_tokens > 0 && session_.input_tokens >= b.input_tokens)
    return "input-token budget reached (" +
           std::to_string(session_.input_tokens) +
           "); resume with a larger --max-input-tokens";
  if (b.output_tokens > 0 && session_.output_tokens >= b.output_tokens)
    return "output-token budget reached (" +
           std::to_string(session_.output_tokens) +
           "); resume with a larger --max-output-tokens";
  if (b.seconds > 0 && elapsed >= b.seconds * 1000)
    return "time budget reached (" + std::to_string(elapsed / 1000) +
           " s); resume with a larger --max-seconds";
  if (b.cost_usd > 0 && session_.cost_micros >= b.cost_usd * 1e6) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "$%.4f", session_.cost_micros / 1e6);
    return std::string("cost budget reached (") + buf +
           "); resume with a larger --max-cost";
  }
  return std::nullopt;
}

vfs::Result<Outcome> Agent::Stop(const std::string& state,
                                 const std::string& reason,
                                 const std::string& final_text) {
  session_.state = state;
  session_.reason = reason;
  session_.elapsed_ms = ElapsedMs();
  if (auto ok = log_.Append(session_.id, "stopped",
                            {{"state", state}, {"reason", reason}});
      !ok)
    return std::unexpected(ok.error());
  if (auto ok = log_.Update(session_); !ok) return std::unexpected(ok.error());
  return Outcome{state, reason, final_text};
}

// The longest call text approval rules are matched against (see Approve).
constexpr size_t kMaxMatched = 4096;

std::optional<ToolResult> Agent::Approve(const ContentBlock& call) {
  const std::string arg =
      options_.approvals.empty() ? std::string() : Argument(call, &files_);
  for (const auto& rule : options_.approvals) {
    if (!rule.tool.empty() && rule.tool != call.name) continue;
    bool matches = rule.pattern.empty();
    if (!matches) {
      // std::regex recurses about once per character it matches: a pattern
      // with `.*` over a 200,000-character command overflowed the stack,
      // and every resume crashed again on the same call. A longer call
      // than kMaxMatched asks, like a broken rule.
      if (arg.size() > kMaxMatched) {
        matches = true;
      } else {
        try {
          matches = std::regex_search(arg, std::regex(rule.pattern));
        } catch (const std::regex_error&) {
          matches = true;  // a broken rule asks rather than lets through
        }
      }
    }
    if (!matches) continue;
    std::string summary = Printable(call.name) + ": " + Printable(arg);
    std::optional<bool> yes;
    if (options_.approve) yes = options_.approve(summary);
    bool timed_out = false;
    if (!yes) {
      yes = WaitForApproval(call.id, summary);
      timed_out = !yes.has_value();
      yes = yes.value_or(false);
    }
    // Stopped while waiting: neither approved nor denied (a resume asks
    // again).
    if (Interrupted()) return ToolResult{kInterrupted, true};
    (void)log_.Append(session_.id, *yes ? "approved" : "denied",
                      {{"id", call.id}, {"summary", summary}});
    if (!*yes)
      return ToolResult{(timed_out ? "Nobody approved this call in time ("
                                   : "A person denied this call (") +
                            Short(summary, 200) +
                            "), so it was not run. Do not retry it; continue "
                            "another way or explain what you need.",
                        true};
    break;
  }
  return std::nullopt;
}

ToolResult Agent::RunTool(const ContentBlock& call) {
  try {
    if (call.name == "bash") {
      // The time budget covers commands too: one may run only as long as
      // the budget has left (a turn of five `sleep 3` ran 15 s past a 2 s
      // budget).
      double left = 0;
      if (options_.budget.seconds > 0) {
        left = options_.budget.seconds - ElapsedMs() / 1000.0;
        if (left <= 0)
          return {
              "Not run: the session's time budget (--max-seconds) is used "
              "up; the session stops after this turn.",
              true};
      }
      return bash_.Run(call.input, left);
    }
    if (call.name == "str_replace_based_edit_tool")
      return files_.Editor(call.input);
    if (call.name == "memory") return files_.Memory(call.input);
  } catch (const json::exception& e) {
    // A field of an unexpected type that a tool read without checking:
    // the model is told, the session goes on.
    return {std::string("Error: the input does not match the tool's schema (") +
                e.what() + "); send it again with the documented fields",
            true};
  }
  return {"Error: there is no tool named '" + call.name +
              "'; use bash, str_replace_based_edit_tool or memory",
          true};
}

std::optional<bool> Agent::WaitForApproval(const std::string& call_id,
                                           const std::string& summary) {
  auto asked = log_.Append(session_.id, "approval_requested",
                           {{"id", call_id}, {"summary", summary}});
  if (!asked) return false;
  // Only an answer given after this request counts: call ids come from the
  // model's server, and some reuse them (or send none), so an answer to an
  // earlier call with the same id must not approve this one.
  session_.state = "waiting";
  (void)log_.Update(session_);
  // The call whole, as it will run (a cut one could hide `; rm -rf` after
  // a harmless start); a very long one up to a point, saying where the
  // rest is.
  constexpr size_t kShown = 4000;
  std::string shown = summary.size() <= kShown
                          ? summary
                          : summary.substr(0, kShown) + "... (" +
                                std::to_string(summary.size()) +
                                " bytes in all; `agentvfs show " + session_.id +
                                "` shows it whole)";
  Progress("[" + std::to_string(session_.steps) + "] waiting for approval of " +
           shown + "\n    agentvfs approve " + session_.id + " " + call_id +
           "  (or: agentvfs deny " + session_.id + " " + call_id + ")");
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(
                      static_cast<int64_t>(options_.approval_timeout_s * 1000));
  std::optional<bool> answer;
  while (!answer && std::chrono::steady_clock::now() < deadline &&
         !Interrupted()) {
    if (auto events = log_.Events(session_.user, session_.id)) {
      for (const auto& e : *events)
        if (e.seq > *asked && e.kind == "approval" &&
            e.data.value("id", std::string()) == call_id)
          answer = e.data.value("yes", false);
    }
    if (!answer) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  session_.state = "running";
  (void)log_.Update(session_);
  return answer;
}

vfs::Result<std::string> RecordApproval(SessionLog& log,
                                        const std::string& user,
                                        const std::string& id,
                                        const std::string& call, bool yes) {
  auto events = log.Events(user, id);
  if (!events) return std::unexpected(events.error());
  bool waiting = false;
  std::string summary;
  for (const auto& e : *events) {
    if (e.data.value("id", std::string()) != call) continue;
    if (e.kind == "approval_requested") {
      waiting = true;
      summary = e.data.value("summary", std::string());
    }
    if (e.kind == "approval" || e.kind == "approved" || e.kind == "denied")
      waiting = false;
  }
  if (!waiting)
    return Fail(ENOENT, "no call '" + call + "' of session " + id +
                            " is waiting for approval; `agentvfs show " + id +
                            "` lists its calls");
  // An answer only counts for the harness that asked: one that has died
  // never reads it, and a resumed one asks again.
  auto info = log.Get(user, id);
  if (!info) return std::unexpected(info.error());
  const json owner = info->config.value("owner", json());
  if (info->state != "waiting" || !owner.is_string() ||
      !OwnerAlive(owner.get<std::string>()))
    return Fail(ESRCH, "session " + id +
                           " is no longer waiting (its harness stopped); "
                           "`agentvfs resume " +
                           id + "` runs it again and asks for " + call +
                           " anew");
  auto ok =
      log.Append(id, "approval", {{"id", call}, {"yes", yes}, {"by", user}});
  if (!ok) return std::unexpected(ok.error());
  return summary;
}

vfs::Result<Message> Agent::Answer(
    const Message& assistant, const std::map<std::string, ToolResult>& done,
    bool run_missing) {
  Message reply{"user", {}};
  for (const auto& b : assistant.content) {
    if (b.kind != ContentBlock::Kind::kToolUse) continue;
    ToolResult result;
    if (auto it = done.find(b.id); it != done.end()) {
      result = it->second;
    } else if (!run_missing) {
      // An earlier turn of a replayed session: never run now.
      result = {kInterrupted, true};
    } else if (Interrupted()) {
      // Not started: a resume runs it (the reply is never sent).
      result = {kInterrupted, true};
    } else {
      // Approval first: a call is "started" only once it may run, so a
      // harness stopped while waiting asks again when resumed.
      if (auto refused = Approve(b)) {
        result = std::move(*refused);
        // A denial is recorded, so a resume replays it; a wait that an
        // interrupt ended is not, so a resume asks again.
        if (!Interrupted()) {
          if (auto ok = log_.Append(session_.id, "tool_finished",
                                    {{"id", b.id},
                                     {"name", b.name},
                                     {"result", result.text},
                                     {"is_error", true},
                                     {"not_run", true}});
              !ok)
            return std::unexpected(ok.error());
        }
        reply.content.push_back(
            ContentBlock::ToolResult(b.id, result.text, result.is_error));
        continue;
      }
      if (auto ok =
              log_.Append(session_.id, "tool_started",
                          {{"id", b.id}, {"name", b.name}, {"input", b.input}});
          !ok)
        return std::unexpected(ok.error());
      result = RunTool(b);
      result.text = ValidUtf8(result.text);
      if (auto ok = log_.Append(session_.id, "tool_finished",
                                {{"id", b.id},
                                 {"name", b.name},
                                 {"result", result.text},
                                 {"is_error", result.is_error}});
          !ok)
        return std::unexpected(ok.error());
      // The time spent is kept after every call, not only at model calls:
      // after a crash during a long command the session showed 10 ms.
      session_.elapsed_ms = ElapsedMs();
      (void)log_.Update(session_);
      size_t lines = std::count(result.text.begin(), result.text.end(), '\n');
      char cost[32];
      std::snprintf(cost, sizeof(cost), "$%.4f", session_.cost_micros / 1e6);
      Progress("[" + std::to_string(session_.steps) + "] " + Printable(b.name) +
               ": " + Printable(Short(Argument(b))) + " -> " +
               (result.is_error ? "error: " : "") +
               Printable(Short(LastLine(result.text), 50)) + " (" +
               std::to_string(lines + 1) + " lines) | " +
               std::to_string(session_.input_tokens) + " in, " +
               std::to_string(session_.output_tokens) + " out, " + cost);
    }
    reply.content.push_back(
        ContentBlock::ToolResult(b.id, result.text, result.is_error));
  }
  return reply;
}

vfs::Result<Outcome> Agent::StopInterrupted() {
  const int sig = Interrupted();
  Progress("[" + std::to_string(session_.steps) + "] interrupted (" +
           (sig > 0 ? std::string(strsignal(sig)) : "stopped") + ")");
  return Stop("interrupted", std::string("interrupted by ") +
                                 (sig > 0 ? strsignal(sig) : "a stop request") +
                                 "; `agentvfs resume " + session_.id +
                                 "` continues");
}

int64_t Agent::ElapsedMs() const {
  return elapsed_before_ms_ +
         std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now() - run_started_)
             .count();
}

vfs::Result<Outcome> Agent::Loop(std::vector<Message> messages) {
  for (;;) {
    if (Interrupted()) return StopInterrupted();
    if (auto reached = BudgetReached()) return Stop("budget", *reached);
    ModelRequest req;
    req.system = options_.system_prompt;
    req.messages = messages;
    req.tools = AgentTools();
    req.max_tokens = options_.max_tokens;
    // The time budget bounds the model call too (its retries included).
    if (options_.budget.seconds > 0)
      req.deadline = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(
                         options_.budget.seconds * 1000 - ElapsedMs()));
    auto r = model_.Complete(req);
    if (!r) {
      (void)log_.Append(
          session_.id, "model_error",
          {{"errno", r.error().code}, {"message", r.error().message}});
      if (r.error().code == ECANCELED && Interrupted())
        return StopInterrupted();
      if (req.deadline && std::chrono::steady_clock::now() >= *req.deadline)
        return Stop("budget", "time budget reached (" +
                                  std::to_string(ElapsedMs() / 1000) +
                                  " s) while waiting for the model; resume "
                                  "with a larger --max-seconds");
      if (r.error().code == EINVAL)  // refused as it is: the same again fails
        return Stop("failed",
                    r.error().message + "; `agentvfs resume " + session_.id +
                        "` sends the same conversation again, so fix the "
                        "cause first (a model name or setting: resume with "
                        "other flags; a conversation too long for the "
                        "model: start a new session)");
      return Stop("failed", r.error().message + "; `agentvfs resume " +
                                session_.id + "` tries again");
    }
    // Every call of a turn needs an id of its own: answers are matched to
    // calls by id, also when a session is resumed. Some servers send none,
    // or the same one twice. A person types an id to approve a call, so one
    // that is not short printable ASCII without spaces (control characters
    // would also reach the terminal) is replaced too.
    {
      std::set<std::string> seen;
      int n = 0;
      for (auto& b : r->message.content) {
        if (b.kind != ContentBlock::Kind::kToolUse) continue;
        ++n;
        if (!Typeable(b.id) || !seen.insert(b.id).second) {
          b.id = "agentvfs_" + std::to_string(session_.steps + 1) + "_" +
                 std::to_string(n);
          seen.insert(b.id);
        }
      }
    }
    session_.steps += 1;
    session_.input_tokens += r->usage.input_tokens;
    session_.output_tokens += r->usage.output_tokens;
    session_.cost_micros += static_cast<int64_t>(
        std::llround(r->usage.input_tokens * options_.price.input_per_mtok +
                     r->usage.output_tokens * options_.price.output_per_mtok));
    if (auto ok = log_.Append(session_.id, "model",
                              {{"message", MessageToJson(r->message)},
                               {"usage",
                                {{"input_tokens", r->usage.input_tokens},
                                 {"output_tokens", r->usage.output_tokens}}},
                               {"stop_reason", r->stop_reason},
                               {"model", r->model},
                               {"attempts", r->attempts}});
        !ok)
      return std::unexpected(ok.error());
    session_.elapsed_ms = ElapsedMs();  // kept if the harness dies
    if (auto ok = log_.Update(session_); !ok)
      return std::unexpected(ok.error());
    messages.push_back(r->message);
    bool calls = std::any_of(
        r->message.content.begin(), r->message.content.end(),
        [](const auto& b) { return b.kind == ContentBlock::Kind::kToolUse; });
    if (!calls) {
      std::string text;
      for (const auto& b : r->message.content)
        if (b.kind == ContentBlock::Kind::kText) text += b.text;
      if (r->stop_reason == "refusal") {
        Progress("[" + std::to_string(session_.steps) +
                 "] refused: " + Printable(Short(text)));
        return Stop("failed", "the model refused the request", text);
      }
      Progress("[" + std::to_string(session_.steps) +
               "] done: " + Printable(Short(text)));
      return Stop("done",
                  r->stop_reason == "max_tokens"
                      ? "the model stopped at its output limit"
                      : "the model finished",
                  text);
    }
    if (r->stop_reason == "max_tokens") {
      // The output was cut: its last call may be incomplete. None is run;
      // each is answered so, and the model tries again.
      // Each answer is recorded, so a resume replays it and never runs
      // the call.
      std::map<std::string, ToolResult> cut;
      for (const auto& b : r->message.content) {
        if (b.kind != ContentBlock::Kind::kToolUse) continue;
        cut[b.id] = {kCutByMaxTokens, true};
        if (auto ok = log_.Append(session_.id, "tool_finished",
                                  {{"id", b.id},
                                   {"name", b.name},
                                   {"result", kCutByMaxTokens},
                                   {"is_error", true},
                                   {"not_run", true}});
            !ok)
          return std::unexpected(ok.error());
      }
      auto reply = Answer(r->message, cut);
      if (!reply) return std::unexpected(reply.error());
      messages.push_back(std::move(*reply));
      continue;
    }
    auto reply = Answer(r->message, {});
    if (!reply) return std::unexpected(reply.error());
    if (Interrupted()) return StopInterrupted();
    messages.push_back(std::move(*reply));
  }
}

std::string OwnerStamp() {
  std::ifstream f("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(f)),
                   std::istreambuf_iterator<char>());
  auto paren = stat.rfind(')');
  std::string start;
  if (paren != std::string::npos) {
    std::istringstream fields(stat.substr(paren + 2));
    std::string v;
    for (int i = 3; i <= 22 && fields >> v; ++i)
      if (i == 22) start = v;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + " " + std::to_string(getpid()) + " " + start;
}

bool OwnerAlive(const std::string& stamp) {
  std::istringstream in(stamp);
  std::string host, start;
  long pid = 0;
  if (!(in >> host >> pid >> start) || pid <= 0) return false;
  char me[256] = {};
  gethostname(me, sizeof(me) - 1);
  if (host != me) return true;  // another host's: assume it runs
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)),
                   std::istreambuf_iterator<char>());
  auto paren = stat.rfind(')');
  if (paren == std::string::npos) return false;
  std::istringstream fields(stat.substr(paren + 2));
  std::string v;
  for (int i = 3; i <= 22 && fields >> v; ++i)
    if (i == 22) return v == start;
  return false;
}

bool HarnessAlive(const SessionInfo& s) {
  auto owner = s.config.find("owner");
  if (owner == s.config.end() || !owner->is_string()) return true;
  return OwnerAlive(owner->get<std::string>());
}

vfs::Result<Outcome> Agent::Start(const std::string& task) {
  run_started_ = std::chrono::steady_clock::now();
  session_.config["owner"] = OwnerStamp();
  if (auto ok = log_.Append(session_.id, "task", {{"text", task}}); !ok)
    return std::unexpected(ok.error());
  session_.state = "running";
  if (auto ok = log_.Update(session_); !ok) return std::unexpected(ok.error());
  return Loop({Message{"user", {ContentBlock::Text(task)}}});
}

vfs::Result<Outcome> Agent::Resume() {
  run_started_ = std::chrono::steady_clock::now();
  // One harness per session: a live one is never joined by a second, which
  // would run the same calls again.
  if ((session_.state == "running" || session_.state == "waiting") &&
      session_.config.contains("owner") &&
      session_.config["owner"].is_string() &&
      OwnerAlive(session_.config["owner"].get<std::string>()))
    return Fail(EBUSY, "session " + session_.id +
                           " is being run by another harness (" +
                           session_.config["owner"].get<std::string>() +
                           "); wait for it to end, or stop it first");
  // Claimed before anything runs, and only if no other harness claimed it
  // since this one read it.
  const std::string was = session_.state;
  session_.config["owner"] = OwnerStamp();
  session_.state = "running";
  if (auto ok = log_.Claim(session_); !ok) return std::unexpected(ok.error());
  // Until the session is handed to the loop (or stopped), a failure puts
  // back the state it had: it must not show as running after we exit.
  struct Restore {
    Agent& agent;
    const std::string& was;
    bool armed = true;
    ~Restore() {
      if (!armed) return;
      agent.session_.state = was;
      (void)agent.log_.Update(agent.session_);
    }
  } restore{*this, was};
  elapsed_before_ms_ = session_.elapsed_ms;
  auto events = log_.Events(session_.user, session_.id);
  if (!events) return std::unexpected(events.error());
  std::vector<Message> messages;
  std::map<std::string, ToolResult> done;  // results since the last model call
  std::map<std::string, bool> started;
  std::string last_stop_reason;  // of the last model turn
  for (const auto& e : *events) {
    if (e.kind == "task") {
      messages.push_back(
          {"user", {ContentBlock::Text(e.data.value("text", std::string()))}});
    } else if (e.kind == "model") {
      // The previous assistant turn's answers first.
      if (!messages.empty() && messages.back().role == "assistant") {
        auto reply = Answer(messages.back(), done, /*run_missing=*/false);
        if (!reply) return std::unexpected(reply.error());
        messages.push_back(std::move(*reply));
      }
      done.clear();
      started.clear();
      auto m = MessageFromJson(e.data.value("message", json()));
      if (!m) return std::unexpected(m.error());
      if (auto sr = e.data.find("stop_reason");
          sr != e.data.end() && sr->is_string())
        last_stop_reason = sr->get<std::string>();
      // Calls of an output cut at max_tokens were never run, and never
      // are (logs written before their answers were recorded).
      if (e.data.value("stop_reason", json()) == "max_tokens")
        for (const auto& b : m->content)
          if (b.kind == ContentBlock::Kind::kToolUse)
            done[b.id] = ToolResult{kCutByMaxTokens, true};
      messages.push_back(std::move(*m));
    } else if (e.kind == "tool_started") {
      started[e.data.value("id", std::string())] = true;
    } else if (e.kind == "tool_finished") {
      done[e.data.value("id", std::string())] =
          ToolResult{e.data.value("result", std::string()),
                     e.data.value("is_error", false)};
    }
  }
  if (messages.empty()) return Fail(EINVAL, "session has no task to resume");
  if (messages.back().role == "assistant") {
    const Message& last = messages.back();
    bool calls = std::any_of(
        last.content.begin(), last.content.end(),
        [](const auto& b) { return b.kind == ContentBlock::Kind::kToolUse; });
    if (!calls) {
      std::string text;
      for (const auto& b : last.content)
        if (b.kind == ContentBlock::Kind::kText) text += b.text;
      // Stopped already (done, or failed on a refusal): nothing to do; the
      // restore puts the state back.
      if (was == "done" || was == "failed")
        return Outcome{was, session_.reason, text};
      // The model had finished; the harness stopped before recording it.
      run_started_ = std::chrono::steady_clock::now();
      restore.armed = false;
      if (last_stop_reason == "refusal")
        return Stop("failed", "the model refused the request", text);
      return Stop("done",
                  last_stop_reason == "max_tokens"
                      ? "the model stopped at its output limit"
                      : "the model finished",
                  text);
    }
    // Calls that started and never finished are answered, never rerun.
    for (const auto& [id, _] : started) {
      if (!done.count(id)) {
        done[id] = ToolResult{kInterrupted, true};
        (void)log_.Append(session_.id, "tool_finished",
                          {{"id", id},
                           {"result", done[id].text},
                           {"is_error", true},
                           {"interrupted", true}});
      }
    }
    if (calls) {
      auto reply = Answer(last, done);
      if (!reply) return std::unexpected(reply.error());
      messages.push_back(std::move(*reply));
    }
  }
  session_.state = "running";
  (void)log_.Append(session_.id, "resumed", json::object());
  if (auto ok = log_.Update(session_); !ok) return std::unexpected(ok.error());
  restore.armed = false;
  return Loop(std::move(messages));
}

}  // namespace agentvfs::harness
