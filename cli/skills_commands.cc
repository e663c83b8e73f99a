// `agentvfs skills import | skills list | export | import`
// (skills_commands.h).
#include "cli/skills_commands.h"

#include <sys/stat.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>

#include "backends/store/auth.h"
#include "backends/store/skills.h"
#include "backends/store/store.h"
#include "cli/signal_guard.h"
#include "cli/store_access.h"

namespace agentvfs::cli {
namespace {

// The first line of `text` for a terminal (ForTerminal).
std::string FirstLine(std::string_view text) {
  return ForTerminal(text.substr(0, text.find('\n')));
}

void AddSkillsImport(CLI::App* skills, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::string dir;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = skills->add_subcommand(
      "import",
      "Validate skill folders (each with a SKILL.md) and copy them into "
      "/skills/NAME; nothing is imported when any is invalid");
  cmd->add_option("dir", a->dir, "A skill folder, or a folder of skill folders")
      ->required();
  AddStoreFlags(cmd, &a->store);
  cmd->callback([a, exit_code] {
    SignalGuard signals;  // as for export: Ctrl-C stops between pieces
    *exit_code = RunAsUser(
        "skills import", a->store, "cli-skills",
        [&](StoreSession& s) -> vfs::Status {
          auto found = store::FindSkills(a->dir);
          if (!found) return std::unexpected(found.error());
          // Every skill's place must be writable before any is copied, so
          // that a refusal imports nothing.
          auto policy = s.backend->auth().PolicyFor(s.caller.user);
          if (!policy) return std::unexpected(policy.error());
          std::string refused;
          for (const auto& skill : *found) {
            std::string dest =
                std::string(store::kSkillsRoot) + "/" + skill.info.name;
            if ((*policy)->LevelOf(dest) < store::Level::kWrite)
              refused += (refused.empty() ? "" : ", ") + dest;
          }
          if (!refused.empty()) {
            return vfs::Fail(EACCES, "user '" + s.caller.user +
                                         "' may not write " + refused +
                                         "; nothing was imported (ask an "
                                         "admin for a write grant there)");
          }
          auto imported = store::ImportHostSkills(
              *s.backend, s.caller, std::move(*found),
              [&signals] { return signals.signal() != 0; });
          if (!imported) return std::unexpected(imported.error());
          for (const auto& skill : *imported) {
            std::cout << "imported " << skill.name << ": "
                      << FirstLine(skill.description) << "\n";
          }
          return {};
        });
    if (signals.signal() != 0) *exit_code = 128 + signals.signal();
  });
}

void AddSkillsList(CLI::App* skills, int* exit_code) {
  auto flags = std::make_shared<StoreFlags>();
  auto* cmd = skills->add_subcommand(
      "list", "List the skills in /skills you can read, with descriptions");
  AddStoreFlags(cmd, flags.get());
  cmd->callback([flags, exit_code] {
    *exit_code = RunAsUser(
        "skills list", *flags, "cli", [&](StoreSession& s) -> vfs::Status {
          auto root = vfs::Path::Parse(store::kSkillsRoot);
          if (!root) return std::unexpected(root.error());
          auto entries = s.backend->ReadDir(s.caller, *root);
          // /skills hidden from this user: no skill they can read.
          if (!entries && entries.error().code == ENOENT) return {};
          if (!entries) return std::unexpected(entries.error());
          std::sort(
              entries->begin(), entries->end(),
              [](const auto& x, const auto& y) { return x.name < y.name; });
          for (const auto& e : *entries) {
            if (e.type != S_IFDIR) continue;
            auto dir = root->Child(e.name);
            if (!dir) continue;
            auto info = store::ReadSkillInfo(*s.backend, s.caller, *dir);
            if (!info) {
              // A folder without a readable, valid SKILL.md is not a skill;
              // say why, and go on listing the others.
              std::cerr << "agentvfs skills list: skipping "
                        << ForTerminal(info.error().message) << "\n";
              continue;
            }
            std::cout << info->name << ": " << FirstLine(info->description)
                      << "\n";
          }
          return {};
        });
  });
}

void AddExport(CLI::App& app, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::string src;
    std::string host_dir;
    bool merge = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "export",
      "Copy a directory of the store (e.g. /skills) to a new or empty host "
      "directory, keeping file modes, symlinks and mtimes");
  cmd->add_option("store_path", a->src, "Store directory, e.g. /skills")
      ->required();
  cmd->add_option("host_dir", a->host_dir,
                  "Host directory to create (or an empty one)")
      ->required();
  cmd->add_flag("--merge", a->merge,
                "Write into a non-empty host directory (same-named files are "
                "replaced, other entries kept)");
  AddStoreFlags(cmd, &a->store);
  cmd->callback([a, exit_code] {
    auto src = ParseStorePath(a->src);
    if (!src) {
      *exit_code = Report("export", src.error());
      return;
    }
    // Ctrl-C or a TERM stops the copy between pieces, so that a new
    // directory is removed again and no temporary file is left (before
    // any thread starts: the guard's thread must be the one to get them).
    SignalGuard signals;
    *exit_code = RunAsUser(
        "export", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
          store::ExportOptions options;
          options.into_non_empty = a->merge;
          options.stopped = [&signals] { return signals.signal() != 0; };
          // A failed export removes the directory it made, or empties the
          // empty one it found.
          auto ok = store::ExportTree(*s.backend, s.caller, *src, a->host_dir,
                                      options);
          if (!ok && ok.error().code == EINTR)
            return vfs::Fail(EINTR, a->merge
                                        ? "interrupted: what was copied stays; "
                                          "run the export again with --merge "
                                          "to finish"
                                        : "interrupted: nothing of the copy "
                                          "was left in " +
                                              a->host_dir);
          if (!ok) return ok;
          std::cout << "exported " << src->str() << " to " << a->host_dir
                    << "\n";
          return {};
        });
    if (signals.signal() != 0) *exit_code = 128 + signals.signal();
  });
}

