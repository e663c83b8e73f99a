// Moving trees between host directories and the store on the command line:
// `skills import DIR` (validated Agent Skills folders into /skills),
// `skills list`, `export STORE_PATH HOST_DIR` and `import HOST_DIR
// STORE_PATH`, acting as the user whose token is given, through
// backends/store/skills.h.
#pragma once

#include <CLI/CLI.hpp>

namespace agentvfs::cli {

// Adds `skills`, `export` and `import` to `app`; their callbacks set
// `*exit_code`.
void AddSkillsCommands(CLI::App& app, int* exit_code);

}  // namespace agentvfs::cli
