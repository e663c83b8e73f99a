// Live invalidation through a real mount: a backend's change feed
// (Backend::SetChangeListener) reaches the kernel through the router and
// FuseServer, so a change made behind the mount shows at once although the
// kernel may cache names and attributes for a day.
//
// The view runs in this process (a FuseServer on a thread) over a Router
// whose /workspace is a LocalDirBackend wrapped in FiringBackend, which
// forwards every call and lets the test report a change the way the store's
// poller will. Each test first checks that the mount still shows the old
// state after the host changed (the kernel cached it), then fires the change
// and expects the new state within 1 s: without the notifications it would
// stay hidden for the whole cache timeout.
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "backends/local_dir/local_dir.h"
#include "router/router.h"
#include "tests/fuse/fuse_test_support.h"
#include "vfs/fuse/fuse_frontend.h"

namespace agentvfs::fuse_test {
namespace {

using vfs::Attr;
using vfs::Caller;
using vfs::Path;
using vfs::Result;
using vfs::Status;

constexpr double kDay = 86400;

// Forwards every call to `inner` and remembers the change listener, so that
// Fire() can report a change as a backend with a change feed would.
class FiringBackend final : public vfs::Backend {
 public:
  explicit FiringBackend(std::unique_ptr<vfs::Backend> inner)
      : inner_(std::move(inner)) {}

  void SetChangeListener(vfs::ChangeListener* listener) override {
    std::lock_guard lock(mu_);
    listener_ = listener;
  }
  bool HasListener() const {
    std::lock_guard lock(mu_);
    return listener_ != nullptr;
  }
  // Reports that `path` (relative to this backend's root) changed. Holding
  // mu_ meanwhile is what makes SetChangeListener(nullptr) final.
  void Fire(std::string_view path) {
    auto p = Path::Parse(path);
    ASSERT_TRUE(p.has_value()) << path;
    std::lock_guard lock(mu_);
    if (listener_ != nullptr) listener_->Changed(*p);
  }

  Result<Attr> Stat(const Caller& c, const Path& p) override {
    std::function<void(const Path&)> hook;
    {
      std::lock_guard lock(mu_);
      hook = before_stat_;
    }
    if (hook) hook(p);
    return inner_->Stat(c, p);
  }
  // `hook` runs before every Stat from now on.
  void BeforeStat(std::function<void(const Path&)> hook) {
    std::lock_guard lock(mu_);
    before_stat_ = std::move(hook);
  }
  Result<std::vector<vfs::DirEntry>> ReadDir(const Caller& c,
                                             const Path& p) override {
    return inner_->ReadDir(c, p);
  }
  Result<std::unique_ptr<vfs::FileHandle>> Open(const Caller& c, const Path& p,
                                                int flags,
                                                mode_t mode) override {
    return inner_->Open(c, p, flags, mode);
  }
  Status Mkdir(const Caller& c, const Path& p, mode_t mode) override {
    return inner_->Mkdir(c, p, mode);
  }
  Status Mknod(const Caller& c, const Path& p, mode_t mode,
               dev_t rdev) override {
    return inner_->Mknod(c, p, mode, rdev);
  }
  Status Unlink(const Caller& c, const Path& p) override {
    return inner_->Unlink(c, p);
  }
  Status Rmdir(const Caller& c, const Path& p) override {
    return inner_->Rmdir(c, p);
  }
  Status Symlink(const Caller& c, const std::string& target,
                 const Path& link) override {
    return inner_->Symlink(c, target, link);
  }
  Result<std::string> Readlink(const Caller& c, const Path& p) override {
    return inner_->Readlink(c, p);
  }
  Status Link(const Caller& c, const Path& from, const Path& to) override {
    return inner_->Link(c, from, to);
  }
  Status Rename(const Caller& c, const Path& from, const Path& to,
                unsigned flags) override {
    return inner_->Rename(c, from, to, flags);
  }
  Status Chmod(const Caller& c, const Path& p, mode_t mode) override {
    return inner_->Chmod(c, p, mode);
  }
  Status Chown(const Caller& c, const Path& p, uid_t uid, gid_t gid) override {
    return inner_->Chown(c, p, uid, gid);
  }
  Status Utimens(const Caller& c, const Path& p,
                 const struct timespec times[2]) override {
    return inner_->Utimens(c, p, times);
  }
  Status Truncate(const Caller& c, const Path& p, off_t size) override {
    return inner_->Truncate(c, p, size);
  }
  Result<struct statvfs> StatFs(const Caller& c, const Path& p) override {
    return inner_->StatFs(c, p);
  }
  Result<std::string> GetXattr(const Caller& c, const Path& p,
                               const std::string& name) override {
    return inner_->GetXattr(c, p, name);
  }
  Status SetXattr(const Caller& c, const Path& p, const std::string& name,
                  const std::string& value, int flags) override {
    return inner_->SetXattr(c, p, name, value, flags);
  }
  Result<std::vector<std::string>> ListXattr(const Caller& c,
                                             const Path& p) override {
    return inner_->ListXattr(c, p);
  }
  Status RemoveXattr(const Caller& c, const Path& p,
                     const std::string& name) override {
    return inner_->RemoveXattr(c, p, name);
  }

