// The model clients against a local server that speaks each API's wire
// format (tests/data/fake_model_server.py): the exact requests sent, the
// parsing of answers, retries, and the errors a person sees.
#include "harness/model.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "tests/harness/fake_api.h"

namespace agentvfs::testing {
namespace {

using harness::ClientConfig;
using harness::ContentBlock;
using harness::ModelRequest;
using nlohmann::json;
using ::testing::HasSubstr;

ClientConfig Config(const std::string& provider, const std::string& url) {
  ClientConfig c;
  c.provider = provider;
  c.model = provider == "anthropic" ? "claude-test" : "gpt-test";
  c.api_key = "sk-test-key";
  c.base_url = url;
  c.retry.max_attempts = 4;
  c.retry.sleep = [](std::chrono::milliseconds) {};
  return c;
}

// A conversation with a finished tool call, as the loop keeps it.
ModelRequest Conversation() {
  ModelRequest r;
  r.system = "You are a careful agent.";
  r.max_tokens = 1000;
  r.messages.push_back({"user", {ContentBlock::Text("List the workspace.")}});
  r.messages.push_back(
      {"assistant",
       {ContentBlock::Text("Looking."),
        ContentBlock::ToolUse("call_1", "bash", {{"command", "ls"}})}});
  r.messages.push_back(
      {"user",
       {ContentBlock::ToolResult("call_1", "a.txt\n[exit code 0]", false)}});
  r.tools.push_back({"bash",
                     "Run a shell command",
                     {{"type", "object"},
                      {"properties", {{"command", {{"type", "string"}}}}},
                      {"required", {"command"}}},
                     "bash_20250124"});
  r.tools.push_back(
      {"lookup",
       "Look a word up",
       {{"type", "object"}, {"properties", {{"word", {{"type", "string"}}}}}},
       ""});
  return r;
}

const json kAnthropicAnswer = {
    {"id", "msg_1"},
    {"type", "message"},
    {"role", "assistant"},
    {"model", "claude-test"},
    {"content",
     {{{"type", "text"}, {"text", "Reading it."}},
      {{"type", "tool_use"},
       {"id", "toolu_2"},
       {"name", "str_replace_based_edit_tool"},
       {"input", {{"command", "view"}, {"path", "/workspace/a.txt"}}}}}},
    {"stop_reason", "tool_use"},
    {"usage", {{"input_tokens", 120}, {"output_tokens", 30}}}};

TEST(ModelClientTest, AnthropicSpeaksTheMessagesApi) {
  FakeApi api{{{"status", 200}, {"body", kAnthropicAnswer}}};
  auto client = harness::MakeModelClient(Config("anthropic", api.Url()));
  ASSERT_TRUE(client.has_value()) << client.error().message;
  auto r = (*client)->Complete(Conversation());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  auto reqs = api.Requests();
  ASSERT_EQ(reqs.size(), 1u);
  const json& q = reqs[0];
  EXPECT_EQ(q["path"], "/v1/messages");
  EXPECT_EQ(q["headers"]["x-api-key"], "sk-test-key");
  EXPECT_EQ(q["headers"]["anthropic-version"], "2023-06-01");
  EXPECT_EQ(q["headers"]["content-type"], "application/json");
  EXPECT_FALSE(q["headers"].contains("authorization"));
  const json& b = q["body"];
  EXPECT_EQ(b["model"], "claude-test");
  EXPECT_EQ(b["max_tokens"], 1000);
  EXPECT_EQ(b["system"], "You are a careful agent.");
  ASSERT_EQ(b["messages"].size(), 3u);
  EXPECT_EQ(b["messages"][1]["content"][1],
            (json{{"type", "tool_use"},
                  {"id", "call_1"},
                  {"name", "bash"},
                  {"input", {{"command", "ls"}}}}));
  EXPECT_EQ(b["messages"][2]["content"][0],
            (json{{"type", "tool_result"},
                  {"tool_use_id", "call_1"},
                  {"content", "a.txt\n[exit code 0]"}}));
  EXPECT_EQ(b["tools"][0], (json{{"type", "bash_20250124"}, {"name", "bash"}}));
  EXPECT_EQ(b["tools"][1]["input_schema"]["properties"]["word"]["type"],
            "string");
  // The answer.
  EXPECT_EQ(r->stop_reason, "tool_use");
  EXPECT_EQ(r->usage.input_tokens, 120);
  EXPECT_EQ(r->usage.output_tokens, 30);
  ASSERT_EQ(r->message.content.size(), 2u);
  EXPECT_EQ(r->message.content[0].text, "Reading it.");
  EXPECT_EQ(r->message.content[1].kind, ContentBlock::Kind::kToolUse);
  EXPECT_EQ(r->message.content[1].id, "toolu_2");
  EXPECT_EQ(r->message.content[1].input["path"], "/workspace/a.txt");
}

TEST(ModelClientTest, OpenAiSpeaksChatCompletionsWithToolCalls) {
  json answer = {
      {"id", "chatcmpl-1"},
      {"model", "gpt-test"},
      {"choices",
       {{{"index", 0},
         {"finish_reason", "tool_calls"},
         {"message",
          {{"role", "assistant"},
           {"content", nullptr},
           {"tool_calls",
            {{{"id", "call_9"},
              {"type", "function"},
              {"function",
               {{"name", "bash"}, {"arguments", "{\"command\":\"pwd\"}"}}}},
             {{"id", "call_10"},
              {"type", "function"},
              {"function",
               {{"name", "bash"}, {"arguments", "{not json"}}}}}}}}}}},
      {"usage", {{"prompt_tokens", 80}, {"completion_tokens", 12}}}};
  FakeApi api{{{"status", 200}, {"body", answer}}};
  auto client = harness::MakeModelClient(Config("openai", api.Url("/v1/")));
  ASSERT_TRUE(client.has_value());
  auto r = (*client)->Complete(Conversation());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const json q = api.Requests().at(0);
  EXPECT_EQ(q["path"], "/v1/chat/completions");
  EXPECT_EQ(q["headers"]["authorization"], "Bearer sk-test-key");
  const json& m = q["body"]["messages"];
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0], (json{{"role", "system"},
                        {"content", "You are a careful agent."}}));
  EXPECT_EQ(m[1], (json{{"role", "user"}, {"content", "List the workspace."}}));
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "Looking.");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"command\":\"ls\"}");
  EXPECT_EQ(m[3], (json{{"role", "tool"},
                        {"tool_call_id", "call_1"},
                        {"content", "a.txt\n[exit code 0]"}}));
  EXPECT_EQ(q["body"]["max_tokens"], 1000);  // a compatible server
  EXPECT_EQ(q["body"]["tools"][0]["type"], "function");
  EXPECT_EQ(q["body"]["tools"][0]["function"]["name"], "bash");
  EXPECT_EQ(r->stop_reason, "tool_use");
  EXPECT_EQ(r->usage.input_tokens, 80);
  ASSERT_EQ(r->message.content.size(), 2u);
  EXPECT_EQ(r->message.content[0].input["command"], "pwd");
  // Arguments that are not JSON reach the tool as a string (it refuses).
  EXPECT_TRUE(r->message.content[1].input.is_string());
}

