// Auth for the store: users with random bearer tokens (only a SHA-256 of each
// token is stored), teams, and grants of read / write / admin on path
// prefixes to a user, a team or everyone. Deny by default.
//
// Rules (written once here, used by every entry point):
//   - A caller's level on a path is the highest level of every grant whose
//     prefix is the path or one of its ancestors (whole components) and whose
//     subject is the caller, one of the caller's teams, or everyone.
//   - A path is visible when the level is at least read, or when the path is
//     an ancestor directory of a prefix the caller may read (so /memories and
//     /memories/users can be walked to reach /memories/users/dev, and list
//     only what leads somewhere readable). What is not visible does not exist
//     for the caller (ENOENT, never listed); visible but not writable is
//     EACCES for every change.
//   - A disabled or unknown user, or a caller with no user, may do nothing
//     (EACCES with a message saying why).
// Policies are cached per user for a short time (AuthCache), so revoking a
// grant or disabling a user reaches live mounts within that time.
//
// Thread-safety: AuthCache is safe to use from any thread; Policy objects
// are immutable.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backends/store/engine.h"
#include "vfs/error.h"

namespace agentvfs::store {

enum class Level { kNone = 0, kRead = 1, kWrite = 2, kAdmin = 3 };

// "read", "write", "admin" <-> Level; EINVAL for anything else.
vfs::Result<Level> ParseLevel(std::string_view text);
std::string_view LevelName(Level level);

// A grant's subject: "user:NAME", "team:NAME" or "everyone".
struct Subject {
  std::string kind;  // "user", "team" or "everyone"
  std::string name;  // empty for everyone
  std::string ToString() const;
};
vfs::Result<Subject> ParseSubject(std::string_view text);

// Names of users and teams: 1-64 of [a-z0-9._-], starting with a letter or
// digit.
vfs::Status ValidateName(std::string_view what, std::string_view name);

// 32 random bytes from OpenSSL, as 64 hex digits prefixed "avfs_".
vfs::Result<std::string> NewToken();
// Hex SHA-256 of a token (what the store keeps).
std::string HashToken(std::string_view token);
// Hex SHA-256 of any bytes.
std::string Sha256Hex(std::string_view bytes);

// What one user may do, at one moment.
class Policy {
 public:
  Policy(std::string user, bool usable, std::string why_not,
         std::vector<std::pair<std::string, Level>> grants);
  const std::string& user() const { return user_; }
  // False for a disabled or unknown user; then why_not() says which.
  bool usable() const { return usable_; }
  const std::string& why_not() const { return why_not_; }
  Level LevelOf(std::string_view path) const;
  bool Visible(std::string_view path) const;
  // Prefixes this user may write (for the harness's prompt), sorted.
  std::vector<std::string> WritablePrefixes() const;
  // Store paths where what this user may see or do differs in `other`:
  // the prefixes of grants added, removed or changed, and "/" when one of
  // the two is usable and the other not.
  std::vector<std::string> Differences(const Policy& other) const;

 private:
  std::string user_;
  bool usable_;
  std::string why_not_;
  std::vector<std::pair<std::string, Level>> grants_;  // (prefix, level)
};

// True when `prefix` is `path` or an ancestor of it on whole components.
bool PathHasPrefix(std::string_view path, std::string_view prefix);

class AuthCache {
 public:
  AuthCache(Engine& engine, std::chrono::milliseconds ttl)
      : engine_(engine), ttl_(ttl) {}
  // The policy of `user`, at most ttl old. EIO when the store fails.
  vfs::Result<std::shared_ptr<const Policy>> PolicyFor(const std::string& user);
  void Clear();
  // Reloads the policy of every user asked for before, and returns the
  // store paths whose access changed for any of them (Policy::Differences).
  // For a frontend that caches names and attributes: what it cached there
  // may no longer be the user's to see.
  vfs::Result<std::vector<std::string>> Refresh();
  // From now on `user` is usable here only while its token still hashes to
  // `token_hash`: a token replaced by `agentvfs user token` stops a live
  // mount that signed in with the old one, like a disable does.
  void PinToken(const std::string& user, std::string token_hash);

 private:
  struct Entry {
    std::shared_ptr<const Policy> policy;
    std::chrono::steady_clock::time_point loaded;
  };
  // Reads `user`'s policy from the store (`pin`: see PinToken).
  vfs::Result<std::shared_ptr<const Policy>> Load(const std::string& user,
                                                  const std::string& pin);
  Engine& engine_;
  std::chrono::milliseconds ttl_;
  std::mutex mu_;  // guards cache_
  std::map<std::string, Entry, std::less<>> cache_;
  std::map<std::string, std::string, std::less<>> pinned_;  // user -> hash
  // What Refresh() last compared against, per user: a PolicyFor() reload
  // in between must not hide a change from it.
  std::map<std::string, std::shared_ptr<const Policy>, std::less<>> reported_;
};

// Loads a policy straight from the database (no cache). With a
// `token_hash`, a user whose token no longer has that hash is not usable.
vfs::Result<std::shared_ptr<const Policy>> LoadPolicy(
    Txn& txn, const std::string& user, std::string_view token_hash = {});

// The user a token belongs to; EACCES (with what to do) for a wrong token or
// a disabled user.
vfs::Result<std::string> Authenticate(Engine& engine, std::string_view token);

}  // namespace agentvfs::store