 private:
  std::unique_ptr<vfs::Backend> inner_;
  mutable std::mutex mu_;  // guards listener_ (held while calling it)
  vfs::ChangeListener* listener_ = nullptr;
  std::function<void(const Path&)> before_stat_;  // guarded by mu_
};

// A FuseServer serving `backend` on a thread of this process. Destruction
// always unmounts: `fusermount3 -u` makes the kernel end the connection,
// which ends the loop (a lazy unmount is the fallback); then the loop thread
// is joined and the server destroyed. Should the test binary exit without
// running it, UnmountAtExit() unmounts.
class InProcessMount {
 public:
  static std::unique_ptr<InProcessMount> Start(vfs::Backend& backend,
                                               fuse::FuseOptions options,
                                               std::string* error) {
    const std::string mountpoint = options.mountpoint;
    auto server = fuse::FuseServer::Mount(backend, std::move(options));
    if (!server) {
      *error = server.error().ToString();
      return nullptr;
    }
    testing::UnmountAtExit(mountpoint);
    auto m = std::unique_ptr<InProcessMount>(new InProcessMount);
    m->mountpoint_ = mountpoint;
    m->server_ = std::move(*server);
    m->loop_ = std::thread([s = m->server_.get(), ended = &m->ended_] {
      if (auto ok = s->Run(); !ok)
        ADD_FAILURE() << "FUSE loop: " << ok.error().ToString();
      ended->store(true);
    });
    return m;
  }

  fuse::FuseServer& server() { return *server_; }
  // Whether Run() returned within `limit`.
  bool EndsWithin(std::chrono::milliseconds limit) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!ended_.load()) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  ~InProcessMount() {
    if (testing::MountedView::IsMounted(mountpoint_)) {
      testing::RunCommand({"fusermount3", "-u", mountpoint_},
                          {.timeout = std::chrono::seconds(10)});
    }
    if (testing::MountedView::IsMounted(mountpoint_)) {
      ADD_FAILURE() << "fusermount3 -u " << mountpoint_ << " failed";
      testing::LazyUnmount(mountpoint_);
    }
    loop_.join();
    server_->Unmount();
    server_.reset();
  }
  InProcessMount(const InProcessMount&) = delete;
  InProcessMount& operator=(const InProcessMount&) = delete;

 private:
  InProcessMount() = default;

