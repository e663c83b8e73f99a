// Skills: validating Agent Skills folders (a folder holding SKILL.md whose
// YAML front matter names and describes the skill, plus scripts and
// resources) and copying whole trees between a host directory and any
// vfs::Backend, so that `agentvfs skills import|export` and the tests run the
// same code against the store, the router or a plain directory.
//
// Validation follows the Agent Skills specification
// (agentskills.io/specification) and its reference validator `skills-ref
// validate`: front matter is the YAML between a first line `---` and the next
// `---` line; `name` (1-64 characters of a-z, 0-9 and '-', not starting or
// ending with '-', no "--", equal to the folder's name) and `description`
// (1-1024 characters, not blank) are required; `license` (string),
// `compatibility` (1-500 characters), `metadata` (string -> string map) and
// `allowed-tools` (string, or a list of strings joined with spaces) are
// optional; any other top-level field is rejected, as skills-ref does (custom
// keys belong under `metadata`). Two choices are stricter than skills-ref:
// names are ASCII only (they become path components under /skills), and the
// file must be named exactly SKILL.md. Lengths count Unicode characters
// (UTF-8 code points), not bytes.
//
// Copying (ImportTree / ExportTree) keeps, byte for byte: regular files,
// directories, symlinks (targets verbatim, never resolved), permission bits
// and modification times. Not kept: owners (new files belong to the caller /
// the exporting process), setuid/setgid/sticky bits (dropped on purpose: a
// file an agent wrote must never come out as a setuid program), hard links
// (each name becomes its own file), xattrs. Special files (devices, FIFOs,
// sockets) are refused with EINVAL: ImportTree checks the whole host tree
// before writing anything, ExportTree stops at the first one it meets (the
// store cannot hold any). File data moves in pieces of at most
// kCopyPieceBytes; no file is ever held whole in memory. ExportTree leaves
// a piece that is all zeros a hole, so a sparse file stays sparse. On the
// host side every entry is opened relative to its parent directory's fd
// without following symlinks, so nothing outside the named tree is read or
// written.
// The way to the top directory the caller names is looked up as given, but
// the top itself is never a symlink (ELOOP, naming it): one planted where
// an agent can write would turn an import or export run as root elsewhere.
// A copy into the store that fails part-way commits nothing of the file it
// was writing (FileHandle::Discard), though files copied before it stay.
//
// Errors: EINVAL for a skill or tree that breaks the rules (the message
// names the file and the field, and lists every problem found, separated by
// "; "); EEXIST for exporting into a non-empty host directory; otherwise the
// errno of the failing syscall or backend call, with a message naming the
// host path or the backend path.
//
// Thread-safety: the functions keep no state; concurrent calls are as safe as
// the backend and host directories they touch.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vfs/backend.h"

