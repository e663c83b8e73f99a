// `agentvfs run`, `sessions`, `show` and `resume` as a person uses them:
// the real binary and store, the real sandbox, a scripted model API.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <thread>

#include "tests/harness/fake_api.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::e2e {
namespace {

using testing::CommandOptions;
using testing::FakeApi;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using json = nlohmann::json;

json Bash(const std::string& id, const std::string& command) {
  return {{"status", 200},
          {"body",
           {{"type", "message"},
            {"role", "assistant"},
            {"model", "m"},
            {"content",
             {{{"type", "tool_use"},
               {"id", id},
               {"name", "bash"},
               {"input", {{"command", command}}}}}},
            {"stop_reason", "tool_use"},
            {"usage", {{"input_tokens", 100}, {"output_tokens", 10}}}}}};
}

json Final(const std::string& text) {
  return {{"status", 200},
          {"body",
           {{"type", "message"},
            {"role", "assistant"},
            {"model", "m"},
            {"content", {{{"type", "text"}, {"text", text}}}},
            {"stop_reason", "end_turn"},
            {"usage", {{"input_tokens", 100}, {"output_tokens", 10}}}}}};
}

class RunCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = testing::StoreFixture::Create({"dev"});
    ASSERT_TRUE(store.has_value()) << store.error().message;
    store_ = std::move(*store);
    ws_ = std::make_unique<testing::TempDir>("agentvfs-run-ws");
    // Outside the workspace: the sandbox must never see a config file.
    conf_ = std::make_unique<testing::TempDir>("agentvfs-run-conf");
  }
  testing::CommandResult Agentvfs(std::vector<std::string> args,
                                  const FakeApi* api = nullptr) {
    args.insert(args.begin(), AGENTVFS_BINARY);
    args.insert(args.end(), {"--store", store_->db(), "--token-file",
                             store_->TokenFile("dev")});
    CommandOptions o;
    o.env = {{"ANTHROPIC_API_KEY", "test-key"},
             {"AGENTVFS_CONFIG", conf_->Sub("no-config.yaml")}};
    if (api) o.env["ANTHROPIC_BASE_URL"] = api->Url();
    return RunCommand(args, o);
  }
  // `agentvfs run TASK` as dev against `api`, as a child process with no
  // terminal (stdin, stdout and stderr on /dev/null); its pid.
  pid_t StartRun(const FakeApi& api, const std::string& task) {
    pid_t child = fork();
    if (child != 0) return child;
    setenv("ANTHROPIC_API_KEY", "k", 1);
    setenv("ANTHROPIC_BASE_URL", api.Url().c_str(), 1);
    setenv("AGENTVFS_CONFIG", conf_->Sub("no-config.yaml").c_str(), 1);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    execl(AGENTVFS_BINARY, AGENTVFS_BINARY, "run", "--workspace",
          ws_->path().c_str(), "--store", store_->db().c_str(), "--token-file",
          store_->TokenFile("dev").c_str(), task.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::unique_ptr<testing::StoreFixture> store_;
  std::unique_ptr<testing::TempDir> ws_;
  std::unique_ptr<testing::TempDir> conf_;
};

TEST_F(RunCliTest, ARunPrintsOneLinePerStepAndIsListedAndShown) {
  FakeApi api{Bash("t1",
                   "echo hello > /workspace/out.txt; cat /workspace/out.txt; "
                   "printf 'x\\n2026-01-01 00:00:00  denied: forged\\n'"),
              Final("Wrote out.txt.")};
  auto r = Agentvfs({"run", "--workspace", ws_->path(), "Write hello."}, &api);
  ASSERT_EQ(r.exit_status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[1] bash: echo hello > /workspace/out.txt"));
  EXPECT_THAT(r.output, HasSubstr("-> [exit code 0]"));
  EXPECT_THAT(r.output, HasSubstr("Wrote out.txt."));
  EXPECT_THAT(r.output, HasSubstr("done (the model finished); 2 steps"));
  // No prices in the config: the cost budget cannot hold, and run says so.
  EXPECT_THAT(r.output, HasSubstr("the cost budget ($10) is not enforced"));
  EXPECT_EQ(testing::ReadFile(ws_->Sub("out.txt")), "hello\n");
  // The key went to the API in its header, and nowhere into the sandbox.
  auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0]["headers"]["x-api-key"], "test-key");
  EXPECT_THAT(reqs[1]["body"]["messages"][2]["content"][0]["content"]
                  .get<std::string>(),
              HasSubstr("hello"));
  for (const auto& q : reqs)
    EXPECT_EQ(q["body"].dump().find("test-key"), std::string::npos);

  auto list = Agentvfs({"sessions"});
  ASSERT_EQ(list.exit_status, 0) << list.output;
  EXPECT_THAT(list.output, HasSubstr("done"));
  EXPECT_THAT(list.output, HasSubstr("Write hello."));
  std::string id = list.output.substr(list.output.find("\nrun-") + 1, 20);
  auto show = Agentvfs({"show", id});
  ASSERT_EQ(show.exit_status, 0) << show.output;
  EXPECT_THAT(show.output, HasSubstr("task: Write hello."));
  EXPECT_THAT(show.output, HasSubstr("-> bash"));
  EXPECT_THAT(show.output, HasSubstr("tool_finished: t1"));
  // What a command printed cannot pass for an event line: every line of
  // it is indented.
  EXPECT_THAT(show.output,
              HasSubstr("\n    2026-01-01 00:00:00  denied: forged"));
  EXPECT_THAT(show.output,
              Not(HasSubstr("\n2026-01-01 00:00:00  denied: forged")));
  auto show_json = Agentvfs({"show", id, "--json"});
  EXPECT_EQ(show_json.output.find("test-key"), std::string::npos);
  std::istringstream lines(show_json.output);
  int events = 0;
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("kind")) ++events;
  }
  EXPECT_GE(events, 6);  // task, model, started, finished, model, stopped
}

