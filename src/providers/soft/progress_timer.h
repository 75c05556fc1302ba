// When a soft device's progress thread wakes: the earlier of the deadline its own wait was planned
// for and the expiry of its timer fd (Linux timerfd), and what a thread that moved an engine timer
// earlier must do so the thread wakes in time: arm the timer fd (a post costs no wake-up) or, where
// there is none, write the wake pipe. The deadline arithmetic lives here, on a clock and an alarm the
// caller injects (tests pass their own), so it is tested without threads or sleeps; UdpTransport's
// progress thread only plans, waits and handles what woke it (progress_fds.h holds the descriptors).
//
// Locks: armed_ and timer_at_ are guarded by the transport's engine lock (mu_), which every caller of
// moved() and plan() holds; arm() takes its own arm_mu_ (one timerfd_settime at a time, the last with
// the earliest expiry asked for) and, only when arming failed, the engine lock after it
// (arm_mu_ -> mu_). due_ is an atomic handed from moved() to arm().
#pragma once
#include <limits.h>
#include <poll.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "rc/host.h"

namespace melon::soft {

// The progress thread's wait off Linux (macOS has poll, not ppoll): the time left, rounded up to
// whole milliseconds so the wait never ends before a deadline and a wait under 1 ms is not a spin
// of 0 ms timeouts, and capped at INT_MAX ms; -1 (no timeout) for no deadline.
inline int poll_timeout_ms(const timespec* ts) {
  if (!ts) return -1;
  const uint64_t ns = uint64_t(ts->tv_sec) * 1000000000ull + uint64_t(ts->tv_nsec);
  const uint64_t ms = ns / 1000000 + (ns % 1000000 != 0);
  return ms > uint64_t(INT_MAX) ? INT_MAX : int(ms);
}

// CLOCK_MONOTONIC in nanoseconds, the clock of the engine's timers and of the timer fd.
uint64_t monotonic_ns();
struct MonotonicClock final : rc::Clock {
  uint64_t now() override { return monotonic_ns(); }
};

class ProgressTimer {
 public:
  static constexpr uint64_t kNever = UINT64_MAX;
  // How often the engine's counter totals are copied out for melonctl (a sum over QPs).
  static constexpr uint64_t kTotalsEveryNs = 1000000;

  // What wakes the progress thread besides its sockets.
  class Alarm {
   public:
    virtual ~Alarm() = default;
    virtual bool has_timer() const = 0;  // a timer fd the thread watches (Linux)
    virtual bool set_timer(uint64_t at) = 0;  // arm it for absolute time `at`; false if that failed
    virtual void wake() = 0;  // the wake pipe: the thread plans its wait again at once
  };
  // The wait itself (ppoll on Linux; poll with poll_timeout_ms elsewhere): fds, and how long.
  using WaitFn = int (*)(pollfd* fds, nfds_t n, const timespec* timeout);
  static int system_wait(pollfd* fds, nfds_t n, const timespec* timeout);

  ProgressTimer(rc::Clock& clock, Alarm& alarm, std::mutex& engine_mu, WaitFn wait = system_wait)
      : clock_(clock), alarm_(alarm), engine_mu_(engine_mu), wait_(wait) {}

  // With the engine lock held, from any thread but the progress thread (which plans its wait again
  // anyway): an engine timer (or a lease's end) is now due at `d`. If that is earlier than the thread
  // will wake, arm() is to set the timer fd for `d`, or wake the thread where there is no timer fd.
  // A wake-up already due may be the one the thread is handling now, having read the state before
  // the caller changed it: only one still to come is sure to find the caller's changes.
  void moved(uint64_t d);
  // Without the engine lock, after the caller sent what it queued (packets do not wait for a
  // syscall): the timer_settime or wake-up moved() asked for, if any.
  void arm();

  // The progress thread, with the engine lock held, before it waits: the deadline of its next wait,
  // the earliest of the engine's next timer, a lease's end and the registries' next tick (0: none)
  // and, while the counter totals are stale, when they are due. `publish`: copy the totals out now.
  struct Plan {
    uint64_t deadline;
    bool publish;
  };
  Plan plan(uint64_t engine_deadline, uint64_t lease_end, uint64_t share_tick);
  // The progress thread's wait on `fds` until `deadline` (kNever: until a descriptor is ready).
  int wait(pollfd* fds, size_t n, uint64_t deadline);

  // For tests: the deadline the thread's current wait ends by, and the timer fd's expiry.
  uint64_t armed() const { return armed_; }
  uint64_t timer_at() const { return timer_at_; }

 private:
  rc::Clock& clock_;
  Alarm& alarm_;
  std::mutex& engine_mu_;
  WaitFn wait_;
  // The thread wakes by the earlier of armed_ (its own wait's deadline, set by plan()) and timer_at_
  // (the timer fd's expiry, kept after the timer it was armed for has gone: an early wake-up costs
  // the thread one look, a timerfd_settime per post costs the poster a syscall).
  uint64_t armed_ = kNever;
  uint64_t timer_at_ = kNever;
  std::atomic<uint64_t> due_{kNever};  // the expiry arm() has yet to set
  std::mutex arm_mu_;
  uint64_t totals_at_ = 0;  // when plan() last asked for the counter totals (progress thread only)
};

}  // namespace melon::soft