// Some OpenAI-compatible servers send a call's arguments as the object
// itself, not as JSON text; and a reply whose strings hold bytes that are
// not UTF-8 is read with U+FFFD in their place. Both failed the session.
TEST(ModelClientTest, ArgumentsAsAnObjectAndRepliesThatAreNotUtf8AreRead) {
  json answer = {
      {"id", "chatcmpl-2"},
      {"choices",
       {{{"index", 0},
         {"finish_reason", "tool_calls"},
         {"message",
          {{"role", "assistant"},
           {"content", nullptr},
           {"tool_calls",
            {{{"id", "call_1"},
              {"type", "function"},
              {"function",
               {{"name", "bash"}, {"arguments", {{"command", "pwd"}}}}}}}}}}}}},
      {"usage", {{"prompt_tokens", 1}, {"completion_tokens", 1}}}};
  // "caf\xe9" and a lone continuation byte, as raw bytes in the reply.
  json bad = kAnthropicAnswer;
  bad["content"][0]["text"] = "caf@ ok @";
  std::string raw = bad.dump();
  // The fake server sends each character of body_latin1 as one byte.
  std::string latin1;
  int ats = 0;
  for (char c : raw) {
    if (c != '@')
      latin1 += c;
    else
      latin1 += ats++ == 0 ? "\xc3\xa9"   // U+00E9: the byte E9
                           : "\xc2\x80";  // U+0080: the byte 80
  }
  FakeApi api{{{"status", 200}, {"body", answer}},
              {{"status", 200}, {"body_latin1", latin1}}};
  auto openai = harness::MakeModelClient(Config("openai", api.Url("/v1/")));
  ASSERT_TRUE(openai.has_value());
  auto r = (*openai)->Complete(Conversation());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->message.content.size(), 1u);
  EXPECT_EQ(r->message.content[0].input, (json{{"command", "pwd"}}));
  auto anthropic = harness::MakeModelClient(Config("anthropic", api.Url()));
  ASSERT_TRUE(anthropic.has_value());
  r = (*anthropic)->Complete(Conversation());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->message.content[0].text, "caf\xef\xbf\xbd ok \xef\xbf\xbd");
}

