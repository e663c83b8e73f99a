// The one conformance suite: POSIX behaviour that programs run by an agent
// (editors, git, tar, compilers) rely on, written once against FsOps and run
// against every way of reaching a filesystem (see factories.h). The Native
// instantiation is plain syscalls on a local directory, so every expectation
// here is checked against the kernel's own behaviour before it is held
// against ours.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/conformance/factories.h"
#include "tests/conformance/fs_ops.h"
#include "tests/support/result_matchers.h"

namespace agentvfs::conformance {
namespace {

constexpr off_t kGiB = off_t{1} << 30;

// Deterministic bytes (all 256 values occur), different per seed.
std::string Pattern(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(size, '\0');
  for (auto& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

Status WriteAll(FsOps& fs, int fd, std::string_view data) {
  while (!data.empty()) {
    auto n = fs.Write(fd, data.data(), data.size());
    if (!n) return std::unexpected(n.error());
    if (*n == 0) return vfs::Fail(EIO, "write returned 0");
    data.remove_prefix(*n);
  }
  return {};
}

Status WriteFile(FsOps& fs, const std::string& path, std::string_view data,
                 int flags = O_WRONLY | O_CREAT | O_TRUNC, mode_t mode = 0644) {
  auto fd = fs.Open(path, flags, mode);
  if (!fd) return std::unexpected(fd.error());
  auto written = WriteAll(fs, *fd, data);
  auto closed = fs.Close(*fd);
  if (!written) return written;
  return closed;
}

Result<std::string> ReadAll(FsOps& fs, int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    auto n = fs.Read(fd, buf, sizeof(buf));
    if (!n) return std::unexpected(n.error());
    if (*n == 0) return out;
    out.append(buf, *n);
  }
}

Result<std::string> ReadFile(FsOps& fs, const std::string& path) {
  auto fd = fs.Open(path, O_RDONLY);
  if (!fd) return std::unexpected(fd.error());
  auto data = ReadAll(fs, *fd);
  auto closed = fs.Close(*fd);
  if (!data) return data;
  if (!closed) return std::unexpected(closed.error());
  return data;
}

Result<std::string> PreadString(FsOps& fs, int fd, size_t size, off_t offset) {
  std::string out(size, '\0');
  auto n = fs.Pread(fd, out.data(), size, offset);
  if (!n) return std::unexpected(n.error());
  out.resize(*n);
  return out;
}

std::multiset<std::string> AsSet(const std::vector<std::string>& names) {
  return {names.begin(), names.end()};
}

// Compares long byte strings without printing megabytes on failure.
::testing::AssertionResult SameBytes(const std::string& actual,
                                     const std::string& expected) {
  if (actual == expected) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < actual.size() && i < expected.size() && actual[i] == expected[i]) {
    ++i;
  }
  return ::testing::AssertionFailure()
         << "contents differ: " << actual.size() << " bytes, expected "
         << expected.size() << "; first difference at offset " << i;
}

class ConformanceTest : public ::testing::TestWithParam<FsOpsFactory> {
 protected:
  void SetUp() override {
    umask(022);  // the umask the expectations below assume
    auto ops = GetParam().make();
    ASSERT_OK(ops);
    fs_ = std::move(*ops);
  }
  // Tear the root down inside the test, so a mount that does not stop
  // cleanly fails the test that used it.
  void TearDown() override { fs_.reset(); }

  FsOps& fs() { return *fs_; }

  // Names in a directory; a failure fails the test and lists a marker name.
  std::multiset<std::string> List(const std::string& path) {
    auto names = fs().ReadDir(path);
    EXPECT_OK(names);
    if (!names) return {"<ReadDir failed>"};
    return AsSet(*names);
  }

 private:
  std::unique_ptr<FsOps> fs_;
};

// --- Reading and writing -------------------------------------------------

TEST_P(ConformanceTest, WrittenBytesReadBackExactly) {
  // Over a megabyte, in chunks that do not line up with pages or FUSE's
  // maximum write size.
  const std::string data = Pattern((1 << 20) + 4099, 1);
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("f", O_WRONLY | O_CREAT, 0644));
  for (size_t off = 0; off < data.size(); off += 65531) {
    std::string_view chunk = std::string_view(data).substr(
        off, std::min<size_t>(65531, data.size() - off));
    ASSERT_OK(WriteAll(fs(), fd, chunk));
  }
  ASSERT_OK(fs().Close(fd));

  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("f"));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, static_cast<off_t>(data.size()));
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "f"));
  EXPECT_TRUE(SameBytes(back, data));
}

TEST_P(ConformanceTest, NewFileIsEmptyRegularFileOwnedByCreator) {
  ASSERT_OK(WriteFile(fs(), "new", ""));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Lstat("new"));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(st.st_gid, getegid());
}

TEST_P(ConformanceTest, CreateModeIsApplied) {
  ASSERT_OK(WriteFile(fs(), "private", "x", O_WRONLY | O_CREAT, 0600));
  ASSERT_OK(WriteFile(fs(), "script", "x", O_WRONLY | O_CREAT, 0755));
  ASSERT_OK_AND_ASSIGN(auto priv, fs().Stat("private"));
  EXPECT_EQ(priv.st_mode & 07777, 0600u);
  ASSERT_OK_AND_ASSIGN(auto script, fs().Stat("script"));
  EXPECT_EQ(script.st_mode & 07777, 0755u);
}

TEST_P(ConformanceTest, ReadAndWriteAdvanceTheFilePosition) {
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("f", O_RDWR | O_CREAT, 0644));
  ASSERT_OK(WriteAll(fs(), fd, "hello "));
  ASSERT_OK(WriteAll(fs(), fd, "world"));
  ASSERT_OK_AND_ASSIGN(off_t pos, fs().Seek(fd, 0, SEEK_CUR));
  EXPECT_EQ(pos, 11);
  ASSERT_OK_AND_ASSIGN(pos, fs().Seek(fd, 6, SEEK_SET));
  EXPECT_EQ(pos, 6);
  char buf[16] = {};
  ASSERT_OK_AND_ASSIGN(size_t n, fs().Read(fd, buf, 3));
  EXPECT_EQ(std::string(buf, n), "wor");
  ASSERT_OK_AND_ASSIGN(n, fs().Read(fd, buf, sizeof(buf)));
  EXPECT_EQ(std::string(buf, n), "ld");
  ASSERT_OK_AND_ASSIGN(n, fs().Read(fd, buf, sizeof(buf)));
  EXPECT_EQ(n, 0u) << "read at end of file must return 0";
  ASSERT_OK_AND_ASSIGN(pos, fs().Seek(fd, -5, SEEK_END));
  EXPECT_EQ(pos, 6);
  ASSERT_OK(WriteAll(fs(), fd, "WORLD!"));
  ASSERT_OK(fs().Close(fd));
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "f"));
  EXPECT_EQ(back, "hello WORLD!");
}

