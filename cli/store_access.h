// How every command finds the store and the caller's identity:
//   store:  --store NAME, else $AGENTVFS_STORE, else `store:` in the config
//           file ($AGENTVFS_CONFIG, else ~/.config/agentvfs/config.yaml).
//           NAME is a SQLite file path (or sqlite:PATH).
//   token:  --token-file FILE, else $AGENTVFS_TOKEN. Never a command-line
//           argument (other users can read argv in /proc).
#pragma once

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/store/store.h"
#include "vfs/caller.h"
#include "vfs/error.h"
#include "vfs/path.h"

namespace agentvfs::cli {

struct StoreFlags {
  std::string store;
  std::string token_file;
};

// Adds --store and --token-file to `cmd`.
void AddStoreFlags(CLI::App* cmd, StoreFlags* flags, bool with_token = true);

// The store's name after flags, environment and config file; EINVAL with
// what to do when none is set.
vfs::Result<std::string> ResolveStoreName(const StoreFlags& flags);

// The config file: $AGENTVFS_CONFIG, else ~/.config/agentvfs/config.yaml
// ("" without HOME). It need not exist.
std::string ConfigFilePath();

// The config file's contents (a null node when there is none). One that is
// not a regular file, cannot be read or is not YAML is EINVAL or EACCES
// naming it. (A relative `store:` in it is relative to the file.)
vfs::Result<YAML::Node> LoadConfig();

// Host files a sandbox must never see: those of the store named by the
// flags (store::SecretPathsOf: a SQLite file with its -wal, -shm, -journal;
// PostgreSQL's password and service files and socket directory), the
// token file, the config file.
std::vector<std::string> SecretFiles(const StoreFlags& flags);

// The token from --token-file or $AGENTVFS_TOKEN (EACCES when neither).
vfs::Result<std::string> ResolveToken(const StoreFlags& flags);

// An opened store and the authenticated user, with a fresh session id.
struct StoreSession {
  std::unique_ptr<store::StoreBackend> backend;
  vfs::Caller caller;
};
vfs::Result<StoreSession> OpenStoreAsUser(const StoreFlags& flags,
                                          const std::string& session_prefix,
                                          store::StoreOptions options = {});

// Runs `fn` with the store opened as the user whose token is given (session
// id SESSION_PREFIX-...), and returns the command's exit code: 0 when `fn`
// succeeds, else Report(cmd, its error).
int RunAsUser(const std::string& cmd, const StoreFlags& flags,
              const std::string& session_prefix,
              const std::function<vfs::Status(StoreSession&)>& fn);

// A path in the store given on the command line: /memories, /skills or
// below (normalised like every path). EINVAL saying so for anything else.
vfs::Result<vfs::Path> ParseStorePath(const std::string& text);

// A random session id: PREFIX-<16 hex digits>.
std::string NewSessionId(const std::string& prefix);

// Prints "agentvfs CMD: message" to stderr and returns the exit code for
// the error (2 for bad input, 1 otherwise).
int Report(const std::string& cmd, const vfs::Error& error);

// `text` for a terminal line: control characters (an escape sequence put in
// a skill's description or a file's name) are shown as '?'.
std::string ForTerminal(std::string_view text);

}  // namespace agentvfs::cli
