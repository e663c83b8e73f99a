// Anthropic Messages and OpenAI Chat Completions clients over libcurl (see
// model.h).
#include "harness/model.h"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

namespace agentvfs::harness {

std::string ValidUtf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < s.size()) {
    unsigned char c = at(i);
    size_t len = c < 0x80                 ? 1
                 : c >= 0xC2 && c <= 0xDF ? 2
                 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4
                                          : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (at(i + k) >> 6) == 2;
    // No overlong forms, no surrogates, nothing past U+10FFFF.
    if (ok && len == 3)
      ok = !(c == 0xE0 && at(i + 1) < 0xA0) && !(c == 0xED && at(i + 1) > 0x9F);
    if (ok && len == 4)
      ok = !(c == 0xF0 && at(i + 1) < 0x90) && !(c == 0xF4 && at(i + 1) > 0x8F);
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

namespace {
std::atomic<int> g_interrupted{0};
}  // namespace

void Interrupt(int signal) { g_interrupted = signal > 0 ? signal : -1; }
int Interrupted() { return g_interrupted.load(); }
void ClearInterrupt() { g_interrupted = 0; }

using nlohmann::json;
using vfs::Fail;

ContentBlock ContentBlock::Text(std::string text) {
  ContentBlock b;
  b.kind = Kind::kText;
  b.text = std::move(text);
  return b;
}
ContentBlock ContentBlock::ToolUse(std::string id, std::string name,
                                   json input) {
  ContentBlock b;
  b.kind = Kind::kToolUse;
  b.id = std::move(id);
  b.name = std::move(name);
  b.input = std::move(input);
  return b;
}
ContentBlock ContentBlock::ToolResult(std::string id, std::string content,
                                      bool is_error) {
  ContentBlock b;
  b.kind = Kind::kToolResult;
  b.id = std::move(id);
  b.text = std::move(content);
  b.is_error = is_error;
  return b;
}

// --- libcurl ---------------------------------------------------------------

namespace {

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* headers = static_cast<std::map<std::string, std::string>*>(user);
  std::string line(data, size * n);
  auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n'))
      value.pop_back();
    (*headers)[name] = value;
  }
  return size * n;
}

class CurlTransport final : public HttpTransport {
 public:
  CurlTransport() {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }
  vfs::Result<HttpResponse> Post(const std::string& url,
                                 const std::vector<std::string>& headers,
                                 const std::string& body,
                                 std::chrono::seconds timeout) override {
    CURL* curl = curl_easy_init();
    if (curl == nullptr) return Fail(ENOMEM, "curl_easy_init failed");
    curl_slist* list = nullptr;
    for (const auto& h : headers) list = curl_slist_append(list, h.c_str());
    HttpResponse response;
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response.headers);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, static_cast<long>(timeout.count()));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    // A stop request ends the transfer (polled about once a second, and on
    // every bit of progress).
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(
        curl, CURLOPT_XFERINFOFUNCTION,
        +[](void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
          return Interrupted() != 0 ? 1 : 0;
        });
    curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "");
    CURLcode rc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
    curl_slist_free_all(list);
    curl_easy_cleanup(curl);
    if (rc == CURLE_ABORTED_BY_CALLBACK)
      return Fail(ECANCELED, "the model call was stopped (" + url + ")");
    if (rc != CURLE_OK) {
      int code = EIO;
      if (rc == CURLE_OPERATION_TIMEDOUT) code = ETIMEDOUT;
      if (rc == CURLE_COULDNT_CONNECT) code = ECONNREFUSED;
      if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY)
        code = EHOSTUNREACH;
      if (rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR ||
          rc == CURLE_GOT_NOTHING)
        code = ECONNRESET;
      return Fail(code, std::string(curl_easy_strerror(rc)) + " (" + url + ")");
    }
    return response;
  }
};

// --- helpers ---------------------------------------------------------------

std::string TrimSlash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

bool Retryable(long status) { return status == 429 || status >= 500; }

bool RetryableNetwork(int code) {
  return code == ETIMEDOUT || code == ECONNREFUSED || code == ECONNRESET ||
         code == EHOSTUNREACH || code == EIO;
}