TEST_P(ConformanceTest, WritesAreVisibleAtOnceToOtherDescriptors) {
  // No close, no fsync: another reader (tail -f, a compiler reading what an
  // editor just wrote) sees the bytes and the new size immediately.
  ASSERT_OK_AND_ASSIGN(int writer, fs().Open("f", O_WRONLY | O_CREAT, 0644));
  ASSERT_OK_AND_ASSIGN(int reader, fs().Open("f", O_RDONLY));
  ASSERT_OK(WriteAll(fs(), writer, "first"));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("f"));
  EXPECT_EQ(st.st_size, 5);
  ASSERT_OK_AND_ASSIGN(std::string seen, PreadString(fs(), reader, 100, 0));
  EXPECT_EQ(seen, "first");
  ASSERT_OK(WriteAll(fs(), writer, " second"));
  ASSERT_OK_AND_ASSIGN(st, fs().Fstat(reader));
  EXPECT_EQ(st.st_size, 12);
  ASSERT_OK_AND_ASSIGN(seen, PreadString(fs(), reader, 100, 0));
  EXPECT_EQ(seen, "first second");
  ASSERT_OK(fs().Close(reader));
  ASSERT_OK(fs().Close(writer));
}

TEST_P(ConformanceTest, PwriteAndPreadUseTheirOffsetAndKeepThePosition) {
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("f", O_RDWR | O_CREAT, 0644));
  ASSERT_OK_AND_ASSIGN(size_t n, fs().Pwrite(fd, "tail", 4, 10));
  EXPECT_EQ(n, 4u);
  ASSERT_OK_AND_ASSIGN(auto st, fs().Fstat(fd));
  EXPECT_EQ(st.st_size, 14) << "pwrite past the end extends the file";
  ASSERT_OK_AND_ASSIGN(std::string gap, PreadString(fs(), fd, 10, 0));
  EXPECT_EQ(gap, std::string(10, '\0')) << "the gap reads as zeros";
  ASSERT_OK_AND_ASSIGN(std::string tail, PreadString(fs(), fd, 100, 10));
  EXPECT_EQ(tail, "tail");
  ASSERT_OK_AND_ASSIGN(std::string past, PreadString(fs(), fd, 10, 1000));
  EXPECT_EQ(past, "") << "pread past the end returns 0 bytes";
  // Neither call moved the position: a plain write lands at offset 0.
  ASSERT_OK(WriteAll(fs(), fd, "AB"));
  ASSERT_OK_AND_ASSIGN(n, fs().Pwrite(fd, "mid", 3, 5));
  ASSERT_OK(fs().Close(fd));
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "f"));
  EXPECT_EQ(back, std::string("AB\0\0\0mid\0\0tail", 14));
}

TEST_P(ConformanceTest, OverwriteInTheMiddleKeepsTheRest) {
  const std::string data = Pattern(200000, 2);
  ASSERT_OK(WriteFile(fs(), "f", data));
  const std::string patch = Pattern(70000, 3);
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("f", O_WRONLY));
  ASSERT_OK_AND_ASSIGN(size_t n,
                       fs().Pwrite(fd, patch.data(), patch.size(), 65000));
  EXPECT_EQ(n, patch.size());
  ASSERT_OK(fs().Close(fd));
  std::string expected = data;
  expected.replace(65000, patch.size(), patch);
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "f"));
  EXPECT_TRUE(SameBytes(back, expected));
}

TEST_P(ConformanceTest, WritevAndReadvGatherAndScatter) {
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("f", O_RDWR | O_CREAT, 0644));
  std::string a = "first,", b = Pattern(10000, 4), c = ",last";
  struct iovec out[3] = {
      {a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  ASSERT_OK_AND_ASSIGN(size_t n, fs().Writev(fd, out, 3));
  EXPECT_EQ(n, a.size() + b.size() + c.size());
  ASSERT_OK(fs().Seek(fd, 0, SEEK_SET));
  std::string x(3, '\0'), y(20000, '\0');
  struct iovec in[2] = {{x.data(), x.size()}, {y.data(), y.size()}};
  ASSERT_OK_AND_ASSIGN(n, fs().Readv(fd, in, 2));
  EXPECT_EQ(n, a.size() + b.size() + c.size());
  y.resize(n - x.size());
  EXPECT_EQ(x + y, a + b + c);
  ASSERT_OK(fs().Close(fd));
}

TEST_P(ConformanceTest, AppendAlwaysWritesAtTheEnd) {
  ASSERT_OK(WriteFile(fs(), "log", "abc"));
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("log", O_WRONLY | O_APPEND));
  ASSERT_OK(WriteAll(fs(), fd, "def"));
  ASSERT_OK(fs().Seek(fd, 0, SEEK_SET));
  ASSERT_OK(WriteAll(fs(), fd, "ghi"));  // still at the end
  ASSERT_OK(fs().Close(fd));
  // Another appender after someone else grew the file.
  ASSERT_OK(WriteFile(fs(), "log", "!", O_WRONLY | O_APPEND));
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "log"));
  EXPECT_EQ(back, "abcdefghi!");
}

TEST_P(ConformanceTest, TwoAppendersInterleaveWithoutLoss) {
  ASSERT_OK(WriteFile(fs(), "log", ""));
  constexpr int kRecords = 300;
  constexpr size_t kRecordSize = 32;
  auto record = [](int writer, int seq) {
    char buf[kRecordSize + 1];
    std::snprintf(buf, sizeof(buf), "writer %d record %06d ........\n", writer,
                  seq);
    return std::string(buf, kRecordSize);
  };
  std::atomic<int> failures{0};
  std::mutex errors_mu;
  std::string errors;  // what failed, for the report
  auto fail = [&](const std::string& what) {
    ++failures;
    std::lock_guard lock(errors_mu);
    errors += what + "\n";
  };
  auto append = [&](int writer) {
    auto fd = fs().Open("log", O_WRONLY | O_APPEND);
    if (!fd) return fail("open: " + fd.error().ToString());
    for (int i = 0; i < kRecords; ++i) {
      std::string r = record(writer, i);
      auto n = fs().Write(*fd, r.data(), r.size());
      if (!n)
        fail("write: " + n.error().ToString());
      else if (*n != r.size())
        fail("short write");
    }
    if (auto closed = fs().Close(*fd); !closed)
      fail("close: " + closed.error().ToString());
  };
  std::thread t1(append, 1), t2(append, 2);
  t1.join();
  t2.join();
  ASSERT_EQ(failures.load(), 0) << errors;

  ASSERT_OK_AND_ASSIGN(std::string log, ReadFile(fs(), "log"));
  ASSERT_EQ(log.size(), 2 * kRecords * kRecordSize)
      << "an append overwrote another instead of following it";
  std::map<int, int> next{{1, 0}, {2, 0}};
  for (size_t off = 0; off < log.size(); off += kRecordSize) {
    std::string r = log.substr(off, kRecordSize);
    int writer = r[7] - '0';
    ASSERT_TRUE(next.contains(writer)) << "torn record at " << off << ": " << r;
    ASSERT_EQ(r, record(writer, next[writer])) << "at offset " << off;
    ++next[writer];
  }
  EXPECT_EQ(next[1], kRecords);
  EXPECT_EQ(next[2], kRecords);
}

