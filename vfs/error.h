// The one error type of agentvfs: a positive POSIX errno plus a short message
// for people (or a model) saying what went wrong and what to do. Every
// operation that can fail returns Result<T> = std::expected<T, Error>; nothing
// throws across module boundaries. Backends translate their foreign errors in
// exactly one function each (FromErrno for syscalls, FromSqlite later).
#pragma once

#include <cerrno>
#include <expected>
#include <string>
#include <string_view>

namespace agentvfs::vfs {

struct Error {
  int code = EIO;       // positive errno
  std::string message;  // one line; may be empty

  // "ENOENT: no such file: /workspace/a" style text for logs and tool results.
  std::string ToString() const;
};

template <typename T>
using Result = std::expected<T, Error>;
using Status = std::expected<void, Error>;

// Shorthand: `return Fail(ENOENT, "no such file");`
inline std::unexpected<Error> Fail(int code, std::string message = {}) {
  return std::unexpected<Error>(Error{code, std::move(message)});
}

// Maps the current (or given) errno of a failed syscall to an Error whose
// message names the operation and the path it was applied to.
Error FromErrno(int err, std::string_view op, std::string_view path);

// Symbolic name of an errno value ("ENOENT"), or "E<number>" when unknown.
std::string ErrnoName(int code);

}  // namespace agentvfs::vfs
