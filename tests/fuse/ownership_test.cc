// Ownership and permissions through a real mount used by a non-root uid (the
// sandbox's user), mounted with --allow-other: who owns what a user creates,
// and which changes the kernel refuses, must be what a local filesystem does,
// because the daemon itself runs as root and would otherwise do anything.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tests/fuse/fuse_test_support.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::fuse_test {
namespace {

class OwnershipTest : public FuseViewTest {
 protected:
  void SetUp() override {
    // On the host, as root: a sticky world-writable directory, root files
    // readable by everyone and by root only, a setgid directory of group 555.
    ASSERT_EQ(mkdir(Host("shared").c_str(), 0777), 0);
    ASSERT_EQ(chmod(Host("shared").c_str(), 01777), 0);
    ASSERT_TRUE(WriteFile(Host("public"), "root's public file", 0644));
    ASSERT_TRUE(WriteFile(Host("private"), "root's secret", 0600));
    ASSERT_EQ(mkdir(Host("sgid").c_str(), 0777), 0);
    ASSERT_EQ(chown(Host("sgid").c_str(), 0, 555), 0);
    ASSERT_EQ(chmod(Host("sgid").c_str(), 02777), 0);
    ASSERT_TRUE(Mount({"--allow-other"}));
  }

  // lstat on the host; fails the test when it fails.
  struct stat HostStat(const std::string& rel) {
    struct stat st {};
    EXPECT_EQ(lstat(Host(rel).c_str(), &st), 0)
        << Host(rel) << ": " << std::strerror(errno);
    return st;
  }
  struct stat ViewStat(const std::string& rel) {
    struct stat st {};
    EXPECT_EQ(lstat(View(rel).c_str(), &st), 0)
        << View(rel) << ": " << std::strerror(errno);
    return st;
  }
};

TEST_F(OwnershipTest, FilesAndDirectoriesBelongToTheirCreator) {
  const std::string file = View("shared/made-by-user");
  const std::string dir = View("shared/dir-by-user");
  ASSERT_ERRNO_EQ(
      AsUser(kUser, kUserGroup,
             [&] {
               if (int e = OpenErrno(file, O_WRONLY | O_CREAT, 0640)) return e;
               return ErrnoOf(mkdir(dir.c_str(), 0750));
             }),
      0);
  for (const char* rel : {"shared/made-by-user", "shared/dir-by-user"}) {
    struct stat host = HostStat(rel), view = ViewStat(rel);
    EXPECT_EQ(host.st_uid, kUser) << rel << " on the host";
    EXPECT_EQ(host.st_gid, kUserGroup) << rel << " on the host";
    EXPECT_EQ(view.st_uid, kUser) << rel << " in the view";
    EXPECT_EQ(view.st_gid, kUserGroup) << rel << " in the view";
  }
  // The creator's umask (022) applied once, not the daemon's on top.
  EXPECT_EQ(Octal(HostStat("shared/made-by-user").st_mode), "0640");
  EXPECT_EQ(Octal(HostStat("shared/dir-by-user").st_mode), "0750");
  // And the user can use what it made: write into its own 0750 directory.
  EXPECT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] {
                           return OpenErrno(dir + "/inner",
                                            O_WRONLY | O_CREAT | O_EXCL);
                         }),
                  0);
  EXPECT_EQ(HostStat("shared/dir-by-user/inner").st_uid, kUser);
}

TEST_F(OwnershipTest, SetuidBitRequestedAtCreationIsKept) {
  // A user may create its own set-user-ID file (open(2) with mode 04755),
  // as on a local filesystem.
  const std::string file = View("shared/suid");
  ASSERT_ERRNO_EQ(
      AsUser(
          kUser, kUserGroup,
          [&] { return OpenErrno(file, O_WRONLY | O_CREAT | O_EXCL, 04755); }),
      0);
  EXPECT_EQ(Octal(HostStat("shared/suid").st_mode), "04755");
  EXPECT_EQ(HostStat("shared/suid").st_uid, kUser);
}