TEST_P(ConformanceTest, ExclusiveCreateFailsOnAnExistingName) {
  ASSERT_OK(WriteFile(fs(), "f", "original", O_WRONLY | O_CREAT | O_EXCL));
  EXPECT_ERRNO(fs().Open("f", O_WRONLY | O_CREAT | O_EXCL, 0644), EEXIST);
  EXPECT_ERRNO(fs().Open("f", O_WRONLY | O_CREAT | O_EXCL | O_TRUNC, 0644),
               EEXIST);
  ASSERT_OK(fs().Mkdir("d"));
  EXPECT_ERRNO(fs().Open("d", O_WRONLY | O_CREAT | O_EXCL, 0644), EEXIST);
  // Even a dangling symlink occupies the name (lock files depend on this).
  ASSERT_OK(fs().Symlink("nowhere", "dangling"));
  EXPECT_ERRNO(fs().Open("dangling", O_WRONLY | O_CREAT | O_EXCL, 0644),
               EEXIST);
  EXPECT_ERRNO(fs().Lstat("nowhere"), ENOENT);
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "f"));
  EXPECT_EQ(back, "original");
}

TEST_P(ConformanceTest, OpenWithTruncEmptiesTheFile) {
  ASSERT_OK(WriteFile(fs(), "f", "0123456789"));
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("f", O_WRONLY | O_TRUNC));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Fstat(fd));
  EXPECT_EQ(st.st_size, 0);
  ASSERT_OK(WriteAll(fs(), fd, "ab"));
  ASSERT_OK(fs().Close(fd));
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "f"));
  EXPECT_EQ(back, "ab");
  // O_CREAT without O_TRUNC opens an existing file as it is.
  ASSERT_OK(WriteFile(fs(), "f", "X", O_WRONLY | O_CREAT));
  ASSERT_OK_AND_ASSIGN(back, ReadFile(fs(), "f"));
  EXPECT_EQ(back, "Xb");
  // O_CREAT|O_TRUNC on an existing file truncates it too.
  ASSERT_OK(WriteFile(fs(), "f", "", O_WRONLY | O_CREAT | O_TRUNC));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("f"));
  EXPECT_EQ(st.st_size, 0);
}

TEST_P(ConformanceTest, TruncateShrinksAndGrowsWithZeros) {
  ASSERT_OK(WriteFile(fs(), "f", "hello world"));
  ASSERT_OK(fs().Truncate("f", 5));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("f"));
  EXPECT_EQ(st.st_size, 5);
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "f"));
  EXPECT_EQ(back, "hello");
  ASSERT_OK(fs().Truncate("f", 100));
  ASSERT_OK_AND_ASSIGN(back, ReadFile(fs(), "f"));
  EXPECT_EQ(back, "hello" + std::string(95, '\0'));
  ASSERT_OK(fs().Truncate("f", 0));
  ASSERT_OK_AND_ASSIGN(back, ReadFile(fs(), "f"));
  EXPECT_EQ(back, "");
  EXPECT_ERRNO(fs().Truncate("missing", 0), ENOENT);
  ASSERT_OK(fs().Mkdir("d"));
  EXPECT_ERRNO(fs().Truncate("d", 0), EISDIR);
}

TEST_P(ConformanceTest, FtruncateChangesAnOpenFile) {
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("f", O_RDWR | O_CREAT, 0644));
  const std::string data = Pattern(100, 5);
  ASSERT_OK(WriteAll(fs(), fd, data));
  ASSERT_OK(fs().Ftruncate(fd, 10));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Fstat(fd));
  EXPECT_EQ(st.st_size, 10);
  ASSERT_OK_AND_ASSIGN(std::string head, PreadString(fs(), fd, 100, 0));
  EXPECT_EQ(head, data.substr(0, 10));
  ASSERT_OK(fs().Ftruncate(fd, 50));
  ASSERT_OK_AND_ASSIGN(std::string grown, PreadString(fs(), fd, 100, 0));
  EXPECT_EQ(grown, data.substr(0, 10) + std::string(40, '\0'));
  ASSERT_OK(fs().Close(fd));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("f"));
  EXPECT_EQ(st.st_size, 50);
  ASSERT_OK_AND_ASSIGN(int ro, fs().Open("f", O_RDONLY));
  EXPECT_ERRNO(fs().Ftruncate(ro, 0), EINVAL);  // POSIX: not open for writing
  ASSERT_OK(fs().Close(ro));
}

TEST_P(ConformanceTest, FsyncSucceedsAndDataIsVisibleToOtherOpens) {
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("f", O_WRONLY | O_CREAT, 0644));
  ASSERT_OK(WriteAll(fs(), fd, "durable"));
  ASSERT_OK(fs().Fsync(fd));
  ASSERT_OK_AND_ASSIGN(std::string seen, ReadFile(fs(), "f"));
  EXPECT_EQ(seen, "durable");
  ASSERT_OK(fs().Close(fd));
  ASSERT_OK_AND_ASSIGN(int ro, fs().Open("f", O_RDONLY));
  EXPECT_OK(fs().Fsync(ro));
  ASSERT_OK(fs().Close(ro));
}

TEST_P(ConformanceTest, LargeSparseFile) {
  const off_t offset = 5 * kGiB;
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("sparse", O_RDWR | O_CREAT, 0644));
  ASSERT_OK_AND_ASSIGN(size_t n,
                       fs().Pwrite(fd, "end of a big file", 17, offset));
  EXPECT_EQ(n, 17u);
  ASSERT_OK(fs().Close(fd));

  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("sparse"));
  EXPECT_EQ(st.st_size, offset + 17);
  EXPECT_LT(st.st_blocks * 512, 1 << 20) << "the hole must not take space";
  ASSERT_OK_AND_ASSIGN(fd, fs().Open("sparse", O_RDONLY));
  ASSERT_OK_AND_ASSIGN(std::string tail, PreadString(fs(), fd, 100, offset));
  EXPECT_EQ(tail, "end of a big file");
  ASSERT_OK_AND_ASSIGN(std::string hole, PreadString(fs(), fd, 4096, 4 * kGiB));
  EXPECT_EQ(hole, std::string(4096, '\0'));
  ASSERT_OK(fs().Close(fd));
}

TEST_P(ConformanceTest, SharedMappingWritesReachTheFile) {
  if (!fs().SupportsMmap()) GTEST_SKIP() << "no mmap through this interface";
  const size_t size = 3 * 4096;
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("mapped", O_RDWR | O_CREAT, 0644));
  ASSERT_OK(fs().Ftruncate(fd, size));
  ASSERT_OK_AND_ASSIGN(
      void* p, fs().Mmap(fd, size, PROT_READ | PROT_WRITE, MAP_SHARED, 0));
  const std::string data = Pattern(size, 6);
  std::memcpy(p, data.data(), size);
  ASSERT_EQ(msync(p, size, MS_SYNC), 0) << std::strerror(errno);
  // Visible to read(2) through another descriptor while still mapped...
  ASSERT_OK_AND_ASSIGN(std::string seen, ReadFile(fs(), "mapped"));
  EXPECT_TRUE(SameBytes(seen, data));
  ASSERT_EQ(munmap(p, size), 0);
  ASSERT_OK(fs().Close(fd));
  // ...and after unmapping and closing.
  ASSERT_OK_AND_ASSIGN(seen, ReadFile(fs(), "mapped"));
  EXPECT_TRUE(SameBytes(seen, data));
}

