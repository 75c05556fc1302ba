#include "providers/soft/progress_timer.h"

#include <algorithm>

namespace melon::soft {

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

int ProgressTimer::system_wait(pollfd* fds, nfds_t n, const timespec* timeout) {
#if defined(__linux__)
  return ppoll(fds, n, timeout, nullptr);
#else
  return poll(fds, n, poll_timeout_ms(timeout));
#endif
}

void ProgressTimer::moved(uint64_t d) {
  const uint64_t now = clock_.now();
  uint64_t by = armed_ > now ? armed_ : kNever;
  if (timer_at_ > now) by = std::min(by, timer_at_);
  if (d >= by) return;
  if (alarm_.has_timer())
    timer_at_ = d;
  else
    armed_ = d;  // woken through the pipe, the thread plans its wait again at once
  if (d < due_.load(std::memory_order_relaxed)) due_.store(d, std::memory_order_relaxed);
}

void ProgressTimer::arm() {
  if (due_.load(std::memory_order_relaxed) == kNever) return;
  std::lock_guard<std::mutex> g(arm_mu_);
  const uint64_t d = due_.exchange(kNever, std::memory_order_relaxed);
  if (d == kNever) return;  // another thread armed it meanwhile
  if (alarm_.has_timer()) {
    if (alarm_.set_timer(d)) return;
    std::lock_guard<std::mutex> m(engine_mu_);
    timer_at_ = kNever;  // not armed after all: the wake below makes the thread look again
  }
  alarm_.wake();
}

ProgressTimer::Plan ProgressTimer::plan(uint64_t engine_deadline, uint64_t lease_end, uint64_t share_tick) {
  const uint64_t now = clock_.now();
  Plan p{engine_deadline, false};
  // The totals are copied out at most every kTotalsEveryNs; while they may be stale the wait is
  // capped so they catch up.
  if (now - totals_at_ >= kTotalsEveryNs) {
    p.publish = true;
    totals_at_ = now;
  } else {
    p.deadline = std::min(p.deadline, totals_at_ + kTotalsEveryNs);
  }
  if (share_tick) p.deadline = std::min(p.deadline, share_tick);
  if (lease_end) p.deadline = std::min(p.deadline, lease_end);
  // A timer set earlier than this needs a wake-up (moved); later ones are seen when this wait ends
  // anyway, so posts during a lease do not write to the wake pipe.
  armed_ = p.deadline;
  if (timer_at_ <= now) timer_at_ = kNever;  // the timer fd has fired (or fires at once)
  return p;
}

int ProgressTimer::wait(pollfd* fds, size_t n, uint64_t deadline) {
  if (deadline == kNever) return wait_(fds, nfds_t(n), nullptr);
  const uint64_t now = clock_.now();
  const uint64_t left = deadline <= now ? 0 : deadline - now;
  timespec ts{};
  ts.tv_sec = time_t(left / 1000000000ull);
  ts.tv_nsec = long(left % 1000000000ull);
  return wait_(fds, nfds_t(n), &ts);
}

}  // namespace melon::soft
