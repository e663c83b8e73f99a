// The log-gathering VFS (see sqlite_log_vfs.h).
#include "backends/store/sqlite_log_vfs.h"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "spdlog/spdlog.h"

namespace agentvfs::store {
namespace {

constexpr int kFrameHeaderSize = 24;  // the WAL format's frame header

sqlite3_vfs* g_base = nullptr;  // the default VFS, which does the I/O
sqlite3_vfs g_vfs;
std::atomic<uint64_t> g_asked{0};
std::atomic<uint64_t> g_issued{0};

// Our part of a wrapped file; the default VFS's file follows it.
struct ShimFile {
  sqlite3_file base;  // its pMethods: kDbMethods or kLogMethods
  sqlite3_file* real;
  ShimFile* peer;  // the database's log file, or the log's database file
  bool is_log;
  // Log files only: the gathered bytes (allocated at the first write),
  // which belong at offset `start`; and the end of the log as written
  // through this file since the log last started over.
  std::vector<char>* gathered;
  sqlite3_int64 start;
  sqlite3_int64 end;
  bool commit_frame_next;  // the last write was a commit frame's header
};

constexpr size_t kShimSize = (sizeof(ShimFile) + 15) & ~size_t{15};

ShimFile* Shim(sqlite3_file* f) { return reinterpret_cast<ShimFile*>(f); }
sqlite3_file* Real(sqlite3_file* f) { return Shim(f)->real; }

// Hands the gathered bytes to the file. On failure they are dropped: the
// write that asked for the flush fails, and with it the transaction.
int Flush(ShimFile* s) {
  if (s->gathered == nullptr || s->gathered->empty()) return SQLITE_OK;
  std::vector<char>& g = *s->gathered;
  g_issued.fetch_add(1, std::memory_order_relaxed);
  int rc = s->real->pMethods->xWrite(s->real, g.data(),
                                     static_cast<int>(g.size()), s->start);
  g.clear();
  s->commit_frame_next = false;
  return rc;
}

// Forgets the gathered bytes: frames of a transaction that did not commit.
void Discard(ShimFile* s) {
  if (s->gathered != nullptr) s->gathered->clear();
  s->commit_frame_next = false;
}

int WriteThrough(ShimFile* s, const void* buf, int n, sqlite3_int64 off) {
  if (int rc = Flush(s); rc != SQLITE_OK) return rc;
  g_issued.fetch_add(1, std::memory_order_relaxed);
  return s->real->pMethods->xWrite(s->real, buf, n, off);
}

// --- methods of both kinds (pass-through) ---------------------------------

int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  ShimFile* s = Shim(f);
  if (int rc = Flush(s); rc != SQLITE_OK) return rc;
  if (s->is_log && s->end > size) s->end = size;
  return s->real->pMethods->xTruncate(s->real, size);
}
int Sync(sqlite3_file* f, int flags) {
  if (int rc = Flush(Shim(f)); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xSync(Real(f), flags);
}
int FileSize(sqlite3_file* f, sqlite3_int64* size) {
  if (int rc = Flush(Shim(f)); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xFileSize(Real(f), size);
}
int Read(sqlite3_file* f, void* buf, int n, sqlite3_int64 off) {
  if (int rc = Flush(Shim(f)); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xRead(Real(f), buf, n, off);
}
int Write(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  return Real(f)->pMethods->xWrite(Real(f), buf, n, off);
}
int Lock(sqlite3_file* f, int level) {
  return Real(f)->pMethods->xLock(Real(f), level);
}
int Unlock(sqlite3_file* f, int level) {
  return Real(f)->pMethods->xUnlock(Real(f), level);
}
int CheckReservedLock(sqlite3_file* f, int* out) {
  return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
}
int FileControl(sqlite3_file* f, int op, void* arg) {
  if (int rc = Flush(Shim(f)); rc != SQLITE_OK) return rc;
  return Real(f)->pMethods->xFileControl(Real(f), op, arg);
}
int SectorSize(sqlite3_file* f) {
  return Real(f)->pMethods->xSectorSize(Real(f));
}
int DeviceCharacteristics(sqlite3_file* f) {
  return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
}
int ShmMap(sqlite3_file* f, int page, int size, int extend, void volatile** p) {
  return Real(f)->pMethods->xShmMap(Real(f), page, size, extend, p);
}
int ShmLock(sqlite3_file* f, int offset, int n, int flags) {
  return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
}

// The WAL index's lock slot 0 is the write lock (WAL_WRITE_LOCK in wal.c).
constexpr int kWalWriteLock = 0;

// A connection gives the write lock up when its write transaction ends.
// A commit has reached the file by then (see DbShmBarrier), so whatever is
// still gathered belongs to a transaction that rolled back, and must never
// be written: once the lock is free another writer may put its own frames
// at the same offsets.
int DbShmLock(sqlite3_file* f, int offset, int n, int flags) {
  if (flags == (SQLITE_SHM_UNLOCK | SQLITE_SHM_EXCLUSIVE) &&
      offset <= kWalWriteLock && kWalWriteLock < offset + n &&
      Shim(f)->peer != nullptr) {
    Discard(Shim(f)->peer);
  }
  return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
}
void ShmBarrier(sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); }
int ShmUnmap(sqlite3_file* f, int del) {
  return Real(f)->pMethods->xShmUnmap(Real(f), del);
}
int Fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** p) {
  return Real(f)->pMethods->xFetch(Real(f), off, n, p);
}
int Unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return Real(f)->pMethods->xUnfetch(Real(f), off, p);
}

// Unpairs the file from its peer and closes the default VFS's file.
int CloseShim(ShimFile* s) {
  if (s->peer != nullptr) s->peer->peer = nullptr;
  int rc = s->real->pMethods != nullptr ? s->real->pMethods->xClose(s->real)
                                        : SQLITE_OK;
  s->base.pMethods = nullptr;
  return rc;
}

// --- the database file ----------------------------------------------------

// Between a commit's frames and its publication in the WAL index: the
// frames must be in the log file before any reader can learn of them.
// (With SQLite's write pattern the commit frame's own flush has written
// them already; what can still be gathered here is the tail of a frame
// split at a sector boundary, on file systems without powersafe overwrite.)
void DbShmBarrier(sqlite3_file* f) {
  if (ShimFile* log = Shim(f)->peer; log != nullptr) {
    if (int rc = Flush(log); rc != SQLITE_OK) {
      // Publishing now would point readers at frames that are not in the
      // file. Dying first loses only this unacknowledged commit.
      if (auto l = spdlog::get("store")) {
        l->critical(
            "cannot write the store's log ({}); stopping before "
            "the commit is published",
            sqlite3_errstr(rc));
        l->flush();
      }
      std::abort();
    }
  }
  ShmBarrier(f);
}

int DbClose(sqlite3_file* f) { return CloseShim(Shim(f)); }

// --- the log file ---------------------------------------------------------

int LogWrite(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  ShimFile* s = Shim(f);
  g_asked.fetch_add(1, std::memory_order_relaxed);
  if (off == 0) s->end = 0;  // the log's header: it starts over
  if (off < s->end) {
    // Rewriting frames this transaction wrote (their checksums): straight
    // to the file, so that any error goes to the call that can act on it.
    return WriteThrough(s, buf, n, off);
  }
  if (s->gathered == nullptr) {
    s->gathered = new (std::nothrow) std::vector<char>();
    if (s->gathered == nullptr) return WriteThrough(s, buf, n, off);
  }
  std::vector<char>& g = *s->gathered;
  if (!g.empty() && (off != s->start + static_cast<sqlite3_int64>(g.size()) ||
                     g.size() + static_cast<size_t>(n) > kMaxGathered)) {
    if (int rc = Flush(s); rc != SQLITE_OK) return rc;
  }
  if (g.empty()) s->start = off;
  const char* p = static_cast<const char*>(buf);
  try {
    if (g.capacity() < kMaxGathered) g.reserve(kMaxGathered);
    g.insert(g.end(), p, p + n);
  } catch (const std::bad_alloc&) {
    return WriteThrough(s, buf, n, off);
  }
  s->end = std::max(s->end, off + n);
  if (n == kFrameHeaderSize) {
    // Bytes 4-7 of a frame header: the database size after a commit, zero
    // in the other frames. The frame's page is the next write.
    const auto* h = static_cast<const unsigned char*>(buf);
    s->commit_frame_next = (h[4] | h[5] | h[6] | h[7]) != 0;
    return SQLITE_OK;
  }
  if (s->commit_frame_next) return Flush(s);
  return SQLITE_OK;
}

int LogClose(sqlite3_file* f) {
  ShimFile* s = Shim(f);
  // Not written: a commit has reached the file before its write lock was
  // given up, so anything still gathered was never committed.
  delete s->gathered;
  s->gathered = nullptr;
  return CloseShim(s);
}

constexpr sqlite3_io_methods kDbMethods = {
    3,
    DbClose,
    Read,
    Write,
    Truncate,
    Sync,
    FileSize,
    Lock,
    Unlock,
    CheckReservedLock,
    FileControl,
    SectorSize,
    DeviceCharacteristics,
    ShmMap,
    DbShmLock,
    DbShmBarrier,
    ShmUnmap,
    Fetch,
    Unfetch,
};

constexpr sqlite3_io_methods kLogMethods = {
    3,
    LogClose,
    Read,
    LogWrite,
    Truncate,
    Sync,
    FileSize,
    Lock,
    Unlock,
    CheckReservedLock,
    FileControl,
    SectorSize,
    DeviceCharacteristics,
    ShmMap,
    ShmLock,
    ShmBarrier,
    ShmUnmap,
    Fetch,
    Unfetch,
};

// --- the VFS --------------------------------------------------------------

int Open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags,
         int* out_flags) {
  const bool db = (flags & SQLITE_OPEN_MAIN_DB) != 0;
  const bool log = (flags & SQLITE_OPEN_WAL) != 0;
  if (!db && !log) return g_base->xOpen(g_base, name, f, flags, out_flags);
  ShimFile* s = Shim(f);
  std::memset(s, 0, kShimSize);
  s->real =
      reinterpret_cast<sqlite3_file*>(reinterpret_cast<char*>(f) + kShimSize);
  int rc = g_base->xOpen(g_base, name, s->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    // SQLite closes a file whose pMethods is set even when opening failed.
    if (s->real->pMethods != nullptr) s->real->pMethods->xClose(s->real);
    return rc;
  }
  if (s->real->pMethods->iVersion < 3) {
    // Too old to pass through (no shared memory or mapping methods): use
    // the default VFS's file as it is.
    s->real->pMethods->xClose(s->real);
    return g_base->xOpen(g_base, name, f, flags, out_flags);
  }
  if (log) {
    s->is_log = true;
    // The database file this log belongs to is open already (a pager opens
    // its log after its database), through this VFS.
    sqlite3_file* dbf = sqlite3_database_file_object(name);
    if (dbf != nullptr && dbf->pMethods == &kDbMethods) {
      s->peer = Shim(dbf);
      Shim(dbf)->peer = s;
    }
    s->base.pMethods = &kLogMethods;
  } else {
    s->base.pMethods = &kDbMethods;
  }
  return SQLITE_OK;
}

