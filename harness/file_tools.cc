// The text-editor and memory tools over the router (see file_tools.h).
#include "harness/file_tools.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <functional>
#include <sstream>
#include <string_view>
#include <vector>

namespace agentvfs::harness {

using nlohmann::json;
using vfs::Fail;

namespace {

// The string field `key` of `input`, or an error naming it.
vfs::Result<std::string> StringField(const json& input, const char* key) {
  auto it = input.find(key);
  if (it == input.end())
    return Fail(EINVAL, std::string("missing parameter `") + key + "`");
  if (!it->is_string())
    return Fail(EINVAL,
                std::string("parameter `") + key + "` must be a string");
  return it->get<std::string>();
}

// `cat -n` of the lines in [begin, end) of `text`, numbered from
// `first_line`; stops once the output is over `budget` bytes.
std::string NumberedLines(const std::string& text, int64_t first_line,
                          size_t begin = 0, size_t end = std::string::npos,
                          size_t budget = std::string::npos) {
  std::string out;
  int64_t n = first_line;
  size_t pos = begin;
  end = std::min(end, text.size());
  while (pos < end && out.size() <= budget) {
    size_t nl = text.find('\n', pos);
    size_t stop = nl == std::string::npos || nl >= end ? end : nl;
    char num[32];
    std::snprintf(num, sizeof(num), "%6" PRId64 "\t", n++);
    out += num;
    out.append(text, pos, stop - pos);
    out += '\n';
    pos = stop + 1;
  }
  return out;
}

// Lines of `text`: a last line without its newline counts.
int64_t LineCount(const std::string& text) {
  if (text.empty()) return 0;
  int64_t n = std::count(text.begin(), text.end(), '\n');
  return text.back() == '\n' ? n : n + 1;
}

// Where line `n` (1-based) of `text` starts; text.size() past the last.
size_t LineOffset(const std::string& text, int64_t n) {
  size_t at = 0;
  for (int64_t line = 1; line < n; ++line) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos || nl + 1 >= text.size()) return text.size();
    at = nl + 1;
  }
  return at;
}

// At most this many match lines are listed when old_str is not unique.
constexpr size_t kMaxListedLines = 20;
// old_str is echoed in refusals up to this many bytes.
constexpr size_t kMaxEchoBytes = 1024;

// `s` for a message: cut to kMaxEchoBytes at a UTF-8 character boundary.
std::string Quoted(const std::string& s) {
  if (s.size() <= kMaxEchoBytes) return s;
  size_t cut = kMaxEchoBytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "[... " + std::to_string(s.size() - cut) +
         " more bytes]";
}

// `cat -n` of lines [from, to] of `text` (1-based, clamped), stopping once
// over `budget` bytes.
std::string Snippet(const std::string& text, int64_t from, int64_t to,
                    size_t budget = std::string::npos) {
  int64_t lines = LineCount(text);
  from = std::max<int64_t>(1, from);
  to = std::min(lines, to);
  if (text.empty() || from > to) return "";
  size_t begin = LineOffset(text, from);
  size_t end = to < lines ? LineOffset(text, to + 1) - 1 : text.size();
  return NumberedLines(text, from, begin, end, budget);
}

std::string HumanSize(uint64_t n) {
  const char* units[] = {"", "K", "M", "G", "T"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof(buf), "%" PRIu64, n);
  else
    std::snprintf(buf, sizeof(buf), "%.1f%s", v, units[u]);
  return buf;
}

const vfs::Path& MemoriesRoot() {
  static const vfs::Path root = *vfs::Path::Parse("/memories");
  return root;
}

const vfs::Path& WorkspaceRoot() {
  static const vfs::Path root = *vfs::Path::Parse("/workspace");
  return root;
}

