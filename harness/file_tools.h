// FileTools: the model's file tools, run through the router as the
// session's caller (never the backends directly, never the sandbox), with
// the command and argument names of Anthropic's tools so that models use
// them as trained:
//   Editor(input)  the text-editor tool (str_replace_based_edit_tool):
//                  view {path, view_range?}, create {path, file_text},
//                  str_replace {path, old_str, new_str?},
//                  insert {path, insert_line, insert_text (or new_str)}
//   Memory(input)  the memory tool: the same four commands plus
//                  delete {path} and rename {old_path, new_path}; every
//                  path must be /memories or below.
// Each call returns a ToolResult: text for the model, and is_error when the
// call failed. Nothing throws: malformed input (a missing field, a wrong
// type, an unknown command) is an error result that says what to send.
//
// Writes are one read-modify-write through one handle, committed when the
// handle is flushed. When another session changed the file in between, the
// store rejects the commit (ESTALE, or EBUSY while another session writes
// it); the result then says who changed it, when, and to read it again.
//
// Thread safety: a FileTools is used by one session's loop at a time.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "vfs/backend.h"
#include "vfs/caller.h"

namespace agentvfs::harness {

struct ToolResult {
  std::string text;
  bool is_error = false;
};

// Largest file the tools read or edit whole.
inline constexpr size_t kMaxToolFileBytes = 16 << 20;
// Largest listing or file view returned at once (the rest is cut with a
// note saying how to see it: view_range, or a deeper directory).
inline constexpr size_t kMaxViewBytes = 256 << 10;

class FileTools {
 public:
  // `router` must outlive this object.
  FileTools(vfs::Backend& router, vfs::Caller caller);

  ToolResult Editor(const nlohmann::json& input);
  ToolResult Memory(const nlohmann::json& input);

  // `path` with the symlinks on its way followed as opening it would (a
  // relative target, within the view; an absolute one in the store, from
  // the view's root), as far as it exists: what a call on it will touch,
  // for approval rules. An absolute target in the workspace, which it
  // refuses to follow, is left as it is.
  vfs::Path Resolve(const vfs::Path& path) const;

 private:
  ToolResult Run(const nlohmann::json& input, bool memory);
  ToolResult View(const vfs::Path& path, const nlohmann::json& input);
  ToolResult Create(const vfs::Path& path, const std::string& text,
                    bool must_be_new);
  ToolResult StrReplace(const vfs::Path& path, const std::string& old_str,
                        const std::string& new_str);
  ToolResult Insert(const vfs::Path& path, int64_t line,
                    const std::string& text);
  ToolResult Delete(const vfs::Path& path);
  ToolResult Rename(const vfs::Path& from, const vfs::Path& to);

  vfs::Result<std::string> ReadWhole(const vfs::Path& path);
  vfs::Status Replace(
      const vfs::Path& path,
      const std::function<vfs::Result<std::string>(const std::string&)>& edit);
  // Makes `content` the whole content of the open file `h` as one change:
  // a failure leaves the file as it was. The store commits nothing before
  // Flush, and a failed handle is discarded. A host file's writes land at
  // once, so the new size is reserved first (fallocate, keeping the size):
  // a full disk or quota fails there, before a byte changes; a write that
  // fails anyway puts `original` back (when given; else the error says the
  // file may hold part of the new text). With `report_kept`, an error also
  // says when the file was left as it was.
  vfs::Status WriteWhole(vfs::FileHandle& h, const vfs::Path& path,
                         const std::string& content,
                         const std::string* original, bool report_kept);
  vfs::Status MakeParents(const vfs::Path& path);
  // Removes `path` and all below it, counting what it removed in *removed.
  vfs::Status RemoveTree(const vfs::Path& path, size_t* removed);
  // An error result for a call on `path` (and `other`, for a rename).
  ToolResult Failure(const vfs::Error& e, const vfs::Path& path,
                     const vfs::Path* other = nullptr) const;

  vfs::Backend& router_;
  vfs::Caller caller_;
};

}  // namespace agentvfs::harness
