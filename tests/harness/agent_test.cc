// The agent loop end to end with a scripted model (the fake API speaking
// the Messages format), the real router, store and sandbox: tools run,
// every call is answered, events are recorded, budgets stop and resume,
// interrupted calls are never rerun, approvals gate calls.
#include "harness/agent.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <thread>

#include "backends/local_dir/local_dir.h"
#include "tests/harness/fake_api.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::testing {
namespace {

using harness::Agent;
using harness::AgentOptions;
using ::testing::HasSubstr;

json ToolUse(const std::string& id, const std::string& name, json input,
             const std::string& text = "") {
  json content = json::array();
  if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
  content.push_back(
      {{"type", "tool_use"}, {"id", id}, {"name", name}, {"input", input}});
  return {{"status", 200},
          {"body",
           {{"type", "message"},
            {"role", "assistant"},
            {"model", "claude-test"},
            {"content", content},
            {"stop_reason", "tool_use"},
            {"usage", {{"input_tokens", 1000}, {"output_tokens", 100}}}}}};
}

json Final(const std::string& text) {
  return {{"status", 200},
          {"body",
           {{"type", "message"},
            {"role", "assistant"},
            {"model", "claude-test"},
            {"content", {{{"type", "text"}, {"text", text}}}},
            {"stop_reason", "end_turn"},
            {"usage", {{"input_tokens", 1200}, {"output_tokens", 50}}}}}};
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = StoreFixture::Create({"alice"});
    ASSERT_TRUE(store.has_value()) << store.error().message;
    store_ = std::move(*store);
    ws_ = std::make_unique<TempDir>("agentvfs-agent-ws");
    router_ = store_->MakeRouter();
    auto local = backends::LocalDirBackend::Open(ws_->path());
    ASSERT_TRUE(local.has_value());
    ASSERT_TRUE(
        router_->Mount("/workspace", router_->Adopt(std::move(*local))));
    caller_ = store_->CallerFor("alice", "agent-s1");
    sandbox::SandboxOptions o;
    o.workspace = ws_->path();
    o.view = router_.get();
    o.identity = caller_;
    auto sb = sandbox::Sandbox::Create(o);
    ASSERT_TRUE(sb.has_value()) << sb.error().message;
    sandbox_ = std::move(*sb);
    files_ = std::make_unique<harness::FileTools>(*router_, caller_);
    sandbox::Limits l;
    l.timeout_s = 20;
    bash_ = std::make_unique<harness::BashTool>(*sandbox_, l);
    backend_ = store_->OpenBackend();
    log_ = std::make_unique<harness::SessionLog>(backend_->engine());
    session_.id = caller_.session;
    session_.user = "alice";
    session_.state = "new";
    session_.task = "task";
    session_.config = json::object();
    ASSERT_TRUE(log_->Create(session_).has_value());
  }
  void TearDown() override {
    if (sandbox_) sandbox_->Close();
  }
  std::unique_ptr<harness::ModelClient> Client(const FakeApi& api) {
    harness::ClientConfig c;
    c.provider = "anthropic";
    c.model = "claude-test";
    c.api_key = "k";
    c.base_url = api.Url();
    c.retry.sleep = [](std::chrono::milliseconds) {};
    return std::move(*harness::MakeModelClient(c));
  }
  Agent MakeAgent(harness::ModelClient& client, AgentOptions options = {}) {
    options.progress = [this](const std::string& line) {
      lines_.push_back(line);
    };
    auto s = log_->Get("alice", session_.id);
    return Agent(client, *files_, *bash_, *log_, *s, options);
  }
  std::vector<std::string> Kinds() {
    std::vector<std::string> kinds;
    auto events = log_->Events("alice", session_.id);  // kept alive below
    for (const auto& e : *events) kinds.push_back(e.kind);
    return kinds;
  }

  std::unique_ptr<StoreFixture> store_;
  std::unique_ptr<TempDir> ws_;
  std::unique_ptr<router::Router> router_;
  vfs::Caller caller_;
  std::unique_ptr<sandbox::Sandbox> sandbox_;
  std::unique_ptr<harness::FileTools> files_;
  std::unique_ptr<harness::BashTool> bash_;
  std::unique_ptr<store::StoreBackend> backend_;
  std::unique_ptr<harness::SessionLog> log_;
  harness::SessionInfo session_;
  std::vector<std::string> lines_;
};