// The workspace backend names a file from its own root ("open /notes.txt:
// ..."); the model knows it as /workspace/notes.txt. Each whole occurrence
// of the inner path in `message` (between spaces, quotes, brackets or a
// colon) becomes the path the model used; anything else, such as the host
// path a symlink names, stays as it is.
std::string AsTheModelSeesIt(std::string message, const vfs::Path& path) {
  if (!path.HasPrefix(WorkspaceRoot())) return message;
  const std::string inner = path.StripPrefix(WorkspaceRoot()).str();
  const std::string outer = path.str();
  auto opens = [&](size_t at) {
    return at == 0 || std::string_view(" '\"(`").find(message[at - 1]) !=
                          std::string_view::npos;
  };
  auto closes = [&](size_t end) {
    return end == message.size() ||
           std::string_view(" '\"`:,;)").find(message[end]) !=
               std::string_view::npos;
  };
  for (size_t at = message.find(inner); at != std::string::npos;
       at = message.find(inner, at)) {
    if (opens(at) && closes(at + inner.size())) {
      message.replace(at, inner.size(), outer);
      at += outer.size();
    } else {
      ++at;
    }
  }
  return message;
}

}  // namespace

FileTools::FileTools(vfs::Backend& router, vfs::Caller caller)
    : router_(router), caller_(std::move(caller)) {}

ToolResult FileTools::Editor(const json& input) { return Run(input, false); }
ToolResult FileTools::Memory(const json& input) { return Run(input, true); }

ToolResult FileTools::Run(const json& input, bool memory) {
  auto bad = [](const std::string& what) {
    return ToolResult{"Error: " + what, true};
  };
  if (!input.is_object()) return bad("the tool input must be a JSON object");
  auto command = StringField(input, "command");
  if (!command) return bad(command.error().message);
  auto parse = [&](const char* key) -> vfs::Result<vfs::Path> {
    auto text = StringField(input, key);
    if (!text) return std::unexpected(text.error());
    if (text->empty() || (*text)[0] != '/')
      return Fail(EINVAL, std::string("`").append(key).append(
                              "` must be an absolute path such as "
                              "/workspace/notes.md, not '") +
                              *text + "'");
    auto p = vfs::Path::Parse(*text);
    if (!p)
      return Fail(EINVAL, "`" + std::string(key) + "` '" + *text +
                              "' is not a valid path: " + p.error().message);
    if (memory && !p->HasPrefix(MemoriesRoot()))
      return Fail(EINVAL, "the memory tool works in /memories only; '" + *text +
                              "' is outside it");
    if (memory) {
      // Nor through a symlink in /memories, which may lead anywhere in the
      // store (/skills): every existing component is checked. (Grants hold
      // whatever path is taken; this keeps the tool where it says it is.)
      vfs::Path at = MemoriesRoot();
      const auto names = p->Components();
      for (size_t i = 1; i < names.size(); ++i) {
        auto next = at.Child(names[i]);
        if (!next) break;
        at = *next;
        auto st = router_.Stat(caller_, at);
        if (!st) break;  // missing (to be created) or hidden: the call says
        if (S_ISLNK(st->st_mode))
          return Fail(EINVAL, "'" + at.str() +
                                  "' is a symlink; the memory tool does not "
                                  "follow links (use the path it names, or "
                                  "bash)");
      }
    }
    return *p;
  };

  if (*command == "view") {
    auto p = parse("path");
    if (!p) return bad(p.error().message);
    return View(*p, input);
  }
  // A path that ends in '/' (or '/.', '/..') names a directory: never a
  // file to write (normalised, `a.txt/.` would have written a.txt, where
  // the kernel says ENOTDIR).
  auto file_path = [&](const char* key) -> vfs::Result<vfs::Path> {
    auto p = parse(key);
    if (!p) return p;
    const std::string text = *StringField(input, key);
    for (const char* end : {"/", "/.", "/.."}) {
      if (text.size() > 1 && text.ends_with(end))
        return Fail(EINVAL, std::string("`").append(key) + "` '" + text +
                                "' ends with '" + end +
                                "', which names a directory; give the path "
                                "of a file");
    }
    return p;
  };
  if (*command == "create") {
    auto p = file_path("path");
    if (!p) return bad(p.error().message);
    auto text = StringField(input, "file_text");
    if (!text) return bad(text.error().message);
    return Create(*p, *text, memory);
  }
  if (*command == "str_replace") {
    auto p = file_path("path");
    if (!p) return bad(p.error().message);
    auto old_str = StringField(input, "old_str");
    if (!old_str) return bad(old_str.error().message);
    std::string new_str;
    if (input.contains("new_str")) {
      auto n = StringField(input, "new_str");
      if (!n) return bad(n.error().message);
      new_str = *n;
    }
    return StrReplace(*p, *old_str, new_str);
  }
  if (*command == "insert") {
    auto p = file_path("path");
    if (!p) return bad(p.error().message);
    auto line = input.find("insert_line");
    if (line == input.end() || !line->is_number_integer())
      return bad("missing or non-integer parameter `insert_line`");
    // insert_text in the current tools; new_str in older text editors.
    auto text = StringField(input, "insert_text");
    if (!text) text = StringField(input, "new_str");
    if (!text) return bad("missing parameter `insert_text`");
    return Insert(*p, line->get<int64_t>(), *text);
  }
  if (memory && *command == "delete") {
    auto p = parse("path");
    if (!p) return bad(p.error().message);
    return Delete(*p);
  }
  if (memory && *command == "rename") {
    auto from = parse("old_path");
    if (!from) return bad(from.error().message);
    auto to = parse("new_path");
    if (!to) return bad(to.error().message);
    return Rename(*from, *to);
  }
  return bad("unknown command '" + *command + "'; use " +
             (memory ? "view, create, str_replace, insert, delete or rename"
                     : "view, create, str_replace or insert"));
}

