// UringChannel: serves a FUSE session's requests over io_uring (Linux 6.14+,
// CONFIG_FUSE_IO_URING, fuse module parameter enable_uring=Y) instead of
// read(2)/writev(2) on /dev/fuse.
//
// Why: on /dev/fuse a request wakes a daemon thread that may sleep on another
// CPU, and the reply wakes the requester back across CPUs; on a virtual
// machine each such wake-up is an inter-processor interrupt and an idle-CPU
// exit, which dominates a metadata round trip. Over io_uring the kernel keeps
// one queue per CPU and hands a request to a daemon thread bound to the
// requester's CPU, so both wake-ups stay on one CPU.
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
// What stays on /dev/fuse: INIT (the channel starts after its reply), FORGET,
// INTERRUPT and notifications; the session's ordinary loop keeps serving
// them. A reply must be sent on the thread that received the request, before
// the handler returns (handlers that hand work to another thread must run it
// inline when InRingThread() is true); a request left unanswered gets EIO.
//
// Stop() wakes every thread through an eventfd; each thread then tears its
// ring down, which the kernel turns into cancelling the entry.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "vfs/error.h"

struct fuse_session;  // libfuse

namespace agentvfs::fuse {

class UringChannel {
 public:
  struct Config {
    fuse_session* session = nullptr;
    int dev_fd = -1;          // the session's /dev/fuse descriptor
    size_t payload_size = 0;  // >= the kernel's max_payload_sz
    unsigned threads_per_queue = 2;
  };
  // Number of queues the kernel keeps: one per possible CPU.
  static unsigned QueueCount();
  // Starts the threads; the kernel switches to the ring once every queue has
  // an entry registered (until then requests keep coming through /dev/fuse).
  static vfs::Result<std::unique_ptr<UringChannel>> Start(const Config& cfg);
  ~UringChannel();
  UringChannel(const UringChannel&) = delete;
  UringChannel& operator=(const UringChannel&) = delete;

  // Wakes and joins every thread. Idempotent.
  void Stop();

  // Requests answered through the ring so far.
  uint64_t Served() const { return served_.load(std::memory_order_relaxed); }

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

  Config cfg_;
  int stop_fd_ = -1;  // eventfd: readable once Stop() was called
  std::atomic<uint64_t> served_{0};
  std::atomic<unsigned> failed_{0};  // threads that could not register
  std::atomic<bool> announced_{false};
  std::vector<std::thread> threads_;
};

}  // namespace agentvfs::fuse
