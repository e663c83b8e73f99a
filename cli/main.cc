// The `agentvfs` command line: parses arguments and hands each subcommand to
// the library code that does the work.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>
#include <string_view>

#include "cli/admin_commands.h"
#include "cli/exec_command.h"
#include "cli/history_commands.h"
#include "cli/mount_command.h"
#include "cli/run_commands.h"
#include "cli/skills_commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "agentvfs: one filesystem for LLM agents - /workspace from the sandbox, "
      "/memories and /skills from a shared store"};
  app.require_subcommand(1);
  // Log lines go to standard error, never into a command's output (`run
  // --json`, `cat`); spdlog's default logger writes to standard output.
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  int exit_code = 0;
  agentvfs::cli::AddAdminCommands(app, &exit_code);
  agentvfs::cli::AddMountCommand(app, &exit_code);
  agentvfs::cli::AddHistoryCommands(app, &exit_code);
  agentvfs::cli::AddSkillsCommands(app, &exit_code);
  agentvfs::cli::AddExecCommands(app, &exit_code);
  agentvfs::cli::AddRunCommands(app, &exit_code);
  // A token is never taken on the command line, where `ps` shows it to
  // every user of the machine. Said before parsing: CLI11's "argument was
  // not expected" would echo it.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;  // what follows is a sandboxed command's
    if (arg == "--token" || arg.starts_with("--token=")) {
      std::cerr << "agentvfs: a token is never taken on the command line, "
                   "where other users can read it; put it in $AGENTVFS_TOKEN, "
                   "or in a file only you can read and pass --token-file "
                   "FILE\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error 2, as is usual (CLI11
    // would give each kind its own number: 105 for a rejected value). A
    // usage error quotes the arguments it did not expect: a token pasted
    // among them is hidden.
    std::ostringstream out, err;
    int code = app.exit(e, out, err);
    static const std::regex kToken("avfs_[0-9A-Za-z]+");
    std::cout << std::regex_replace(out.str(), kToken, "avfs_(hidden)");
    std::cerr << std::regex_replace(err.str(), kToken, "avfs_(hidden)");
    return code == 0 ? 0 : 2;
  }
  // Output that could not be written (a full disk, a closed pipe) is a
  // failure, not a quiet success.
  std::cout.flush();
  if ((std::cout.fail() || std::fflush(stdout) != 0 || std::ferror(stdout)) &&
      exit_code == 0) {
    std::cerr << "agentvfs: could not write the output to standard output; "
                 "it is incomplete\n";
    exit_code = 1;
  }
  return exit_code;
}