vfs::Path FileTools::Resolve(const vfs::Path& path) const {
  std::deque<std::string> rest;
  for (auto c : path.Components()) rest.emplace_back(c);
  vfs::Path at;  // the root
  int links = 0;
  bool exists = true;  // past a missing name the rest is taken as written
  while (!rest.empty()) {
    std::string name = std::move(rest.front());
    rest.pop_front();
    if (name.empty() || name == ".") continue;
    if (name == "..") {
      at = at.Parent();
      continue;
    }
    auto next = at.Child(name);
    if (!next) return path;
    at = *next;
    if (!exists) continue;
    auto st = router_.Stat(caller_, at);
    exists = st.has_value();
    if (!exists || !S_ISLNK(st->st_mode) || ++links > 40) continue;
    auto target = router_.Readlink(caller_, at);
    if (!target || target->empty()) continue;
    if (target->front() == '/') {
      // The workspace never follows one; the store follows it within the
      // view (`abs -> /memories/teams/t1`).
      if (at.HasPrefix(WorkspaceRoot())) continue;
      at = vfs::Path();
    } else {
      at = at.Parent();
    }
    std::vector<std::string> parts;
    for (size_t i = 0; i <= target->size();) {
      size_t slash = target->find('/', i);
      if (slash == std::string::npos) slash = target->size();
      parts.push_back(target->substr(i, slash - i));
      i = slash + 1;
    }
    rest.insert(rest.begin(), parts.begin(), parts.end());
  }
  return at;
}

ToolResult FileTools::Failure(const vfs::Error& e, const vfs::Path& path,
                              const vfs::Path* other) const {
  std::string message = AsTheModelSeesIt(e.message, path);
  if (other != nullptr) message = AsTheModelSeesIt(message, *other);
  // Every error names the path it is about (the store's "no such file or
  // directory" for a hidden one did not).
  if (!message.empty() && message.find(path.str()) == std::string::npos &&
      (other == nullptr || message.find(other->str()) == std::string::npos))
    message = path.str() + ": " + message;
  std::string text = "Error: " + message;
  if (message.empty()) text += vfs::ErrnoName(e.code) + " on " + path.str();
  // A write conflict in the store (another session writes the file, or
  // committed since it was read); not the EBUSY of a mount point.
  const bool conflict = e.code == ESTALE ||
                        (e.code == EBUSY && !path.HasPrefix(WorkspaceRoot()) &&
                         message.find("mount point") == std::string::npos);
  if (conflict)
    text += ". Your change was not saved. View " + path.str() +
            " again to see the current content, then redo the change.";
  return {text, true};
}