TEST_F(OwnershipTest, UserCannotChangeRootsFiles) {
  const std::string pub = View("public"), priv = View("private");
  auto as_user = [](const std::function<int()>& fn) {
    return AsUser(kUser, kUserGroup, fn);
  };
  // Positive control: the world-readable file is readable.
  EXPECT_ERRNO_EQ(as_user([&] { return OpenErrno(pub, O_RDONLY); }), 0);

  EXPECT_ERRNO_EQ(as_user([&] { return ErrnoOf(chmod(pub.c_str(), 0666)); }),
                  EPERM);
  EXPECT_ERRNO_EQ(
      as_user([&] { return ErrnoOf(chown(pub.c_str(), kUser, kUserGroup)); }),
      EPERM);
  EXPECT_ERRNO_EQ(as_user([&] { return ErrnoOf(chown(pub.c_str(), -1, 0)); }),
                  EPERM);
  EXPECT_ERRNO_EQ(as_user([&] { return OpenErrno(pub, O_WRONLY); }), EACCES);
  EXPECT_ERRNO_EQ(as_user([&] { return OpenErrno(pub, O_RDWR | O_TRUNC); }),
                  EACCES);
  EXPECT_ERRNO_EQ(as_user([&] { return ErrnoOf(truncate(pub.c_str(), 0)); }),
                  EACCES);
  EXPECT_ERRNO_EQ(as_user([&] { return OpenErrno(priv, O_RDONLY); }), EACCES);
  // Touching to "now" needs write permission; to a chosen time, ownership.
  EXPECT_ERRNO_EQ(
      as_user([&] { return ErrnoOf(utimes(pub.c_str(), nullptr)); }), EACCES);
  EXPECT_ERRNO_EQ(as_user([&] {
                    struct timeval tv[2] = {{1, 0}, {1, 0}};
                    return ErrnoOf(utimes(pub.c_str(), tv));
                  }),
                  EPERM);
  EXPECT_ERRNO_EQ(as_user([&] {
                    return ErrnoOf(setxattr(pub.c_str(), "user.x", "v", 1, 0));
                  }),
                  EACCES);
  // The workspace directory itself is root's 0755: no new names in it.
  EXPECT_ERRNO_EQ(
      as_user([&] { return OpenErrno(View("new"), O_WRONLY | O_CREAT); }),
      EACCES);
  EXPECT_ERRNO_EQ(as_user([&] { return ErrnoOf(unlink(pub.c_str())); }),
                  EACCES);

  // Nothing changed on the host.
  struct stat st = HostStat("public");
  EXPECT_EQ(Octal(st.st_mode), "0644");
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_gid, 0u);
  EXPECT_EQ(ReadFile(Host("public")), "root's public file");
  EXPECT_EQ(Octal(HostStat("private").st_mode), "0600");
  struct stat none;
  EXPECT_NE(lstat(Host("new").c_str(), &none), 0);
}

TEST_F(OwnershipTest, OnlyRootGivesFilesAway) {
  const std::string file = View("shared/mine");
  ASSERT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] {
                           if (int e = OpenErrno(file, O_WRONLY | O_CREAT))
                             return e;
                           // Own file: chmod and a no-op chown are fine...
                           if (chmod(file.c_str(), 0600) != 0) return errno;
                           if (chown(file.c_str(), kUser, kUserGroup) != 0)
                             return errno;
                           // ...giving it to someone else is not.
                           if (chown(file.c_str(), kOtherUser, -1) == 0)
                             return 200;
                           if (errno != EPERM) return errno + 100;
                           // Nor to a group the user is not in.
                           if (chown(file.c_str(), -1, kOtherGroup) == 0)
                             return 201;
                           return errno;
                         }),
                  EPERM);
  struct stat st = HostStat("shared/mine");
  EXPECT_EQ(st.st_uid, kUser);
  EXPECT_EQ(st.st_gid, kUserGroup);
  EXPECT_EQ(Octal(st.st_mode), "0600");

  // Root can.
  ASSERT_EQ(chown(file.c_str(), kOtherUser, kOtherGroup), 0)
      << std::strerror(errno);
  st = HostStat("shared/mine");
  EXPECT_EQ(st.st_uid, kOtherUser);
  EXPECT_EQ(st.st_gid, kOtherGroup);
  st = ViewStat("shared/mine");
  EXPECT_EQ(st.st_uid, kOtherUser);
  EXPECT_EQ(st.st_gid, kOtherGroup);
  // And the previous owner now has no access to the 0600 file.
  EXPECT_ERRNO_EQ(
      AsUser(kUser, kUserGroup, [&] { return OpenErrno(file, O_RDONLY); }),
      EACCES);
}

