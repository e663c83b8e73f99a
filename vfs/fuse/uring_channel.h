// UringChannel: serves a FUSE session's requests over io_uring (Linux 6.14+,
// CONFIG_FUSE_IO_URING, fuse module parameter enable_uring=Y) instead of
// read(2)/writev(2) on /dev/fuse.
//
// Why: on /dev/fuse a request wakes a daemon thread that may sleep on another
// CPU, and the reply wakes the requester back across CPUs; on a virtual
// machine each such wake-up is an inter-processor interrupt and an idle-CPU
// exit. Over io_uring the kernel keeps one queue per CPU and hands a request
// to a daemon thread bound to the requester's CPU.
//
// How: libfuse 3.14 knows nothing of io_uring, but its request decoder
// (fuse_session_process_buf) takes any buffer in the /dev/fuse layout and its
// replies leave through the session's write hook. For every CPU queue the
// channel runs `threads_per_queue` threads, each bound to that CPU, each with
// its own ring and one registered entry (a header buffer and a payload buffer
// of the connection's largest message). A thread waits for the kernel to fill
// its entry, lays the request out as /dev/fuse would deliver it (in-header,
// per-op header, payload, contiguous), runs it through libfuse, and the reply,
// captured by CaptureReply from the write hook on the same thread, goes back
// into the entry; one COMMIT_AND_FETCH then answers it and waits for the next.
//
// Order of events: once INIT's reply carries FUSE_OVER_IO_URING the kernel
// holds every new request until each queue has an entry, so the rings and
// buffers are made first (Prepare, before that reply is written; the flag is
// set only if it succeeded) and the entries registered after (Go).
//
// What stays on /dev/fuse: INIT, FORGET, INTERRUPT and notifications; the
// session's ordinary loop keeps serving them. A reply must be sent on the
// thread that received the request, before the handler returns (handlers that
// hand work to another thread must run it inline when InRingThread() is
// true); a request left unanswered gets EIO. A captured reply counts as sent
// although the kernel only checks it at the commit (a malformed reply then
// fails that request alone, as a bad write to /dev/fuse would).
//
// Stop() wakes every thread through an eventfd; each thread answers what it
// holds and tears its ring down, which the kernel turns into cancelling the
// entry. The channel holds its own descriptor of the device, so libfuse may
// close its own (at unmount) while threads still commit.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "vfs/error.h"

struct fuse_session;  // libfuse

namespace agentvfs::fuse {

class UringChannel {
 public:
  struct Config {
    fuse_session* session = nullptr;
    int dev_fd = -1;          // the session's /dev/fuse descriptor (dup'ed)
    size_t payload_size = 0;  // >= the kernel's max_payload_sz
    unsigned threads_per_queue = 2;
  };
  // Number of queues the kernel keeps: one per possible CPU.
  static unsigned QueueCount();
  // Starts the threads and waits until each has its ring and buffers; an
  // error (io_uring refused, no memory) means none is left running.
  static vfs::Result<std::unique_ptr<UringChannel>> Prepare(const Config& cfg);
  ~UringChannel();
  UringChannel(const UringChannel&) = delete;
  UringChannel& operator=(const UringChannel&) = delete;

  // Lets the threads register their entries (after INIT's reply).
  void Go();
  // Wakes and joins every thread. Idempotent.
  void Stop();

  // True on a channel thread while it runs a request.
  static bool InRingThread();
  // From the session's write hook: when this thread is running a ring
  // request and `iov` is its reply, stores the reply in the ring entry and
  // returns its length (or -1 with errno set); otherwise nullopt, and the
  // caller writes `iov` to /dev/fuse as usual.
  static std::optional<ssize_t> CaptureReply(const struct iovec* iov,
                                             int count);
  // The same for a reply libfuse spliced into `pipe_fd` (`len` bytes).
  static std::optional<ssize_t> CaptureSplice(int pipe_fd, size_t len);

 private:
  explicit UringChannel(const Config& cfg);
  void Serve(unsigned qid);
  // Thread start-up handshake: each thread reports ready (or failed), then
  // waits for Go() or Stop().
  void Report(bool ok, std::string why);
  bool AwaitGo();  // false: stopping

  Config cfg_;
  int stop_fd_ = -1;  // eventfd: readable once Stop() was called
  std::mutex mu_;     // guards the handshake below
  std::condition_variable cv_;
  unsigned ready_ = 0, failed_threads_ = 0;
  std::string first_failure_;
  bool go_ = false, stopping_ = false;
  // Logged at Stop (with --debug): requests answered through the rings, of
  // those answered EIO by the channel itself, replies libfuse spliced, and
  // the largest request payload seen.
  std::atomic<uint64_t> served_{0}, failed_{0}, spliced_{0}, max_payload_{0};
  std::atomic<bool> announced_{false};
  std::vector<std::thread> threads_;
};

}  // namespace agentvfs::fuse
