// Factories for the conformance suite's instantiations: one per way of
// reaching a filesystem (see factories.cc). A new backend adds a factory here
// and one INSTANTIATE line in conformance_test.cc.
#pragma once

#include <string>
#include <vector>

#include "tests/conformance/fs_ops.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::conformance {

// Real syscalls on a plain temporary directory: the POSIX reference that
// proves each expectation of the suite is itself right.
FsOpsFactory NativeFactory();
// The vfs API: Router{ /workspace -> LocalDirBackend(temporary directory) }.
FsOpsFactory LocalDirApiFactory();
// The vfs API: Router{ /memories, /skills -> StoreBackend(a fresh store on
// `engine`) }, as a user writing in /memories/users/<user>.
FsOpsFactory StoreApiFactory(
    testing::StoreEngine engine = testing::StoreEngine::kSqlite);
// Real syscalls on MOUNTPOINT/memories/users/<user> of `agentvfs mount
// --store` with that user's token.
FsOpsFactory StoreFuseFactory(
    std::string name = "StoreFuse", std::vector<std::string> mount_args = {},
    testing::StoreEngine engine = testing::StoreEngine::kSqlite);
// Real syscalls on MOUNTPOINT/workspace of `agentvfs mount MOUNT_ARGS`.
FsOpsFactory FuseFactory(std::string name = "Fuse",
                         std::vector<std::string> mount_args = {});

}  // namespace agentvfs::conformance
