// Anthropic's bash tool on the session's sandbox (see bash_tool.h).
#include "harness/bash_tool.h"

namespace agentvfs::harness {

using nlohmann::json;

BashTool::BashTool(sandbox::Sandbox& sandbox, sandbox::Limits limits)
    : sandbox_(sandbox), limits_(limits) {}

std::string DescribeForModel(const sandbox::CommandResult& r) {
  std::string text = r.out.text;
  if (!r.err.text.empty()) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    if (!text.empty()) text += "stderr:\n";
    text += r.err.text;
  }
  if (!text.empty() && text.back() != '\n') text += '\n';
  if (r.timed_out) {
    text += "[" + r.Describe() +
            "; the next command starts in a fresh sandbox, the workspace "
            "files remain]";
  } else if (r.signal != 0) {
    text += "[" + r.Describe() + "]";
  } else {
    text += "[exit code " + std::to_string(r.exit_code) + "]";
  }
  return text;
}

ToolResult BashTool::Run(const json& input, double max_seconds) {
  if (!input.is_object())
    return {"Error: the bash tool takes {\"command\": \"...\"}", true};
  if (auto restart = input.find("restart");
      restart != input.end() && restart->is_boolean() && restart->get<bool>()) {
    sandbox_.Kill();
    return {
        "The sandbox was restarted: every process in it was stopped; "
        "the workspace files remain.",
        false};
  }
  auto command = input.find("command");
  if (command == input.end() || !command->is_string())
    return {
        "Error: missing string parameter `command` (or send "
        "{\"restart\": true})",
        true};
  if (command->get<std::string>().find_first_not_of(" \t\n") ==
      std::string::npos)
    return {"Error: `command` is empty", true};
  sandbox::Command c;
  c.argv = {"bash", "-c", command->get<std::string>()};
  c.limits = limits_;
  if (max_seconds > 0 &&
      (c.limits->timeout_s <= 0 || c.limits->timeout_s > max_seconds))
    c.limits->timeout_s = max_seconds;
  auto r = sandbox_.Run(c);
  if (!r) return {"Error: " + r.error().message, true};
  return {DescribeForModel(*r), r->timed_out};
}

}  // namespace agentvfs::harness