TEST_F(OwnershipTest, StickyDirectoryProtectsOtherUsersFiles) {
  const std::string theirs = View("shared/theirs");
  const std::string mine = View("shared/mine");
  ASSERT_ERRNO_EQ(
      AsUser(kUser, kUserGroup,
             [&] { return OpenErrno(theirs, O_WRONLY | O_CREAT, 0666); }),
      0);
  auto as_other = [](const std::function<int()>& fn) {
    return AsUser(kOtherUser, kOtherGroup, fn);
  };
  // Even a world-writable file in a sticky directory cannot be removed or
  // renamed by someone else...
  EXPECT_ERRNO_EQ(as_other([&] { return ErrnoOf(unlink(theirs.c_str())); }),
                  EPERM);
  EXPECT_ERRNO_EQ(
      as_other([&] {
        return ErrnoOf(rename(theirs.c_str(), View("shared/stolen").c_str()));
      }),
      EPERM);
  // ...nor replaced by a rename onto its name.
  EXPECT_ERRNO_EQ(as_other([&] {
                    if (int e = OpenErrno(mine, O_WRONLY | O_CREAT)) return e;
                    return ErrnoOf(rename(mine.c_str(), theirs.c_str()));
                  }),
                  EPERM);
  EXPECT_EQ(HostStat("shared/theirs").st_uid, kUser);
  struct stat none;
  EXPECT_NE(lstat(Host("shared/stolen").c_str(), &none), 0);

  // Everyone manages their own files there.
  EXPECT_ERRNO_EQ(as_other([&] {
                    const std::string moved = View("shared/mine-moved");
                    if (rename(mine.c_str(), moved.c_str()) != 0) return errno;
                    return ErrnoOf(unlink(moved.c_str()));
                  }),
                  0);
  EXPECT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] { return ErrnoOf(unlink(theirs.c_str())); }),
                  0);
  EXPECT_EQ(ListDir(Host("shared")), std::vector<std::string>{});
}

TEST_F(OwnershipTest, SetgidDirectoryPassesItsGroupOn) {
  const std::string file = View("sgid/f");
  const std::string dir = View("sgid/sub");
  const std::string sgid_file = View("sgid/wants-sgid");
  ASSERT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] {
                           if (int e = OpenErrno(file, O_WRONLY | O_CREAT))
                             return e;
                           if (mkdir(dir.c_str(), 0755) != 0) return errno;
                           // Not a member of group 555: the kernel drops
                           // the set-group-ID bit it asked for.
                           return OpenErrno(sgid_file, O_WRONLY | O_CREAT,
                                            02755);
                         }),
                  0);
  struct stat st = HostStat("sgid/f");
  EXPECT_EQ(st.st_uid, kUser);
  EXPECT_EQ(st.st_gid, 555u);
  EXPECT_EQ(ViewStat("sgid/f").st_gid, 555u);
  st = HostStat("sgid/sub");
  EXPECT_EQ(st.st_uid, kUser);
  EXPECT_EQ(st.st_gid, 555u);
  EXPECT_TRUE(st.st_mode & S_ISGID) << "subdirectories inherit setgid";
  st = HostStat("sgid/wants-sgid");
  EXPECT_EQ(st.st_gid, 555u);
  EXPECT_EQ(Octal(st.st_mode), "0755");
}

// Without --allow-other only the mounting user (root here) may use the view;
// the kernel answers everyone else EACCES before the daemon sees anything.
// The kernel checks a request against the attributes it cached for up to
// the cache timeout. A user who replaces a file of its own by another's
// (here by a rename on the host, in a directory anyone may write) must not
// get to open, chmod or hard-link the other's file through the mount on the
// strength of its own file's cached mode: the daemon, root, has the host
// check every such operation again, as the user, on the file there now.
TEST_F(OwnershipTest, AFileReplacedBesideTheMountIsCheckedAsItIsNow) {
  ASSERT_EQ(mkdir(Host("open").c_str(), 0777), 0);
  ASSERT_EQ(chmod(Host("open").c_str(), 0777), 0);
  ASSERT_TRUE(WriteFile(Host("open/rootsecret"), "root's secret", 0600));
  const std::string mine = View("open/mine");
  auto as_user = [](const std::function<int()>& fn) {
    return AsUser(kUser, kUserGroup, fn);
  };
  auto swap = [&] {
    return as_user([&] {
      if (int e = OpenErrno(mine, O_WRONLY | O_CREAT, 0644)) return e;
      struct stat st;
      if (stat(mine.c_str(), &st) != 0) return errno;  // now cached
      return ErrnoOf(
          rename(Host("open/rootsecret").c_str(), Host("open/mine").c_str()));
    });
  };
  ASSERT_ERRNO_EQ(swap(), 0);
  EXPECT_ERRNO_EQ(as_user([&] { return ErrnoOf(chmod(mine.c_str(), 0666)); }),
                  EPERM);
  EXPECT_ERRNO_EQ(as_user([&] { return OpenErrno(mine, O_RDONLY); }), EACCES);
  EXPECT_ERRNO_EQ(as_user([&] { return OpenErrno(mine, O_RDWR); }), EACCES);
  EXPECT_ERRNO_EQ(
      as_user([&] { return ErrnoOf(chown(mine.c_str(), -1, kUserGroup)); }),
      EPERM);
  if (ReadFile("/proc/sys/fs/protected_hardlinks")
          .value_or("")
          .starts_with("1")) {
    EXPECT_ERRNO_EQ(
        as_user([&] {
          return ErrnoOf(link(mine.c_str(), View("open/hard").c_str()));
        }),
        EPERM);
  }
  struct stat st = HostStat("open/mine");
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(Octal(st.st_mode), "0600");
  EXPECT_EQ(ReadFile(Host("open/mine")), "root's secret");
}

