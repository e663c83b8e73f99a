#include "vfs/host_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace agentvfs::vfs {
namespace {

// The id of the mount `name` (relative to dir_fd; "" for dir_fd) is on, or 0.
uint64_t MountId(int dir_fd, const char* name) {
  struct statx sx;
  if (statx(dir_fd, name, AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH, STATX_MNT_ID,
            &sx) != 0 ||
      !(sx.stx_mask & STATX_MNT_ID))
    return 0;
  return sx.stx_mnt_id;
}

void RemoveBelow(int dir_fd, dev_t dev, uint64_t mnt) {
  DIR* d = fdopendir(dir_fd);
  if (d == nullptr) {
    close(dir_fd);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  int fd = dirfd(d);
  for (const auto& n : names) {
    struct stat st;
    if (fstatat(fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (st.st_dev != dev || MountId(fd, n.c_str()) != mnt) continue;
      int sub = openat(fd, n.c_str(),
                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0 && errno == EACCES) {
        fchmodat(fd, n.c_str(), 0700, 0);
        sub = openat(fd, n.c_str(),
                     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      }
      if (sub >= 0) RemoveBelow(sub, dev, mnt);
      unlinkat(fd, n.c_str(), AT_REMOVEDIR);
    } else {
      unlinkat(fd, n.c_str(), 0);
    }
  }
  closedir(d);
}

}  // namespace

void RemoveTreeAt(int dir_fd) {
  struct stat st;
  if (fstat(dir_fd, &st) != 0) {
    close(dir_fd);
    return;
  }
  RemoveBelow(dir_fd, st.st_dev, MountId(dir_fd, ""));
}

}  // namespace agentvfs::vfs
