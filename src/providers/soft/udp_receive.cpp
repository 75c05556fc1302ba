// UdpTransport's receive path (udp_transport.h): from a socket (or, in forward mode, the receive
// ring) through the receive batch (rx_batch.h) to this lane's engine or another lane's, with the
// replies a busy-polling application's or a waiter's own receive holds; and who receives: the
// progress thread, an application polling an empty CQ (poll_progress, busy_poll_lease.h) or a
// thread blocked on a completion channel (wait_readable). Locks as udp_transport.h says: rx_mu_ is
// held from recvmmsg to the end of processing, mu_ only around the engine calls.
#include "providers/soft/udp_transport.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

#include <algorithm>

#include "providers/soft/addr_registry.h"
#include "roce/ip_udp.h"

namespace melon::soft {

using roce::IpUdp;

void UdpTransport::rx_packet(const Socket& k, const sockaddr_storage& from, const uint8_t* pkt, size_t len,
                             uint16_t likely_id) {
  if (k.share.registry && is_probe(pkt, len)) {  // for the registry, after the engine lock (receive_batch)
    ProbeSeen p{size_t(&k - socks_.data()), {}};
    memcpy(p.bytes, pkt, kProbeLen);
    probes_.push_back(p);
    return;
  }
  RingMeta meta;
  if (!sockaddr_gid(from, meta.src, &meta.sport)) {
    stats_.rx_malformed++;
    return;
  }
  if (k.fwd && k.fwd->owner()) {  // another member's datagram goes to its ring (share_forward.h)
    meta.likely_id = likely_id;
    meta.v6 = k.v6;
    if (k.fwd->route(pkt, len, meta)) return;
  }
  rx_datagram(k, meta.src, meta.sport, pkt, len, likely_id);
}

void UdpTransport::rx_datagram(const Socket& k, const uint8_t src[16], uint16_t sport, const uint8_t* pkt, size_t len,
                               uint16_t likely_id) {
  const RxLocal at{k.v6, k.addr.gid, port_, lane_.lane_of_bucket, lane_.index};
  IpUdp ip;
  uint8_t lane;
  const RxTo to = check_datagram(at, src, sport, pkt, len, likely_id, stats_, &ip, &lane);
  if (to == RxTo::bad_icrc) return;
  lane_rx_packets_.store(lane_rx_packets_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (to == RxTo::unknown_qpn) return;
  if (to == RxTo::lane)
    foreign_.push_back({lane, ip, pkt, len});
  else
    engine_.receive(ip, pkt, len);
}

void UdpTransport::hand_over() {
  // Lane by lane, in arrival order within each (a QP's packets stay in order).
  lane_handed_over_.store(lane_handed_over_.load(std::memory_order_relaxed) + foreign_.size(),
                          std::memory_order_relaxed);
  stats_.rx_lane_handovers.fetch_add(foreign_.size(), std::memory_order_relaxed);
  std::vector<Foreign> mine;
  for (uint32_t l = 0; l < lane_.count; ++l) {
    mine.clear();
    for (const Foreign& f : foreign_)
      if (f.lane == l) mine.push_back(f);
    if (!mine.empty()) lane_.lanes[l]->receive_handed(mine.data(), mine.size());
  }
  foreign_.clear();
}

void UdpTransport::receive_handed(const Foreign* f, size_t n) {
  if (!running_) return;  // the device is closing: nothing to deliver to
  {
    std::lock_guard<std::mutex> g(mu_);
    batch_now_ = now_ns();
    engine_.begin_batch();
    for (size_t i = 0; i < n; ++i) engine_.receive(f[i].ip, f[i].pkt, f[i].len);
    engine_.end_batch();
    batch_now_ = 0;
    after_engine_call();
  }
  send_queued(false);
  arm_timer();
}

int UdpTransport::receive_batch(size_t sock, bool hold, int max_msgs) {
  // Called with rx_mu_ held: the receive buffers are shared with poll_progress(), and reading and
  // processing under that lock keeps packets in arrival order whoever reads them. The engine lock
  // is taken only after recvmmsg returns.
  Socket& k = socks_[sock];
  ShareForward* const fw = k.fwd.get();
  const int nmsg = max_msgs > 0 ? std::min(max_msgs, rx_.capacity()) : rx_.capacity();
  if (fw) {
    // A leased poll leaves the wake fd to the progress thread (a syscall per poll otherwise); it
    // reads the ring, which costs a load.
    if (max_msgs <= 0 && fw->drain_wake()) {  // an owner that left handed the port to us
      share_tick_now_.store(true);
      wake();
    }
    if (fw->owner()) fw->refresh_routes();
  }
  const int rfd = fw ? fw->rx_fd() : k.fd;
  const bool ring = fw && fw->ring().pending();
  int n = rfd >= 0 ? rx_.receive(rfd, nmsg) : 0;
  if (n <= 0 && !ring) {
    rx_hint_.store(false, std::memory_order_relaxed);
    return 0;
  }
  std::unique_lock<std::mutex> g(mu_);
  const bool stage_empty = !stage_->nmsgs;
  batch_now_ = now_ns();
  engine_.begin_batch();  // one ACK per QP for the whole batch (Engine::begin_batch)
  rx_.split(n, &k.rxq_drops, [&](const sockaddr_storage& from, const uint8_t* pkt, size_t len, uint16_t nth) {
    rx_packet(k, from, pkt, len, nth);
  });
  if (ring) {  // forward mode: what the owner copied into our ring, read in place
    const uint64_t bad = fw->ring().bad();
    n += int(fw->ring().pop(uint32_t(nmsg), [&](const uint8_t* d, size_t len, const RingMeta& m) {
      if (m.v6 != k.v6) {
        stats_.rx_malformed++;
        return;
      }
      rx_datagram(k, m.src, m.sport, d, len, m.likely_id);
    }));
    if (fw->ring().bad() != bad) stats_.rx_ring_bad.fetch_add(fw->ring().bad() - bad, std::memory_order_relaxed);
  }
  engine_.end_batch();
  const uint64_t dropped = engine_.dropped_packets();
  if (dropped != published_dropped_) {  // a locked add only when there is something to add
    stats_.rx_engine_dropped.fetch_add(dropped - published_dropped_, std::memory_order_relaxed);
    published_dropped_ = dropped;
  }
  engine_.tick();
  batch_now_ = 0;
  if (hold && defer_ && stage_->nslots <= kMaxHeldReplies) {
    // A busy-polling application's or a waiter's own receive: its replies (ACKs) wait in stage_ for
    // the application's next post, which sends them in the same sendmmsg (after_post), or its next
    // poll (flush_held), arming, or the end of its lease (run()).
    if (stage_->nslots) held_.store(true, std::memory_order_relaxed);
    if (stage_empty) replies_end_ = stage_->nmsgs;  // a post's requests may join them (join_held_reply)
    timer_moved(engine_.next_deadline());
  } else {
    // More than a ping-pong's replies: a stream whose ACKs open the window. Sending it is work for
    // the progress thread on the other core, not for the polling thread: the lease ends (poll_progress).
    if (hold) lease_.note_stream();
    after_engine_call();
  }
  g.unlock();
  if (fw && fw->owner()) fw->wake_routed();
  if (!foreign_.empty()) hand_over();
  for (const ProbeSeen& p : probes_) {
    const Socket& ps = socks_[p.sock];
    ps.share.registry->probe_arrived(ps.share.slot, p.bytes, kProbeLen);
  }
  probes_.clear();
  if (n < nmsg) rx_hint_.store(false, std::memory_order_relaxed);  // drained (for now)
  return n;
}

bool UdpTransport::poll_progress() {
  // Outside a busy-poll lease an empty CQ poll costs no syscall and no lock unless the progress
  // thread's ppoll has seen a socket readable (the hint) or poll_interval_ns_ has passed since this
  // path last looked. Inside one the progress thread does not receive, so every poll does.
  if (!running_) return false;
  const uint64_t now = now_ns();
  const BusyPollLease::Poll poll = lease_.on_poll(now);
  const bool lease = poll.leased;
  if (poll.taken) {  // the progress thread leaves the sockets to us
    stats_.busy_poll_leases++;
    wake();
  }
  if (!lease && !rx_hint_.load(std::memory_order_relaxed)) {
    if (now - last_poll_rx_.load(std::memory_order_relaxed) < poll_interval_ns_) return false;
    last_poll_rx_.store(now, std::memory_order_relaxed);
  }
  // A thread blocked on rx_mu_ goes first: a spinning poll that took the lock back at once every
  // time would keep the progress thread (and the timers it runs) waiting for ever.
  if (rx_blocked_.load(std::memory_order_relaxed) || !rx_mu_.try_lock()) return false;
  int got = 0;
  for (size_t s = 0; s < socks_.size(); ++s) {
    if (socks_[s].fd < 0) continue;
    // In a lease, a ping-pong's next arrival is one buffer (with GRO, the peer's SEND and ACK
    // together), so the vector starts at one entry: after the datagram, a longer recvmmsg makes one
    // more attempt that finds the socket empty. It doubles while polls fill it (a burst) and is
    // one again after a poll that did not.
    const int want = lease ? rx_lease_msgs_ : 0;
    const int n = receive_batch(s, lease, want);
    if (lease) rx_lease_msgs_ = n == want ? std::min(want * 2, rx_.capacity()) : 1;
    got += n;
  }
  rx_mu_.unlock();
  send_queued(false);
  arm_timer();
  // Streaming: receiving goes back to the progress thread, for a back-off (busy_poll_lease.h).
  if (lease && lease_.end_if_stream(now)) wake();
  return got > 0;
}

void UdpTransport::receive_arrived() {
  if (!running_) return;
  {
    RxLock g(this);  // after a receive in progress on another thread, which may hand packets on
    for (size_t s = 0; s < socks_.size(); ++s) {
      if (socks_[s].fd < 0) continue;
      // What is there now, not a stream that keeps coming: a few batches at most.
      for (int i = 0; i < 4 && receive_batch(s, false, 0) >= rx_.capacity(); ++i) {}
    }
  }
  send_queued(false);
  arm_timer();
}

void UdpTransport::app_waits() {
  // A waiter's lease that stays has its timer armed, so an application that now blocks elsewhere
  // (poll() on the channel fd) has its arrivals taken up at the latest busy_ns from here.
  if (lease_.on_arm(now_ns()) == BusyPollLease::Arm::ended) wake();
  if (held_.load(std::memory_order_relaxed)) flush_held();
}

int UdpTransport::wait_readable(int fd, bool (*event_taken)()) {
  if (!running_) return 0;
  waiters_.fetch_add(1);
  if (watching_.load()) wake();  // the progress thread leaves the sockets to waiters
  if (lease_.enabled()) {
    // The lease this wait leaves on its way out ends by the timer (below). Armed now, before the
    // wait, it need not be armed after the wake-up unless the wait outlasted it (timer_moved).
    {
      std::lock_guard<std::mutex> g(mu_);
      timer_moved(now_ns() + lease_.busy_ns());
    }
    arm_timer();
  }
  std::vector<pollfd> fds{{fd, POLLIN, 0}};
  std::vector<size_t> which;
  uint32_t roles = 0;
  int err = 0;
  for (;;) {
    if (fds.size() == 1 || roles != roles_.load()) {  // a take-over gave a socket a new receive fd
      std::unique_lock<std::mutex> g;
      if (forwarding_) g = std::unique_lock<std::mutex>(rx_mu_);  // roles change under it (share_tick)
      roles = roles_.load();
      fds.resize(1);
      watch_set(&fds, &which);
    }
    // No timeout: the progress thread keeps the timers, and wakes on its pipe when this one ends.
    // A signal handler ends the wait (EINTR): poll is never restarted, and whether the caller's
    // read would have been is ibv_get_cq_event's to decide (read_restarts_after_signal).
    if (poll(fds.data(), nfds_t(fds.size()), -1) < 0) {
      err = errno;
      break;
    }
    if (fds[0].revents) break;  // an event (or an error the read will report)
    // Replies (ACKs) are held while this thread looks whether its event came: if it did, they
    // leave after this thread has returned (from the progress thread it wakes below, or with the
    // application's next post); if not, now.
    {
      RxLock g(this);
      for (size_t s = 0; s < which.size(); ++s)
        if (fds[s + 1].revents & POLLIN) receive_batch(which[s], true);
    }
    // Our own receive signalled the channel (its event is ours, not in `fd`), or another thread
    // did meanwhile.
    if (event_taken() || poll(fds.data(), 1, 0) == 1) break;
    if (held_.load(std::memory_order_relaxed)) flush_held();
    send_queued(false);
    arm_timer();
  }
  // What the receive queued beyond the replies it may hold (READ responses, a window's refill)
  // leaves now: the lease this wait leaves may wake nobody before it ends.
  send_queued(false);
  // The last waiter out leaves a lease, as a poll does: the application's next poll, post or
  // ibv_req_notify_cq takes over from here (and sends the held replies); if none comes, the
  // progress thread's timer ends the lease after busy_ns. No wake-up on the way out.
  const uint64_t now = now_ns();
  lease_.on_wait_left(now, event_taken());  // its own event: see BusyPollLease::on_arm
  if (waiters_.fetch_sub(1) == 1) {
    if (!lease_.enabled()) {
      wake();
    } else {
      std::lock_guard<std::mutex> g(mu_);
      timer_moved(now + lease_.busy_ns());  // mostly armed already, on the way in
    }
  } else if (held_.load(std::memory_order_relaxed)) {
    flush_held();
  }
  arm_timer();  // also what this thread's receive asked for
  return err;
}

}  // namespace melon::soft
