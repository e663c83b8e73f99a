// ReaderPool: the connections an engine keeps for read transactions. A
// reader takes any free one; when all are busy it waits for one in turn.
// Each connection is used by one thread at a time (the holder of its lock).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>

namespace agentvfs::store {

template <typename Conn, size_t N>
class ReaderPool {
 public:
  // A connection and the lock that makes it this thread's.
  struct Lease {
    Conn* conn = nullptr;
    std::unique_lock<std::mutex> lock;
  };

  // Sets connection `i` (at start-up, before any Acquire).
  void Set(size_t i, std::unique_ptr<Conn> conn) {
    slots_[i].conn = std::move(conn);
  }
  static constexpr size_t size() { return N; }

  Lease Acquire() {
    for (auto& slot : slots_) {
      std::unique_lock<std::mutex> l(slot.mu, std::try_to_lock);
      if (l.owns_lock()) return {slot.conn.get(), std::move(l)};
    }
    Slot& slot = slots_[next_.fetch_add(1) % N];
    return {slot.conn.get(), std::unique_lock<std::mutex>(slot.mu)};
  }

 private:
  struct Slot {
    std::mutex mu;  // guards conn
    std::unique_ptr<Conn> conn;
  };
  std::array<Slot, N> slots_;
  std::atomic<size_t> next_{0};
};

}  // namespace agentvfs::store
