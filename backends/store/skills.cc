// Agent Skills validation (SKILL.md front matter read with yaml-cpp) and tree
// copies between host directories and a vfs::Backend. Host-side walking is
// fd-relative (openat/fstatat with O_NOFOLLOW / AT_SYMLINK_NOFOLLOW) so a
// symlink in the source is copied as a link and never followed; backend-side
// walking uses only the Backend interface, so the same code serves the store,
// the router and local_dir.
#include "backends/store/skills.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "vfs/host_tree.h"

namespace agentvfs::store {
namespace {

using vfs::Error;
using vfs::Fail;
using vfs::Path;
using vfs::Result;
using vfs::Status;

using Sink = std::function<Status(std::string_view)>;

constexpr std::string_view kSkillMd = "SKILL.md";
constexpr std::string_view kAllowedFields[] = {"name",     "description",
                                               "license",  "compatibility",
                                               "metadata", "allowed-tools"};
// Permission bits copied; setuid/setgid/sticky are dropped (see skills.h).
constexpr mode_t kCopiedModeBits = 0777;

std::unexpected<Error> Unexpected(Error e) {
  return std::unexpected<Error>(std::move(e));
}

// `e` with `context` in front of its message, keeping its errno.
std::unexpected<Error> WithContext(const Error& e, std::string_view context) {
  std::string msg(context);
  msg += ": ";
  msg += e.message.empty() ? vfs::ErrnoName(e.code) : e.message;
  return Unexpected(Error{e.code, std::move(msg)});
}

std::unexpected<Error> HostErrno(std::string_view op, std::string_view path) {
  return Unexpected(vfs::FromErrno(errno, op, path));
}

// ---------------------------------------------------------------- messages

// `s` with quotes, backslashes and control bytes escaped, cut after 80
// characters: safe to put in a one-line message whatever a file holds.
std::string Escaped(std::string_view s) {
  constexpr size_t kMaxShownChars = 80;
  std::string out;
  size_t chars = 0;
  for (unsigned char ch : s) {
    bool starts_char = (ch & 0xC0) != 0x80;
    if (starts_char && chars++ == kMaxShownChars) {
      out += "...";
      break;
    }
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", ch);
      out += hex;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

std::string Quote(std::string_view s) {
  // Built in place: GCC 12 warns (-Wrestrict, wrongly) about "..." + string.
  std::string out(1, '"');
  out += Escaped(s);
  out += '"';
  return out;
}

// Characters (UTF-8 code points), which is what the spec's limits count.
size_t CountChars(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

// The offset of the first byte of `s` that is not part of valid UTF-8
// (overlong forms, surrogates and values past U+10FFFF included), or npos.
size_t InvalidUtf8At(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    // Continuation bytes that follow a lead byte: 1, 2 or 3.
    const size_t n = (b >> 5) == 6    ? 1
                     : (b >> 4) == 14 ? 2
                     : (b >> 3) == 30 ? 3
                                      : 0;
    if (n == 0 || (n == 1 && b < 0xC2) || i + n >= s.size()) return i;
    uint32_t cp = b & (0x3F >> n);
    for (size_t k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (c & 0x3F);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
      return i;
    i += n + 1;
  }
  return std::string_view::npos;
}

std::string TypeName(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "regular file";
    case S_IFDIR:
      return "directory";
    case S_IFLNK:
      return "symlink";
    case S_IFIFO:
      return "FIFO";
    case S_IFSOCK:
      return "socket";
    case S_IFCHR:
      return "character device";
    case S_IFBLK:
      return "block device";
    default:
      return "file of unknown type";
  }
}

std::string SpecialFileMessage(std::string_view shown, mode_t mode) {
  return std::string(shown) + ": is a " + TypeName(mode) +
         "; only regular files, directories and symlinks can be copied";
}

std::string JoinHost(std::string_view dir, std::string_view name) {
  std::string out(dir);
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

// Everything wrong with a skill or a set of skills; becomes one error whose
// message lists the problems in the order found, and whose errno is the first
// problem's (EINVAL for rule violations).
class Problems {
 public:
  void Add(std::string message) { Add(Error{EINVAL, std::move(message)}); }
  void Add(const Error& e) {
    if (list_.empty()) code_ = e.code;
    list_.push_back(e.message.empty() ? e.ToString() : e.message);
  }
  bool empty() const { return list_.empty(); }

  Error ToError() const {
    std::string msg;
    for (const std::string& p : list_) {
      if (!msg.empty()) msg += "; ";
      msg += p;
    }
    return Error{code_, std::move(msg)};
  }

 private:
  int code_ = EINVAL;
  std::vector<std::string> list_;
};

// ---------------------------------------------------------------- SKILL.md

std::string_view TrimLineEnd(std::string_view line) {
  while (!line.empty() &&
         (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
    line.remove_suffix(1);
  }
  return line;
}

// The YAML between a first line "---" and the next line "---".
Result<std::string_view> ExtractFrontMatter(std::string_view text,
                                            std::string_view file) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // BOM
  size_t eol = text.find('\n');
  if (TrimLineEnd(text.substr(0, eol)) != "---") {
    return Fail(EINVAL, std::string(file) +
                            ": must start with YAML front matter: a first "
                            "line \"---\", then name: and description:, then "
                            "a line \"---\"");
  }
  if (eol != std::string_view::npos) {
    size_t start = eol + 1;
    for (size_t pos = start; pos < text.size();) {
      size_t end = text.find('\n', pos);
      std::string_view line =
          text.substr(pos, end == std::string_view::npos ? end : end - pos);
      if (TrimLineEnd(line) == "---") return text.substr(start, pos - start);
      if (end == std::string_view::npos) break;
      pos = end + 1;
    }
  }
  return Fail(EINVAL, std::string(file) +
                          ": front matter is not closed: no line \"---\" "
                          "after the first");
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "empty";
    default:
      return "a string";
  }
}

// Checks the front matter fields of one SKILL.md, adding every problem.
class FieldChecker {
 public:
  FieldChecker(std::string_view file, std::string_view folder,
               Problems& problems)
      : file_(file), folder_(folder), problems_(problems) {}

  void Check(const YAML::Node& root, SkillInfo& info) {
    if (!root.IsDefined() || root.IsNull()) {
      problems_.Add(file_ +
                    ": front matter is empty; it needs name: and "
                    "description:");
      return;
    }
    if (!root.IsMap()) {
      problems_.Add(file_ +
                    ": front matter must be a mapping of fields (name: ..., "
                    "description: ...), not " +
                    Describe(root));
      return;
    }
    std::map<std::string, YAML::Node> fields;
    // By value: a yaml-cpp iterator's `->first` is a temporary, and a
    // reference to it would dangle.
    for (const auto& kv : root) {
      const YAML::Node key = kv.first;
      if (!key.IsScalar()) {
        problems_.Add(file_ + ": front matter keys must be plain names, not " +
                      Describe(key));
        continue;
      }
      const std::string name = key.Scalar();
      if (std::find(std::begin(kAllowedFields), std::end(kAllowedFields),
                    name) == std::end(kAllowedFields)) {
        problems_.Add(Field(name) +
                      "not a field of the Agent Skills format (allowed: "
                      "name, description, license, compatibility, metadata, "
                      "allowed-tools); put custom keys under metadata:");
        continue;
      }
      if (!fields.emplace(name, kv.second).second) {
        problems_.Add(Field(name) + "is given more than once");
      }
    }

    auto name = fields.find("name");
    if (name == fields.end()) {
      problems_.Add(Field("name") +
                    "is required (the skill's name, equal to "
                    "its folder's name " +
                    Quote(folder_) + ")");
    } else if (auto value = Required("name", name->second)) {
      CheckName(*value);
      info.name = *value;
    }

    auto description = fields.find("description");
    if (description == fields.end()) {
      problems_.Add(Field("description") +
                    "is required (what the skill does and when to use it)");
    } else if (auto value = Required("description", description->second)) {
      CheckLength("description", *value, kMaxSkillDescriptionChars);
      info.description = *value;
    }

    if (auto it = fields.find("license"); it != fields.end()) {
      info.license = Optional("license", it->second);
    }
    if (auto it = fields.find("compatibility"); it != fields.end()) {
      info.compatibility = Optional("compatibility", it->second);
      if (info.compatibility) {
        if (info.compatibility->empty()) {
          problems_.Add(Field("compatibility") +
                        "must not be empty when given");
        }
        CheckLength("compatibility", *info.compatibility,
                    kMaxSkillCompatibilityChars);
      }
    }
    if (auto it = fields.find("metadata"); it != fields.end()) {
      CheckMetadata(it->second, info.metadata);
    }
    if (auto it = fields.find("allowed-tools"); it != fields.end()) {
      info.allowed_tools = AllowedTools(it->second);
    }
  }

 private:
  std::string Field(std::string_view name) const {
    return file_ + ": field '" + Escaped(name) + "': ";
  }

  // A required string field's value; nullopt (and a problem) when it is
  // empty, blank or not a string.
  std::optional<std::string> Required(std::string_view name,
                                      const YAML::Node& node) {
    if (node.IsScalar()) {
      const std::string& value = node.Scalar();
      if (value.find_first_not_of(" \t\r\n") != std::string::npos) {
        return value;
      }
    }
    if (node.IsScalar() || node.IsNull()) {
      problems_.Add(Field(name) + "must not be empty");
    } else {
      problems_.Add(Field(name) + "must be a string, not " + Describe(node));
    }
    return std::nullopt;
  }

  std::optional<std::string> Optional(std::string_view name,
                                      const YAML::Node& node) {
    if (node.IsScalar()) return node.Scalar();
    problems_.Add(Field(name) +
                  (node.IsNull() ? std::string("has no value; give one or "
                                               "remove the line")
                                 : "must be a string, not " + Describe(node)));
    return std::nullopt;
  }

  void CheckLength(std::string_view name, std::string_view value,
                   size_t max_chars) {
    if (size_t bad = InvalidUtf8At(value); bad != std::string_view::npos) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X",
                    static_cast<unsigned char>(value[bad]));
      problems_.Add(Field(name) + "must be UTF-8 text (byte " + hex +
                    " at offset " + std::to_string(bad) + " is not)");
      return;
    }
    size_t chars = CountChars(value);
    if (chars > max_chars) {
      problems_.Add(Field(name) + "must be at most " +
                    std::to_string(max_chars) + " characters (got " +
                    std::to_string(chars) + ")");
    }
  }

  void CheckName(const std::string& name) {
    std::string field = Field("name");
    bool ok = true;
    auto add = [&](std::string what) {
      problems_.Add(field + what + " (got " + Quote(name) + ")");
      ok = false;
    };
    if (!std::all_of(name.begin(), name.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
        })) {
      add("must be lowercase letters, digits and hyphens");
    }
    if (size_t chars = CountChars(name); chars > kMaxSkillNameChars) {
      problems_.Add(field + "must be at most " +
                    std::to_string(kMaxSkillNameChars) + " characters (got " +
                    std::to_string(chars) + ")");
      ok = false;
    }
    if (name.front() == '-' || name.back() == '-') {
      add("must not start or end with a hyphen");
    }
    if (name.find("--") != std::string::npos) {
      add("must not contain two hyphens in a row");
    }
    // Only a well-formed name is compared with the folder: one message per
    // mistake is clearer than "bad name, and also not the folder's".
    if (ok && name != folder_) {
      add("must match the skill's folder name " + Quote(folder_));
    }
  }

