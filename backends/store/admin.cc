// Store administration: the default layout, users, teams, grants (admin.h).
#include "backends/store/admin.h"

#include <unistd.h>

#include "backends/store/namespace.h"
#include "vfs/path.h"

namespace agentvfs::store {
namespace {

#define TRY(expr)                                     \
  do {                                                \
    if (auto _st = (expr); !_st) {                    \
      return std::unexpected(std::move(_st).error()); \
    }                                                 \
  } while (0)

// Needs `level` on `path` for `actor`, read inside `txn`.
vfs::Status NeedLevel(Txn& txn, const std::string& actor,
                      const std::string& path, Level level) {
  auto policy = LoadPolicy(txn, actor);
  if (!policy) return std::unexpected(policy.error());
  if (!(*policy)->usable()) return vfs::Fail(EACCES, (*policy)->why_not());
  if ((*policy)->LevelOf(path) < level) {
    return vfs::Fail(EACCES, "user '" + actor + "' needs " +
                                 std::string(LevelName(level)) + " on " + path +
                                 " for this");
  }
  return {};
}

// Refuses a change (made in `txn`, which the caller then rolls back) after
// which no enabled user has admin on / any more: nobody could then add
// users, grant or undo it, short of editing the database.
vfs::Status KeepsAnAdmin(Txn& txn) {
  auto users = txn.Query("SELECT name FROM users WHERE disabled = 0");
  if (!users) return std::unexpected(users.error());
  for (const auto& r : *users) {
    auto policy = LoadPolicy(txn, AsText(r[0]));
    if (!policy) return std::unexpected(policy.error());
    if ((*policy)->usable() && (*policy)->LevelOf("/") == Level::kAdmin) {
      return {};
    }
  }
  return vfs::Fail(EPERM,
                   "this would leave no user with admin on /, and nobody "
                   "could manage the store any more; grant admin on / to "
                   "another user first (`agentvfs grant admin / --to "
                   "user:NAME`); nothing was changed");
}

vfs::Status Exec(Txn& txn, std::string_view sql, const std::vector<Value>& p) {
  auto r = txn.Exec(sql, p);
  if (!r) return std::unexpected(r.error());
  return {};
}

vfs::Status PutGrant(Txn& txn, const std::string& prefix, const Subject& s,
                     Level level) {
  return Exec(txn,
              "INSERT INTO grants(prefix, subject_kind, subject, level) "
              "VALUES(?, ?, ?, ?) ON CONFLICT(prefix, subject_kind, subject) "
              "DO UPDATE SET level = excluded.level",
              {prefix, s.kind, s.name, static_cast<int64_t>(level)});
}

vfs::Status EnsureTeam(Txn& txn, const std::string& team) {
  TRY(ValidateName("team", team));
  auto r = txn.Exec("INSERT INTO teams(name) VALUES(?) ON CONFLICT DO NOTHING",
                    {team});
  if (!r) return std::unexpected(r.error());
  if (*r == 0) return {};
  std::string dir = "/memories/teams/" + team;
  TRY(MakeDirs(txn, dir, NowNs()));
  return PutGrant(txn, dir, Subject{"team", team}, Level::kWrite);
}

vfs::Result<bool> TeamExists(Txn& txn, const std::string& team) {
  auto rows = txn.Query("SELECT 1 FROM teams WHERE name = ?", {team});
  if (!rows) return std::unexpected(rows.error());
  return !rows->empty();
}

vfs::Status UserExists(Txn& txn, const std::string& name) {
  auto rows = txn.Query("SELECT 1 FROM users WHERE name = ?", {name});
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) {
    return vfs::Fail(ENOENT, "no user '" + name +
                                 "'; add it with "
                                 "`agentvfs user add " +
                                 name + "`");
  }
  return {};
}

vfs::Result<std::string> NormalisePrefix(const std::string& prefix) {
  auto p = vfs::Path::Parse(prefix);
  if (!p) {
    return vfs::Fail(EINVAL,
                     "grant prefix '" + prefix +
                         "' is not an absolute path: " + p.error().message);
  }
  const std::string& s = p->str();
  if (s != "/" && !PathHasPrefix(s, "/memories") &&
      !PathHasPrefix(s, "/skills")) {
    return vfs::Fail(EINVAL, "grant prefix '" + prefix +
                                 "' is outside the store; grants apply to "
                                 "/memories/... or /skills/...");
  }
  return s;
}

}  // namespace

