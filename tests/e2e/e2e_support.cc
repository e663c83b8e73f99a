// Implementation of the end-to-end helpers (see e2e_support.h).
#include "tests/e2e/e2e_support.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace agentvfs::e2e {

namespace {

const char* TypeName(mode_t mode) {
  if (S_ISREG(mode)) return "file";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISLNK(mode)) return "symlink";
  return "special file";
}

void CompareEntry(const std::string& expected, const std::string& actual,
                  const std::string& rel, const CompareOptions& options,
                  std::vector<std::string>* diffs) {
  const std::string where = rel.empty() ? "." : rel;
  struct stat want, got;
  if (lstat(expected.c_str(), &want) != 0) {
    diffs->push_back(where + ": cannot lstat the expected entry");
    return;
  }
  if (lstat(actual.c_str(), &got) != 0) {
    diffs->push_back(where + ": missing (" + std::strerror(errno) + ")");
    return;
  }
  if ((want.st_mode & S_IFMT) != (got.st_mode & S_IFMT)) {
    diffs->push_back(where + ": is a " + TypeName(got.st_mode) +
                     ", expected a " + TypeName(want.st_mode));
    return;
  }
  if (!S_ISLNK(want.st_mode) &&
      (want.st_mode & 07777) != (got.st_mode & 07777)) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), ": mode %04o, expected %04o",
                  got.st_mode & 07777, want.st_mode & 07777);
    diffs->push_back(where + buf);
  }
  if (S_ISLNK(want.st_mode)) {
    char a[PATH_MAX], b[PATH_MAX];
    ssize_t na = readlink(expected.c_str(), a, sizeof(a));
    ssize_t nb = readlink(actual.c_str(), b, sizeof(b));
    if (nb < 0 ||
        std::string(a, std::max<ssize_t>(na, 0)) != std::string(b, nb)) {
      diffs->push_back(where + ": symlink target differs");
    }
  } else if (S_ISREG(want.st_mode)) {
    if (want.st_size != got.st_size) {
      diffs->push_back(where + ": size " + std::to_string(got.st_size) +
                       ", expected " + std::to_string(want.st_size));
    } else if (ReadFile(expected) != ReadFile(actual)) {
      diffs->push_back(where + ": contents differ");
    }
    if (options.mtimes && want.st_mtim.tv_sec != got.st_mtim.tv_sec) {
      diffs->push_back(where + ": mtime " + std::to_string(got.st_mtim.tv_sec) +
                       ", expected " + std::to_string(want.st_mtim.tv_sec));
    }
  } else if (S_ISDIR(want.st_mode)) {
    auto want_names = ListDir(expected);
    auto got_names = ListDir(actual);
    if (!want_names || !got_names) {
      diffs->push_back(where + ": cannot list");
      return;
    }
    std::set<std::string> all(want_names->begin(), want_names->end());
    all.insert(got_names->begin(), got_names->end());
    for (const auto& name : all) {
      std::string child = rel.empty() ? name : rel + "/" + name;
      bool in_want =
          std::binary_search(want_names->begin(), want_names->end(), name);
      bool in_got =
          std::binary_search(got_names->begin(), got_names->end(), name);
      if (!in_got) {
        diffs->push_back(child + ": missing");
      } else if (!in_want) {
        diffs->push_back(child + ": unexpected extra entry");
      } else {
        CompareEntry(expected + "/" + name, actual + "/" + name, child, options,
                     diffs);
      }
    }
  }
}

}  // namespace

std::vector<std::string> CompareTrees(const std::string& expected,
                                      const std::string& actual,
                                      CompareOptions options) {
  std::vector<std::string> diffs;
  CompareEntry(expected, actual, "", options, &diffs);
  return diffs;
}

void MountedWorkspaceTest::SetUp() {
  workspace_ = std::make_unique<testing::TempDir>("agentvfs-e2e-ws");
  mountpoint_ = std::make_unique<testing::TempDir>("agentvfs-e2e-mnt");
  std::string error;
  view_ = testing::MountedView::Start(workspace_->path(), mountpoint_->path(),
                                      {}, &error);
  ASSERT_NE(view_, nullptr) << error;
}

void MountedWorkspaceTest::TearDown() {
  if (view_ != nullptr) {
    EXPECT_EQ(view_->Stop(), 0)
        << "agentvfs mount did not exit cleanly; its output:\n"
        << view_->Log();
    view_.reset();
  }
  mountpoint_.reset();
  workspace_.reset();
}

std::string MountedWorkspaceTest::View(const std::string& rel) const {
  std::string base = view_->mountpoint() + "/workspace";
  return rel.empty() ? base : base + "/" + rel;
}

std::string MountedWorkspaceTest::Host(const std::string& rel) const {
  return rel.empty() ? workspace_->path() : workspace_->Sub(rel);
}

std::string MountedWorkspaceTest::Run(const std::vector<std::string>& argv,
                                      const testing::CommandOptions& options) {
  testing::CommandResult r = testing::RunCommand(argv, options);
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  EXPECT_EQ(r.exit_status, 0)
      << "`" << cmd << "` in " << options.cwd
      << (r.timed_out ? " timed out" : " failed") << "; output:\n"
      << r.output;
  return r.output;
}

}  // namespace agentvfs::e2e