// --- Names ---------------------------------------------------------------

TEST_P(ConformanceTest, RenameMovesAFile) {
  ASSERT_OK(WriteFile(fs(), "a", "content"));
  ASSERT_OK_AND_ASSIGN(auto before, fs().Stat("a"));
  ASSERT_OK(fs().Rename("a", "b"));
  EXPECT_ERRNO(fs().Stat("a"), ENOENT);
  ASSERT_OK_AND_ASSIGN(auto after, fs().Stat("b"));
  EXPECT_EQ(after.st_ino, before.st_ino) << "rename keeps the file's identity";
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "b"));
  EXPECT_EQ(back, "content");
  ASSERT_OK(fs().Mkdir("d"));
  ASSERT_OK(fs().Rename("b", "d/c"));
  ASSERT_OK_AND_ASSIGN(back, ReadFile(fs(), "d/c"));
  EXPECT_EQ(back, "content");
  EXPECT_EQ(List(""), std::multiset<std::string>{"d"});
  ASSERT_OK(fs().Rename("d/c", "d/c"));  // onto itself: nothing happens
  ASSERT_OK_AND_ASSIGN(back, ReadFile(fs(), "d/c"));
  EXPECT_EQ(back, "content");
  EXPECT_ERRNO(fs().Rename("missing", "x"), ENOENT);
  EXPECT_ERRNO(fs().Rename("d/c", "nodir/c"), ENOENT);
}

TEST_P(ConformanceTest, RenameMovesADirectoryWithItsContents) {
  ASSERT_OK(fs().Mkdir("src"));
  ASSERT_OK(fs().Mkdir("src/sub"));
  ASSERT_OK(WriteFile(fs(), "src/sub/f", "deep"));
  ASSERT_OK(fs().Mkdir("dst"));
  ASSERT_OK(fs().Rename("src", "dst/moved"));
  EXPECT_ERRNO(fs().Stat("src"), ENOENT);
  EXPECT_ERRNO(fs().Stat("src/sub/f"), ENOENT);
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "dst/moved/sub/f"));
  EXPECT_EQ(back, "deep");
  EXPECT_EQ(List("dst/moved"), std::multiset<std::string>{"sub"});
}

TEST_P(ConformanceTest, RenameReplacesAnExistingFile) {
  ASSERT_OK(WriteFile(fs(), "new", "new content"));
  ASSERT_OK(WriteFile(fs(), "old", "old content that is longer"));
  ASSERT_OK_AND_ASSIGN(int reader, fs().Open("old", O_RDONLY));
  ASSERT_OK(fs().Rename("new", "old"));  // how editors save atomically
  // A reader that opened the old file keeps reading the old file.
  ASSERT_OK_AND_ASSIGN(std::string was, ReadAll(fs(), reader));
  EXPECT_EQ(was, "old content that is longer");
  ASSERT_OK(fs().Close(reader));
  EXPECT_ERRNO(fs().Stat("new"), ENOENT);
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "old"));
  EXPECT_EQ(back, "new content");
  EXPECT_EQ(List(""), std::multiset<std::string>{"old"});
}

TEST_P(ConformanceTest, RenameKeepsOpenDescriptorsWorking) {
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("before", O_RDWR | O_CREAT, 0644));
  ASSERT_OK(WriteAll(fs(), fd, "one "));
  ASSERT_OK(fs().Rename("before", "after"));
  ASSERT_OK(WriteAll(fs(), fd, "two"));
  ASSERT_OK(fs().Close(fd));
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), "after"));
  EXPECT_EQ(back, "one two");
  EXPECT_ERRNO(fs().Stat("before"), ENOENT);
}

TEST_P(ConformanceTest, RenameDirectoryOverDirectory) {
  ASSERT_OK(fs().Mkdir("a"));
  ASSERT_OK(WriteFile(fs(), "a/f", "from a"));
  ASSERT_OK(fs().Mkdir("empty"));
  ASSERT_OK(fs().Mkdir("full"));
  ASSERT_OK(WriteFile(fs(), "full/g", "from full"));

  EXPECT_ERRNO(fs().Rename("a", "full"), ENOTEMPTY);
  ASSERT_OK_AND_ASSIGN(std::string g, ReadFile(fs(), "full/g"));
  EXPECT_EQ(g, "from full");
  ASSERT_OK_AND_ASSIGN(std::string f, ReadFile(fs(), "a/f"));
  EXPECT_EQ(f, "from a");

  ASSERT_OK(fs().Rename("a", "empty"));
  EXPECT_ERRNO(fs().Stat("a"), ENOENT);
  ASSERT_OK_AND_ASSIGN(f, ReadFile(fs(), "empty/f"));
  EXPECT_EQ(f, "from a");
}

TEST_P(ConformanceTest, RenameBetweenFileAndDirectoryIsRefused) {
  ASSERT_OK(WriteFile(fs(), "file", "x"));
  ASSERT_OK(fs().Mkdir("dir"));
  EXPECT_ERRNO(fs().Rename("file", "dir"), EISDIR);
  EXPECT_ERRNO(fs().Rename("dir", "file"), ENOTDIR);
  ASSERT_OK(fs().Mkdir("dir/sub"));
  EXPECT_ERRNO(fs().Rename("dir", "dir/sub/inside"), EINVAL)
      << "a directory cannot move into itself";
  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("dir/sub"));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST_P(ConformanceTest, RenameNoReplaceRefusesAnExistingTarget) {
  ASSERT_OK(WriteFile(fs(), "a", "A"));
  ASSERT_OK(WriteFile(fs(), "b", "B"));
  EXPECT_ERRNO(fs().Rename("a", "b", RENAME_NOREPLACE), EEXIST);
  ASSERT_OK_AND_ASSIGN(std::string a, ReadFile(fs(), "a"));
  ASSERT_OK_AND_ASSIGN(std::string b, ReadFile(fs(), "b"));
  EXPECT_EQ(a, "A");
  EXPECT_EQ(b, "B");
  ASSERT_OK(fs().Rename("a", "c", RENAME_NOREPLACE));
  EXPECT_ERRNO(fs().Stat("a"), ENOENT);
  ASSERT_OK_AND_ASSIGN(std::string c, ReadFile(fs(), "c"));
  EXPECT_EQ(c, "A");
}

TEST_P(ConformanceTest, RenameExchangeSwapsTwoNames) {
  ASSERT_OK(WriteFile(fs(), "file", "I was a file"));
  ASSERT_OK(fs().Mkdir("dir"));
  ASSERT_OK(WriteFile(fs(), "dir/inner", "inside"));
  ASSERT_OK(fs().Rename("file", "dir", RENAME_EXCHANGE));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("file"));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_OK_AND_ASSIGN(std::string inner, ReadFile(fs(), "file/inner"));
  EXPECT_EQ(inner, "inside");
  ASSERT_OK_AND_ASSIGN(std::string was, ReadFile(fs(), "dir"));
  EXPECT_EQ(was, "I was a file");

  ASSERT_OK(WriteFile(fs(), "x", "X"));
  ASSERT_OK(WriteFile(fs(), "y", "Y"));
  ASSERT_OK(fs().Rename("x", "y", RENAME_EXCHANGE));
  ASSERT_OK_AND_ASSIGN(std::string x, ReadFile(fs(), "x"));
  ASSERT_OK_AND_ASSIGN(std::string y, ReadFile(fs(), "y"));
  EXPECT_EQ(x, "Y");
  EXPECT_EQ(y, "X");
  EXPECT_ERRNO(fs().Rename("x", "missing", RENAME_EXCHANGE), ENOENT);
  EXPECT_ERRNO(fs().Rename("x", "y", RENAME_EXCHANGE | RENAME_NOREPLACE),
               EINVAL);
}