vfs::Status MakeDirs(
    Txn& txn, const std::string& path, int64_t now_ns,
    const std::function<vfs::Status(const std::string&)>& may_make) {
  auto root = LoadInode(txn, kRootIno);
  if (!root) return std::unexpected(root.error());
  auto parsed = vfs::Path::Parse(path);
  if (!parsed) return std::unexpected(parsed.error());
  // First the directories that are there, then the missing ones, which are
  // all asked about before the first is made.
  Inode dir = **root;
  std::string at;
  std::vector<std::string_view> missing;
  for (auto comp : parsed->Components()) {
    if (!missing.empty()) {
      missing.push_back(comp);
      continue;
    }
    auto child = LookupName(txn, dir.ino, comp);
    if (!child) return std::unexpected(child.error());
    if (!*child) {
      missing.push_back(comp);
      continue;
    }
    auto node = LoadInode(txn, **child);
    if (!node) return std::unexpected(node.error());
    if (!*node || !(*node)->IsDir()) {
      return vfs::Fail(ENOTDIR, std::string(comp) + " in " + path +
                                    " exists and is not a directory");
    }
    dir = **node;
    at.append("/").append(comp);
  }
  if (may_make) {
    std::string next = at;
    for (auto comp : missing) {
      next.append("/").append(comp);
      if (auto ok = may_make(next); !ok) return ok;
    }
  }
  for (auto comp : missing) {
    auto made = CreateNode(txn, dir, comp, S_IFDIR, 0755, 0, 0, "", now_ns);
    if (!made) return std::unexpected(made.error());
    dir = *made;
  }
  return {};
}

vfs::Result<std::string> InitStore(
    const std::string& name, const std::string& admin,
    const std::function<vfs::Status(const std::string& token)>& hand_over) {
  TRY(ValidateName("user", admin));
  std::string file = name.starts_with("sqlite:") ? name.substr(7) : name;
  bool existed = ::access(file.c_str(), F_OK) == 0;
  auto engine = Engine::Open(name, true);
  if (!engine) return std::unexpected(engine.error());
  auto token = NewToken();
  if (!token) return token;
  auto made = (*engine)->Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    auto users = txn.Query("SELECT COUNT(*) FROM users");
    if (!users) return std::unexpected(users.error());
    if (AsInt((*users)[0][0]) > 0) {
      return vfs::Fail(EEXIST, DisplayName(name) +
                                   " is already set up; add users with "
                                   "`agentvfs user add`");
    }
    int64_t now = NowNs();
    for (const char* dir :
         {"/memories/users", "/memories/teams", "/memories/org", "/skills"}) {
      TRY(MakeDirs(txn, dir, now));
    }
    TRY(Exec(txn,
             "INSERT INTO users(name, token_hash, created_ns) VALUES(?, ?, ?)",
             {admin, HashToken(*token), now}));
    TRY(MakeDirs(txn, "/memories/users/" + admin, now));
    TRY(PutGrant(txn, "/", Subject{"user", admin}, Level::kAdmin));
    TRY(PutGrant(txn, "/memories/org", Subject{"everyone", ""}, Level::kRead));
    TRY(PutGrant(txn, "/skills", Subject{"everyone", ""}, Level::kRead));
    TRY(PutGrant(txn, "/memories/users/" + admin, Subject{"user", admin},
                 Level::kWrite));
    TRY(Exec(txn,
             "INSERT INTO meta(key, value) VALUES('created_ns', ?) "
             "ON CONFLICT(key) DO NOTHING",
             {std::to_string(now)}));
    if (hand_over) {
      if (auto ok = hand_over(*token); !ok) {
        return vfs::Fail(ok.error().code,
                         ok.error().message + "; no store was made");
      }
    }
    return {};
  });
  if (!made) {
    // Leave nothing behind that a second attempt would trip over.
    engine->reset();
    if (!existed && !name.starts_with("postgres")) {
      for (const char* suffix : {"", "-wal", "-shm"}) {
        ::unlink((file + suffix).c_str());
      }
    }
    return std::unexpected(made.error());
  }
  return token;
}

