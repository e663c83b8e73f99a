// FileHandle::AttrsAtOpen on the store: a handle whose open created the file
// carries the attributes the creating transaction wrote (the FUSE create
// reply uses them instead of a read transaction), and they are what Stat
// reports; a handle of a file that existed carries none.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <string>

#include "backends/store/store.h"
#include "tests/support/pg_server.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using testing::StoreFixture;

class OpenAttrsTest : public ::testing::TestWithParam<testing::StoreEngine> {
 protected:
  void SetUp() override {
    auto f = StoreFixture::Create({"dev"}, {}, GetParam());
    ASSERT_TRUE(f.has_value()) << f.error().ToString();
    fixture_ = std::move(*f);
    backend_ = fixture_->OpenBackend();
    ASSERT_NE(backend_, nullptr);
    caller_ = fixture_->CallerFor("dev");
  }

  static vfs::Path UserPath(const std::string& rel) {
    return *vfs::Path::Parse("/memories/users/dev/" + rel);
  }

  std::unique_ptr<StoreFixture> fixture_;
  std::unique_ptr<StoreBackend> backend_;
  vfs::Caller caller_;
};

TEST_P(OpenAttrsTest, ACreatingOpenCarriesTheNewFilesAttributes) {
  auto h = backend_->Open(caller_, UserPath("new"), O_WRONLY | O_CREAT | O_EXCL,
                          0640);
  ASSERT_TRUE(h.has_value()) << h.error().ToString();
  auto at_open = (*h)->AttrsAtOpen();
  ASSERT_TRUE(at_open.has_value());
  auto st = (*h)->Stat();
  ASSERT_TRUE(st.has_value()) << st.error().ToString();
  EXPECT_EQ(at_open->st_ino, st->st_ino);
  EXPECT_EQ(at_open->st_mode, st->st_mode);
  EXPECT_EQ(at_open->st_mode, S_IFREG | 0640);
  EXPECT_EQ(at_open->st_uid, st->st_uid);
  EXPECT_EQ(at_open->st_gid, st->st_gid);
  EXPECT_EQ(at_open->st_nlink, st->st_nlink);
  EXPECT_EQ(at_open->st_size, 0);
  EXPECT_EQ(at_open->st_mtim.tv_sec, st->st_mtim.tv_sec);
  EXPECT_EQ(at_open->st_mtim.tv_nsec, st->st_mtim.tv_nsec);
  EXPECT_EQ(at_open->st_ctim.tv_nsec, st->st_ctim.tv_nsec);
  auto by_path = backend_->Stat(caller_, UserPath("new"));
  ASSERT_TRUE(by_path.has_value()) << by_path.error().ToString();
  EXPECT_EQ(at_open->st_ino, by_path->st_ino);
  ASSERT_OK((*h)->Flush());
}

TEST_P(OpenAttrsTest, OpeningAnExistingFileCarriesNone) {
  {
    auto h = backend_->Open(caller_, UserPath("old"),
                            O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_TRUE(h.has_value()) << h.error().ToString();
    ASSERT_OK((*h)->Write("x", 1, 0));
    ASSERT_OK((*h)->Flush());
  }
  for (int flags : {O_RDONLY, O_WRONLY | O_CREAT | O_TRUNC, O_RDWR}) {
    auto h = backend_->Open(caller_, UserPath("old"), flags, 0644);
    ASSERT_TRUE(h.has_value()) << h.error().ToString();
    EXPECT_FALSE((*h)->AttrsAtOpen().has_value()) << "flags " << flags;
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, OpenAttrsTest,
                         ::testing::ValuesIn(testing::kAllEngines),
                         [](const auto& info) {
                           return testing::EngineName(info.param);
                         });

}  // namespace
}  // namespace agentvfs::store
