// `agentvfs run`, `sessions`, `show` and `resume`: the harness from the
// command line (see docs/harness.md).
#pragma once

#include <CLI/CLI.hpp>

namespace agentvfs::cli {

void AddRunCommands(CLI::App& app, int* exit_code);

}  // namespace agentvfs::cli