TEST_F(AgentTest, ARunUsesEveryToolAndAnswersEveryCall) {
  FakeApi api{
      ToolUse("t1", "bash", {{"command", "echo 42 > /workspace/answer.txt"}},
              "Computing."),
      ToolUse("t2", "str_replace_based_edit_tool",
              {{"command", "view"}, {"path", "/workspace/answer.txt"}}),
      ToolUse("t3", "memory",
              {{"command", "create"},
               {"path", "/memories/users/alice/answer.md"},
               {"file_text", "The answer is 42.\n"}}),
      ToolUse("t4", "no_such_tool", {{"x", 1}}), Final("The answer is 42.")};
  auto client = Client(api);
  harness::Price price{3.0, 15.0};
  AgentOptions options;
  options.price = price;
  options.system_prompt = "SYSTEM";
  auto agent = MakeAgent(*client, options);
  auto out = agent.Start("Find the answer and remember it.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "done");
  EXPECT_EQ(out->final_text, "The answer is 42.");
  EXPECT_EQ(ReadFile(ws_->Sub("answer.txt")), "42\n");
  // Every request after the first answers the previous calls.
  auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 5u);
  EXPECT_EQ(reqs[0]["body"]["system"], "SYSTEM");
  EXPECT_EQ(reqs[0]["body"]["tools"].size(), 3u);
  auto last_result = [&](size_t i) {
    const json& msgs = reqs[i]["body"]["messages"];
    return msgs[msgs.size() - 1]["content"][0];
  };
  EXPECT_EQ(last_result(1)["tool_use_id"], "t1");
  EXPECT_EQ(last_result(1)["content"], "[exit code 0]");
  EXPECT_THAT(last_result(2)["content"].get<std::string>(),
              HasSubstr("     1\t42"));
  EXPECT_EQ(last_result(3)["content"],
            "File created successfully at: /memories/users/alice/answer.md");
  EXPECT_EQ(last_result(4)["is_error"], true);
  EXPECT_THAT(last_result(4)["content"].get<std::string>(),
              HasSubstr("no tool named 'no_such_tool'"));
  // Messages alternate user/assistant throughout.
  const json& msgs = reqs[4]["body"]["messages"];
  for (size_t i = 0; i < msgs.size(); ++i)
    EXPECT_EQ(msgs[i]["role"], i % 2 == 0 ? "user" : "assistant");
  // The memory reached the store, as alice.
  auto st = backend_->Stat(
      caller_, *vfs::Path::Parse("/memories/users/alice/answer.md"));
  EXPECT_TRUE(st.has_value());
  // Totals and events.
  auto s = log_->Get("alice", session_.id);
  EXPECT_EQ(s->state, "done");
  EXPECT_EQ(s->steps, 5);
  EXPECT_EQ(s->input_tokens, 4 * 1000 + 1200);
  EXPECT_EQ(s->output_tokens, 4 * 100 + 50);
  EXPECT_EQ(s->cost_micros, (5200 * 3 + 450 * 15));  // $/Mtok x tokens
  auto kinds = Kinds();
  EXPECT_EQ(kinds.front(), "task");
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "tool_started"), 4);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "tool_finished"), 4);
  EXPECT_EQ(kinds.back(), "stopped");
  ASSERT_EQ(lines_.size(), 5u);
  EXPECT_THAT(lines_[0], HasSubstr("bash: echo 42 > /workspace/answer.txt"));
  EXPECT_THAT(lines_[4], HasSubstr("done"));
}

TEST_F(AgentTest, ABudgetStopsTheSessionAndResumeGoesOn) {
  FakeApi api{
      ToolUse("t1", "bash", {{"command", "echo one >> /workspace/log"}}),
      ToolUse("t2", "bash", {{"command", "echo two >> /workspace/log"}}),
      Final("Both written.")};
  auto client = Client(api);
  AgentOptions tight;
  tight.budget.steps = 1;
  auto first = MakeAgent(*client, tight).Start("Write two lines.");
  ASSERT_TRUE(first.has_value()) << first.error().message;
  EXPECT_EQ(first->state, "budget");
  EXPECT_THAT(first->reason, HasSubstr("--max-steps"));
  EXPECT_EQ(ReadFile(ws_->Sub("log")), "one\n");
  EXPECT_EQ(api.Requests().size(), 1u);
  AgentOptions roomy;
  roomy.budget.steps = 10;
  auto second = MakeAgent(*client, roomy).Resume();
  ASSERT_TRUE(second.has_value()) << second.error().message;
  EXPECT_EQ(second->state, "done");
  EXPECT_EQ(ReadFile(ws_->Sub("log")), "one\ntwo\n");  // t1 not rerun
  auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 3u);
  // The resumed request carries the whole conversation with t1's answer.
  const json& msgs = reqs[1]["body"]["messages"];
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[2]["content"][0]["tool_use_id"], "t1");
}

