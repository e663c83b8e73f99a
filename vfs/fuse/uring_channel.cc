// UringChannel: FUSE requests over io_uring; see uring_channel.h.
#define FUSE_USE_VERSION 314
#include "vfs/fuse/uring_channel.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "vfs/fuse/fuse_abi.h"

namespace agentvfs::fuse {
namespace {

std::shared_ptr<spdlog::logger> Log() { return FuseLog(); }

// The kernel's FUSE-over-io_uring ABI (linux/fuse.h 7.42), which Debian 12's
// kernel headers predate.
namespace kabi {
using abi::InHeader;
using abi::OutHeader;
struct EntInOut {  // struct fuse_uring_ent_in_out
  uint64_t flags;
  uint64_t commit_id;
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};
struct ReqHeader {   // struct fuse_uring_req_header
  char in_out[128];  // fuse_in_header on fetch, fuse_out_header on commit
  char op_in[128];   // the per-op header (first argument), if any
  EntInOut ent;
};
struct CmdReq {  // struct fuse_uring_cmd_req, in the SQE's command area
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
static_assert(sizeof(EntInOut) == 32 && sizeof(ReqHeader) == 288 &&
              sizeof(CmdReq) == 24);
constexpr uint32_t kRegister = 1;        // FUSE_IO_URING_CMD_REGISTER
constexpr uint32_t kCommitAndFetch = 2;  // FUSE_IO_URING_CMD_COMMIT_AND_FETCH
}  // namespace kabi

// Completion tags.
constexpr uint64_t kEntryTag = 1, kStopTag = 2;
// Room before the payload for the in-header and the per-op header, so that
// the request can be laid out contiguously without moving the payload.
constexpr size_t kHeadroom = 4096;
static_assert(sizeof(kabi::ReqHeader) + sizeof(kabi::InHeader) + 128 <=
              kHeadroom);

// The ring entry this thread is serving a request from.
struct Entry {
  kabi::ReqHeader* header = nullptr;
  char* payload = nullptr;
  size_t payload_size = 0;
  uint64_t unique = 0;
  bool replied = false;
  std::atomic<uint64_t>* spliced = nullptr;  // the channel's counter
};
thread_local Entry* t_entry = nullptr;

bool ReadFull(int fd, char* out, size_t n) {
  while (n > 0) {
    ssize_t k = ::read(fd, out, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    out += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Marks the entry answered by header `h`, its `payload` bytes already in
// the payload buffer.
void StoreReply(Entry& e, const kabi::OutHeader& h, size_t payload) {
  std::memcpy(e.header->in_out, &h, sizeof h);
  e.header->ent.payload_sz = static_cast<uint32_t>(payload);
  e.replied = true;
}

// Answers the entry's request with `err` (negative errno) and no data.
void ReplyError(Entry& e, int err) {
  StoreReply(e, {sizeof(kabi::OutHeader), err, e.unique}, 0);
}

// How many CPUs a list like "0-3,5" (the format of
// /sys/devices/system/cpu/possible) names, or 0.
unsigned CountCpus(const std::string& list) {
  unsigned n = 0;
  size_t i = 0;
  while (i < list.size()) {
    size_t end = list.find(',', i);
    if (end == std::string::npos) end = list.size();
    std::string part = list.substr(i, end - i);
    size_t dash = part.find('-');
    try {
      int lo = std::stoi(part.substr(0, dash));
      int hi =
          dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      if (lo < 0 || hi < lo) return 0;
      n += static_cast<unsigned>(hi - lo + 1);
    } catch (const std::exception&) {
      return 0;
    }
    i = end + 1;
  }
  return n;
}

}  // namespace

unsigned UringChannel::QueueCount() {
  // As the kernel's num_possible_cpus().
  std::ifstream in("/sys/devices/system/cpu/possible");
  std::string list;
  if (in && std::getline(in, list)) {
    if (unsigned n = CountCpus(list); n > 0) return n;
  }
  return static_cast<unsigned>(std::max(1, get_nprocs_conf()));
}

bool UringChannel::InRingThread() { return t_entry != nullptr; }

std::optional<ssize_t> UringChannel::CaptureReply(const struct iovec* iov,
                                                  int count) {
  Entry* e = t_entry;
  if (e == nullptr) return std::nullopt;
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  kabi::OutHeader h{};
  if (total < sizeof h) return std::nullopt;
  MessageBytes(iov, count, 0, &h, sizeof h, false);
  // A notification (unique 0) sent while serving goes to /dev/fuse.
  if (h.unique != e->unique) return std::nullopt;
  if (e->replied || total - sizeof h > e->payload_size) {
    errno = EINVAL;
    return -1;
  }
  MessageBytes(iov, count, sizeof h, e->payload, total - sizeof h, false);
  StoreReply(*e, h, total - sizeof h);
  return static_cast<ssize_t>(total);
}

std::optional<ssize_t> UringChannel::CaptureSplice(int pipe_fd, size_t len) {
  Entry* e = t_entry;
  if (e == nullptr) return std::nullopt;
  kabi::OutHeader h{};
  if (e->replied || len < sizeof h || len - sizeof h > e->payload_size ||
      !ReadFull(pipe_fd, reinterpret_cast<char*>(&h), sizeof h) ||
      h.unique != e->unique || !ReadFull(pipe_fd, e->payload, len - sizeof h)) {
    // libfuse only splices data replies, which answer the request being
    // served; anything else would be a bug. The request then gets EIO.
    Log()->error("io_uring: unexpected spliced reply ({} bytes)", len);
    errno = EIO;
    return -1;
  }
  StoreReply(*e, h, len - sizeof h);
  e->spliced->fetch_add(1, std::memory_order_relaxed);
  return static_cast<ssize_t>(len);
}

UringChannel::UringChannel(const Config& cfg) : cfg_(cfg) {}

vfs::Result<std::unique_ptr<UringChannel>> UringChannel::Prepare(
    const Config& cfg) {
  std::unique_ptr<UringChannel> ch(new UringChannel(cfg));
  ch->cfg_.dev_fd = ::fcntl(cfg.dev_fd, F_DUPFD_CLOEXEC, 0);
  if (ch->cfg_.dev_fd < 0)
    return vfs::Fail(errno, std::string("dup: ") + std::strerror(errno));
  ch->stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (ch->stop_fd_ < 0)
    return vfs::Fail(errno, std::string("eventfd: ") + std::strerror(errno));
  const unsigned queues = QueueCount();
  const unsigned per_queue = std::max(1u, cfg.threads_per_queue);
  // Stop signals go to the thread that runs the session loop (as libfuse
  // does for its own workers): one landing on a ring thread would not wake
  // that loop. Threads inherit the mask they are created with.
  sigset_t stop_signals, old_mask;
  sigemptyset(&stop_signals);
  for (int sig : {SIGHUP, SIGINT, SIGQUIT, SIGTERM})
    sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);
  bool started = true;
  try {
    for (unsigned q = 0; q < queues; ++q)
      for (unsigned i = 0; i < per_queue; ++i)
        ch->threads_.emplace_back([raw = ch.get(), q] { raw->Serve(q); });
  } catch (const std::system_error&) {
    started = false;
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  std::string why = started ? "" : "cannot start io_uring threads";
  {
    std::unique_lock lock(ch->mu_);
    const size_t n = ch->threads_.size();
    ch->cv_.wait(lock, [&] { return ch->ready_ + ch->failed_threads_ == n; });
    if (why.empty()) why = ch->first_failure_;
  }
  if (!why.empty()) {
    ch->Stop();
    return vfs::Fail(EAGAIN, why);
  }
  Log()->debug("io_uring: {} queues x {} threads", queues, per_queue);
  return ch;
}

UringChannel::~UringChannel() { Stop(); }

void UringChannel::Go() {
  std::lock_guard lock(mu_);
  go_ = true;
  cv_.notify_all();
}

void UringChannel::Report(bool ok, std::string why) {
  std::lock_guard lock(mu_);
  (ok ? ready_ : failed_threads_) += 1;
  if (!ok && first_failure_.empty()) first_failure_ = std::move(why);
  cv_.notify_all();
}

bool UringChannel::AwaitGo() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return go_ || stopping_; });
  return !stopping_;
}

void UringChannel::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
  }
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  bool served;  // the threads ran, this is the first Stop
  {
    std::lock_guard lock(mu_);
    served = go_ && !threads_.empty();
  }
  threads_.clear();
  if (stop_fd_ >= 0) {
    ::close(stop_fd_);
    stop_fd_ = -1;
  }
  if (cfg_.dev_fd >= 0) {
    ::close(cfg_.dev_fd);
    cfg_.dev_fd = -1;
  }
  if (served) {
    Log()->debug(
        "io_uring: {} requests served ({} answered EIO here), {} spliced "
        "replies, largest payload {} bytes",
        served_.load(), failed_.load(), spliced_.load(), max_payload_.load());
  }
}