TEST_P(ConformanceTest, HardLinksShareOneFile) {
  ASSERT_OK(WriteFile(fs(), "a", "shared"));
  ASSERT_OK(fs().Link("a", "b"));
  ASSERT_OK_AND_ASSIGN(auto sa, fs().Stat("a"));
  ASSERT_OK_AND_ASSIGN(auto sb, fs().Stat("b"));
  EXPECT_EQ(sa.st_ino, sb.st_ino);
  EXPECT_EQ(sa.st_nlink, 2u);
  EXPECT_EQ(sb.st_nlink, 2u);
  ASSERT_OK(fs().Mkdir("d"));
  ASSERT_OK(fs().Link("b", "d/c"));
  ASSERT_OK_AND_ASSIGN(sa, fs().Stat("a"));
  EXPECT_EQ(sa.st_nlink, 3u);

  // A write through one name is seen through the others.
  ASSERT_OK(WriteFile(fs(), "b", "changed", O_WRONLY | O_TRUNC));
  ASSERT_OK_AND_ASSIGN(std::string via_a, ReadFile(fs(), "a"));
  EXPECT_EQ(via_a, "changed");

  ASSERT_OK(fs().Unlink("a"));
  ASSERT_OK_AND_ASSIGN(sb, fs().Stat("b"));
  EXPECT_EQ(sb.st_nlink, 2u);
  ASSERT_OK(fs().Unlink("d/c"));
  ASSERT_OK_AND_ASSIGN(sb, fs().Stat("b"));
  EXPECT_EQ(sb.st_nlink, 1u);
  ASSERT_OK_AND_ASSIGN(std::string via_b, ReadFile(fs(), "b"));
  EXPECT_EQ(via_b, "changed");
}

TEST_P(ConformanceTest, LinkErrors) {
  ASSERT_OK(WriteFile(fs(), "a", "x"));
  ASSERT_OK(WriteFile(fs(), "b", "y"));
  ASSERT_OK(fs().Mkdir("d"));
  EXPECT_ERRNO(fs().Link("a", "b"), EEXIST);
  EXPECT_ERRNO(fs().Link("d", "d2"), EPERM);
  EXPECT_ERRNO(fs().Link("missing", "c"), ENOENT);
  EXPECT_ERRNO(fs().Link("a", "nodir/c"), ENOENT);
  ASSERT_OK_AND_ASSIGN(std::string b, ReadFile(fs(), "b"));
  EXPECT_EQ(b, "y");
}

TEST_P(ConformanceTest, UnlinkRemovesTheName) {
  ASSERT_OK(WriteFile(fs(), "f", "x"));
  ASSERT_OK(fs().Unlink("f"));
  EXPECT_ERRNO(fs().Stat("f"), ENOENT);
  EXPECT_ERRNO(fs().Open("f", O_RDONLY), ENOENT);
  EXPECT_TRUE(List("").empty());
  EXPECT_ERRNO(fs().Unlink("f"), ENOENT);
  ASSERT_OK(fs().Mkdir("d"));
  EXPECT_ERRNO(fs().Unlink("d"), EISDIR);
  // Unlinking a symlink removes the link, not its target.
  ASSERT_OK(WriteFile(fs(), "target", "kept"));
  ASSERT_OK(fs().Symlink("target", "link"));
  ASSERT_OK(fs().Unlink("link"));
  ASSERT_OK_AND_ASSIGN(std::string kept, ReadFile(fs(), "target"));
  EXPECT_EQ(kept, "kept");
}

TEST_P(ConformanceTest, UnlinkedOpenFileStaysUsable) {
  ASSERT_OK(WriteFile(fs(), "tmp", "still here"));
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("tmp", O_RDWR));
  ASSERT_OK(fs().Unlink("tmp"));
  EXPECT_ERRNO(fs().Stat("tmp"), ENOENT);
  ASSERT_OK_AND_ASSIGN(std::string before, PreadString(fs(), fd, 100, 0));
  EXPECT_EQ(before, "still here");
  ASSERT_OK_AND_ASSIGN(size_t n, fs().Pwrite(fd, "!", 1, 10));
  EXPECT_EQ(n, 1u);
  ASSERT_OK_AND_ASSIGN(std::string after, PreadString(fs(), fd, 100, 0));
  EXPECT_EQ(after, "still here!");
  // fstat(2) of a file with no name left: on a mount the kernel asks for
  // the attributes without the handle.
  ASSERT_OK_AND_ASSIGN(auto st, fs().Fstat(fd));
  EXPECT_EQ(st.st_size, 11);
  EXPECT_EQ(st.st_nlink, 0u);
  ASSERT_OK(fs().Close(fd));
  EXPECT_TRUE(List("").empty());
}

TEST_P(ConformanceTest, AFileRenamedOverStaysUsableThroughItsHandle) {
  ASSERT_OK(WriteFile(fs(), "log", "old log"));
  ASSERT_OK_AND_ASSIGN(int fd, fs().Open("log", O_RDONLY));
  ASSERT_OK(WriteFile(fs(), "log.new", "new log!"));
  ASSERT_OK(fs().Rename("log.new", "log"));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Fstat(fd));
  EXPECT_EQ(st.st_size, 7);
  ASSERT_OK_AND_ASSIGN(std::string old_bytes, PreadString(fs(), fd, 100, 0));
  EXPECT_EQ(old_bytes, "old log");
  ASSERT_OK(fs().Close(fd));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("log"));
  EXPECT_EQ(st.st_size, 8);
}

TEST_P(ConformanceTest, MkdirCreatesAnEmptyDirectory) {
  ASSERT_OK(fs().Mkdir("d", 0755));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("d"));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_TRUE(List("d").empty());
  ASSERT_OK(fs().Mkdir("d/private", 0700));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("d/private"));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_ERRNO(fs().Mkdir("d"), EEXIST);
  ASSERT_OK(WriteFile(fs(), "f", ""));
  EXPECT_ERRNO(fs().Mkdir("f"), EEXIST);
  EXPECT_ERRNO(fs().Mkdir("missing/d"), ENOENT);
  EXPECT_ERRNO(fs().Mkdir("f/d"), ENOTDIR);
}