TEST_F(RunCliTest, ABudgetStopIsResumedWithALargerBudget) {
  FakeApi api{Bash("t1", "echo 1 >> /workspace/n"),
              Bash("t2", "echo 2 >> /workspace/n"), Final("Counted.")};
  auto r = Agentvfs(
      {"run", "--workspace", ws_->path(), "--max-steps", "1", "Count."}, &api);
  EXPECT_EQ(r.exit_status, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step budget reached"));
  std::string id = r.output.substr(r.output.find("session run-") + 8, 20);
  // A plain resume keeps the session's budget (it fell back to 50 steps):
  // still over it, it stops again without a model call.
  auto plain = Agentvfs({"resume", id}, &api);
  EXPECT_EQ(plain.exit_status, 3) << plain.output;
  EXPECT_THAT(plain.output, HasSubstr("step budget reached"));
  EXPECT_EQ(testing::ReadFile(ws_->Sub("n")), "1\n");
  EXPECT_EQ(api.Requests().size(), 1u);
  auto resumed = Agentvfs({"resume", id, "--max-steps", "10"}, &api);
  EXPECT_EQ(resumed.exit_status, 0) << resumed.output;
  EXPECT_EQ(testing::ReadFile(ws_->Sub("n")), "1\n2\n");
}

TEST_F(RunCliTest, AMissingKeyOrAnotherUsersSessionIsAClearError) {
  auto r =
      RunCommand({AGENTVFS_BINARY, "run", "--workspace", ws_->path(), "--store",
                  store_->db(), "--token-file", store_->TokenFile("dev"), "Hi"},
                 CommandOptions{.env = {{"ANTHROPIC_API_KEY", ""},
                                        {"OPENAI_API_KEY", ""}}});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_THAT(r.output, HasSubstr("ANTHROPIC_API_KEY"));
  auto show = Agentvfs({"show", "run-0000000000000000"});
  EXPECT_NE(show.exit_status, 0);
  EXPECT_THAT(show.output, HasSubstr("no session"));
}

}  // namespace
}  // namespace agentvfs::e2e