// What a server (or the model, which writes a call's arguments) sends is
// checked before it is used: JSON nested 100,000 deep crashed the harness
// (copying it recursed once per level), and negative or absurd token
// counts walked a run past its budgets.
TEST(ModelClientTest, ARepliesNestedTooDeepOrWithNoTokenCountsAreRefused) {
  const std::string deep =
      std::string(100'000, '[') + std::string(100'000, ']');
  const std::string anthropic_deep =
      R"({"type":"message","role":"assistant","model":"m","stop_reason":"tool_use",)"
      R"("content":[{"type":"tool_use","id":"t1","name":"bash","input":{"x":)" +
      deep + R"(}}],"usage":{"input_tokens":1,"output_tokens":1}})";
  const std::string openai_deep =
      R"({"model":"m","choices":[{"index":0,"finish_reason":"tool_calls",)"
      R"("message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1",)"
      R"("type":"function","function":{"name":"bash","arguments":)" +
      json(R"({"x":)" + deep + "}").dump() + R"(}}]}}]})";
  auto message = [](json usage) {
    return json{{"type", "message"},
                {"role", "assistant"},
                {"model", "m"},
                {"content", {{{"type", "text"}, {"text", "hi"}}}},
                {"stop_reason", "end_turn"},
                {"usage", usage}};
  };
  auto completion = [](json usage) {
    return json{{"model", "m"},
                {"choices",
                 {{{"index", 0},
                   {"finish_reason", "stop"},
                   {"message", {{"role", "assistant"}, {"content", "hi"}}}}}},
                {"usage", usage}};
  };
  struct Case {
    std::string provider;
    json body;
    std::string says;
  };
  std::vector<Case> cases = {
      {"anthropic", anthropic_deep, "levels deep"},
      {"openai", openai_deep, "levels deep"},
      {"anthropic", message({{"input_tokens", -5000000}, {"output_tokens", 1}}),
       "usage.input_tokens is -5000000"},
      {"anthropic", message({{"input_tokens", 1}, {"output_tokens", 1e30}}),
       "usage.output_tokens"},
      {"anthropic",
       message({{"input_tokens", 1},
                {"cache_read_input_tokens", int64_t{9223372036854775807}},
                {"output_tokens", 1}}),
       "usage.cache_read_input_tokens"},
      {"openai", completion({{"prompt_tokens", 1}, {"completion_tokens", -1}}),
       "usage.completion_tokens is -1"},
      {"openai", completion({{"prompt_tokens", "12"}}), "usage.prompt_tokens"},
  };
  for (const auto& c : cases) {
    FakeApi api{{{"status", 200}, {"body", c.body}}};
    auto client = harness::MakeModelClient(
        Config(c.provider, api.Url(c.provider == "openai" ? "/v1/" : "")));
    ASSERT_TRUE(client.has_value());
    auto r = (*client)->Complete(Conversation());
    ASSERT_FALSE(r.has_value()) << c.says;
    EXPECT_EQ(r.error().code, EPROTO);
    EXPECT_THAT(r.error().message, HasSubstr(c.says));
  }
  // Counts that are whole and in range pass, null as none.
  FakeApi api{{{"status", 200},
               {"body", message({{"input_tokens", 7},
                                 {"cache_read_input_tokens", nullptr},
                                 {"output_tokens", 0}})}}};
  auto client = harness::MakeModelClient(Config("anthropic", api.Url()));
  auto r = (*client)->Complete(Conversation());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->usage.input_tokens, 7);
  EXPECT_EQ(r->usage.output_tokens, 0);
}

