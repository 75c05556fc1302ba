#include "providers/soft/progress_fds.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#if defined(__linux__)
#include <sys/timerfd.h>
#endif
#include <unistd.h>

namespace melon::soft {

int ProgressFds::open(std::string* why) {
  int p[2];
  if (pipe(p) < 0) {
    const int e = errno;
    if (why) *why = std::string("pipe: ") + strerror(e);
    return e;
  }
  wake_rd_ = p[0];
  wake_wr_ = p[1];
  // The progress thread drains the wake pipe until EAGAIN; a blocking pipe would hang it.
  if (fcntl(wake_rd_, F_SETFL, O_NONBLOCK) != 0 || fcntl(wake_wr_, F_SETFL, O_NONBLOCK) != 0) {
    const int e = errno;
    close();
    if (why) *why = std::string("fcntl(O_NONBLOCK) on the wake pipe: ") + strerror(e);
    return e;
  }
#if defined(__linux__)
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);  // -1: woken through the pipe
#endif
  return 0;
}

void ProgressFds::close() {
  for (int* fd : {&wake_rd_, &wake_wr_, &timer_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

bool ProgressFds::set_timer(uint64_t at) {
#if defined(__linux__)
  if (timer_fd_ < 0) return false;
  itimerspec its{};
  its.it_value.tv_sec = time_t(at / 1000000000ull);
  its.it_value.tv_nsec = long(at % 1000000000ull);
  if (!its.it_value.tv_sec && !its.it_value.tv_nsec) its.it_value.tv_nsec = 1;  // 0 would disarm
  return timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &its, nullptr) == 0;
#else
  (void)at;
  return false;
#endif
}

void ProgressFds::wake() {
  char c = 1;
  if (wake_wr_ >= 0) (void)!write(wake_wr_, &c, 1);
}

void ProgressFds::watch(std::vector<pollfd>* fds) const {
  fds->push_back({wake_rd_, POLLIN, 0});
  if (timer_fd_ >= 0) fds->push_back({timer_fd_, POLLIN, 0});
}

void ProgressFds::drain(const pollfd* fds) const {
  if (fds[0].revents & POLLIN) {
    char buf[64];
    while (read(wake_rd_, buf, sizeof buf) > 0) {}
  }
  if (timer_fd_ >= 0 && (fds[1].revents & POLLIN)) {
    uint64_t expirations;
    (void)!read(timer_fd_, &expirations, sizeof expirations);
  }
}

}  // namespace melon::soft
