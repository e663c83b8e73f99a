// The roots the conformance suite runs against. Each factory builds a fresh,
// empty root for one test and hands over everything it owns through the
// FsOps's keep-alive, so that tearing a test down closes descriptors first
// and only then removes mounts and directories.
#include "tests/conformance/factories.h"

#include "backends/local_dir/local_dir.h"
#include "backends/store/admin.h"
#include "backends/store/store.h"
#include "router/router.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::conformance {
namespace {

using testing::MountedView;
using testing::TempDir;

// Router -> LocalDirBackend; the router goes before the directory.
struct RouterOverDir {
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<router::Router> router;
};

// A real mount; the view is stopped before its directories are removed, and
// a mount that did not exit cleanly fails the test that used it.
struct FuseMount {
  std::unique_ptr<TempDir> workspace;
  std::unique_ptr<TempDir> mountpoint;
  std::unique_ptr<MountedView> view;

  ~FuseMount() {
    if (view == nullptr) return;
    int status = view->Stop();
    EXPECT_EQ(status, 0) << "agentvfs mount did not exit cleanly; its output:\n"
                         << view->Log();
    view.reset();
  }
};

// Router -> StoreBackend; the router goes before the store, the store before
// its directory.
struct RouterOverStore {
  std::unique_ptr<testing::StoreFixture> store;
  std::unique_ptr<router::Router> router;
};

}  // namespace

FsOpsFactory StoreApiFactory(testing::StoreEngine engine) {
  std::string name = engine == testing::StoreEngine::kSqlite
                         ? "StoreApi"
                         : "Store" + testing::EngineName(engine) + "Api";
  return {name, [engine]() -> Result<std::unique_ptr<FsOps>> {
            auto owned = std::make_shared<RouterOverStore>();
            auto fixture = testing::StoreFixture::Create({"tester"}, {}, engine);
            if (!fixture) return std::unexpected(fixture.error());
            owned->store = std::move(*fixture);
            owned->router = owned->store->MakeRouter();
            vfs::Caller caller = owned->store->CallerFor("tester");
            vfs::Backend* r = owned->router.get();
            return MakeBackendOps(r, "/memories/users/tester", std::move(owned),
                                  caller);
          }};
}

FsOpsFactory StoreFuseFactory(std::string name,
                              std::vector<std::string> mount_args,
                              testing::StoreEngine engine) {
  return {std::move(name),
          [mount_args, engine]() -> Result<std::unique_ptr<FsOps>> {
            struct Owned {
              std::unique_ptr<testing::StoreFixture> store;
              FuseMount mount;
            };
            auto owned = std::make_shared<Owned>();
            auto fixture =
                testing::StoreFixture::Create({"tester"}, {}, engine);
            if (!fixture) return std::unexpected(fixture.error());
            owned->store = std::move(*fixture);
            owned->mount.workspace = std::make_unique<TempDir>("agentvfs-ws");
            owned->mount.mountpoint = std::make_unique<TempDir>("agentvfs-mnt");
            std::vector<std::string> args = owned->store->MountArgs("tester");
            args.insert(args.end(), mount_args.begin(), mount_args.end());
            std::string error;
            owned->mount.view = MountedView::Start(
                owned->mount.workspace->path(), owned->mount.mountpoint->path(),
                args, &error);
            if (owned->mount.view == nullptr) return vfs::Fail(EIO, error);
            std::string root =
                owned->mount.view->mountpoint() + "/memories/users/tester";
            return MakeSyscallOps(root, std::move(owned));
          }};
}

FsOpsFactory NativeFactory() {
  return {"Native", []() -> Result<std::unique_ptr<FsOps>> {
            auto dir = std::make_shared<TempDir>("agentvfs-native");
            std::string path = dir->path();
            return MakeSyscallOps(path, std::move(dir));
          }};
}

FsOpsFactory LocalDirApiFactory() {
  return {"LocalDirApi", []() -> Result<std::unique_ptr<FsOps>> {
            auto owned = std::make_shared<RouterOverDir>();
            owned->dir = std::make_unique<TempDir>("agentvfs-localdir");
            auto backend = backends::LocalDirBackend::Open(owned->dir->path());
            if (!backend) return std::unexpected(backend.error());
            owned->router = std::make_unique<router::Router>();
            vfs::Backend* b = owned->router->Adopt(std::move(*backend));
            if (auto ok = owned->router->Mount("/workspace", b); !ok) {
              return std::unexpected(ok.error());
            }
            vfs::Backend* r = owned->router.get();
            return MakeBackendOps(r, "/workspace", std::move(owned));
          }};
}

FsOpsFactory FuseFactory(std::string name,
                         std::vector<std::string> mount_args) {
  return {std::move(name), [mount_args]() -> Result<std::unique_ptr<FsOps>> {
            auto owned = std::make_shared<FuseMount>();
            owned->workspace = std::make_unique<TempDir>("agentvfs-ws");
            owned->mountpoint = std::make_unique<TempDir>("agentvfs-mnt");
            std::string error;
            owned->view = MountedView::Start(owned->workspace->path(),
                                             owned->mountpoint->path(),
                                             mount_args, &error);
            if (owned->view == nullptr) return vfs::Fail(EIO, error);
            std::string root = owned->view->mountpoint() + "/workspace";
            return MakeSyscallOps(root, std::move(owned));
          }};
}

}  // namespace agentvfs::conformance