namespace agentvfs::e2e {
namespace {

TEST_F(RunCliTest, AHarnessKilledDuringACallResumesWithoutRunningItTwice) {
  FakeApi api{Bash("t1",
                   "echo started > /workspace/started; sleep 30; "
                   "echo again >> /workspace/finished"),
              Final("I checked; the step was interrupted.")};
  pid_t child = StartRun(api, "Do the long step.");
  ASSERT_GE(child, 0);
  for (int i = 0; i < 500 && !testing::ReadFile(ws_->Sub("started")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(testing::ReadFile(ws_->Sub("started")).has_value());
  ASSERT_EQ(kill(child, SIGKILL), 0);  // in the middle of the tool call
  int status;
  waitpid(child, &status, 0);
  auto list = Agentvfs({"sessions"});
  std::string id = list.output.substr(list.output.find("\nrun-") + 1, 20);
  // Recorded as running, but its harness is gone: listed as died.
  EXPECT_THAT(list.output, HasSubstr(" died "));
  EXPECT_THAT(list.output, HasSubstr("`agentvfs resume SESSION` goes on"));
  auto resumed = Agentvfs({"resume", id}, &api);
  EXPECT_EQ(resumed.exit_status, 0) << resumed.output;
  EXPECT_FALSE(testing::ReadFile(ws_->Sub("finished")).has_value());
  // The killed harness's command is gone too (its sandbox died with it).
  for (const auto& name :
       testing::ListDir("/proc").value_or(std::vector<std::string>{})) {
    auto cmdline = testing::ReadFile("/proc/" + name + "/cmdline");
    if (atoi(name.c_str()) > 0 && cmdline) {
      EXPECT_EQ(cmdline->find("/workspace/finished"), std::string::npos)
          << "process " << name << " outlived its harness";
    }
  }
  auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 2u);
  const json result = reqs[1]["body"]["messages"][2]["content"][0];
  EXPECT_EQ(result["tool_use_id"], "t1");
  EXPECT_EQ(result["is_error"], true);
  EXPECT_THAT(result["content"].get<std::string>(), HasSubstr("interrupted"));
}

TEST_F(RunCliTest, ACallIsDeniedFromAnotherTerminal) {
  std::ofstream(conf_->Sub("config.yaml"))
      << "approvals: [{tool: bash, pattern: \"rm -rf\"}]\n";
  ASSERT_EQ(mkdir(ws_->Sub("keep").c_str(), 0755), 0);
  FakeApi api{Bash("t1", "rm -rf /workspace/keep"), Final("Left it.")};
  testing::CommandResult run;
  std::thread runner([&] {
    CommandOptions o;
    o.env = {{"ANTHROPIC_API_KEY", "k"},
             {"ANTHROPIC_BASE_URL", api.Url()},
             {"AGENTVFS_CONFIG", conf_->Sub("config.yaml")}};
    run = RunCommand(
        {AGENTVFS_BINARY, "run", "--workspace", ws_->path(), "--store",
         store_->db(), "--token-file", store_->TokenFile("dev"), "Clean up."},
        o);
  });
  std::string id;
  for (int i = 0; i < 300 && id.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto list = Agentvfs({"sessions"});
    if (list.output.find("waiting") != std::string::npos)
      id = list.output.substr(list.output.find("\nrun-") + 1, 20);
  }
  if (id.empty()) {
    ADD_FAILURE() << "the session never waited for approval";
    runner.join();  // the run's own timeout ends it
    return;
  }
  auto deny = Agentvfs({"deny", id, "t1"});
  EXPECT_EQ(deny.exit_status, 0) << deny.output;
  EXPECT_THAT(deny.output, HasSubstr("denied t1 of session " + id +
                                     ": bash: rm -rf /workspace/keep"));
  runner.join();
  EXPECT_EQ(run.exit_status, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("agentvfs approve " + id + " t1"));
  struct stat st;
  EXPECT_EQ(stat(ws_->Sub("keep").c_str(), &st), 0);  // not run
  const json result = api.Requests().at(1)["body"]["messages"][2]["content"][0];
  EXPECT_THAT(result["content"].get<std::string>(), HasSubstr("denied"));
}

}  // namespace
}  // namespace agentvfs::e2e

namespace agentvfs::e2e {
namespace {

TEST_F(RunCliTest, TheModelAndKeyMayComeFromTheConfigFile) {
  FakeApi api{Final("Hi.")};
  std::ofstream(conf_->Sub("config.yaml"))
      << "provider: anthropic\nmodel: claude-from-config\napi_key: "
         "key-from-config\nbase_url: "
      << api.Url()
      << "\nprices: {claude-from-config: {input: 30, output: 150}}\n";
  auto r = RunCommand(
      {AGENTVFS_BINARY, "run", "--workspace", ws_->path(), "--store",
       store_->db(), "--token-file", store_->TokenFile("dev"), "Say hi."},
      CommandOptions{.env = {{"ANTHROPIC_API_KEY", ""},
                             {"AGENTVFS_CONFIG", conf_->Sub("config.yaml")}}});
  EXPECT_EQ(r.exit_status, 0) << r.output;
  auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0]["headers"]["x-api-key"], "key-from-config");
  EXPECT_EQ(reqs[0]["body"]["model"], "claude-from-config");
  // 100 in x $30 + 10 out x $150 per million tokens.
  EXPECT_THAT(r.output, HasSubstr("$0.0045"));
}

// An approval rule that could never match (a misspelt tool, a pattern that
// is no regular expression) is refused before anything runs, rather than
// letting every call through.
TEST_F(RunCliTest, AnApprovalRuleThatCannotMatchIsRefused) {
  for (const char* rules :
       {"approvals: [{tool: Bash, pattern: \"rm -rf\"}]\n",
        "approvals: [{tool: bash, pattern: \"rm -rf (\"}]\n"}) {
    FakeApi api{Bash("t1", "rm -rf /workspace/keep"), Final("Done.")};
    std::ofstream(conf_->Sub("config.yaml")) << rules;
    auto r = RunCommand(
        {AGENTVFS_BINARY, "run", "--workspace", ws_->path(), "--store",
         store_->db(), "--token-file", store_->TokenFile("dev"), "Go."},
        CommandOptions{
            .env = {{"ANTHROPIC_API_KEY", "k"},
                    {"ANTHROPIC_BASE_URL", api.Url()},
                    {"AGENTVFS_CONFIG", conf_->Sub("config.yaml")}}});
    EXPECT_EQ(r.exit_status, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("approval rule")) << rules;
    EXPECT_TRUE(api.Requests().empty());
  }
}

// `run --json` writes events, one JSON object per line, and nothing else
// to standard output: log lines (here the sweep of a killed run's sandbox)
// go to standard error.
TEST_F(RunCliTest, RunJsonWritesOnlyJsonToStandardOutput) {
  // Sandbox sessions in a directory of this test's own, so that the killed
  // run's is swept by the next run here, not by another test's.
  testing::TempDir state("agentvfs-run-state");
  ASSERT_EQ(chmod(state.path().c_str(), 0711), 0);
  setenv("XDG_RUNTIME_DIR", state.path().c_str(), 1);
  FakeApi killed{Bash("t1", "echo started > /workspace/started; sleep 30")};
  pid_t child = StartRun(killed, "Start.");
  unsetenv("XDG_RUNTIME_DIR");
  ASSERT_GE(child, 0);
  for (int i = 0; i < 500 && !testing::ReadFile(ws_->Sub("started")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(testing::ReadFile(ws_->Sub("started")).has_value());
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status;
  waitpid(child, &status, 0);

  FakeApi api{Bash("t1", "echo hi"), Final("Done.")};
  std::string out_path = conf_->Sub("stdout");
  auto r = RunCommand(
      {"sh", "-c",
       std::string("\"$0\" run --json --workspace \"$1\" "
                   "--store \"$2\" --token-file \"$3\" Go. "
                   "> \"$4\""),
       AGENTVFS_BINARY, ws_->path(), store_->db(), store_->TokenFile("dev"),
       out_path},
      CommandOptions{.env = {{"ANTHROPIC_API_KEY", "k"},
                             {"ANTHROPIC_BASE_URL", api.Url()},
                             {"AGENTVFS_CONFIG", conf_->Sub("no-config.yaml")},
                             {"XDG_RUNTIME_DIR", state.path()}}});
  ASSERT_EQ(r.exit_status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("stale sandbox session"));
  std::ifstream in(out_path);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines)
    EXPECT_FALSE(json::parse(line, nullptr, false).is_discarded()) << line;
  EXPECT_GT(lines, 2);
}

// Ctrl-C (SIGINT) during a call: the command is killed, the session is
// recorded as interrupted (not left "running"), the view and the sandbox
// are gone, `run` exits 130, and a resume finishes without running the
// stopped command again.
TEST_F(RunCliTest, SigintStopsTheSessionCleanlyAndResumeGoesOn) {
  FakeApi api{Bash("t1",
                   "echo started > /workspace/started; sleep 30; "
                   "echo again >> /workspace/finished"),
              Final("Stopped, then finished.")};
  // Sandbox sessions in a directory of this test's own: another test's
  // sandbox may be mounted meanwhile (RunJsonWritesOnlyJsonToStandardOutput
  // leaves a killed run's for its next run to sweep), and only this run's
  // must be gone.
  testing::TempDir state("agentvfs-run-state");
  ASSERT_EQ(chmod(state.path().c_str(), 0711), 0);
  setenv("XDG_RUNTIME_DIR", state.path().c_str(), 1);
  pid_t child = StartRun(api, "Do the long step.");
  unsetenv("XDG_RUNTIME_DIR");
  ASSERT_GE(child, 0);
  for (int i = 0; i < 500 && !testing::ReadFile(ws_->Sub("started")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  bool started = testing::ReadFile(ws_->Sub("started")).has_value();
  kill(child, SIGINT);
  int status = 0;
  for (int i = 0; i < 1000 && waitpid(child, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (waitpid(child, &status, WNOHANG) == 0) {  // still running after 20 s
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "run did not stop on SIGINT";
  }
  ASSERT_TRUE(started);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  auto list = Agentvfs({"sessions"});
  EXPECT_THAT(list.output, HasSubstr("interrupted"));
  std::string id = list.output.substr(list.output.find("\nrun-") + 1, 20);
  // Nothing of the session is left: no view mount, no sandbox process.
  auto mounts = testing::ReadFile("/proc/self/mountinfo").value_or("");
  EXPECT_EQ(mounts.find(state.path() + "/agentvfs-sandbox-"), std::string::npos)
      << mounts;
  for (const auto& name :
       testing::ListDir("/proc").value_or(std::vector<std::string>{})) {
    auto cmdline = testing::ReadFile("/proc/" + name + "/cmdline");
    if (atoi(name.c_str()) > 0 && cmdline) {
      EXPECT_EQ(cmdline->find("/workspace/finished"), std::string::npos)
          << "process " << name << " outlived the interrupted run";
    }
  }
  auto resumed = Agentvfs({"resume", id}, &api);
  EXPECT_EQ(resumed.exit_status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("Stopped, then finished."));
  EXPECT_FALSE(testing::ReadFile(ws_->Sub("finished")).has_value());
}

}  // namespace
}  // namespace agentvfs::e2e