// fchown, fchmod and futimens reach the daemon without a file handle (only
// ftruncate brings one). They change the open file, as on any filesystem,
// never the file another user has put at its name meanwhile: root's `tar`
// does fchown(fd, 0, 0) then fchmod(fd, 04755), and acting on the name gave
// a user's planted shell set-user-ID root. A file that was only renamed
// away is still changed (before: ENOENT).
TEST_F(OwnershipTest, MetadataChangesThroughADescriptorReachTheOpenFile) {
  ASSERT_EQ(mkdir(Host("sb").c_str(), 0777), 0);
  ASSERT_EQ(chown(Host("sb").c_str(), kUser, kUserGroup), 0);
  ASSERT_TRUE(WriteFile(Host("sb/prog"), "root's program", 0755));
  ASSERT_EQ(AsUser(kUser, kUserGroup,
                   [&] {
                     int e =
                         OpenErrno(Host("sb/evil"), O_WRONLY | O_CREAT, 0755);
                     return e;
                   }),
            0);
  int fd = open(View("sb/prog").c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(rename(Host("sb/prog").c_str(), Host("sb/prog.old").c_str()), 0);
  ASSERT_EQ(rename(Host("sb/evil").c_str(), Host("sb/prog").c_str()), 0);
  EXPECT_EQ(fchown(fd, 0, 0), 0) << std::strerror(errno);
  EXPECT_EQ(fchmod(fd, 04755), 0) << std::strerror(errno);
  struct timespec times[2] = {{1000000, 0}, {2000000, 0}};
  EXPECT_EQ(futimens(fd, times), 0) << std::strerror(errno);
  close(fd);
  struct stat planted = HostStat("sb/prog"),
              open_file = HostStat("sb/prog.old");
  EXPECT_EQ(planted.st_uid, kUser);
  EXPECT_EQ(Octal(planted.st_mode), "0755") << "the planted file was changed";
  EXPECT_NE(planted.st_mtim.tv_sec, 2000000);
  EXPECT_EQ(open_file.st_uid, 0u);
  EXPECT_EQ(Octal(open_file.st_mode), "04755");
  EXPECT_EQ(open_file.st_mtim.tv_sec, 2000000);
}

// A file another user's cached file was removed beside the mount: the
// kernel's permission check asks for fresh attributes, finds the file gone
// and looks the name up again, so open(O_CREAT) creates it (before: ENOENT).
TEST_F(OwnershipTest, OCreatOfAFileRemovedBesideTheMountCreatesIt) {
  ASSERT_EQ(mkdir(Host("open2").c_str(), 0777), 0);
  ASSERT_EQ(chmod(Host("open2").c_str(), 0777), 0);
  ASSERT_TRUE(WriteFile(View("open2/gone"), "root's", 0600));
  ASSERT_EQ(ReadFile(View("open2/gone")), "root's");  // cached
  ASSERT_EQ(unlink(Host("open2/gone").c_str()), 0);
  EXPECT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] {
                           return OpenErrno(View("open2/gone"),
                                            O_WRONLY | O_CREAT, 0644);
                         }),
                  0);
  EXPECT_EQ(HostStat("open2/gone").st_uid, kUser);
}