TEST_P(ConformanceTest, RmdirRemovesOnlyEmptyDirectories) {
  ASSERT_OK(fs().Mkdir("d"));
  ASSERT_OK(WriteFile(fs(), "d/f", "x"));
  EXPECT_ERRNO(fs().Rmdir("d"), ENOTEMPTY);
  ASSERT_OK_AND_ASSIGN(std::string still, ReadFile(fs(), "d/f"));
  EXPECT_EQ(still, "x");
  EXPECT_ERRNO(fs().Rmdir("d/f"), ENOTDIR);
  EXPECT_ERRNO(fs().Rmdir("missing"), ENOENT);
  ASSERT_OK(fs().Unlink("d/f"));
  ASSERT_OK(fs().Rmdir("d"));
  EXPECT_ERRNO(fs().Stat("d"), ENOENT);
  EXPECT_TRUE(List("").empty());
}

TEST_P(ConformanceTest, SymlinkStoresItsTargetVerbatim) {
  const std::vector<std::string> targets = {
      "plain", "../up/and/over", "/absolute/elsewhere", "dir/", "./a//b"};
  for (size_t i = 0; i < targets.size(); ++i) {
    std::string link = "link" + std::to_string(i);
    ASSERT_OK(fs().Symlink(targets[i], link));
    ASSERT_OK_AND_ASSIGN(std::string back, fs().Readlink(link));
    EXPECT_EQ(back, targets[i]);
    ASSERT_OK_AND_ASSIGN(auto st, fs().Lstat(link));
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    EXPECT_EQ(st.st_size, static_cast<off_t>(targets[i].size()));
  }
  EXPECT_ERRNO(fs().Symlink("x", "link0"), EEXIST);
  ASSERT_OK(WriteFile(fs(), "file", "x"));
  EXPECT_ERRNO(fs().Symlink("x", "file"), EEXIST);
  EXPECT_ERRNO(fs().Readlink("file"), EINVAL);
  EXPECT_ERRNO(fs().Readlink("missing"), ENOENT);
  EXPECT_ERRNO(fs().Symlink("x", "missing/link"), ENOENT);
}

TEST_P(ConformanceTest, StatFollowsSymlinksAndLstatDoesNot) {
  ASSERT_OK(fs().Mkdir("d"));
  ASSERT_OK(WriteFile(fs(), "d/file", "twelve bytes"));
  ASSERT_OK(fs().Symlink("d/file", "to_file"));
  ASSERT_OK(fs().Symlink("d", "to_dir"));
  ASSERT_OK(fs().Symlink("../d/file", "d/up_and_back"));
  ASSERT_OK(fs().Symlink("to_file", "chain"));
  ASSERT_OK(fs().Symlink("nothing", "dangling"));

  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("to_file"));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 12);
  ASSERT_OK_AND_ASSIGN(auto target, fs().Stat("d/file"));
  EXPECT_EQ(st.st_ino, target.st_ino);
  ASSERT_OK_AND_ASSIGN(auto lst, fs().Lstat("to_file"));
  EXPECT_TRUE(S_ISLNK(lst.st_mode));
  EXPECT_NE(lst.st_ino, target.st_ino);

  ASSERT_OK_AND_ASSIGN(st, fs().Stat("to_dir"));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("d/up_and_back"));
  EXPECT_EQ(st.st_ino, target.st_ino);
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("chain"));
  EXPECT_EQ(st.st_ino, target.st_ino);

  EXPECT_ERRNO(fs().Stat("dangling"), ENOENT);
  ASSERT_OK_AND_ASSIGN(lst, fs().Lstat("dangling"));
  EXPECT_TRUE(S_ISLNK(lst.st_mode));

  // open(2) follows the link; writing through it changes the target.
  ASSERT_OK_AND_ASSIGN(std::string via_link, ReadFile(fs(), "chain"));
  EXPECT_EQ(via_link, "twelve bytes");
  ASSERT_OK(WriteFile(fs(), "to_file", "new", O_WRONLY | O_TRUNC));
  ASSERT_OK_AND_ASSIGN(std::string direct, ReadFile(fs(), "d/file"));
  EXPECT_EQ(direct, "new");
  ASSERT_OK_AND_ASSIGN(lst, fs().Lstat("to_file"));
  EXPECT_TRUE(S_ISLNK(lst.st_mode)) << "writing through a link keeps the link";
  EXPECT_ERRNO(fs().Open("to_file", O_RDONLY | O_NOFOLLOW), ELOOP);

  ASSERT_OK(fs().Symlink("loop2", "loop1"));
  ASSERT_OK(fs().Symlink("loop1", "loop2"));
  EXPECT_ERRNO(fs().Stat("loop1"), ELOOP);
  EXPECT_ERRNO(fs().Open("loop1", O_RDONLY), ELOOP);
}

TEST_P(ConformanceTest, ReadDirListsEveryEntryExactlyOnce) {
  constexpr int kEntries = 5000;
  ASSERT_OK(fs().Mkdir("many"));
  std::multiset<std::string> expected;
  for (int i = 0; i < kEntries; ++i) {
    std::string name = "entry-" + std::to_string(i) + "-with-some-length";
    ASSERT_OK(WriteFile(fs(), "many/" + name, "", O_WRONLY | O_CREAT))
        << "at entry " << i;
    expected.insert(name);
  }
  ASSERT_OK(fs().Mkdir("many/subdir"));
  ASSERT_OK(fs().Symlink("entry-0-with-some-length", "many/link"));
  expected.insert("subdir");
  expected.insert("link");

  ASSERT_OK_AND_ASSIGN(auto names, fs().ReadDir("many"));
  EXPECT_EQ(names.size(), expected.size());
  auto got = AsSet(names);
  EXPECT_TRUE(got == expected) << "entries missing or listed twice";
  for (const auto& name : got) {
    EXPECT_EQ(got.count(name), 1u) << name;
    EXPECT_EQ(expected.count(name), 1u) << "unexpected entry " << name;
  }
}

TEST_P(ConformanceTest, ReadDirErrors) {
  ASSERT_OK(fs().Mkdir("empty"));
  ASSERT_OK_AND_ASSIGN(auto names, fs().ReadDir("empty"));
  EXPECT_TRUE(names.empty());
  ASSERT_OK(WriteFile(fs(), "file", "x"));
  EXPECT_ERRNO(fs().ReadDir("file"), ENOTDIR);
  EXPECT_ERRNO(fs().ReadDir("missing"), ENOENT);
}

TEST_P(ConformanceTest, NamesOfExactly255Bytes) {
  const std::string file(255, 'f');
  const std::string dir(255, 'd');
  const std::string other = std::string(254, 'o') + "!";
  ASSERT_OK(WriteFile(fs(), file, "long name"));
  ASSERT_OK(fs().Mkdir(dir));
  ASSERT_OK(WriteFile(fs(), dir + "/" + file, "nested"));
  ASSERT_OK_AND_ASSIGN(auto names, fs().ReadDir(""));
  EXPECT_EQ(AsSet(names), (std::multiset<std::string>{file, dir}));
  ASSERT_OK(fs().Rename(file, other));
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), other));
  EXPECT_EQ(back, "long name");
  ASSERT_OK(fs().Symlink(other, file));
  ASSERT_OK_AND_ASSIGN(std::string target, fs().Readlink(file));
  EXPECT_EQ(target, other);
  ASSERT_OK_AND_ASSIGN(back, ReadFile(fs(), dir + "/" + file));
  EXPECT_EQ(back, "nested");
  ASSERT_OK(fs().Unlink(dir + "/" + file));
  ASSERT_OK(fs().Rmdir(dir));
}