// JSON nested deeper than this in a model's reply is refused: copying or
// printing a value recurses once per level, so a reply (or a tool call's
// arguments, which the model writes) nested 100,000 deep crashed the
// harness. Real replies nest a few levels; tool inputs a few more.
constexpr int kMaxJsonDepth = 128;

struct TooDeep {};

// json::parse(text) that gives up (TooDeep) past kMaxJsonDepth; a text that
// is not JSON is discarded as with allow_exceptions = false.
json ParseReplyAsIs(const std::string& text) {
  return json::parse(
      text,
      [](int depth, json::parse_event_t event, json&) {
        if (depth >= kMaxJsonDepth &&
            (event == json::parse_event_t::object_start ||
             event == json::parse_event_t::array_start))
          throw TooDeep{};
        return true;
      },
      false);
}

// A reply with bytes that are not UTF-8 in its strings (a server passing
// the model's bytes on) is read with U+FFFD in their place, as tool output
// is, rather than failing the session as "not a message".
json ParseReply(const std::string& text) {
  json j = ParseReplyAsIs(text);
  if (!j.is_discarded()) return j;
  std::string clean = ValidUtf8(text);
  return clean == text ? j : ParseReplyAsIs(clean);
}

// A token count of a reply's `usage`: 0 when absent or null; an error for
// anything but a whole number from 0 to 10^12 (a negative count would let a
// server, or a proxy, walk a run past its token and cost budgets).
vfs::Result<int64_t> TokenCount(const json& usage, const char* key) {
  auto it = usage.find(key);
  if (it == usage.end() || it->is_null()) return int64_t{0};
  constexpr uint64_t kMax = 1'000'000'000'000;
  if (it->is_number_unsigned() && it->get<uint64_t>() <= kMax)
    return static_cast<int64_t>(it->get<uint64_t>());
  if (it->is_number_integer() && it->get<int64_t>() == 0) return int64_t{0};
  return Fail(EPROTO, std::string("the reply's usage.") + key + " is " +
                          it->dump().substr(0, 40) +
                          ", not a count of tokens (a whole number from 0 to "
                          "10^12)");
}