TEST_F(AgentTest, TokenTimeAndCostBudgetsStopTheSessionToo) {
  struct Case {
    const char* name;
    std::function<void(harness::Budget&)> set;
    const char* reason;
  };
  const Case cases[] = {
      {"input tokens", [](harness::Budget& b) { b.input_tokens = 500; },
       "input-token budget"},
      {"output tokens", [](harness::Budget& b) { b.output_tokens = 50; },
       "output-token budget"},
      {"cost", [](harness::Budget& b) { b.cost_usd = 0.001; }, "cost budget"},
      {"time", [](harness::Budget& b) { b.seconds = 0.001; }, "time budget"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.name);
    harness::SessionInfo s = session_;
    s.id = std::string("budget-") + k.name;
    ASSERT_TRUE(log_->Create(s).has_value());
    FakeApi api{ToolUse("t1", "bash", {{"command", "true"}}), Final("never")};
    auto client = Client(api);
    AgentOptions options;
    k.set(options.budget);
    options.price = {3.0, 15.0};  // 1000 in + 100 out = $0.0045 > $0.001
    Agent agent(*client, *files_, *bash_, *log_, s, options);
    auto out = agent.Start("Go.");
    ASSERT_TRUE(out.has_value()) << out.error().message;
    EXPECT_EQ(out->state, "budget") << out->reason;
    EXPECT_THAT(out->reason, HasSubstr(k.reason));
    // Stopped before the second call (the time budget may run out before
    // the first).
    EXPECT_LE(api.Requests().size(), 1u);
    if (std::string(k.name) != "time") {
      EXPECT_EQ(api.Requests().size(), 1u);
    }
  }
}

TEST_F(AgentTest, ACallInterruptedByACrashIsReportedNotRerun) {
  // What a harness killed during t1 left behind: the model's call and
  // tool_started, no tool_finished.
  ASSERT_TRUE(log_->Append(session_.id, "task", {{"text", "Delete x."}}));
  json call = {{"role", "assistant"},
               {"content",
                {{{"type", "tool_use"},
                  {"id", "t1"},
                  {"name", "bash"},
                  {"input", {{"command", "echo ran >> /workspace/ran"}}}}}}};
  ASSERT_TRUE(
      log_->Append(session_.id, "model",
                   {{"message", call},
                    {"usage", {{"input_tokens", 10}, {"output_tokens", 5}}}}));
  ASSERT_TRUE(log_->Append(session_.id, "tool_started",
                           {{"id", "t1"}, {"name", "bash"}}));
  FakeApi api{Final("I will check first.")};
  auto client = Client(api);
  auto out = MakeAgent(*client).Resume();
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "done");
  EXPECT_FALSE(ReadFile(ws_->Sub("ran")).has_value());  // never run twice
  const json msgs = api.Requests().at(0)["body"]["messages"];
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[2]["content"][0]["tool_use_id"], "t1");
  EXPECT_EQ(msgs[2]["content"][0]["is_error"], true);
  EXPECT_THAT(msgs[2]["content"][0]["content"].get<std::string>(),
              HasSubstr("interrupted"));
}

TEST_F(AgentTest, ACallThatNeedsApprovalRunsOnlyWhenApproved) {
  FakeApi api{ToolUse("t1", "bash", {{"command", "rm -rf /workspace/keep"}}),
              ToolUse("t2", "bash", {{"command", "echo safe > /workspace/s"}}),
              Final("ok")};
  ASSERT_EQ(mkdir(ws_->Sub("keep").c_str(), 0755), 0);
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"bash", "rm -rf"}};
  std::vector<std::string> asked;
  options.approve = [&](const std::string& summary) {
    asked.push_back(summary);
    return false;
  };
  auto out = MakeAgent(*client, options).Start("Clean up.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  ASSERT_EQ(asked.size(), 1u);  // only the matching call asked
  EXPECT_THAT(asked[0], HasSubstr("rm -rf /workspace/keep"));
  struct stat st;
  EXPECT_EQ(stat(ws_->Sub("keep").c_str(), &st), 0);  // denied: not run
  EXPECT_EQ(ReadFile(ws_->Sub("s")), "safe\n");
  const json result = api.Requests().at(1)["body"]["messages"][2]["content"][0];
  EXPECT_EQ(result["is_error"], true);
  EXPECT_THAT(result["content"].get<std::string>(), HasSubstr("denied"));
  auto kinds = Kinds();
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "denied"), 1);
}

TEST_F(AgentTest, AnApprovalCanComeFromAnotherTerminal) {
  FakeApi api{ToolUse("t1", "bash", {{"command", "echo ok > /workspace/ran"}}),
              Final("done")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"bash", ""}};  // every bash call
  options.approve = [](const std::string&) { return std::nullopt; };
  // Another terminal: waits for the request, then approves it.
  std::thread person([this] {
    for (int i = 0; i < 200; ++i) {
      auto events = log_->Events("alice", session_.id);
      bool asked = false;
      for (const auto& e : *events) asked |= e.kind == "approval_requested";
      if (asked) {
        EXPECT_EQ(harness::RecordApproval(*log_, "bob", session_.id, "t1", true)
                      .error()
                      .code,
                  ENOENT);  // not bob's session
        EXPECT_ERRNO(
            harness::RecordApproval(*log_, "alice", session_.id, "t9", true),
            ENOENT);  // no such call waiting
        // Answering says what was answered.
        auto what =
            harness::RecordApproval(*log_, "alice", session_.id, "t1", true);
        EXPECT_TRUE(what.has_value());
        if (what) {
          EXPECT_EQ(*what, "bash: echo ok > /workspace/ran");
        }
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "no approval was requested";
  });
  auto out = MakeAgent(*client, options).Start("Run it.");
  person.join();
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "done");
  EXPECT_EQ(ReadFile(ws_->Sub("ran")), "ok\n");
  // The waiting line told the person what to type.
  bool told = false;
  for (const auto& l : lines_)
    told |=
        l.find("agentvfs approve " + session_.id + " t1") != std::string::npos;
  EXPECT_TRUE(told);
  // Answered once: a second answer is refused.
  EXPECT_ERRNO(
      harness::RecordApproval(*log_, "alice", session_.id, "t1", false),
      ENOENT);
}