void UringChannel::Serve(unsigned qid) {
  // Bound to the queue's CPU, the thread is woken where the requester runs.
  // A CPU outside this process's set leaves the thread unbound.
  if (qid < CPU_SETSIZE) {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(qid, &cpus);
    (void)pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
  }

  io_uring ring;
  io_uring_params params{};
  // The kernel's command area needs 128-byte SQEs; completions are run
  // only when this thread waits for them (it is their only consumer).
  params.flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER |
                 IORING_SETUP_DEFER_TASKRUN;
  int rc = io_uring_queue_init_params(4, &ring, &params);
  if (rc == -EINVAL) {  // before Linux 6.1
    params = {};
    params.flags = IORING_SETUP_SQE128;
    rc = io_uring_queue_init_params(4, &ring, &params);
  }
  if (rc < 0) {
    Report(false, std::string("io_uring_setup: ") + std::strerror(-rc));
    return;
  }
  const size_t map_len = kHeadroom + cfg_.payload_size;
  void* mem = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    io_uring_queue_exit(&ring);
    Report(false, "cannot map " + std::to_string(map_len) + " bytes");
    return;
  }
  Report(true, {});
  if (!AwaitGo()) {
    io_uring_queue_exit(&ring);
    ::munmap(mem, map_len);
    return;
  }

  Entry e;
  e.header = static_cast<kabi::ReqHeader*>(mem);
  e.payload = static_cast<char*>(mem) + kHeadroom;
  e.payload_size = cfg_.payload_size;
  e.spliced = &spliced_;
  struct iovec iov[2] = {{e.header, sizeof(kabi::ReqHeader)},
                         {e.payload, e.payload_size}};
  // At most two commands are in flight (the entry's and the stop poll) on
  // a ring of four, so a submission slot is always free.
  auto command = [&](uint32_t op, uint64_t commit_id) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_rw(IORING_OP_URING_CMD, sqe, cfg_.dev_fd,
                     op == kabi::kRegister ? iov : nullptr,
                     op == kabi::kRegister ? 2 : 0, 0);
    sqe->cmd_op = op;
    kabi::CmdReq req{0, commit_id, static_cast<uint16_t>(qid), {}};
    std::memcpy(sqe->cmd, &req, sizeof req);
    io_uring_sqe_set_data64(sqe, kEntryTag);
  };
  command(kabi::kRegister, 0);
  io_uring_sqe* stop = io_uring_get_sqe(&ring);
  io_uring_prep_poll_add(stop, stop_fd_, POLLIN);
  io_uring_sqe_set_data64(stop, kStopTag);

  bool running = true;
  int refusals = 0;  // consecutive
  while (running) {
    rc = io_uring_submit_and_wait(&ring, 1);
    if (rc < 0 && rc != -EINTR) {
      Log()->error("io_uring: waiting failed: {}", std::strerror(-rc));
      break;
    }
    // Every completion of the batch is handled, a request after a stop too.
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      if (tag == kStopTag) {
        running = false;
        continue;
      }
      if (res == -ENOTCONN || res == -ECONNABORTED || res == -ECANCELED) {
        running = false;  // the connection ended (unmounted, aborted)
        continue;
      }
      if (res < 0) {
        // The kernel refused the entry (a commit for a request it no longer
        // knows, say): register it afresh, so the queue keeps this thread.
        Log()->warn("io_uring: the kernel refused queue {}'s entry: {}", qid,
                    std::strerror(-res));
        if (++refusals > 8) {
          Log()->error("io_uring: giving up queue {}'s entry", qid);
          running = false;
        } else {
          command(kabi::kRegister, 0);
        }
        continue;
      }
      refusals = 0;
      if (!announced_.exchange(true))
        Log()->debug("io_uring: FUSE requests now arrive over io_uring");
      kabi::InHeader h;
      std::memcpy(&h, e.header->in_out, sizeof h);
      const kabi::EntInOut ent = e.header->ent;
      e.unique = h.unique;
      e.replied = false;
      const size_t fixed = sizeof h + ent.payload_sz;
      if (h.len < fixed || h.len - fixed > sizeof e.header->op_in ||
          ent.payload_sz > e.payload_size) {
        Log()->error("io_uring: malformed request (opcode {}, {} bytes)",
                     h.opcode, h.len);
        ReplyError(e, -EIO);
        failed_.fetch_add(1, std::memory_order_relaxed);
      } else {
        // The /dev/fuse layout: in-header, per-op header, payload.
        const size_t op_len = h.len - fixed;
        char* start = e.payload - op_len - sizeof h;
        std::memcpy(start, &h, sizeof h);
        std::memcpy(start + sizeof h, e.header->op_in, op_len);
        uint64_t seen = max_payload_.load(std::memory_order_relaxed);
        while (ent.payload_sz > seen &&
               !max_payload_.compare_exchange_weak(seen, ent.payload_sz)) {
        }
        fuse_buf buf{};
        buf.size = h.len;
        buf.mem = start;
        t_entry = &e;
        fuse_session_process_buf(cfg_.session, &buf);
        t_entry = nullptr;
        if (!e.replied) {
          Log()->error("io_uring: request {} (opcode {}) got no reply",
                       h.unique, h.opcode);
          ReplyError(e, -EIO);
          failed_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      served_.fetch_add(1, std::memory_order_relaxed);
      command(kabi::kCommitAndFetch, h.unique);
    }
  }
  // Answers still queued go out before the ring goes; tearing the ring
  // down cancels the entry's pending fetch. (A request the last fetch took
  // meanwhile ends when the connection does.)
  (void)io_uring_submit(&ring);
  io_uring_queue_exit(&ring);
  ::munmap(mem, map_len);
}

}  // namespace agentvfs::fuse