// The API's own error message in a response body, when there is one.
std::string ApiMessage(const std::string& body) {
  json j;
  try {
    j = ParseReply(body);
  } catch (const TooDeep&) {
    return body.substr(0, 300);
  }
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end()) {
      if (e->is_object() && e->contains("message") &&
          (*e)["message"].is_string())
        return (*e)["message"].get<std::string>();
      if (e->is_string()) return e->get<std::string>();
    }
  }
  return body.substr(0, 300);
}

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// POSTs with retries (see RetryPolicy). `key_hint` names what to set when
// the key is rejected.
vfs::Result<HttpResponse> PostWithRetries(
    HttpTransport& transport, const RetryPolicy& policy, const std::string& url,
    const std::vector<std::string>& headers, const std::string& body,
    const std::string& key_hint, int* attempts,
    std::optional<std::chrono::steady_clock::time_point> deadline,
    const std::string& key) {
  using Clock = std::chrono::steady_clock;
  static thread_local std::mt19937 rng{std::random_device{}()};
  auto left = [&]() {
    return deadline ? std::chrono::duration_cast<std::chrono::milliseconds>(
                          *deadline - Clock::now())
                    : std::chrono::milliseconds::max();
  };
  auto wait = [&](int attempt, const HttpResponse* r) {
    auto delay = policy.base_delay * (1LL << std::min(attempt - 1, 16));
    delay = std::min<std::chrono::milliseconds>(delay, policy.max_delay);
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    auto ms = std::chrono::milliseconds(
        static_cast<int64_t>(static_cast<double>(delay.count()) * jitter(rng)));
    if (r != nullptr) {
      auto it = r->headers.find("retry-after");
      if (it != r->headers.end()) {
        char* end = nullptr;
        double secs = std::strtod(it->second.c_str(), &end);
        if (end != it->second.c_str() && secs >= 0)
          ms = std::min<std::chrono::milliseconds>(
              policy.max_delay,
              std::chrono::milliseconds(static_cast<int64_t>(secs * 1000)));
      }
    }
    ms = std::max(std::chrono::milliseconds(0), std::min(ms, left()));
    if (policy.sleep) {
      policy.sleep(ms);
      return;
    }
    // In slices, so that a stop request is not kept waiting.
    for (auto until = Clock::now() + ms;
         Clock::now() < until && Interrupted() == 0;)
      std::this_thread::sleep_for(std::min<Clock::duration>(
          std::chrono::milliseconds(100), until - Clock::now()));
  };
  vfs::Error last{EIO, "no attempt made"};
  for (int attempt = 1; attempt <= policy.max_attempts; ++attempt) {
    if (Interrupted() != 0)
      return Fail(ECANCELED, "the model call was stopped");
    if (deadline && Clock::now() >= *deadline)
      return Fail(ETIMEDOUT,
                  "the session's time budget ran out while waiting for the "
                  "model (" +
                      (attempt > 1 ? last.message + ", " : std::string()) +
                      std::to_string(attempt - 1) + " attempt(s))");
    *attempts = attempt;
    const auto remaining = left();
    // Whole seconds for curl, at least one, never past the deadline.
    auto timeout = std::min<std::chrono::seconds>(
        policy.request_timeout,
        std::max<std::chrono::seconds>(
            std::chrono::seconds(1),
            std::chrono::ceil<std::chrono::seconds>(remaining)));
    auto r = transport.Post(url, headers, body, timeout);
    if (!r) {
      last = r.error();
      if (last.code == ECANCELED) return std::unexpected(last);
      if (!RetryableNetwork(last.code) || attempt == policy.max_attempts) break;
      wait(attempt, nullptr);
      continue;
    }
    if (r->status >= 200 && r->status < 300) return *r;
    // A server may echo the request's headers back; the key never goes
    // into a message (they are logged and shown).
    std::string msg = OneLine(ApiMessage(r->body));
    if (key.size() >= 8)
      for (size_t at = msg.find(key); at != std::string::npos;
           at = msg.find(key, at))
        msg.replace(at, key.size(), "[the API key]");
    if (r->status == 401 || r->status == 403)
      return Fail(EACCES, "the model API rejected the key (HTTP " +
                              std::to_string(r->status) + ": " + msg +
                              "); check " + key_hint);
    if (!Retryable(r->status))
      return Fail(EINVAL, "the model API refused the request (HTTP " +
                              std::to_string(r->status) + ": " + msg + ")");
    last = vfs::Error{EAGAIN, "the model API answered HTTP " +
                                  std::to_string(r->status) + " (" + msg + ")"};
    if (attempt == policy.max_attempts) break;
    wait(attempt, &*r);
  }
  return Fail(last.code, last.message + " after " + std::to_string(*attempts) +
                             " attempts; try again later");
}

// --- Anthropic -------------------------------------------------------------

json AnthropicBlock(const ContentBlock& b) {
  switch (b.kind) {
    case ContentBlock::Kind::kText:
      return {{"type", "text"}, {"text", b.text}};
    case ContentBlock::Kind::kToolUse:
      return {{"type", "tool_use"},
              {"id", b.id},
              {"name", b.name},
              {"input", b.input.is_object() ? b.input : json::object()}};
    case ContentBlock::Kind::kToolResult: {
      json r = {
          {"type", "tool_result"}, {"tool_use_id", b.id}, {"content", b.text}};
      if (b.is_error) r["is_error"] = true;
      return r;
    }
  }
  return json::object();
}

class AnthropicClient final : public ModelClient {
 public:
  AnthropicClient(ClientConfig config, std::unique_ptr<HttpTransport> t)
      : config_(std::move(config)), transport_(std::move(t)) {}