vfs::Result<std::string> AddUser(Engine& e, const std::string& actor,
                                 const std::string& name,
                                 const std::vector<std::string>& teams) {
  TRY(ValidateName("user", name));
  auto token = NewToken();
  if (!token) return token;
  TRY(e.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, "/", Level::kAdmin));
    auto exists = txn.Query("SELECT 1 FROM users WHERE name = ?", {name});
    if (!exists) return std::unexpected(exists.error());
    if (!exists->empty()) {
      return vfs::Fail(EEXIST, "user '" + name +
                                   "' exists; for a new token "
                                   "use `agentvfs user token " +
                                   name + "`");
    }
    int64_t now = NowNs();
    TRY(Exec(txn,
             "INSERT INTO users(name, token_hash, created_ns) VALUES(?, ?, ?)",
             {name, HashToken(*token), now}));
    std::string home = "/memories/users/" + name;
    TRY(MakeDirs(txn, home, now));
    TRY(PutGrant(txn, home, Subject{"user", name}, Level::kWrite));
    for (const auto& team : teams) {
      TRY(EnsureTeam(txn, team));
      TRY(Exec(txn,
               "INSERT INTO members(team, \"user\") VALUES(?, ?) "
               "ON CONFLICT DO NOTHING",
               {team, name}));
    }
    return {};
  }));
  return token;
}

vfs::Result<std::string> RotateToken(Engine& e, const std::string& actor,
                                     const std::string& name) {
  auto token = NewToken();
  if (!token) return token;
  TRY(e.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    if (actor != name) TRY(NeedLevel(txn, actor, "/", Level::kAdmin));
    TRY(UserExists(txn, name));
    return Exec(txn, "UPDATE users SET token_hash = ? WHERE name = ?",
                {HashToken(*token), name});
  }));
  return token;
}

vfs::Status SetUserDisabled(Engine& e, const std::string& actor,
                            const std::string& name, bool disabled) {
  return e.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, "/", Level::kAdmin));
    TRY(UserExists(txn, name));
    if (disabled && name == actor) {
      return vfs::Fail(EINVAL, "an admin cannot disable itself");
    }
    return Exec(txn, "UPDATE users SET disabled = ? WHERE name = ?",
                {int64_t{disabled ? 1 : 0}, name});
  });
}

vfs::Status AddTeam(Engine& e, const std::string& actor,
                    const std::string& team) {
  return e.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, "/", Level::kAdmin));
    TRY(ValidateName("team", team));
    auto there = TeamExists(txn, team);
    if (!there) return std::unexpected(there.error());
    if (*there) return vfs::Fail(EEXIST, "team '" + team + "' exists");
    return EnsureTeam(txn, team);
  });
}

vfs::Status AddMember(Engine& e, const std::string& actor,
                      const std::string& team, const std::string& user) {
  return e.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, "/", Level::kAdmin));
    TRY(UserExists(txn, user));
    TRY(ValidateName("team", team));
    auto there = TeamExists(txn, team);
    if (!there) return std::unexpected(there.error());
    if (!*there) {
      return vfs::Fail(ENOENT, "no team '" + team +
                                   "'; add it with `agentvfs team add " + team +
                                   "`");
    }
    return Exec(txn,
                "INSERT INTO members(team, \"user\") VALUES(?, ?) "
                "ON CONFLICT DO NOTHING",
                {team, user});
  });
}

vfs::Status RemoveMember(Engine& e, const std::string& actor,
                         const std::string& team, const std::string& user) {
  return e.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, "/", Level::kAdmin));
    auto r = txn.Exec("DELETE FROM members WHERE team = ? AND \"user\" = ?",
                      {team, user});
    if (!r) return std::unexpected(r.error());
    if (*r == 0) {
      return vfs::Fail(ENOENT, "'" + user + "' is not in team '" + team + "'");
    }
    return KeepsAnAdmin(txn);  // the team may hold admin on /
  });
}

