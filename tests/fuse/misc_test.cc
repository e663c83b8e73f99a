// Single features programs use through the mount that the conformance suite
// does not reach: a shared mapping seen by the host file, O_DIRECT,
// fallocate, extended attributes, statfs, a directory renamed under an open
// file, a directory of 10,000 entries, the writeback cache, and how fast a
// change made beside the mount shows up for each --cache-timeout.
#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/fuse/fuse_test_support.h"

namespace agentvfs::fuse_test {
namespace {

using Clock = std::chrono::steady_clock;

// Compares long byte strings without printing megabytes on failure.
::testing::AssertionResult SameBytes(const std::optional<std::string>& got,
                                     const std::string& want) {
  if (!got) return ::testing::AssertionFailure() << "could not read";
  if (*got == want) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < got->size() && i < want.size() && (*got)[i] == want[i]) ++i;
  return ::testing::AssertionFailure()
         << "sizes " << got->size() << " vs " << want.size()
         << ", first difference at byte " << i;
}

// An fd closed at scope exit.
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

class MiscTest : public FuseViewTest {};

TEST_F(MiscTest, SharedMappingWritesReachTheHostFile) {
  ASSERT_TRUE(Mount());
  const size_t size = 4 * 4096;
  Fd fd(open(View("mapped").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_GE(fd.fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd.fd, size), 0);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
  const std::string data = Pattern(size, 1);
  std::memcpy(p, data.data(), size);
  ASSERT_EQ(msync(p, size, MS_SYNC), 0) << std::strerror(errno);
  EXPECT_TRUE(SameBytes(ReadFile(View("mapped")), data)) << "second fd";
  EXPECT_TRUE(SameBytes(ReadFile(Host("mapped")), data)) << "host file";
  // A second change to one page, while still mapped.
  static_cast<char*>(p)[5000] = 'Z';
  ASSERT_EQ(msync(p, size, MS_SYNC), 0);
  std::string changed = data;
  changed[5000] = 'Z';
  EXPECT_TRUE(SameBytes(ReadFile(Host("mapped")), changed));
  ASSERT_EQ(munmap(p, size), 0);
}

TEST_F(MiscTest, DirectIoBypassesThePageCache) {
  ASSERT_TRUE(Mount());
  const size_t size = 64 * 1024;
  void* raw = nullptr;
  ASSERT_EQ(posix_memalign(&raw, 4096, size), 0);
  std::unique_ptr<void, decltype(&free)> buf(raw, &free);
  const std::string data = Pattern(size, 2);
  std::memcpy(buf.get(), data.data(), size);

  Fd fd(open(View("direct").c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC,
             0644));
  ASSERT_GE(fd.fd, 0) << std::strerror(errno);
  ASSERT_EQ(pwrite(fd.fd, buf.get(), size, 0), static_cast<ssize_t>(size))
      << std::strerror(errno);
  std::memset(buf.get(), 0, size);
  ASSERT_EQ(pread(fd.fd, buf.get(), size, 0), static_cast<ssize_t>(size))
      << std::strerror(errno);
  EXPECT_TRUE(
      SameBytes(std::string(static_cast<char*>(buf.get()), size), data));
  EXPECT_TRUE(SameBytes(ReadFile(Host("direct")), data));

  // No page cache: a change made on the host is read at once.
  const std::string host_data = Pattern(4096, 3);
  Fd host(open(Host("direct").c_str(), O_WRONLY | O_CLOEXEC));
  ASSERT_EQ(pwrite(host.fd, host_data.data(), 4096, 8192), 4096);
  ASSERT_EQ(pread(fd.fd, buf.get(), 4096, 8192), 4096);
  EXPECT_TRUE(
      SameBytes(std::string(static_cast<char*>(buf.get()), 4096), host_data));
}

TEST_F(MiscTest, FallocateAllocatesAndPunchesHolesLikeTheHost) {
  ASSERT_TRUE(Mount());
  const off_t size = 1 << 20;
  Fd fd(open(View("alloc").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_GE(fd.fd, 0) << std::strerror(errno);
  ASSERT_EQ(fallocate(fd.fd, 0, 0, size), 0) << std::strerror(errno);
  struct stat st;
  ASSERT_EQ(fstat(fd.fd, &st), 0);
  EXPECT_EQ(st.st_size, size);
  EXPECT_GE(st.st_blocks * 512, size) << "space was not allocated";
  ASSERT_EQ(stat(Host("alloc").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, size);

  // Write data, then punch a hole in the middle, as on the host fs.
  const std::string data = Pattern(size, 4);
  ASSERT_EQ(pwrite(fd.fd, data.data(), size, 0), size);
  ASSERT_EQ(fsync(fd.fd), 0);
  const int mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
  int host_errno = 0;
  {
    Fd probe(open(Beside("probe").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_EQ(pwrite(probe.fd, data.data(), size, 0), size);
    host_errno = ErrnoOf(fallocate(probe.fd, mode, 4096, 65536));
  }
  ASSERT_EQ(fstat(fd.fd, &st), 0);
  const blkcnt_t blocks_before = st.st_blocks;
  EXPECT_ERRNO_EQ(ErrnoOf(fallocate(fd.fd, mode, 4096, 65536)), host_errno);
  if (host_errno != 0) return;
  std::string want = data;
  std::memset(want.data() + 4096, 0, 65536);
  EXPECT_TRUE(SameBytes(ReadFile(View("alloc")), want));
  EXPECT_TRUE(SameBytes(ReadFile(Host("alloc")), want));
  ASSERT_EQ(fstat(fd.fd, &st), 0);
  EXPECT_EQ(st.st_size, size) << "KEEP_SIZE";
  EXPECT_LT(st.st_blocks, blocks_before) << "the hole freed no space";
}

TEST_F(MiscTest, WithoutXattrOptionXattrsAreClearlyUnsupported) {
  ASSERT_TRUE(WriteFile(Host("f"), "x"));
  ASSERT_EQ(setxattr(Host("f").c_str(), "user.agentvfs.a", "1", 1, 0), 0);
  ASSERT_TRUE(Mount());
  const std::string f = View("f");
  char buf[64];
  // Twice each: the first answer is the daemon's, later ones the kernel's.
  for (int i = 0; i < 2; ++i) {
    EXPECT_ERRNO_EQ(
        ErrnoOf(getxattr(f.c_str(), "user.agentvfs.a", buf, sizeof buf)),
        EOPNOTSUPP);
    EXPECT_ERRNO_EQ(ErrnoOf(setxattr(f.c_str(), "user.agentvfs.b", "2", 1, 0)),
                    EOPNOTSUPP);
    EXPECT_ERRNO_EQ(ErrnoOf(listxattr(f.c_str(), buf, sizeof buf)), EOPNOTSUPP);
    EXPECT_ERRNO_EQ(ErrnoOf(removexattr(f.c_str(), "user.agentvfs.a")),
                    EOPNOTSUPP);
  }
  // Nothing reached the host file, and writes still work.
  EXPECT_EQ(getxattr(Host("f").c_str(), "user.agentvfs.b", buf, sizeof buf),
            -1);
  EXPECT_EQ(getxattr(Host("f").c_str(), "user.agentvfs.a", buf, sizeof buf), 1);
  ASSERT_TRUE(WriteFile(f, "written through the view"));
  EXPECT_EQ(ReadFile(Host("f")), "written through the view");
}

TEST_F(MiscTest, UserXattrsRoundTripAndSystemOnesAreRefused) {
  ASSERT_TRUE(WriteFile(Host("f"), "x"));
  ASSERT_TRUE(Mount({"--xattr"}));
  const std::string f = View("f");
  const std::string value = "some value\0with a NUL";
  ASSERT_EQ(setxattr(f.c_str(), "user.agentvfs.a", value.data(), value.size(),
                     XATTR_CREATE),
            0)
      << std::strerror(errno);
  ASSERT_EQ(setxattr(f.c_str(), "user.agentvfs.b", "2", 1, 0), 0);

  // Size query, exact read, too small a buffer.
  EXPECT_EQ(getxattr(f.c_str(), "user.agentvfs.a", nullptr, 0),
            static_cast<ssize_t>(value.size()));
  char buf[256];
  ssize_t n = getxattr(f.c_str(), "user.agentvfs.a", buf, sizeof buf);
  ASSERT_EQ(n, static_cast<ssize_t>(value.size()));
  EXPECT_EQ(std::string(buf, n), value);
  EXPECT_EQ(getxattr(f.c_str(), "user.agentvfs.a", buf, 3), -1);
  EXPECT_ERRNO_EQ(errno, ERANGE);
  // The host file carries the same attribute.
  n = getxattr(Host("f").c_str(), "user.agentvfs.a", buf, sizeof buf);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), value);

  // Listing.
  n = listxattr(f.c_str(), buf, sizeof buf);
  ASSERT_GT(n, 0) << std::strerror(errno);
  std::set<std::string> names;
  for (ssize_t i = 0; i < n; i += std::strlen(buf + i) + 1)
    names.insert(buf + i);
  EXPECT_TRUE(names.count("user.agentvfs.a"));
  EXPECT_TRUE(names.count("user.agentvfs.b"));

  // Create/replace flags.
  EXPECT_ERRNO_EQ(
      ErrnoOf(setxattr(f.c_str(), "user.agentvfs.a", "v", 1, XATTR_CREATE)),
      EEXIST);
  EXPECT_ERRNO_EQ(
      ErrnoOf(setxattr(f.c_str(), "user.agentvfs.none", "v", 1, XATTR_REPLACE)),
      ENODATA);

  // Removal.
  ASSERT_EQ(removexattr(f.c_str(), "user.agentvfs.a"), 0);
  EXPECT_EQ(getxattr(f.c_str(), "user.agentvfs.a", buf, sizeof buf), -1);
  EXPECT_ERRNO_EQ(errno, ENODATA);
  EXPECT_EQ(getxattr(Host("f").c_str(), "user.agentvfs.a", buf, sizeof buf),
            -1);
  EXPECT_ERRNO_EQ(ErrnoOf(removexattr(f.c_str(), "user.agentvfs.a")), ENODATA);

  // ACLs and other system.* attributes would not be enforced: refused.
  const char acl[] = {2, 0, 0, 0};  // a POSIX ACL header, no entries
  EXPECT_ERRNO_EQ(ErrnoOf(setxattr(f.c_str(), "system.posix_acl_access", acl,
                                   sizeof acl, 0)),
                  EOPNOTSUPP);
  EXPECT_ERRNO_EQ(ErrnoOf(setxattr(f.c_str(), "system.agentvfs", "v", 1, 0)),
                  EOPNOTSUPP);
  EXPECT_ERRNO_EQ(
      ErrnoOf(getxattr(f.c_str(), "system.agentvfs", buf, sizeof buf)),
      EOPNOTSUPP);
  EXPECT_ERRNO_EQ(ErrnoOf(removexattr(f.c_str(), "system.agentvfs")),
                  EOPNOTSUPP);
  // trusted.* would let the sandbox plant attributes only root should set.
  EXPECT_ERRNO_EQ(ErrnoOf(setxattr(f.c_str(), "trusted.agentvfs", "v", 1, 0)),
                  EPERM);
}

TEST_F(MiscTest, StatfsAnswersForTheRootAndTheWorkspace) {
  ASSERT_TRUE(Mount());
  struct statvfs view_root {
  }, view_ws{}, host{};
  ASSERT_EQ(statvfs(MountPoint().c_str(), &view_root), 0)
      << std::strerror(errno);
  ASSERT_EQ(statvfs(View().c_str(), &view_ws), 0) << std::strerror(errno);
  ASSERT_EQ(statvfs(Host().c_str(), &host), 0);
  EXPECT_GT(view_root.f_bsize, 0u);
  EXPECT_GT(view_root.f_namemax, 0u);
  // The workspace reports its host filesystem's size.
  EXPECT_EQ(view_ws.f_blocks * view_ws.f_frsize, host.f_blocks * host.f_frsize);
  EXPECT_EQ(view_ws.f_namemax, host.f_namemax);
  EXPECT_GT(view_ws.f_bavail, 0u);
}

TEST_F(MiscTest, OpenFileSurvivesRenameOfItsDirectory) {
  ASSERT_EQ(mkdir(Host("a").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(Host("a/file"), "before"));
  ASSERT_TRUE(Mount());
  Fd fd(open(View("a/file").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_GE(fd.fd, 0) << std::strerror(errno);

  ASSERT_EQ(rename(View("a").c_str(), View("b").c_str()), 0)
      << std::strerror(errno);
  struct stat st;
  ASSERT_EQ(fstat(fd.fd, &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_size, 6);
  char buf[32] = {};
  ASSERT_EQ(pread(fd.fd, buf, sizeof buf, 0), 6);
  EXPECT_STREQ(buf, "before");
  ASSERT_EQ(pwrite(fd.fd, "after!", 6, 0), 6);
  EXPECT_EQ(fchmod(fd.fd, 0600), 0) << std::strerror(errno);
  EXPECT_EQ(ftruncate(fd.fd, 5), 0) << std::strerror(errno);
  EXPECT_EQ(ReadFile(View("b/file")), "after");
  EXPECT_EQ(OpenErrno(View("a/file"), O_RDONLY), ENOENT);
  ASSERT_EQ(stat(View("b/file").c_str(), &st), 0);
  EXPECT_EQ(Octal(st.st_mode), "0600");

  // Again, renamed behind the daemon's back on the host: what goes through
  // the open handle keeps working at once. (fchmod does not: the kernel
  // sends it without the handle, and the daemon only learns the new name
  // when something looks it up.)
  ASSERT_EQ(rename(Host("b").c_str(), Host("c").c_str()), 0);
  EXPECT_EQ(fstat(fd.fd, &st), 0) << std::strerror(errno);
  EXPECT_EQ(pwrite(fd.fd, "!", 1, 5), 1) << std::strerror(errno);
  EXPECT_EQ(ftruncate(fd.fd, 6), 0) << std::strerror(errno);
  EXPECT_EQ(ReadFile(View("c/file")), "after!");
  EXPECT_ERRNO_EQ(OpenErrno(View("b/file"), O_RDONLY), ENOENT);
  // Once the new name was looked up, path operations use it.
  EXPECT_EQ(fchmod(fd.fd, 0640), 0) << std::strerror(errno);
  ASSERT_EQ(stat(Host("c/file").c_str(), &st), 0);
  EXPECT_EQ(Octal(st.st_mode), "0640");
}

TEST_F(MiscTest, ReaddirOfTenThousandEntries) {
  ASSERT_EQ(mkdir(Host("big").c_str(), 0755), 0);
  const int kCount = 10'000;
  std::set<std::string> want;
  for (int i = 0; i < kCount; ++i) {
    std::string name = "entry-" + std::to_string(i);
    int fd =
        open(Host("big/" + name).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    close(fd);
    want.insert(name);
  }
  ASSERT_TRUE(Mount());
  DIR* dir = opendir(View("big").c_str());
  ASSERT_NE(dir, nullptr) << std::strerror(errno);
  std::set<std::string> got;
  size_t entries = 0;
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    ++entries;
    got.insert(name);
    EXPECT_EQ(e->d_type, DT_REG) << name;
  }
  closedir(dir);
  EXPECT_EQ(entries, static_cast<size_t>(kCount)) << "duplicates or losses";
  EXPECT_EQ(got, want);
}

// A listing hands the kernel every entry's attributes (readdirplus); what the
// view then reports for each entry must be the host's, for files, dirs and
// symlinks alike, and the entries must stay usable (open, unlink).
TEST_F(MiscTest, AttributesFromAListingMatchTheHost) {
  ASSERT_EQ(mkdir(Host("l").c_str(), 0755), 0);
  const int kCount = 300;
  for (int i = 0; i < kCount; ++i) {
    std::string name = "l/f" + std::to_string(i);
    ASSERT_TRUE(WriteFile(Host(name), std::string(i, 'x'), 0600 | (i % 8)));
  }
  ASSERT_EQ(mkdir(Host("l/sub").c_str(), 0710), 0);
  ASSERT_EQ(symlink("f7", Host("l/link").c_str()), 0);
  ASSERT_TRUE(Mount());
  auto names = ListDir(View("l"));
  ASSERT_TRUE(names.has_value());
  ASSERT_EQ(names->size(), static_cast<size_t>(kCount + 2));
  for (const auto& name : *names) {
    struct stat host, view;
    ASSERT_EQ(lstat(Host("l/" + name).c_str(), &host), 0) << name;
    ASSERT_EQ(lstat(View("l/" + name).c_str(), &view), 0) << name;
    EXPECT_EQ(view.st_ino, host.st_ino) << name;
    EXPECT_EQ(view.st_mode, host.st_mode) << name;
    EXPECT_EQ(view.st_size, host.st_size) << name;
    EXPECT_EQ(view.st_nlink, host.st_nlink) << name;
    EXPECT_EQ(view.st_mtim.tv_sec, host.st_mtim.tv_sec) << name;
  }
  auto content = ReadFile(View("l/f42"));
  ASSERT_TRUE(content.has_value());
  EXPECT_EQ(*content, std::string(42, 'x'));
  for (int i = 0; i < kCount; ++i)
    ASSERT_EQ(unlink(View("l/f" + std::to_string(i)).c_str()), 0) << i;
  auto left = ListDir(Host("l"));
  ASSERT_TRUE(left.has_value());
  EXPECT_EQ(*left, (std::vector<std::string>{"link", "sub"}));
}

TEST_F(MiscTest, WritebackCacheKeepsSequentialWritesIntact) {
  ASSERT_TRUE(Mount({"--writeback-cache"}));
  // Odd-sized sequential writes that straddle pages.
  const std::string data = Pattern(3 * 1024 * 1024 + 123, 5);
  Fd fd(
      open(View("wb").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ASSERT_GE(fd.fd, 0) << std::strerror(errno);
  for (size_t off = 0; off < data.size(); off += 1000) {
    size_t len = std::min<size_t>(1000, data.size() - off);
    ASSERT_EQ(write(fd.fd, data.data() + off, len), static_cast<ssize_t>(len));
  }
  ASSERT_EQ(close(fd.fd), 0);
  fd.fd = -1;
  EXPECT_TRUE(SameBytes(ReadFile(View("wb")), data));
  EXPECT_TRUE(SameBytes(ReadFile(Host("wb")), data));

  // Appends through a write-only O_APPEND descriptor land at the end.
  Fd app(open(View("wb").c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
  ASSERT_GE(app.fd, 0) << std::strerror(errno);
  ASSERT_EQ(write(app.fd, "tail-1", 6), 6);
  ASSERT_EQ(write(app.fd, "tail-2", 6), 6);
  ASSERT_EQ(close(app.fd), 0);
  app.fd = -1;
  EXPECT_TRUE(SameBytes(ReadFile(Host("wb")), data + "tail-1tail-2"));
  struct stat st;
  ASSERT_EQ(stat(View("wb").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(data.size() + 12));
}

TEST_F(MiscTest, CacheTimeoutZeroShowsHostChangesAtOnce) {
  ASSERT_TRUE(WriteFile(Host("f"), "one"));
  ASSERT_TRUE(Mount({"--cache-timeout", "0"}));
  ASSERT_EQ(ReadFile(View("f")), "one");
  struct stat st;
  ASSERT_NE(stat(View("g").c_str(), &st), 0);  // a negative lookup

  ASSERT_TRUE(WriteFile(Host("f"), "two, longer", 0600));
  ASSERT_TRUE(WriteFile(Host("g"), "new"));
  EXPECT_EQ(ReadFile(View("f")), "two, longer");
  ASSERT_EQ(stat(View("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 11);
  EXPECT_EQ(Octal(st.st_mode), "0600");
  EXPECT_EQ(ReadFile(View("g")), "new");

  ASSERT_EQ(unlink(Host("g").c_str()), 0);
  EXPECT_ERRNO_EQ(ErrnoOf(stat(View("g").c_str(), &st)), ENOENT);
}

// While the kernel still has a name cached, the host file behind it may be
// removed or replaced beside the mount. An open then reaches the file there
// now, as on a local filesystem: open(O_CREAT) of a removed file makes a
// new one (before: ENOENT), and a replaced file is read as itself, not
// through the old file's node and cached pages.
TEST_F(MiscTest, AnOpenReachesTheFileThereNowWhateverTheCache) {
  for (const char* passthrough : {"on", "off"}) {
    SCOPED_TRACE(std::string("passthrough ") + passthrough);
    std::vector<std::string> args = {"--cache-timeout", "60"};
    if (std::string(passthrough) == "off") args.push_back("--no-passthrough");
    ASSERT_TRUE(Mount(args));
    ASSERT_TRUE(WriteFile(View("made"), "first"));
    ASSERT_EQ(ReadFile(View("made")), "first");  // name and pages cached
    ASSERT_EQ(unlink(Host("made").c_str()), 0);
    {
      Fd fd(open(View("made").c_str(), O_WRONLY | O_CREAT, 0644));
      ASSERT_GE(fd.fd, 0) << std::strerror(errno);
      ASSERT_EQ(write(fd.fd, "again", 5), 5);
    }
    EXPECT_EQ(ReadFile(Host("made")), "again");

    ASSERT_TRUE(WriteFile(View("swapped"), "the old file"));
    ASSERT_EQ(ReadFile(View("swapped")), "the old file");
    ASSERT_TRUE(WriteFile(Host("new"), "the new file, longer"));
    ASSERT_EQ(rename(Host("new").c_str(), Host("swapped").c_str()), 0);
    EXPECT_EQ(ReadFile(View("swapped")), "the new file, longer");
    ASSERT_EQ(view_->Stop(), 0) << view_->Log();
    view_.reset();
    ASSERT_EQ(unlink(Host("made").c_str()), 0);
    ASSERT_EQ(unlink(Host("swapped").c_str()), 0);
  }
}

// rewinddir(3) shows the directory as it is now (POSIX), not as it was
// when it was opened: "delete everything, rewind, check" loops end.
TEST_F(MiscTest, RewinddirShowsTheDirectoryAsItIsNow) {
  ASSERT_TRUE(WriteFile(Host("a"), "a"));
  ASSERT_TRUE(Mount());
  DIR* d = opendir(View().c_str());
  ASSERT_NE(d, nullptr);
  auto names = [&] {
    std::set<std::string> out;
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.insert(n);
    }
    return out;
  };
  EXPECT_EQ(names(), (std::set<std::string>{"a"}));
  ASSERT_TRUE(WriteFile(View("b"), "b"));
  rewinddir(d);
  EXPECT_EQ(names(), (std::set<std::string>{"a", "b"}));
  ASSERT_EQ(unlink(View("a").c_str()), 0);
  ASSERT_EQ(unlink(View("b").c_str()), 0);
  rewinddir(d);
  EXPECT_EQ(names(), std::set<std::string>{});
  closedir(d);

  // What is made between opendir and the first read is listed too (the
  // listing was taken at opendir: a failed export, cleaning up the
  // directory it had opened before filling it, left every file).
  d = opendir(View().c_str());
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(WriteFile(View("c"), "c"));
  EXPECT_EQ(names(), (std::set<std::string>{"c"}));
  closedir(d);
  // opendir of a name that is gone or not a directory fails as it should.
  EXPECT_EQ(opendir(View("c").c_str()), nullptr);
  EXPECT_EQ(errno, ENOTDIR);
  EXPECT_EQ(opendir(View("gone").c_str()), nullptr);
  EXPECT_EQ(errno, ENOENT);
}

// A directory renamed away and back beside the mount: the daemon knew it
// under both names for a while, and the name found again is the one its
// paths are built from (before, everything below it gave ENOENT until the
// kernel forgot the directory).
TEST_F(MiscTest, ADirectoryRenamedAwayAndBackBesideTheMountStaysReachable) {
  ASSERT_EQ(mkdir(Host("src").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(Host("src/x"), "x"));
  ASSERT_TRUE(Mount({"--cache-timeout", "0"}));
  auto list = [&] {
    std::set<std::string> names;
    DIR* d = opendir(View().c_str());
    if (d == nullptr) return names;
    while (dirent* e = readdir(d)) names.insert(e->d_name);
    closedir(d);
    return names;
  };
  struct stat st;
  ASSERT_EQ(stat(View("src").c_str(), &st), 0);
  ASSERT_EQ(rename(Host("src").c_str(), Host("src.bak").c_str()), 0);
  ASSERT_EQ(list().count("src.bak"), 1u);  // the same directory, a new name
  ASSERT_EQ(rename(Host("src.bak").c_str(), Host("src").c_str()), 0);
  EXPECT_EQ(ReadFile(View("src/x")), "x");
  ASSERT_EQ(list().count("src"), 1u);
  EXPECT_EQ(ReadFile(View("src/x")), "x");
  // A hard link that went away on the host no longer names the file.
  ASSERT_TRUE(WriteFile(Host("a"), "linked"));
  ASSERT_EQ(link(Host("a").c_str(), Host("b").c_str()), 0);
  int fd = open(View("a").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(stat(View("b").c_str(), &st), 0);  // its newest name now
  ASSERT_EQ(unlink(Host("b").c_str()), 0);
  EXPECT_NE(stat(View("b").c_str(), &st), 0);
  // fstat asks for the file without a name: it must not use the gone one.
  EXPECT_EQ(fstat(fd, &st), 0) << strerror(errno);
  EXPECT_EQ(st.st_size, 6);
  close(fd);
  EXPECT_EQ(ReadFile(View("a")), "linked");
}

// With the default timeout (1 s) a change made beside the mount is seen
// within 2 s; tests/e2e allows 5 s for the same with a slower check.
TEST_F(MiscTest, DefaultCacheTimeoutShowsHostChangesWithinTwoSeconds) {
  ASSERT_TRUE(WriteFile(Host("f"), "one"));
  ASSERT_TRUE(Mount());
  ASSERT_EQ(ReadFile(View("f")), "one");
  struct stat st;
  ASSERT_NE(stat(View("g").c_str(), &st), 0);

  ASSERT_TRUE(WriteFile(Host("f"), "two, longer"));
  ASSERT_TRUE(WriteFile(Host("g"), "new"));
  const auto changed = Clock::now();
  bool seen = false;
  while (Clock::now() - changed < std::chrono::seconds(2)) {
    if (ReadFile(View("f")) == "two, longer" && ReadFile(View("g")) == "new") {
      seen = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(seen) << "not visible after 2 s: f=" << *ReadFile(View("f"))
                    << ", g exists: " << ReadFile(View("g")).has_value();
}

}  // namespace
}  // namespace agentvfs::fuse_test
