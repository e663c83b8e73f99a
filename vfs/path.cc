// Lexical path normalisation. Nothing here touches a filesystem: '..' is
// resolved on the text, which is what makes it impossible for a path to climb
// above the namespace root before any backend sees it.
#include "vfs/path.h"

namespace agentvfs::vfs {

Result<Path> Path::Parse(std::string_view text) {
  if (text.empty())
    return Fail(ENOENT,
                "empty path; give an absolute path such as /workspace/file");
  if (text.find('\0') != std::string_view::npos)
    return Fail(EINVAL, "path contains a NUL byte");
  if (text.front() != '/')
    return Fail(EINVAL,
                "path '" + std::string(text) +
                    "' is relative; give an absolute path starting with '/'");
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == '/') ++i;
    size_t j = i;
    while (j < text.size() && text[j] != '/') ++j;
    std::string_view comp = text.substr(i, j - i);
    i = j;
    if (comp.empty() || comp == ".") continue;
    if (comp == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    if (comp.size() > kNameMax)
      return Fail(ENAMETOOLONG, "a path component is longer than 255 bytes");
    parts.push_back(comp);
  }
  std::string out;
  for (auto p : parts) {
    out += '/';
    out += p;
  }
  if (out.empty()) out = "/";
  if (out.size() > kPathMax - 1)
    return Fail(ENAMETOOLONG, "path is longer than 4095 bytes");
  return Path(std::move(out));
}

Status Path::ValidateName(std::string_view name) {
  if (name.empty()) return Fail(EINVAL, "empty file name");
  if (name == "." || name == "..")
    return Fail(EINVAL, "'.' and '..' are not file names");
  if (name.find('/') != std::string_view::npos)
    return Fail(EINVAL, "file name contains '/'");
  if (name.find('\0') != std::string_view::npos)
    return Fail(EINVAL, "file name contains a NUL byte");
  if (name.size() > kNameMax)
    return Fail(ENAMETOOLONG, "file name is longer than 255 bytes");
  return {};
}

Path Path::Parent() const {
  if (IsRoot()) return *this;
  size_t slash = text_.rfind('/');
  if (slash == 0) return Path();
  return Path(text_.substr(0, slash));
}

std::string_view Path::Name() const {
  if (IsRoot()) return {};
  return std::string_view(text_).substr(text_.rfind('/') + 1);
}

Result<Path> Path::Child(std::string_view name) const {
  if (auto ok = ValidateName(name); !ok) return std::unexpected(ok.error());
  std::string out = IsRoot() ? std::string() : text_;
  out += '/';
  out += name;
  if (out.size() > kPathMax - 1)
    return Fail(ENAMETOOLONG, "path is longer than 4095 bytes");
  return Path(std::move(out));
}

std::vector<std::string_view> Path::Components() const {
  std::vector<std::string_view> out;
  std::string_view s(text_);
  size_t i = 1;
  while (i < s.size()) {
    size_t j = s.find('/', i);
    if (j == std::string_view::npos) j = s.size();
    out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

bool Path::HasPrefix(const Path& prefix) const {
  if (prefix.IsRoot()) return true;
  if (text_.size() < prefix.text_.size()) return false;
  if (text_.compare(0, prefix.text_.size(), prefix.text_) != 0) return false;
  return text_.size() == prefix.text_.size() ||
         text_[prefix.text_.size()] == '/';
}

Path Path::StripPrefix(const Path& prefix) const {
  if (prefix.IsRoot()) return *this;
  if (text_.size() == prefix.text_.size()) return Path();
  return Path(text_.substr(prefix.text_.size()));
}

Path Path::Join(const Path& rel) const {
  if (rel.IsRoot()) return *this;
  if (IsRoot()) return rel;
  return Path(text_ + rel.text_);
}

std::string Path::Relative() const {
  if (IsRoot()) return ".";
  return text_.substr(1);
}

}  // namespace agentvfs::vfs
