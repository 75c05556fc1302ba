#include "providers/soft/udp_transport.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>

#include "providers/soft/addr_registry.h"
#include "providers/soft/msg_batch.h"
#include "providers/soft/soft_config.h"
#include "providers/soft/udp_socket.h"
#include "roce/ip_udp.h"

namespace melon::soft {

using namespace roce;

thread_local const UdpTransport* UdpTransport::progress_thread_ = nullptr;

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
  if (progress_thread_ != this) timer_.moved(d);
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
  sendq_->send(wait, [this](TxBatch& b) {
    send_batch(
        b, [this](size_t sock) { return socks_[sock].fd; }, gso_.get(), stats_);
  });
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

}  // namespace melon::soft
