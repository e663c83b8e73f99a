// Store administration on the command line: `init` (a new store and its
// first admin), `user ...`, `team ...`, `grant`, `revoke` and `grants`. Each
// command but `init` acts as the user whose token is given, through
// backends/store/admin.h, which checks that user's rights itself.
#pragma once

#include <CLI/CLI.hpp>

namespace agentvfs::cli {

// Adds the administration subcommands to `app`; their callbacks set
// `*exit_code`.
void AddAdminCommands(CLI::App& app, int* exit_code);

}  // namespace agentvfs::cli
