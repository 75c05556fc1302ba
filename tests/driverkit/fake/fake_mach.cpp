// The fake kernel's mach ports and kqueues, as far as an IOKit notification port needs them:
// IONotificationPortCreate makes a receive port, IOUserClient::AsyncCompletion queues one message
// on the port its call named (dropped when the queue holds kMachPortQueueLimit, as a kernel send
// with a zero timeout is), mach_msg takes messages off, and kqueue/kevent wait for EVFILT_READ
// descriptors and EVFILT_MACHPORT ports with poll(). A port's eventfd (semaphore mode) counts its
// queued messages, so a waiter polls it; Apple's semantics, level-triggered on "a message is queued".
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/event.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <IOKit/IOKitLib.h>
#include <mach/message.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "fake.h"
#include "fake_internal.h"

struct IONotificationPort {
  mach_port_t port;
};

namespace melon::dkfake {
namespace {

struct Port {
  int efd = -1;  // readable while a message is queued
  std::deque<std::vector<uint8_t>> messages;
};

std::mutex g_mu;
std::map<mach_port_t, Port> g_ports;
std::map<int, std::vector<struct kevent>> g_kqueues;  // kqueue fd -> what it watches
mach_port_t g_next_port = 0x5000;
std::atomic<long> g_sent{0}, g_dropped{0};
std::atomic<int64_t> g_last_sent_ns{0};

// The message AsyncCompletion sends: a header, the status, the caller's reference, the arguments.
struct AsyncMessage {
  mach_msg_header_t header;
  int32_t status;
  uint64_t reference[8];
  uint32_t count;
  uint64_t args[kIOUserClientAsyncArgumentsCountMax];
};

}  // namespace

long async_messages_sent() { return g_sent; }
long async_messages_dropped() { return g_dropped; }
std::chrono::steady_clock::time_point last_async_message_time() {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(g_last_sent_ns.load()));
}

}  // namespace melon::dkfake

using namespace melon::dkfake;

void IOUserClient::AsyncCompletion(OSAction* action, IOReturn status, const IOUserClientAsyncArgumentsArray data,
                                   uint32_t count) {
  if (!action || !action->GetReference()) return;
  const auto* ref = static_cast<const AsyncReference*>(action->GetReference());
  AsyncMessage m{};
  m.header.msgh_size = sizeof m;
  m.header.msgh_remote_port = ref->wake_port;
  m.status = status;
  memcpy(m.reference, ref->words, sizeof m.reference);
  m.count = count < kIOUserClientAsyncArgumentsCountMax ? count : kIOUserClientAsyncArgumentsCountMax;
  if (data) memcpy(m.args, data, m.count * sizeof(uint64_t));
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_ports.find(ref->wake_port);
  if (it == g_ports.end() || it->second.messages.size() >= kMachPortQueueLimit) {
    g_dropped++;
    return;
  }
  const auto* b = reinterpret_cast<const uint8_t*>(&m);
  it->second.messages.emplace_back(b, b + sizeof m);
  uint64_t one = 1;
  (void)!write(it->second.efd, &one, sizeof one);
  g_sent++;
  g_last_sent_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

extern "C" {

IONotificationPortRef IONotificationPortCreate(mach_port_t) {
  int efd = eventfd(0, EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return nullptr;
  std::lock_guard<std::mutex> l(g_mu);
  mach_port_t name = g_next_port++;
  g_ports[name].efd = efd;
  return new IONotificationPort{name};
}

mach_port_t IONotificationPortGetMachPort(IONotificationPortRef notify) { return notify ? notify->port : 0; }

void IONotificationPortDestroy(IONotificationPortRef notify) {
  if (!notify) return;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_ports.find(notify->port);
    if (it != g_ports.end()) {
      close(it->second.efd);
      g_ports.erase(it);
    }
  }
  delete notify;
}

// Only receiving, with or without a timeout (the transport takes messages off with a zero one).
mach_msg_return_t mach_msg(mach_msg_header_t* msg, mach_msg_option_t option, mach_msg_size_t, mach_msg_size_t rcv_size,
                           mach_port_name_t rcv_name, mach_msg_timeout_t timeout, mach_port_name_t) {
  if (!(option & MACH_RCV_MSG)) return MACH_RCV_INVALID_NAME;
  for (;;) {
    int efd;
    {
      std::lock_guard<std::mutex> l(g_mu);
      auto it = g_ports.find(rcv_name);
      if (it == g_ports.end()) return MACH_RCV_INVALID_NAME;
      Port& p = it->second;
      if (!p.messages.empty()) {
        std::vector<uint8_t> m = std::move(p.messages.front());
        p.messages.pop_front();
        uint64_t v;
        (void)!read(p.efd, &v, sizeof v);
        // Without MACH_RCV_LARGE a message too large for the buffer is dequeued and destroyed.
        if (m.size() > rcv_size) return MACH_RCV_TOO_LARGE;
        memcpy(msg, m.data(), m.size());
        return MACH_MSG_SUCCESS;
      }
      efd = p.efd;
    }
    if (option & MACH_RCV_TIMEOUT) {
      pollfd pf{efd, POLLIN, 0};
      if (poll(&pf, 1, int(timeout)) <= 0) return MACH_RCV_TIMED_OUT;
    } else {
      pollfd pf{efd, POLLIN, 0};
      poll(&pf, 1, -1);
    }
  }
}

int kqueue(void) {
  int fd = eventfd(0, EFD_CLOEXEC);  // a descriptor to close; what it watches is the table's
  if (fd < 0) return -1;
  std::lock_guard<std::mutex> l(g_mu);
  g_kqueues[fd].clear();
  return fd;
}

int kevent(int kq, const struct kevent* changes, int nchanges, struct kevent* events, int nevents,
           const struct timespec* timeout) {
  std::vector<struct kevent> watch;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_kqueues.find(kq);
    if (it == g_kqueues.end()) {
      errno = EBADF;
      return -1;
    }
    for (int i = 0; i < nchanges; i++) {
      const struct kevent& c = changes[i];
      if (c.filter != EVFILT_READ && c.filter != EVFILT_MACHPORT) {
        errno = EINVAL;
        return -1;
      }
      auto& w = it->second;
      for (size_t j = 0; j < w.size();)
        if (w[j].ident == c.ident && w[j].filter == c.filter)
          w.erase(w.begin() + long(j));
        else
          j++;
      if (c.flags & EV_ADD) w.push_back(c);
    }
    watch = it->second;
  }
  if (nevents <= 0) return 0;
  std::vector<pollfd> fds;
  for (const struct kevent& w : watch) {
    int fd = int(w.ident);
    if (w.filter == EVFILT_MACHPORT) {
      std::lock_guard<std::mutex> l(g_mu);
      auto p = g_ports.find(mach_port_t(w.ident));
      fd = p == g_ports.end() ? -1 : p->second.efd;
    }
    fds.push_back(pollfd{fd, POLLIN, 0});
  }
  int ms = timeout ? int(timeout->tv_sec * 1000 + timeout->tv_nsec / 1000000) : -1;
  int n = poll(fds.data(), fds.size(), ms);
  if (n <= 0) return n;
  int got = 0;
  for (size_t i = 0; i < fds.size() && got < nevents; i++)
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
      events[got] = watch[i];
      events[got].data = 1;
      got++;
    }
  return got;
}

}  // extern "C"