// An error result is marked "Error: " for Chat Completions (which has no
// is_error), once: the tools' own errors already start so.
TEST(ModelClientTest, OpenAiErrorResultsAreMarkedOnce) {
  json answer = {{"model", "gpt-test"},
                 {"choices",
                  {{{"index", 0},
                    {"finish_reason", "stop"},
                    {"message", {{"role", "assistant"}, {"content", "ok"}}}}}}};
  FakeApi api{{{"status", 200}, {"body", answer}}};
  auto client = harness::MakeModelClient(Config("openai", api.Url("/v1/")));
  ModelRequest r = Conversation();
  r.messages.back().content = {
      ContentBlock::ToolResult("call_1", "Error: no such file", true)};
  r.messages[1].content.push_back(
      ContentBlock::ToolUse("call_2", "bash", {{"command", "x"}}));
  r.messages.back().content.push_back(
      ContentBlock::ToolResult("call_2", "command not found", true));
  ASSERT_TRUE((*client)->Complete(r).has_value());
  const json q = api.Requests().at(0);
  const json& m = q["body"]["messages"];
  ASSERT_EQ(m.size(), 5u) << m.dump();
  EXPECT_EQ(m[3]["content"], "Error: no such file");
  EXPECT_EQ(m[4]["content"], "Error: command not found");
}

TEST(ModelClientTest, RateLimitsAndOverloadsAreRetriedHonouringRetryAfter) {
  json overloaded = {
      {"type", "error"},
      {"error", {{"type", "overloaded_error"}, {"message", "Overloaded"}}}};
  FakeApi api{{{"status", 429},
               {"headers", {{"retry-after", "7"}}},
               {"body", overloaded}},
              {{"status", 529}, {"body", overloaded}},
              {{"status", 200}, {"body", kAnthropicAnswer}}};
  auto config = Config("anthropic", api.Url());
  std::vector<int64_t> waits;
  config.retry.sleep = [&](std::chrono::milliseconds ms) {
    waits.push_back(ms.count());
  };
  auto client = harness::MakeModelClient(config);
  auto r = (*client)->Complete(Conversation());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->attempts, 3);
  EXPECT_EQ(api.Requests().size(), 3u);
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0], 7000);  // retry-after
  EXPECT_GE(waits[1], 1000);  // backoff: base 1 s doubled, with jitter
  EXPECT_LE(waits[1], 2000);
}

TEST(ModelClientTest, ARejectedKeyFailsAtOnceWithTheApisMessage) {
  FakeApi api{{{"status", 401},
               {"body",
                {{"type", "error"},
                 {"error",
                  {{"type", "authentication_error"},
                   {"message", "invalid x-api-key"}}}}}}};
  auto client = harness::MakeModelClient(Config("anthropic", api.Url()));
  auto r = (*client)->Complete(Conversation());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EACCES);
  EXPECT_THAT(r.error().message, HasSubstr("invalid x-api-key"));
  EXPECT_THAT(r.error().message, HasSubstr("ANTHROPIC_API_KEY"));
  EXPECT_EQ(api.Requests().size(), 1u);
}