TEST_F(AgentTest, OutputThatIsNotUtf8ReachesTheModelReplaced) {
  FakeApi api{
      ToolUse("t1", "bash", {{"command", "printf 'caf\\351 \\377 ok'"}}),
      Final("done")};
  auto client = Client(api);
  auto out = MakeAgent(*client).Start("Print bytes.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "done");
  const json result = api.Requests().at(1)["body"]["messages"][2]["content"][0];
  EXPECT_EQ(result["content"], "caf\ufffd \ufffd ok\n[exit code 0]");
}

TEST_F(AgentTest, ALiveSessionIsNotResumedBySecondHarness) {
  FakeApi api{ToolUse("t1", "bash", {{"command", "true"}}), Final("done")};
  auto client = Client(api);
  AgentOptions tight;
  tight.budget.steps = 1;
  ASSERT_EQ(MakeAgent(*client, tight).Start("Go.")->state, "budget");
  // Pretend this process is still running it.
  auto s = log_->Get("alice", session_.id);
  auto running = *s;
  running.state = "running";
  ASSERT_TRUE(log_->Update(running).has_value());
  Agent second(*client, *files_, *bash_, *log_, running, {});
  auto r = second.Resume();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EBUSY);
  EXPECT_THAT(r.error().message, HasSubstr("another harness"));
}

// Two harnesses that read the session at the same moment and both resume
// it: the second is refused before it runs the pending call a second time.
TEST_F(AgentTest, OfTwoHarnessesResumingAtOnceOnlyOneRuns) {
  // A session whose last answer holds a call that never started (its
  // harness died right after recording the model's answer).
  harness::Message answer{"assistant", {}};
  answer.content.push_back(harness::ContentBlock::ToolUse(
      "t1", "bash", {{"command", "sleep 1; echo once >> /workspace/count"}}));
  ASSERT_TRUE(log_->Append(session_.id, "task", {{"text", "Count."}}));
  ASSERT_TRUE(log_->Append(session_.id, "model",
                           {{"message", harness::MessageToJson(answer)},
                            {"stop_reason", "tool_use"}}));
  auto s = log_->Get("alice", session_.id);
  ASSERT_TRUE(s.has_value());
  s->state = "failed";
  ASSERT_TRUE(log_->Update(*s));
  FakeApi api{Final("counted"), Final("counted again")};
  auto client = Client(api);
  Agent first = MakeAgent(*client);  // both read the session now
  Agent second = MakeAgent(*client);
  vfs::Result<harness::Outcome> one;
  std::thread t([&] { one = first.Resume(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto two = second.Resume();
  t.join();
  // Normally the first claims it; on a slow machine the second may have.
  ASSERT_NE(one.has_value(), two.has_value())
      << "both or neither resumed the session";
  const auto& won = one.has_value() ? one : two;
  const auto& lost = one.has_value() ? two : one;
  EXPECT_EQ(won->state, "done");
  EXPECT_EQ(lost.error().code, EBUSY) << lost.error().message;
  EXPECT_EQ(ReadFile(ws_->Sub("count")), "once\n");
}

// A resume that fails after claiming the session (here: nothing recorded
// to resume) leaves the state it found, not "running".
TEST_F(AgentTest, AFailedResumeLeavesTheStateItFound) {
  auto s = log_->Get("alice", session_.id);
  ASSERT_TRUE(s.has_value());
  s->state = "failed";
  ASSERT_TRUE(log_->Update(*s));
  FakeApi api{Final("unused")};
  auto client = Client(api);
  auto r = MakeAgent(*client).Resume();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EINVAL) << r.error().message;
  EXPECT_EQ(log_->Get("alice", session_.id)->state, "failed");
}

TEST_F(AgentTest, CallsCutByMaxTokensAreNotRun) {
  json cut = ToolUse("t1", "bash", {{"command", "echo ran > /workspace/cut"}});
  cut["body"]["stop_reason"] = "max_tokens";
  FakeApi api{cut, Final("ok")};
  auto client = Client(api);
  auto out = MakeAgent(*client).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_FALSE(ReadFile(ws_->Sub("cut")).has_value());
  const json result = api.Requests().at(1)["body"]["messages"][2]["content"][0];
  EXPECT_EQ(result["is_error"], true);
  EXPECT_THAT(result["content"].get<std::string>(), HasSubstr("max_tokens"));
}

// A cut call's answer is recorded: a session that stops right after (here
// on its step budget) and is resumed never runs the call it cut.
TEST_F(AgentTest, ACallCutByMaxTokensIsNotRunWhenTheSessionIsResumed) {
  json cut = ToolUse("t1", "bash", {{"command", "echo ran > /workspace/cut"}});
  cut["body"]["stop_reason"] = "max_tokens";
  FakeApi api{cut, Final("ok")};
  auto client = Client(api);
  AgentOptions tight;
  tight.budget.steps = 1;
  auto out = MakeAgent(*client, tight).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  ASSERT_EQ(out->state, "budget");
  AgentOptions roomy;
  roomy.budget.steps = 10;
  auto again = MakeAgent(*client, roomy).Resume();
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(again->state, "done");
  EXPECT_FALSE(ReadFile(ws_->Sub("cut")).has_value()) << "the cut call ran";
  const json result = api.Requests().at(1)["body"]["messages"][2]["content"][0];
  EXPECT_EQ(result["is_error"], true);
  EXPECT_THAT(result["content"].get<std::string>(), HasSubstr("max_tokens"));
}

// The model writes the tool input: fields of another type than the schema
// says are errors it can correct, never a crash of the harness.
TEST_F(AgentTest, AToolInputOfTheWrongTypeIsAnErrorNotACrash) {
  FakeApi api{ToolUse("t1", "bash", {{"restart", "true"}}),
              ToolUse("t2", "memory", {{"command", 5}}),
              ToolUse("t3", "str_replace_based_edit_tool",
                      {{"command", "view"}, {"path", 7}}),
              Final("ok")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"", "never matches this"}};  // reads every input
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "done");
  for (int i = 1; i <= 3; ++i) {
    const json result =
        api.Requests().at(i)["body"]["messages"][2 * i]["content"][0];
    EXPECT_EQ(result["is_error"], true) << result.dump();
  }
}