namespace agentvfs::store {

inline constexpr size_t kMaxSkillNameChars = 64;
inline constexpr size_t kMaxSkillDescriptionChars = 1024;
inline constexpr size_t kMaxSkillCompatibilityChars = 500;
// Largest piece of file data read or written in one call while copying.
inline constexpr size_t kCopyPieceBytes = size_t{1} << 20;
// How much of a SKILL.md is read to find its front matter.
inline constexpr size_t kMaxSkillMdReadBytes = size_t{1} << 20;
// Where ImportSkills puts skills: /skills/<name>.
inline constexpr std::string_view kSkillsRoot = "/skills";

// The front matter of one valid SKILL.md.
struct SkillInfo {
  std::string name;
  std::string description;
  std::optional<std::string> license;
  std::optional<std::string> compatibility;
  // Space-delimited, as the spec writes it; a YAML list is joined with spaces.
  std::optional<std::string> allowed_tools;
  std::map<std::string, std::string> metadata;
};

// Parses and validates the text of a SKILL.md that lives in a folder named
// `folder_name`. `file_for_messages` is how messages name the file, e.g.
// "skills/pdf/SKILL.md". EINVAL with every problem found, each written as
// `<file>: field '<field>': <what is wrong> (got "<value>")` or, for the
// file as a whole, `<file>: <what is wrong>`.
vfs::Result<SkillInfo> ParseSkillMd(std::string_view text,
                                    std::string_view folder_name,
                                    std::string_view file_for_messages);

// Validates one skill folder on the host: it is a directory, its SKILL.md is
// a regular file (not a symlink) with valid front matter whose name equals
// the folder's name, and the tree holds nothing but regular files,
// directories and symlinks. ENOENT/ENOTDIR/EACCES for a folder that cannot be
// opened; EINVAL listing every problem.
vfs::Result<SkillInfo> ValidateSkillFolder(const std::string& host_dir);

struct HostSkill {
  std::string host_dir;  // the skill's folder on the host
  SkillInfo info;
  // The folder that was validated (device, inode): an import refuses a
  // folder that is no longer the same one, e.g. swapped for a symlink to a
  // directory that is not a skill.
  dev_t dev = 0;
  ino_t ino = 0;
};

// The skills under `host_dir`, all validated: either `host_dir` itself is a
// skill folder (it holds SKILL.md), or it is a folder of skill folders. In a
// folder of skills, entries whose names start with '.' (.git, .github) and
// regular files (README.md, LICENSE) are skipped; every other entry must be a
// valid skill folder (a symlink is refused rather than followed). EINVAL
// listing the problems of every invalid skill, or when there is no skill.
vfs::Result<std::vector<HostSkill>> FindSkills(const std::string& host_dir);

struct ImportOptions {
  // Remove what `dest` holds but the source does not, so that `dest` ends up
  // an exact copy (the default: re-importing a skill drops deleted files).
  // With false, nothing of `dest` is removed: entries absent from the
  // source are left alone, and an entry of another type than the source's
  // (a directory where the source has a file) is refused (EINVAL, naming
  // each) before anything is written; with true it is replaced.
  bool remove_extra = true;
  // Asked between files and pieces: true stops the copy (EINTR), leaving
  // the file being copied as it was (SIGINT, SIGTERM of the command).
  std::function<bool()> stopped;
};

// Copies the host directory `host_dir` into `backend` at `dest`: `dest` is
// created (its parent must exist) or, when it is an existing directory,
// updated in place. Files are written with O_TRUNC and closed one at a time
// (in the store each close is one commit), then given the source's mode and
// mtime; directories get theirs after their contents. A file whose bytes
// are already there is not written (a re-import adds no versions). The host tree is
// checked for special files before anything is written (EINVAL naming them).
// ENOTDIR when `dest` exists and is not a directory.
vfs::Status ImportTree(vfs::Backend& backend, const vfs::Caller& caller,
                       const std::string& host_dir, const vfs::Path& dest,
                       const ImportOptions& options = {});

struct ExportOptions {
  // Write into a host directory that already has entries: same-named
  // non-directories are replaced (a complete new copy is renamed over them,
  // never written through; a copy that fails leaves the old one),
  // same-named directories are merged, other entries are kept. Without it,
  // a non-empty `host_dir` is EEXIST and nothing is written.
  bool into_non_empty = false;
  // As ImportOptions::stopped; a stopped export into a directory it made
  // removes it, like a failed one.
  std::function<bool()> stopped;
};

// Copies the directory `src` of `backend` to the host directory `host_dir`,
// which is created when missing (its parent must exist), relative to its
// parent's descriptor; an export that fails removes the directory it made,
// through that descriptor (never by path), or empties the empty one it
// found. `host_dir` and everything in it
// get the store's modes less the process's umask (as tar does for a user
// who is not root) and mtimes, except that a host directory merged into
// keeps its own mode. ENOTDIR when `src` is not a
// directory; EEXIST (see
// ExportOptions) or, when merging, for a host directory where `src` has a
// non-directory.
vfs::Status ExportTree(vfs::Backend& backend, const vfs::Caller& caller,
                       const vfs::Path& src, const std::string& host_dir,
                       const ExportOptions& options = {});

// Validates every skill under `host_dir` (see FindSkills) and, only when all
// are valid, imports each into /skills/<name> with ImportTree (default
// options), creating /skills/<name> when missing. Returns the imported
// skills in name order. When any skill is invalid nothing is imported.
// An import that fails part-way (e.g. EACCES on the third skill) leaves the
// skills before it imported; the message says which skill failed and
// which were imported before it.
vfs::Result<std::vector<SkillInfo>> ImportSkills(vfs::Backend& backend,
                                                 const vfs::Caller& caller,
                                                 const std::string& host_dir);

// The import half of ImportSkills, for skills FindSkills returned. Each
// folder is opened again and must still be the folder that was validated
// (same device and inode; EINVAL otherwise, naming it), and its SKILL.md is
// validated again from that same descriptor before anything is copied.
// `stopped` is asked between files and pieces, as ImportOptions::stopped
// (EINTR, naming the skill that may now be mixed).
vfs::Result<std::vector<SkillInfo>> ImportHostSkills(
    vfs::Backend& backend, const vfs::Caller& caller,
    std::vector<HostSkill> skills, std::function<bool()> stopped = {});

// Reads and validates `<skill_dir>/SKILL.md` inside `backend` (the first
// kMaxSkillMdReadBytes of it), e.g. to list the skills a caller can see.
vfs::Result<SkillInfo> ReadSkillInfo(vfs::Backend& backend,
                                     const vfs::Caller& caller,
                                     const vfs::Path& skill_dir);

// Reads the file at `path` (opened O_RDONLY|O_NOFOLLOW) from start to end
// and hands each piece (at most kCopyPieceBytes, never empty) to `sink`; a
// failing sink stops the read and its error is returned.
vfs::Status ReadInPieces(
    vfs::Backend& backend, const vfs::Caller& caller, const vfs::Path& path,
    const std::function<vfs::Status(std::string_view piece)>& sink);

}  // namespace agentvfs::store