TEST_P(ConformanceTest, NamesOver255BytesAreRefused) {
  const std::string name(256, 'n');
  ASSERT_OK(WriteFile(fs(), "f", "x"));
  EXPECT_ERRNO(fs().Open(name, O_WRONLY | O_CREAT, 0644), ENAMETOOLONG);
  EXPECT_ERRNO(fs().Mkdir(name), ENAMETOOLONG);
  EXPECT_ERRNO(fs().Stat(name), ENAMETOOLONG);
  EXPECT_ERRNO(fs().Symlink("f", name), ENAMETOOLONG);
  EXPECT_ERRNO(fs().Rename("f", name), ENAMETOOLONG);
  EXPECT_ERRNO(fs().Link("f", name), ENAMETOOLONG);
  ASSERT_OK_AND_ASSIGN(auto names, fs().ReadDir(""));
  EXPECT_EQ(AsSet(names), std::multiset<std::string>{"f"});
}

TEST_P(ConformanceTest, UnusualButValidNames) {
  const std::vector<std::string> names = {
      "with space", "ünïcödé-名前", ".hidden",   "-leading-dash", "semi;colon",
      "quote'\"",   "back\\slash",  "trailing.", "a\tb",          "#%&*?[]{}"};
  for (const auto& name : names) {
    ASSERT_OK(WriteFile(fs(), name, name)) << name;
  }
  ASSERT_OK_AND_ASSIGN(auto listed, fs().ReadDir(""));
  EXPECT_EQ(AsSet(listed), AsSet(names));
  for (const auto& name : names) {
    ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), name));
    EXPECT_EQ(back, name);
  }
}

TEST_P(ConformanceTest, DeepPathNearPathMax) {
  // Directories of 99-byte names until the path is about 4000 bytes long.
  std::string path;
  int level = 0;
  while (path.size() + 100 < 3950) {
    char prefix[16];
    std::snprintf(prefix, sizeof(prefix), "%03d", level++);
    path +=
        (path.empty() ? "" : "/") + std::string(prefix) + std::string(96, 'd');
    ASSERT_OK(fs().Mkdir(path)) << "at depth " << level;
  }
  const std::string file = path + "/" + std::string(40, 'f');
  ASSERT_GE(file.size(), 3900u);
  ASSERT_LT(file.size(), 4000u);
  ASSERT_OK(WriteFile(fs(), file, "at the bottom"));
  ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(fs(), file));
  EXPECT_EQ(back, "at the bottom");
  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat(file));
  EXPECT_EQ(st.st_size, 13);
  ASSERT_OK_AND_ASSIGN(auto names, fs().ReadDir(path));
  EXPECT_EQ(AsSet(names), std::multiset<std::string>{std::string(40, 'f')});
  const std::string renamed = path + "/" + std::string(50, 'r');
  ASSERT_OK(fs().Rename(file, renamed));
  ASSERT_OK_AND_ASSIGN(back, ReadFile(fs(), renamed));
  EXPECT_EQ(back, "at the bottom");
  ASSERT_OK(fs().Unlink(renamed));
  ASSERT_OK(fs().Rmdir(path));
  EXPECT_ERRNO(fs().Stat(path), ENOENT);
}

// --- Attributes ----------------------------------------------------------

TEST_P(ConformanceTest, ChmodSetsPermissionBits) {
  ASSERT_OK(WriteFile(fs(), "tool", "#!/bin/sh\necho hi\n"));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("tool"));
  EXPECT_EQ(st.st_mode & 0111, 0u);
  ASSERT_OK(fs().Chmod("tool", 0755));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("tool"));
  EXPECT_EQ(st.st_mode & 07777, 0755u) << "chmod +x must stick";
  EXPECT_TRUE(S_ISREG(st.st_mode));
  ASSERT_OK(fs().Chmod("tool", 0600));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("tool"));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_OK(fs().Chmod("tool", 0));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("tool"));
  EXPECT_EQ(st.st_mode & 07777, 0u);

  ASSERT_OK(fs().Mkdir("d"));
  ASSERT_OK(fs().Chmod("d", 0711));
  ASSERT_OK_AND_ASSIGN(st, fs().Stat("d"));
  EXPECT_EQ(st.st_mode & 07777, 0711u);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_ERRNO(fs().Chmod("missing", 0644), ENOENT);
}

TEST_P(ConformanceTest, ChownChangesOwnership) {
  ASSERT_OK(WriteFile(fs(), "f", "x"));
  ASSERT_OK(fs().Chown("f", geteuid(), getegid()));
  ASSERT_OK(fs().Chown("f", vfs::kKeepUid, vfs::kKeepGid));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Lstat("f"));
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(st.st_gid, getegid());
  EXPECT_ERRNO(fs().Chown("missing", geteuid(), getegid()), ENOENT);
  if (geteuid() != 0) return;  // only root may give files away (tar does)
  ASSERT_OK(fs().Chown("f", 4242, vfs::kKeepGid));
  ASSERT_OK_AND_ASSIGN(st, fs().Lstat("f"));
  EXPECT_EQ(st.st_uid, 4242u);
  EXPECT_EQ(st.st_gid, getegid());
  ASSERT_OK(fs().Chown("f", vfs::kKeepUid, 4343));
  ASSERT_OK_AND_ASSIGN(st, fs().Lstat("f"));
  EXPECT_EQ(st.st_uid, 4242u);
  EXPECT_EQ(st.st_gid, 4343u);
  ASSERT_OK(fs().Symlink("f", "link"));
  ASSERT_OK(fs().Chown("link", 4444, 4545));
  ASSERT_OK_AND_ASSIGN(st, fs().Lstat("link"));
  EXPECT_EQ(st.st_uid, 4444u) << "lchown changes the link itself";
  ASSERT_OK_AND_ASSIGN(st, fs().Lstat("f"));
  EXPECT_EQ(st.st_uid, 4242u) << "lchown must not follow the link";
}