// A reply of an unexpected shape from the model's server ends the session
// as failed (resumable) with a protocol error, not with a crash.
TEST_F(AgentTest, AModelReplyOfAnUnexpectedShapeFailsTheSession) {
  json odd = Final("x");
  odd["body"]["content"] = json::array({5, "text"});
  json null_reason = Final("y");
  null_reason["body"]["stop_reason"] = 42;
  for (const json& reply : {odd, null_reason}) {
    FakeApi api{reply};
    auto client = Client(api);
    auto out = MakeAgent(*client).Start("Go.");
    ASSERT_TRUE(out.has_value()) << out.error().message;
    EXPECT_EQ(out->state, "failed");
    EXPECT_THAT(out->reason, HasSubstr("unexpected shape"));
  }
}

// What a person is asked to approve is what runs, shown so that no control
// character can rewrite the line on a terminal.
TEST_F(AgentTest, AnApprovalShowsControlCharactersEscaped) {
  FakeApi api{ToolUse("t1", "bash",
                      {{"command",
                        "rm -rf /workspace/keep #\r\x1b[2Kbash: ls\xc2\x9b"}}),
              ToolUse("t2", "bash",
                      {{"command", "ls # a\\nb\nrm -rf /workspace/keep"}}),
              Final("ok")};
  ASSERT_EQ(mkdir(ws_->Sub("keep").c_str(), 0755), 0);
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"bash", "rm -rf"}};
  std::vector<std::string> asked;
  options.approve = [&](const std::string& summary) {
    asked.push_back(summary);
    return false;
  };
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[0].find_first_of("\r\x1b"), std::string::npos) << asked[0];
  EXPECT_EQ(asked[0].find("\xc2\x9b"), std::string::npos) << asked[0];
  EXPECT_THAT(asked[0], HasSubstr("rm -rf /workspace/keep #\\r\\x1b[2K"));
  // A written "\n" and a real line break never look the same.
  EXPECT_THAT(asked[1], HasSubstr("ls # a\\\\nb\\nrm -rf"));
  for (const auto& l : lines_)
    EXPECT_EQ(l.find_first_of("\r\x1b"), std::string::npos) << l;
}

// std::regex recursed once per character: a rule with `.*` against a
// 200,000-character command crashed the harness, and every resume again.
// A call too long to match asks instead.
TEST_F(AgentTest, ACallTooLongToMatchAgainstTheRulesAsks) {
  const std::string long_command = "echo curl " + std::string(200'000, 'a');
  FakeApi api{ToolUse("t1", "bash", {{"command", long_command}}),
              ToolUse("t2", "bash", {{"command", "echo short"}}), Final("ok")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"bash", "curl .*\\| *sh"}};
  std::vector<std::string> asked;
  options.approve = [&](const std::string& summary) {
    asked.push_back(summary.substr(0, 20));
    return false;
  };
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "done");
  ASSERT_EQ(asked.size(), 1u);  // the short one matched no rule
  EXPECT_EQ(asked[0], "bash: echo curl aaaa");
}

