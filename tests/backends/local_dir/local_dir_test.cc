// Tests of LocalDirBackend: every method's success and main errors, and,
// above all, that no operation reaches outside the root whatever symlinks the
// agent plants (escape tests) or swaps in concurrently (race test). Each test
// gets a fresh directory under /tmp holding `root/` (served) and `outside/`
// (must never change); snapshots of `outside/` are compared before and after.
#include "backends/local_dir/local_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace agentvfs::backends {
namespace {

using vfs::Caller;
using vfs::Path;

// Expects `expr` (a Result/Status) to fail with errno `err`; prints the
// error's text when it fails otherwise.
#define EXPECT_ERRNO(expr, err)                               \
  do {                                                        \
    const auto& _r = (expr);                                  \
    if (_r.has_value()) {                                     \
      ADD_FAILURE() << #expr << " succeeded; expected "       \
                    << vfs::ErrnoName(err);                   \
    } else {                                                  \
      EXPECT_EQ(std::string(vfs::ErrnoName(_r.error().code)), \
                std::string(vfs::ErrnoName(err)))             \
          << #expr << ": " << _r.error().ToString();          \
    }                                                         \
  } while (0)

#define EXPECT_OK(expr)                                                    \
  do {                                                                     \
    const auto& _r = (expr);                                               \
    EXPECT_TRUE(_r.has_value()) << #expr << ": " << _r.error().ToString(); \
  } while (0)

#define ASSERT_OK(expr)                                                    \
  do {                                                                     \
    const auto& _r = (expr);                                               \
    ASSERT_TRUE(_r.has_value()) << #expr << ": " << _r.error().ToString(); \
  } while (0)

// Removes a tree without following any symlink and without full paths, so
// trees deeper than PATH_MAX and planted escape links are handled.
void RemoveTreeAt(int dirfd, const char* name) {
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd >= 0) {
      DIR* d = fdopendir(fd);
      std::vector<std::string> names;
      while (struct dirent* de = readdir(d)) {
        std::string n = de->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      for (const auto& n : names) RemoveTreeAt(fd, n.c_str());
      closedir(d);
    }
    unlinkat(dirfd, name, AT_REMOVEDIR);
  } else {
    unlinkat(dirfd, name, 0);
  }
}

std::string ReadHostFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteHostFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

// Everything observable about a tree except atime: names, types, modes,
// owners, sizes, link counts, mtime, ctime (which any chmod, chown, xattr or
// write change) and file contents. Never follows symlinks.
void SnapshotAt(int dirfd, const std::string& name, const std::string& shown,
                std::vector<std::string>& out) {
  struct stat st;
  if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    out.push_back(shown + " <missing>");
    return;
  }
  std::ostringstream line;
  line << shown << " mode=" << std::oct << st.st_mode << std::dec
       << " uid=" << st.st_uid << " gid=" << st.st_gid << " size=" << st.st_size
       << " nlink=" << st.st_nlink << " mtime=" << st.st_mtim.tv_sec << "."
       << st.st_mtim.tv_nsec << " ctime=" << st.st_ctim.tv_sec << "."
       << st.st_ctim.tv_nsec;
  if (S_ISREG(st.st_mode)) {
    int fd = openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NOATIME);
    std::string content(static_cast<size_t>(st.st_size), '\0');
    if (fd >= 0) {
      ssize_t n = pread(fd, content.data(), content.size(), 0);
      content.resize(n < 0 ? 0 : static_cast<size_t>(n));
      close(fd);
    }
    line << " content=" << content;
  }
  out.push_back(line.str());
  if (S_ISDIR(st.st_mode)) {
    int fd = openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    DIR* d = fdopendir(fd);
    std::vector<std::string> names;
    while (struct dirent* de = readdir(d)) {
      std::string n = de->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) SnapshotAt(fd, n, shown + "/" + n, out);
    closedir(d);
  }
}

std::vector<std::string> Snapshot(const std::string& path) {
  std::vector<std::string> out;
  SnapshotAt(AT_FDCWD, path, path, out);
  return out;
}

std::string Describe(const struct stat& st) {
  std::ostringstream s;
  s << "mode=" << std::oct << st.st_mode << std::dec << " uid=" << st.st_uid
    << " gid=" << st.st_gid << " size=" << st.st_size
    << " nlink=" << st.st_nlink << " mtime=" << st.st_mtim.tv_sec << "."
    << st.st_mtim.tv_nsec << " ctime=" << st.st_ctim.tv_sec << "."
    << st.st_ctim.tv_nsec;
  return s.str();
}

std::string LstatHost(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return "<missing>";
  return Describe(st);
}

class LocalDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentvfs-localdir-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << strerror(errno);
    base_ = tmpl;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0755), 0);
    auto backend = LocalDirBackend::Open(root_);
    ASSERT_TRUE(backend.has_value()) << backend.error().ToString();
    backend_ = std::move(*backend);
  }

  void TearDown() override {
    backend_.reset();
    RemoveTreeAt(AT_FDCWD, base_.c_str());
  }

  static Path P(std::string_view text) {
    auto p = Path::Parse(text);
    EXPECT_TRUE(p.has_value()) << text;
    // Never the root: a bad test path must not act on the whole tree.
    return p.value_or(*Path::Parse("/bad-test-path"));
  }
  std::string Host(std::string_view rel) const {
    return root_ + "/" + std::string(rel);
  }

  // Creates `rel` inside the root with `content` through the backend.
  void MakeFile(std::string_view rel, const std::string& content) {
    auto h = backend_->Open(c_, P(rel), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_TRUE(h.has_value()) << h.error().ToString();
    if (!content.empty()) {
      auto n = (*h)->Write(content.data(), content.size(), 0);
      ASSERT_TRUE(n.has_value()) << n.error().ToString();
      ASSERT_EQ(*n, content.size());
    }
  }

  // Creation that may fail (used while paths are being swapped).
  void MakeFileQuietly(const std::string& rel) {
    (void)backend_->Open(c_, P(rel), O_CREAT | O_WRONLY, 0644);
  }

  std::string ReadAll(std::string_view rel) {
    auto h = backend_->Open(c_, P(rel), O_RDONLY);
    EXPECT_TRUE(h.has_value()) << h.error().ToString();
    if (!h) return "<error>";
    std::string out(1 << 16, '\0');
    auto n = (*h)->Read(out.data(), out.size(), 0);
    EXPECT_TRUE(n.has_value()) << n.error().ToString();
    out.resize(n.value_or(0));
    return out;
  }

  std::string base_;
  std::string root_;
  std::string outside_;
  std::unique_ptr<LocalDirBackend> backend_;
  Caller c_ = Caller::Local();
};

// --- Open (the factory) -----------------------------------------------------

TEST_F(LocalDirTest, OpenRejectsMissingDirectoryWithAdvice) {
  auto b = LocalDirBackend::Open(base_ + "/nope");
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code, ENOENT);
  EXPECT_NE(b.error().message.find("mkdir -p"), std::string::npos)
      << b.error().ToString();
}

TEST_F(LocalDirTest, OpenRejectsFile) {
  WriteHostFile(base_ + "/plain", "x");
  auto b = LocalDirBackend::Open(base_ + "/plain");
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.error().code, ENOTDIR);
  EXPECT_NE(b.error().message.find("not a directory"), std::string::npos);
}

// --- Stat
// ---------------------------------------------------------------------

TEST_F(LocalDirTest, StatRootFileAndErrors) {
  auto root = backend_->Stat(c_, Path());
  ASSERT_OK(root);
  EXPECT_TRUE(S_ISDIR(root->st_mode));
  struct stat host;
  ASSERT_EQ(stat(root_.c_str(), &host), 0);
  EXPECT_EQ(root->st_ino, host.st_ino);

  MakeFile("/f", "hello");
  auto f = backend_->Stat(c_, P("/f"));
  ASSERT_OK(f);
  EXPECT_TRUE(S_ISREG(f->st_mode));
  EXPECT_EQ(f->st_size, 5);

  EXPECT_ERRNO(backend_->Stat(c_, P("/missing")), ENOENT);
  EXPECT_ERRNO(backend_->Stat(c_, P("/missing/x")), ENOENT);
  EXPECT_ERRNO(backend_->Stat(c_, P("/f/x")), ENOTDIR);
}

TEST_F(LocalDirTest, StatDoesNotFollowFinalSymlinkButFollowsParents) {
  ASSERT_EQ(mkdir(Host("dir").c_str(), 0755), 0);
  MakeFile("/dir/f", "abc");
  ASSERT_EQ(symlink("dir", Host("ldir").c_str()), 0);
  auto l = backend_->Stat(c_, P("/ldir"));
  ASSERT_OK(l);
  EXPECT_TRUE(S_ISLNK(l->st_mode));
  auto f = backend_->Stat(c_, P("/ldir/f"));
  ASSERT_OK(f);
  EXPECT_EQ(f->st_size, 3);
}

