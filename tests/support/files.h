// Small file helpers shared by the mount test suites (e2e, fuse): whole-file
// write and read, and directory listings, with failures that say what failed.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace agentvfs::testing {

// Writes `data` to a new (or truncated) file and sets its mode exactly.
::testing::AssertionResult WriteFile(const std::string& path,
                                     std::string_view data, mode_t mode = 0644);
// The whole content of a file; nullopt when it cannot be read.
std::optional<std::string> ReadFile(const std::string& path);
// Names in a directory without "." and "..", sorted; nullopt on error.
std::optional<std::vector<std::string>> ListDir(const std::string& path);

}  // namespace agentvfs::testing