int Delete(sqlite3_vfs*, const char* name, int sync) {
  return g_base->xDelete(g_base, name, sync);
}
int Access(sqlite3_vfs*, const char* name, int flags, int* out) {
  return g_base->xAccess(g_base, name, flags, out);
}
int FullPathname(sqlite3_vfs*, const char* name, int n, char* out) {
  return g_base->xFullPathname(g_base, name, n, out);
}
void* DlOpen(sqlite3_vfs*, const char* name) {
  return g_base->xDlOpen(g_base, name);
}
void DlError(sqlite3_vfs*, int n, char* msg) {
  g_base->xDlError(g_base, n, msg);
}
void (*DlSym(sqlite3_vfs*, void* h, const char* sym))(void) {
  return g_base->xDlSym(g_base, h, sym);
}
void DlClose(sqlite3_vfs*, void* h) { g_base->xDlClose(g_base, h); }
int Randomness(sqlite3_vfs*, int n, char* out) {
  return g_base->xRandomness(g_base, n, out);
}
int Sleep(sqlite3_vfs*, int us) { return g_base->xSleep(g_base, us); }
int CurrentTime(sqlite3_vfs*, double* t) {
  return g_base->xCurrentTime(g_base, t);
}
int GetLastError(sqlite3_vfs*, int n, char* msg) {
  return g_base->xGetLastError(g_base, n, msg);
}
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* t) {
  return g_base->xCurrentTimeInt64(g_base, t);
}

}  // namespace

