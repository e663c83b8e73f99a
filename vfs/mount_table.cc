#include "vfs/mount_table.h"

#include <fstream>
#include <sstream>

namespace agentvfs::vfs {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool ok = true;
      for (size_t k = 1; k <= 3; ++k) {
        char ch = s[i + k];
        if (ch < '0' || ch > '7') ok = false;
        v = v * 8 + (ch - '0');
      }
      if (ok) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

std::vector<MountEntry> ReadMountTable() {
  // id parent major:minor root point options [optional...] - fstype source
  std::vector<MountEntry> table;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    MountEntry e;
    std::string parent, root, point, word;
    if (!(fields >> e.id >> parent >> e.device >> root >> point)) continue;
    e.root = Unescape(root);
    e.point = Unescape(point);
    while (fields >> word) {
      if (word == "-") {
        fields >> e.fstype;
        break;
      }
    }
    table.push_back(std::move(e));
  }
  return table;
}

bool IsWithin(std::string_view path, std::string_view dir) {
  if (dir == "/") return path.starts_with('/');
  if (!path.starts_with(dir)) return false;
  return path.size() == dir.size() || path[dir.size()] == '/';
}

}  // namespace agentvfs::vfs