// The approval prompt shows the call whole, so a harmless start cannot
// hide what follows it, and with bidirectional and zero-width characters
// escaped, so it cannot show in another order than it runs.
TEST_F(AgentTest, TheApprovalPromptShowsTheWholeCallAsItRuns) {
  const std::string cmd =
      "echo 'checking the build status of the project, listing files only'"
      "      ; rm -rf /workspace/important; echo \u202edone\u2066\u200b"
      "\u2028\U000e0041\u00ad";
  FakeApi api{ToolUse("t1", "bash", {{"command", cmd}}), Final("ok")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"bash", ""}};
  options.approval_timeout_s = 0.2;
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  bool waited = false;
  for (const auto& l : lines_) {
    if (l.find("waiting for approval") == std::string::npos) continue;
    waited = true;
    EXPECT_THAT(l, HasSubstr("; rm -rf /workspace/important; echo "
                             "\\u202edone\\u2066\\u200b\\u2028"
                             "\\U000e0041\\u00ad"));
    EXPECT_EQ(l.find("\u202e"), std::string::npos) << l;
  }
  EXPECT_TRUE(waited);
}

// A tool's name and a call's id come from the model's server too: neither
// reaches the terminal raw, and an id a person could not type (to approve
// the call) is replaced.
TEST_F(AgentTest, ToolNamesAndCallIdsReachTheTerminalEscaped) {
  FakeApi api{
      ToolUse("id1\x1b[31mRED\rX", "bash\x1b]0;TITLE\a", {{"command", "true"}}),
      ToolUse("id2\x1b[2K", "bash", {{"command", "rm -rf /workspace/x"}}),
      Final("ok")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"bash", "rm -rf"}};
  options.approval_timeout_s = 0.2;
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "done");
  ASSERT_FALSE(lines_.empty());
  bool waited = false;
  for (const auto& l : lines_) {
    EXPECT_EQ(l.find_first_of("\r\x1b\a"), std::string::npos) << l;
    if (l.find("waiting for approval") != std::string::npos) {
      waited = true;
      EXPECT_THAT(
          l, HasSubstr("agentvfs approve " + session_.id + " agentvfs_2_1"));
    }
  }
  EXPECT_TRUE(waited);
  EXPECT_THAT(lines_[0], HasSubstr("bash\\x1b]0;TITLE\\x07: true"));
  // Nobody answered: the model is not told that a person denied it.
  auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 3u);
  const json& msgs = reqs[2]["body"]["messages"];
  EXPECT_THAT(msgs[msgs.size() - 1]["content"][0]["content"].get<std::string>(),
              HasSubstr("Nobody approved this call in time"));
}