vfs::Result<std::string> FileTools::ReadWhole(const vfs::Path& path) {
  auto h = router_.Open(caller_, path, O_RDONLY, 0);
  if (!h) return std::unexpected(h.error());
  auto st = (*h)->Stat();
  if (!st) return std::unexpected(st.error());
  if (S_ISDIR(st->st_mode)) return Fail(EISDIR, path.str() + " is a directory");
  if (static_cast<uint64_t>(st->st_size) > kMaxToolFileBytes)
    return Fail(EFBIG, path.str() + " is " + HumanSize(st->st_size) +
                           "B, over the " + HumanSize(kMaxToolFileBytes) +
                           "B the file tools handle; use bash (head, sed, "
                           "grep) instead");
  std::string data;
  char buf[65536];
  for (off_t off = 0;;) {
    auto n = (*h)->Read(buf, sizeof(buf), off);
    if (!n) return std::unexpected(n.error());
    if (*n == 0) break;
    data.append(buf, *n);
    off += static_cast<off_t>(*n);
    if (data.size() > kMaxToolFileBytes)
      return Fail(EFBIG, path.str() + " grew past " +
                             HumanSize(kMaxToolFileBytes) + "B while read");
  }
  if (data.find('\0') != std::string::npos)
    return Fail(EINVAL,
                path.str() + " is a binary file; the file tools edit text");
  return data;
}