// What the host does for a local process, the mount does too: a truncating
// open by a user who may write but does not own the file clears its set-ID
// bits, and a member of a set-group-ID directory's group (through a
// supplementary group) keeps the set-group-ID bit it asks for.
TEST_F(OwnershipTest, SetIdBitsFollowTheHostsRules) {
  ASSERT_TRUE(WriteFile(Host("shared-suid"), "x", 0644));
  ASSERT_EQ(chmod(Host("shared-suid").c_str(), 06777), 0);
  EXPECT_ERRNO_EQ(
      AsUser(
          kUser, kUserGroup,
          [&] { return OpenErrno(View("shared-suid"), O_WRONLY | O_TRUNC); }),
      0);
  EXPECT_EQ(Octal(HostStat("shared-suid").st_mode), "0777");
  // A write by a group member who does not own the file clears them too
  // (the kernel asks the daemon to, by a chmod the member may not make).
  ASSERT_TRUE(WriteFile(Host("group-suid"), "x", 0644));
  ASSERT_EQ(chown(Host("group-suid").c_str(), 0, 555), 0);
  ASSERT_EQ(chmod(Host("group-suid").c_str(), 06775), 0);
  EXPECT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] {
                           int fd = open(View("group-suid").c_str(), O_WRONLY);
                           if (fd < 0) return errno;
                           int e = ErrnoOf(write(fd, "y", 1));
                           close(fd);
                           return e;
                         },
                         {555}),
                  0);
  EXPECT_EQ(Octal(HostStat("group-suid").st_mode), "0775");
  EXPECT_EQ(ReadFile(Host("group-suid")), "y");

  EXPECT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] {
                           return OpenErrno(View("sgid/f"),
                                            O_WRONLY | O_CREAT | O_EXCL, 02755);
                         },
                         {555}),
                  0);
  struct stat st = HostStat("sgid/f");
  EXPECT_EQ(st.st_uid, kUser);
  EXPECT_EQ(st.st_gid, 555u);
  EXPECT_EQ(Octal(st.st_mode), "02755");
}

TEST_F(FuseViewTest, WithoutAllowOtherOtherUsersAreRefused) {
  ASSERT_TRUE(WriteFile(Host("f"), "data"));
  ASSERT_TRUE(Mount());
  const std::string mnt = MountPoint(), file = View("f");
  EXPECT_EQ(ReadFile(file), "data") << "root, who mounted it, can read";
  EXPECT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] {
                           struct stat st;
                           return ErrnoOf(stat(mnt.c_str(), &st));
                         }),
                  EACCES);
  EXPECT_ERRNO_EQ(
      AsUser(kUser, kUserGroup, [&] { return OpenErrno(file, O_RDONLY); }),
      EACCES);
}

// The same rule on the store: a truncating open by a user without
// CAP_FSETID drops the set-user-ID bit (and set-group-ID with group
// execute). With atomic O_TRUNC the kernel leaves it to the daemon; the
// store kept both bits on the emptied file.
class StoreSetIdTest : public FuseViewTest {};

TEST_F(StoreSetIdTest, ATruncatingOpenByAnotherUserDropsSetIdBits) {
  auto store = testing::StoreFixture::Create({});
  ASSERT_TRUE(store.has_value()) << store.error().ToString();
  auto args = (*store)->MountArgs("admin");
  args.push_back("--allow-other");
  ASSERT_TRUE(Mount(args));
  const std::string dir = MountPoint() + "/memories/users/admin/tmpd";
  ASSERT_EQ(mkdir(dir.c_str(), 0777), 0) << std::strerror(errno);
  ASSERT_EQ(chmod(dir.c_str(), 01777), 0) << std::strerror(errno);
  const std::string file = dir + "/suid";
  ASSERT_ERRNO_EQ(AsUser(kUser, kUserGroup,
                         [&] {
                           if (int e = OpenErrno(file, O_WRONLY | O_CREAT))
                             return e;
                           return ErrnoOf(chmod(file.c_str(), 06777));
                         }),
                  0);
  struct stat st {};
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  ASSERT_EQ(Octal(st.st_mode & 07777), "06777");
  ASSERT_ERRNO_EQ(AsUser(kOtherUser, kOtherGroup,
                         [&] { return OpenErrno(file, O_WRONLY | O_TRUNC); }),
                  0);
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_EQ(Octal(st.st_mode & 07777), "0777");
}

}  // namespace
}  // namespace agentvfs::fuse_test