vfs::Result<std::vector<UserInfo>> ListUsers(Engine& e,
                                             const std::string& actor) {
  std::vector<UserInfo> out;
  TRY(e.Read([&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, "/", Level::kAdmin));
    auto rows = txn.Query("SELECT name, disabled FROM users ORDER BY name");
    if (!rows) return std::unexpected(rows.error());
    for (const auto& r : *rows) {
      UserInfo u{AsText(r[0]), AsInt(r[1]) != 0, {}};
      auto teams = txn.Query(
          "SELECT team FROM members WHERE \"user\" = ? ORDER BY team", {u.name});
      if (!teams) return std::unexpected(teams.error());
      for (const auto& t : *teams) u.teams.push_back(AsText(t[0]));
      out.push_back(std::move(u));
    }
    return {};
  }));
  return out;
}

vfs::Status Grant(Engine& e, const std::string& actor,
                  const std::string& prefix, const Subject& subject,
                  Level level) {
  auto norm = NormalisePrefix(prefix);
  if (!norm) return std::unexpected(norm.error());
  if (level == Level::kNone) return vfs::Fail(EINVAL, "nothing to grant");
  return e.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, *norm, Level::kAdmin));
    if (subject.kind == "user") TRY(UserExists(txn, subject.name));
    if (subject.kind == "team") {
      auto rows =
          txn.Query("SELECT 1 FROM teams WHERE name = ?", {subject.name});
      if (!rows) return std::unexpected(rows.error());
      if (rows->empty()) {
        return vfs::Fail(ENOENT, "no team '" + subject.name +
                                     "'; add it with `agentvfs team add " +
                                     subject.name + "`");
      }
    }
    TRY(PutGrant(txn, *norm, subject, level));
    return KeepsAnAdmin(txn);  // a lower grant on / replaces admin
  });
}

vfs::Status Revoke(Engine& e, const std::string& actor,
                   const std::string& prefix, const Subject& subject) {
  auto norm = NormalisePrefix(prefix);
  if (!norm) return std::unexpected(norm.error());
  return e.Write(Durability::kFull, [&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, *norm, Level::kAdmin));
    auto r = txn.Exec(
        "DELETE FROM grants WHERE prefix = ? AND subject_kind = ? AND "
        "subject = ?",
        {*norm, subject.kind, subject.name});
    if (!r) return std::unexpected(r.error());
    if (*r == 0) {
      return vfs::Fail(ENOENT, "no grant on " + *norm + " to " +
                                   subject.ToString() +
                                   "; `agentvfs grants` lists them");
    }
    return KeepsAnAdmin(txn);
  });
}

vfs::Result<std::vector<GrantInfo>> ListGrants(Engine& e,
                                               const std::string& actor) {
  std::vector<GrantInfo> out;
  TRY(e.Read([&](Txn& txn) -> vfs::Status {
    TRY(NeedLevel(txn, actor, "/", Level::kAdmin));
    auto rows = txn.Query(
        "SELECT prefix, subject_kind, subject, level FROM grants "
        "ORDER BY prefix, subject_kind, subject");
    if (!rows) return std::unexpected(rows.error());
    for (const auto& r : *rows) {
      out.push_back(GrantInfo{AsText(r[0]), Subject{AsText(r[1]), AsText(r[2])},
                              static_cast<Level>(AsInt(r[3]))});
    }
    return {};
  }));
  return out;
}

vfs::Status CompactStore(Engine& e, const std::string& actor) {
  TRY(e.Read([&](Txn& txn) -> vfs::Status {
    return NeedLevel(txn, actor, "/", Level::kAdmin);
  }));
  TRY(e.Compact());
  return e.Write(Durability::kProcess, [](Txn& txn) -> vfs::Status {
    return MarkCompactionPending(txn, false);
  });
}

}  // namespace agentvfs::store
