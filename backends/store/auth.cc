// Tokens, grants and the per-user policy cache (see auth.h).
#include "backends/store/auth.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

namespace agentvfs::store {
namespace {

std::string Hex(const unsigned char* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 0xf]);
  }
  return out;
}

}  // namespace

vfs::Result<Level> ParseLevel(std::string_view text) {
  if (text == "read") return Level::kRead;
  if (text == "write") return Level::kWrite;
  if (text == "admin") return Level::kAdmin;
  return vfs::Fail(EINVAL, "unknown access level '" + std::string(text) +
                               "'; use read, write or admin");
}

std::string_view LevelName(Level level) {
  switch (level) {
    case Level::kRead:
      return "read";
    case Level::kWrite:
      return "write";
    case Level::kAdmin:
      return "admin";
    default:
      return "none";
  }
}

std::string Subject::ToString() const {
  return kind == "everyone" ? "everyone" : kind + ":" + name;
}

vfs::Result<Subject> ParseSubject(std::string_view text) {
  if (text == "everyone") return Subject{"everyone", ""};
  auto colon = text.find(':');
  if (colon != std::string_view::npos) {
    std::string kind(text.substr(0, colon));
    std::string name(text.substr(colon + 1));
    if (kind == "user" || kind == "team") {
      if (auto ok = ValidateName(kind, name); !ok) {
        return std::unexpected(ok.error());
      }
      return Subject{kind, name};
    }
  }
  return vfs::Fail(EINVAL, "unknown grantee '" + std::string(text) +
                               "'; use user:NAME, team:NAME or everyone");
}

vfs::Status ValidateName(std::string_view what, std::string_view name) {
  bool ok = !name.empty() && name.size() <= 64 &&
            std::isalnum(static_cast<unsigned char>(name[0]));
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                c == '_' || c == '.');
  }
  if (!ok) {
    return vfs::Fail(EINVAL, std::string(what) + " name '" + std::string(name) +
                                 "' is not valid; use 1-64 lowercase letters, "
                                 "digits, '.', '_' or '-', starting with a "
                                 "letter or digit");
  }
  return {};
}

vfs::Result<std::string> NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    return vfs::Fail(EIO, "OpenSSL could not produce random bytes");
  }
  return "avfs_" + Hex(bytes, sizeof bytes);
}

std::string Sha256Hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  return Hex(digest, size);
}

std::string HashToken(std::string_view token) { return Sha256Hex(token); }

bool PathHasPrefix(std::string_view path, std::string_view prefix) {
  if (prefix == "/") return true;
  if (!path.starts_with(prefix)) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '/';
}

Policy::Policy(std::string user, bool usable, std::string why_not,
               std::vector<std::pair<std::string, Level>> grants)
    : user_(std::move(user)),
      usable_(usable),
      why_not_(std::move(why_not)),
      grants_(std::move(grants)) {}

Level Policy::LevelOf(std::string_view path) const {
  if (!usable_) return Level::kNone;
  Level best = Level::kNone;
  for (const auto& [prefix, level] : grants_) {
    if (level > best && PathHasPrefix(path, prefix)) best = level;
  }
  return best;
}

bool Policy::Visible(std::string_view path) const {
  if (!usable_) return false;
  for (const auto& [prefix, level] : grants_) {
    if (level < Level::kRead) continue;
    if (PathHasPrefix(path, prefix) || PathHasPrefix(prefix, path)) {
      return true;
    }
  }
  return false;
}

std::vector<std::string> Policy::Differences(const Policy& other) const {
  if (usable_ != other.usable_) return {"/"};
  std::set<std::pair<std::string, Level>> mine(grants_.begin(), grants_.end());
  std::set<std::pair<std::string, Level>> theirs(other.grants_.begin(),
                                                 other.grants_.end());
  std::set<std::string> out;
  for (const auto& g : mine) {
    if (!theirs.contains(g)) out.insert(g.first);
  }
  for (const auto& g : theirs) {
    if (!mine.contains(g)) out.insert(g.first);
  }
  return std::vector<std::string>(out.begin(), out.end());
}

