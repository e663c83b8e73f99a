// Path: an absolute, lexically normalised path inside the agentvfs namespace.
// Every entry point (FUSE, harness tools, CLI) parses what it is given into a
// Path before any router or backend sees it, so backends never deal with '.',
// '..', repeated or trailing slashes, NULs or over-long names.
//
// Rules (Parse):
//   - must start with '/'                        -> EINVAL otherwise
//   - empty string                               -> ENOENT (as POSIX does for
//   "")
//   - contains NUL                               -> EINVAL
//   - '//' and trailing '/' collapse; '.' is dropped
//   - '..' removes the previous component; at the root it stays at the root
//   - a component longer than NAME_MAX (255)     -> ENAMETOOLONG
//   - the normalised path longer than PATH_MAX-1 -> ENAMETOOLONG
// Path is an immutable value type; it is safe to share between threads.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vfs/error.h"

namespace agentvfs::vfs {

inline constexpr size_t kNameMax = 255;   // bytes in one component
inline constexpr size_t kPathMax = 4096;  // bytes incl. the terminating NUL

class Path {
 public:
  // The root, "/".
  Path() : text_("/") {}

  static Result<Path> Parse(std::string_view text);

  // Checks one directory entry name: not empty, not '.' or '..', no '/',
  // no NUL, at most NAME_MAX bytes. EINVAL or ENAMETOOLONG otherwise.
  static Status ValidateName(std::string_view name);

  const std::string& str() const { return text_; }
  bool IsRoot() const { return text_.size() == 1; }

  // Parent of this path; the root's parent is the root.
  Path Parent() const;
  // Last component; empty for the root.
  std::string_view Name() const;
  // This path extended by one validated name.
  Result<Path> Child(std::string_view name) const;
  // Components in order; empty for the root.
  std::vector<std::string_view> Components() const;

  // True when `prefix` equals this path or is an ancestor of it, compared on
  // whole components: /workspace is a prefix of /workspace/a, not of
  // /workspacefoo.
  bool HasPrefix(const Path& prefix) const;
  // This path with `prefix` removed, as an absolute path ("/" when equal).
  // Precondition: HasPrefix(prefix).
  Path StripPrefix(const Path& prefix) const;
  // `rel` (an absolute path inside a mount) placed under this path.
  Path Join(const Path& rel) const;

  // Path relative to the root without the leading '/', "." for the root:
  // the form openat()-style calls against a root directory fd need.
  std::string Relative() const;

  friend bool operator==(const Path&, const Path&) = default;
  friend auto operator<=>(const Path&, const Path&) = default;

 private:
  explicit Path(std::string text) : text_(std::move(text)) {}
  std::string text_;  // always starts with '/', never ends with '/' unless root
};

}  // namespace agentvfs::vfs
