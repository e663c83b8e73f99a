// Administration of a store: creating it with its default layout, users,
// teams and grants. Every function but InitStore acts as `actor`, who needs
// admin on "/" (the user made by InitStore has it), except that Grant/Revoke
// also accept admin on the prefix being granted.
//
// Default layout (DESIGN.md), made by InitStore, AddUser and AddTeam:
//   /memories/users/<user>/   the user writes; nobody else reads
//   /memories/teams/<team>/   the team's members write
//   /memories/org/            everyone reads; admins write
//   /skills/                  everyone reads; admins (and whoever an admin
//                             grants write on /skills/<skill>) write
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backends/store/auth.h"
#include "backends/store/engine.h"
#include "vfs/error.h"

namespace agentvfs::store {

// Creates a new store at `name` with the default layout and its first user,
// `admin`, who gets admin on "/". Returns that user's token (shown once).
// EEXIST when the store already has users. `hand_over`, when given, gets
// the token inside the creating transaction: when it fails, nothing is
// committed (and a SQLite file this call made is removed), so a token that
// never reached anyone leaves no store behind that nobody could use.
vfs::Result<std::string> InitStore(
    const std::string& name, const std::string& admin,
    const std::function<vfs::Status(const std::string& token)>& hand_over = {});

struct UserInfo {
  std::string name;
  bool disabled = false;
  std::vector<std::string> teams;
};

struct GrantInfo {
  std::string prefix;
  Subject subject;
  Level level = Level::kNone;
};

// Adds a user (and /memories/users/<name>/, which it may write), member of
// `teams` (created if missing). Returns the new user's token.
vfs::Result<std::string> AddUser(Engine& e, const std::string& actor,
                                 const std::string& name,
                                 const std::vector<std::string>& teams);
// A new token for `name`; the old one stops working at once.
vfs::Result<std::string> RotateToken(Engine& e, const std::string& actor,
                                     const std::string& name);
vfs::Status SetUserDisabled(Engine& e, const std::string& actor,
                            const std::string& name, bool disabled);
// Adds a team (and /memories/teams/<team>/, which its members may write).
vfs::Status AddTeam(Engine& e, const std::string& actor,
                    const std::string& team);
vfs::Status AddMember(Engine& e, const std::string& actor,
                      const std::string& team, const std::string& user);
vfs::Status RemoveMember(Engine& e, const std::string& actor,
                         const std::string& team, const std::string& user);
vfs::Result<std::vector<UserInfo>> ListUsers(Engine& e,
                                             const std::string& actor);

// Grants `level` on `prefix` (a normalised store path under /memories or
// /skills, or "/") to `subject`; replaces an earlier grant to that subject
// on that prefix.
vfs::Status Grant(Engine& e, const std::string& actor,
                  const std::string& prefix, const Subject& subject,
                  Level level);
// ENOENT when there was no such grant.
vfs::Status Revoke(Engine& e, const std::string& actor,
                   const std::string& prefix, const Subject& subject);
vfs::Result<std::vector<GrantInfo>> ListGrants(Engine& e,
                                               const std::string& actor);

// Rewrites the store's files so that content erased by a purge is gone
// from them too (Engine::Compact), as every purge does at its end. For a
// purge whose compaction failed (another process kept reading, or the
// PostgreSQL role does not own the tables): the purge is committed, and
// this finishes it. Needs admin on "/".
vfs::Status CompactStore(Engine& e, const std::string& actor);

// Makes every directory of `path` (a store path) that is missing, owned by
// root, mode 0755, inside `txn`. Used by the layout and by restore, which
// passes `may_make`: it is asked about each missing directory (its path)
// before any is made, and its error stops the whole call.
vfs::Status MakeDirs(
    Txn& txn, const std::string& path, int64_t now_ns,
    const std::function<vfs::Status(const std::string&)>& may_make = {});

}  // namespace agentvfs::store