  void CheckMetadata(const YAML::Node& node,
                     std::map<std::string, std::string>& out) {
    std::string field = Field("metadata");
    if (!node.IsMap()) {
      problems_.Add(field +
                    "must be a mapping of string keys to string "
                    "values, not " +
                    Describe(node));
      return;
    }
    for (const auto& kv : node) {
      const YAML::Node key_node = kv.first;
      const YAML::Node value = kv.second;
      if (!key_node.IsScalar()) {
        problems_.Add(field + "keys must be strings, not " +
                      Describe(key_node));
        continue;
      }
      const std::string key = key_node.Scalar();
      if (!value.IsScalar()) {
        problems_.Add(field + "the value of " + Quote(key) +
                      " must be a string, not " + Describe(value));
        continue;
      }
      if (!out.emplace(key, value.Scalar()).second) {
        problems_.Add(field + "key " + Quote(key) + " is given more than once");
      }
    }
  }

  std::optional<std::string> AllowedTools(const YAML::Node& node) {
    if (node.IsScalar()) return node.Scalar();
    if (node.IsSequence()) {
      std::string joined;
      for (const YAML::Node& item : node) {
        if (!item.IsScalar()) {
          problems_.Add(Field("allowed-tools") +
                        "list items must be strings, not " + Describe(item));
          return std::nullopt;
        }
        if (!joined.empty()) joined += ' ';
        joined += item.Scalar();
      }
      return joined;
    }
    problems_.Add(Field("allowed-tools") +
                  "must be a space-separated string or a list of strings, "
                  "not " +
                  Describe(node));
    return std::nullopt;
  }

