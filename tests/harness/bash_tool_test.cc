// The bash tool on a real sandbox with the store's view.
#include "harness/bash_tool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/files.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::testing {
namespace {

using harness::BashTool;
using nlohmann::json;
using ::testing::HasSubstr;

class BashToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = StoreFixture::Create({"alice"});
    ASSERT_TRUE(store.has_value()) << store.error().message;
    store_ = std::move(*store);
    ws_ = std::make_unique<TempDir>("agentvfs-bash-ws");
    view_ = store_->MakeRouter();
    sandbox::SandboxOptions o;
    o.workspace = ws_->path();
    o.view = view_.get();
    o.identity = store_->CallerFor("alice", "bash-test");
    auto sb = sandbox::Sandbox::Create(o);
    ASSERT_TRUE(sb.has_value()) << sb.error().message;
    sandbox_ = std::move(*sb);
    sandbox::Limits l;
    l.timeout_s = 2;
    l.output_cap = 1000;
    bash_ = std::make_unique<BashTool>(*sandbox_, l);
  }
  void TearDown() override {
    bash_.reset();
    if (sandbox_) sandbox_->Close();
  }
  std::unique_ptr<StoreFixture> store_;
  std::unique_ptr<TempDir> ws_;
  std::unique_ptr<router::Router> view_;
  std::unique_ptr<sandbox::Sandbox> sandbox_;
  std::unique_ptr<BashTool> bash_;
};

TEST_F(BashToolTest, OutputErrorsAndTheExitCodeReachTheModel) {
  auto r = bash_->Run({{"command", "echo hi; pwd"}});
  EXPECT_FALSE(r.is_error);
  EXPECT_EQ(r.text, "hi\n/workspace\n[exit code 0]");
  r = bash_->Run({{"command", "echo out; echo oops >&2; exit 3"}});
  EXPECT_FALSE(r.is_error);  // it ran; the model reads the code
  EXPECT_EQ(r.text, "out\nstderr:\noops\n[exit code 3]");
  r = bash_->Run({{"command", "kill -TERM $$"}});
  EXPECT_THAT(r.text, HasSubstr("[killed by SIGTERM"));
}

TEST_F(BashToolTest, FilesAndMemoriesCarryOverButNotTheShell) {
  auto r = bash_->Run({{"command",
                        "cd /tmp && echo x > f && echo note > "
                        "/memories/users/alice/n.md && export V=1"}});
  EXPECT_EQ(r.text, "[exit code 0]");
  r = bash_->Run({{"command",
                   "pwd; cat /tmp/f /memories/users/alice/n.md; "
                   "echo \"V=$V\""}});
  EXPECT_EQ(r.text, "/workspace\nx\nnote\nV=\n[exit code 0]");
}

TEST_F(BashToolTest, TimeoutsAndLongOutputAreSaidSo) {
  auto r = bash_->Run({{"command", "echo started; sleep 30"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_THAT(r.text, HasSubstr("started\n[timed out after"));
  EXPECT_THAT(r.text, HasSubstr("the workspace files remain"));
  r = bash_->Run({{"command", "seq 1 5000"}});
  EXPECT_EQ(r.text.substr(0, 4), "1\n2\n");
  EXPECT_THAT(r.text, HasSubstr("of stdout cut here"));
  EXPECT_THAT(r.text, HasSubstr("5000\n[exit code 0]"));
}

TEST_F(BashToolTest, RestartAndBadInput) {
  ASSERT_EQ(bash_->Run({{"command", "true"}}).text, "[exit code 0]");
  pid_t before = sandbox_->init_pid();
  auto r = bash_->Run({{"restart", true}});
  EXPECT_FALSE(r.is_error);
  EXPECT_EQ(bash_->Run({{"command", "true"}}).text, "[exit code 0]");
  EXPECT_NE(sandbox_->init_pid(), before);
  for (const json& bad : {json::array(), json{{"cmd", "ls"}},
                          json{{"command", 5}}, json{{"command", "  "}}}) {
    auto b = bash_->Run(bad);
    EXPECT_TRUE(b.is_error) << bad.dump();
    EXPECT_THAT(b.text, HasSubstr("Error: ")) << bad.dump();
  }
}

}  // namespace
}  // namespace agentvfs::testing
