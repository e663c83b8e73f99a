// A file's history on the command line: `history`, `cat [--version N]`,
// `restore --version N` and `purge`, acting as the user whose token is given
// through StoreBackend's history calls (which check that user's rights).
#pragma once

#include <CLI/CLI.hpp>

namespace agentvfs::cli {

// Adds the history subcommands to `app`; their callbacks set `*exit_code`.
void AddHistoryCommands(CLI::App& app, int* exit_code);

}  // namespace agentvfs::cli