void AddImport(CLI::App& app, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::string host_dir;
    std::string dest;
    bool remove_extra = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "import",
      "Copy a host directory into the store (each file becomes a new "
      "version); for skills use `skills import`, which validates them");
  cmd->add_option("host_dir", a->host_dir, "Host directory to copy")
      ->required();
  cmd->add_option(
         "store_path", a->dest,
         "Store directory to create or update, e.g. /memories/org/runbooks")
      ->required();
  cmd->add_flag("--delete", a->remove_extra,
                "Also remove what the store directory holds but the host "
                "directory does not (deleted files stay in their history)");
  AddStoreFlags(cmd, &a->store);
  cmd->callback([a, exit_code] {
    auto dest = ParseStorePath(a->dest);
    if (!dest) {
      *exit_code = Report("import", dest.error());
      return;
    }
    SignalGuard signals;  // as for export
    *exit_code = RunAsUser(
        "import", a->store, "cli-import", [&](StoreSession& s) -> vfs::Status {
          store::ImportOptions options;
          options.remove_extra = a->remove_extra;
          options.stopped = [&signals] { return signals.signal() != 0; };
          auto ok = store::ImportTree(*s.backend, s.caller, a->host_dir, *dest,
                                      options);
          if (!ok && ok.error().code == EINTR)
            return vfs::Fail(EINTR,
                             "interrupted: the files copied before it are in "
                             "the store, the one being copied is as it was; "
                             "run the import again to finish");
          if (!ok) return ok;
          std::cout << "imported " << a->host_dir << " into " << dest->str()
                    << "\n";
          return {};
        });
    if (signals.signal() != 0) *exit_code = 128 + signals.signal();
  });
}

}  // namespace

void AddSkillsCommands(CLI::App& app, int* exit_code) {
  auto* skills = app.add_subcommand("skills", "Import and list skills");
  skills->require_subcommand(1);
  AddSkillsImport(skills, exit_code);
  AddSkillsList(skills, exit_code);
  AddExport(app, exit_code);
  AddImport(app, exit_code);
}

}  // namespace agentvfs::cli
