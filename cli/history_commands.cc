// `agentvfs history | cat | restore | purge` (history_commands.h).
#include "cli/history_commands.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "backends/store/admin.h"
#include "backends/store/skills.h"
#include "backends/store/store.h"
#include "cli/store_access.h"

namespace agentvfs::cli {
namespace {

// UTC time of nanoseconds since the epoch, "2026-11-22 02:03:44" or, for
// JSON, ISO 8601 "2026-11-22T02:03:44Z".
std::string UtcTime(int64_t time_ns, bool iso = false) {
  time_t secs = static_cast<time_t>(time_ns / 1'000'000'000);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[32];
  strftime(buf, sizeof buf, iso ? "%Y-%m-%dT%H:%M:%SZ" : "%Y-%m-%d %H:%M:%S",
           &tm);
  return buf;
}

nlohmann::json VersionJson(const store::VersionInfo& v) {
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o",
                static_cast<unsigned>(v.mode & 07777));
  return nlohmann::json{
      {"version", v.n},
      {"path", v.path},
      {"time", UtcTime(v.time_ns, /*iso=*/true)},
      {"time_ns", v.time_ns},
      {"author", v.author},
      {"session", v.session},
      {"size", v.size},
      {"hash", v.content_hash},
      {"mode", mode},
      {"deleted", v.deleted},
  };
}

// `path` is the one the history was asked for; a version made under
// another name (a temporary file an editor renamed over it, or before a
// move) says where.
void PrintHistoryTable(const std::vector<store::VersionInfo>& versions,
                       const std::string& path) {
  size_t author_width = 6, session_width = 7;
  for (const auto& v : versions) {
    author_width = std::max(author_width, v.author.size());
    session_width = std::max(session_width, v.session.size());
  }
  auto row = [&](const std::string& n, const std::string& time,
                 const std::string& author, const std::string& session,
                 const std::string& size, const std::string& hash,
                 const std::string& note) {
    char line[512];
    std::snprintf(line, sizeof line, "%-8s %-19s  %-*s  %-*s  %10s  %-12s",
                  n.c_str(), time.c_str(), static_cast<int>(author_width),
                  author.c_str(), static_cast<int>(session_width),
                  session.c_str(), size.c_str(), hash.c_str());
    std::string out = line;
    if (!note.empty()) out += "  " + note;
    while (!out.empty() && out.back() == ' ') out.pop_back();
    std::cout << out << "\n";
  };
  row("VERSION", "TIME (UTC)", "AUTHOR", "SESSION", "SIZE", "HASH", "");
  for (const auto& v : versions) {
    std::string note = v.deleted ? "deleted" : "";
    if (v.path != path) {
      note += (note.empty() ? "at " : " at ") + ForTerminal(v.path);
    }
    row(std::to_string(v.n), UtcTime(v.time_ns), v.author, v.session,
        v.deleted ? "-" : std::to_string(v.size), v.content_hash.substr(0, 12),
        note);
  }
}

// `e` with `path` named in its message, for errors that do not name it
// ("no such file or directory").
std::unexpected<vfs::Error> Naming(vfs::Error e, const vfs::Path& path) {
  if (e.message.find(path.str()) == std::string::npos)
    e.message = path.str() + ": " + e.message;
  return std::unexpected(std::move(e));
}

// --version: a version number as `agentvfs history` lists them.
CLI::Validator VersionNumber() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty() ||
            text.find_first_not_of("0123456789") != std::string::npos ||
            text.find_first_not_of('0') == std::string::npos ||
            text.size() > 18)
          return "give a version number as `agentvfs history` "
                 "lists them (1, 2, ...), not '" +
                 text + "'";
        return "";
      },
      "N");
}

vfs::Status WriteStdout(std::string_view piece) {
  if (std::fwrite(piece.data(), 1, piece.size(), stdout) != piece.size()) {
    return vfs::Fail(EIO, "cannot write to standard output");
  }
  return {};
}

void AddHistory(CLI::App& app, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::string path;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "history",
      "List the versions of a file in the store (also of a deleted one)");
  cmd->add_option("path", a->path, "Store path, e.g. /memories/org/oncall.md")
      ->required();
  cmd->add_flag("--json", a->json, "One JSON object per version and line");
  AddStoreFlags(cmd, &a->store);
  cmd->callback([a, exit_code] {
    auto path = ParseStorePath(a->path);
    if (!path) {
      *exit_code = Report("history", path.error());
      return;
    }
    *exit_code = RunAsUser(
        "history", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
          auto versions = s.backend->History(s.caller, *path);
          if (!versions) return Naming(versions.error(), *path);
          if (a->json) {
            for (const auto& v : *versions) {
              // A path need not be UTF-8; JSON must be.
              std::cout << VersionJson(v).dump(
                               -1, ' ', false,
                               nlohmann::json::error_handler_t::replace)
                        << "\n";
            }
          } else {
            PrintHistoryTable(*versions, path->str());
          }
          return {};
        });
  });
}

