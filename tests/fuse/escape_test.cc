// The workspace is writable by the sandbox, which can replace any directory
// with a symlink at any moment. Whatever the sandbox does, the daemon (root)
// must never touch a file outside the workspace. These tests race the swap
// against a stream of operations through the mount and then check that a
// directory beside the workspace is exactly as it was.
//
// The planted symlinks are relative (`../outside`): through the view the
// kernel resolves them inside the view, where no `outside` exists, so a
// reader following them gets ENOENT. Any change to the host's outside
// directory can therefore only have been made by the daemon, through a node
// it had cached for `d` while `d` was swapped for the symlink.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "tests/fuse/fuse_test_support.h"

namespace agentvfs::fuse_test {
namespace {

// What must not change about a file outside the workspace.
struct Snapshot {
  mode_t mode;
  uid_t uid;
  gid_t gid;
  off_t size;
  timespec mtime, ctime;
  std::string content;
  bool operator==(const Snapshot& o) const {
    return mode == o.mode && uid == o.uid && gid == o.gid && size == o.size &&
           mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec &&
           ctime.tv_sec == o.ctime.tv_sec && ctime.tv_nsec == o.ctime.tv_nsec &&
           content == o.content;
  }
};

std::ostream& operator<<(std::ostream& os, const Snapshot& s) {
  return os << "{mode " << std::oct << s.mode << std::dec << ", owner " << s.uid
            << ":" << s.gid << ", size " << s.size << ", mtime "
            << s.mtime.tv_sec << "." << s.mtime.tv_nsec << ", ctime "
            << s.ctime.tv_sec << "." << s.ctime.tv_nsec << ", content \""
            << s.content.substr(0, 40) << "\"}";
}

// Every entry of `dir` (not recursive) and `dir` itself (key ".").
std::map<std::string, Snapshot> SnapshotDir(const std::string& dir) {
  std::map<std::string, Snapshot> out;
  auto add = [&](const std::string& key, const std::string& path) {
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) return;
    Snapshot s{st.st_mode, st.st_uid,  st.st_gid, st.st_size,
               st.st_mtim, st.st_ctim, ""};
    if (S_ISREG(st.st_mode))
      s.content = ReadFile(path).value_or("<unreadable>");
    out[key] = s;
  };
  add(".", dir);
  for (const auto& name : ListDir(dir).value_or(std::vector<std::string>{})) {
    add(name, dir + "/" + name);
  }
  return out;
}

class EscapeTest : public FuseViewTest {
 protected:
  void SetUp() override {
    ASSERT_EQ(mkdir(Beside("outside").c_str(), 0755), 0);
    // Same names as inside d/, so an escaped path would hit a real file.
    ASSERT_TRUE(WriteFile(Beside("outside/f"), "outside f", 0640));
    ASSERT_TRUE(WriteFile(Beside("outside/secret"), "top secret", 0600));
    ASSERT_EQ(mkdir(Beside("outside/sub").c_str(), 0700), 0);
    ASSERT_EQ(mkdir(Beside("outside/empty").c_str(), 0700), 0);
    ASSERT_EQ(mkdir(Host("d").c_str(), 0755), 0);
    ASSERT_TRUE(WriteFile(Host("d/f"), "inside f", 0644));
    ASSERT_EQ(mkdir(Host("d/sub").c_str(), 0755), 0);
    // Make the outside's times distinguishable from "now".
    struct timeval old[2] = {{1000000000, 0}, {1000000000, 0}};
    for (const char* rel :
         {"outside/f", "outside/secret", "outside/sub", "outside/empty"}) {
      ASSERT_EQ(utimes(Beside(rel).c_str(), old), 0);
    }
    before_ = SnapshotDir(Beside("outside"));
    before_sub_ = SnapshotDir(Beside("outside/sub"));
  }

  void ExpectOutsideUntouched() {
    auto after = SnapshotDir(Beside("outside"));
    EXPECT_EQ(after.size(), before_.size());
    for (const auto& [name, snap] : after) {
      auto it = before_.find(name);
      if (it == before_.end()) {
        ADD_FAILURE() << "the daemon created outside/" << name << ": " << snap;
        continue;
      }
      EXPECT_EQ(snap, it->second) << "outside/" << name << " changed";
    }
    for (const auto& [name, snap] : before_) {
      EXPECT_TRUE(after.count(name)) << "the daemon removed outside/" << name;
    }
    EXPECT_EQ(SnapshotDir(Beside("outside/sub")), before_sub_);
  }

