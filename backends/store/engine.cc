// Engine selection by the store's name, and the row value accessors.
#include "backends/store/engine.h"

#include "backends/store/postgres_engine.h"
#include "backends/store/sqlite_engine.h"

namespace agentvfs::store {

int64_t AsInt(const Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  return 0;
}

const std::string& AsText(const Value& v) {
  static const std::string kEmpty;
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* b = std::get_if<Bytes>(&v)) return b->data;
  return kEmpty;
}

bool IsNull(const Value& v) {
  return std::holds_alternative<std::monostate>(v);
}

std::string DisplayName(const std::string& name) {
  if (name.starts_with("postgresql://") || name.starts_with("postgres://")) {
    return RedactPostgresUri(name);
  }
  return name;
}

std::string ShellQuoted(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                          "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "0123456789_-./:@%+,") == std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::vector<std::string> SecretPathsOf(const std::string& name) {
  if (name.starts_with("postgresql://") || name.starts_with("postgres://"))
    return PostgresSecretPaths(name);
  std::string db = name.starts_with("sqlite:") ? name.substr(7) : name;
  std::vector<std::string> out;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"})
    out.push_back(db + suffix);
  return out;
}

vfs::Result<std::unique_ptr<Engine>> Engine::Open(const std::string& name,
                                                  bool create) {
  if (name.empty()) {
    return vfs::Fail(EINVAL,
                     "no store named; pass --store PATH or set AGENTVFS_STORE");
  }
  if (name.starts_with("postgresql://") || name.starts_with("postgres://")) {
    return OpenPostgresEngine(name, create);
  }
  std::string path = name;
  if (path.starts_with("sqlite:")) path = path.substr(7);
  // `postgresql:user@host` lacks its `//`; as a file name it made a SQLite
  // store in the working directory.
  if (name.starts_with("postgresql:") || name.starts_with("postgres:")) {
    // (Not echoed: it may hold a password.)
    return vfs::Fail(EINVAL,
                     "the store's name starts with postgres: but is not a "
                     "URI; write postgresql://USER@HOST/DATABASE (or name a "
                     "SQLite file as sqlite:FILE)");
  }
  if (auto colon = path.find("://"); colon != std::string::npos) {
    return vfs::Fail(EINVAL, "unknown store scheme in '" + name +
                                 "'; use a file path (SQLite) or a "
                                 "postgresql:// URI");
  }
  return OpenSqliteEngine(path, create);
}

}  // namespace agentvfs::store
