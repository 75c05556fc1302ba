// The progress thread's own descriptors (progress_timer.h's Alarm): a non-blocking wake pipe any
// thread writes a byte to, and on Linux a timerfd armed for an absolute CLOCK_MONOTONIC time, so a
// post that moves a timer earlier arms it without waking the thread. Without a timerfd (macOS, or
// timerfd_create failed) such a post wakes the thread through the pipe.
//
// Locks: none. The descriptors are opened before the progress thread starts and closed after it was
// joined; a write to the pipe and timerfd_settime are safe from any thread (ProgressTimer::arm
// makes the settime calls one at a time).
#pragma once
#include <poll.h>

#include <cstdint>
#include <string>
#include <vector>

#include "providers/soft/progress_timer.h"

namespace melon::soft {

class ProgressFds final : public ProgressTimer::Alarm {
 public:
  ProgressFds() = default;
  ProgressFds(const ProgressFds&) = delete;
  ProgressFds& operator=(const ProgressFds&) = delete;
  ~ProgressFds() override { close(); }

  // 0, or an errno value with *why saying which call failed.
  int open(std::string* why);
  void close();

  bool has_timer() const override { return timer_fd_ >= 0; }
  bool set_timer(uint64_t at) override;
  void wake() override;

  // Appends the wake pipe and then the timer fd (if any) to `fds`, for the progress thread's wait.
  void watch(std::vector<pollfd>* fds) const;
  // After that wait: `fds` points at the entries watch() appended. Empties the pipe and reads the
  // timer's expirations, so the next wait blocks again.
  void drain(const pollfd* fds) const;

 private:
  int wake_rd_ = -1, wake_wr_ = -1;
  int timer_fd_ = -1;
};

}  // namespace melon::soft