// Approval rules see the place a path leads to: a symlink the model made
// in the workspace does not take a call around a rule on the directory it
// names.
TEST_F(AgentTest, ARuleOnAPathHoldsThroughASymlinkToIt) {
  ASSERT_EQ(mkdir(ws_->Sub("protected").c_str(), 0755), 0);
  ASSERT_EQ(symlink("protected", ws_->Sub("pp").c_str()), 0);
  ASSERT_EQ(mkdir(ws_->Sub("other").c_str(), 0755), 0);
  ASSERT_EQ(symlink("../protected", ws_->Sub("other/up").c_str()), 0);
  FakeApi api{ToolUse("t1", "str_replace_based_edit_tool",
                      {{"command", "create"},
                       {"path", "/workspace/pp/deploy.yml"},
                       {"file_text", "x"}}),
              ToolUse("t2", "str_replace_based_edit_tool",
                      {{"command", "create"},
                       {"path", "/workspace/other/up/deploy2.yml"},
                       {"file_text", "x"}}),
              ToolUse("t3", "str_replace_based_edit_tool",
                      {{"command", "create"},
                       {"path", "/workspace/other/free.yml"},
                       {"file_text", "x"}}),
              Final("ok")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {
      {"str_replace_based_edit_tool", "^create /workspace/protected"}};
  std::vector<std::string> asked;
  options.approve = [&](const std::string& summary) {
    asked.push_back(summary);
    return false;
  };
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_THAT(asked[0], HasSubstr("/workspace/protected/deploy.yml"));
  EXPECT_THAT(asked[1], HasSubstr("/workspace/protected/deploy2.yml"));
  EXPECT_FALSE(ReadFile(ws_->Sub("protected/deploy.yml")).has_value());
  EXPECT_EQ(ReadFile(ws_->Sub("other/free.yml")), "x");
}

// In the store, a symlink's absolute target is followed within the view,
// so a rule on /memories/users/alice/keep holds through `abs -> /memories/
// users/alice/keep` too.
TEST_F(AgentTest, ARuleOnAStorePathHoldsThroughAnAbsoluteSymlink) {
  auto P = [](const char* text) { return *vfs::Path::Parse(text); };
  ASSERT_OK(router_->Mkdir(caller_, P("/memories/users/alice/keep"), 0755));
  ASSERT_OK(router_->Symlink(caller_, "/memories/users/alice/keep",
                             P("/memories/users/alice/abs")));
  FakeApi api{ToolUse("t1", "str_replace_based_edit_tool",
                      {{"command", "create"},
                       {"path", "/memories/users/alice/abs/x.md"},
                       {"file_text", "x"}}),
              Final("ok")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {
      {"str_replace_based_edit_tool", "/memories/users/alice/keep"}};
  std::vector<std::string> asked;
  options.approve = [&](const std::string& summary) {
    asked.push_back(summary);
    return false;
  };
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_THAT(asked[0], HasSubstr("create /memories/users/alice/keep/x.md"));
  EXPECT_FALSE(router_->Stat(caller_, P("/memories/users/alice/keep/x.md")));
}

// Call ids come from the model's server; an answer given to an earlier
// call with the same id does not approve a later one.
TEST_F(AgentTest, AnAnswerToAnEarlierCallWithTheSameIdApprovesNothingElse) {
  FakeApi api{ToolUse("same", "bash", {{"command", "echo 1 > /workspace/one"}}),
              ToolUse("same", "bash", {{"command", "echo 2 > /workspace/two"}}),
              Final("ok")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"bash", ""}};
  options.approve = [](const std::string&) { return std::nullopt; };
  options.approval_timeout_s = 1.5;
  std::thread person([this] {  // approves the first request only
    for (int i = 0; i < 200; ++i) {
      auto events = log_->Events("alice", session_.id);
      for (const auto& e : *events)
        if (e.kind == "approval_requested") {
          EXPECT_TRUE(harness::RecordApproval(*log_, "alice", session_.id,
                                              "same", true));
          return;
        }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "no approval was requested";
  });
  auto out = MakeAgent(*client, options).Start("Go.");
  person.join();
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(ReadFile(ws_->Sub("one")), "1\n");
  EXPECT_FALSE(ReadFile(ws_->Sub("two")).has_value())
      << "the second call ran on the first call's approval";
}

TEST_F(AgentTest, AModelFailureStopsTheSessionResumably) {
  FakeApi api{{{"status", 400}, {"body", {{"error", {{"message", "bad"}}}}}},
              Final("fine now")};
  auto client = Client(api);
  auto out = MakeAgent(*client).Start("Hello");
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->state, "failed");
  EXPECT_THAT(out->reason, HasSubstr("agentvfs resume"));
  auto again = MakeAgent(*client).Resume();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->state, "done");
  EXPECT_EQ(again->final_text, "fine now");
}

// Two calls of one turn with the same id (or none, as some servers send):
// each gets an id of its own, so each answer goes to its own call, also
// when the session is replayed.
TEST_F(AgentTest, CallsWithoutUniqueIdsGetIdsOfTheirOwn) {
  json turn = ToolUse("dup", "bash", {{"command", "echo one > /workspace/1"}});
  turn["body"]["content"].push_back(
      {{"type", "tool_use"},
       {"id", "dup"},
       {"name", "bash"},
       {"input", {{"command", "echo two > /workspace/2"}}}});
  FakeApi api{turn, Final("ok")};
  auto client = Client(api);
  auto out = MakeAgent(*client).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "done");
  EXPECT_EQ(ReadFile(ws_->Sub("1")), "one\n");
  EXPECT_EQ(ReadFile(ws_->Sub("2")), "two\n");
  auto requests = api.Requests();
  ASSERT_EQ(requests.size(), 2u);
  const json& msgs = requests[1]["body"]["messages"];
  std::vector<std::string> uses, results;
  for (const auto& m : msgs)
    for (const auto& b : m["content"]) {
      if (!b.is_object()) continue;
      if (b.value("type", "") == "tool_use") uses.push_back(b["id"]);
      if (b.value("type", "") == "tool_result")
        results.push_back(b["tool_use_id"]);
    }
  ASSERT_EQ(uses.size(), 2u);
  EXPECT_NE(uses[0], uses[1]);
  EXPECT_EQ(results, uses);
}

// A session that ended on a refusal stays failed when resumed (before, the
// resume took the refusal for a finished answer and said done).
TEST_F(AgentTest, AResumedRefusalStaysFailed) {
  json refusal = Final("I can't help with that.");
  refusal["body"]["stop_reason"] = "refusal";
  FakeApi api{refusal, Final("never")};
  auto client = Client(api);
  auto out = MakeAgent(*client).Start("Do something bad.");
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->state, "failed");
  auto again = MakeAgent(*client).Resume();
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(again->state, "failed");
  EXPECT_EQ(log_->Get("alice", session_.id)->state, "failed");
  EXPECT_EQ(api.Requests().size(), 1u);
}

