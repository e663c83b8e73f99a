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

// One directory on the way down: its name in its parent, who it is (to
// check the way back up) and the subdirectories still to remove.
struct Level {
  std::string name;
  dev_t dev;
  ino_t ino;
  std::vector<std::string> subdirs;
};

// Removes what the directory open as `fd` holds but its subdirectories
// (and `keep`), and returns the names of those on the same filesystem and
// mount.
std::vector<std::string> ClearFiles(int fd, dev_t dev, uint64_t mnt,
                                    const char* keep) {
  std::vector<std::string> subdirs;
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return subdirs;
  DIR* d = fdopendir(dup_fd);
  if (d == nullptr) {
    close(dup_fd);
    return subdirs;
  }
  rewinddir(d);  // the offset is shared with `fd`, which may have been read
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != ".." && (keep == nullptr || n != keep))
      names.push_back(std::move(n));
  }
  closedir(d);
  for (auto& n : names) {
    struct stat st;
    if (fstatat(fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISDIR(st.st_mode)) {
      unlinkat(fd, n.c_str(), 0);
    } else if (st.st_dev == dev && MountId(fd, n.c_str()) == mnt) {
      subdirs.push_back(std::move(n));
    }
  }
  return subdirs;
}

// Depth first, with neither recursion nor a descriptor per level: a tree
// 20,000 directories deep (a sandbox's `mkdir d; cd d` loop) overflowed
// the stack of the recursive version, and 1,000 levels its descriptors.
// The way back up is "..", checked against the directory that was entered,
// so a tree moved meanwhile stops the removal instead of leading elsewhere.
void RemoveBelow(int root_fd, const char* keep) {
  struct stat st;
  if (fstat(root_fd, &st) != 0) {
    close(root_fd);
    return;
  }
  const dev_t dev = st.st_dev;
  const uint64_t mnt = MountId(root_fd, "");
  int cur = root_fd;
  std::vector<Level> stack;
  stack.push_back({"", st.st_dev, st.st_ino, ClearFiles(cur, dev, mnt, keep)});
  while (true) {
    if (!stack.back().subdirs.empty()) {
      std::string name = std::move(stack.back().subdirs.back());
      stack.back().subdirs.pop_back();
      const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
      int sub = openat(cur, name.c_str(), flags);
      if (sub < 0 && errno == EACCES) {
        fchmodat(cur, name.c_str(), 0700, 0);
        sub = openat(cur, name.c_str(), flags);
      }
      if (sub < 0) continue;
      if (fstat(sub, &st) != 0 || st.st_dev != dev || MountId(sub, "") != mnt) {
        close(sub);
        continue;
      }
      close(cur);
      cur = sub;
      std::vector<std::string> subdirs = ClearFiles(cur, dev, mnt, nullptr);
      stack.push_back(
          {std::move(name), st.st_dev, st.st_ino, std::move(subdirs)});
      continue;
    }
    if (stack.size() == 1) break;
    int parent = openat(cur, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const Level& above = stack[stack.size() - 2];
    if (parent < 0 || fstat(parent, &st) != 0 || st.st_dev != above.dev ||
        st.st_ino != above.ino) {
      if (parent >= 0) close(parent);
      break;  // moved while being removed: leave the rest
    }
    close(cur);
    cur = parent;
    unlinkat(cur, stack.back().name.c_str(), AT_REMOVEDIR);
    stack.pop_back();
  }
  close(cur);
}

}  // namespace

void RemoveTreeAt(int dir_fd, const char* keep_last) {
  RemoveBelow(dir_fd, keep_last);
}

}  // namespace agentvfs::vfs
