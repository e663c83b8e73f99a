// `agentvfs mount`: builds the routed view and serves it over FUSE until
// unmounted or signalled.
#pragma once

#include <CLI/CLI.hpp>

namespace agentvfs::cli {

// Adds the `mount` subcommand to `app`; its callback sets `*exit_code`.
void AddMountCommand(CLI::App& app, int* exit_code);

}  // namespace agentvfs::cli
