// UdpTransport's progress thread (udp_transport.h): it plans its wait under the engine lock
// (progress_timer.h: the engine's timers, a lease's end, the registries' tick, the counters'
// catch-up), waits on the sockets it is to watch, its wake pipe and timer fd (progress_fds.h),
// receives what is ready and runs the timers that are due. While the application holds a busy-poll
// lease or a thread waits on a completion channel it watches the pipe and the timer only. Lane 0's
// thread also ticks its addresses' registries (addr_registry.h, share_forward.h).
#include "providers/soft/udp_transport.h"

#include <errno.h>
#include <poll.h>

#include <algorithm>

#include "providers/soft/addr_registry.h"
#include "providers/soft/udp_socket.h"

namespace melon::soft {

UdpTransport::WaitPlan UdpTransport::plan_wait() {
  // While the application holds a busy-poll lease, watch only the wake pipe and the timers, and
  // look again when the lease would run out; once no poll came for busy_ns, take the sockets back.
  // Threads blocked in wait_readable() receive too; the same holds while there are any.
  // The lease is read under mu_, where the timer's deadline is planned: a waiter that leaves a
  // lease then calls timer_moved under mu_, so either this sees its lease or it sees the deadline
  // planned here (and wakes this thread if its lease ends sooner).
  std::lock_guard<std::mutex> g(mu_);
  WaitPlan w;
  const uint64_t lease_end = lease_.running_until(now_ns());
  w.spin_leased = lease_end != 0;
  watching_.store(true);  // before looking at waiters_: an arriving waiter sees one or the other
  w.leased = w.spin_leased || waiters_.load() > 0;
  if (w.leased) watching_.store(false);
  const ProgressTimer::Plan p = timer_.plan(engine_.next_deadline(), lease_end, next_share_tick_);
  if (p.publish) publish_totals_locked();
  w.deadline = p.deadline;
  return w;
}

void UdpTransport::receive_ready(const pollfd* fds, const std::vector<size_t>& which) {
  for (size_t s = 0; s < which.size(); ++s) {
    if (!(fds[s].revents & POLLIN)) continue;
    rx_hint_.store(true, std::memory_order_relaxed);
    for (int i = 0; i < 16; ++i) {  // drain a burst, but look at timers in between
      int n;
      {
        RxLock g(this);
        n = receive_batch(which[s]);
      }
      send_queued(false);
      if (n < rx_.capacity()) break;
    }
  }
}

void UdpTransport::run_due_timers() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (engine_.next_deadline() <= now_ns()) {
      engine_.tick();
      after_engine_call();
    }
  }
  send_queued(false);
}

void UdpTransport::run() {
  // fds: the sockets' receive fds (which[] maps them to sockets), then the wake pipe and timer fd.
  std::vector<pollfd> fds;
  std::vector<size_t> which;
  size_t nsock = 0;
  auto rewatch = [&] {
    fds.clear();
    {
      std::unique_lock<std::mutex> g;
      if (forwarding_) g = std::unique_lock<std::mutex>(rx_mu_);  // roles change under it (share_tick)
      watch_set(&fds, &which);
    }
    nsock = which.size();
    fds_.watch(&fds);
  };
  rewatch();
  progress_thread_ = this;
  // Lane 0 looks after its addresses' registries: dead members, unanswered probes (addr_registry.h).
  bool shares = false;
  for (const Socket& k : socks_) shares |= lane_.index == 0 && k.share.registry && k.fd >= 0;
  if (shares) next_share_tick_ = now_ns();
  while (running_) {
    if (next_share_tick_ && (share_tick_now_.exchange(false) || now_ns() >= next_share_tick_)) {
      if (share_tick()) rewatch();
      next_share_tick_ = now_ns() + AddressRegistry::kTickNs;
    }
    const WaitPlan w = plan_wait();
    // Replies the application held back (receive_batch) leave when it stopped polling.
    if (!w.spin_leased && held_.load(std::memory_order_relaxed)) flush_held();
    for (size_t s = 0; s < nsock; ++s) fds[s].revents = 0;
    pollfd* watch = w.leased ? &fds[nsock] : fds.data();  // leased: the wake pipe and the timer only
    const int r = timer_.wait(watch, w.leased ? fds.size() - nsock : fds.size(), w.deadline);
    if (r < 0 && errno != EINTR) break;
    fds_.drain(&fds[nsock]);
    receive_ready(fds.data(), which);
    run_due_timers();
  }
}

void UdpTransport::watch_set(std::vector<pollfd>* fds, std::vector<size_t>* which) const {
  which->clear();
  for (size_t i = 0; i < socks_.size(); ++i) {
    const Socket& k = socks_[i];
    if (k.fd < 0) continue;
    const int rfd = k.fwd ? k.fwd->rx_fd() : k.fd;
    if (rfd >= 0) {
      fds->push_back({rfd, POLLIN, 0});
      which->push_back(i);
    }
    if (k.fwd) {
      fds->push_back({k.fwd->wake_fd(), POLLIN, 0});
      which->push_back(i);
    }
  }
}

bool UdpTransport::share_tick() {
  bool changed = false;
  for (Socket& k : socks_) {
    if (!k.share.registry || k.fd < 0) continue;
    k.share.registry->tick();  // dead members reclaimed (a dead owner among them), probes
    if (!k.fwd) continue;
    RxLock g(this);
    if (!k.fwd->tick()) continue;
    // The port's socket is new: the offloads the receive buffers were sized for (rx_setup).
    if (rx_.gro()) enable_offloads(k.fwd->rx_fd());
    changed = true;
  }
  if (changed) roles_.fetch_add(1);
  return changed;
}

}  // namespace melon::soft
