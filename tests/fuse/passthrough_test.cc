// FUSE passthrough on the workspace route (vfs/fuse, docs/routed-view.md):
// file data moves between the kernel and the host file without the daemon
// (no READ or WRITE request reaches it) while reads, writes, appends and
// shared mappings behave as on the host; --no-passthrough brings the
// daemon's I/O back; and a file replaced beside the mount while open through
// it is opened afresh instead of reaching the replaced file.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tests/fuse/fuse_test_support.h"

namespace agentvfs::fuse_test {
namespace {

// Passthrough needs Linux 6.9 and CAP_SYS_ADMIN (root here).
bool PassthroughExpected(std::string* why) {
  utsname u{};
  int major = 0, minor = 0;
  if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2) {
    *why = "cannot read the kernel version";
    return false;
  }
  if (major < 6 || (major == 6 && minor < 9)) {
    *why = std::string("kernel ") + u.release + " predates FUSE passthrough";
    return false;
  }
  if (geteuid() != 0) {
    *why = "passthrough needs CAP_SYS_ADMIN";
    return false;
  }
  return true;
}

// How many requests of kind `op` a --debug log shows ("opcode: WRITE (16)").
size_t RequestsOf(const std::string& log, const std::string& op) {
  const std::string needle = "opcode: " + op + " (";
  size_t n = 0;
  for (size_t at = log.find(needle); at != std::string::npos;
       at = log.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// Writes and reads back a 3 MiB file, appends to it and changes it through
// a shared mapping, all through the view; checks the host file each time.
void ExerciseFileData(const std::string& view, const std::string& host) {
  std::string data = Pattern(3 << 20, 7);
  ASSERT_TRUE(WriteFile(view, data));
  auto on_host = ReadFile(host);
  ASSERT_TRUE(on_host.has_value());
  EXPECT_TRUE(*on_host == data) << "host copy differs";
  auto back = ReadFile(view);
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(*back == data) << "read back through the view differs";

  int fd = open(view.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(write(fd, "tail", 4), 4);
  ASSERT_EQ(close(fd), 0);
  data += "tail";

  fd = open(view.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
  std::memcpy(p, "mapped", 6);
  ASSERT_EQ(msync(p, 4096, MS_SYNC), 0);
  munmap(p, 4096);
  ASSERT_EQ(close(fd), 0);
  data.replace(0, 6, "mapped");

  on_host = ReadFile(host);
  ASSERT_TRUE(on_host.has_value());
  EXPECT_EQ(on_host->size(), data.size());
  EXPECT_TRUE(*on_host == data) << "host copy differs after append and mmap";

  // A file written on the host is in no page cache of the view: reading it
  // through the view must fetch it (through the daemon unless passed
  // through).
  std::string fresh = Pattern(1 << 20, 8);
  ASSERT_TRUE(WriteFile(host + ".fresh", fresh));
  back = ReadFile(view + ".fresh");
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(*back == fresh) << "host-written file read through the view";
}

class PassthroughTest : public FuseViewTest {};

TEST_F(PassthroughTest, FileDataBypassesTheDaemon) {
  std::string why;
  if (!PassthroughExpected(&why)) GTEST_SKIP() << why;
  ASSERT_TRUE(Mount({"--debug"}));
  ExerciseFileData(View("data"), Host("data"));
  // O_TRUNC while the file is open (passed through) elsewhere: the open
  // truncates once it knows the file, and both descriptors see one file.
  int reader = open(View("data").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reader, 0) << std::strerror(errno);
  ASSERT_TRUE(WriteFile(View("data"), "short"));
  char buf[16] = {};
  EXPECT_EQ(pread(reader, buf, sizeof buf, 0), 5);
  EXPECT_EQ(std::string(buf, 5), "short");
  close(reader);
  EXPECT_EQ(ReadFile(Host("data")).value_or("(unreadable)"), "short");

  std::string log = view_->Log();
  EXPECT_TRUE(Contains(log, "FUSE passthrough on"));
  EXPECT_GE(RequestsOf(log, "CREATE") + RequestsOf(log, "OPEN"), 3u);
  EXPECT_EQ(RequestsOf(log, "WRITE"), 0u);
  EXPECT_EQ(RequestsOf(log, "READ"), 0u);
}

TEST_F(PassthroughTest, WithoutPassthroughTheDaemonServesFileData) {
  ASSERT_TRUE(Mount({"--debug", "--no-passthrough"}));
  ExerciseFileData(View("data"), Host("data"));
  std::string log = view_->Log();
  EXPECT_EQ(log.find("FUSE passthrough on"), std::string::npos);
  EXPECT_GT(RequestsOf(log, "WRITE"), 0u);
  EXPECT_GT(RequestsOf(log, "READ"), 0u);
}

TEST_F(PassthroughTest, AFileReplacedBesideTheMountIsOpenedAfresh) {
  std::string why;
  if (!PassthroughExpected(&why)) GTEST_SKIP() << why;
  // Long cache timeouts: the kernel keeps the old name -> file entry, so the
  // daemon is asked to open the old node while the name holds a new file.
  ASSERT_TRUE(Mount({"--cache-timeout", "3600"}));
  ASSERT_TRUE(WriteFile(Host("f"), "old"));
  int old_fd = open(View("f").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(old_fd, 0) << std::strerror(errno);
  char buf[16] = {};
  ASSERT_EQ(pread(old_fd, buf, sizeof buf, 0), 3);
  EXPECT_EQ(std::string(buf, 3), "old");

  ASSERT_TRUE(WriteFile(Host("f.new"), "new contents"));
  ASSERT_EQ(rename(Host("f.new").c_str(), Host("f").c_str()), 0);

  EXPECT_EQ(ReadFile(View("f")).value_or("(unreadable)"), "new contents");
  int fd = open(View("f").c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(write(fd, "+", 1), 1);
  ASSERT_EQ(close(fd), 0);
  EXPECT_EQ(ReadFile(Host("f")).value_or("(unreadable)"), "new contents+");
  // The descriptor opened before still reads the file it opened.
  std::memset(buf, 0, sizeof buf);
  ASSERT_EQ(pread(old_fd, buf, sizeof buf, 0), 3);
  EXPECT_EQ(std::string(buf, 3), "old");
  close(old_fd);
}

}  // namespace
}  // namespace agentvfs::fuse_test