  std::string file_;
  std::string folder_;
  Problems& problems_;
};

// ---------------------------------------------------------------- host side

// An owned host file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // close(2) with its result: for a written file, the last chance to hear
  // of a failed write.
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

struct HostEntry {
  std::string name;
  struct stat st;  // lstat: a symlink is described, not followed
};

// The entries of the directory open at `dirfd`, sorted by name.
Result<std::vector<HostEntry>> ListHostDir(int dirfd,
                                           const std::string& shown) {
  // A fresh open file description, so that reading it leaves dirfd alone.
  int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return HostErrno("open directory", shown);
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    int err = errno;
    ::close(fd);
    return Unexpected(vfs::FromErrno(err, "open directory", shown));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> closer(dir, closedir);
  std::vector<HostEntry> entries;
  for (;;) {
    errno = 0;
    dirent* e = readdir(dir);
    if (e == nullptr) {
      if (errno != 0) return HostErrno("read directory", shown);
      break;
    }
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    HostEntry entry{name, {}};
    if (fstatat(dirfd, name.c_str(), &entry.st, AT_SYMLINK_NOFOLLOW) != 0) {
      return HostErrno("stat", JoinHost(shown, name));
    }
    entries.push_back(std::move(entry));
  }
  std::sort(
      entries.begin(), entries.end(),
      [](const HostEntry& a, const HostEntry& b) { return a.name < b.name; });
  return entries;
}

Result<Fd> OpenHostSubdir(int dirfd, const std::string& name,
                          const std::string& shown) {
  Fd fd(openat(dirfd, name.c_str(),
               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return HostErrno("open directory", shown);
  return fd;
}

Result<std::string> ReadHostLink(int dirfd, const std::string& name,
                                 const std::string& shown);

// Whether the symlink target `target`, in a directory `depth` levels below
// a tree's top, names a place inside the tree (taken lexically, as the
// store's walk takes '..').
bool StaysInside(const std::string& target, int depth) {
  if (target.empty() || target[0] == '/') return false;
  int level = depth;
  size_t start = 0;
  while (start <= target.size()) {
    size_t end = target.find('/', start);
    if (end == std::string::npos) end = target.size();
    std::string_view comp(target.data() + start, end - start);
    if (comp == "..") {
      if (--level < 0) return false;
    } else if (!comp.empty() && comp != ".") {
      ++level;
    }
    start = end + 1;
  }
  return true;
}

// Whether the symlink target `target`, in the directory `rel` below the
// tree `root_fd` ("" for its top), leads out of the tree when the kernel
// follows it, symlinks on the way included. A lexical reading misses
// those: with `up -> .`, `up/../x` names the tree's parent. Checked with
// openat2(RESOLVE_BENEATH), which refuses any step out; of a target that
// does not exist (a dangling link), the part that exists is checked.
bool LeadsOut(int root_fd, const std::string& rel, const std::string& target) {
  std::string path = rel.empty() ? target : rel + "/" + target;
  struct open_how how = {};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (int attempt = 0; !path.empty();) {
    long fd = syscall(SYS_openat2, root_fd, path.c_str(), &how, sizeof(how));
    if (fd >= 0) {
      close(static_cast<int>(fd));
      return false;
    }
    if (errno == EINTR || (errno == EAGAIN && ++attempt < 16)) continue;
    // Only a name that does not exist (yet) is checked by what leads to
    // it; anything else counts as leading out: a step out (EXDEV), `..`
    // after a file (ENOTDIR: the store's walk once took that as a way
    // up), a loop, no openat2 at all.
    if (errno != ENOENT) return true;
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return false;
    path.resize(slash);
  }
  return false;
}

// Adds a problem for every special file in the tree below `dirfd`, and,
// with `depth` >= 0 (how far `dirfd` is below the top, `rel` below
// `root_fd`), for every symlink that leads out of the tree: a skill must
// be whole in its folder.
// A host directory that is a store directory seen through a mount of the
// store (a FUSE filesystem showing the store's inode number): importing a
// tree into a directory inside it, or exporting one into a directory of
// itself, would copy the copy without end (2,027 levels before a name grew
// too long).
constexpr long kFuseMagic = 0x65735546;

struct SelfCheck {
  Path dest;      // the store directory being filled or read
  ino_t ino = 0;  // its inode number in the store
  bool host_is_fuse = false;
  bool Is(const struct stat& st) const {
    return host_is_fuse && S_ISDIR(st.st_mode) && st.st_ino == ino;
  }
};

bool OnFuse(int fd) {
  struct statfs fs;
  return fstatfs(fd, &fs) == 0 && fs.f_type == kFuseMagic;
}

Status ScanHostTree(int dirfd, const std::string& shown, Problems& problems,
                    int depth = -1, const SelfCheck* self = nullptr,
                    int root_fd = -1, const std::string& rel = {}) {
  auto entries = ListHostDir(dirfd, shown);
  if (!entries) return Unexpected(entries.error());
  for (const HostEntry& e : *entries) {
    std::string child = JoinHost(shown, e.name);
    if (S_ISDIR(e.st.st_mode)) {
      if (self != nullptr && self->Is(e.st)) {
        problems.Add(child + " is " + self->dest.str() +
                     " itself, seen through a mount: a directory cannot be "
                     "copied into itself; import into a directory outside " +
                     shown);
        continue;
      }
      auto sub = OpenHostSubdir(dirfd, e.name, child);
      if (!sub) return Unexpected(sub.error());
      if (auto s = ScanHostTree(sub->get(), child, problems,
                                depth < 0 ? -1 : depth + 1, self, root_fd,
                                rel.empty() ? e.name : rel + "/" + e.name);
          !s)
        return s;
    } else if (S_ISLNK(e.st.st_mode)) {
      if (depth < 0) continue;
      auto target = ReadHostLink(dirfd, e.name, child);
      if (!target) {
        problems.Add(target.error());
      } else if (!StaysInside(*target, depth) ||
                 LeadsOut(root_fd, rel, *target)) {
        problems.Add(child + ": a symlink to " + *target +
                     ", outside the skill's folder; a skill must hold "
                     "everything it uses (copy the file in, or link within "
                     "the folder)");
      }
    } else if (!S_ISREG(e.st.st_mode)) {
      problems.Add(SpecialFileMessage(child, e.st.st_mode));
    } else if (faccessat(dirfd, e.name.c_str(), R_OK, AT_EACCESS) != 0 &&
               errno == EACCES) {
      // Found now, not after the files before it were committed.
      problems.Add(child +
                   ": cannot be read by this user (permission denied); make "
                   "it readable, or move it out of the folder");
    }
  }
  return {};
}

// At most `limit` bytes from the start of the regular file `name`.
Result<std::string> ReadHostPrefix(int dirfd, const std::string& name,
                                   const std::string& shown, size_t limit) {
  // O_NONBLOCK: a FIFO swapped in after the caller's lstat must not hang us.
  Fd fd(openat(dirfd, name.c_str(),
               O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return HostErrno("open", shown);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return HostErrno("stat", shown);
  if (!S_ISREG(st.st_mode)) {
    return Fail(EINVAL, shown + ": must be a regular file, not a " +
                            TypeName(st.st_mode));
  }
  std::string text(std::min<size_t>(limit, static_cast<size_t>(st.st_size)),
                   '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = pread(fd.get(), text.data() + got, text.size() - got,
                      static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return HostErrno("read", shown);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

// `data` at `offset` of the host file `fd`.
Status PWriteAllHost(int fd, std::string_view data, off_t offset,
                     const std::string& shown) {
  while (!data.empty()) {
    ssize_t n = pwrite(fd, data.data(), data.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return HostErrno("write", shown);
    data.remove_prefix(static_cast<size_t>(n));
    offset += n;
  }
  return {};
}

bool AllZero(std::string_view data) {
  return std::all_of(data.begin(), data.end(), [](char c) { return c == 0; });
}

Result<std::string> ReadHostLink(int dirfd, const std::string& name,
                                 const std::string& shown) {
  std::vector<char> buf(PATH_MAX + 1);
  ssize_t n = readlinkat(dirfd, name.c_str(), buf.data(), buf.size());
  if (n < 0) return HostErrno("readlink", shown);
  if (static_cast<size_t>(n) == buf.size()) {
    return Fail(ENAMETOOLONG, shown + ": symlink target is too long");
  }
  return std::string(buf.data(), static_cast<size_t>(n));
}

// Gives a directory we are about to fill owner rwx (needed when not root).
Status MakeHostDirWritable(int fd, const std::string& shown) {
  struct stat st;
  if (fstat(fd, &st) != 0) return HostErrno("stat", shown);
  if ((st.st_mode & S_IRWXU) != S_IRWXU &&
      fchmod(fd, (st.st_mode & 07777) | S_IRWXU) != 0) {
    return HostErrno("chmod", shown);
  }
  return {};
}

// The directory `name` (relative to `at`), opened without following a
// symlink there: ELOOP, saying so, for one. A link may have been planted by
// whoever can write the directory it is in, such as an agent in its
// workspace; the caller names the directory it leads to if it means it.
Result<Fd> OpenDirNoFollow(int at, const std::string& name,
                           const std::string& shown) {
  Fd fd(openat(at, name.c_str(),
               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.valid()) return fd;
  int err = errno;
  struct stat st;
  if ((err == ELOOP || err == ENOTDIR) &&
      fstatat(at, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISLNK(st.st_mode)) {
    return Fail(ELOOP, shown +
                           ": is a symlink; agentvfs does not follow it "
                           "(name the directory it leads to, if that is "
                           "what you mean)");
  }
  errno = err;
  return HostErrno("open directory", shown);
}

// The directory a command names on the host (the way to it is the caller's
// path, looked up as given), never a symlink itself.
Result<Fd> OpenHostTop(const std::string& host_dir) {
  std::string path = host_dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return OpenDirNoFollow(AT_FDCWD, path, host_dir);
}

timespec OmitTime() { return timespec{0, UTIME_OMIT}; }

// The name of the folder `host_dir` names, also for "." and "dir/".
std::string FolderName(const std::string& host_dir) {
  std::string s = host_dir;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  size_t slash = s.rfind('/');
  std::string base = slash == std::string::npos ? s : s.substr(slash + 1);
  if (base.empty() || base == "." || base == "..") {
    if (char* real = realpath(host_dir.c_str(), nullptr)) {
      std::string r = real;
      free(real);
      base = r.substr(r.rfind('/') + 1);
    }
  }
  return base;
}

// Validates the skill folder open at `dirfd` (named `folder` on the host,
// shown as `shown` in messages).
Result<SkillInfo> ValidateSkillAt(int dirfd, const std::string& shown,
                                  const std::string& folder) {
  Problems problems;
  SkillInfo info;
  std::string file = JoinHost(shown, kSkillMd);
  struct stat st;
  if (fstatat(dirfd, std::string(kSkillMd).c_str(), &st, AT_SYMLINK_NOFOLLOW) !=
      0) {
    if (errno == ENOENT) {
      problems.Add(file +
                   ": missing; a skill folder needs a SKILL.md whose front "
                   "matter has name: and description:");
    } else {
      problems.Add(vfs::FromErrno(errno, "stat", file));
    }
  } else if (!S_ISREG(st.st_mode)) {
    problems.Add(file + ": must be a regular file, not a " +
                 TypeName(st.st_mode));
  } else if (auto text = ReadHostPrefix(dirfd, std::string(kSkillMd), file,
                                        kMaxSkillMdReadBytes);
             !text) {
    problems.Add(text.error());
  } else if (auto parsed = ParseSkillMd(*text, folder, file); !parsed) {
    problems.Add(parsed.error());
  } else {
    info = std::move(*parsed);
  }
  if (auto s = ScanHostTree(dirfd, shown, problems, /*depth=*/0, nullptr,
                            /*root_fd=*/dirfd);
      !s)
    problems.Add(s.error());
  if (!problems.empty()) return Unexpected(problems.ToError());
  return info;
}

// ---------------------------------------------------------------- copying

// Reads `h` from offset 0 to EOF (or `limit` bytes) through `buf`.
Status ReadHandle(vfs::FileHandle& h, std::vector<char>& buf, size_t limit,
                  const Sink& sink) {
  off_t offset = 0;
  size_t total = 0;
  while (total < limit) {
    size_t want = std::min(buf.size(), limit - total);
    auto n = h.Read(buf.data(), want, offset);
    if (!n) return Unexpected(n.error());
    if (*n == 0) break;
    if (auto s = sink(std::string_view(buf.data(), *n)); !s) return s;
    offset += static_cast<off_t>(*n);
    total += *n;
  }
  return {};
}

bool IsNotSupported(const Error& e) {
  return e.code == ENOTSUP || e.code == EOPNOTSUPP;
}

// One ImportTree call: host tree -> backend.
class Importer {
 public:
  Importer(vfs::Backend& backend, const vfs::Caller& caller,
           const ImportOptions& options)
      : backend_(backend), caller_(caller), options_(options) {}

  // Makes the top of the copy a directory we can fill: created when
  // missing; ENOTDIR when something else is there.
  // True when it made it.
  Result<bool> PrepareTop(const Path& dest) {
    auto attr = backend_.Stat(caller_, dest);
    if (!attr && attr.error().code == ENOENT) {
      auto made = backend_.Mkdir(caller_, dest, S_IRWXU);
      if (made) return true;
      // Made meanwhile (another import of the same tree): fill it too.
      if (made.error().code != EEXIST)
        return WithContext(made.error(), "create " + dest.str());
      attr = backend_.Stat(caller_, dest);
    }
    if (!attr) return WithContext(attr.error(), "stat " + dest.str());
    if (!S_ISDIR(attr->st_mode)) {
      return Fail(ENOTDIR, dest.str() + ": exists and is a " +
                               TypeName(attr->st_mode) +
                               ", not a directory to import into");
    }
    if (auto s = MakeWritable(dest, attr->st_mode); !s)
      return Unexpected(s.error());
    return false;
  }

  // Adds a problem for every entry of the host directory open at `dirfd`
  // whose counterpart under `dest` exists with another type.
  Status CheckTypes(int dirfd, const std::string& shown, const Path& dest,
                    Problems& problems) {
    auto attr = backend_.Stat(caller_, dest);
    if (!attr) {
      if (attr.error().code == ENOENT) return {};
      return WithContext(attr.error(), "stat " + dest.str());
    }
    if (!S_ISDIR(attr->st_mode)) return {};  // PrepareTop says so
    auto entries = ListHostDir(dirfd, shown);
    if (!entries) return Unexpected(entries.error());
    for (const HostEntry& e : *entries) {
      std::string child_shown = JoinHost(shown, e.name);
      auto child = dest.Child(e.name);
      if (!child) return WithContext(child.error(), child_shown);
      auto there = backend_.Stat(caller_, *child);
      if (!there) {
        if (there.error().code == ENOENT) continue;
        return WithContext(there.error(), "stat " + child->str());
      }
      if ((there->st_mode & S_IFMT) != (e.st.st_mode & S_IFMT)) {
        problems.Add(child_shown + " is a " + TypeName(e.st.st_mode) + " but " +
                     child->str() + " is a " + TypeName(there->st_mode) +
                     "; `import --delete` replaces it (what it holds stays "
                     "in its history), or move one of them");
      } else if (S_ISDIR(e.st.st_mode)) {
        auto sub = OpenHostSubdir(dirfd, e.name, child_shown);
        if (!sub) return Unexpected(sub.error());
        if (auto s = CheckTypes(sub->get(), child_shown, *child, problems); !s)
          return s;
      }
    }
    return {};
  }

  // Copies the entries of the host directory open at `dirfd` into the
  // existing directory `dest`, then gives `dest` the mode and mtime `st`.
  Status CopyDir(int dirfd, const std::string& shown, const Path& dest,
                 const struct stat& st) {
    auto entries = ListHostDir(dirfd, shown);
    if (!entries) return Unexpected(entries.error());
    auto listed = backend_.ReadDir(caller_, dest);
    if (!listed) return WithContext(listed.error(), "list " + dest.str());

    std::set<std::string> source_names;
    for (const HostEntry& e : *entries) source_names.insert(e.name);
    std::set<std::string> existing;
    for (const vfs::DirEntry& d : *listed) {
      if (source_names.contains(d.name)) {
        existing.insert(d.name);
      } else if (options_.remove_extra) {
        auto child = dest.Child(d.name);
        if (!child) return WithContext(child.error(), dest.str());
        if (auto s = RemoveTree(*child); !s) return s;
      }
    }

    for (const HostEntry& e : *entries) {
      if (options_.stopped && options_.stopped())
        return Fail(EINTR, "import interrupted");
      std::string child_shown = JoinHost(shown, e.name);
      auto child = dest.Child(e.name);
      if (!child) return WithContext(child.error(), child_shown);
      // What `dest` already has under this name (null: nothing).
      vfs::Attr old_attr{};
      const vfs::Attr* old = nullptr;
      if (existing.contains(e.name)) {
        auto attr = backend_.Stat(caller_, *child);
        if (!attr) return WithContext(attr.error(), "stat " + child->str());
        old_attr = *attr;
        old = &old_attr;
        if ((old->st_mode & S_IFMT) != (e.st.st_mode & S_IFMT)) {
          if (auto s = RemoveTree(*child); !s) return s;
          old = nullptr;
        }
      }
      Status s;
      if (S_ISREG(e.st.st_mode)) {
        s = CopyFile(dirfd, e.name, child_shown, *child, old);
      } else if (S_ISDIR(e.st.st_mode)) {
        s = CopySubdir(dirfd, e.name, child_shown, *child, old);
      } else if (S_ISLNK(e.st.st_mode)) {
        s = CopySymlink(dirfd, e, child_shown, *child, old);
      } else {
        s = Fail(EINVAL, SpecialFileMessage(child_shown, e.st.st_mode));
      }
      if (!s) return s;
    }
    return SetModeAndTime(dest, st);
  }

 private:
  Status CopySubdir(int dirfd, const std::string& name,
                    const std::string& shown, const Path& dest,
                    const vfs::Attr* old) {
    auto sub = OpenHostSubdir(dirfd, name, shown);
    if (!sub) return Unexpected(sub.error());
    struct stat st;
    if (fstat(sub->get(), &st) != 0) return HostErrno("stat", shown);
    if (!old) {
      if (auto s = backend_.Mkdir(caller_, dest, S_IRWXU); !s) {
        return WithContext(s.error(), "create " + dest.str());
      }
    } else if (auto s = MakeWritable(dest, old->st_mode); !s) {
      return s;
    }
    return CopyDir(sub->get(), shown, dest, st);
  }

  Status CopyFile(int dirfd, const std::string& name, const std::string& shown,
                  const Path& dest, const vfs::Attr* old) {
    // O_NONBLOCK: a FIFO swapped in since the listing must not hang us.
    Fd in(openat(dirfd, name.c_str(),
                 O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!in.valid()) return HostErrno("open", shown);
    struct stat st;
    if (fstat(in.get(), &st) != 0) return HostErrno("stat", shown);
    if (!S_ISREG(st.st_mode)) {
      return Fail(EINVAL, shown + ": changed while being copied (now a " +
                              TypeName(st.st_mode) + ")");
    }
    // The same bytes already there: nothing to commit (a re-import of an
    // unchanged tree adds no versions); mode and mtime still follow.
    if (old && old->st_size == st.st_size) {
      auto same = SameBytes(in.get(), shown, dest);
      if (!same) return Unexpected(same.error());
      if (*same) return SetModeAndTime(dest, st);
    }
    if (old && (old->st_mode & S_IWUSR) == 0) {
      if (auto s =
              backend_.Chmod(caller_, dest, (old->st_mode & 07777) | S_IWUSR);
          !s) {
        return WithContext(s.error(), "chmod " + dest.str());
      }
    }
    auto handle =
        backend_.Open(caller_, dest, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW,
                      S_IRUSR | S_IWUSR);
    if (!handle) return WithContext(handle.error(), "open " + dest.str());
    // A copy that fails part-way commits nothing: the file keeps the
    // version it had (or, new, stays empty).
    struct DiscardUnlessDone {
      vfs::FileHandle& h;
      bool done = false;
      ~DiscardUnlessDone() {
        if (!done) h.Discard();
      }
    } discard{**handle};
    off_t offset = 0;
    for (;;) {
      if (options_.stopped && options_.stopped())
        return Fail(EINTR, "import interrupted");
      ssize_t n = read(in.get(), buf_.data(), buf_.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return HostErrno("read", shown);
      if (n == 0) break;
      size_t done = 0;
      while (done < static_cast<size_t>(n)) {
        auto w = (*handle)->Write(buf_.data() + done,
                                  static_cast<size_t>(n) - done, offset);
        if (!w) return WithContext(w.error(), "write " + dest.str());
        if (*w == 0) return Fail(EIO, "write " + dest.str() + ": no progress");
        done += *w;
        offset += static_cast<off_t>(*w);
      }
    }
    // The host file's mode before the commit, so that the version records
    // it (a new file was made 0600 to be written, a read-only one given
    // S_IWUSR); a handle that cannot change modes gets it by path below.
    // Flush is where a committing backend commits; then close the handle
    // before changing attributes by path.
    if (auto s = (*handle)->Chmod(st.st_mode & 07777);
        !s && s.error().code != ENOTSUP)
      return WithContext(s.error(), "chmod " + dest.str());
    discard.done = true;
    if (auto s = (*handle)->Flush(); !s) {
      return WithContext(s.error(), "commit " + dest.str());
    }
    handle->reset();
    return SetModeAndTime(dest, st);
  }

  // Whether the store file `dest` holds exactly the bytes of the host file
  // open as `fd` (of the same size), compared a piece at a time.
  Result<bool> SameBytes(int fd, const std::string& shown, const Path& dest) {
    auto handle = backend_.Open(caller_, dest, O_RDONLY | O_NOFOLLOW);
    if (!handle) return WithContext(handle.error(), "open " + dest.str());
    std::vector<char>& theirs = theirs_;
    theirs.resize(buf_.size());  // allocated once per import
    for (off_t offset = 0;;) {
      ssize_t n = pread(fd, buf_.data(), buf_.size(), offset);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return HostErrno("read", shown);
      size_t got = 0;
      while (got < static_cast<size_t>(n)) {
        auto r = (*handle)->Read(theirs.data() + got,
                                 static_cast<size_t>(n) - got, offset + got);
        if (!r) return WithContext(r.error(), "read " + dest.str());
        if (*r == 0) return false;  // shorter than the host file
        got += *r;
      }
      if (std::memcmp(buf_.data(), theirs.data(), got) != 0) return false;
      if (n == 0) {
        char extra;
        auto r = (*handle)->Read(&extra, 1, offset);
        if (!r) return WithContext(r.error(), "read " + dest.str());
        return *r == 0;
      }
      offset += n;
    }
  }

  Status CopySymlink(int dirfd, const HostEntry& e, const std::string& shown,
                     const Path& dest, const vfs::Attr* old) {
    auto target = ReadHostLink(dirfd, e.name, shown);
    if (!target) return Unexpected(target.error());
    bool create = true;
    if (old) {
      auto current = backend_.Readlink(caller_, dest);
      if (current && *current == *target) {
        create = false;
      } else if (auto s = backend_.Unlink(caller_, dest); !s) {
        return WithContext(s.error(), "remove " + dest.str());
      }
    }
    if (create) {
      if (auto s = backend_.Symlink(caller_, *target, dest); !s) {
        return WithContext(s.error(), "symlink " + dest.str());
      }
    }
    timespec times[2] = {OmitTime(), e.st.st_mtim};
    if (auto s = backend_.Utimens(caller_, dest, times);
        !s && !IsNotSupported(s.error())) {
      return WithContext(s.error(), "set mtime of " + dest.str());
    }
    return {};
  }

  // Gives `path` the permission bits and mtime of `st` (mode only when it
  // differs, so an unchanged mode makes no change in a versioned store).
  Status SetModeAndTime(const Path& path, const struct stat& st) {
    mode_t want = st.st_mode & kCopiedModeBits;
    auto attr = backend_.Stat(caller_, path);
    if (!attr) return WithContext(attr.error(), "stat " + path.str());
    if ((attr->st_mode & 07777) != want) {
      if (auto s = backend_.Chmod(caller_, path, want); !s) {
        return WithContext(s.error(), "chmod " + path.str());
      }
    }
    timespec times[2] = {OmitTime(), st.st_mtim};
    if (auto s = backend_.Utimens(caller_, path, times); !s) {
      return WithContext(s.error(), "set mtime of " + path.str());
    }
    return {};
  }

  // Owner rwx on a directory we are about to fill or empty (when not root).
  Status MakeWritable(const Path& dir, mode_t mode) {
    if ((mode & S_IRWXU) == S_IRWXU) return {};
    if (auto s = backend_.Chmod(caller_, dir, (mode & 07777) | S_IRWXU); !s) {
      return WithContext(s.error(), "chmod " + dir.str());
    }
    return {};
  }

  Status RemoveTree(const Path& path) {
    auto attr = backend_.Stat(caller_, path);
    if (!attr) {
      if (attr.error().code == ENOENT) return {};
      return WithContext(attr.error(), "stat " + path.str());
    }
    if (!S_ISDIR(attr->st_mode)) {
      if (auto s = backend_.Unlink(caller_, path); !s) {
        return WithContext(s.error(), "remove " + path.str());
      }
      return {};
    }
    if (auto s = MakeWritable(path, attr->st_mode); !s) return s;
    auto listed = backend_.ReadDir(caller_, path);
    if (!listed) return WithContext(listed.error(), "list " + path.str());
    for (const vfs::DirEntry& d : *listed) {
      auto child = path.Child(d.name);
      if (!child) return WithContext(child.error(), path.str());
      if (auto s = RemoveTree(*child); !s) return s;
    }
    if (auto s = backend_.Rmdir(caller_, path); !s) {
      return WithContext(s.error(), "remove " + path.str());
    }
    return {};
  }

  vfs::Backend& backend_;
  const vfs::Caller& caller_;
  const ImportOptions& options_;
  std::vector<char> buf_ = std::vector<char>(kCopyPieceBytes);
  std::vector<char> theirs_;  // the store's side of SameBytes
};

// One ExportTree call: backend tree -> host.
// The process's umask, read without changing it (/proc/self/status), so
// that other threads never create files under a umask of 0.
mode_t CurrentUmask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0) {
      return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8)) & 0777;
    }
  }
  return 022;
}

// Exported files and directories get the store's modes less the umask, as
// tar does for a user who is not root: who may write a skill in the store
// does not decide that the copy in someone's home is writable by everyone.
// The name of an entry an export is making, before it is renamed into
// place.
constexpr std::string_view kTempPrefix = ".agentvfs-export-";

class Exporter {
 public:
  Exporter(vfs::Backend& backend, const vfs::Caller& caller, mode_t umask,
           std::function<bool()> stopped)
      : backend_(backend),
        caller_(caller),
        umask_(umask),
        stopped_(std::move(stopped)) {}

  // The host directory exported into is on a FUSE mount, with this inode
  // number: a store directory with the same is that directory (SelfCheck).
  void ExportingInto(ino_t ino) { into_ = ino; }

  // Copies the entries of the backend directory `src` into the host
  // directory open at `dirfd` (shown as `shown`). Temporary files an
  // export killed there left behind (kTempPrefix) are removed: a merge
  // into the directory of an interrupted export kept 190 MB of them.
  Status CopyDir(const Path& src, int dirfd, const std::string& shown) {
    if (auto here = ListHostDir(dirfd, shown)) {
      for (const HostEntry& e : *here)
        if (e.name.starts_with(kTempPrefix) && S_ISREG(e.st.st_mode))
          unlinkat(dirfd, e.name.c_str(), 0);
    }
    auto listed = backend_.ReadDir(caller_, src);
    if (!listed) return WithContext(listed.error(), "list " + src.str());
    std::sort(listed->begin(), listed->end(),
              [](const vfs::DirEntry& a, const vfs::DirEntry& b) {
                return a.name < b.name;
              });
    for (const vfs::DirEntry& d : *listed) {
      if (stopped_ && stopped_()) return Fail(EINTR, "export interrupted");
      auto child = src.Child(d.name);
      if (!child) return WithContext(child.error(), src.str());
      auto attr = backend_.Stat(caller_, *child);
      if (!attr) return WithContext(attr.error(), "stat " + child->str());
      std::string child_shown = JoinHost(shown, d.name);
      if (into_ != 0 && S_ISDIR(attr->st_mode) && attr->st_ino == into_) {
        return Fail(EINVAL, child->str() +
                                " is the directory exported into, "
                                "seen through a mount of the "
                                "store: a directory cannot be "
                                "copied into itself; export "
                                "outside " +
                                src.str());
      }
      if (auto s = CopyEntry(*child, *attr, dirfd, d.name, child_shown); !s) {
        return s;
      }
    }
    return {};
  }

 private:
  Status CopyEntry(const Path& src, const vfs::Attr& attr, int dirfd,
                   const std::string& name, const std::string& shown) {
    mode_t type = attr.st_mode & S_IFMT;
    if (type != S_IFREG && type != S_IFDIR && type != S_IFLNK) {
      return Fail(EINVAL, SpecialFileMessage(src.str(), attr.st_mode));
    }
    // What is already on the host under this name: a directory is merged
    // into (or refused); anything else is replaced, never written through:
    // the new file or link is made under a temporary name and renamed over
    // it, so a copy that fails leaves the old one in place.
    bool have_dir = false;
    struct stat host;
    if (fstatat(dirfd, name.c_str(), &host, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISDIR(host.st_mode)) {
        if (type != S_IFDIR) {
          return Fail(EEXIST, shown + ": is a directory on the host, but " +
                                  src.str() + " is a " + TypeName(type) +
                                  "; remove it or export elsewhere");
        }
        have_dir = true;
      } else if (type == S_IFDIR && unlinkat(dirfd, name.c_str(), 0) != 0) {
        return HostErrno("remove", shown);
      }
    } else if (errno != ENOENT) {
      return HostErrno("stat", shown);
    }

    timespec times[2] = {OmitTime(), attr.st_mtim};
    mode_t mode = attr.st_mode & kCopiedModeBits & ~umask_;
    if (type == S_IFLNK) {
      auto target = backend_.Readlink(caller_, src);
      if (!target) return WithContext(target.error(), "readlink " + src.str());
      TempName temp(dirfd);
      if (symlinkat(target->c_str(), dirfd, temp.name().c_str()) != 0) {
        return HostErrno("symlink", shown);
      }
      temp.made();
      if (utimensat(dirfd, temp.name().c_str(), times, AT_SYMLINK_NOFOLLOW) !=
              0 &&
          errno != EOPNOTSUPP) {
        return HostErrno("set mtime of", shown);
      }
      return temp.RenameTo(name, shown);
    }
    if (type == S_IFDIR) {
      if (!have_dir && mkdirat(dirfd, name.c_str(), S_IRWXU) != 0) {
        return HostErrno("mkdir", shown);
      }
      auto sub = OpenHostSubdir(dirfd, name, shown);
      if (!sub) return Unexpected(sub.error());
      // A host directory merged into keeps its own mode (a ~/.ssh is not
      // opened up to the store's 0755).
      struct stat was;
      if (have_dir && fstat(sub->get(), &was) == 0) mode = was.st_mode & 07777;
      if (auto s = MakeHostDirWritable(sub->get(), shown); !s) return s;
      if (auto s = CopyDir(src, sub->get(), shown); !s) return s;
      if (fchmod(sub->get(), mode) != 0) return HostErrno("chmod", shown);
      if (futimens(sub->get(), times) != 0) {
        return HostErrno("set mtime of", shown);
      }
      return {};
    }
    auto handle = backend_.Open(caller_, src, O_RDONLY | O_NOFOLLOW, 0);
    if (!handle) return WithContext(handle.error(), "open " + src.str());
    TempName temp(dirfd);
    Fd out(openat(dirfd, temp.name().c_str(),
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  S_IRUSR | S_IWUSR));
    if (!out.valid()) return HostErrno("create", shown);
    temp.made();
    // A piece of zeros is left a hole, so a sparse file stays sparse (the
    // size is set at the end).
    off_t size = 0;
    if (auto s = ReadHandle(**handle, buf_, SIZE_MAX,
                            [&](std::string_view piece) -> Status {
                              if (stopped_ && stopped_())
                                return Fail(EINTR, "export interrupted");
                              const off_t at = size;
                              size += static_cast<off_t>(piece.size());
                              if (AllZero(piece)) return {};
                              return PWriteAllHost(out.get(), piece, at, shown);
                            });
        !s) {
      return WithContext(s.error(), "copy " + src.str());
    }
    if (ftruncate(out.get(), size) != 0) return HostErrno("truncate", shown);
    if (fchmod(out.get(), mode) != 0) return HostErrno("chmod", shown);
    if (futimens(out.get(), times) != 0)
      return HostErrno("set mtime of", shown);
    if (out.Close() != 0) return HostErrno("close", shown);
    return temp.RenameTo(name, shown);
  }

  // A fresh name in the host directory `dirfd` for an entry being made;
  // the entry is removed again unless it was renamed into place.
  class TempName {
   public:
    explicit TempName(int dirfd) : dirfd_(dirfd) {
      std::random_device random;
      char hex[17];
      std::snprintf(hex, sizeof hex, "%08x%08x", random(), random());
      name_ = std::string(kTempPrefix) + hex;
    }
    TempName(const TempName&) = delete;
    TempName& operator=(const TempName&) = delete;
    ~TempName() {
      if (made_) unlinkat(dirfd_, name_.c_str(), 0);
    }
    const std::string& name() const { return name_; }
    void made() { made_ = true; }
    Status RenameTo(const std::string& name, const std::string& shown) {
      if (renameat(dirfd_, name_.c_str(), dirfd_, name.c_str()) != 0) {
        return HostErrno("rename into place", shown);
      }
      made_ = false;
      return {};
    }

   private:
    int dirfd_;
    std::string name_;
    bool made_ = false;
  };

  vfs::Backend& backend_;
  const vfs::Caller& caller_;
  mode_t umask_;
  ino_t into_ = 0;
  std::function<bool()> stopped_;
  std::vector<char> buf_ = std::vector<char>(kCopyPieceBytes);
};

}  // namespace

// yaml-cpp takes a quoted scalar left open to the end of the text as
// ending there (`description: "unterminated` is "unterminated "), where the
// YAML spec and other parsers fail. Returns the mark of the first quoted
// scalar below `node` that has no closing quote in `yaml`.
std::optional<YAML::Mark> UnclosedQuote(const YAML::Node& node,
                                        std::string_view yaml) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      for (const auto& kv : node) {
        if (auto m = UnclosedQuote(kv.first, yaml)) return m;
        if (auto m = UnclosedQuote(kv.second, yaml)) return m;
      }
      return std::nullopt;
    case YAML::NodeType::Sequence:
      for (const YAML::Node& item : node) {
        if (auto m = UnclosedQuote(item, yaml)) return m;
      }
      return std::nullopt;
    case YAML::NodeType::Scalar:
      break;
    default:
      return std::nullopt;
  }
  YAML::Mark mark = node.Mark();
  if (mark.is_null() || mark.pos < 0 ||
      static_cast<size_t>(mark.pos) >= yaml.size())
    return std::nullopt;
  char quote = yaml[static_cast<size_t>(mark.pos)];
  if (quote != '"' && quote != '\'') return std::nullopt;
  for (size_t i = static_cast<size_t>(mark.pos) + 1; i < yaml.size(); ++i) {
    if (quote == '"' && yaml[i] == '\\') {
      ++i;  // an escape: the next character is part of the text
    } else if (yaml[i] == quote) {
      if (quote == '\'' && i + 1 < yaml.size() && yaml[i + 1] == '\'') {
        ++i;  // '' is a quote inside single quotes
      } else {
        return std::nullopt;
      }
    }
  }
  return mark;
}

vfs::Result<SkillInfo> ParseSkillMd(std::string_view text,
                                    std::string_view folder_name,
                                    std::string_view file_for_messages) {
  std::string file(file_for_messages);
  auto yaml = ExtractFrontMatter(text, file);
  if (!yaml) return Unexpected(yaml.error());
  Problems problems;
  SkillInfo info;
  try {
    YAML::Node root = YAML::Load(std::string(*yaml));
    if (auto open = UnclosedQuote(root, *yaml)) {
      throw YAML::ParserException(*open, "a quoted string is never closed");
    }
    FieldChecker(file, folder_name, problems).Check(root, info);
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null()) {
      // The front matter starts on the file's second line.
      where = " (line " + std::to_string(e.mark.line + 2) + ", column " +
              std::to_string(e.mark.column + 1) + ")";
    }
    return Fail(EINVAL, file + ": front matter is not valid YAML" + where +
                            ": " + e.msg);
  }
  if (!problems.empty()) return Unexpected(problems.ToError());
  return info;
}

vfs::Result<SkillInfo> ValidateSkillFolder(const std::string& host_dir) {
  auto top = OpenHostTop(host_dir);
  if (!top) return Unexpected(top.error());
  Fd root = std::move(*top);
  return ValidateSkillAt(root.get(), host_dir, FolderName(host_dir));
}

vfs::Result<std::vector<HostSkill>> FindSkills(const std::string& host_dir) {
  auto top = OpenHostTop(host_dir);
  if (!top) return Unexpected(top.error());
  Fd root = std::move(*top);
  struct stat st;
  if (fstatat(root.get(), std::string(kSkillMd).c_str(), &st,
              AT_SYMLINK_NOFOLLOW) == 0 ||
      errno != ENOENT) {
    auto info = ValidateSkillAt(root.get(), host_dir, FolderName(host_dir));
    if (!info) return Unexpected(info.error());
    struct stat self;
    if (fstat(root.get(), &self) != 0) return HostErrno("stat", host_dir);
    return std::vector<HostSkill>{
        HostSkill{host_dir, std::move(*info), self.st_dev, self.st_ino}};
  }

  auto entries = ListHostDir(root.get(), host_dir);
  if (!entries) return Unexpected(entries.error());
  Problems problems;
  std::vector<HostSkill> skills;
  for (const HostEntry& e : *entries) {
    if (e.name.starts_with('.') || S_ISREG(e.st.st_mode)) continue;
    std::string shown = JoinHost(host_dir, e.name);
    if (S_ISLNK(e.st.st_mode)) {
      problems.Add(shown +
                   ": is a symlink; skills are imported from real folders "
                   "(import the folder it points to by its own path)");
    } else if (!S_ISDIR(e.st.st_mode)) {
      problems.Add(shown + ": is a " + TypeName(e.st.st_mode) +
                   "; a folder of skills holds skill folders");
    } else if (auto sub = OpenHostSubdir(root.get(), e.name, shown); !sub) {
      problems.Add(sub.error());
    } else if (auto info = ValidateSkillAt(sub->get(), shown, e.name); !info) {
      problems.Add(info.error());
    } else if (struct stat self; fstat(sub->get(), &self) != 0) {
      problems.Add(HostErrno("stat", shown).error());
    } else {
      skills.push_back(
          HostSkill{shown, std::move(*info), self.st_dev, self.st_ino});
    }
  }
  if (!problems.empty()) return Unexpected(problems.ToError());
  if (skills.empty()) {
    return Fail(EINVAL, host_dir +
                            ": holds no SKILL.md and no skill folders; give a "
                            "skill folder or a folder of skill folders");
  }
  return skills;
}

namespace {

// ImportTree from the host directory open at `root`.
vfs::Status ImportOpenTree(vfs::Backend& backend, const vfs::Caller& caller,
                           int root, const std::string& host_dir,
                           const vfs::Path& dest,
                           const ImportOptions& options) {
  // Refuse special files before writing anything, and, when the source is
  // seen through a mount, a source holding the destination.
  SelfCheck self{dest, 0, OnFuse(root)};
  if (self.host_is_fuse) {
    if (auto attr = backend.Stat(caller, dest)) self.ino = attr->st_ino;
  }
  Problems problems;
  if (auto s = ScanHostTree(root, host_dir, problems, -1,
                            self.ino != 0 ? &self : nullptr);
      !s)
    return s;
  if (!problems.empty()) return Unexpected(problems.ToError());
  struct stat st;
  if (fstat(root, &st) != 0) return HostErrno("stat", host_dir);

  Importer importer(backend, caller, options);
  // Without remove_extra nothing of the store is removed: an entry whose
  // type differs from the source's (a directory where the source has a
  // file would go with everything under it) is refused before anything
  // is written.
  if (!options.remove_extra) {
    if (auto s = importer.CheckTypes(root, host_dir, dest, problems); !s)
      return s;
    if (!problems.empty()) return Unexpected(problems.ToError());
  }
  auto created = importer.PrepareTop(dest);
  if (!created) return Unexpected(created.error());
  if (*created && self.host_is_fuse) {
    // The destination made now must not be inside the source either.
    auto attr = backend.Stat(caller, dest);
    if (!attr) return WithContext(attr.error(), "stat " + dest.str());
    self.ino = attr->st_ino;
    if (auto s = ScanHostTree(root, host_dir, problems, -1, &self); !s)
      return s;
    if (!problems.empty()) {
      (void)backend.Rmdir(caller, dest);
      return Unexpected(problems.ToError());
    }
  }
  return importer.CopyDir(root, host_dir, dest, st);
}

}  // namespace

vfs::Status ImportTree(vfs::Backend& backend, const vfs::Caller& caller,
                       const std::string& host_dir, const vfs::Path& dest,
                       const ImportOptions& options) {
  auto top = OpenHostTop(host_dir);
  if (!top) return Unexpected(top.error());
  Fd root = std::move(*top);
  return ImportOpenTree(backend, caller, root.get(), host_dir, dest, options);
}

vfs::Status ExportTree(vfs::Backend& backend, const vfs::Caller& caller,
                       const vfs::Path& src, const std::string& host_dir,
                       const ExportOptions& options) {
  auto attr = backend.Stat(caller, src);
  if (!attr) return WithContext(attr.error(), "stat " + src.str());
  if (!S_ISDIR(attr->st_mode)) {
    return Fail(ENOTDIR, src.str() + ": is a " + TypeName(attr->st_mode) +
                             "; export copies a directory");
  }
  // The way to the destination is the caller's path, looked up once, as
  // given; the destination itself is made and opened relative to its
  // parent and never through a symlink, so that nobody who can write the
  // parent (an agent, in its workspace) can turn the export elsewhere.
  std::string path = host_dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string parent_path = ".", name = path;
  if (auto slash = path.rfind('/'); slash != std::string::npos) {
    parent_path = slash == 0 ? "/" : path.substr(0, slash);
    name = path.substr(slash + 1);
  }
  Fd parent;
  Fd root;
  bool created = false;
  if (name.empty() || name == "." || name == ".." || path == "/") {
    auto top = OpenHostTop(path);  // nothing to make: it exists
    if (!top) return Unexpected(top.error());
    root = std::move(*top);
  } else {
    parent = Fd(open(parent_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!parent.valid()) return HostErrno("open directory", parent_path);
    created = mkdirat(parent.get(), name.c_str(), S_IRWXU) == 0;
    if (!created && errno != EEXIST) return HostErrno("mkdir", host_dir);
    auto opened = OpenDirNoFollow(parent.get(), name, host_dir);
    if (!opened) return Unexpected(opened.error());
    root = std::move(*opened);
  }
  // (A directory swapped in for the one just made is not told apart by
  // its owner, which NFS or vfat may map; unless merging, it must be empty
  // like the one made.)
  struct stat top;
  if (fstat(root.get(), &top) != 0) return HostErrno("stat", host_dir);

  // Whether everything in the directory is ours: one it made, or an
  // existing one found empty.
  bool all_ours = created;
  auto copy = [&]() -> vfs::Status {
    if (!options.into_non_empty) {
      auto entries = ListHostDir(root.get(), host_dir);
      if (!entries) return Unexpected(entries.error());
      if (!entries->empty()) {
        return Fail(EEXIST, host_dir +
                                ": is not empty; export into a new or empty "
                                "directory, or merge into this one (--merge)");
      }
      all_ours = true;
    }
    if (auto s = MakeHostDirWritable(root.get(), host_dir); !s) return s;
    const mode_t umask = CurrentUmask();
    Exporter exporter(backend, caller, umask, options.stopped);
    if (OnFuse(root.get())) exporter.ExportingInto(top.st_ino);
    if (auto s = exporter.CopyDir(src, root.get(), host_dir); !s) return s;
    // A directory merged into keeps its own mode; a new or empty one gets
    // the store's.
    mode_t mode = options.into_non_empty && !created
                      ? top.st_mode & 07777
                      : attr->st_mode & kCopiedModeBits & ~umask;
    if (fchmod(root.get(), mode) != 0) return HostErrno("chmod", host_dir);
    timespec times[2] = {OmitTime(), attr->st_mtim};
    if (futimens(root.get(), times) != 0) {
      return HostErrno("set mtime of", host_dir);
    }
    return {};
  };
  auto result = copy();
  if (!result && all_ours) {
    // Leave no half-written copy behind: empty the directory, through its
    // descriptor; remove it if this call made it and its name still leads
    // to it, else give it back its mode.
    int fd = dup(root.get());
    if (fd >= 0) vfs::RemoveTreeAt(fd);
    struct stat now;
    if (!created) {
      fchmod(root.get(), top.st_mode & 07777);
    } else if (fstatat(parent.get(), name.c_str(), &now, AT_SYMLINK_NOFOLLOW) ==
                   0 &&
               now.st_dev == top.st_dev && now.st_ino == top.st_ino) {
      unlinkat(parent.get(), name.c_str(), AT_REMOVEDIR);
    }
    if (result.error().code != EINTR) {
      result.error().message +=
          created ? "; the directory it made was removed"
                  : "; what it had copied into " + host_dir + " was removed";
    }
  }
  return result;
}

vfs::Result<std::vector<SkillInfo>> ImportSkills(vfs::Backend& backend,
                                                 const vfs::Caller& caller,
                                                 const std::string& host_dir) {
  auto skills = FindSkills(host_dir);
  if (!skills) return Unexpected(skills.error());
  return ImportHostSkills(backend, caller, std::move(*skills));
}

vfs::Result<std::vector<SkillInfo>> ImportHostSkills(
    vfs::Backend& backend, const vfs::Caller& caller,
    std::vector<HostSkill> skills, std::function<bool()> stopped) {
  auto root = Path::Parse(kSkillsRoot);
  if (!root) return Unexpected(root.error());
  std::vector<SkillInfo> imported;
  for (HostSkill& skill : skills) {
    auto dest = root->Child(skill.info.name);
    if (!dest) return WithContext(dest.error(), skill.host_dir);
    // The folder validated, not whatever the path names now: a folder of
    // skills may be writable by others while the import runs.
    Fd dir(open(skill.host_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    struct stat st;
    if (!dir.valid() || fstat(dir.get(), &st) != 0 || st.st_dev != skill.dev ||
        st.st_ino != skill.ino) {
      return Fail(EINVAL, skill.host_dir +
                              ": is no longer the folder that was validated "
                              "(replaced or swapped for a symlink while "
                              "importing); skill " +
                              skill.info.name + " was not imported");
    }
    auto again = ValidateSkillAt(dir.get(), skill.host_dir, skill.info.name);
    if (!again) return Unexpected(again.error());
    ImportOptions options;
    options.stopped = stopped;
    if (auto s = ImportOpenTree(backend, caller, dir.get(), skill.host_dir,
                                *dest, options);
        !s) {
      std::string before;
      for (const auto& done : imported)
        before += (before.empty() ? "" : ", ") + done.name;
      // Files are committed one at a time: the skill may now mix new files
      // with old ones. Say so, and how to finish.
      Error e = s.error();
      e.message =
          (e.code == EINTR ? "interrupted while importing skill " +
                                 skill.info.name + " from " + skill.host_dir
                           : "importing skill " + skill.info.name + " from " +
                                 skill.host_dir + ": " + e.message) +
          "; " + dest->str() +
          " may now hold part of the new files (earlier versions are "
          "in their history): run the import again" +
          (e.code == EINTR ? " to finish" : " once this is fixed") +
          (before.empty() ? "" : " (imported before it: " + before + ")");
      return std::unexpected(e);
    }
    imported.push_back(std::move(*again));
  }
  std::sort(
      imported.begin(), imported.end(),
      [](const SkillInfo& a, const SkillInfo& b) { return a.name < b.name; });
  return imported;
}

vfs::Result<SkillInfo> ReadSkillInfo(vfs::Backend& backend,
                                     const vfs::Caller& caller,
                                     const vfs::Path& skill_dir) {
  auto md = skill_dir.Child(kSkillMd);
  if (!md) return Unexpected(md.error());
  auto handle = backend.Open(caller, *md, O_RDONLY | O_NOFOLLOW, 0);
  if (!handle) {
    if (handle.error().code == ENOENT)
      return Fail(ENOENT, skill_dir.str() + ": holds no " +
                              std::string(kSkillMd) + " (not a skill)");
    return WithContext(handle.error(), "open " + md->str());
  }
  std::string text;
  std::vector<char> buf(size_t{64} << 10);
  if (auto s = ReadHandle(**handle, buf, kMaxSkillMdReadBytes,
                          [&](std::string_view piece) -> Status {
                            text.append(piece);
                            return {};
                          });
      !s) {
    return WithContext(s.error(), "read " + md->str());
  }
  return ParseSkillMd(text, skill_dir.Name(), md->str());
}

vfs::Status ReadInPieces(vfs::Backend& backend, const vfs::Caller& caller,
                         const vfs::Path& path, const Sink& sink) {
  auto handle = backend.Open(caller, path, O_RDONLY | O_NOFOLLOW, 0);
  if (!handle) return Unexpected(handle.error());
  std::vector<char> buf(kCopyPieceBytes);
  return ReadHandle(**handle, buf, SIZE_MAX, sink);
}

}  // namespace agentvfs::store