void AddCat(CLI::App& app, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::string path;
    int64_t version = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "cat", "Print a file of the store, or one of its earlier versions");
  cmd->add_option("path", a->path, "Store path")->required();
  cmd->add_option("--version", a->version,
                  "Version to print (see `agentvfs history`); default: the "
                  "current content")
      ->check(VersionNumber());
  AddStoreFlags(cmd, &a->store);
  cmd->callback([a, exit_code] {
    auto path = ParseStorePath(a->path);
    if (!path) {
      *exit_code = Report("cat", path.error());
      return;
    }
    *exit_code =
        RunAsUser("cat", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
          // The current content through the file's name (a symlink in the
          // store is followed, as cat does), or a version by number.
          auto file = a->version == 0
                          ? s.backend->Open(s.caller, *path, O_RDONLY, 0)
                          : s.backend->OpenVersion(s.caller, *path, a->version);
          if (!file) return Naming(file.error(), *path);
          auto st = (*file)->Stat();
          if (!st) return Naming(st.error(), *path);
          if (S_ISDIR(st->st_mode)) {
            return vfs::Fail(EISDIR, path->str() +
                                         " is a directory; cat prints files "
                                         "(see the folder with `agentvfs "
                                         "export` or through a mount)");
          }
          // "file/" names a directory, as it does for cat(1).
          if (a->path.size() > 1 && a->path.back() == '/')
            return vfs::Fail(ENOTDIR, path->str() +
                                          " is not a directory (drop the "
                                          "trailing /)");
          std::string buf(store::kCopyPieceBytes, '\0');
          for (off_t offset = 0;;) {
            auto got = (*file)->Read(buf.data(), buf.size(), offset);
            if (!got) return Naming(got.error(), *path);
            if (*got == 0) break;
            if (auto ok = WriteStdout(std::string_view(buf.data(), *got)); !ok)
              return ok;
            offset += static_cast<off_t>(*got);
          }
          if (std::fflush(stdout) != 0) {
            return vfs::Fail(EIO, "cannot write to standard output");
          }
          return {};
        });
  });
}

void AddRestore(CLI::App& app, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::string path;
    int64_t version = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "restore",
      "Make an earlier version of a file its current content again (as a new "
      "version; nothing is rewritten)");
  cmd->add_option("path", a->path, "Store path")->required();
  cmd->add_option("--version", a->version,
                  "Version to restore (see `agentvfs history`)")
      ->required()
      ->check(VersionNumber());
  AddStoreFlags(cmd, &a->store);
  cmd->callback([a, exit_code] {
    auto path = ParseStorePath(a->path);
    if (!path) {
      *exit_code = Report("restore", path.error());
      return;
    }
    *exit_code = RunAsUser(
        "restore", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
          auto v = s.backend->Restore(s.caller, *path, a->version);
          if (!v) return Naming(v.error(), *path);
          std::cout << "restored version " << a->version << " of "
                    << path->str() << " as version " << v->n << "\n";
          return {};
        });
  });
}

void AddPurge(CLI::App& app, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::string path;
    bool keep_current = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "purge",
      "Erase a file's versions for good (and the file itself unless "
      "--keep-current); needs admin on the path");
  cmd->add_option("path", a->path, "Store path")->required();
  cmd->add_flag("--keep-current", a->keep_current,
                "Erase only the versions older than the current one");
  AddStoreFlags(cmd, &a->store);
  cmd->callback([a, exit_code] {
    auto path = ParseStorePath(a->path);
    if (!path) {
      *exit_code = Report("purge", path.error());
      return;
    }
    *exit_code = RunAsUser(
        "purge", a->store, "cli", [&](StoreSession& s) -> vfs::Status {
          auto r = s.backend->Purge(s.caller, *path, a->keep_current);
          if (!r) return Naming(r.error(), *path);
          std::cout << "purged " << path->str() << ": " << r->versions
                    << " version(s), " << r->files << " file(s)";
          // Contents are shared across the whole store, so how much of it
          // went tells whether any other file, hidden ones included, holds
          // the same bytes: said only to an admin of everything.
          auto policy = s.backend->auth().PolicyFor(s.caller.user);
          if (policy && (*policy)->LevelOf("/") == store::Level::kAdmin) {
            std::cout << ", " << r->blobs << " stored chunk(s), " << r->bytes
                      << " byte(s) of content";
          } else {
            std::cout << "; content no other version shares is erased";
          }
          std::cout << "\n";
          return {};
        });
  });
}

void AddCompact(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<StoreFlags>();
  auto* cmd = app.add_subcommand(
      "compact",
      "Rewrite the store's files so that purged content is gone from them "
      "too (every purge does this; run it when a purge said its compaction "
      "failed); needs admin on /");
  AddStoreFlags(cmd, flags.get());
  cmd->callback([flags, exit_code] {
    *exit_code = RunAsUser(
        "compact", *flags, "cli", [&](StoreSession& s) -> vfs::Status {
          auto ok = store::CompactStore(s.backend->engine(), s.caller.user);
          if (!ok) return ok;
          std::cout << "compacted " << s.backend->engine().Describe() << "\n";
          return {};
        });
  });
}

}  // namespace

void AddHistoryCommands(CLI::App& app, int* exit_code) {
  AddHistory(app, exit_code);
  AddCat(app, exit_code);
  AddRestore(app, exit_code);
  AddPurge(app, exit_code);
  AddCompact(app, exit_code);
}

}  // namespace agentvfs::cli
