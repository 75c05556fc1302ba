// The busy-poll lease: who receives a soft device's datagrams, its progress thread or the
// application that spins on an empty CQ. Once the application has polled without a pause for
// kSpinMinNs it takes the lease, the progress thread leaves the sockets (it keeps the timers and
// its wake pipe) and every poll receives, so an arrival never wakes a second thread that would race
// the spinning one for the socket and the CPU. The lease ends when no poll came for busy_ns
// (MELON_SOFT_BUSY_NS, default 1 ms; 0 turns it off), when a CQ is armed, or when a leased receive
// sees a stream (then none is taken for a back-off that doubles each time in a row).
//
// Only the decisions live here, each taking the time from its caller (tests pass their own);
// UdpTransport does the waking and the receiving. Locks: none. Every member is an atomic that any
// thread may read; the application's polls write with plain loads and stores (two threads polling
// at once may both see the older time, which only delays a lease), and taking or ending the lease
// is one exchange, so exactly one caller learns it changed hands and wakes the progress thread.
#pragma once
#include <atomic>
#include <cstdint>

namespace melon::soft {

class BusyPollLease {
 public:
  // Polls closer than kSpinGapNs are one spin; a spin of kSpinMinNs takes the lease (an
  // event-driven application's empty polls around ibv_req_notify_cq are a few µs apart and
  // shorter than that).
  static constexpr uint64_t kSpinGapNs = 20000, kSpinMinNs = 50000;
  // The first back-off after a stream; it doubles up to 128 times this (1.3 s).
  static constexpr uint64_t kNoLeaseAfterStreamNs = 10000000;

  explicit BusyPollLease(uint64_t busy_ns = 1000000) : busy_ns_(busy_ns) {}
  void set_busy_ns(uint64_t ns) { busy_ns_ = ns; }
  uint64_t busy_ns() const { return busy_ns_; }
  bool enabled() const { return busy_ns_ != 0; }

  struct Poll {
    bool leased;  // this poll receives (the lease is the application's)
    bool taken;  // this poll took it: the progress thread is to be woken to leave the sockets
  };
  // An empty CQ poll at `now`.
  Poll on_poll(uint64_t now) {
    bool lease = lease_.load(std::memory_order_relaxed);
    if (!busy_ns_) return {lease, false};
    const uint64_t prev = polled_at_.load(std::memory_order_relaxed);
    polled_at_.store(now, std::memory_order_relaxed);
    if (now - prev > kSpinGapNs) {
      spin_since_.store(now, std::memory_order_relaxed);
    } else if (!lease && now - spin_since_.load(std::memory_order_relaxed) >= kSpinMinNs &&
               now >= no_lease_until_.load(std::memory_order_relaxed)) {
      if (!lease_.exchange(true)) {
        waiter_lease_.store(false, std::memory_order_relaxed);  // a spin's lease, which arming ends
        return {true, true};
      }
      return {true, false};
    }
    return {lease, false};
  }

  // A leased receive made more replies than a ping-pong's: a stream, whose sending is work for
  // the progress thread on the other core.
  void note_stream() { stream_seen_.store(true, std::memory_order_relaxed); }
  // After a leased poll at `now`: if it saw a stream, the lease ends and none is taken for the
  // back-off. True when the lease was held (the progress thread is to be woken to take the sockets).
  bool end_if_stream(uint64_t now) {
    if (!stream_seen_.exchange(false, std::memory_order_relaxed)) return false;
    const uint64_t backoff = no_lease_backoff_ns_.load(std::memory_order_relaxed);
    no_lease_backoff_ns_.store(backoff * 2 < kMaxBackoffNs ? backoff * 2 : kMaxBackoffNs, std::memory_order_relaxed);
    no_lease_until_.store(now + backoff, std::memory_order_relaxed);
    return lease_.exchange(false);
  }

  enum class Arm {
    kept,  // a waiter's lease stays (its timer armed): the application waits there again
    ended,  // the lease was held and ends: wake the progress thread
    none,  // there was none
  };
  // A CQ was armed at `now`: the application is about to block. A poll right after arming
  // (closing the race with a completion) starts a new spin, not a lease; the back-off resets. The
  // lease a waiter left after receiving its own event stays: the application arms to wait again
  // (ibv_get_cq_event receives itself), and waking the progress thread to take the sockets, then
  // the next wait waking it to leave them, would cost two wake-ups a message.
  Arm on_arm(uint64_t now) {
    no_lease_backoff_ns_.store(kNoLeaseAfterStreamNs, std::memory_order_relaxed);
    spin_since_.store(now, std::memory_order_relaxed);
    polled_at_.store(now, std::memory_order_relaxed);
    if (waiter_lease_.exchange(false, std::memory_order_relaxed) && lease_.load()) return Arm::kept;
    return lease_.exchange(false) ? Arm::ended : Arm::none;
  }

  // A thread leaves a wait on a completion channel at `now`, where it received: it leaves a lease,
  // as a poll does, which the application's next poll, post or arming takes over (or the progress
  // thread's timer ends busy_ns later). `own_event`: its own receive signalled the channel.
  void on_wait_left(uint64_t now, bool own_event) {
    if (!busy_ns_) return;
    polled_at_.store(now, std::memory_order_relaxed);
    spin_since_.store(now, std::memory_order_relaxed);
    waiter_lease_.store(own_event, std::memory_order_relaxed);
    lease_.store(true);
  }

  // The progress thread before it waits, at `now`: the end of a lease still running (it watches
  // the timers only, and looks again then), or 0 when there is none, after ending one that ran out
  // (no poll for busy_ns). Called under the transport's engine lock, where the waiter that leaves
  // a lease also moves the progress thread's deadline, so either sees the other.
  uint64_t running_until(uint64_t now) {
    const uint64_t end =
        lease_.load(std::memory_order_relaxed) ? polled_at_.load(std::memory_order_relaxed) + busy_ns_ : 0;
    if (end > now) return end;
    lease_.store(false, std::memory_order_relaxed);
    waiter_lease_.store(false, std::memory_order_relaxed);
    return 0;
  }

  bool held() const { return lease_.load(std::memory_order_relaxed); }

 private:
  static constexpr uint64_t kMaxBackoffNs = kNoLeaseAfterStreamNs << 7;
  uint64_t busy_ns_;
  std::atomic<uint64_t> polled_at_{0};  // the last empty poll
  std::atomic<uint64_t> spin_since_{0};  // start of the application's current spin
  std::atomic<bool> lease_{false};
  std::atomic<bool> waiter_lease_{false};  // lease_ was left by a waiter that received its own event
  std::atomic<bool> stream_seen_{false};
  std::atomic<uint64_t> no_lease_until_{0};
  std::atomic<uint64_t> no_lease_backoff_ns_{kNoLeaseAfterStreamNs};  // reset when a CQ is armed
};

}  // namespace melon::soft