  vfs::Result<ModelResponse> Complete(const ModelRequest& request) override {
    json body = AnthropicRequestBody(config_, request);
    std::vector<std::string> headers = {"content-type: application/json",
                                        "x-api-key: " + config_.api_key,
                                        "anthropic-version: 2023-06-01"};
    for (const auto& t : request.tools) {
      if (t.anthropic_type.rfind("memory_", 0) == 0) {
        headers.push_back("anthropic-beta: context-management-2025-06-27");
        break;
      }
    }
    ModelResponse out;
    auto r = PostWithRetries(
        *transport_, config_.retry, config_.base_url + "/v1/messages", headers,
        body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
        "ANTHROPIC_API_KEY", &out.attempts, request.deadline, config_.api_key);
    if (!r) return std::unexpected(r.error());
    // A field of an unexpected type (a server that is not quite the API)
    // is a protocol error, not a crash.
    try {
      json j = ParseReply(r->body);
      if (!j.is_object() || !j.contains("content") || !j["content"].is_array())
        return Fail(EPROTO,
                    "the Messages API answered something else than a "
                    "message: " +
                        r->body.substr(0, 200));
      out.message.role = "assistant";
      for (const auto& c : j["content"]) {
        std::string type = c.value("type", "");
        if (type == "text") {
          out.message.content.push_back(
              ContentBlock::Text(c.value("text", std::string())));
        } else if (type == "tool_use") {
          out.message.content.push_back(ContentBlock::ToolUse(
              c.value("id", std::string()), c.value("name", std::string()),
              c.contains("input") ? c["input"] : json::object()));
        }
        // Other block types (thinking, ...) are not kept.
      }
      out.stop_reason = j.value("stop_reason", std::string());
      out.model = j.value("model", config_.model);
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        for (const char* k : {"input_tokens", "cache_creation_input_tokens",
                              "cache_read_input_tokens"}) {
          auto n = TokenCount(*u, k);
          if (!n) return std::unexpected(n.error());
          out.usage.input_tokens += *n;
        }
        auto n = TokenCount(*u, "output_tokens");
        if (!n) return std::unexpected(n.error());
        out.usage.output_tokens = *n;
      }
    } catch (const json::exception& e) {
      return Fail(EPROTO, std::string("the Messages API answered a message "
                                      "of an unexpected shape: ") +
                              e.what());
    } catch (const TooDeep&) {
      return Fail(EPROTO,
                  "the Messages API answered a message nested more "
                  "than " +
                      std::to_string(kMaxJsonDepth) + " levels deep");
    }
    return out;
  }

 private:
  ClientConfig config_;
  std::unique_ptr<HttpTransport> transport_;
};

// --- OpenAI ----------------------------------------------------------------

class OpenAiClient final : public ModelClient {
 public:
  OpenAiClient(ClientConfig config, std::unique_ptr<HttpTransport> t)
      : config_(std::move(config)), transport_(std::move(t)) {}

  vfs::Result<ModelResponse> Complete(const ModelRequest& request) override {
    json body = OpenAiRequestBody(config_, request);
    std::vector<std::string> headers = {
        "content-type: application/json",
        "authorization: Bearer " + config_.api_key};
    ModelResponse out;
    auto r = PostWithRetries(
        *transport_, config_.retry, config_.base_url + "/chat/completions",
        headers,
        body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
        "OPENAI_API_KEY", &out.attempts, request.deadline, config_.api_key);
    if (!r) return std::unexpected(r.error());
    try {
      json j = ParseReply(r->body);
      if (!j.is_object() || !j.contains("choices") ||
          !j["choices"].is_array() || j["choices"].empty() ||
          !j["choices"][0].is_object())
        return Fail(EPROTO,
                    "the Chat Completions API answered something else "
                    "than a completion: " +
                        r->body.substr(0, 200));
      const json& choice = j["choices"][0];
      const json msg = choice.value("message", json::object());
      out.message.role = "assistant";
      if (msg.contains("content") && msg["content"].is_string() &&
          !msg["content"].get<std::string>().empty())
        out.message.content.push_back(
            ContentBlock::Text(msg["content"].get<std::string>()));
      if (msg.contains("tool_calls") && msg["tool_calls"].is_array()) {
        for (const auto& call : msg["tool_calls"]) {
          const json fn = call.value("function", json::object());
          // A JSON text, as the API sends them; some compatible servers
          // send the object itself.
          json input = json::object();
          if (auto a = fn.find("arguments"); a != fn.end()) {
            if (a->is_object()) {
              input = *a;
            } else if (a->is_string()) {
              std::string args = a->get<std::string>();
              input = ParseReply(args);
              // Arguments that are not JSON reach the tool as a string,
              // which it refuses with a message the model can act on.
              if (input.is_discarded()) input = args;
            } else if (!a->is_null()) {
              input = a->dump();
            }
          }
          out.message.content.push_back(
              ContentBlock::ToolUse(call.value("id", std::string()),
                                    fn.value("name", std::string()), input));
        }
      }
      std::string finish = choice.value("finish_reason", std::string());
      out.stop_reason = finish == "tool_calls" ? "tool_use"
                        : finish == "length"   ? "max_tokens"
                        : finish == "stop"     ? "end_turn"
                                               : finish;
      out.model = j.value("model", config_.model);
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        auto in = TokenCount(*u, "prompt_tokens");
        if (!in) return std::unexpected(in.error());
        auto out_tokens = TokenCount(*u, "completion_tokens");
        if (!out_tokens) return std::unexpected(out_tokens.error());
        out.usage.input_tokens = *in;
        out.usage.output_tokens = *out_tokens;
      }
    } catch (const json::exception& e) {
      return Fail(EPROTO,
                  std::string("the Chat Completions API answered a completion "
                              "of an unexpected shape: ") +
                      e.what());
    } catch (const TooDeep&) {
      return Fail(EPROTO,
                  "the Chat Completions API answered a completion (or "
                  "tool arguments) nested more than " +
                      std::to_string(kMaxJsonDepth) + " levels deep");
    }
    return out;
  }

 private:
  ClientConfig config_;
  std::unique_ptr<HttpTransport> transport_;
};

}  // namespace

