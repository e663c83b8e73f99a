// The harness's commands. The model, its provider and prices come from
// flags, else the config file ($AGENTVFS_CONFIG or
// ~/.config/agentvfs/config.yaml: `provider`, `model`, `base_url`,
// `prices: {MODEL: {input: USD_PER_MTOK, output: USD_PER_MTOK}}`,
// `approvals: [{tool: bash, pattern: "rm -rf|git push"}]`, `api_key`), else
// the environment (ANTHROPIC_API_KEY / OPENAI_API_KEY and their _BASE_URL).
#include "cli/run_commands.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <regex>

#include "backends/local_dir/local_dir.h"
#include "backends/sandbox/sandbox.h"
#include "cli/signal_guard.h"
#include "cli/store_access.h"
#include "harness/agent.h"
#include "harness/prompt.h"
#include "router/router.h"

namespace agentvfs::cli {
namespace {

using nlohmann::json;

struct RunArgs {
  std::string workspace;
  StoreFlags store;
  std::string provider, model, base_url;
  int64_t max_steps = -1, max_input_tokens = -1, max_output_tokens = -1;
  double max_seconds = -1, max_cost = -1;
  double command_timeout = 120;
  double approval_timeout = -1;
  std::string call;  // approve, deny
  bool json_events = false;
  std::string task;     // run
  std::string session;  // resume, show
};

json BudgetJson(const harness::Budget& b) {
  return {{"steps", b.steps},
          {"input_tokens", b.input_tokens},
          {"output_tokens", b.output_tokens},
          {"seconds", b.seconds},
          {"cost_usd", b.cost_usd}};
}

// On resume, each budget no flag sets is the one recorded with the session.
void KeepRecordedBudget(const json& config, const RunArgs& a,
                        harness::Budget& b) {
  auto it = config.find("budget");
  if (it == config.end() || !it->is_object()) return;
  auto keep = [&](const char* key, bool flagged, auto& field) {
    auto v = it->find(key);
    if (!flagged && v != it->end() && v->is_number())
      field = v->template get<std::remove_reference_t<decltype(field)>>();
  };
  keep("steps", a.max_steps >= 0, b.steps);
  keep("input_tokens", a.max_input_tokens >= 0, b.input_tokens);
  keep("output_tokens", a.max_output_tokens >= 0, b.output_tokens);
  keep("seconds", a.max_seconds >= 0, b.seconds);
  keep("cost_usd", a.max_cost >= 0, b.cost_usd);
}

// Fills the model settings and options from flags, then the config file.
vfs::Status Configure(const RunArgs& a, harness::ClientConfig& client,
                      harness::AgentOptions& options) {
  auto loaded = LoadConfig();
  if (!loaded) return std::unexpected(loaded.error());
  YAML::Node root = *loaded;
  std::string path = ConfigFilePath();
  auto pick = [&](const std::string& flag, const char* key) {
    if (!flag.empty()) return flag;
    if (root[key]) return root[key].as<std::string>();
    return std::string();
  };
  client.provider = pick(a.provider, "provider");
  if (client.provider.empty())
    client.provider = std::getenv("ANTHROPIC_API_KEY") == nullptr &&
                              std::getenv("OPENAI_API_KEY") != nullptr
                          ? "openai"
                          : "anthropic";
  client.model = pick(a.model, "model");
  if (client.model.empty())
    client.model =
        client.provider == "openai" ? "gpt-4.1" : "claude-sonnet-4-5";
  client.base_url = pick(a.base_url, "base_url");
  // The key: the config file (keep it mode 0600), else the environment;
  // never a command-line argument (anyone can read argv in /proc).
  if (root["api_key"]) client.api_key = root["api_key"].as<std::string>();
  try {
    if (root["prices"] && root["prices"][client.model]) {
      options.price.input_per_mtok =
          root["prices"][client.model]["input"].as<double>(0);
      options.price.output_per_mtok =
          root["prices"][client.model]["output"].as<double>(0);
    }
    if (root["approvals"]) {
      for (const auto& r : root["approvals"]) {
        harness::ApprovalRule rule{r["tool"].as<std::string>(""),
                                   r["pattern"].as<std::string>("")};
        // A rule that can never match must not pass for a safeguard: a
        // misspelt tool (Bash, text_editor) let every call through.
        if (!rule.tool.empty() && rule.tool != "bash" &&
            rule.tool != "str_replace_based_edit_tool" && rule.tool != "memory")
          return vfs::Fail(EINVAL,
                           path + ": approval rule for tool '" +
                               ForTerminal(rule.tool) +
                               "': no such tool; name bash, "
                               "str_replace_based_edit_tool or memory, or "
                               "leave `tool` out to match every tool");
        try {
          (void)std::regex(rule.pattern);
        } catch (const std::regex_error& e) {
          return vfs::Fail(EINVAL, path + ": approval rule pattern '" +
                                       ForTerminal(rule.pattern) +
                                       "' is not a valid regular expression (" +
                                       e.what() + ")");
        }
        options.approvals.push_back(std::move(rule));
      }
    }
  } catch (const std::exception& e) {
    return vfs::Fail(EINVAL, path + ": " + e.what() +
                                 " (prices: {MODEL: {input: N, output: N}}, "
                                 "approvals: [{tool: T, pattern: REGEX}])");
  }
  if (a.max_steps >= 0) options.budget.steps = a.max_steps;
  if (a.max_input_tokens >= 0) options.budget.input_tokens = a.max_input_tokens;
  if (a.max_output_tokens >= 0)
    options.budget.output_tokens = a.max_output_tokens;
  if (a.max_seconds >= 0) options.budget.seconds = a.max_seconds;
  if (a.max_cost >= 0) options.budget.cost_usd = a.max_cost;
  if (options.budget.cost_usd > 0 && options.price.input_per_mtok <= 0 &&
      options.price.output_per_mtok <= 0)
    std::cerr << "agentvfs: warning: no prices for " << client.model << " ("
              << (path.empty() || !std::filesystem::exists(path)
                      ? "there is no config file " + path
                      : "none in " + path)
              << "), so the cost budget ($" << options.budget.cost_usd
              << ") is not enforced and costs show as $0 (add prices: {"
              << client.model
              << ": {input: USD_PER_MTOK, output: "
                 "USD_PER_MTOK}})\n";
  // A person at this terminal answers approval questions; without one, the
  // session waits for `agentvfs approve|deny` from another terminal.
  options.approve = [](const std::string& summary) -> std::optional<bool> {
    if (!isatty(0)) return std::nullopt;
    std::cerr << "approve " << summary << " ? [y/N] " << std::flush;
    std::string line;
    std::getline(std::cin, line);
    return !line.empty() && (line[0] == 'y' || line[0] == 'Y');
  };
  if (a.approval_timeout >= 0) options.approval_timeout_s = a.approval_timeout;
  return {};
}

// One event as a JSON line (run --json, show --json).
std::string EventLine(const harness::Event& e) {
  return json{{"seq", e.seq},
              {"time_ns", e.time_ns},
              {"kind", e.kind},
              {"data", e.data}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string Dollars(int64_t micros) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "$%.4f", micros / 1e6);
  return buf;
}

// Runs (or resumes) a session: the view, the sandbox, the tools, the loop.
int Drive(const RunArgs& a, bool resume) {
  const char* cmd = resume ? "resume" : "run";
  // First, before any thread starts (the store's, the view's, the
  // sandbox's): every thread then blocks the stop signals, and one waits
  // for them. A stop request ends the running command, the loop records
  // the session as interrupted (resumable), and the sandbox and view are
  // closed.
  SignalGuard signals;
  signals.OnSignal([](int sig) { harness::Interrupt(sig); });
  auto session = OpenStoreAsUser(a.store, "run");
  if (!session) return Report(cmd, session.error());
  harness::SessionLog log(session->backend->engine());
  harness::SessionInfo info;
  std::string workspace = a.workspace;
  if (resume) {
    auto got = log.Get(session->caller.user, a.session);
    if (!got) return Report(cmd, got.error());
    info = *got;
    session->caller.session = info.id;
    if (workspace.empty())
      workspace = info.config.value("workspace", std::string());
  }
  if (workspace.empty())
    return Report(cmd,
                  vfs::Error{EINVAL, "no workspace: pass --workspace DIR"});
  harness::ClientConfig client_config;
  harness::AgentOptions options;
  RunArgs settings = a;
  if (resume) {
    // The session goes on with the model it started with, unless flags say
    // otherwise.
    auto recorded = [&info](std::string& field, const char* key) {
      if (field.empty() && info.config.contains(key) &&
          info.config[key].is_string())
        field = info.config[key].get<std::string>();
    };
    recorded(settings.provider, "provider");
    recorded(settings.model, "model");
    recorded(settings.base_url, "base_url");
  }
  if (auto ok = Configure(settings, client_config, options); !ok)
    return Report(cmd, ok.error());
  // The budgets too: a plain `resume` after a crash keeps the limits the
  // session was given (it fell back to the defaults: 50 steps, $10).
  if (resume) KeepRecordedBudget(info.config, a, options.budget);
  auto client = harness::MakeModelClient(client_config);
  if (!client) return Report(cmd, client.error());

  auto router = std::make_unique<router::Router>();
  auto ws = backends::LocalDirBackend::Open(workspace);
  if (!ws) return Report(cmd, ws.error());
  store::StoreBackend& store_ref = *session->backend;
  vfs::Backend* store = router->Adopt(std::move(session->backend));
  router::MountOptions full;
  full.strip_prefix = false;
  for (const char* prefix : {"/memories", "/skills"})
    if (auto ok = router->Mount(prefix, store, full); !ok)
      return Report(cmd, ok.error());
  if (auto ok = router->Mount("/workspace", router->Adopt(std::move(*ws))); !ok)
    return Report(cmd, ok.error());

  sandbox::SandboxOptions so;
  so.workspace = workspace;
  so.view = router.get();
  so.identity = session->caller;
  so.secret_paths = SecretFiles(a.store);
  auto sb = sandbox::Sandbox::Create(so);
  if (!sb) return Report(cmd, sb.error());
  signals.SetTarget(sb->get());
  // Recorded only once the session can run: a set-up that fails leaves no
  // session behind that could not be resumed.
  if (!resume) {
    info.id = session->caller.session;
    info.user = session->caller.user;
    info.state = "new";
    info.task = a.task;
    info.config = {{"workspace", std::filesystem::absolute(workspace).string()},
                   {"provider", client_config.provider},
                   {"model", client_config.model},
                   {"base_url", client_config.base_url}};
  }
  info.config["budget"] = BudgetJson(options.budget);
  if (!resume) {
    if (auto ok = log.Create(info); !ok) {
      signals.SetTarget(nullptr);
      (*sb)->Close();
      return Report(cmd, ok.error());
    }
  }
  harness::FileTools files(*router, session->caller);
  sandbox::Limits limits;
  limits.timeout_s = a.command_timeout;
  limits.output_cap = 64 * 1024;
  harness::BashTool bash(**sb, limits);
  options.system_prompt =
      harness::BuildSystemPrompt(*router, store_ref.engine(), session->caller);
  options.progress = [&a](const std::string& line) {
    if (!a.json_events) std::cout << line << std::endl;
  };
  std::cerr << "agentvfs " << cmd << ": session " << info.id << " as '"
            << info.user << "' with " << client_config.provider << " "
            << client_config.model << "\n";
  harness::Agent agent(**client, files, bash, log, info, options);
  auto out = resume ? agent.Resume() : agent.Start(a.task);
  signals.SetTarget(nullptr);
  (*sb)->Close();
  if (!out) return Report(cmd, out.error());
  if (a.json_events) {
    if (auto events = log.Events(info.user, info.id))
      for (const auto& e : *events) std::cout << EventLine(e) << "\n";
  } else if (!out->final_text.empty()) {
    std::cout << "\n" << harness::TerminalText(out->final_text) << "\n";
  }
  const auto& s = agent.session();
  std::cerr << "agentvfs " << cmd << ": " << out->state << " ("
            << harness::TerminalText(out->reason) << "); " << s.steps
            << " steps, " << s.input_tokens << " in, " << s.output_tokens
            << " out, " << Dollars(s.cost_micros) << "; session " << s.id
            << "\n";
  if (out->state == "interrupted" && signals.signal() > 0)
    return 128 + signals.signal();
  return out->state == "done" ? 0 : (out->state == "budget" ? 3 : 1);
}

std::string When(int64_t ns) {
  std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
  return buf;
}

int Sessions(const RunArgs& a) {
  return RunAsUser(
      "sessions", a.store, "sessions", [&](StoreSession& s) -> vfs::Status {
        harness::SessionLog log(s.backend->engine());
        auto list = log.List(s.caller.user);
        if (!list) return std::unexpected(list.error());
        std::printf("%-28s %-8s %-19s %6s %10s %10s %10s  %s\n", "SESSION",
                    "STATE", "STARTED (UTC)", "STEPS", "IN", "OUT", "COST",
                    "TASK");
        bool died = false;
        for (const auto& i : *list) {
          std::string task = ForTerminal(i.task.substr(0, 50));
          // A session recorded as running or waiting whose harness is gone
          // (kill -9, a crash) is not running: say so.
          std::string state = i.state;
          if ((state == "running" || state == "waiting") &&
              !harness::HarnessAlive(i)) {
            state = "died";
            died = true;
          }
          std::printf("%-28s %-8s %-19s %6lld %10lld %10lld %10s  %s\n",
                      i.id.c_str(), state.c_str(), When(i.created_ns).c_str(),
                      static_cast<long long>(i.steps),
                      static_cast<long long>(i.input_tokens),
                      static_cast<long long>(i.output_tokens),
                      Dollars(i.cost_micros).c_str(), task.c_str());
        }
        if (died)
          std::printf(
              "(died: its harness stopped without recording it; "
              "`agentvfs resume SESSION` goes on)\n");
        return {};
      });
}

// Text of an event for `show`: at most `limit` bytes (cut on a character
// boundary, saying how much is left out), every line indented, so that
// what a model or a command wrote can never pass for an event line.
std::string Indented(const std::string& text, size_t limit = 2000) {
  std::string kept = text;
  if (kept.size() > limit) {
    size_t cut = limit;
    while (cut > 0 && (static_cast<unsigned char>(kept[cut]) & 0xC0) == 0x80)
      --cut;
    kept = kept.substr(0, cut) + " [... " + std::to_string(text.size() - cut) +
           " bytes more; show --json has "
           "them]";
  }
  std::string out = "\n    ";
  for (char c : kept) {
    out += c;
    if (c == '\n') out += "    ";
  }
  return out;
}

int Show(const RunArgs& a) {
  return RunAsUser(
      "show", a.store, "show", [&](StoreSession& s) -> vfs::Status {
        harness::SessionLog log(s.backend->engine());
        auto events = log.Events(s.caller.user, a.session);
        if (!events) return std::unexpected(events.error());
        for (const auto& e : *events) {
          if (a.json_events) {
            std::cout << EventLine(e) << "\n";
            continue;
          }
          std::string line = When(e.time_ns) + "  " + e.kind + ": ";
          const json& d = e.data;
          if (e.kind == "task") {
            const std::string task = d.value("text", std::string());
            line += task.find('\n') == std::string::npos && task.size() <= 200
                        ? task
                        : Indented(task);
          } else if (e.kind == "model") {
            for (const auto& b : d["message"].value("content", json::array())) {
              if (b.value("type", "") == "text")
                line += Indented(b.value("text", std::string()));
              if (b.value("type", "") == "tool_use")
                line += Indented(
                    "-> " + b.value("name", std::string()) + " " +
                    b["input"].dump(-1, ' ', false,
                                    nlohmann::json::error_handler_t::replace));
            }
          } else if (e.kind == "tool_finished") {
            line += d.value("id", std::string()) +
                    (d.value("is_error", false) ? " (error)" : "") +
                    Indented(d.value("result", std::string()));
          } else {
            line += d.dump(-1, ' ', false,
                           nlohmann::json::error_handler_t::replace);
          }
          std::cout << harness::TerminalText(line) << "\n";
        }
        return {};
      });
}

int Approve(const RunArgs& a, bool yes) {
  const char* cmd = yes ? "approve" : "deny";
  return RunAsUser(cmd, a.store, cmd, [&](StoreSession& s) -> vfs::Status {
    harness::SessionLog log(s.backend->engine());
    auto what =
        harness::RecordApproval(log, s.caller.user, a.session, a.call, yes);
    if (!what) return std::unexpected(what.error());
    // Say what was answered: the prompt may have been read in a hurry.
    std::cout << (yes ? "approved " : "denied ") << a.call << " of session "
              << a.session << ": " << *what << "\n";  // printable as asked
    return {};
  });
}

void AddBudgetFlags(CLI::App* c, RunArgs* a) {
  c->add_option("--max-steps", a->max_steps, "Model calls (default 50)");
  c->add_option("--max-input-tokens", a->max_input_tokens,
                "Input tokens (default 5,000,000)");
  c->add_option("--max-output-tokens", a->max_output_tokens,
                "Output tokens (default 500,000)");
  c->add_option("--max-seconds", a->max_seconds,
                "Wall-clock seconds over all runs (default 3600)");
  c->add_option("--max-cost", a->max_cost,
                "US dollars, from the config's prices (default 10)");
  c->add_option("--command-timeout", a->command_timeout,
                "Seconds a bash command may run (default 120)");
  c->add_option("--provider", a->provider, "anthropic or openai");
  c->add_option("--model", a->model, "Model name");
  c->add_option("--base-url", a->base_url,
                "API base URL (any OpenAI-compatible server with openai)");
  c->add_option("--approval-timeout", a->approval_timeout,
                "Seconds to wait for agentvfs approve/deny (default 900; then "
                "the call is denied)");
  c->add_flag("--json", a->json_events,
              "Print the session's events as JSON lines at the end");
}

}  // namespace

void AddRunCommands(CLI::App& app, int* exit_code) {
  auto run_args = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand(
      "run",
      "Run an agent on a task: the model outside, bash in the sandbox, "
      "files through the router as your user");
  run->add_option("--workspace", run_args->workspace,
                  "Host directory the agent works in (/workspace)")
      ->required()
      ->check(CLI::ExistingDirectory);
  AddStoreFlags(run, &run_args->store);
  AddBudgetFlags(run, run_args.get());
  run->add_option("task", run_args->task, "What to do")->required();
  run->callback(
      [run_args, exit_code] { *exit_code = Drive(*run_args, false); });

  auto resume_args = std::make_shared<RunArgs>();
  auto* resume = app.add_subcommand(
      "resume", "Continue a session after a crash, a budget stop or a failure");
  resume->add_option("session", resume_args->session, "Session id")->required();
  resume->add_option("--workspace", resume_args->workspace,
                     "Workspace (default: the session's)");
  AddStoreFlags(resume, &resume_args->store);
  AddBudgetFlags(resume, resume_args.get());
  resume->callback(
      [resume_args, exit_code] { *exit_code = Drive(*resume_args, true); });

  auto list_args = std::make_shared<RunArgs>();
  auto* sessions = app.add_subcommand("sessions",
                                      "Your sessions, with state "
                                      "and cost");
  AddStoreFlags(sessions, &list_args->store);
  sessions->callback(
      [list_args, exit_code] { *exit_code = Sessions(*list_args); });

  for (bool yes : {true, false}) {
    auto args = std::make_shared<RunArgs>();
    auto* c = app.add_subcommand(
        yes ? "approve" : "deny",
        yes ? "Let a waiting call of a session run"
            : "Refuse a waiting call of a session (the model is told)");
    c->add_option("session", args->session, "Session id")->required();
    c->add_option("call", args->call, "Call id (shown by run and show)")
        ->required();
    AddStoreFlags(c, &args->store);
    c->callback([args, exit_code, yes] { *exit_code = Approve(*args, yes); });
  }

  auto show_args = std::make_shared<RunArgs>();
  auto* show = app.add_subcommand("show", "A session's transcript");
  show->add_option("session", show_args->session, "Session id")->required();
  show->add_flag("--json", show_args->json_events, "Events as JSON lines");
  AddStoreFlags(show, &show_args->store);
  show->callback([show_args, exit_code] { *exit_code = Show(*show_args); });
}

}  // namespace agentvfs::cli