vfs::Status FileTools::Replace(
    const vfs::Path& path,
    const std::function<vfs::Result<std::string>(const std::string&)>& edit) {
  // One handle for read and write: the store commits it whole at Flush, and
  // rejects it if another session changed the file meanwhile.
  auto h = router_.Open(caller_, path, O_RDWR, 0);
  if (!h) return std::unexpected(h.error());
  auto st = (*h)->Stat();
  if (!st) return std::unexpected(st.error());
  if (static_cast<uint64_t>(st->st_size) > kMaxToolFileBytes)
    return Fail(EFBIG, path.str() + " is over " + HumanSize(kMaxToolFileBytes) +
                           "B; edit it with bash instead");
  std::string data(static_cast<size_t>(st->st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    auto n = (*h)->Read(data.data() + got, data.size() - got,
                        static_cast<off_t>(got));
    if (!n) return std::unexpected(n.error());
    if (*n == 0) break;
    got += *n;
  }
  data.resize(got);
  if (data.find('\0') != std::string::npos)
    return Fail(EINVAL, path.str() +
                            " is a binary file; the file tools "
                            "edit text");
  auto changed = edit(data);
  if (!changed) return std::unexpected(changed.error());
  if (changed->size() > kMaxToolFileBytes)
    return Fail(EFBIG, "the edit would make " + path.str() + " " +
                           HumanSize(changed->size()) + "B, over the " +
                           HumanSize(kMaxToolFileBytes) +
                           "B the file tools handle; nothing was changed. "
                           "Split the file or edit it with bash");
  return WriteWhole(**h, path, *changed, &data, /*report_kept=*/true);
}

vfs::Status FileTools::WriteWhole(vfs::FileHandle& h, const vfs::Path& path,
                                  const std::string& content,
                                  const std::string* original,
                                  bool report_kept) {
  const bool at_once = !h.NeedsFlush();  // a host file: no commit to hold
  auto failed = [&](vfs::Error e, bool touched) -> vfs::Status {
    if (e.message.empty())
      e.message = vfs::ErrnoName(e.code) + " writing " + path.str();
    std::string changed;  // what became of the file, unless it is as it was
    if (!at_once) {
      h.Discard();  // nothing of this edit is committed, now or later
    } else if (touched && original != nullptr) {
      // Put the former content back: its blocks are still the file's.
      bool back = true;
      for (size_t off = 0; back && off < original->size();) {
        auto n = h.Write(original->data() + off, original->size() - off,
                         static_cast<off_t>(off));
        back = n && *n > 0;
        if (back) off += *n;
      }
      back = back && h.Truncate(static_cast<off_t>(original->size()));
      if (!back)
        changed = "; putting back the former content of " + path.str() +
                  " failed too: the file may be damaged";
    } else if (touched) {
      changed = "; " + path.str() + " may now hold part of the new text";
    }
    if (!changed.empty())
      e.message += changed;
    else if (report_kept)
      e.message += "; " + path.str() + " was left as it was";
    return std::unexpected(std::move(e));
  };
  if (at_once && !content.empty()) {
    auto reserved =
        h.Allocate(FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(content.size()));
    if (!reserved && reserved.error().code != ENOTSUP &&
        reserved.error().code != EOPNOTSUPP && reserved.error().code != ENOSYS)
      return failed(reserved.error(), false);
  }
  // Written over the old bytes first, then cut to the new length: a crash
  // in between leaves the new text (and maybe old bytes after it), never an
  // empty file.
  for (size_t off = 0; off < content.size();) {
    auto n = h.Write(content.data() + off, content.size() - off,
                     static_cast<off_t>(off));
    if (!n) return failed(n.error(), true);
    if (*n == 0) return failed(vfs::Error{EIO, "write made no progress"}, true);
    off += *n;
  }
  if (auto t = h.Truncate(static_cast<off_t>(content.size())); !t)
    return failed(t.error(), true);
  if (auto f = h.Flush(); !f) return failed(f.error(), true);
  return {};
}

vfs::Status FileTools::MakeParents(const vfs::Path& path) {
  std::vector<vfs::Path> missing;
  for (vfs::Path p = path.Parent(); !p.IsRoot(); p = p.Parent()) {
    auto st = router_.Stat(caller_, p);
    if (st) {
      if (!S_ISDIR(st->st_mode))
        return Fail(ENOTDIR, p.str() + " is not a directory");
      break;
    }
    if (st.error().code != ENOENT) return std::unexpected(st.error());
    missing.push_back(p);
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    auto made = router_.Mkdir(caller_, *it, 0755);
    if (!made && made.error().code != EEXIST) return made;
  }
  return {};
}

ToolResult FileTools::View(const vfs::Path& path, const json& input) {
  auto st = router_.Stat(caller_, path);
  if (!st) return Failure(st.error(), path);
  // A symlink to a directory is listed as the directory it leads to (one to
  // a file is read through it below, as open(2) follows it). Each step is
  // looked up through the router as the user, so a link leads nowhere the
  // user could not name.
  vfs::Path dir = path;
  if (S_ISLNK(st->st_mode)) {
    vfs::Path at = path;
    auto now = st;
    for (int hops = 0; hops < 40 && now && S_ISLNK(now->st_mode); ++hops) {
      auto target = router_.Readlink(caller_, at);
      if (!target || target->empty()) break;
      auto next = vfs::Path::Parse(
          (*target)[0] == '/' ? *target : at.Parent().str() + "/" + *target);
      if (!next) break;
      at = *next;
      now = router_.Stat(caller_, at);
    }
    if (now && S_ISDIR(now->st_mode)) {
      dir = at;
      st = now;
    }
  }
  if (S_ISDIR(st->st_mode)) {
    if (input.contains("view_range"))
      return {"Error: view_range applies to files; " + path.str() +
                  " is a directory",
              true};
    // Two levels deep, without hidden entries and node_modules, each with
    // its size, as Anthropic's tools list directories.
    std::string listing;
    std::function<void(const vfs::Path&, int)> walk = [&](const vfs::Path& dir,
                                                          int depth) {
      auto entries = router_.ReadDir(caller_, dir);
      if (!entries) return;
      std::sort(entries->begin(), entries->end(),
                [](const auto& a, const auto& b) { return a.name < b.name; });
      for (const auto& e : *entries) {
        if (listing.size() > kMaxViewBytes) return;  // cut below anyway
        if (e.name.empty() || e.name[0] == '.' || e.name == "node_modules")
          continue;
        auto child = dir.Child(e.name);
        if (!child) continue;
        auto cst = router_.Stat(caller_, *child);
        if (!cst) continue;
        bool is_dir = S_ISDIR(cst->st_mode);
        listing += HumanSize(is_dir ? 4096 : cst->st_size) + "\t" +
                   child->str() + (is_dir ? "/" : "") + "\n";
        if (is_dir && depth < 2) walk(*child, depth + 1);
      }
    };
    listing = HumanSize(4096) + "\t" + dir.str() + "/\n";
    walk(dir, 1);
    std::string text =
        "Here are the files and directories up to 2 levels "
        "deep in " +
        dir.str() +
        (dir == path ? std::string()
                     : " (" + path.str() + " is a symlink to it)") +
        ", excluding hidden items and node_modules:\n";
    if (listing.size() > kMaxViewBytes) {
      listing.resize(kMaxViewBytes);
      listing.resize(listing.rfind('\n') + 1);
      listing += "[... listing cut at " + HumanSize(kMaxViewBytes) +
                 "B; view a subdirectory to see more]\n";
    }
    return {text + listing, false};
  }
  auto data = ReadWhole(path);
  if (!data) return Failure(data.error(), path);
  int64_t lines = LineCount(*data);
  int64_t from = 1, to = lines;
  if (auto r = input.find("view_range"); r != input.end()) {
    if (!r->is_array() || r->size() != 2 || !(*r)[0].is_number_integer() ||
        !(*r)[1].is_number_integer())
      return {
          "Error: view_range must be two integers [start, end]; end -1 "
          "means to the end of the file",
          true};
    from = (*r)[0].get<int64_t>();
    to = (*r)[1].get<int64_t>();
    if (to == -1) to = lines;
    if (from < 1 || from > std::max<int64_t>(lines, 1) || to < from ||
        to > lines)
      return {"Error: view_range [" + std::to_string((*r)[0].get<int64_t>()) +
                  ", " + std::to_string((*r)[1].get<int64_t>()) +
                  "] is not within " + path.str() + ", which has " +
                  std::to_string(lines) + " lines",
              true};
  }
  std::string body = Snippet(*data, from, to, kMaxViewBytes);
  if (body.size() > kMaxViewBytes) {
    body.resize(kMaxViewBytes);
    size_t nl = body.rfind('\n');
    if (nl == std::string::npos) {
      // One line longer than the whole view: show its start.
      return {"Here's the start of line " + std::to_string(from) + " of " +
                  path.str() + " (the line is longer than " +
                  HumanSize(kMaxViewBytes) +
                  "B; use bash, e.g. cut -c or fold, to see more):\n" + body,
              false};
    }
    body.resize(nl + 1);
    int64_t shown = from + std::count(body.begin(), body.end(), '\n') - 1;
    body += "[... cut after line " + std::to_string(shown) + " of " +
            std::to_string(lines) + "; view the rest with view_range [" +
            std::to_string(shown + 1) + ", -1]]\n";
  }
  return {
      "Here's the content of " + path.str() + " with line numbers:\n" + body,
      false};
}

ToolResult FileTools::Create(const vfs::Path& path, const std::string& text,
                             bool must_be_new) {
  if (text.size() > kMaxToolFileBytes)
    return {"Error: file_text is over " + HumanSize(kMaxToolFileBytes) + "B",
            true};
  if (must_be_new) {
    if (router_.Stat(caller_, path))
      return {"Error: " + path.str() +
                  " already exists; view it and edit it with str_replace or "
                  "insert, or delete it first",
              true};
    if (auto ok = MakeParents(path); !ok) return Failure(ok.error(), path);
  }
  // O_EXCL first, so that a failure removes only a file this call made;
  // an existing file is opened without O_TRUNC (WriteWhole cuts it once the
  // new text is in).
  bool made = true;
  auto h = router_.Open(caller_, path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (!h && h.error().code == ENOENT && !must_be_new &&
      !router_.Stat(caller_, path.Parent())) {
    // The editor makes missing folders too (a model otherwise spends a
    // turn on "No such file or directory" and a mkdir).
    if (auto ok = MakeParents(path); !ok) return Failure(ok.error(), path);
    h = router_.Open(caller_, path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  }
  if (!h && h.error().code == EEXIST && !must_be_new) {
    made = false;
    h = router_.Open(caller_, path, O_WRONLY | O_CREAT, 0644);
  }
  if (!h) return Failure(h.error(), path);
  static const std::string kNothing;
  if (auto ok = WriteWhole(**h, path, text, made ? &kNothing : nullptr,
                           /*report_kept=*/!made);
      !ok) {
    auto e = ok.error();
    if (made) {
      // The empty file this call made goes too, so a retry can make it.
      h->reset();
      if (router_.Unlink(caller_, path)) e.message += "; nothing was created";
    }
    return Failure(e, path);
  }
  return {"File created successfully at: " + path.str(), false};
}

ToolResult FileTools::StrReplace(const vfs::Path& path,
                                 const std::string& old_str,
                                 const std::string& new_str) {
  if (old_str.empty())
    return {"Error: old_str is empty; give the exact text to replace", true};
  int64_t first_line = 0, new_lines = 0;
  std::string after;
  std::optional<std::string> refusal;
  auto ok =
      Replace(path, [&](const std::string& text) -> vfs::Result<std::string> {
        // The lines of the matches in one pass (newlines counted from the
        // previous match), listing at most kMaxListedLines of them.
        std::vector<int64_t> lines;
        size_t matches = 0, counted = 0;
        int64_t line = 1;
        bool more = false;
        for (size_t at = text.find(old_str); at != std::string::npos;
             at = text.find(old_str, at + old_str.size())) {
          line += std::count(text.begin() + static_cast<ptrdiff_t>(counted),
                             text.begin() + static_cast<ptrdiff_t>(at), '\n');
          counted = at;
          ++matches;
          if (lines.empty() || lines.back() != line) {
            if (lines.size() < kMaxListedLines)
              lines.push_back(line);
            else
              more = true;
          }
        }
        if (matches == 0) {
          refusal = "No replacement was performed, old_str `" +
                    Quoted(old_str) + "` did not appear verbatim in " +
                    path.str() + ".";
          return Fail(ECANCELED, *refusal);
        }
        if (matches > 1) {
          std::string where;
          for (size_t i = 0; i < lines.size(); ++i)
            where += (i ? ", " : "") + std::to_string(lines[i]);
          if (more) where += ", ...";
          refusal = "No replacement was performed. Multiple occurrences (" +
                    std::to_string(matches) + ") of old_str `" +
                    Quoted(old_str) + "` in lines [" + where +
                    "]. Please ensure it is unique (include more context).";
          return Fail(ECANCELED, *refusal);
        }
        size_t at = text.find(old_str);
        first_line = lines[0];
        new_lines = std::count(new_str.begin(), new_str.end(), '\n');
        after = text.substr(0, at) + new_str + text.substr(at + old_str.size());
        return after;
      });
  if (!ok) {
    if (refusal) return {"Error: " + *refusal, true};
    return Failure(ok.error(), path);
  }
  return {"The file " + path.str() +
              " has been edited. Here's the result of "
              "running `cat -n` on a snippet of " +
              path.str() + ":\n" +
              Snippet(after, first_line - 4, first_line + new_lines + 4) +
              "Review the changes and make sure they are as expected. Edit "
              "the file again if necessary.",
          false};
}

ToolResult FileTools::Insert(const vfs::Path& path, int64_t line,
                             const std::string& text) {
  std::optional<std::string> refusal;
  std::string after;
  auto ok =
      Replace(path, [&](const std::string& data) -> vfs::Result<std::string> {
        int64_t lines = LineCount(data);
        if (line < 0 || line > lines) {
          refusal = "insert_line " + std::to_string(line) +
                    " is not within [0, " + std::to_string(lines) + "] (" +
                    path.str() + " has " + std::to_string(lines) +
                    " lines; 0 inserts at the top)";
          return Fail(ECANCELED, *refusal);
        }
        // After line `line`: where line `line` + 1 starts (the end when
        // there is none).
        size_t at = LineOffset(data, line + 1);
        std::string piece = text;
        if (!piece.empty() && piece.back() != '\n') piece += '\n';
        std::string head = data.substr(0, at);
        if (at == data.size() && !head.empty() && head.back() != '\n')
          head += '\n';  // after a last line without its newline
        after = head + piece + data.substr(at);
        return after;
      });
  if (!ok) {
    if (refusal) return {"Error: " + *refusal, true};
    return Failure(ok.error(), path);
  }
  int64_t added = std::count(text.begin(), text.end(), '\n') +
                  (text.empty() || text.back() != '\n' ? 1 : 0);
  return {"The file " + path.str() +
              " has been edited. Here's the result of "
              "running `cat -n` on a snippet of the edited file:\n" +
              Snippet(after, line - 3, line + added + 4) +
              "Review the changes and make sure they are as expected "
              "(correct indentation, no duplicate lines). Edit the file "
              "again if necessary.",
          false};
}

vfs::Status FileTools::RemoveTree(const vfs::Path& path, size_t* removed) {
  auto st = router_.Stat(caller_, path);
  if (!st) return std::unexpected(st.error());
  if (!S_ISDIR(st->st_mode)) {
    auto ok = router_.Unlink(caller_, path);
    if (ok) ++*removed;
    return ok;
  }
  // First the directory itself: a directory the caller may not remove
  // (a grant starts there) fails before anything in it is deleted; only
  // "not empty" goes on to its entries.
  auto ok = router_.Rmdir(caller_, path);
  if (!ok && ok.error().code == ENOTEMPTY) {
    auto entries = router_.ReadDir(caller_, path);
    if (!entries) return std::unexpected(entries.error());
    for (const auto& e : *entries) {
      auto child = path.Child(e.name);
      if (!child) return std::unexpected(child.error());
      if (auto removed_child = RemoveTree(*child, removed); !removed_child)
        return removed_child;
    }
    ok = router_.Rmdir(caller_, path);
  }
  if (ok) ++*removed;
  return ok;
}

ToolResult FileTools::Delete(const vfs::Path& path) {
  if (path == MemoriesRoot())
    return {"Error: /memories itself cannot be deleted; delete what is in it",
            true};
  size_t removed = 0;
  if (auto ok = RemoveTree(path, &removed); !ok) {
    ToolResult r = Failure(ok.error(), path);
    // A folder is emptied before it is removed: say what is gone already.
    if (removed > 0)
      r.text += " (" + std::to_string(removed) +
                (removed == 1 ? " entry" : " entries") + " inside " +
                path.str() + (removed == 1 ? " was" : " were") +
                " deleted before this; view it to see what is left)";
    return r;
  }
  return {"Successfully deleted " + path.str(), false};
}

ToolResult FileTools::Rename(const vfs::Path& from, const vfs::Path& to) {
  if (router_.Stat(caller_, to))
    return {"Error: " + to.str() +
                " already exists; choose another name or "
                "delete it first",
            true};
  if (auto ok = MakeParents(to); !ok) return Failure(ok.error(), to);
  if (auto ok = router_.Rename(caller_, from, to, RENAME_NOREPLACE); !ok)
    return Failure(ok.error(), from, &to);
  return {"Successfully renamed " + from.str() + " to " + to.str(), false};
}

}  // namespace agentvfs::harness