TEST(ModelClientTest, BadRequestsAndForeignAnswersAreNotRetried) {
  FakeApi api{{{"status", 400},
               {"body",
                {{"error",
                  {{"message",
                    "messages: roles must "
                    "alternate"}}}}}},
              {{"status", 200}, {"body", "<html>proxy error</html>"}}};
  auto client = harness::MakeModelClient(Config("anthropic", api.Url()));
  auto r = (*client)->Complete(Conversation());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_THAT(r.error().message, HasSubstr("roles must alternate"));
  r = (*client)->Complete(Conversation());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EPROTO);
  EXPECT_EQ(api.Requests().size(), 2u);
}

// A server that echoes the request (headers and all) in its error: the key
// never reaches the message, which is logged and shown.
TEST(ModelClientTest, AnErrorThatEchoesTheKeyIsShownWithoutIt) {
  FakeApi api{{{"status", 400},
               {"body",
                {{"error",
                  {{"message",
                    "bad request with x-api-key: sk-test-key "
                    "and again sk-test-key"}}}}}}};
  auto client = harness::MakeModelClient(Config("anthropic", api.Url()));
  auto r = (*client)->Complete(Conversation());
  ASSERT_FALSE(r.has_value());
  EXPECT_THAT(r.error().message, HasSubstr("bad request with x-api-key"));
  EXPECT_EQ(r.error().message.find("sk-test-key"), std::string::npos)
      << r.error().message;
  EXPECT_THAT(r.error().message, HasSubstr("[the API key]"));
}

TEST(ModelClientTest, ANetworkFailureIsRetriedThenReported) {
  // A port nothing listens on.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  auto config =
      Config("openai",
             "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/v1");
  int waits = 0;
  config.retry.sleep = [&](std::chrono::milliseconds) { ++waits; };
  auto client = harness::MakeModelClient(config);
  auto r = (*client)->Complete(Conversation());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ECONNREFUSED);
  EXPECT_THAT(r.error().message, HasSubstr("after 4 attempts"));
  EXPECT_EQ(waits, 3);
}

TEST(ModelClientTest, KeysAndUrlsComeFromTheUsualEnvironmentVariables) {
  setenv("ANTHROPIC_API_KEY", "from-env", 1);
  setenv("ANTHROPIC_BASE_URL", "http://proxy.example/v1/", 1);
  setenv("OPENAI_BASE_URL", "http://localhost:11434/v1", 1);
  unsetenv("OPENAI_API_KEY");
  ClientConfig a;
  a.provider = "anthropic";
  ASSERT_TRUE(harness::ApplyEnvironment(a).has_value());
  EXPECT_EQ(a.api_key, "from-env");
  EXPECT_EQ(a.base_url, "http://proxy.example");
  ClientConfig o;
  o.provider = "openai";
  o.model = "llama";
  ASSERT_TRUE(harness::ApplyEnvironment(o).has_value());
  EXPECT_EQ(o.base_url, "http://localhost:11434/v1");
  // A local server may need no key.
  EXPECT_TRUE(harness::MakeModelClient(o).has_value());
  unsetenv("ANTHROPIC_API_KEY");
  unsetenv("ANTHROPIC_BASE_URL");
  unsetenv("OPENAI_BASE_URL");
  // The public APIs do: a clear error before any request.
  ClientConfig none;
  none.provider = "anthropic";
  none.model = "claude-test";
  auto r = harness::MakeModelClient(none);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EACCES);
  EXPECT_THAT(r.error().message, HasSubstr("set ANTHROPIC_API_KEY"));
  ClientConfig unknown;
  unknown.provider = "gemini";
  EXPECT_FALSE(harness::MakeModelClient(unknown).has_value());
}

}  // namespace
}  // namespace agentvfs::testing
