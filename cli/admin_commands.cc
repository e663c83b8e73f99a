// `agentvfs init | user | team | grant | revoke | grants` (admin_commands.h).
// Tokens are printed once, on stdout, and never taken from argv.
#include "cli/admin_commands.h"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "backends/store/admin.h"
#include "backends/store/auth.h"
#include "backends/store/migrate.h"
#include "cli/store_access.h"

namespace agentvfs::cli {
namespace {

// The one line that carries a new token. Fails when the line did not reach
// standard output (a full disk, a closed pipe): the token would be lost.
vfs::Status PrintToken(const std::string& user, const std::string& token) {
  std::cout << "token for " << user << " (shown once; keep it): " << token
            << std::endl;
  if (!std::cout.fail()) return {};
  std::cout.clear();
  return vfs::Fail(EIO, "the token for " + user +
                            " could not be written to standard output");
}

// For a token already committed whose line did not reach the user.
vfs::Status TokenLost(const vfs::Error& e, const std::string& user) {
  return vfs::Fail(e.code, e.message +
                               ", so it is lost; make a new one with "
                               "`agentvfs user token " +
                               user + "` (the lost one will stop working)");
}

int RunInit(const StoreFlags& flags, const std::string& admin) {
  auto name = ResolveStoreName(flags);
  if (!name) return Report("init", name.error());
  // The token is printed inside init's transaction: if it cannot be
  // written, no store is made (a store whose only admin has no token could
  // never be used, and init refuses a store that has users).
  auto token = store::InitStore(
      *name, admin, [&](const std::string& t) { return PrintToken(admin, t); });
  if (!token) return Report("init", token.error());
  std::cerr << "Store " << store::DisplayName(*name) << " is ready; " << admin
            << " is its admin. Use the token without putting it on a command "
               "line:\n"
            << "  export AGENTVFS_TOKEN=<the token above>\n"
            << "  export AGENTVFS_STORE="
            << store::ShellQuoted(store::DisplayName(*name)) << "\n"
            << "or keep it in a file only you can read and pass "
               "--token-file FILE.\n";
  if (store::DisplayName(*name) != *name) {
    std::cerr << "(The database password is not repeated here: keep it in "
                 "~/.pgpass or PGPASSWORD, not in the URI.)\n";
  }
  return 0;
}

// `agentvfs migrate --from A --to B`: the whole store into a new one on any
// engine, then a check that both hold the same rows (migrate.h).
int RunMigrate(const std::string& from_name, const std::string& to_name) {
  auto from = store::Engine::Open(from_name, false);
  if (!from) return Report("migrate", from.error());
  auto to = store::Engine::Open(to_name, true);
  if (!to) return Report("migrate", to.error());
  std::cerr << "copying " << (*from)->Describe() << " into "
            << (*to)->Describe()
            << " (stop the mounts of the source first: later writes to it "
               "are not copied)\n";
  auto copied = store::CopyStore(**from, **to);
  if (!copied) return Report("migrate", copied.error());
  auto verified = store::VerifyCopy(**from, **to);
  if (!verified) return Report("migrate", verified.error());
  // As wide as the longest table name (inline_bytes is 12).
  size_t width = 5;
  for (const auto& t : *verified) width = std::max(width, t.table.size());
  std::cout << std::left << std::setw(static_cast<int>(width + 1)) << "TABLE"
            << std::right << std::setw(12) << "ROWS"
            << "  DIGEST\n";
  for (const auto& t : *verified) {
    std::cout << std::left << std::setw(static_cast<int>(width + 1)) << t.table
              << std::right << std::setw(12) << t.rows << "  "
              << t.digest.substr(0, 16) << "\n";
  }
  std::cout << "verified: every table of " << (*to)->Describe()
            << " holds the same rows as " << (*from)->Describe() << "\n";
  return 0;
}

// Pads `text` to `width` columns (ASCII names).
std::string Pad(const std::string& text, size_t width) {
  return text.size() >= width ? text + " "
                              : text + std::string(width - text.size(), ' ');
}

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

void AddUserCommands(CLI::App& app, int* exit_code) {
  auto* user = app.add_subcommand("user", "Add, list, enable or disable users");
  user->require_subcommand(1);

  {
    struct Args {
      StoreFlags store;
      std::string name;
      std::vector<std::string> teams;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = user->add_subcommand(
        "add", "Add a user (prints their token once); needs admin on /");
    cmd->add_option("name", a->name, "User name")->required();
    cmd->add_option("--team", a->teams,
                    "Team the user joins (created if missing); repeatable");
    AddStoreFlags(cmd, &a->store);
    cmd->callback([a, exit_code] {
      *exit_code = RunAsUser(
          "user add", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
            auto token = store::AddUser(s.backend->engine(), s.caller.user,
                                        a->name, a->teams);
            if (!token) return std::unexpected(token.error());
            if (auto ok = PrintToken(a->name, *token); !ok)
              return TokenLost(ok.error(), a->name);
            return {};
          });
    });
  }
  {
    struct Args {
      StoreFlags store;
      std::string name;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = user->add_subcommand(
        "token",
        "Give a user a new token (prints it once); the old one stops working");
    cmd->add_option("name", a->name, "User name")->required();
    AddStoreFlags(cmd, &a->store);
    cmd->callback([a, exit_code] {
      *exit_code = RunAsUser(
          "user token", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
            auto token =
                store::RotateToken(s.backend->engine(), s.caller.user, a->name);
            if (!token) return std::unexpected(token.error());
            if (auto ok = PrintToken(a->name, *token); !ok)
              return TokenLost(ok.error(), a->name);
            return {};
          });
    });
  }
  for (bool disable : {true, false}) {
    struct Args {
      StoreFlags store;
      std::string name;
    };
    auto a = std::make_shared<Args>();
    const std::string verb = disable ? "disable" : "enable";
    auto* cmd = user->add_subcommand(
        verb, disable ? "Disable a user: their token stops working (live "
                        "mounts within seconds)"
                      : "Enable a disabled user again");
    cmd->add_option("name", a->name, "User name")->required();
    AddStoreFlags(cmd, &a->store);
    cmd->callback([a, exit_code, disable, verb] {
      *exit_code = RunAsUser(
          "user " + verb, a->store, "cli", [&](StoreSession& s) -> vfs::Status {
            auto ok = store::SetUserDisabled(s.backend->engine(), s.caller.user,
                                             a->name, disable);
            if (!ok) return ok;
            std::cout << "user " << a->name << " " << verb << "d\n";
            return {};
          });
    });
  }
  {
    auto flags = std::make_shared<StoreFlags>();
    auto* cmd = user->add_subcommand("list", "List users and their teams");
    AddStoreFlags(cmd, flags.get());
    cmd->callback([flags, exit_code] {
      *exit_code = RunAsUser(
          "user list", *flags, "cli", [&](StoreSession& s) -> vfs::Status {
            auto users = store::ListUsers(s.backend->engine(), s.caller.user);
            if (!users) return std::unexpected(users.error());
            size_t width = 4;
            for (const auto& u : *users) width = std::max(width, u.name.size());
            std::cout << Pad("USER", width + 1) << Pad("STATUS", 9)
                      << "TEAMS\n";
            for (const auto& u : *users) {
              std::cout << Pad(u.name, width + 1)
                        << Pad(u.disabled ? "disabled" : "enabled", 9)
                        << (u.teams.empty() ? "-" : Join(u.teams)) << "\n";
            }
            return {};
          });
    });
  }
}

void AddTeamCommands(CLI::App& app, int* exit_code) {
  auto* team = app.add_subcommand("team", "Add teams and manage their members");
  team->require_subcommand(1);
  {
    struct Args {
      StoreFlags store;
      std::string team;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = team->add_subcommand(
        "add",
        "Add a team (and /memories/teams/TEAM, which its members write)");
    cmd->add_option("team", a->team, "Team name")->required();
    AddStoreFlags(cmd, &a->store);
    cmd->callback([a, exit_code] {
      *exit_code = RunAsUser(
          "team add", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
            auto ok =
                store::AddTeam(s.backend->engine(), s.caller.user, a->team);
            if (!ok) return ok;
            std::cout << "team " << a->team << " added\n";
            return {};
          });
    });
  }
  auto* member = team->add_subcommand("member", "Add or remove team members");
  member->require_subcommand(1);
  for (bool add : {true, false}) {
    struct Args {
      StoreFlags store;
      std::string team;
      std::string user;
    };
    auto a = std::make_shared<Args>();
    const std::string verb = add ? "add" : "remove";
    auto* cmd = member->add_subcommand(
        verb, add ? "Add USER to TEAM" : "Remove USER from TEAM");
    cmd->add_option("team", a->team, "Team name")->required();
    cmd->add_option("user", a->user, "User name")->required();
    AddStoreFlags(cmd, &a->store);
    cmd->callback([a, exit_code, add, verb] {
      *exit_code = RunAsUser(
          "team member " + verb, a->store, "cli",
          [&](StoreSession& s) -> vfs::Status {
            auto& e = s.backend->engine();
            auto ok =
                add ? store::AddMember(e, s.caller.user, a->team, a->user)
                    : store::RemoveMember(e, s.caller.user, a->team, a->user);
            if (!ok) return ok;
            std::cout << "user " << a->user
                      << (add ? " added to" : " removed from") << " team "
                      << a->team << "\n";
            return {};
          });
    });
  }
}

void AddGrantCommands(CLI::App& app, int* exit_code) {
  {
    struct Args {
      StoreFlags store;
      std::string level;
      std::string prefix;
      std::string subject;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = app.add_subcommand(
        "grant",
        "Grant read, write or admin on a store path (and everything below it) "
        "to user:NAME, team:NAME or everyone");
    cmd->add_option("level", a->level, "read, write or admin")->required();
    cmd->add_option("prefix", a->prefix,
                    "Store path: /memories/..., /skills/... or /")
        ->required();
    cmd->add_option("--to", a->subject, "user:NAME, team:NAME or everyone")
        ->required();
    AddStoreFlags(cmd, &a->store);
    cmd->callback([a, exit_code] {
      auto level = store::ParseLevel(a->level);
      if (!level) {
        *exit_code = Report("grant", level.error());
        return;
      }
      auto subject = store::ParseSubject(a->subject);
      if (!subject) {
        *exit_code = Report("grant", subject.error());
        return;
      }
      *exit_code = RunAsUser(
          "grant", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
            auto ok = store::Grant(s.backend->engine(), s.caller.user,
                                   a->prefix, *subject, *level);
            if (!ok) return ok;
            auto shown = vfs::Path::Parse(a->prefix);  // as it was stored
            std::cout << "granted " << store::LevelName(*level) << " on "
                      << (shown ? shown->str() : a->prefix) << " to "
                      << subject->ToString() << "\n";
            return {};
          });
    });
  }
  {
    struct Args {
      StoreFlags store;
      std::string prefix;
      std::string subject;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = app.add_subcommand(
        "revoke", "Remove the grant on a store path to a subject");
    cmd->add_option("prefix", a->prefix, "Store path the grant is on")
        ->required();
    cmd->add_option("--from", a->subject, "user:NAME, team:NAME or everyone")
        ->required();
    AddStoreFlags(cmd, &a->store);
    cmd->callback([a, exit_code] {
      auto subject = store::ParseSubject(a->subject);
      if (!subject) {
        *exit_code = Report("revoke", subject.error());
        return;
      }
      *exit_code = RunAsUser(
          "revoke", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
            auto ok = store::Revoke(s.backend->engine(), s.caller.user,
                                    a->prefix, *subject);
            if (!ok) return ok;
            auto shown = vfs::Path::Parse(a->prefix);
            std::cout << "revoked the grant on "
                      << (shown ? shown->str() : a->prefix) << " to "
                      << subject->ToString() << "\n";
            return {};
          });
    });
  }
  {
    auto flags = std::make_shared<StoreFlags>();
    auto* cmd = app.add_subcommand("grants", "List every grant");
    AddStoreFlags(cmd, flags.get());
    cmd->callback([flags, exit_code] {
      *exit_code = RunAsUser(
          "grants", *flags, "cli", [&](StoreSession& s) -> vfs::Status {
            auto grants = store::ListGrants(s.backend->engine(), s.caller.user);
            if (!grants) return std::unexpected(grants.error());
            size_t prefix_width = 6, subject_width = 7;
            for (const auto& g : *grants) {
              prefix_width = std::max(prefix_width, g.prefix.size());
              subject_width =
                  std::max(subject_width, g.subject.ToString().size());
            }
            std::cout << Pad("PREFIX", prefix_width + 1)
                      << Pad("SUBJECT", subject_width + 1) << "LEVEL\n";
            for (const auto& g : *grants) {
              std::cout << Pad(g.prefix, prefix_width + 1)
                        << Pad(g.subject.ToString(), subject_width + 1)
                        << store::LevelName(g.level) << "\n";
            }
            return {};
          });
    });
  }
}

}  // namespace

void AddAdminCommands(CLI::App& app, int* exit_code) {
  {
    struct Args {
      StoreFlags store;
      std::string admin;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = app.add_subcommand(
        "init",
        "Create a store with the default layout and its first user, an admin "
        "(prints their token once)");
    AddStoreFlags(cmd, &a->store, /*with_token=*/false);
    cmd->add_option("--admin", a->admin, "Name of the first user (an admin)")
        ->required();
    cmd->callback([a, exit_code] { *exit_code = RunInit(a->store, a->admin); });
  }
  {
    struct Args {
      std::string from, to;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = app.add_subcommand(
        "migrate",
        "Copy a whole store (files, versions, users, grants, sessions) into a "
        "new store on any engine and verify the copy, e.g. --from team.db "
        "--to postgresql://host/db");
    cmd->add_option("--from", a->from, "The store to copy (file or URI)")
        ->required();
    cmd->add_option("--to", a->to,
                    "The new store: a file path, or a postgresql:// URI of "
                    "an existing, empty database")
        ->required();
    cmd->callback([a, exit_code] { *exit_code = RunMigrate(a->from, a->to); });
  }
  AddUserCommands(app, exit_code);
  AddTeamCommands(app, exit_code);
  AddGrantCommands(app, exit_code);
}

}  // namespace agentvfs::cli
