#include "providers/soft/udp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/udp.h>
#include <poll.h>
#if defined(__linux__)
#include <sys/timerfd.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "providers/soft/addr_registry.h"
#include "providers/soft/msg_batch.h"
#include "providers/soft/soft_config.h"
#include "providers/soft/udp_socket.h"
#include "rc/wire.h"
#include "roce/frame.h"
#include "roce/icrc.h"
#include "roce/icrc_udp.h"
#include "roce/ip_udp.h"

namespace melon::soft {

using namespace roce;

namespace {

thread_local const UdpTransport* tls_progress = nullptr;  // the transport whose progress thread this is

}  // namespace

UdpTransport::UdpTransport(const std::vector<LocalAddress>& addrs, rc::HostMemory& memory, rc::EventSink* events,
                           const rc::EngineConfig& config, uint16_t port, const char* counter_name,
                           const LaneConfig& lane)
    : port_(port),
      engine_(rc::Host{memory, *this, *this, events}, config),
      name_(counter_name ? counter_name : "?"),
      lane_(lane),
      counters_(lane.stats ? nullptr : counter_name),
      stats_(lane.stats ? *lane.stats : counters_.counters()) {
  for (const LocalAddress& a : addrs) {
    socks_.emplace_back();
    socks_.back().addr = a;
    socks_.back().v6 = !gid_is_v4_mapped(a.gid);
    socks_.back().src_port = port;
  }
  window_ = std::max<uint32_t>(config.max_inflight_packets, 64);
  const SoftTunables t = soft_tunables();
  poll_interval_ns_ = t.poll_ns;
  lease_.set_busy_ns(t.busy_ns);
  defer_ = t.defer;
  stage_.reset(new TxBatch(window_));
  sendq_.reset(new SendQueue(window_));
  gso_.reset(new std::atomic<bool>[socks_.size()]);
  for (size_t i = 0; i < socks_.size(); ++i) gso_[i] = false;
}

UdpTransport::~UdpTransport() { stop(); }

uint64_t UdpTransport::now_ns() { return monotonic_ns(); }

size_t UdpTransport::bound() const {
  size_t n = 0;
  for (const Socket& k : socks_) n += k.fd >= 0;
  return n;
}

int UdpTransport::start(std::string* why) {
  int last_err = EADDRNOTAVAIL;
  std::string last_why = "no address";
  std::vector<std::string> unbound;
  for (Socket& k : socks_) {
    // The other lanes join lane 0's groups only: an address lane 0 could not claim and bind may
    // belong to another process's group.
    if (lane_.index > 0 && lane_.lanes[0]->socks_[size_t(&k - socks_.data())].fd < 0) continue;
    if (const char* no = gid_family_unusable(k.v6)) {  // refused at use too, with the reason (soft_device.cpp)
      last_err = EAFNOSUPPORT;
      last_why = no;
      continue;
    }
    std::string w;
    bool bind_failed = false;
    int fd;
    if (k.share.registry && k.share.forward) {  // the port's owner, or a member sending from a port of its own
      k.fwd.reset(new ShareForward(k.share.registry, k.share.slot, k.addr.gid, k.addr.scope_id, port_, stats_));
      fd = k.fwd->open(&w, &bind_failed);
      if (fd >= 0)
        k.src_port = k.fwd->send_port();
      else
        k.fwd.reset();
    } else {
      fd =
          open_roce_socket(k.addr.gid, k.addr.scope_id, port_, &w, &bind_failed, k.share.registry ? &k.share : nullptr);
    }
    if (fd >= 0) {
      k.fd = fd;
      k.offloads = enable_offloads(fd);
      gso_[size_t(&k - socks_.data())] = k.offloads.gso;
#if defined(__linux__)
      if (!k.offloads.gso || !k.offloads.gro) stats_.offload_fallbacks++;
#endif
      continue;
    }
    last_err = errno;
    last_why = w;
    if (!bind_failed) {  // the host cannot carry RoCEv2 right: no half-working device
      stop();
      if (why) *why = w;
      return last_err;
    }
    unbound.push_back(w);
  }
  if (!bound()) {
    if (why) *why = last_why;
    return last_err;
  }
  // Not silent: packets to these GIDs will not arrive.
  for (const std::string& w : unbound)
    std::fprintf(stderr, "melondma soft: %s; packets to this address will not be received\n", w.c_str());
  if (const int e = fds_.open(why)) {
    stop();
    return e;
  }
  bool gro = false;
  for (const Socket& k : socks_) gro |= k.fd >= 0 && k.offloads.gro;
  rx_.setup(gro, window_);
  for (const Socket& k : socks_) forwarding_ |= k.fwd != nullptr;
  running_ = true;
  thread_ = std::thread([this] { run(); });
  return 0;
}

bool UdpTransport::halt() {
  if (running_.exchange(false)) {
    wake();
    thread_.join();
    halted_ = true;
  }
  return halted_;
}

void UdpTransport::stop() {
  const bool was_running = halt();
  halted_ = false;
  drain();
  if (was_running) publish_totals();
  // MELON_SOFT_STATS=1: the final counters on stderr (the counter file goes with the process), so a
  // benchmark can show the losses and retries of each run. Lanes share the device's counters: the
  // Hub prints them once.
  if (was_running && !lane_.stats) print_counters(name_.c_str(), stats_);
  for (Socket& k : socks_) {
    if (k.fwd) {  // an owner hands the port over; its sockets and ring go, then its claims
      k.fwd->close();
      k.fwd.reset();
      k.share.registry->leave(k.share.slot, -1);
    } else if (k.share.registry)
      k.share.registry->leave(k.share.slot, k.fd);  // the group rebuilt without it, then closed
    else if (k.fd >= 0)
      close(k.fd);
    k.fd = -1;
    k.share = {};
  }
  fds_.close();
}

size_t UdpTransport::socket_for(const uint8_t sgid[16]) const {
  size_t first = socks_.size();
  for (size_t i = 0; i < socks_.size(); ++i) {
    if (socks_[i].fd < 0) continue;
    if (!memcmp(socks_[i].addr.gid, sgid, 16)) return i;
    if (first == socks_.size()) first = i;
  }
  return first;
}

void UdpTransport::timer_moved(uint64_t d) {
  if (tls_progress != this) timer_.moved(d);
}

void UdpTransport::handoff() {
  if (!stage_->nmsgs) return;
  if (replies_end_ == 1 && stage_->join_held_reply(gso_.get(), &join_delta_))
    stats_.tx_replies_joined.fetch_add(1, std::memory_order_relaxed);
  replies_end_ = 0;
  held_.store(false, std::memory_order_relaxed);
  ++handoffs_;
  sendq_->push(&stage_);
}

void UdpTransport::transmit(const rc::TxPacket& p) {
  const size_t sock = socket_for(p.av->sgid);
  if (sock == socks_.size()) {
    stats_.tx_errors++;
    return;
  }
  if (stage_->full(p.niov + 2)) handoff();
  ++staged_;
  const Socket& k = socks_[sock];
  stage_->add(p, TxSource{sock, k.addr.gid, k.v6, k.src_port, gso_.get()});
}

void UdpTransport::drain() {
  {
    std::lock_guard<std::mutex> g(mu_);
    handoff();
  }
  send_queued(true);
}

void UdpTransport::send_queued(bool wait) {
  sendq_->send(wait, [this](TxBatch& b) { send_batch(b); });
}

void UdpTransport::send_batch(TxBatch& b) {
  b.prepare_send();
  // Consecutive messages from the same socket go out in one sendmmsg.
  int off = 0;
  while (off < b.nmsgs) {
    const size_t sock = b.msgs[off].sock;
    int end = off + 1;
    while (end < b.nmsgs && b.msgs[end].sock == sock) ++end;
    const int fd = socks_[sock].fd;
#if defined(__linux__)
    int r = sendmmsg(fd, b.mmsg.data() + off, unsigned(end - off), 0);
#else  // sendmsg_x with MELON_SOFT_DARWIN_BATCH, else one sendmsg per message (msg_batch.h)
    int r = send_msg_x(system_msg_x(), fd, b.mmsg.data() + off, unsigned(end - off));
#endif
    stats_.tx_calls.fetch_add(1, std::memory_order_relaxed);
    if (r < 0) {
      if (errno == EINTR) continue;
      const TxMsg& m = b.msgs[off];
      // A kernel that refuses this GSO send (EIO: no checksum offload on the route; EINVAL: a limit
      // we do not know of) gets one datagram per packet from now on; these packets are lost and
      // the transport retries them. Anything else (ENOBUFS, EAGAIN, no route) loses the packets.
      if (m.npkts > 1 && (errno == EIO || errno == EINVAL) && gso_[sock].exchange(false)) stats_.offload_fallbacks++;
      stats_.tx_errors += uint64_t(m.npkts);
      ++off;
      continue;
    }
    for (int j = off; j < off + r; ++j) {
      stats_.tx_packets += uint64_t(b.msgs[j].npkts);
      if (b.msgs[j].npkts > 1) stats_.tx_gso_sends++;
    }
    off += r;
  }
}

void UdpTransport::print_counters(const char* name, const TransportStats& stats) {
  if (!soft_tunables().stats) return;
  std::string line = std::string("melondma soft: ") + name + " counters:";
#define MELON_SOFT_COUNTER_TEXT(name, text) line += " " #name " " + std::to_string(stats.name.load());
  MELON_SOFT_COUNTERS(MELON_SOFT_COUNTER_TEXT)
#undef MELON_SOFT_COUNTER_TEXT
  fprintf(stderr, "%s\n", line.c_str());
}

void UdpTransport::publish_totals() {
  std::lock_guard<std::mutex> g(mu_);
  publish_totals_locked();
}

void UdpTransport::publish_totals_locked() {
  // Added as differences, not stored: several lanes add into one device's counters. The engine's
  // totals only grow (destroyed QPs included).
  const rc::QpCounters t = engine_.totals();
  stats_.retransmits.fetch_add(t.retransmits - published_.retransmits, std::memory_order_relaxed);
  stats_.timeouts.fetch_add(t.timeouts - published_.timeouts, std::memory_order_relaxed);
  stats_.acks_coalesced.fetch_add(t.acks_coalesced - published_.acks_coalesced, std::memory_order_relaxed);
  published_ = t;
  const uint64_t d = engine_.dropped_packets();
  stats_.rx_engine_dropped.fetch_add(d - published_dropped_, std::memory_order_relaxed);
  published_dropped_ = d;
}

void UdpTransport::after_engine_call() {
  handoff();
  timer_moved(engine_.next_deadline());
}

bool UdpTransport::after_post(bool backed, uint64_t staged_before, uint64_t handoffs_before) {
  // Hold when nothing was handed off meanwhile (a full batch must go) and either the post staged
  // nothing (a receive WQE, a full window: what is held stays held) or it went to a QP whose coming
  // ACK or timer sends it, with fewer than a GSO run held. Held packets wait at most for the next
  // arrival or timer the progress thread handles (after_engine_call), or, in a lease, for the
  // application's next poll or the lease's end (receive_batch, run()).
  const uint64_t added = staged_ - staged_before;
  if (handoffs_ == handoffs_before && stage_->nslots < kMaxHeld && (!added || backed)) {
    if (added) {
      stats_.tx_deferred.fetch_add(added, std::memory_order_relaxed);
      held_.store(true, std::memory_order_relaxed);
    }
    timer_moved(engine_.next_deadline());
    return false;
  }
  after_engine_call();
  return true;
}

void UdpTransport::flush_held() {
  if (!held_.load(std::memory_order_relaxed)) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    handoff();
  }
  send_queued(false);
}

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
    if (poll(fds.data(), nfds_t(fds.size()), -1) < 0) {
      if (errno == EINTR) continue;
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
  tls_progress = this;
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
