// Whole-file and directory helpers for the mount test suites.
#include "tests/support/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace agentvfs::testing {

::testing::AssertionResult WriteFile(const std::string& path,
                                     std::string_view data, mode_t mode) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) {
    return ::testing::AssertionFailure()
           << "open " << path << ": " << std::strerror(errno);
  }
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) {
      int err = errno;
      close(fd);
      return ::testing::AssertionFailure()
             << "write " << path << ": " << std::strerror(err);
    }
    done += static_cast<size_t>(n);
  }
  if (fchmod(fd, mode) != 0 || close(fd) != 0) {
    return ::testing::AssertionFailure()
           << "chmod/close " << path << ": " << std::strerror(errno);
  }
  return ::testing::AssertionSuccess();
}

std::optional<std::string> ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) {
      close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

std::optional<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return std::nullopt;
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace agentvfs::testing