  std::string mountpoint_;
  std::unique_ptr<fuse::FuseServer> server_;
  std::thread loop_;
  std::atomic<bool> ended_{false};
};

// Polls `shows` every 10 ms for up to 1 s (the promise: a change reported
// by the feed is visible within 1 second).
::testing::AssertionResult ShowsWithinOneSecond(
    const std::function<bool()>& shows) {
  const auto start = std::chrono::steady_clock::now();
  const auto limit = start + std::chrono::seconds(1);
  while (true) {
    if (shows()) return ::testing::AssertionSuccess();
    if (std::chrono::steady_clock::now() >= limit) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ::testing::AssertionFailure() << "still the old state after 1 s";
}

// 0 when `path` exists (lstat), else errno.
int StatErrno(const std::string& path) {
  struct stat st;
  return ErrnoOf(lstat(path.c_str(), &st));
}

off_t SizeOf(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// Permission bits ("0644"), or "?" when lstat fails.
std::string ModeOf(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 ? Octal(st.st_mode) : "?";
}

class InvalidationTest : public ::testing::Test {
 protected:
  InvalidationTest() {
    mkdir(root_.Sub("ws").c_str(), 0755);
    mkdir(root_.Sub("mnt").c_str(), 0755);
  }

  // Mounts ROOT/ws as /workspace at ROOT/mnt, caching everything for a day.
  ::testing::AssertionResult Mount() {
    auto local = backends::LocalDirBackend::Open(root_.Sub("ws"));
    if (!local) return ::testing::AssertionFailure() << local.error().message;
    ws_ = static_cast<FiringBackend*>(
        router_.Adopt(std::make_unique<FiringBackend>(std::move(*local))));
    if (auto ok = router_.Mount("/workspace", ws_); !ok)
      return ::testing::AssertionFailure() << ok.error().message;
    fuse::FuseOptions options;
    options.mountpoint = root_.Sub("mnt");
    options.entry_timeout = kDay;
    options.attr_timeout = kDay;
    options.negative_timeout = kDay;
    // The page cache must be the kernel's for these tests to mean anything:
    // passed through, workspace reads go to the host file and see every
    // change at once.
    options.passthrough = false;
    options.identity = Caller::Local();
    std::string error;
    mount_ = InProcessMount::Start(router_, options, &error);
    if (mount_ == nullptr) return ::testing::AssertionFailure() << error;
    return ::testing::AssertionSuccess();
  }

  std::string View(const std::string& rel) const {
    return root_.Sub("mnt/workspace/" + rel);
  }
  std::string Host(const std::string& rel) const {
    return root_.Sub("ws/" + rel);
  }

  testing::TempDir root_{"agentvfs-inval"};
  router::Router router_;
  FiringBackend* ws_ = nullptr;            // owned by router_
  std::unique_ptr<InProcessMount> mount_;  // destroyed first
};

TEST_F(InvalidationTest, ContentChangeOfTheSameSizeShowsAfterChanged) {
  ASSERT_TRUE(WriteFile(Host("f.txt"), "version 1"));
  ASSERT_TRUE(Mount());
  ASSERT_EQ(ReadFile(View("f.txt")), "version 1");

  ASSERT_TRUE(WriteFile(Host("f.txt"), "version 2"));  // same inode, size
  ASSERT_EQ(ReadFile(View("f.txt")), "version 1")
      << "the kernel did not keep the page cache; this test proves nothing";

  ws_->Fire("/f.txt");
  EXPECT_TRUE(ShowsWithinOneSecond(
      [&] { return ReadFile(View("f.txt")) == "version 2"; }));
}

// Only reads check the old state: a read marks the cached atime stale, so
// the kernel would fetch all attributes again for the next stat().
TEST_F(InvalidationTest, ContentChangeOfAnotherSizeShowsAfterChanged) {
  ASSERT_TRUE(WriteFile(Host("f.txt"), "short"));
  ASSERT_TRUE(Mount());
  ASSERT_EQ(ReadFile(View("f.txt")), "short");

  ASSERT_TRUE(WriteFile(Host("f.txt"), "a good deal longer"));
  ASSERT_EQ(ReadFile(View("f.txt")), "short")
      << "the kernel did not keep size and pages; this test proves nothing";

  ws_->Fire("/f.txt");
  EXPECT_TRUE(ShowsWithinOneSecond([&] {
    return ReadFile(View("f.txt")) == "a good deal longer" &&
           SizeOf(View("f.txt")) == 18;
  }));
}

TEST_F(InvalidationTest, AttributeChangeShowsAfterChanged) {
  ASSERT_TRUE(WriteFile(Host("f.txt"), "x", 0644));
  ASSERT_TRUE(Mount());
  ASSERT_EQ(ModeOf(View("f.txt")), "0644");

  ASSERT_EQ(chmod(Host("f.txt").c_str(), 0600), 0);
  ASSERT_EQ(ModeOf(View("f.txt")), "0644")
      << "the kernel did not cache attributes; this test proves nothing";

  ws_->Fire("/f.txt");
  EXPECT_TRUE(
      ShowsWithinOneSecond([&] { return ModeOf(View("f.txt")) == "0600"; }));
}

TEST_F(InvalidationTest, FileCreatedAfterANegativeLookupShowsAfterChanged) {
  ASSERT_TRUE(Mount());
  ASSERT_ERRNO_EQ(StatErrno(View("new.txt")), ENOENT);

  ASSERT_TRUE(WriteFile(Host("new.txt"), "fresh"));
  ASSERT_ERRNO_EQ(StatErrno(View("new.txt")), ENOENT)
      << "the kernel did not cache the missing name; this test proves nothing";

  ws_->Fire("/new.txt");
  EXPECT_TRUE(ShowsWithinOneSecond(
      [&] { return ReadFile(View("new.txt")) == "fresh"; }));
}

// The kernel knows only that "d" is missing; the change names d/x, two
// levels below the deepest directory it has.
TEST_F(InvalidationTest, TreeCreatedUnderAMissingDirectoryShowsAfterChanged) {
  ASSERT_TRUE(Mount());
  ASSERT_ERRNO_EQ(StatErrno(View("d/x")), ENOENT);

  ASSERT_EQ(mkdir(Host("d").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(Host("d/x"), "deep"));
  ASSERT_ERRNO_EQ(StatErrno(View("d/x")), ENOENT)
      << "the kernel did not cache the missing name; this test proves nothing";

  ws_->Fire("/d/x");
  EXPECT_TRUE(
      ShowsWithinOneSecond([&] { return ReadFile(View("d/x")) == "deep"; }));
}

TEST_F(InvalidationTest, RemovedFileDisappearsAfterChanged) {
  ASSERT_TRUE(WriteFile(Host("gone.txt"), "here"));
  ASSERT_TRUE(Mount());
  ASSERT_EQ(StatErrno(View("gone.txt")), 0);  // looked up, not read (atime)

  ASSERT_EQ(unlink(Host("gone.txt").c_str()), 0);
  ASSERT_EQ(StatErrno(View("gone.txt")), 0)
      << "the kernel did not cache the entry; this test proves nothing";

  ws_->Fire("/gone.txt");
  EXPECT_TRUE(ShowsWithinOneSecond(
      [&] { return StatErrno(View("gone.txt")) == ENOENT; }));
}

// Many changes fired at once (duplicates among them) all arrive.
TEST_F(InvalidationTest, ABurstOfChangesAllShow) {
  constexpr int kFiles = 50;
  for (int i = 0; i < kFiles; ++i)
    ASSERT_TRUE(WriteFile(Host("f" + std::to_string(i)), "old"));
  ASSERT_TRUE(Mount());
  for (int i = 0; i < kFiles; ++i)
    ASSERT_EQ(ReadFile(View("f" + std::to_string(i))), "old");

  for (int i = 0; i < kFiles; ++i)
    ASSERT_TRUE(WriteFile(Host("f" + std::to_string(i)), "new"));
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < kFiles; ++i) ws_->Fire("/f" + std::to_string(i));

  EXPECT_TRUE(ShowsWithinOneSecond([&] {
    for (int i = 0; i < kFiles; ++i)
      if (ReadFile(View("f" + std::to_string(i))) != "new") return false;
    return true;
  }));
}

TEST_F(InvalidationTest, TheViewListensWhileServingAndStopsAtUnmount) {
  ASSERT_TRUE(WriteFile(Host("f.txt"), "x"));
  ASSERT_TRUE(Mount());
  ASSERT_EQ(ReadFile(View("f.txt")), "x");  // served, so Run() has started
  EXPECT_TRUE(ws_->HasListener());
  mount_.reset();
  EXPECT_FALSE(ws_->HasListener());
  ws_->Fire("/f.txt");  // reaches nobody
}

// FUSE's control filesystem at /sys/fs/fuse/connections, mounted for the
// test's lifetime when nothing had mounted it (as on Debian without
// systemd's sys-fs-fuse-connections.mount).
class FuseControl {
 public:
  static constexpr const char* kDir = "/sys/fs/fuse/connections";
  FuseControl() {
    if (testing::MountedView::IsMounted(kDir)) return;
    mounted_ = mount("fusectl", kDir, "fusectl", 0, nullptr) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~FuseControl() {
    if (mounted_) umount2(kDir, MNT_DETACH);
  }
  FuseControl(const FuseControl&) = delete;
  FuseControl& operator=(const FuseControl&) = delete;
  const std::string& error() const { return error_; }

 private:
  bool mounted_ = false;
  std::string error_;
};

// /sys/fs/fuse/connections/N of the mount at `mountpoint` ("" if unknown).
std::string ConnectionDir(const std::string& mountpoint) {
  struct stat st;
  if (stat(mountpoint.c_str(), &st) != 0 || major(st.st_dev) != 0) return "";
  return "/sys/fs/fuse/connections/" + std::to_string(minor(st.st_dev));
}

// Requests of the connection sent and not yet answered, or -1.
int Waiting(const std::string& conn) {
  std::ifstream in(conn + "/waiting");
  int n = -1;
  in >> n;
  return in ? n : -1;
}

// A stop may come while the invalidation thread's notification waits for a
// kernel lock that an unanswered request holds: a LOOKUP holds its
// directory until answered, and invalidating an entry there takes it. The
// loop has ended then, so the server must go on answering until the
// notification is through; before, Run() never returned (nor did the
// lookup), and the daemon hung at Ctrl-C. Staged: the loop is held inside
// one request (stat of "slow") while a second one (a lookup in "dir") waits
// behind it, the change of dir/y is fired, the stop signal (SIGTERM, whose
// handler FuseServer::HandleSignals installs) arrives, and the first request
// is let go.
TEST_F(InvalidationTest, AStopWhileANotificationWaitsForARequestEnds) {
  ASSERT_EQ(mkdir(Host("dir").c_str(), 0755), 0);
  std::mutex mu;
  std::condition_variable cv;
  bool held = false, release = false;
  ASSERT_TRUE(Mount());
  ws_->BeforeStat([&](const Path& p) {
    if (p.str() != "/slow") return;
    std::unique_lock lock(mu);
    held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  auto let_go = [&] {
    std::lock_guard lock(mu);
    release = true;
    cv.notify_all();
  };
  ASSERT_EQ(StatErrno(View("dir")), 0);  // the kernel knows dir
  FuseControl control;
  const std::string conn = ConnectionDir(root_.Sub("mnt"));
  ASSERT_NE(Waiting(conn), -1)
      << "no FUSE control files at " << conn << " " << control.error();
  ASSERT_TRUE(mount_->server().HandleSignals());

  std::thread slow([&] { StatErrno(View("slow")); });
  // From here on nothing returns early: the threads are joined at the end,
  // after the held request was let go.
  {
    std::unique_lock lock(mu);
    EXPECT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(5), [&] { return held; }));
  }
  std::atomic<int> lookup = -1;
  std::thread waiter([&] { lookup = StatErrno(View("dir/y")); });
  for (int i = 0; i < 500 && Waiting(conn) < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(Waiting(conn), 2) << "the lookup in dir was not sent";
  ws_->Fire("/dir/y");
  // Time for the notification to reach the kernel and wait for dir's lock.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(getpid(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  let_go();

  const bool ended = mount_->EndsWithin(std::chrono::seconds(10));
  EXPECT_TRUE(ended) << "Run() did not return after the stop signal";
  for (int i = 0; i < 500 && lookup.load() == -1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(lookup.load(), ENOENT) << "the waiting lookup was not answered";
  if (!ended || lookup.load() == -1) {
    // Abort the connection, which ends the request and the notification,
    // so that the threads end and the mount can be cleaned up.
    std::ofstream(conn + "/abort") << "1\n";
  }
  waiter.join();
  slow.join();
}

}  // namespace
}  // namespace agentvfs::fuse_test
