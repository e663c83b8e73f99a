// `agentvfs exec` and `agentvfs shell`: a command, or an interactive shell,
// in the sandbox of a session (see backends/sandbox/sandbox.h).
#pragma once

#include <CLI/CLI.hpp>

namespace agentvfs::cli {

void AddExecCommands(CLI::App& app, int* exit_code);

}  // namespace agentvfs::cli
