// The file tools on a full disk: an edit or a create that cannot be written
// whole leaves the file as it was (a host file in the workspace and a file
// of the store alike), commits no part of it, and a create that fails leaves
// no file behind, so the call can simply be made again. The disk is a real
// tmpfs of a few MiB, mounted for the test and always unmounted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fstream>

#include "backends/local_dir/local_dir.h"
#include "backends/store/admin.h"
#include "harness/file_tools.h"
#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"

namespace agentvfs::testing {
namespace {

using harness::FileTools;
using nlohmann::json;
using ::testing::HasSubstr;

// A tmpfs of `size` mounted on a new directory; unmounted when destroyed.
class SmallDisk {
 public:
  explicit SmallDisk(const std::string& size) {
    point_ = dir_.Sub("disk");
    mounted_ = mkdir(point_.c_str(), 0755) == 0 &&
               mount("tmpfs", point_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                     ("size=" + size).c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) umount2(point_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& path() const { return point_; }
  std::string Sub(const std::string& rel) const { return point_ + "/" + rel; }
  // Fills the disk until about `left` bytes are free (a file "filler").
  void FillLeaving(uint64_t left) {
    struct statvfs st;
    ASSERT_EQ(statvfs(point_.c_str(), &st), 0);
    uint64_t avail = uint64_t{st.f_bavail} * st.f_frsize;
    ASSERT_GT(avail, left);
    int fd = open(Sub("filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fallocate(fd, 0, 0, static_cast<off_t>(avail - left)), 0);
    close(fd);
  }
  void Free() { unlink(Sub("filler").c_str()); }

 private:
  TempDir dir_{"agentvfs-fulldisk"};
  std::string point_;
  bool mounted_ = false;
};

std::string Lines(int n, const std::string& what) {
  std::string s;
  for (int i = 1; i <= n; ++i)
    s += "line " + std::to_string(i) + " " + what + "\n";
  return s;
}

TEST(FullDiskTest, AWorkspaceFileKeepsItsContentWhenAnEditDoesNotFit) {
  SmallDisk disk("1m");
  if (!disk.mounted()) GTEST_SKIP() << "mounting a tmpfs needs root";
  router::Router view;
  auto local = backends::LocalDirBackend::Open(disk.path());
  ASSERT_TRUE(local.has_value());
  ASSERT_TRUE(view.Mount("/workspace", view.Adopt(std::move(*local))));
  vfs::Caller caller;
  caller.user = "agent";
  FileTools tools(view, caller);
  const std::string before = Lines(4000, "original");  // about 90 KiB
  { std::ofstream(disk.Sub("notes.txt")) << before; }
  disk.FillLeaving(12 << 10);

  // str_replace that grows the file by 64 KiB.
  auto r = tools.Editor({{"command", "str_replace"},
                         {"path", "/workspace/notes.txt"},
                         {"old_str", "line 2000 original\n"},
                         {"new_str", std::string(64 << 10, 'x') + "\n"}});
  EXPECT_TRUE(r.is_error) << r.text;
  EXPECT_THAT(r.text, HasSubstr("was left as it was"));
  EXPECT_EQ(ReadFile(disk.Sub("notes.txt")).value_or(""), before);
  // insert of as much.
  r = tools.Editor({{"command", "insert"},
                    {"path", "/workspace/notes.txt"},
                    {"insert_line", 10},
                    {"insert_text", std::string(64 << 10, 'y')}});
  EXPECT_TRUE(r.is_error) << r.text;
  EXPECT_EQ(ReadFile(disk.Sub("notes.txt")).value_or(""), before);
  // create over it: the old file stays whole, not truncated.
  r = tools.Editor({{"command", "create"},
                    {"path", "/workspace/notes.txt"},
                    {"file_text", Lines(8000, "new")}});
  EXPECT_TRUE(r.is_error) << r.text;
  EXPECT_THAT(r.text, HasSubstr("was left as it was"));
  EXPECT_EQ(ReadFile(disk.Sub("notes.txt")).value_or(""), before);
  // A new file that does not fit is not left behind.
  r = tools.Editor({{"command", "create"},
                    {"path", "/workspace/big.txt"},
                    {"file_text", Lines(8000, "new")}});
  EXPECT_TRUE(r.is_error) << r.text;
  EXPECT_THAT(r.text, HasSubstr("nothing was created"));
  EXPECT_NE(access(disk.Sub("big.txt").c_str(), F_OK), 0);

  // With room again, the same calls succeed.
  disk.Free();
  r = tools.Editor({{"command", "str_replace"},
                    {"path", "/workspace/notes.txt"},
                    {"old_str", "line 2000 original\n"},
                    {"new_str", "line 2000 changed\n"}});
  EXPECT_FALSE(r.is_error) << r.text;
  EXPECT_THAT(ReadFile(disk.Sub("notes.txt")).value_or(""),
              HasSubstr("line 1999 original\nline 2000 changed\nline 2001"));
}

TEST(FullDiskTest, AStoreFileGetsNoPartialVersionWhenAWriteDoesNotFit) {
  SmallDisk disk("8m");
  if (!disk.mounted()) GTEST_SKIP() << "mounting a tmpfs needs root";
  const std::string db = disk.Sub("s.db");
  ASSERT_TRUE(store::InitStore(db, "admin").has_value());
  auto backend = store::StoreBackend::Open(db);
  ASSERT_TRUE(backend.has_value()) << backend.error().message;
  store::StoreBackend* store = backend->get();
  router::Router view;
  vfs::Backend* b = view.Adopt(std::move(*backend));
  router::MountOptions mo;
  mo.strip_prefix = false;
  ASSERT_TRUE(view.Mount("/memories", b, mo));
  vfs::Caller caller;
  caller.user = "admin";
  caller.session = "s-full";
  FileTools tools(view, caller);
  const std::string kPath = "/memories/users/admin/m.md";
  ASSERT_FALSE(
      tools
          .Memory(
              {{"command", "create"}, {"path", kPath}, {"file_text", "keep\n"}})
          .is_error);
  auto versions = [&] {
    auto h = store->History(caller, *vfs::Path::Parse(kPath));
    return h ? h->size() : size_t{0};
  };
  const size_t had = versions();
  ASSERT_GE(had, 1u);
  disk.FillLeaving(300 << 10);

  const std::string big = Lines(60000, "too much for the disk");  // ~1.8 MiB
  auto r = tools.Editor(
      {{"command", "create"}, {"path", kPath}, {"file_text", big}});
  EXPECT_TRUE(r.is_error) << r.text;
  EXPECT_THAT(r.text, HasSubstr("was left as it was"));
  r = tools.Memory({{"command", "str_replace"},
                    {"path", kPath},
                    {"old_str", "keep"},
                    {"new_str", big}});
  EXPECT_TRUE(r.is_error) << r.text;
  auto v = tools.Memory({{"command", "view"}, {"path", kPath}});
  EXPECT_EQ(v.text, "Here's the content of " + kPath +
                        " with line numbers:\n     1\tkeep\n");
  EXPECT_EQ(versions(), had) << "a failed write committed a version";
  // A new memory that does not fit is not left behind (empty), so the same
  // create can be made again once there is room.
  const std::string kNew = "/memories/users/admin/n.md";
  r = tools.Memory({{"command", "create"}, {"path", kNew}, {"file_text", big}});
  EXPECT_TRUE(r.is_error) << r.text;
  EXPECT_THAT(r.text, HasSubstr("nothing was created"));
  EXPECT_FALSE(view.Stat(caller, *vfs::Path::Parse(kNew)).has_value());
  disk.Free();
  r = tools.Memory(
      {{"command", "create"}, {"path", kNew}, {"file_text", "fits now\n"}});
  EXPECT_FALSE(r.is_error) << r.text;
}

}  // namespace
}  // namespace agentvfs::testing