const char* LogGatheringVfs() {
  static const char* name = []() -> const char* {
    g_base = sqlite3_vfs_find(nullptr);
    if (g_base == nullptr || g_base->iVersion < 2 ||
        g_base->xCurrentTimeInt64 == nullptr) {
      return nullptr;
    }
    g_vfs = sqlite3_vfs{};
    g_vfs.iVersion = 2;
    g_vfs.szOsFile = static_cast<int>(kShimSize) + g_base->szOsFile;
    g_vfs.mxPathname = g_base->mxPathname;
    g_vfs.zName = "agentvfs-log";
    g_vfs.xOpen = Open;
    g_vfs.xDelete = Delete;
    g_vfs.xAccess = Access;
    g_vfs.xFullPathname = FullPathname;
    g_vfs.xDlOpen = DlOpen;
    g_vfs.xDlError = DlError;
    g_vfs.xDlSym = DlSym;
    g_vfs.xDlClose = DlClose;
    g_vfs.xRandomness = Randomness;
    g_vfs.xSleep = Sleep;
    g_vfs.xCurrentTime = CurrentTime;
    g_vfs.xGetLastError = GetLastError;
    g_vfs.xCurrentTimeInt64 = CurrentTimeInt64;
    if (sqlite3_vfs_register(&g_vfs, 0) != SQLITE_OK) return nullptr;
    return g_vfs.zName;
  }();
  return name;
}

LogVfsStats LogGatheringVfsStats() {
  return {g_asked.load(std::memory_order_relaxed),
          g_issued.load(std::memory_order_relaxed)};
}

}  // namespace agentvfs::store
