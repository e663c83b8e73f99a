// Shared pieces of the end-to-end tests, which drive real programs (git, tar,
// rm, a shell script) through a real `agentvfs mount`: a fixture that mounts
// a fresh workspace for each test, small file helpers, and a recursive tree
// comparison (type, permission bits, bytes, symlink targets, mtimes).
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"

namespace agentvfs::e2e {

using agentvfs::testing::ListDir;
using agentvfs::testing::ReadFile;
using agentvfs::testing::WriteFile;

struct CompareOptions {
  bool mtimes = true;  // compare regular files' mtimes (whole seconds)
};
// Every difference between the trees at `expected` and `actual` (walked
// without following symlinks), one line each; empty when identical.
std::vector<std::string> CompareTrees(const std::string& expected,
                                      const std::string& actual,
                                      CompareOptions options = {});

// A fresh workspace mounted for each test; the mount must stop cleanly.
class MountedWorkspaceTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // MOUNTPOINT/workspace: the workspace as programs in the sandbox see it.
  std::string View(const std::string& rel = "") const;
  // The same directory on the host, bypassing the mount.
  std::string Host(const std::string& rel = "") const;

  // Runs a command and fails the test (printing its output) unless it
  // exits 0; returns its output.
  std::string Run(const std::vector<std::string>& argv,
                  const testing::CommandOptions& options = {});

  std::unique_ptr<testing::TempDir> workspace_;
  std::unique_ptr<testing::TempDir> mountpoint_;
  std::unique_ptr<testing::MountedView> view_;
};

}  // namespace agentvfs::e2e