TEST_F(LocalDirTest, StatSymlinkLoopIsEloop) {
  ASSERT_EQ(symlink("loop", Host("loop").c_str()), 0);
  EXPECT_ERRNO(backend_->Stat(c_, P("/loop/x")), ELOOP);
}

// --- ReadDir
// ------------------------------------------------------------------

TEST_F(LocalDirTest, ReadDirListsEntriesWithTypes) {
  MakeFile("/file", "x");
  ASSERT_OK(backend_->Mkdir(c_, P("/dir"), 0755));
  ASSERT_OK(backend_->Symlink(c_, "file", P("/link")));
  ASSERT_OK(backend_->Mknod(c_, P("/fifo"), S_IFIFO | 0644, 0));
  auto entries = backend_->ReadDir(c_, Path());
  ASSERT_OK(entries);
  std::map<std::string, mode_t> types;
  for (const auto& e : *entries) {
    types[e.name] = e.type;
    EXPECT_NE(e.ino, 0u);
  }
  EXPECT_EQ(types.size(), 4u);
  EXPECT_EQ(types["file"], S_IFREG);
  EXPECT_EQ(types["dir"], S_IFDIR);
  EXPECT_EQ(types["link"], S_IFLNK);
  EXPECT_EQ(types["fifo"], S_IFIFO);

  auto empty = backend_->ReadDir(c_, P("/dir"));
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->empty());
}

TEST_F(LocalDirTest, ReadDirErrors) {
  MakeFile("/file", "x");
  EXPECT_ERRNO(backend_->ReadDir(c_, P("/file")), ENOTDIR);
  EXPECT_ERRNO(backend_->ReadDir(c_, P("/missing")), ENOENT);
  // A final symlink is not followed, even to a directory inside.
  ASSERT_OK(backend_->Mkdir(c_, P("/dir"), 0755));
  ASSERT_OK(backend_->Symlink(c_, "dir", P("/ldir")));
  EXPECT_ERRNO(backend_->ReadDir(c_, P("/ldir")), ENOTDIR);
}

// --- Open and file handles ---------------------------------------------------

TEST_F(LocalDirTest, CreateWriteReadRoundTrip) {
  auto h = backend_->Open(c_, P("/f"), O_CREAT | O_RDWR, 0600);
  ASSERT_OK(h);
  auto w = (*h)->Write("hello world", 11, 0);
  ASSERT_OK(w);
  EXPECT_EQ(*w, 11u);
  char buf[32] = {};
  auto r = (*h)->Read(buf, sizeof(buf), 6);
  ASSERT_OK(r);
  EXPECT_EQ(std::string(buf, *r), "world");
  auto eof = (*h)->Read(buf, sizeof(buf), 100);
  ASSERT_OK(eof);
  EXPECT_EQ(*eof, 0u);
  auto st = (*h)->Stat();
  ASSERT_OK(st);
  EXPECT_EQ(st->st_mode & 07777, 0600u);
  EXPECT_EQ(st->st_size, 11);
  EXPECT_EQ(ReadHostFile(Host("f")), "hello world");
}

TEST_F(LocalDirTest, OpenFlagSemantics) {
  MakeFile("/f", "0123456789");
  EXPECT_ERRNO(backend_->Open(c_, P("/f"), O_CREAT | O_EXCL | O_WRONLY, 0644),
               EEXIST);
  EXPECT_ERRNO(backend_->Open(c_, P("/missing"), O_RDONLY), ENOENT);
  EXPECT_ERRNO(backend_->Open(c_, P("/missing/f"), O_CREAT | O_WRONLY, 0644),
               ENOENT);
  EXPECT_ERRNO(backend_->Open(c_, P("/f/x"), O_RDONLY), ENOTDIR);
  EXPECT_ERRNO(backend_->Open(c_, P("/f"), O_PATH), EINVAL);
  EXPECT_ERRNO(backend_->Open(c_, P("/f"), O_RDWR | O_WRONLY), EINVAL);

  // O_CREAT on an existing file opens it without truncating.
  {
    auto h = backend_->Open(c_, P("/f"), O_CREAT | O_RDWR, 0644);
    ASSERT_OK(h);
    auto st = (*h)->Stat();
    ASSERT_OK(st);
    EXPECT_EQ(st->st_size, 10);
  }
  // O_APPEND writes at the end whatever the offset.
  {
    auto h = backend_->Open(c_, P("/f"), O_WRONLY | O_APPEND);
    ASSERT_OK(h);
    ASSERT_OK((*h)->Write("ab", 2, 0));
    ASSERT_OK((*h)->Write("cd", 2, 3));
  }
  EXPECT_EQ(ReadHostFile(Host("f")), "0123456789abcd");
  // O_TRUNC empties it.
  ASSERT_OK(backend_->Open(c_, P("/f"), O_WRONLY | O_TRUNC));
  EXPECT_EQ(ReadHostFile(Host("f")), "");
  // A read-only handle refuses writes.
  {
    auto h = backend_->Open(c_, P("/f"), O_RDONLY);
    ASSERT_OK(h);
    EXPECT_ERRNO((*h)->Write("x", 1, 0), EBADF);
  }
}

TEST_F(LocalDirTest, OpenDirectories) {
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  EXPECT_ERRNO(backend_->Open(c_, P("/d"), O_WRONLY), EISDIR);
  EXPECT_ERRNO(backend_->Open(c_, P("/d"), O_CREAT | O_WRONLY, 0644), EISDIR);
  auto h = backend_->Open(c_, P("/d"), O_RDONLY | O_DIRECTORY);
  ASSERT_OK(h);
  MakeFile("/f", "x");
  EXPECT_ERRNO(backend_->Open(c_, P("/f"), O_RDONLY | O_DIRECTORY), ENOTDIR);
}

