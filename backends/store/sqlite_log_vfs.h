// A SQLite VFS that writes each transaction's log (WAL) frames to the file
// in one system call instead of two per page.
//
// SQLite writes a WAL frame as two pwrite(2) calls, its 24-byte header and
// then its page: a store commit that changes 20 pages costs 40 calls, each
// taking the file's locks and updating its times. This VFS wraps the
// default one and, for the log file only, gathers a transaction's appended
// frames in memory and hands them to the file in one write:
//
//   - when a commit frame is complete (its header's "database size after
//     commit" field is not zero, as the WAL format defines);
//   - before anything reads, syncs, sizes or truncates the log;
//   - when the gathered bytes would pass kMaxGathered, or a write is not
//     contiguous with them;
//   - and, as a safety net, at every shared-memory barrier of the database
//     file: SQLite passes one between writing a commit's frames and
//     publishing it in the WAL index, so no reader (in this or any other
//     process) can be told of a frame that is not in the file yet. If that
//     flush fails, the process aborts before publishing: the unpublished,
//     unacknowledged commit is then lost and nothing else. With SQLite's
//     write pattern the commit frame's own flush has already written
//     everything, except the tail of a frame split at a sector boundary on
//     file systems without powersafe overwrite.
//
// Writes over bytes already in the log (SQLite rewriting the checksums of a
// transaction's frames) go straight to the file. When the connection gives
// up the WAL write lock, anything still gathered belongs to a transaction
// that rolled back and is dropped: written later, it could overwrite frames
// another writer has committed at the same offsets since.
//
// Everything else (the database file's I/O, locks, shared memory, other
// files) goes to the default VFS unchanged, so the files stay ordinary
// SQLite files that any SQLite reads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace agentvfs::store {

// Name of the VFS (pass to sqlite3_open_v2); registers it on the first call.
// Returns nullptr (use the default VFS) if registration failed.
const char* LogGatheringVfs();

// Process-wide counters, for tests and benchmarks.
struct LogVfsStats {
  uint64_t log_writes_asked = 0;   // writes SQLite made to log files
  uint64_t log_writes_issued = 0;  // writes handed to the default VFS
};
LogVfsStats LogGatheringVfsStats();

// SQLite's unix VFS writes at most 128 KiB - 1 bytes per call (it masks the
// length to 17 bits), so a gathered write stays below that.
constexpr size_t kMaxGathered = (size_t{1} << 17) - 1;

}  // namespace agentvfs::store
