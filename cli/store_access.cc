// Store name, token and identity resolution for the commands (store_access.h).
#include "cli/store_access.h"

#include <openssl/rand.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "harness/agent.h"

namespace agentvfs::cli {

void AddStoreFlags(CLI::App* cmd, StoreFlags* flags, bool with_token) {
  cmd->add_option("--store", flags->store,
                  "The store: a SQLite file or a postgresql:// URI (default: "
                  "$AGENTVFS_STORE, or "
                  "`store:` in ~/.config/agentvfs/config.yaml)");
  if (with_token) {
    cmd->add_option("--token-file", flags->token_file,
                    "File holding your token (default: $AGENTVFS_TOKEN)");
  }
}

vfs::Result<std::string> ResolveStoreName(const StoreFlags& flags) {
  if (!flags.store.empty()) return flags.store;
  if (const char* env = std::getenv("AGENTVFS_STORE"); env && *env) {
    return std::string(env);
  }
  auto root = LoadConfig();
  if (!root) return std::unexpected(root.error());
  const std::string config = ConfigFilePath();
  try {
    if ((*root)["store"]) {
      auto store = (*root)["store"];
      if (!store.IsScalar() || store.as<std::string>().empty())
        return vfs::Fail(EINVAL, config +
                                     ": `store:` must name the store, e.g. "
                                     "`store: /srv/agentvfs/team.db`");
      std::string name = store.as<std::string>();
      // A relative file name is relative to the config file, wherever the
      // command runs (from the working directory, `init` made a second
      // store in every directory it was run in). A name with a scheme
      // (postgresql:..., sqlite:FILE) keeps it: only sqlite's FILE is a
      // path.
      std::string scheme = name.starts_with("sqlite:") ? "sqlite:" : "";
      std::string file = name.substr(scheme.size());
      const bool other_scheme = scheme.empty() &&
                                name.find(':') != std::string::npos &&
                                name.find(':') < name.find('/');
      if (!other_scheme && !file.empty() && file[0] != '/' &&
          config.find('/') != std::string::npos)
        name = scheme + config.substr(0, config.rfind('/') + 1) + file;
      return name;
    }
  } catch (const std::exception& e) {
    return vfs::Fail(EINVAL, config + ": " + e.what());
  }
  return vfs::Fail(
      EINVAL,
      "no store given: pass --store PATH, set AGENTVFS_STORE, or "
      "put `store: PATH` in " +
          (config.empty() ? std::string("the config file") : config));
}

vfs::Result<YAML::Node> LoadConfig() {
  const std::string config = ConfigFilePath();
  if (config.empty()) return YAML::Node();
  struct stat st {};
  if (::stat(config.c_str(), &st) != 0) {
    // None is fine (messages that mention it name the path used).
    if (errno == ENOENT) return YAML::Node();
    const int err = errno == EACCES || errno == EPERM ? EACCES : EIO;
    return vfs::Fail(err, "the config file " + config +
                              " cannot be read: " + strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    return vfs::Fail(EINVAL, "the config file " + config +
                                 " is not a file; name a YAML file (keys "
                                 "store, provider, model, base_url, api_key, "
                                 "prices, approvals)");
  try {
    return YAML::LoadFile(config);
  } catch (const std::exception& e) {
    return vfs::Fail(EINVAL, config + ": " + e.what());
  }
}

std::string ConfigFilePath() {
  if (const char* env = std::getenv("AGENTVFS_CONFIG"); env && *env) return env;
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.config/agentvfs/config.yaml";
  return "";
}

std::vector<std::string> SecretFiles(const StoreFlags& flags) {
  std::vector<std::string> out;
  if (auto name = ResolveStoreName(flags)) {
    for (auto& path : store::SecretPathsOf(*name)) out.push_back(path);
  }
  if (!flags.token_file.empty()) out.push_back(flags.token_file);
  if (std::string config = ConfigFilePath();
      !config.empty() && std::filesystem::exists(config))
    out.push_back(config);
  return out;
}

vfs::Result<std::string> ResolveToken(const StoreFlags& flags) {
  std::string token;
  const bool from_file = !flags.token_file.empty();
  if (from_file) {
    struct stat st {};
    if (::stat(flags.token_file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return vfs::Fail(EACCES,
                       "cannot read the token file " + flags.token_file +
                           (S_ISDIR(st.st_mode) ? " (a directory)" : "") +
                           "; --token-file wants a file holding the "
                           "token on its first line");
    }
    std::ifstream in(flags.token_file);
    if (!in) {
      return vfs::Fail(EACCES,
                       "cannot read the token file " + flags.token_file);
    }
    std::getline(in, token);
    if ((st.st_mode & 077) != 0) {
      std::cerr << "agentvfs: warning: the token file " << flags.token_file
                << " can be read by others (mode " << std::oct
                << (st.st_mode & 0777) << std::dec
                << "); make it private: chmod 600 " << flags.token_file << "\n";
    }
  } else if (const char* env = std::getenv("AGENTVFS_TOKEN"); env && *env) {
    token = env;
  }
  // Blanks around it (a pasted line) are not part of a token.
  const char* blanks = " \t\r\n";
  token.erase(0, std::min(token.size(), token.find_first_not_of(blanks)));
  token.erase(token.find_last_not_of(blanks) + 1);
  if (token.empty()) {
    if (from_file) {
      return vfs::Fail(EACCES, "the token file " + flags.token_file +
                                   " holds no token on its first line");
    }
    return vfs::Fail(EACCES,
                     "no token: set AGENTVFS_TOKEN or pass --token-file FILE "
                     "(tokens are printed once by `agentvfs init` and "
                     "`agentvfs user add`)");
  }
  return token;
}

std::string NewSessionId(const std::string& prefix) {
  unsigned char bytes[8];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    for (auto& b : bytes) b = static_cast<unsigned char>(std::rand());
  }
  std::ostringstream out;
  out << prefix << "-";
  for (unsigned char b : bytes) {
    static constexpr char kDigits[] = "0123456789abcdef";
    out << kDigits[b >> 4] << kDigits[b & 0xf];
  }
  return out.str();
}

vfs::Result<StoreSession> OpenStoreAsUser(const StoreFlags& flags,
                                          const std::string& session_prefix,
                                          store::StoreOptions options) {
  auto name = ResolveStoreName(flags);
  if (!name) return std::unexpected(name.error());
  auto token = ResolveToken(flags);
  if (!token) return std::unexpected(token.error());
  auto backend = store::StoreBackend::Open(*name, options);
  if (!backend) return std::unexpected(backend.error());
  auto user = store::Authenticate((*backend)->engine(), *token);
  if (!user) return std::unexpected(user.error());
  // A live session ends when its token is replaced, not only when its user
  // is disabled.
  (*backend)->auth().PinToken(*user, store::HashToken(*token));
  // A purge stopped before its compaction finished leaves purged bytes in
  // the store's files: whoever can finish it is told at every command.
  if (auto pending = (*backend)->CompactionPending(); pending && *pending) {
    auto policy = (*backend)->auth().PolicyFor(*user);
    if (policy && (*policy)->LevelOf("/") == store::Level::kAdmin)
      std::cerr << "agentvfs: warning: a purge did not finish erasing (it was "
                   "stopped before its compaction): purged bytes may remain "
                   "in the store's files until you run `agentvfs compact`\n";
  }
  StoreSession s;
  s.backend = std::move(*backend);
  s.caller.user = *user;
  s.caller.session = NewSessionId(session_prefix);
  return s;
}

int RunAsUser(const std::string& cmd, const StoreFlags& flags,
              const std::string& session_prefix,
              const std::function<vfs::Status(StoreSession&)>& fn) {
  auto session = OpenStoreAsUser(flags, session_prefix);
  if (!session) return Report(cmd, session.error());
  if (auto ok = fn(*session); !ok) return Report(cmd, ok.error());
  return 0;
}

vfs::Result<vfs::Path> ParseStorePath(const std::string& text) {
  auto path = vfs::Path::Parse(text);
  if (!path) {
    return vfs::Fail(
        EINVAL, "'" + text + "' is not a store path: " + path.error().message +
                    " (store paths start with /memories or /skills)");
  }
  for (const char* root : {"/memories", "/skills"}) {
    auto top = vfs::Path::Parse(root);
    if (top && path->HasPrefix(*top)) return *path;
  }
  return vfs::Fail(EINVAL, "'" + text +
                               "' is not in the store; store paths start "
                               "with /memories or /skills");
}

int Report(const std::string& cmd, const vfs::Error& error) {
  // Names in a message come from files and the store: an escape sequence
  // in one (a skill's folder, a FIFO's name) must not reach the terminal.
  std::cerr << "agentvfs " << cmd << ": "
            << harness::TerminalText(error.message) << "\n";
  return error.code == EINVAL || error.code == ENOENT ? 2 : 1;
}

std::string ForTerminal(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

}  // namespace agentvfs::cli
