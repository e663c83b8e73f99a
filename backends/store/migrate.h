// Copying a whole store from one engine to another (`agentvfs migrate`), for
// example from a team's SQLite file to a PostgreSQL database when it
// outgrows one host, and checking the copy.
//
// What is copied: files, directories and links (inodes, entries), every
// version and all content, users (token hashes), teams, grants, the
// harness's sessions with their events, and the store's facts (meta). Not
// copied: write leases and the change feed, which only mean something to
// the mounts that are live on the source (stop them before migrating).
//
// The copy reads one snapshot of the source and writes the destination in
// one transaction: either all of it lands or nothing does. The destination
// must be a new, empty store. Verification re-reads both stores and
// compares every copied table: its row count and a digest of its rows (the
// sum of the rows' SHA-256, so that engines that sort text differently
// still agree).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/store/engine.h"

namespace agentvfs::store {

struct TableCopy {
  std::string table;
  int64_t rows = 0;
  std::string digest;  // of the table's rows, whatever their order
};

// Copies `from` into `to` (which must hold no users and no files yet).
// EEXIST when `to` is not empty. Returns what was copied, per table.
vfs::Result<std::vector<TableCopy>> CopyStore(Engine& from, Engine& to);

// Compares every copied table of the two stores; EIO naming the first table
// that differs. Returns the digests per table.
vfs::Result<std::vector<TableCopy>> VerifyCopy(Engine& from, Engine& to);

}  // namespace agentvfs::store
