// SandboxTest: a store with users alice and bob (alice the one in the
// sandbox), a host workspace directory, and a Sandbox for alice whose view
// is a router over the store. Helpers run shell snippets inside and read
// what is left on the host (processes, mounts, directories).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backends/sandbox/sandbox.h"
#include "router/router.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::testing {

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Creates sandbox_ with `limits` as the defaults (after SetUp).
  void MakeSandbox(sandbox::Limits limits = {});
  // Runs `sh -c script` inside; fails the test when it cannot start.
  sandbox::CommandResult Sh(const std::string& script,
                            std::optional<sandbox::Limits> limits = {});
  // Limits with short timeouts for tests.
  static sandbox::Limits TestLimits();

  std::unique_ptr<StoreFixture> store_;
  std::unique_ptr<TempDir> dir_;
  std::string workspace_;
  std::unique_ptr<router::Router> view_;
  std::unique_ptr<sandbox::Sandbox> sandbox_;
};

// Host pids whose command line contains `marker`.
std::vector<pid_t> ProcessesWith(const std::string& marker);
// How many processes carry `marker` once the shell that started them (its
// command line has the marker too) has gone: waits up to 5 s for the count
// to settle.
size_t SettledCount(const std::string& marker);
// Mount points in this process's mount table under `prefix`.
std::vector<std::string> MountsUnder(const std::string& prefix);
// The whole content of a host file ("" when missing).
std::string ReadHostFile(const std::string& path);
// A unique marker for process command lines in this test.
std::string Marker();

}  // namespace agentvfs::testing
