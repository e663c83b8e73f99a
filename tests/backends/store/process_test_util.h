// Helpers for the store tests that fork writer processes (durability_test,
// concurrent_writers_test): report lines sent through pipes with one
// write(2) each (atomic up to PIPE_BUF, so a writer killed mid-report leaves
// either the whole line or nothing), reading every pipe to its end, and
// reading whole files and versions back through the store's API.
//
// A forked child may only use the functions marked "child-safe": they never
// touch gtest and end the process with _exit.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "backends/store/store.h"
#include "vfs/backend.h"
#include "vfs/path.h"

namespace agentvfs::store::test_util {

// child-safe. Sends one report line with a single write(2); a child that
// cannot report has nothing useful left to do.
inline void SendLine(int fd, std::string_view line) {
  if (line.size() > PIPE_BUF) _exit(90);
  while (true) {
    ssize_t n = write(fd, line.data(), line.size());
    if (n == static_cast<ssize_t>(line.size())) return;
    if (n < 0 && errno == EINTR) continue;
    _exit(91);
  }
}

// child-safe. A path the test wrote itself; a bad one is a bug in the test.
inline vfs::Path P(std::string_view text) {
  auto p = vfs::Path::Parse(text);
  if (!p) _exit(92);
  return *p;
}

// Reads every fd to its end (all writers closed or dead), in parallel so
// that no writer blocks on a full pipe. Returns the text per fd, in order;
// false in `*timed_out` unless `limit` passed first.
inline std::vector<std::string> ReadUntilEof(const std::vector<int>& fds,
                                             std::chrono::milliseconds limit,
                                             bool* timed_out) {
  std::vector<std::string> out(fds.size());
  std::vector<bool> open(fds.size(), true);
  auto deadline = std::chrono::steady_clock::now() + limit;
  *timed_out = false;
  char buf[65536];
  while (std::count(open.begin(), open.end(), true) > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *timed_out = true;
      break;
    }
    std::vector<pollfd> pfds;
    std::vector<size_t> which;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!open[i]) continue;
      pfds.push_back(pollfd{fds[i], POLLIN, 0});
      which.push_back(i);
    }
    int n = poll(pfds.data(), pfds.size(), static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (pfds[k].revents == 0) continue;
      ssize_t got = read(pfds[k].fd, buf, sizeof buf);
      if (got > 0) {
        out[which[k]].append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        open[which[k]] = false;
      }
    }
  }
  return out;
}

inline std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The whole content of an open file.
inline vfs::Result<std::string> ReadAll(vfs::FileHandle& file) {
  std::string out;
  std::string buf(1 << 20, '\0');
  while (true) {
    auto got =
        file.Read(buf.data(), buf.size(), static_cast<off_t>(out.size()));
    if (!got) return std::unexpected(got.error());
    if (*got == 0) return out;
    out.append(buf.data(), *got);
  }
}

inline vfs::Result<std::string> ReadPath(vfs::Backend& backend,
                                         const vfs::Caller& c,
                                         const std::string& path) {
  auto file = backend.Open(c, P(path), O_RDONLY, 0);
  if (!file) return std::unexpected(file.error());
  return ReadAll(**file);
}

inline vfs::Result<std::string> ReadVersion(StoreBackend& backend,
                                            const vfs::Caller& c,
                                            const std::string& path,
                                            int64_t n) {
  auto file = backend.OpenVersion(c, P(path), n);
  if (!file) return std::unexpected(file.error());
  return ReadAll(**file);
}

// "" when equal, else sizes and the first differing offset.
inline std::string Mismatch(const std::string& got, const std::string& want) {
  if (got == want) return "";
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return "got " + std::to_string(got.size()) + " bytes, want " +
         std::to_string(want.size()) + "; first difference at offset " +
         std::to_string(i);
}

// Printable start of a short text (for messages about records).
inline std::string Quote(const std::string& text, size_t max = 200) {
  std::string out = "\"";
  for (char ch : text.substr(0, max)) {
    if (ch == '\n') {
      out += "\\n";
    } else if (ch >= 32 && ch < 127) {
      out += ch;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(ch));
      out += hex;
    }
  }
  if (text.size() > max) out += "...";
  return out + "\"";
}

}  // namespace agentvfs::store::test_util