// A call is recorded as started only once approved, so a harness that dies
// while waiting asks again when resumed; an answer given to a harness that
// is gone is refused, saying so.
TEST_F(AgentTest, ACallStartsOnlyOnceApproved) {
  FakeApi api{ToolUse("t1", "bash", {{"command", "rm -rf /workspace/x"}}),
              Final("ok")};
  auto client = Client(api);
  AgentOptions options;
  options.approvals = {{"bash", "rm -rf"}};
  bool started_before_answer = false;
  options.approve = [&](const std::string&) -> std::optional<bool> {
    for (const auto& k : Kinds())
      if (k == "tool_started") started_before_answer = true;
    return true;
  };
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_FALSE(started_before_answer);

  harness::SessionInfo dead = session_;
  dead.id = "dead-harness";
  dead.state = "waiting";
  dead.config = {{"owner", "no-such-host-or-this 999999 1"}};
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  dead.config["owner"] = std::string(host) + " 999999 1";
  ASSERT_TRUE(log_->Create(dead).has_value());
  ASSERT_TRUE(log_->Append(dead.id, "approval_requested",
                           {{"id", "c1"}, {"summary", "bash: rm -rf x"}}));
  auto answered = harness::RecordApproval(*log_, "alice", dead.id, "c1", true);
  ASSERT_FALSE(answered.has_value());
  EXPECT_EQ(answered.error().code, ESRCH);
  EXPECT_THAT(answered.error().message, HasSubstr("no longer waiting"));
}

// A stop request (SIGINT in `agentvfs run`) ends the running command and
// the loop: the session is interrupted, not running, and a resume goes on
// from there without running the stopped command again.
TEST_F(AgentTest, AnInterruptStopsTheSessionResumably) {
  FakeApi api{ToolUse("t1", "bash",
                      {{"command", "echo once >> /workspace/n; sleep 30"}}),
              Final("resumed fine")};
  auto client = Client(api);
  std::thread stopper([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    harness::Interrupt(SIGINT);
    sandbox_->Kill();
  });
  auto started = std::chrono::steady_clock::now();
  auto out = MakeAgent(*client).Start("Go.");
  stopper.join();
  harness::ClearInterrupt();
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "interrupted");
  EXPECT_THAT(out->reason, HasSubstr("agentvfs resume"));
  EXPECT_LT(std::chrono::steady_clock::now() - started,
            std::chrono::seconds(20));
  EXPECT_EQ(log_->Get("alice", session_.id)->state, "interrupted");
  EXPECT_EQ(api.Requests().size(), 1u);
  auto again = MakeAgent(*client).Resume();
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(again->state, "done");
  EXPECT_EQ(again->final_text, "resumed fine");
  EXPECT_EQ(ReadFile(ws_->Sub("n")), "once\n");  // not run again
}

// The time budget bounds a model call too: a model that does not answer
// is given up when the budget runs out, not after its own timeout.
TEST_F(AgentTest, TheTimeBudgetBoundsAModelCall) {
  json slow = Final("too late");
  slow["delay_s"] = 30;
  FakeApi api{slow};
  auto client = Client(api);
  AgentOptions options;
  options.budget.seconds = 2;
  auto started = std::chrono::steady_clock::now();
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "budget");
  EXPECT_THAT(out->reason, HasSubstr("time budget"));
  EXPECT_LT(std::chrono::steady_clock::now() - started,
            std::chrono::seconds(10));
}

// The time budget covers commands too: a command runs only as long as the
// budget has left, and calls after it are not run (a turn of five
// `sleep 3` ran 15 s past a 2 s budget). The time spent is recorded.
TEST_F(AgentTest, TheTimeBudgetBoundsCommands) {
  json turn = ToolUse("t1", "bash", {{"command", "sleep 60"}});
  turn["body"]["content"].push_back({{"type", "tool_use"},
                                     {"id", "t2"},
                                     {"name", "bash"},
                                     {"input", {{"command", "echo ran"}}}});
  FakeApi api{turn, Final("late")};
  auto client = Client(api);
  AgentOptions options;
  options.budget.seconds = 1;
  auto out = MakeAgent(*client, options).Start("Go.");
  ASSERT_TRUE(out.has_value()) << out.error().message;
  EXPECT_EQ(out->state, "budget");
  EXPECT_THAT(out->reason, HasSubstr("time budget"));
  auto events = log_->Events("alice", session_.id);
  ASSERT_TRUE(events.has_value());
  std::map<std::string, std::string> results;
  for (const auto& e : *events)
    if (e.kind == "tool_finished")
      results[e.data.value("id", std::string())] =
          e.data.value("result", std::string());
  EXPECT_THAT(results["t1"], HasSubstr("timed out"));
  EXPECT_THAT(results["t2"], HasSubstr("Not run: the session's time budget"));
  EXPECT_EQ(api.Requests().size(), 1u);
  auto s = log_->Get("alice", session_.id);
  EXPECT_GE(s->elapsed_ms, 1000);
}

}  // namespace
}  // namespace agentvfs::testing
