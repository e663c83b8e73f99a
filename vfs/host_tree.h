// Host directory trees, handled relative to open directories so that no
// symlink is ever followed.
#pragma once

namespace agentvfs::vfs {

// Removes everything under the directory open as `dir_fd` (and closes it),
// without following symlinks and without entering another filesystem or
// mount (a bind mount or a FUSE view left under it stays whole). A
// directory without owner rwx is opened up first. Best effort: what cannot
// be removed stays. Any depth: no recursion, at most two descriptors open.
// `keep_last` names an entry of the top directory that is left alone
// (the caller removes it once the rest is gone; a sandbox session's owner
// stamp, so that a removal cut short is tried again).
void RemoveTreeAt(int dir_fd, const char* keep_last = nullptr);

}  // namespace agentvfs::vfs