TEST_P(ConformanceTest, UtimensSetsExactTimesAndHonoursOmit) {
  ASSERT_OK(WriteFile(fs(), "f", "x"));
  struct timespec times[2] = {{1'000'000'000, 123'456'789},
                              {1'200'000'000, 987'654'321}};
  ASSERT_OK(fs().Utimens("f", times));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Lstat("f"));
  EXPECT_EQ(st.st_atim.tv_sec, 1'000'000'000);
  EXPECT_EQ(st.st_atim.tv_nsec, 123'456'789);
  EXPECT_EQ(st.st_mtim.tv_sec, 1'200'000'000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 987'654'321);

  struct timespec mtime_only[2] = {{0, UTIME_OMIT}, {1'300'000'000, 5}};
  ASSERT_OK(fs().Utimens("f", mtime_only));
  ASSERT_OK_AND_ASSIGN(st, fs().Lstat("f"));
  EXPECT_EQ(st.st_atim.tv_sec, 1'000'000'000) << "UTIME_OMIT kept atime";
  EXPECT_EQ(st.st_atim.tv_nsec, 123'456'789);
  EXPECT_EQ(st.st_mtim.tv_sec, 1'300'000'000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 5);

  struct timespec atime_only[2] = {{1'100'000'000, 0}, {0, UTIME_OMIT}};
  ASSERT_OK(fs().Utimens("f", atime_only));
  ASSERT_OK_AND_ASSIGN(st, fs().Lstat("f"));
  EXPECT_EQ(st.st_atim.tv_sec, 1'100'000'000);
  EXPECT_EQ(st.st_mtim.tv_sec, 1'300'000'000) << "UTIME_OMIT kept mtime";

  struct timespec now[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  ASSERT_OK(fs().Utimens("f", now));
  ASSERT_OK_AND_ASSIGN(st, fs().Lstat("f"));
  EXPECT_NEAR(st.st_mtim.tv_sec, time(nullptr), 60);

  ASSERT_OK(fs().Mkdir("d"));
  ASSERT_OK(fs().Utimens("d", times));
  ASSERT_OK_AND_ASSIGN(st, fs().Lstat("d"));
  EXPECT_EQ(st.st_mtim.tv_sec, 1'200'000'000);
  EXPECT_ERRNO(fs().Utimens("missing", times), ENOENT);
}

TEST_P(ConformanceTest, WritingUpdatesMtime) {
  ASSERT_OK(WriteFile(fs(), "f", "x"));
  struct timespec old[2] = {{1'000'000'000, 0}, {1'000'000'000, 0}};
  ASSERT_OK(fs().Utimens("f", old));
  ASSERT_OK(WriteFile(fs(), "f", "y", O_WRONLY | O_APPEND));
  ASSERT_OK_AND_ASSIGN(auto st, fs().Stat("f"));
  EXPECT_NEAR(st.st_mtim.tv_sec, time(nullptr), 60)
      << "make and build tools rely on mtime moving forward on write";
}

// --- Errors a program can cause -------------------------------------------

TEST_P(ConformanceTest, ErrnoOfCommonFailures) {
  ASSERT_OK(WriteFile(fs(), "file", "x"));
  ASSERT_OK(fs().Mkdir("dir"));

  EXPECT_ERRNO(fs().Open("missing", O_RDONLY), ENOENT);
  EXPECT_ERRNO(fs().Open("nodir/f", O_WRONLY | O_CREAT, 0644), ENOENT);
  EXPECT_ERRNO(fs().Open("file/f", O_WRONLY | O_CREAT, 0644), ENOTDIR);
  EXPECT_ERRNO(fs().Open("file/f", O_RDONLY), ENOTDIR);
  EXPECT_ERRNO(fs().Stat("file/f"), ENOTDIR);
  EXPECT_ERRNO(fs().Stat("nodir/f"), ENOENT);
  EXPECT_ERRNO(fs().Lstat("missing"), ENOENT);
  EXPECT_ERRNO(fs().Open("dir", O_WRONLY), EISDIR);
  EXPECT_ERRNO(fs().Open("dir", O_RDWR), EISDIR);
  EXPECT_ERRNO(fs().Open("dir", O_WRONLY | O_CREAT, 0644), EISDIR);

  ASSERT_OK_AND_ASSIGN(int ro, fs().Open("file", O_RDONLY));
  EXPECT_ERRNO(fs().Write(ro, "y", 1), EBADF);
  EXPECT_ERRNO(fs().Pwrite(ro, "y", 1, 0), EBADF);
  ASSERT_OK(fs().Close(ro));
  ASSERT_OK_AND_ASSIGN(int wo, fs().Open("file", O_WRONLY));
  char c;
  EXPECT_ERRNO(fs().Read(wo, &c, 1), EBADF);
  EXPECT_ERRNO(fs().Pread(wo, &c, 1, 0), EBADF);
  ASSERT_OK(fs().Close(wo));
  ASSERT_OK_AND_ASSIGN(std::string unchanged, ReadFile(fs(), "file"));
  EXPECT_EQ(unchanged, "x");
}

std::string FactoryName(const ::testing::TestParamInfo<FsOpsFactory>& info) {
  return info.param.name;
}

// One line per way of reaching a filesystem; test names end in /Native,
// /LocalDirApi or /Fuse (filter with e.g. --gtest_filter='*/Fuse').
INSTANTIATE_TEST_SUITE_P(Native, ConformanceTest,
                         ::testing::Values(NativeFactory()), FactoryName);
INSTANTIATE_TEST_SUITE_P(LocalDirApi, ConformanceTest,
                         ::testing::Values(LocalDirApiFactory()), FactoryName);
INSTANTIATE_TEST_SUITE_P(StoreApi, ConformanceTest,
                         ::testing::Values(StoreApiFactory()), FactoryName);
INSTANTIATE_TEST_SUITE_P(StoreFuse, ConformanceTest,
                         ::testing::Values(StoreFuseFactory()), FactoryName);
// The same store suites on PostgreSQL (a fresh database per test).
INSTANTIATE_TEST_SUITE_P(
    StorePostgresApi, ConformanceTest,
    ::testing::Values(StoreApiFactory(testing::StoreEngine::kPostgres)),
    FactoryName);
INSTANTIATE_TEST_SUITE_P(
    StorePostgresFuse, ConformanceTest,
    ::testing::Values(StoreFuseFactory("StorePostgresFuse", {},
                                       testing::StoreEngine::kPostgres)),
    FactoryName);
INSTANTIATE_TEST_SUITE_P(Fuse, ConformanceTest,
                         ::testing::Values(FuseFactory()), FactoryName);
// The same mount served by libfuse's multi-threaded loop, and with the
// kernel's writeback cache (the "exclusive" mode of the benchmark).
INSTANTIATE_TEST_SUITE_P(FuseThreaded, ConformanceTest,
                         ::testing::Values(FuseFactory("FuseThreaded",
                                                       {"--threads", "4"})),
                         FactoryName);
INSTANTIATE_TEST_SUITE_P(
    FuseWriteback, ConformanceTest,
    ::testing::Values(FuseFactory("FuseWriteback", {"--writeback-cache",
                                                    "--cache-timeout", "30"})),
    FactoryName);
// The workspace and the store mounts taking their requests over io_uring,
// where that can be turned on (root, a kernel with FUSE over io_uring);
// UringTest checks that the rings then carry the requests.
std::vector<FsOpsFactory> IfUring(FsOpsFactory f) {
  std::vector<FsOpsFactory> v;
  if (geteuid() == 0 &&
      access("/sys/module/fuse/parameters/enable_uring", F_OK) == 0)
    v.push_back(std::move(f));
  return v;
}
INSTANTIATE_TEST_SUITE_P(
    FuseUring, ConformanceTest,
    ::testing::ValuesIn(IfUring(FuseFactory("FuseUring", {"--io-uring"}))),
    FactoryName);
INSTANTIATE_TEST_SUITE_P(StoreFuseUring, ConformanceTest,
                         ::testing::ValuesIn(IfUring(StoreFuseFactory(
                             "StoreFuseUring", {"--io-uring"}))),
                         FactoryName);

}  // namespace
}  // namespace agentvfs::conformance
