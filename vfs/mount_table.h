// The mount table of this process's mount namespace, as the kernel lists it
// in /proc/self/mountinfo.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace agentvfs::vfs {

struct MountEntry {
  int id = 0;          // the mount's id (a new mount at a point gets a new one)
  std::string device;  // "major:minor" of the mounted filesystem
  std::string root;    // the directory of that filesystem shown here
  std::string point;   // where it is mounted (unescaped, absolute)
  std::string fstype;  // "ext4", "fuse.agentvfs", ...
};

// Every mount in mountinfo order: a later mount at the same point covers
// the earlier ones. Empty when /proc is not mounted.
std::vector<MountEntry> ReadMountTable();

// Whether the absolute, normalised `path` is `dir` or lies below it, by
// whole components (/a/bc is not below /a/b).
bool IsWithin(std::string_view path, std::string_view dir);

}  // namespace agentvfs::vfs
