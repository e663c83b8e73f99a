// Store-to-store copy and verification (see migrate.h). Engine-neutral: it
// uses only the portable SQL of engine.h, so it copies in either direction.
#include "backends/store/migrate.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <memory>

namespace agentvfs::store {
namespace {

struct TableSpec {
  const char* name;
  std::vector<std::string> columns;
  size_t keys;        // the first `keys` columns are the primary key
  size_t page_rows;   // rows read per query
};

// Every table that holds the store's state, in an order that keeps the
// copy readable (parents of references first). Column names are quoted
// where SQL reserves them.
const std::vector<TableSpec>& Tables() {
  static const std::vector<TableSpec> kTables = {
      {"meta", {"key", "value"}, 1, 1000},
      {"users", {"name", "token_hash", "disabled", "created_ns"}, 1, 1000},
      {"teams", {"name"}, 1, 1000},
      {"members", {"team", "\"user\""}, 2, 1000},
      {"grants", {"prefix", "subject_kind", "subject", "level"}, 3, 1000},
      {"inodes",
       {"ino", "kind", "mode", "uid", "gid", "nlink", "size", "blocks",
        "atime_ns", "mtime_ns", "ctime_ns", "version", "content", "target",
        "deleted_ns"},
       1,
       1000},
      {"dentries", {"parent", "name", "ino"}, 2, 1000},
      {"blobs", {"id", "hash", "size", "refs", "data"}, 1, 8},
      {"inline_bytes", {"id", "data"}, 1, 64},  // up to 64 KiB each
      {"contents", {"hash", "size", "chunks", "refs", "inline_id"}, 1, 1000},
      {"chunks", {"content", "seq", "blob"}, 2, 1000},
      {"versions",
       {"ino", "n", "path", "author", "session", "time_ns", "size", "content",
        "mode", "deleted"},
       2,
       1000},
      {"sessions",
       {"id", "\"user\"", "created_ns", "updated_ns", "state", "reason",
        "task", "config", "steps", "input_tokens", "output_tokens",
        "cost_micros", "elapsed_ms"},
       1,
       1000},
      {"events", {"session", "seq", "time_ns", "kind", "data"}, 2, 1000},
  };
  return kTables;
}

std::string Join(const std::vector<std::string>& parts, size_t n,
                 const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// Reads `t` in key order, a page at a time, calling `fn` with each page.
vfs::Status ForEachPage(Txn& txn, const TableSpec& t,
                        const std::function<vfs::Status(std::vector<Row>&)>& fn) {
  std::string cols = Join(t.columns, t.columns.size(), ", ");
  std::string keys = Join(t.columns, t.keys, ", ");
  std::string marks = Join(std::vector<std::string>(t.keys, "?"), t.keys, ", ");
  std::string first = "SELECT " + cols + " FROM " + t.name + " ORDER BY " +
                      keys + " LIMIT " + std::to_string(t.page_rows);
  std::string next = "SELECT " + cols + " FROM " + t.name + " WHERE (" + keys +
                     ") > (" + marks + ") ORDER BY " + keys + " LIMIT " +
                     std::to_string(t.page_rows);
  std::vector<Value> after;
  while (true) {
    auto rows = after.empty() ? txn.Query(first) : txn.Query(next, after);
    if (!rows) return std::unexpected(rows.error());
    if (rows->empty()) return {};
    const Row& last = rows->back();
    after.assign(last.begin(), last.begin() + static_cast<long>(t.keys));
    bool done = rows->size() < t.page_rows;
    if (auto ok = fn(*rows); !ok) return ok;
    if (done) return {};
  }
}

// A digest of a set of rows that does not depend on their order (engines
// may sort text differently): the sum, lane by lane, of each row's SHA-256.
class Digest {
 public:
  void Add(const Row& row) {
    std::string enc;
    for (const Value& v : row) {
      // Tag, length, bytes: TEXT and BLOB hash alike (the engines name the
      // types differently), NULL and 0 do not.
      if (IsNull(v)) {
        enc += "n";
      } else if (const auto* i = std::get_if<int64_t>(&v)) {
        enc += "i" + std::to_string(*i);
      } else {
        const std::string& s = AsText(v);
        enc += "s" + std::to_string(s.size()) + ":" + s;
      }
      enc += '\x1f';
    }
    unsigned char md[32];
    unsigned int n = 0;
    EVP_Digest(enc.data(), enc.size(), md, &n, EVP_sha256(), nullptr);
    for (int lane = 0; lane < 4; ++lane) {
      uint64_t x = 0;
      for (int k = 0; k < 8; ++k) x = (x << 8) | md[lane * 8 + k];
      sum_[lane] += x;
    }
  }
  std::string Hex() const {
    char buf[65];
    std::snprintf(buf, sizeof buf, "%016llx%016llx%016llx%016llx",
                  static_cast<unsigned long long>(sum_[0]),
                  static_cast<unsigned long long>(sum_[1]),
                  static_cast<unsigned long long>(sum_[2]),
                  static_cast<unsigned long long>(sum_[3]));
    return buf;
  }

 private:
  uint64_t sum_[4] = {0, 0, 0, 0};
};

// Rows of every table of one store, digested.
vfs::Result<std::vector<TableCopy>> DigestStore(Engine& e) {
  std::vector<TableCopy> out;
  auto ok = e.Read([&](Txn& txn) -> vfs::Status {
    for (const auto& t : Tables()) {
      TableCopy c;
      c.table = t.name;
      Digest d;
      auto st = ForEachPage(txn, t, [&](std::vector<Row>& rows) -> vfs::Status {
        for (const auto& r : rows) d.Add(r);
        c.rows += static_cast<int64_t>(rows.size());
        return {};
      });
      if (!st) return st;
      c.digest = d.Hex();
      out.push_back(std::move(c));
    }
    return {};
  });
  if (!ok) return std::unexpected(ok.error());
  return out;
}

}  // namespace

vfs::Result<std::vector<TableCopy>> CopyStore(Engine& from, Engine& to) {
  std::vector<TableCopy> copied;
  auto ok = from.Read([&](Txn& src) -> vfs::Status {
    return to.Write(Durability::kFull, [&](Txn& dst) -> vfs::Status {
      // A new store has only its root directory.
      auto users = dst.Query("SELECT COUNT(*) FROM users");
      if (!users) return std::unexpected(users.error());
      auto inodes = dst.Query("SELECT COUNT(*) FROM inodes");
      if (!inodes) return std::unexpected(inodes.error());
      if (AsInt((*users)[0][0]) > 0 || AsInt((*inodes)[0][0]) > 1) {
        return vfs::Fail(EEXIST, to.Describe() +
                                     " already holds a store; migrate into a "
                                     "new, empty one");
      }
      for (const char* t : {"meta", "inodes", "sessions", "events"}) {
        auto d = dst.Exec(std::string("DELETE FROM ") + t);
        if (!d) return std::unexpected(d.error());
      }
      for (const auto& t : Tables()) {
        TableCopy c;
        c.table = t.name;
        size_t ncols = t.columns.size();
        std::string head = "INSERT INTO " + std::string(t.name) + "(" +
                           Join(t.columns, ncols, ", ") + ") VALUES ";
        std::string one =
            "(" + Join(std::vector<std::string>(ncols, "?"), ncols, ", ") + ")";
        auto st = ForEachPage(src, t, [&](std::vector<Row>& rows) -> vfs::Status {
          // Several rows per statement, within every engine's limit on
          // parameters.
          size_t per = std::max<size_t>(1, std::min<size_t>(100, 30000 / ncols));
          for (size_t i = 0; i < rows.size(); i += per) {
            size_t n = std::min(per, rows.size() - i);
            std::string sql = head;
            std::vector<Value> params;
            params.reserve(n * ncols);
            for (size_t k = 0; k < n; ++k) {
              sql += (k ? ", " : "") + one;
              for (auto& v : rows[i + k]) params.push_back(std::move(v));
            }
            auto r = dst.Exec(sql, params);
            if (!r) {
              return vfs::Fail(r.error().code, "copying " + std::string(t.name) +
                                                   ": " + r.error().message);
            }
          }
          c.rows += static_cast<int64_t>(rows.size());
          return {};
        });
        if (!st) return st;
        copied.push_back(std::move(c));
      }
      return to.ResyncKeys(dst);
    });
  });
  if (!ok) return std::unexpected(ok.error());
  return copied;
}

vfs::Result<std::vector<TableCopy>> VerifyCopy(Engine& from, Engine& to) {
  auto a = DigestStore(from);
  if (!a) return a;
  auto b = DigestStore(to);
  if (!b) return b;
  for (size_t i = 0; i < a->size(); ++i) {
    const auto& x = (*a)[i];
    const auto& y = (*b)[i];
    if (x.rows != y.rows || x.digest != y.digest) {
      // The copy is committed, from one snapshot of the source; the check
      // reads the source as it is now.
      return vfs::Fail(
          EIO, "the copy in " + to.Describe() + " (committed) differs from " +
                   from.Describe() + " in table " + x.table + " (" +
                   std::to_string(x.rows) + " rows in the source, " +
                   std::to_string(y.rows) +
                   " in the copy): most likely the source was written while "
                   "it was copied. Stop every mount and command using it, "
                   "delete the copy (its file, or drop its database) and run "
                   "migrate again");
    }
  }
  return a;
}

}  // namespace agentvfs::store