json MessageToJson(const Message& m) {
  json content = json::array();
  for (const auto& b : m.content) {
    json j = AnthropicBlock(b);
    if (b.kind == ContentBlock::Kind::kToolUse) j["input"] = b.input;
    content.push_back(j);
  }
  return {{"role", m.role}, {"content", content}};
}

vfs::Result<Message> MessageFromJson(const json& j) {
  if (!j.is_object() || !j.contains("role") || !j["role"].is_string() ||
      !j.contains("content") || !j["content"].is_array())
    return Fail(EPROTO, "not a message: " +
                            j.dump(-1, ' ', false,
                                   nlohmann::json::error_handler_t::replace)
                                .substr(0, 200));
  Message m;
  m.role = j["role"].get<std::string>();
  for (const auto& c : j["content"]) {
    std::string type = c.value("type", "");
    if (type == "text")
      m.content.push_back(ContentBlock::Text(c.value("text", std::string())));
    else if (type == "tool_use")
      m.content.push_back(ContentBlock::ToolUse(
          c.value("id", std::string()), c.value("name", std::string()),
          c.contains("input") ? c["input"] : json::object()));
    else if (type == "tool_result")
      m.content.push_back(ContentBlock::ToolResult(
          c.value("tool_use_id", std::string()),
          c.value("content", std::string()), c.value("is_error", false)));
  }
  return m;
}

std::unique_ptr<HttpTransport> MakeCurlTransport() {
  return std::make_unique<CurlTransport>();
}

json AnthropicRequestBody(const ClientConfig& config,
                          const ModelRequest& request) {
  json body = {{"model", config.model}, {"max_tokens", request.max_tokens}};
  if (!request.system.empty()) body["system"] = request.system;
  json messages = json::array();
  for (const auto& m : request.messages) {
    json content = json::array();
    for (const auto& b : m.content) content.push_back(AnthropicBlock(b));
    messages.push_back({{"role", m.role}, {"content", content}});
  }
  body["messages"] = messages;
  if (!request.tools.empty()) {
    json tools = json::array();
    for (const auto& t : request.tools) {
      if (!t.anthropic_type.empty())
        tools.push_back({{"type", t.anthropic_type}, {"name", t.name}});
      else
        tools.push_back({{"name", t.name},
                         {"description", t.description},
                         {"input_schema", t.input_schema}});
    }
    body["tools"] = tools;
  }
  return body;
}