std::vector<std::string> Policy::WritablePrefixes() const {
  std::vector<std::string> out;
  for (const auto& [prefix, level] : grants_) {
    if (level >= Level::kWrite) out.push_back(prefix);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

vfs::Result<std::shared_ptr<const Policy>> LoadPolicy(
    Txn& txn, const std::string& user, std::string_view token_hash) {
  if (user.empty()) {
    return std::make_shared<const Policy>(
        user, false,
        "no agentvfs user: give a token in AGENTVFS_TOKEN or --token-file",
        std::vector<std::pair<std::string, Level>>{});
  }
  auto users = txn.Query(
      "SELECT disabled, token_hash FROM users WHERE name = ?", {user});
  if (!users) return std::unexpected(users.error());
  if (users->empty()) {
    return std::make_shared<const Policy>(
        user, false, "user '" + user + "' does not exist in this store",
        std::vector<std::pair<std::string, Level>>{});
  }
  if (AsInt((*users)[0][0]) != 0) {
    return std::make_shared<const Policy>(
        user, false, "user '" + user + "' is disabled; ask an admin",
        std::vector<std::pair<std::string, Level>>{});
  }
  if (!token_hash.empty() && AsText((*users)[0][1]) != token_hash) {
    return std::make_shared<const Policy>(
        user, false,
        "the token user '" + user +
            "' signed in with was replaced (agentvfs user token); sign in "
            "again with the new one",
        std::vector<std::pair<std::string, Level>>{});
  }
  auto rows = txn.Query(
      "SELECT prefix, level FROM grants WHERE subject_kind = 'everyone' "
      "OR (subject_kind = 'user' AND subject = ?) "
      "OR (subject_kind = 'team' AND subject IN "
      "    (SELECT team FROM members WHERE \"user\" = ?))",
      {user, user});
  if (!rows) return std::unexpected(rows.error());
  std::vector<std::pair<std::string, Level>> grants;
  for (const auto& r : *rows) {
    grants.emplace_back(AsText(r[0]), static_cast<Level>(AsInt(r[1])));
  }
  return std::make_shared<const Policy>(user, true, "", std::move(grants));
}

vfs::Result<std::shared_ptr<const Policy>> AuthCache::PolicyFor(
    const std::string& user) {
  auto now = std::chrono::steady_clock::now();
  std::string pin;
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(user);
        it != cache_.end() && now - it->second.loaded < ttl_) {
      return it->second.policy;
    }
    if (auto it = pinned_.find(user); it != pinned_.end()) pin = it->second;
  }
  auto policy = Load(user, pin);
  if (!policy) return policy;
  std::lock_guard lock(mu_);
  cache_[user] = Entry{*policy, now};
  reported_.try_emplace(user, *policy);
  return policy;
}

vfs::Result<std::shared_ptr<const Policy>> AuthCache::Load(
    const std::string& user, const std::string& pin) {
  std::shared_ptr<const Policy> policy;
  auto ok = engine_.Read([&](Txn& txn) -> vfs::Status {
    auto p = LoadPolicy(txn, user, pin);
    if (!p) return std::unexpected(p.error());
    policy = std::move(*p);
    return {};
  });
  if (!ok) return std::unexpected(ok.error());
  return policy;
}

vfs::Result<std::vector<std::string>> AuthCache::Refresh() {
  std::map<std::string, std::pair<std::shared_ptr<const Policy>, std::string>>
      before;  // user -> (policy, pinned token hash)
  {
    std::lock_guard lock(mu_);
    for (const auto& [user, policy] : reported_) {
      auto pin = pinned_.find(user);
      before[user] = {policy,
                      pin == pinned_.end() ? std::string() : pin->second};
    }
  }
  std::set<std::string> changed;
  for (const auto& [user, old] : before) {
    auto now = std::chrono::steady_clock::now();
    auto policy = Load(user, old.second);
    if (!policy) return std::unexpected(policy.error());
    for (auto& path : old.first->Differences(**policy))
      changed.insert(std::move(path));
    std::lock_guard lock(mu_);
    cache_[user] = Entry{*policy, now};
    reported_[user] = *policy;
  }
  return std::vector<std::string>(changed.begin(), changed.end());
}

void AuthCache::Clear() {
  std::lock_guard lock(mu_);
  cache_.clear();
}

void AuthCache::PinToken(const std::string& user, std::string token_hash) {
  std::lock_guard lock(mu_);
  pinned_[user] = std::move(token_hash);
  cache_.erase(user);
}

vfs::Result<std::string> Authenticate(Engine& engine, std::string_view token) {
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' ||
                            token.back() == ' ')) {
    token.remove_suffix(1);
  }
  if (token.empty()) {
    return vfs::Fail(EACCES,
                     "no token given; set AGENTVFS_TOKEN or pass --token-file "
                     "(an admin prints tokens with `agentvfs user add`)");
  }
  std::string user;
  bool disabled = false;
  auto ok = engine.Read([&](Txn& txn) -> vfs::Status {
    auto rows =
        txn.Query("SELECT name, disabled FROM users WHERE token_hash = ?",
                  {HashToken(token)});
    if (!rows) return std::unexpected(rows.error());
    if (!rows->empty()) {
      user = AsText((*rows)[0][0]);
      disabled = AsInt((*rows)[0][1]) != 0;
    }
    return {};
  });
  if (!ok) return std::unexpected(ok.error());
  if (user.empty()) {
    return vfs::Fail(EACCES,
                     "the token is not valid for " + engine.Describe() +
                         "; check AGENTVFS_TOKEN / --token-file, or ask an "
                         "admin for a new one (`agentvfs user token NAME`)");
  }
  if (disabled) {
    return vfs::Fail(EACCES, "user '" + user + "' is disabled; ask an admin");
  }
  return user;
}

}  // namespace agentvfs::store
