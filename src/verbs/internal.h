// Library-internal declarations shared by the src/verbs translation units.
#pragma once

#include "abi/gen/ibverbs_prototypes.h"  // rdma-core v44's prototype of every export: a mismatch does not compile
#include "verbs/provider.h"

#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <mutex>
#include <new>
#include <type_traits>

#ifdef MSG_NOSIGNAL
#define MSG_NOSIGNAL_COMPAT MSG_NOSIGNAL
#else
#define MSG_NOSIGNAL_COMPAT 0 /* Darwin: the socketpair never loses its reader first */
#endif

// The exported symbols are C; within the library the macros of <infiniband/verbs.h> that shadow
// them must be gone (verbs.h defines ibv_query_port and ibv_reg_mr* as macros).
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define MELON_EXPORT extern "C" __attribute__((visibility("default")))

namespace melon::verbs {

// A pollable queue: the read end of a socketpair holds one byte per queued item. Apps may poll()
// the fd, set it O_NONBLOCK, or block in read(); all three behave as with rdma-core.
template <class T>
struct EventFdQueue {
  int read_fd = -1;
  int write_fd = -1;
  std::mutex mu;
  std::deque<T> items;

  int open();  // errno value
  void close();
  void push(const T& item);
  // Blocks (unless read_fd is non-blocking) until an item is available. 0 or an errno value: EINTR
  // when a signal handler without SA_RESTART interrupts the read, as with rdma-core's fd.
  int pop(T* out);
  // Remove queued items for which pred is true, with their bytes. Returns how many.
  template <class Pred>
  size_t purge(Pred pred);
};

// ---- pollable event queues ------------------------------------------------------------------------

template <class T>
inline int EventFdQueue<T>::open() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return errno;
  for (int fd : sv) fcntl(fd, F_SETFD, FD_CLOEXEC);
  read_fd = sv[0];
  write_fd = sv[1];
  return 0;
}

template <class T>
inline void EventFdQueue<T>::close() {
  if (read_fd >= 0) ::close(read_fd);
  if (write_fd >= 0) ::close(write_fd);
  read_fd = write_fd = -1;
}

template <class T>
inline void EventFdQueue<T>::push(const T& item) {
  {
    std::lock_guard<std::mutex> lock(mu);
    try {
      items.push_back(item);
    } catch (const std::bad_alloc&) {
      return;  // out of memory: the event is lost rather than thrown into the caller
    }
  }
  // One byte per item, sent after the lock is released: the reader this wakes takes the same lock
  // at once, and must not find it held by a pusher the wake-up preempted. pop() reads a byte before
  // it looks for the item, so the item is always there first. A full socket buffer only delays
  // wake-ups, items stay queued.
  char b = 1;
  (void)!send(write_fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL_COMPAT);
}

template <class T>
inline int EventFdQueue<T>::pop(T* out) {
  for (;;) {
    char b;
    ssize_t n = ::read(read_fd, &b, 1);  // the kernel restarts it after an SA_RESTART handler
    if (n < 0) return errno;
    if (n == 0) return EIO;
    std::lock_guard<std::mutex> lock(mu);
    if (items.empty()) continue;  // byte of a purged item
    *out = items.front();
    items.pop_front();
    return 0;
  }
}

template <class T>
template <class Pred>
inline size_t EventFdQueue<T>::purge(Pred pred) {
  std::lock_guard<std::mutex> lock(mu);
  size_t before = items.size();
  items.erase(std::remove_if(items.begin(), items.end(), pred), items.end());
  size_t removed = before - items.size();
  for (size_t i = 0; i < removed; i++) {
    char b;
    if (recv(read_fd, &b, 1, MSG_DONTWAIT) != 1) break;  // a reader consumed it first; pop() skips the mismatch
  }
  return removed;
}

struct AsyncQueue : EventFdQueue<ibv_async_event> {};

struct CompChannel {
  ibv_comp_channel ibv;
  EventFdQueue<ibv_cq*>* queue;
  static CompChannel* from(ibv_comp_channel* ch) { return reinterpret_cast<CompChannel*>(ch); }
};

Device* device_of(ibv_device* dev);  // nullptr if not one of ours

// Out of memory must not escape through the C ABI as an exception: creators report ENOMEM
// (errno, NULL), int verbs return it.
template <class F>
auto no_throw(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    if constexpr (std::is_pointer_v<decltype(f())>) {
      errno = ENOMEM;
      return nullptr;
    } else {
      return ENOMEM;
    }
  }
}

// Purge events of a dying object from the context's async queue, and wait until every delivered
// event for it has been acknowledged (rdma-core's destroy contract).
void retire_async_events(ibv_context* ctx, const void* element);

// The command descriptor and context sharing (import.cpp). open_command_fd gives a fresh context
// its cmd_fd (an errno value on failure); release_context closes it on ibv_close_device and says
// whether the provider context must now be closed (no other context shares it).
int open_command_fd(ContextBase* base);
bool release_context(ContextBase* base);

// Synthesised sysfs (ibv_read_sysfs_file on the device's ibdev_path).
extern const char kSysfsRoot[];
int synth_sysfs_file(const char* path, char* buf, size_t size);  // bytes, or -1 with errno

}  // namespace melon::verbs