  std::map<std::string, Snapshot> before_, before_sub_;
};

// Every kind of operation the daemon performs on a path below `d`, by one
// thread; errors are expected while `d` is a symlink and are ignored.
void Hammer(const std::string& d, int id, const std::atomic<bool>& stop,
            std::atomic<long>* ok, std::atomic<long>* failed) {
  const std::string t = std::to_string(id);
  const std::string f = d + "/f", sub = d + "/sub";
  auto count = [&](bool success) { (success ? *ok : *failed)++; };
  for (long i = 0; !stop.load(); ++i) {
    const std::string n = d + "/new" + t + "_" + std::to_string(i % 4);
    const std::string m = d + "/moved" + t;
    struct stat st;
    int fd = open(f.c_str(), O_RDWR | O_CLOEXEC);
    count(fd >= 0);
    if (fd >= 0) {
      count(pwrite(fd, "X", 1, 0) == 1);
      count(ftruncate(fd, 5 + i % 3) == 0);
      close(fd);
    }
    fd = open(n.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    count(fd >= 0);
    if (fd >= 0) {
      count(write(fd, "new", 3) == 3);
      close(fd);
    }
    count(stat(f.c_str(), &st) == 0);
    count(chmod(f.c_str(), (i & 1) ? 0600 : 0644) == 0);
    count(chown(f.c_str(), 0, (i & 1) ? 1 : 0) == 0);
    count(truncate(f.c_str(), 7) == 0);
    count(utimes(f.c_str(), nullptr) == 0);
    count(setxattr(f.c_str(), "user.escape", "x", 1, 0) == 0);
    count(rename(n.c_str(), m.c_str()) == 0);
    count(link(m.c_str(), (m + "l").c_str()) == 0);
    count(unlink((m + "l").c_str()) == 0);
    count(unlink(m.c_str()) == 0);
    count(symlink("target", (d + "/ln" + t).c_str()) == 0);
    count(unlink((d + "/ln" + t).c_str()) == 0);
    count(mkdir((sub + "/dir" + t).c_str(), 0755) == 0);
    count(rmdir((sub + "/dir" + t).c_str()) == 0);
    count(ListDir(d).has_value());
    // Names that exist only outside.
    count(truncate((d + "/secret").c_str(), 0) == 0);
    count(unlink((d + "/secret").c_str()) == 0);
    count(rmdir((d + "/empty").c_str()) == 0);
  }
}

// Swaps `d` with the symlink `dlink -> ../outside` (atomically, so `d` is
// always one or the other) until `stop`, and leaves `d` a directory.
void Swap(const std::string& ws, const std::atomic<bool>& stop,
          std::atomic<long>* swaps) {
  const std::string d = ws + "/d", link = ws + "/dlink";
  while (!stop.load()) {
    if (renameat2(AT_FDCWD, d.c_str(), AT_FDCWD, link.c_str(),
                  RENAME_EXCHANGE) == 0) {
      (*swaps)++;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200 + *swaps % 500));
  }
  struct stat st;
  if (lstat(d.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    renameat2(AT_FDCWD, d.c_str(), AT_FDCWD, link.c_str(), RENAME_EXCHANGE);
  }
}

class EscapeRaceTest : public EscapeTest,
                       public ::testing::WithParamInterface<const char*> {};

TEST_P(EscapeRaceTest, SwappingADirectoryForASymlinkNeverReachesOutside) {
  ASSERT_EQ(symlink("../outside", Host("dlink").c_str()), 0);
  ASSERT_TRUE(Mount({"--cache-timeout", GetParam(), "--xattr"}));
  // Let the kernel cache the node of `d` as a directory.
  struct stat st;
  ASSERT_EQ(stat(View("d/f").c_str(), &st), 0) << std::strerror(errno);

  std::atomic<bool> stop{false};
  std::atomic<long> ok{0}, failed{0}, swaps{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(Hammer, View("d"), i, std::cref(stop), &ok, &failed);
  }
  threads.emplace_back(Swap, Host(), std::cref(stop), &swaps);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop = true;
  for (auto& t : threads) t.join();

  // The race happened: operations both succeeded and failed.
  EXPECT_GT(swaps.load(), 100);
  EXPECT_GT(ok.load(), 0);
  EXPECT_GT(failed.load(), 0);
  ExpectOutsideUntouched();

  // Once what the kernel cached expires, the workspace's own `d` is served
  // again: the daemon's node table survived the race.
  ASSERT_EQ(lstat(Host("d").c_str(), &st), 0);
  ASSERT_TRUE(S_ISDIR(st.st_mode));
  int err = -1;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    err = OpenErrno(View("d/f"), O_RDWR);
    if (err == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_ERRNO_EQ(err, 0) << "view/workspace/d/f stays unusable";
  EXPECT_ERRNO_EQ(ErrnoOf(stat(View("d/sub").c_str(), &st)), 0);
  EXPECT_EQ(view_->Stop(), 0) << view_->Log();
}

// 0: the kernel asks the daemon about `d` on every access; 2: it keeps
// using the node it cached while the host swaps the name under it.
INSTANTIATE_TEST_SUITE_P(CacheTimeouts, EscapeRaceTest,
                         ::testing::Values("0", "2"), [](const auto& info) {
                           return std::string("timeout_") + info.param;
                         });

TEST_F(EscapeTest, RelativeSymlinkOutOfTheWorkspaceLeadsNowhere) {
  ASSERT_EQ(symlink("../outside/secret", Host("esc").c_str()), 0);
  ASSERT_EQ(symlink("../outside", Host("escdir").c_str()), 0);
  ASSERT_EQ(
      symlink("../../../../../../../../outside/secret", Host("deep").c_str()),
      0);
  ASSERT_TRUE(Mount());
  for (const char* rel : {"esc", "escdir/secret", "deep"}) {
    SCOPED_TRACE(rel);
    EXPECT_EQ(ReadFile(View(rel)), std::nullopt);
    EXPECT_ERRNO_EQ(OpenErrno(View(rel), O_RDONLY), ENOENT);
    EXPECT_ERRNO_EQ(OpenErrno(View(rel), O_WRONLY | O_TRUNC), ENOENT);
  }
  // Creating through the dangling link would make view/outside/secret, which
  // the view's root refuses.
  EXPECT_NE(OpenErrno(View("esc"), O_WRONLY | O_CREAT), 0);
  // The links themselves are shown as they are.
  char target[256] = {};
  ASSERT_GT(readlink(View("esc").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "../outside/secret");
  ExpectOutsideUntouched();
}

}  // namespace
}  // namespace agentvfs::fuse_test
