// SignalGuard: a command that runs a sandbox survives SIGINT, SIGTERM and
// SIGHUP long enough to clean up (exec_command.cc, run_commands.cc).
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "backends/sandbox/sandbox.h"

namespace agentvfs::cli {

// Blocks the signals a session must survive long enough to clean up; a
// thread waits for them and kills the sandbox, so the command returns and
// the session ends with nothing left behind.
class SignalGuard {
 public:
  SignalGuard() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGWINCH, SIGUSR2})
      sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
    sigset_t winch;
    sigemptyset(&winch);
    sigaddset(&winch, SIGWINCH);
    winch_fd_ = signalfd(-1, &winch, SFD_CLOEXEC | SFD_NONBLOCK);
    thread_ = std::thread([this] {
      sigset_t wait;
      sigemptyset(&wait);
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR2}) sigaddset(&wait, s);
      int sig = 0;
      while (sigwait(&wait, &sig) == 0) {
        if (sig == SIGUSR2 && stopping_) return;
        got_ = sig;
        std::lock_guard lock(mu_);
        if (on_signal_) on_signal_(sig);
        if (target_ != nullptr) target_->Kill();
      }
    });
  }
  ~SignalGuard() {
    stopping_ = true;
    pthread_kill(thread_.native_handle(), SIGUSR2);
    thread_.join();
    if (winch_fd_ >= 0) close(winch_fd_);
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  int winch_fd() const { return winch_fd_; }
  int signal() const { return got_; }
  // The sandbox a signal stops (null: none; set to null before it goes).
  void SetTarget(sandbox::Sandbox* target) {
    std::lock_guard lock(mu_);
    target_ = target;
  }
  // Called (on the signal thread) with each stop signal, before the
  // sandbox is killed.
  void OnSignal(std::function<void(int)> f) {
    std::lock_guard lock(mu_);
    on_signal_ = std::move(f);
  }

 private:
  std::mutex mu_;  // guards target_ and on_signal_
  sandbox::Sandbox* target_ = nullptr;
  std::function<void(int)> on_signal_;
  sigset_t old_;
  int winch_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int> got_{0};
  std::thread thread_;
};

}  // namespace agentvfs::cli
