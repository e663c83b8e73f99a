// BashTool: Anthropic's bash tool ({"command": "..."}, or {"restart": true})
// run in the session's sandbox, never on the host. Each command is a new
// `bash -c` in the same sandbox, at /workspace: files, /tmp and background
// processes carry over from one command to the next; the shell's own state
// (cd, variables) does not. The result text holds stdout, then stderr, then
// the exit code or the signal, with the sandbox's notes when output was cut
// or the timeout killed the sandbox. is_error is set when the command could
// not run or timed out; a command that ran and failed is a normal result
// with its exit code (the model decides what that means).
//
// Thread safety: as Sandbox (one command at a time per session).
#pragma once

#include <nlohmann/json.hpp>

#include "backends/sandbox/sandbox.h"
#include "harness/file_tools.h"

namespace agentvfs::harness {

class BashTool {
 public:
  // `sandbox` must outlive this object; `limits` apply to every command.
  BashTool(sandbox::Sandbox& sandbox, sandbox::Limits limits);

  // `max_seconds` > 0 shortens the command's timeout to it (what is left
  // of the session's time budget).
  ToolResult Run(const nlohmann::json& input, double max_seconds = 0);

 private:
  sandbox::Sandbox& sandbox_;
  sandbox::Limits limits_;
};

// The text a model gets for a finished command (see BashTool).
std::string DescribeForModel(const sandbox::CommandResult& r);

}  // namespace agentvfs::harness