TEST_F(LocalDirTest, OpenFollowsSymlinksInsideAndHonoursNofollow) {
  MakeFile("/target", "inside");
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  ASSERT_OK(backend_->Symlink(c_, "../target", P("/d/link")));
  EXPECT_EQ(ReadAll("/d/link"), "inside");
  EXPECT_ERRNO(backend_->Open(c_, P("/d/link"), O_RDONLY | O_NOFOLLOW), ELOOP);
  EXPECT_ERRNO(
      backend_->Open(c_, P("/d/link"), O_CREAT | O_EXCL | O_WRONLY, 0644),
      EEXIST);
  // O_CREAT through a dangling symlink creates its (inside) target.
  ASSERT_OK(backend_->Symlink(c_, "../made", P("/d/dangling")));
  ASSERT_OK(backend_->Open(c_, P("/d/dangling"), O_CREAT | O_WRONLY, 0644));
  struct stat st;
  EXPECT_EQ(lstat(Host("made").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST_F(LocalDirTest, OpenPassesODirectThrough) {
  MakeFile("/f", std::string(4096, 'x'));
  auto h = backend_->Open(c_, P("/f"), O_RDONLY | O_DIRECT);
  if (!h && h.error().code == EINVAL) GTEST_SKIP() << "no O_DIRECT on /tmp";
  ASSERT_OK(h);
  int fl = fcntl((*h)->NativeFd(), F_GETFL);
  EXPECT_TRUE(fl & O_DIRECT);
}

TEST_F(LocalDirTest, CreatedFilesBelongToTheCaller) {
  Caller agent = Caller::Local();
  agent.uid = 4321;
  agent.gid = 8765;
  ASSERT_OK(backend_->Open(agent, P("/f"), O_CREAT | O_WRONLY, 0644));
  ASSERT_OK(backend_->Mkdir(agent, P("/d"), 0755));
  ASSERT_OK(backend_->Symlink(agent, "f", P("/l")));
  ASSERT_OK(backend_->Mknod(agent, P("/p"), S_IFIFO | 0644, 0));
  for (const char* name : {"f", "d", "l", "p"}) {
    struct stat st;
    ASSERT_EQ(lstat(Host(name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_uid, 4321u) << name;
    EXPECT_EQ(st.st_gid, 8765u) << name;
  }
  // Opening an existing file does not change its owner.
  MakeFile("/mine", "x");
  ASSERT_OK(backend_->Open(agent, P("/mine"), O_CREAT | O_WRONLY, 0644));
  struct stat st;
  ASSERT_EQ(stat(Host("mine").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, geteuid());
  // Without a caller identity new files belong to the server.
  ASSERT_OK(backend_->Mkdir(c_, P("/srv"), 0755));
  ASSERT_EQ(stat(Host("srv").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, geteuid());
}

TEST_F(LocalDirTest, CreateThroughDanglingSymlinkGivesFileToCaller) {
  Caller agent = Caller::Local();
  agent.uid = 4321;
  agent.gid = 8765;
  ASSERT_OK(backend_->Symlink(c_, "made", P("/dl")));
  ASSERT_OK(backend_->Open(agent, P("/dl"), O_CREAT | O_WRONLY, 0644));
  struct stat st;
  ASSERT_EQ(lstat(Host("made").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_uid, 4321u);
  // Now the target exists: opening again changes no owner.
  Caller other = agent;
  other.uid = 1111;
  ASSERT_OK(backend_->Open(other, P("/dl"), O_CREAT | O_WRONLY, 0644));
  ASSERT_EQ(lstat(Host("made").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4321u);
}

// A FIFO opened for reading waits for a writer (and the other way round);
// a FIFO the sandbox made must never hold a daemon thread.
TEST_F(LocalDirTest, OpeningAFifoNeverBlocks) {
  ASSERT_EQ(mkfifo(Host("p").c_str(), 0666), 0);
  ASSERT_OK(backend_->Symlink(c_, "p", P("/l")));
  for (const char* name : {"/p", "/l"}) {
    for (int flags : {O_RDONLY, O_WRONLY, O_RDWR, O_WRONLY | O_CREAT,
                      O_WRONLY | O_CREAT | O_TRUNC}) {
      auto opened = std::async(std::launch::async, [&] {
        return backend_->Open(c_, P(name), flags, 0644);
      });
      if (opened.wait_for(std::chrono::seconds(3)) !=
          std::future_status::ready) {
        // Free the stuck thread: an O_RDWR open serves both ends.
        int fd = open(Host("p").c_str(), O_RDWR | O_NONBLOCK);
        opened.wait();
        if (fd >= 0) close(fd);
        ADD_FAILURE() << "open " << name << " flags " << flags << " blocked";
        continue;
      }
      EXPECT_ERRNO(opened.get(), ENXIO);
    }
  }
}

// Creating through a dangling symlink acts on the link's target as read
// from the pinned directory, never on whatever the name leads to a moment
// later: a file swapped in is never given to the caller.
TEST_F(LocalDirTest, CreatingThroughASwappedSymlinkNeverRechownsAFile) {
  ASSERT_EQ(
      [&] {
        std::ofstream(Host("victim")) << "secret\n";
        return chmod(Host("victim").c_str(), 0600);
      }(),
      0);
  ASSERT_EQ(symlink("missing", Host("x").c_str()), 0);
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    for (int i = 0; !stop; ++i) {
      const char* to = i % 2 ? "victim" : "missing";
      unlink(Host("x.n").c_str());
      if (symlink(to, Host("x.n").c_str()) == 0)
        rename(Host("x.n").c_str(), Host("x").c_str());
      unlink(Host("missing").c_str());
    }
  });
  Caller agent = Caller::Local();
  agent.uid = 4321;
  agent.gid = 8765;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  int opens = 0;
  struct stat st {};
  bool victim_ok = true;
  while (victim_ok && std::chrono::steady_clock::now() < until) {
    auto f = backend_->Open(agent, P("/x"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (f) ++opens;
    victim_ok = stat(Host("victim").c_str(), &st) == 0 && st.st_uid == 0 &&
                (st.st_mode & 07777) == 0600;
  }
  stop = true;
  swapper.join();
  EXPECT_TRUE(victim_ok) << "the swapped-in file was given to the caller: uid "
                         << st.st_uid << ", mode " << std::oct
                         << (st.st_mode & 07777);
  EXPECT_GT(opens, 0);
}

// mkdir, mknod and symlink make the new entry with the caller as owner in
// one step. Giving it away afterwards by name would give away whatever the
// agent put under that name in between: here the swapper exchanges the new
// node, the moment it exists, with a hard link of a root-owned file (for
// symlink and mknod), or renames a root-owned directory over it (mkdir).
TEST_F(LocalDirTest, MakingANodeNeverGivesAwayWhatWasSwappedOverIt) {
  ASSERT_EQ(
      [&] {
        std::ofstream(Host("victim")) << "secret\n";
        return chmod(Host("victim").c_str(), 0600);
      }(),
      0);
  ASSERT_EQ(mkdir(Host("vdir").c_str(), 0700), 0);
  std::ofstream(Host("vdir/keep")) << "keeps vdir non-empty\n";
  // O_PATH descriptors follow the inodes wherever the swapper moves them.
  int victim = open(Host("victim").c_str(), O_PATH);
  int vdir = open(Host("vdir").c_str(), O_PATH | O_DIRECTORY);
  ASSERT_GE(victim, 0);
  ASSERT_GE(vdir, 0);
  struct stat vdir_st {};
  ASSERT_EQ(fstat(vdir, &vdir_st), 0);
  Caller agent = Caller::Local();
  agent.uid = 4321;
  agent.gid = 8765;
  auto owned_by_root = [](int fd) {
    struct stat st {};
    return fstat(fd, &st) == 0 && st.st_uid == 0 && st.st_gid == 0;
  };
  auto exchange = [&](const char* a, const char* b) {
    renameat2(AT_FDCWD, Host(a).c_str(), AT_FDCWD, Host(b).c_str(),
              RENAME_EXCHANGE);
  };
  // For symlink and mknod "h" is the victim's second name; the new node
  // ends up as "n" or, swapped, as "h".
  auto relink = [&] {
    unlink(Host("n").c_str());
    unlink(Host("h").c_str());
    link(Host("victim").c_str(), Host("h").c_str());
  };
  struct Case {
    const char* what;
    std::function<vfs::Status()> make;
    std::function<void()> swap;
    std::function<void()> undo;
  };
  const Case cases[] = {
      {"symlink", [&] { return backend_->Symlink(agent, "t", P("/n")); },
       [&] { exchange("h", "n"); }, relink},
      {"mknod",
       [&] { return backend_->Mknod(agent, P("/n"), S_IFIFO | 0644, 0); },
       [&] { exchange("h", "n"); }, relink},
      // vdir is not empty, so it replaces the new, empty directory.
      {"mkdir", [&] { return backend_->Mkdir(agent, P("/n"), 0755); },
       [&] { rename(Host("vdir").c_str(), Host("n").c_str()); },
       [&] {
         struct stat st {};
         if (lstat(Host("n").c_str(), &st) == 0 && st.st_ino == vdir_st.st_ino)
           rename(Host("n").c_str(), Host("vdir").c_str());
         rmdir(Host("n").c_str());
       }},
  };
  for (const Case& k : cases) {
    // Each case starts from root-owned victims.
    ASSERT_EQ(fchownat(victim, "", 0, 0, AT_EMPTY_PATH), 0);
    ASSERT_EQ(fchownat(vdir, "", 0, 0, AT_EMPTY_PATH), 0);
    k.undo();
    std::atomic<bool> stop{false};
    // An exchange succeeds only while both names exist: right after the
    // backend made "n".
    std::thread swapper([&] {
      while (!stop) k.swap();
    });
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    int made = 0;
    bool ok = true;
    while (ok && std::chrono::steady_clock::now() < until) {
      if (k.make()) ++made;
      ok = owned_by_root(victim) && owned_by_root(vdir);
      k.undo();
    }
    stop = true;
    swapper.join();
    k.undo();
    EXPECT_TRUE(ok) << k.what
                    << ": a node swapped in for the new one was given to the "
                       "caller";
    EXPECT_GT(made, 0) << k.what;
    // Without a race the new node is the caller's, group included.
    ASSERT_OK(k.make());
    struct stat st {};
    ASSERT_EQ(lstat(Host("n").c_str(), &st), 0) << k.what;
    EXPECT_EQ(st.st_uid, 4321u) << k.what;
    EXPECT_EQ(st.st_gid, 8765u) << k.what;
    k.undo();
  }
  unlink(Host("h").c_str());
  close(victim);
  close(vdir);
}

TEST_F(LocalDirTest, CreatingThroughALinkThatClimbsOutIsRefused) {
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  ASSERT_OK(backend_->Symlink(c_, "../../outside/new", P("/d/up")));
  ASSERT_OK(backend_->Symlink(c_, "/tmp/agentvfs-abs-new", P("/abs")));
  EXPECT_ERRNO(backend_->Open(c_, P("/d/up"), O_CREAT | O_WRONLY, 0644),
               EACCES);
  EXPECT_ERRNO(backend_->Open(c_, P("/abs"), O_CREAT | O_WRONLY, 0644), EACCES);
  struct stat st;
  EXPECT_NE(lstat((outside_ + "/new").c_str(), &st), 0);
  EXPECT_NE(lstat("/tmp/agentvfs-abs-new", &st), 0);
  EXPECT_NE(lstat((base_ + "/new").c_str(), &st), 0);
  // A chain of links inside the root is followed, and a loop is ELOOP.
  ASSERT_OK(backend_->Symlink(c_, "../d/b", P("/d/a")));
  ASSERT_OK(backend_->Symlink(c_, "made", P("/d/b")));
  ASSERT_OK(backend_->Open(c_, P("/d/a"), O_CREAT | O_WRONLY, 0644));
  EXPECT_EQ(lstat(Host("d/made").c_str(), &st), 0);
  ASSERT_OK(backend_->Symlink(c_, "loop2", P("/loop1")));
  ASSERT_OK(backend_->Symlink(c_, "loop1", P("/loop2")));
  EXPECT_ERRNO(backend_->Open(c_, P("/loop1"), O_CREAT | O_WRONLY, 0644),
               ELOOP);
}

TEST_F(LocalDirTest, SetgidDirectoryGivesItsGroup) {
  ASSERT_OK(backend_->Mkdir(c_, P("/shared"), 0755));
  ASSERT_EQ(chown(Host("shared").c_str(), 0, 777), 0);
  ASSERT_EQ(chmod(Host("shared").c_str(), 02775), 0);
  Caller agent = Caller::Local();
  agent.uid = 4321;
  agent.gid = 8765;
  ASSERT_OK(backend_->Open(agent, P("/shared/f"), O_CREAT | O_WRONLY, 0644));
  ASSERT_OK(backend_->Mkdir(agent, P("/shared/d"), 0755));
  struct stat st;
  ASSERT_EQ(stat(Host("shared/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4321u);
  EXPECT_EQ(st.st_gid, 777u);
  ASSERT_EQ(stat(Host("shared/d").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4321u);
  EXPECT_EQ(st.st_gid, 777u);
  EXPECT_TRUE(st.st_mode & S_ISGID) << std::oct << st.st_mode;
}

TEST_F(LocalDirTest, HandleTruncateSyncAllocateNativeFd) {
  auto h = backend_->Open(c_, P("/f"), O_CREAT | O_RDWR, 0644);
  ASSERT_OK(h);
  ASSERT_OK((*h)->Write("0123456789", 10, 0));
  ASSERT_OK((*h)->Truncate(4));
  ASSERT_OK((*h)->Sync(false));
  ASSERT_OK((*h)->Sync(true));
  EXPECT_EQ(ReadHostFile(Host("f")), "0123");
  ASSERT_OK((*h)->Allocate(0, 0, 1 << 20));
  auto st = (*h)->Stat();
  ASSERT_OK(st);
  EXPECT_EQ(st->st_size, 1 << 20);
  EXPECT_ERRNO((*h)->Allocate(FALLOC_FL_PUNCH_HOLE, 0, 4096), EOPNOTSUPP);
  int fd = (*h)->NativeFd();
  ASSERT_GE(fd, 0);
  struct stat host;
  ASSERT_EQ(fstat(fd, &host), 0);
  EXPECT_EQ(host.st_ino, st->st_ino);
}

TEST_F(LocalDirTest, SparseFileBeyondFourGiB) {
  const off_t kOffset = off_t{5} << 30;
  auto h = backend_->Open(c_, P("/sparse"), O_CREAT | O_RDWR, 0644);
  ASSERT_OK(h);
  auto w = (*h)->Write("Z", 1, kOffset);
  ASSERT_OK(w);
  EXPECT_EQ(*w, 1u);
  char c = 0;
  auto r = (*h)->Read(&c, 1, kOffset);
  ASSERT_OK(r);
  ASSERT_EQ(*r, 1u);
  EXPECT_EQ(c, 'Z');
  auto zero = (*h)->Read(&c, 1, kOffset - 1);
  ASSERT_OK(zero);
  EXPECT_EQ(c, '\0');
  auto st = backend_->Stat(c_, P("/sparse"));
  ASSERT_OK(st);
  EXPECT_EQ(st->st_size, kOffset + 1);
  EXPECT_LT(st->st_blocks, 1024) << "the hole was written out";
}

TEST_F(LocalDirTest, NameMaxNames) {
  const std::string name(255, 'n');
  MakeFile("/" + name, "long");
  EXPECT_EQ(ReadAll("/" + name), "long");
  const std::string dir(255, 'd');
  ASSERT_OK(backend_->Mkdir(c_, P("/" + dir), 0755));
  MakeFile("/" + dir + "/" + name, "nested");
  EXPECT_EQ(ReadAll("/" + dir + "/" + name), "nested");
  auto entries = backend_->ReadDir(c_, Path());
  ASSERT_OK(entries);
  bool found = false;
  for (const auto& e : *entries) found |= e.name == name;
  EXPECT_TRUE(found);
}

TEST_F(LocalDirTest, DeepPathsNearPathMax) {
  std::string path;
  char letter = 'a';
  // Fifteen 255-byte directories (3840 bytes), then a 254-byte file name:
  // a 4095-byte path, the longest there is.
  while (path.size() + 256 <= 3840) {
    path += "/" + std::string(255, letter++);
    ASSERT_OK(backend_->Mkdir(c_, P(path), 0755));
  }
  const std::string file =
      path + "/" + std::string(4095 - path.size() - 1, 'f');
  ASSERT_EQ(file.size(), 4095u);
  MakeFile(file, "bottom");
  auto st = backend_->Stat(c_, P(file));
  ASSERT_OK(st);
  EXPECT_EQ(st->st_size, 6);
  EXPECT_EQ(ReadAll(file), "bottom");
  auto entries = backend_->ReadDir(c_, P(path));
  ASSERT_OK(entries);
  EXPECT_EQ(entries->size(), 1u);
  ASSERT_OK(backend_->Chmod(c_, P(file), 0600));
  ASSERT_OK(backend_->Truncate(c_, P(file), 3));
  EXPECT_EQ(ReadAll(file), "bot");
  ASSERT_OK(backend_->Unlink(c_, P(file)));
  EXPECT_ERRNO(backend_->Stat(c_, P(file)), ENOENT);
}

// --- Mkdir, Mknod, Unlink, Rmdir
// -----------------------------------------------

TEST_F(LocalDirTest, MkdirAndErrors) {
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0700));
  struct stat st;
  ASSERT_EQ(stat(Host("d").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_ERRNO(backend_->Mkdir(c_, P("/d"), 0755), EEXIST);
  EXPECT_ERRNO(backend_->Mkdir(c_, Path(), 0755), EEXIST);
  EXPECT_ERRNO(backend_->Mkdir(c_, P("/no/d"), 0755), ENOENT);
  MakeFile("/f", "");
  EXPECT_ERRNO(backend_->Mkdir(c_, P("/f/d"), 0755), ENOTDIR);
  // A dangling symlink occupies the name; mkdir does not follow it.
  ASSERT_OK(backend_->Symlink(c_, "nowhere", P("/dl")));
  EXPECT_ERRNO(backend_->Mkdir(c_, P("/dl"), 0755), EEXIST);
  EXPECT_NE(lstat(Host("nowhere").c_str(), &st), 0);
}

TEST_F(LocalDirTest, MknodFifoButNoDevices) {
  ASSERT_OK(backend_->Mknod(c_, P("/fifo"), S_IFIFO | 0600, 0));
  auto st = backend_->Stat(c_, P("/fifo"));
  ASSERT_OK(st);
  EXPECT_TRUE(S_ISFIFO(st->st_mode));
  EXPECT_ERRNO(backend_->Mknod(c_, P("/fifo"), S_IFIFO | 0600, 0), EEXIST);
  EXPECT_ERRNO(backend_->Mknod(c_, P("/null"), S_IFCHR | 0666, makedev(1, 3)),
               EPERM);
  EXPECT_ERRNO(backend_->Mknod(c_, P("/sda"), S_IFBLK | 0666, makedev(8, 0)),
               EPERM);
  struct stat host;
  EXPECT_NE(lstat(Host("null").c_str(), &host), 0);
}

TEST_F(LocalDirTest, DeviceNodesPlacedByTheHostAreNotOpened) {
  ASSERT_EQ(mknod(Host("null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  EXPECT_ERRNO(backend_->Open(c_, P("/null"), O_RDONLY), EACCES);
  EXPECT_ERRNO(backend_->Open(c_, P("/null"), O_CREAT | O_WRONLY, 0644),
               EACCES);
  EXPECT_ERRNO(backend_->Truncate(c_, P("/null"), 0), EACCES);
  // They can still be seen and removed.
  EXPECT_OK(backend_->Stat(c_, P("/null")));
  EXPECT_OK(backend_->Unlink(c_, P("/null")));
}

TEST_F(LocalDirTest, UnlinkAndErrors) {
  MakeFile("/f", "x");
  ASSERT_OK(backend_->Unlink(c_, P("/f")));
  EXPECT_ERRNO(backend_->Stat(c_, P("/f")), ENOENT);
  EXPECT_ERRNO(backend_->Unlink(c_, P("/f")), ENOENT);
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  EXPECT_ERRNO(backend_->Unlink(c_, P("/d")), EISDIR);
  EXPECT_ERRNO(backend_->Unlink(c_, Path()), EISDIR);
}

TEST_F(LocalDirTest, RmdirAndErrors) {
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  MakeFile("/d/f", "x");
  EXPECT_ERRNO(backend_->Rmdir(c_, P("/d")), ENOTEMPTY);
  EXPECT_ERRNO(backend_->Rmdir(c_, P("/d/f")), ENOTDIR);
  ASSERT_OK(backend_->Unlink(c_, P("/d/f")));
  ASSERT_OK(backend_->Rmdir(c_, P("/d")));
  EXPECT_ERRNO(backend_->Rmdir(c_, P("/d")), ENOENT);
  EXPECT_ERRNO(backend_->Rmdir(c_, Path()), EBUSY);
  // A symlink to a directory is not a directory to rmdir.
  ASSERT_OK(backend_->Mkdir(c_, P("/real"), 0755));
  ASSERT_OK(backend_->Symlink(c_, "real", P("/lreal")));
  EXPECT_ERRNO(backend_->Rmdir(c_, P("/lreal")), ENOTDIR);
  EXPECT_OK(backend_->Stat(c_, P("/real")));
}

// --- Symlink, Readlink, Link -------------------------------------------------

TEST_F(LocalDirTest, SymlinkStoresTargetVerbatim) {
  for (const std::string& target :
       std::vector<std::string>{"plain", "../../../etc/shadow", "/etc/passwd",
                                std::string(4000, 'x')}) {
    ASSERT_OK(backend_->Symlink(c_, target, P("/l")));
    auto got = backend_->Readlink(c_, P("/l"));
    ASSERT_OK(got);
    EXPECT_EQ(*got, target);
    ASSERT_OK(backend_->Unlink(c_, P("/l")));
  }
  ASSERT_OK(backend_->Symlink(c_, "x", P("/l")));
  EXPECT_ERRNO(backend_->Symlink(c_, "y", P("/l")), EEXIST);
  EXPECT_ERRNO(backend_->Symlink(c_, "y", P("/no/l")), ENOENT);
  MakeFile("/f", "x");
  EXPECT_ERRNO(backend_->Readlink(c_, P("/f")), EINVAL);
  EXPECT_ERRNO(backend_->Readlink(c_, P("/missing")), ENOENT);
  EXPECT_ERRNO(backend_->Readlink(c_, Path()), EINVAL);
}

TEST_F(LocalDirTest, HardLinks) {
  MakeFile("/f", "data");
  ASSERT_OK(backend_->Link(c_, P("/f"), P("/g")));
  auto st = backend_->Stat(c_, P("/g"));
  ASSERT_OK(st);
  EXPECT_EQ(st->st_nlink, 2u);
  EXPECT_EQ(ReadAll("/g"), "data");
  EXPECT_ERRNO(backend_->Link(c_, P("/f"), P("/g")), EEXIST);
  EXPECT_ERRNO(backend_->Link(c_, P("/missing"), P("/h")), ENOENT);
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  EXPECT_ERRNO(backend_->Link(c_, P("/d"), P("/d2")), EPERM);
  EXPECT_ERRNO(backend_->Link(c_, Path(), P("/r")), EPERM);
  // A symlink is linked itself, not its target.
  ASSERT_OK(backend_->Symlink(c_, "f", P("/l")));
  ASSERT_OK(backend_->Link(c_, P("/l"), P("/l2")));
  auto l2 = backend_->Stat(c_, P("/l2"));
  ASSERT_OK(l2);
  EXPECT_TRUE(S_ISLNK(l2->st_mode));
}

// --- Rename
// ---------------------------------------------------------------------

TEST_F(LocalDirTest, RenameVariants) {
  MakeFile("/a", "A");
  MakeFile("/b", "B");
  ASSERT_OK(backend_->Rename(c_, P("/a"), P("/c"), 0));
  EXPECT_ERRNO(backend_->Stat(c_, P("/a")), ENOENT);
  EXPECT_EQ(ReadAll("/c"), "A");
  EXPECT_ERRNO(backend_->Rename(c_, P("/c"), P("/b"), RENAME_NOREPLACE),
               EEXIST);
  ASSERT_OK(backend_->Rename(c_, P("/c"), P("/b"), RENAME_EXCHANGE));
  EXPECT_EQ(ReadAll("/b"), "A");
  EXPECT_EQ(ReadAll("/c"), "B");
  ASSERT_OK(backend_->Rename(c_, P("/c"), P("/b"), 0));  // replaces
  EXPECT_EQ(ReadAll("/b"), "B");
  EXPECT_ERRNO(backend_->Rename(c_, P("/missing"), P("/x"), 0), ENOENT);
  EXPECT_ERRNO(backend_->Rename(c_, P("/b"), P("/x"), RENAME_WHITEOUT), EINVAL);
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  EXPECT_ERRNO(backend_->Rename(c_, P("/d"), P("/d/sub"), 0), EINVAL);
  MakeFile("/d/f", "x");
  ASSERT_OK(backend_->Mkdir(c_, P("/e"), 0755));
  ASSERT_OK(backend_->Mkdir(c_, P("/e/full"), 0755));
  MakeFile("/e/full/x", "x");
  EXPECT_ERRNO(backend_->Rename(c_, P("/d"), P("/e/full"), 0), ENOTEMPTY);
  ASSERT_OK(backend_->Rename(c_, P("/d/f"), P("/e/moved"), 0));
  EXPECT_EQ(ReadAll("/e/moved"), "x");
  EXPECT_ERRNO(backend_->Rename(c_, Path(), P("/r"), 0), EBUSY);
  EXPECT_ERRNO(backend_->Rename(c_, P("/b"), Path(), 0), EBUSY);
}

// --- Chmod, Chown, Utimens, Truncate, StatFs
// ------------------------------------

TEST_F(LocalDirTest, ChmodFilesDirsAndRootButNotSymlinks) {
  MakeFile("/f", "x");
  ASSERT_OK(backend_->Chmod(c_, P("/f"), 0640));
  struct stat st;
  ASSERT_EQ(stat(Host("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ASSERT_OK(backend_->Chmod(c_, P("/f"), 04755));
  ASSERT_EQ(stat(Host("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  ASSERT_OK(backend_->Chmod(c_, Path(), 0711));
  ASSERT_EQ(stat(root_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0711u);
  ASSERT_OK(backend_->Symlink(c_, "f", P("/l")));
  EXPECT_ERRNO(backend_->Chmod(c_, P("/l"), 0600), EOPNOTSUPP);
  ASSERT_EQ(stat(Host("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  EXPECT_ERRNO(backend_->Chmod(c_, P("/missing"), 0600), ENOENT);
}

TEST_F(LocalDirTest, ChownAndKeep) {
  MakeFile("/f", "x");
  ASSERT_OK(backend_->Chown(c_, P("/f"), 1234, 5678));
  struct stat st;
  ASSERT_EQ(stat(Host("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 5678u);
  ASSERT_OK(backend_->Chown(c_, P("/f"), vfs::kKeepUid, 42));
  ASSERT_EQ(stat(Host("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 42u);
  ASSERT_OK(backend_->Chown(c_, Path(), vfs::kKeepUid, vfs::kKeepGid));
  ASSERT_OK(backend_->Chown(c_, Path(), 77, vfs::kKeepGid));
  ASSERT_EQ(stat(root_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 77u);
  EXPECT_ERRNO(backend_->Chown(c_, P("/missing"), 1, 1), ENOENT);
}

TEST_F(LocalDirTest, UtimensSetsNowAndOmits) {
  MakeFile("/f", "x");
  struct timespec times[2] = {{1000, 5}, {2000, 7}};
  ASSERT_OK(backend_->Utimens(c_, P("/f"), times));
  auto st = backend_->Stat(c_, P("/f"));
  ASSERT_OK(st);
  EXPECT_EQ(st->st_atim.tv_sec, 1000);
  EXPECT_EQ(st->st_atim.tv_nsec, 5);
  EXPECT_EQ(st->st_mtim.tv_sec, 2000);
  EXPECT_EQ(st->st_mtim.tv_nsec, 7);
  struct timespec now_omit[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
  ASSERT_OK(backend_->Utimens(c_, P("/f"), now_omit));
  st = backend_->Stat(c_, P("/f"));
  ASSERT_OK(st);
  EXPECT_GT(st->st_atim.tv_sec, 1000000000);
  EXPECT_EQ(st->st_mtim.tv_sec, 2000);
  ASSERT_OK(backend_->Utimens(c_, Path(), times));
  st = backend_->Stat(c_, Path());
  ASSERT_OK(st);
  EXPECT_EQ(st->st_mtim.tv_sec, 2000);
  EXPECT_ERRNO(backend_->Utimens(c_, P("/missing"), times), ENOENT);
}

TEST_F(LocalDirTest, TruncatePath) {
  MakeFile("/f", "0123456789");
  ASSERT_OK(backend_->Truncate(c_, P("/f"), 3));
  EXPECT_EQ(ReadHostFile(Host("f")), "012");
  ASSERT_OK(backend_->Truncate(c_, P("/f"), 5));
  EXPECT_EQ(ReadHostFile(Host("f")), std::string("012\0\0", 5));
  // Follows a final symlink that stays inside, like truncate(2).
  ASSERT_OK(backend_->Symlink(c_, "f", P("/l")));
  ASSERT_OK(backend_->Truncate(c_, P("/l"), 1));
  EXPECT_EQ(ReadHostFile(Host("f")), "0");
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  EXPECT_ERRNO(backend_->Truncate(c_, P("/d"), 0), EISDIR);
  EXPECT_ERRNO(backend_->Truncate(c_, P("/missing"), 0), ENOENT);
  ASSERT_OK(backend_->Mknod(c_, P("/fifo"), S_IFIFO | 0644, 0));
  EXPECT_ERRNO(backend_->Truncate(c_, P("/fifo"), 0), EINVAL);
  EXPECT_ERRNO(backend_->Truncate(c_, P("/f"), -1), EINVAL);
}

TEST_F(LocalDirTest, StatFs) {
  auto sv = backend_->StatFs(c_, Path());
  ASSERT_OK(sv);
  EXPECT_GT(sv->f_bsize, 0u);
  EXPECT_GT(sv->f_blocks, 0u);
  EXPECT_ERRNO(backend_->StatFs(c_, P("/missing")), ENOENT);
}

// --- Xattrs
// ---------------------------------------------------------------------

TEST_F(LocalDirTest, XattrRoundTrip) {
  MakeFile("/f", "x");
  ASSERT_OK(backend_->SetXattr(c_, P("/f"), "user.a", "value", 0));
  ASSERT_OK(backend_->SetXattr(c_, P("/f"), "user.b", std::string(1, '\0'), 0));
  auto a = backend_->GetXattr(c_, P("/f"), "user.a");
  ASSERT_OK(a);
  EXPECT_EQ(*a, "value");
  auto b = backend_->GetXattr(c_, P("/f"), "user.b");
  ASSERT_OK(b);
  EXPECT_EQ(*b, std::string(1, '\0'));
  auto names = backend_->ListXattr(c_, P("/f"));
  ASSERT_OK(names);
  EXPECT_NE(std::find(names->begin(), names->end(), "user.a"), names->end());
  EXPECT_NE(std::find(names->begin(), names->end(), "user.b"), names->end());
  EXPECT_ERRNO(backend_->SetXattr(c_, P("/f"), "user.a", "v", XATTR_CREATE),
               EEXIST);
  EXPECT_ERRNO(backend_->SetXattr(c_, P("/f"), "user.c", "v", XATTR_REPLACE),
               ENODATA);
  ASSERT_OK(backend_->RemoveXattr(c_, P("/f"), "user.a"));
  EXPECT_ERRNO(backend_->GetXattr(c_, P("/f"), "user.a"), ENODATA);
  EXPECT_ERRNO(backend_->RemoveXattr(c_, P("/f"), "user.a"), ENODATA);
  EXPECT_ERRNO(backend_->GetXattr(c_, P("/missing"), "user.a"), ENOENT);
  // The root works too.
  ASSERT_OK(backend_->SetXattr(c_, Path(), "user.root", "r", 0));
  auto r = backend_->GetXattr(c_, Path(), "user.root");
  ASSERT_OK(r);
  EXPECT_EQ(*r, "r");
  char host[8] = {};
  EXPECT_EQ(getxattr(root_.c_str(), "user.root", host, sizeof(host)), 1);
}

TEST_F(LocalDirTest, PrivilegedXattrsCannotBeSet) {
  MakeFile("/f", "x");
  EXPECT_ERRNO(backend_->SetXattr(c_, P("/f"), "security.capability",
                                  std::string(20, '\xff'), 0),
               EPERM);
  EXPECT_ERRNO(backend_->SetXattr(c_, P("/f"), "trusted.x", "v", 0), EPERM);
  EXPECT_ERRNO(backend_->RemoveXattr(c_, P("/f"), "security.selinux"), EPERM);
  char buf[64];
  EXPECT_LT(
      getxattr(Host("f").c_str(), "security.capability", buf, sizeof(buf)), 0);
  // POSIX ACLs: the host would enforce them on the sandbox's own view.
  const char acl[] = {2, 0, 0,  0,  1,  0,  6,  0, -1, -1, -1, -1, 4,  0,
                      4, 0, -1, -1, -1, -1, 32, 0, 4,  0,  -1, -1, -1, -1};
  EXPECT_ERRNO(backend_->SetXattr(c_, P("/f"), "system.posix_acl_access",
                                  std::string(acl, sizeof(acl)), 0),
               EOPNOTSUPP);
  EXPECT_LT(
      getxattr(Host("f").c_str(), "system.posix_acl_access", buf, sizeof(buf)),
      0);
  EXPECT_ERRNO(backend_->RemoveXattr(c_, P("/f"), "system.posix_acl_access"),
               EOPNOTSUPP);
}

TEST_F(LocalDirTest, OpenWithOCreatOfADirectoryIsEisdir) {
  ASSERT_OK(backend_->Mkdir(c_, P("/d"), 0755));
  EXPECT_ERRNO(backend_->Open(c_, P("/d"), O_CREAT | O_RDONLY, 0644), EISDIR);
  EXPECT_ERRNO(backend_->Open(c_, P("/d"), O_CREAT | O_WRONLY, 0644), EISDIR);
  EXPECT_OK(backend_->Open(c_, P("/d"), O_RDONLY | O_DIRECTORY, 0));
}

TEST_F(LocalDirTest, XattrOnSymlinkActsOnTheLinkItself) {
  MakeFile("/f", "x");
  ASSERT_OK(backend_->Symlink(c_, "f", P("/l")));
  // Linux refuses user.* on symlinks; the point is that /f is untouched.
  EXPECT_FALSE(backend_->SetXattr(c_, P("/l"), "user.a", "v", 0).has_value());
  EXPECT_ERRNO(backend_->GetXattr(c_, P("/f"), "user.a"), ENODATA);
}

// --- Escapes
// ----------------------------------------------------------------------

// Plants the links an agent would use to get out, and records the state of
// everything outside so that each test can prove nothing changed.
class LocalDirEscapeTest : public LocalDirTest {
 protected:
  void SetUp() override {
    LocalDirTest::SetUp();
    if (HasFatalFailure()) return;
    WriteHostFile(outside_ + "/sentinel", "secret\n");
    ASSERT_EQ(chmod((outside_ + "/sentinel").c_str(), 0640), 0);
    ASSERT_EQ(mkdir((outside_ + "/subdir").c_str(), 0755), 0);
    WriteHostFile(outside_ + "/subdir/inner", "inner\n");
    ASSERT_EQ(symlink("sentinel", (outside_ + "/olink").c_str()), 0);
    ASSERT_EQ(
        setxattr((outside_ + "/sentinel").c_str(), "user.keep", "1", 1, 0), 0);

    WriteHostFile(Host("file"), "inside\n");
    ASSERT_EQ(mkdir(Host("inner").c_str(), 0755), 0);
    ASSERT_EQ(symlink(outside_.c_str(), Host("esc").c_str()), 0);
    ASSERT_EQ(symlink("../../..", Host("up").c_str()), 0);
    ASSERT_EQ(symlink("..", Host("dotdot").c_str()), 0);
    ASSERT_EQ(symlink("../outside", Host("reldir").c_str()), 0);
    ASSERT_EQ(symlink("../../outside", Host("inner/deep").c_str()), 0);
    ASSERT_EQ(symlink("/", Host("slash").c_str()), 0);
    ASSERT_EQ(symlink((outside_ + "/sentinel").c_str(), Host("abs").c_str()),
              0);
    ASSERT_EQ(symlink("../outside/sentinel", Host("rel").c_str()), 0);
    ASSERT_EQ(symlink("/etc/passwd", Host("passwd").c_str()), 0);
    ASSERT_EQ(symlink("../outside/newfile", Host("dangling").c_str()), 0);
    ASSERT_EQ(
        symlink((outside_ + "/newfile2").c_str(), Host("dangling_abs").c_str()),
        0);
    // A chain: hop1 -> hop2 -> outside.
    ASSERT_EQ(symlink("hop2", Host("hop1").c_str()), 0);
    ASSERT_EQ(symlink("inner/../../outside", Host("hop2").c_str()), 0);

    before_ = Snapshot(base_ + "/outside");
    passwd_before_ = LstatHost("/etc/passwd");
    passwd_content_ = ReadHostFile("/etc/passwd");
  }

  void ExpectOutsideUnchanged() {
    EXPECT_EQ(Snapshot(base_ + "/outside"), before_);
    EXPECT_EQ(LstatHost("/etc/passwd"), passwd_before_);
    EXPECT_EQ(ReadHostFile("/etc/passwd"), passwd_content_);
    struct stat st;
    EXPECT_NE(lstat((base_ + "/stolen").c_str(), &st), 0);
  }

  // Directory paths that each lead to `outside/` through a symlink.
  std::vector<std::string> OutsideDirs() const {
    return {"/esc",           "/reldir",     "/dotdot/outside",
            "/up" + outside_, "/inner/deep", "/slash" + outside_,
            "/hop1"};
  }

  std::vector<std::string> before_;
  std::string passwd_before_;
  std::string passwd_content_;
};

// Each call must fail with one of `allowed`.
#define EXPECT_DENIED(expr, ...)                                              \
  do {                                                                        \
    const auto& _r = (expr);                                                  \
    if (_r.has_value()) {                                                     \
      ADD_FAILURE() << #expr << " succeeded through an escaping symlink";     \
    } else {                                                                  \
      std::vector<int> _allowed = {__VA_ARGS__};                              \
      EXPECT_NE(std::find(_allowed.begin(), _allowed.end(), _r.error().code), \
                _allowed.end())                                               \
          << #expr << ": " << _r.error().ToString();                          \
    }                                                                         \
  } while (0)

TEST_F(LocalDirEscapeTest, EveryOperationThroughAnEscapingDirectoryFails) {
  const timespec times[2] = {{1, 0}, {1, 0}};
  for (const std::string& d : OutsideDirs()) {
    SCOPED_TRACE(d);
    const Path s = P(d + "/sentinel");
    const Path n = P(d + "/new");
    EXPECT_DENIED(backend_->Stat(c_, s), EACCES);
    EXPECT_DENIED(backend_->Stat(c_, P(d + "/subdir/inner")), EACCES);
    EXPECT_DENIED(backend_->ReadDir(c_, P(d)), EACCES, ENOTDIR);
    EXPECT_DENIED(backend_->ReadDir(c_, P(d + "/subdir")), EACCES);
    EXPECT_DENIED(backend_->Open(c_, s, O_RDONLY), EACCES);
    EXPECT_DENIED(backend_->Open(c_, s, O_WRONLY | O_TRUNC), EACCES);
    EXPECT_DENIED(backend_->Open(c_, s, O_RDWR | O_APPEND), EACCES);
    EXPECT_DENIED(backend_->Open(c_, s, O_CREAT | O_WRONLY | O_TRUNC, 0644),
                  EACCES);
    EXPECT_DENIED(backend_->Open(c_, n, O_CREAT | O_WRONLY, 0644), EACCES);
    EXPECT_DENIED(backend_->Open(c_, n, O_CREAT | O_EXCL | O_WRONLY, 0644),
                  EACCES);
    EXPECT_DENIED(backend_->Mkdir(c_, n, 0755), EACCES);
    EXPECT_DENIED(backend_->Mknod(c_, n, S_IFIFO | 0644, 0), EACCES);
    EXPECT_DENIED(backend_->Unlink(c_, s), EACCES);
    EXPECT_DENIED(backend_->Unlink(c_, P(d + "/olink")), EACCES);
    EXPECT_DENIED(backend_->Rmdir(c_, P(d + "/subdir")), EACCES);
    EXPECT_DENIED(backend_->Symlink(c_, "x", n), EACCES);
    EXPECT_DENIED(backend_->Readlink(c_, P(d + "/olink")), EACCES);
    EXPECT_DENIED(backend_->Link(c_, s, P("/stolen")), EACCES);
    EXPECT_DENIED(backend_->Link(c_, P("/file"), n), EACCES);
    EXPECT_DENIED(backend_->Rename(c_, s, P("/stolen"), 0), EACCES);
    EXPECT_DENIED(backend_->Rename(c_, P("/file"), n, 0), EACCES);
    EXPECT_DENIED(backend_->Rename(c_, P("/file"), s, RENAME_EXCHANGE), EACCES);
    EXPECT_DENIED(backend_->Rename(c_, P("/file"), s, 0), EACCES);
    EXPECT_DENIED(backend_->Chmod(c_, s, 0777), EACCES);
    EXPECT_DENIED(backend_->Chmod(c_, P(d + "/subdir"), 0777), EACCES);
    EXPECT_DENIED(backend_->Chown(c_, s, 1234, 1234), EACCES);
    EXPECT_DENIED(backend_->Utimens(c_, s, times), EACCES);
    EXPECT_DENIED(backend_->Truncate(c_, s, 0), EACCES);
    EXPECT_DENIED(backend_->StatFs(c_, s), EACCES);
    EXPECT_DENIED(backend_->GetXattr(c_, s, "user.keep"), EACCES);
    EXPECT_DENIED(backend_->ListXattr(c_, s), EACCES);
    EXPECT_DENIED(backend_->SetXattr(c_, s, "user.evil", "1", 0), EACCES);
    EXPECT_DENIED(backend_->RemoveXattr(c_, s, "user.keep"), EACCES);
  }
  // The planted files inside are still there, untouched.
  EXPECT_EQ(ReadHostFile(Host("file")), "inside\n");
  ExpectOutsideUnchanged();
}

TEST_F(LocalDirEscapeTest, FollowingOperationsOnEscapingFileLinksFail) {
  // /etc/passwd is only ever read here: a regression must not be able to
  // damage the host running the tests. Our own outside/sentinel (behind /abs
  // and /rel) takes the destructive attempts.
  EXPECT_DENIED(backend_->Open(c_, P("/passwd"), O_RDONLY), EACCES);
  EXPECT_DENIED(backend_->StatFs(c_, P("/passwd")), EACCES);
  for (const std::string& f :
       std::vector<std::string>{"/abs", "/rel", "/dangling", "/dangling_abs"}) {
    SCOPED_TRACE(f);
    const Path p = P(f);
    EXPECT_DENIED(backend_->Open(c_, p, O_RDONLY), EACCES);
    EXPECT_DENIED(backend_->Open(c_, p, O_WRONLY | O_TRUNC), EACCES);
    EXPECT_DENIED(backend_->Open(c_, p, O_CREAT | O_WRONLY, 0644), EACCES);
    EXPECT_DENIED(backend_->Open(c_, p, O_CREAT | O_RDWR | O_TRUNC, 0600),
                  EACCES);
    EXPECT_DENIED(backend_->Truncate(c_, p, 0), EACCES);
    EXPECT_DENIED(backend_->StatFs(c_, p), EACCES);
    // With O_EXCL the link itself counts as existing.
    EXPECT_DENIED(backend_->Open(c_, p, O_CREAT | O_EXCL | O_WRONLY, 0644),
                  EEXIST);
    // Intermediate use of a file link.
    EXPECT_DENIED(backend_->Stat(c_, P(f + "/x")), EACCES, ENOTDIR, ENOENT);
  }
  ExpectOutsideUnchanged();
}

TEST_F(LocalDirEscapeTest, OperationsOnTheLinkItselfActOnTheLink) {
  // Stat and Readlink see the link.
  auto st = backend_->Stat(c_, P("/abs"));
  ASSERT_OK(st);
  EXPECT_TRUE(S_ISLNK(st->st_mode));
  auto target = backend_->Readlink(c_, P("/abs"));
  ASSERT_OK(target);
  EXPECT_EQ(*target, outside_ + "/sentinel");
  auto dirst = backend_->Stat(c_, P("/esc"));
  ASSERT_OK(dirst);
  EXPECT_TRUE(S_ISLNK(dirst->st_mode));

  // Chmod refuses symlinks rather than changing the target.
  EXPECT_ERRNO(backend_->Chmod(c_, P("/abs"), 0777), EOPNOTSUPP);
  EXPECT_ERRNO(backend_->Chmod(c_, P("/esc"), 0777), EOPNOTSUPP);
  EXPECT_ERRNO(backend_->Chmod(c_, P("/rel"), 0777), EOPNOTSUPP);

  // Chown and Utimens change the link.
  ASSERT_OK(backend_->Chown(c_, P("/abs"), 1234, 5678));
  struct stat link;
  ASSERT_EQ(lstat(Host("abs").c_str(), &link), 0);
  EXPECT_EQ(link.st_uid, 1234u);
  EXPECT_EQ(link.st_gid, 5678u);
  ASSERT_OK(backend_->Chown(c_, P("/esc"), 1234, 5678));
  ASSERT_OK(backend_->Chown(c_, P("/rel"), 1234, 5678));
  const timespec times[2] = {{1, 0}, {2, 0}};
  ASSERT_OK(backend_->Utimens(c_, P("/abs"), times));
  ASSERT_OK(backend_->Utimens(c_, P("/esc"), times));
  ASSERT_OK(backend_->Utimens(c_, P("/rel"), times));
  ASSERT_EQ(lstat(Host("abs").c_str(), &link), 0);
  EXPECT_EQ(link.st_mtim.tv_sec, 2);

  // Xattrs address the link (Linux refuses user.* on symlinks).
  EXPECT_FALSE(
      backend_->SetXattr(c_, P("/abs"), "user.evil", "1", 0).has_value());
  EXPECT_FALSE(backend_->RemoveXattr(c_, P("/abs"), "user.keep").has_value());
  EXPECT_ERRNO(backend_->GetXattr(c_, P("/abs"), "user.keep"), ENODATA);

  // Mkdir/Symlink/Mknod over the link name: it exists.
  EXPECT_ERRNO(backend_->Mkdir(c_, P("/esc"), 0755), EEXIST);
  EXPECT_ERRNO(backend_->Symlink(c_, "x", P("/dangling")), EEXIST);
  EXPECT_ERRNO(backend_->Mknod(c_, P("/dangling"), S_IFIFO | 0644, 0), EEXIST);
  // Rmdir of a link to a directory does not remove the directory.
  EXPECT_ERRNO(backend_->Rmdir(c_, P("/esc")), ENOTDIR);
  // ReadDir does not follow it.
  EXPECT_ERRNO(backend_->ReadDir(c_, P("/esc")), ENOTDIR);

  // Hard-linking and renaming move the link, not the target.
  ASSERT_OK(backend_->Link(c_, P("/abs"), P("/abs_hard")));
  ASSERT_OK(backend_->Rename(c_, P("/abs"), P("/abs_moved"), 0));
  ASSERT_OK(backend_->Rename(c_, P("/esc"), P("/file"), RENAME_EXCHANGE));
  auto swapped = backend_->Stat(c_, P("/file"));
  ASSERT_OK(swapped);
  EXPECT_TRUE(S_ISLNK(swapped->st_mode));
  ASSERT_OK(backend_->Rename(c_, P("/esc"), P("/file"), RENAME_EXCHANGE));

  // Unlink removes links only.
  ASSERT_OK(backend_->Unlink(c_, P("/abs_moved")));
  ASSERT_OK(backend_->Unlink(c_, P("/abs_hard")));
  ASSERT_OK(backend_->Unlink(c_, P("/passwd")));
  ASSERT_OK(backend_->Unlink(c_, P("/esc")));
  ASSERT_OK(backend_->Unlink(c_, P("/up")));
  struct stat host;
  EXPECT_NE(lstat(Host("passwd").c_str(), &host), 0);
  EXPECT_EQ(stat("/etc/passwd", &host), 0);
  ExpectOutsideUnchanged();
}

TEST_F(LocalDirEscapeTest, RenamedLinkStillCannotBeUsedToEscape) {
  // Moving an escaping link deeper does not make it work.
  ASSERT_OK(backend_->Rename(c_, P("/reldir"), P("/inner/reldir"), 0));
  EXPECT_DENIED(backend_->Stat(c_, P("/inner/reldir/sentinel")), EACCES,
                ENOENT);
  ASSERT_OK(backend_->Symlink(c_, "../..", P("/inner/twoup")));
  EXPECT_DENIED(backend_->Open(c_, P("/inner/twoup/outside/sentinel"),
                               O_WRONLY | O_TRUNC),
                EACCES);
  ExpectOutsideUnchanged();
}

// One thread keeps exchanging a real directory inside the root with a symlink
// to the outside directory while others operate on paths beneath it. Whatever
// the interleaving, every operation lands inside or fails.
TEST_F(LocalDirEscapeTest, SwappingADirectoryForALinkNeverLeaksOut) {
  ASSERT_EQ(mkdir(Host("d").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(Host("d/subdir").c_str(), 0755), 0);
  WriteHostFile(Host("d/sentinel"), "decoy\n");
  ASSERT_EQ(symlink(outside_.c_str(), Host("l").c_str()), 0);
  ASSERT_EQ(mkdir(Host("p").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(Host("p/q").c_str(), 0755), 0);
  ASSERT_EQ(symlink("../../outside", Host("pl").c_str()), 0);

  std::atomic<bool> stop{false};
  std::atomic<long> swaps{0};
  std::atomic<long> inside_ok{0};
  int root_fd = open(root_.c_str(), O_PATH | O_DIRECTORY);
  ASSERT_GE(root_fd, 0);
  std::thread swapper([&] {
    while (!stop.load()) {
      if (renameat2(root_fd, "d", root_fd, "l", RENAME_EXCHANGE) == 0) ++swaps;
      // A relative link one level down, swapped with its sibling too.
      int p = openat(root_fd, "p", O_PATH | O_DIRECTORY | O_NOFOLLOW);
      if (p >= 0) {
        renameat2(p, "q", root_fd, "pl", RENAME_EXCHANGE);
        close(p);
      }
    }
  });
  auto worker = [&](int id) {
    const timespec times[2] = {{1, 0}, {1, 0}};
    for (int i = 0; !stop.load(); ++i) {
      for (const std::string& d : {std::string("/d"), std::string("/p/q")}) {
        const std::string n =
            d + "/w" + std::to_string(id) + "_" + std::to_string(i % 8);
        auto h = backend_->Open(c_, P(n), O_CREAT | O_WRONLY, 0644);
        if (h) {
          ++inside_ok;
          (void)(*h)->Write("x", 1, 0);
        }
        h = backend_->Open(c_, P(d + "/sentinel"), O_WRONLY | O_TRUNC);
        (void)backend_->Stat(c_, P(d + "/sentinel"));
        (void)backend_->Chmod(c_, P(d + "/sentinel"), 0777);
        (void)backend_->Chmod(c_, P(d + "/subdir"), 0700);
        (void)backend_->Chown(c_, P(d + "/sentinel"), 99, 99);
        (void)backend_->Utimens(c_, P(d + "/sentinel"), times);
        (void)backend_->Truncate(c_, P(d + "/sentinel"), 0);
        (void)backend_->SetXattr(c_, P(d + "/sentinel"), "user.evil", "1", 0);
        (void)backend_->RemoveXattr(c_, P(d + "/sentinel"), "user.keep");
        (void)backend_->Mkdir(c_, P(d + "/newdir"), 0755);
        (void)backend_->Rmdir(c_, P(d + "/subdir"));
        (void)backend_->Mkdir(c_, P(d + "/subdir"), 0755);
        (void)backend_->Symlink(c_, "x", P(d + "/newlink"));
        (void)backend_->Link(c_, P(d + "/sentinel"), P("/stolen_hard"));
        (void)backend_->Unlink(c_, P("/stolen_hard"));
        (void)backend_->Rename(c_, P(d + "/sentinel"), P("/stolen_move"), 0);
        (void)backend_->Rename(c_, P("/stolen_move"), P(d + "/sentinel"), 0);
        (void)backend_->Unlink(c_, P(d + "/sentinel"));
        (void)backend_->Unlink(c_, P(n));
        (void)backend_->Unlink(c_, P(d + "/newlink"));
        (void)backend_->Rmdir(c_, P(d + "/newdir"));
        MakeFileQuietly(d + "/sentinel");
      }
    }
  };
  std::vector<std::thread> workers;
  for (int id = 0; id < 3; ++id) workers.emplace_back(worker, id);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  stop = true;
  for (auto& t : workers) t.join();
  swapper.join();
  close(root_fd);

  EXPECT_GT(swaps.load(), 100);
  EXPECT_GT(inside_ok.load(), 0) << "no operation ever reached the inside";
  ExpectOutsideUnchanged();
}

}  // namespace
}  // namespace agentvfs::backends
