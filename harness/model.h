// Model clients: one conversation model, two wire formats.
//
// The loop keeps the conversation in Anthropic's shape (it is the richer
// one): messages alternate user/assistant; an assistant turn holds text and
// tool_use blocks; the next user turn answers every tool_use with a
// tool_result of the same id. AnthropicClient sends it to the Messages API
// as is; OpenAiClient translates it to Chat Completions (assistant
// `tool_calls`, `role: tool` replies) and back.
//
// Transport: HTTPS through libcurl (HttpTransport), retried with
// exponential backoff and jitter on 429 (honouring retry-after), 5xx and
// network errors or timeouts. A missing key fails before any request; a
// rejected one (401/403) fails at once with the API's own message and what
// to set. Every call reports its token usage.
//
// Errors: EINVAL (bad configuration or request), EACCES (missing or
// rejected key), EAGAIN (still rate-limited or overloaded after the
// retries), ETIMEDOUT / ECONNREFUSED / EHOSTUNREACH (network, after the
// retries), EPROTO (a response that is not the API's format).
//
// Thread safety: a client may be used by one thread at a time.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "vfs/error.h"

namespace agentvfs::harness {

struct ContentBlock {
  enum class Kind { kText, kToolUse, kToolResult };
  Kind kind = Kind::kText;
  std::string text;       // kText; kToolResult's content
  std::string id;         // kToolUse id; kToolResult's tool_use_id
  std::string name;       // kToolUse
  nlohmann::json input;   // kToolUse
  bool is_error = false;  // kToolResult

  static ContentBlock Text(std::string text);
  static ContentBlock ToolUse(std::string id, std::string name,
                              nlohmann::json input);
  static ContentBlock ToolResult(std::string id, std::string content,
                                 bool is_error);
};

struct Message {
  std::string role;  // "user" or "assistant"
  std::vector<ContentBlock> content;
};

// A message as JSON in Anthropic's block shapes (for the session log), and
// back; EPROTO for JSON that is not such a message.
nlohmann::json MessageToJson(const Message& m);
vfs::Result<Message> MessageFromJson(const nlohmann::json& j);

struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::json input_schema;  // JSON Schema of the input
  // For Anthropic: the type of its built-in tool with this name and these
  // commands ("bash_20250124", "text_editor_20250728", "memory_20250818");
  // empty: a custom tool described by input_schema.
  std::string anthropic_type;
};

struct ModelRequest {
  std::string system;
  std::vector<Message> messages;
  std::vector<ToolSpec> tools;
  int max_tokens = 8192;
  // When set, the call (its retries and waits included) gives up at this
  // time with ETIMEDOUT: the session's time budget.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// A process-wide stop request (the CLI's signal thread calls Interrupt):
// a model call in flight ends with ECANCELED, retries stop, and the agent
// loop stops at its next safe point. Interrupted() is the signal (or -1
// for a request without one), 0 when none.
void Interrupt(int signal);
int Interrupted();
void ClearInterrupt();  // for tests

struct Usage {
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
};

struct ModelResponse {
  Message message;          // role "assistant"
  std::string stop_reason;  // "end_turn", "tool_use", "max_tokens", ...
  Usage usage;
  std::string model;
  int attempts = 1;  // HTTP requests made, retries included
};

// --- transport ---------------------------------------------------------

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // POSTs `body`; a network failure is an error, an HTTP status is not.
  virtual vfs::Result<HttpResponse> Post(
      const std::string& url, const std::vector<std::string>& headers,
      const std::string& body, std::chrono::seconds timeout) = 0;
};

// libcurl. One easy handle per request.
std::unique_ptr<HttpTransport> MakeCurlTransport();

struct RetryPolicy {
  int max_attempts = 6;
  std::chrono::milliseconds base_delay{1000};
  std::chrono::milliseconds max_delay{60000};
  std::chrono::seconds request_timeout{600};
  // How to wait (tests shorten it); default sleeps.
  std::function<void(std::chrono::milliseconds)> sleep;
};

// --- clients -----------------------------------------------------------

struct ClientConfig {
  std::string provider;  // "anthropic" or "openai"
  std::string model;
  std::string api_key;
  std::string base_url;  // default: the provider's public API
  RetryPolicy retry;
};

// Fills what `config` leaves empty from the environment variables people
// already use: ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL, OPENAI_API_KEY /
// OPENAI_BASE_URL (a base URL with or without its /v1), and the default
// base URLs. EINVAL for an unknown provider.
vfs::Status ApplyEnvironment(ClientConfig& config);

class ModelClient {
 public:
  virtual ~ModelClient() = default;
  virtual vfs::Result<ModelResponse> Complete(const ModelRequest& request) = 0;
};

// EACCES when there is no key, EINVAL for a missing model or provider.
vfs::Result<std::unique_ptr<ModelClient>> MakeModelClient(
    ClientConfig config, std::unique_ptr<HttpTransport> transport = nullptr);

// The request bodies each client sends (exposed for tests and `--json`).
nlohmann::json AnthropicRequestBody(const ClientConfig& config,
                                    const ModelRequest& request);
nlohmann::json OpenAiRequestBody(const ClientConfig& config,
                                 const ModelRequest& request);

// `s` with every byte that is not part of valid UTF-8 (strict: no overlong
// forms, surrogates or code points past U+10FFFF) replaced by U+FFFD.
// Command output and some servers' replies are bytes; the APIs, JSON and
// the event log take text.
std::string ValidUtf8(const std::string& s);

}  // namespace agentvfs::harness
