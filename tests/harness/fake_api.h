// FakeApi: tests/data/fake_model_server.py started with a script of
// answers (one per request, in order), logging what it was sent; stopped
// when the object goes.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"

namespace agentvfs::testing {

using json = nlohmann::json;

inline std::string ServerScript() {
  std::string here = __FILE__;  // tests/harness/model_test.cc
  return here.substr(0, here.rfind("/harness/")) + "/data/fake_model_server.py";
}

// The fake API: started with a script of answers, stopped at the end.
class FakeApi {
 public:
  FakeApi(std::initializer_list<json> answers) : dir_("agentvfs-fake-api") {
    std::ofstream(dir_.Sub("script.json")) << json(answers).dump();
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      close(out[0]);
      std::string script = ServerScript(), s = dir_.Sub("script.json"),
                  l = dir_.Sub("log.jsonl");
      execlp("python3", "python3", script.c_str(), s.c_str(), l.c_str(),
             static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    // The port, up to its newline (it may come in more than one write; the
    // server must not find the pipe closed before it has written it all).
    std::string line;
    char c;
    while (line.size() < 16) {
      ssize_t n = read(out[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == '\n') break;
      line += c;
    }
    close(out[0]);
    port_ = atoi(line.c_str());
    EXPECT_GT(port_, 0) << "the fake API did not start";
  }
  ~FakeApi() {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  std::string Url(const std::string& suffix = "") const {
    return "http://127.0.0.1:" + std::to_string(port_) + suffix;
  }
  std::vector<json> Requests() const {
    std::vector<json> out;
    std::istringstream lines(ReadFile(dir_.Sub("log.jsonl")).value_or(""));
    for (std::string line; std::getline(lines, line);)
      out.push_back(json::parse(line));
    return out;
  }

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace agentvfs::testing