json OpenAiRequestBody(const ClientConfig& config,
                       const ModelRequest& request) {
  json messages = json::array();
  if (!request.system.empty())
    messages.push_back({{"role", "system"}, {"content", request.system}});
  for (const auto& m : request.messages) {
    if (m.role == "assistant") {
      json msg = {{"role", "assistant"}};
      std::string text;
      json calls = json::array();
      for (const auto& b : m.content) {
        if (b.kind == ContentBlock::Kind::kText) text += b.text;
        if (b.kind == ContentBlock::Kind::kToolUse)
          calls.push_back(
              {{"id", b.id},
               {"type", "function"},
               {"function",
                {{"name", b.name},
                 {"arguments",
                  b.input.is_string()
                      ? b.input.get<std::string>()
                      : b.input.dump(
                            -1, ' ', false,
                            nlohmann::json::error_handler_t::replace)}}}});
      }
      msg["content"] = text.empty() ? json(nullptr) : json(text);
      if (!calls.empty()) msg["tool_calls"] = calls;
      messages.push_back(msg);
      continue;
    }
    // A user turn: its tool results first (each a `tool` message, right
    // after the assistant's calls, as the API requires), then its text.
    std::string text;
    for (const auto& b : m.content) {
      if (b.kind == ContentBlock::Kind::kToolResult)
        messages.push_back(
            {{"role", "tool"},
             {"tool_call_id", b.id},
             {"content", b.is_error && !b.text.starts_with("Error")
                             ? "Error: " + b.text
                             : b.text}});
      if (b.kind == ContentBlock::Kind::kText) text += b.text;
    }
    if (!text.empty())
      messages.push_back({{"role", "user"}, {"content", text}});
  }
  json body = {{"model", config.model}, {"messages", messages}};
  // OpenAI's own API wants max_completion_tokens; compatible servers know
  // max_tokens.
  if (config.base_url.find("api.openai.com") != std::string::npos)
    body["max_completion_tokens"] = request.max_tokens;
  else
    body["max_tokens"] = request.max_tokens;
  if (!request.tools.empty()) {
    json tools = json::array();
    for (const auto& t : request.tools)
      tools.push_back({{"type", "function"},
                       {"function",
                        {{"name", t.name},
                         {"description", t.description},
                         {"parameters", t.input_schema}}}});
    body["tools"] = tools;
  }
  return body;
}

vfs::Status ApplyEnvironment(ClientConfig& config) {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (config.provider == "anthropic") {
    if (config.api_key.empty()) config.api_key = env("ANTHROPIC_API_KEY");
    if (config.base_url.empty()) config.base_url = env("ANTHROPIC_BASE_URL");
    if (config.base_url.empty()) config.base_url = "https://api.anthropic.com";
    config.base_url = TrimSlash(config.base_url);
    // Accept a base URL given with its /v1.
    if (config.base_url.size() >= 3 &&
        config.base_url.compare(config.base_url.size() - 3, 3, "/v1") == 0)
      config.base_url.resize(config.base_url.size() - 3);
    return {};
  }
  if (config.provider == "openai") {
    if (config.api_key.empty()) config.api_key = env("OPENAI_API_KEY");
    if (config.base_url.empty()) config.base_url = env("OPENAI_BASE_URL");
    if (config.base_url.empty()) config.base_url = "https://api.openai.com/v1";
    config.base_url = TrimSlash(config.base_url);
    return {};
  }
  return Fail(EINVAL, "unknown model provider '" + config.provider +
                          "'; use anthropic or openai (any OpenAI-compatible "
                          "server, with OPENAI_BASE_URL)");
}

vfs::Result<std::unique_ptr<ModelClient>> MakeModelClient(
    ClientConfig config, std::unique_ptr<HttpTransport> transport) {
  if (auto ok = ApplyEnvironment(config); !ok)
    return std::unexpected(ok.error());
  if (config.model.empty())
    return Fail(EINVAL,
                "no model named; pass --model or set model: in the "
                "config file");
  if (config.api_key.empty()) {
    // A local compatible server may need no key; the public APIs do.
    bool public_api =
        config.base_url.find("api.anthropic.com") != std::string::npos ||
        config.base_url.find("api.openai.com") != std::string::npos;
    if (public_api)
      return Fail(EACCES,
                  std::string("no API key: set ") +
                      (config.provider == "anthropic" ? "ANTHROPIC_API_KEY"
                                                      : "OPENAI_API_KEY") +
                      " (or api_key in the config file)");
  }
  if (!transport) transport = MakeCurlTransport();
  if (config.provider == "anthropic")
    return std::unique_ptr<ModelClient>(
        new AnthropicClient(std::move(config), std::move(transport)));
  return std::unique_ptr<ModelClient>(
      new OpenAiClient(std::move(config), std::move(transport)));
}

}  // namespace agentvfs::harness
