// The Hub: a soft device's lanes (transports), their QPN buckets and registries, the engines' memory
// lookups and events (hub.h).
#include "providers/soft/hub.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "providers/soft/addr_registry.h"
#include "providers/soft/random.h"
#include "providers/soft/soft_config.h"
#include "roce/ip_udp.h"

namespace melon::soft {

using rc::kMaxQpWr;

namespace {
std::mutex g_hubs_mu;
std::map<SoftDevice*, Hub*>& hubs() {
  static auto* m = new std::map<SoftDevice*, Hub*>;  // never destroyed: progress threads may outlive statics
  return *m;
}
// The requester windows, in packets: per QP, and shared by all QPs of a lane
// (rc::EngineConfig::max_inflight_total). The engine's default per-QP window (128: 128 KiB at path
// MTU 1024) stalls a QP on every scheduling delay of a loaded host (docs/performance.md, "Soft
// path"); a larger one is only safe while the receive buffer holds it, or the window itself causes
// drops. UdpTransport asks for 8 MiB, which Linux caps at rmem_max and then doubles; a packet of path
// MTU `pmtu` takes about 2 * pmtu of it. Half the buffer is what all QPs of a lane may have in
// flight together; one QP alone may use a quarter of that (128..512). Without the shared budget,
// 16 or 32 QPs streaming at once overflowed the peer's buffer (docs/performance.md).
// MELON_SOFT_WINDOW=N (1..16384) sets the per-QP window; MELON_SOFT_SHARED_WINDOW=0 turns the shared
// one off (benchmarks comparing them in one run).
struct Windows {
  uint32_t per_qp, shared;
};
Windows requester_windows(unsigned pmtu) {
  uint64_t rcvbuf = 0;
  unsigned long long rmem_max = 0;
  if (FILE* f = fopen("/proc/sys/net/core/rmem_max", "r")) {
    if (fscanf(f, "%llu", &rmem_max) == 1) rcvbuf = 2 * std::min<uint64_t>(rmem_max, 8u << 20);
    fclose(f);
  }
  Windows w;
  const uint64_t half = rcvbuf / 2 / (2 * uint64_t(pmtu));
  w.per_qp = uint32_t(std::clamp<uint64_t>(half / 4, 128, 512));
  const SoftTunables t = soft_tunables();
  if (t.window >= 1 && t.window <= kMaxQpWr) w.per_qp = uint32_t(t.window);
  w.shared = uint32_t(std::clamp<uint64_t>(half, w.per_qp, kMaxQpWr));
  if (!t.shared_window) w.shared = 0;
  if (t.debug && rmem_max < (8u << 20))
    fprintf(stderr,
            "melondma soft: net.core.rmem_max = %llu caps the 8 MiB receive buffer asked for; requester window "
            "%u packets per QP, %u per lane, at path MTU %u (raise rmem_max for more)\n",
            rmem_max, w.per_qp, w.shared, pmtu);
  return w;
}

// How many lanes a device runs (hub.h): MELON_SOFT_LANES=N (1..kMaxLanes), else one per online
// CPU up to 4; 1 where the kernel cannot steer datagrams by QPN (said with MELON_SOFT_DEBUG=1). How
// its addresses are shared (MELON_SOFT_SHARE, soft_config.h): through the kernel's steering where it
// has it, else in forward mode (share_forward.h; one lane), or not at all ("off": one lane).
uint32_t lane_count(const char* device, ShareMode* mode) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  uint32_t n = uint32_t(std::clamp<long>(cpus, 1, 4));
  const SoftTunables t = soft_tunables();
  if (t.lanes >= 1 && t.lanes <= kMaxLanes) n = uint32_t(t.lanes);
  std::string why;
  const bool steering = t.share != "forward" && t.share != "off" && steering_available(&why);
  *mode = steering ? ShareMode::reuseport : t.share == "off" ? ShareMode::off : ShareMode::forward;
  if (!steering) {
    if (why.empty()) why = "MELON_SOFT_SHARE=" + t.share;
    if (t.debug)
      fprintf(stderr, "melondma soft: %s: one lane instead of %u, addresses %s: %s\n", device, n,
              *mode == ShareMode::off ? "not shared with other processes" : "shared in forward mode", why.c_str());
    n = 1;
  }
  return n;
}

// EngineConfig::random_qpn of a lane: a QPN in one of its buckets (Hub::LaneQpns).
uint32_t lane_random_qpn(void* arg) {
  const auto* q = static_cast<const Hub::LaneQpns*>(arg);
  return lane_qpn(random_u32(), q->buckets, q->n);  // QPNs nobody can predict (random.h), steered here
}

}  // namespace

Hub::Hub(SoftDevice* dev) : dev_(dev) {
  std::vector<LocalAddress> addrs;
  for (const IpAddr& a : dev->spec().addrs) {
    LocalAddress l{};
    a.to_gid(l.gid);
    l.scope_id = a.scope_id;
    addrs.push_back(l);
  }
  if (!dev->spec().addrs.empty()) dev->spec().addrs.front().to_gid(gid_);
  const uint32_t n = lane_count(dev->name(), &mode_);
  shared_ = mode_ != ShareMode::off;
  counters_.reset(new CounterFile(dev->name()));
  counters_->counters().lanes.store(n, std::memory_order_relaxed);
  rc::EngineConfig config;
  // IPv4: the larger MTU, the smaller windows.
  const Windows w = requester_windows(ib_mtu_for_interface(dev->spec().if_mtu, false));
  config.max_inflight_packets = w.per_qp;
  config.max_inflight_total = w.shared;
  config.random_qpn = lane_random_qpn;
  lane_ptrs_.assign(n, nullptr);
  load_.reset(new std::atomic<int>[n]);
  lane_qpns_.reset(new LaneQpns[n]);
  std::fill(std::begin(lane_of_bucket_), std::end(lane_of_bucket_), kNotOurs);
  for (uint32_t i = 0; i < n; ++i) {
    load_[i] = 0;
    config.random_qpn_arg = &lane_qpns_[i];  // filled by start(), before any QP
    LaneConfig lane{n, i, &counters_->counters(), lane_ptrs_.data(), shared_ ? lane_of_bucket_ : nullptr};
    lane_mem_.emplace_back(new LaneMemory(this));
    lanes_.emplace_back(new UdpTransport(addrs, *lane_mem_.back(), static_cast<rc::EventSink*>(this), config,
                                         roce::kRoceV2Port, dev->name(), lane));
    lane_ptrs_[i] = lanes_.back().get();
  }
}

Hub::~Hub() {
  for (auto& l : lanes_) l->halt();  // every thread first: a lane may hand packets to another until then
  for (auto& l : lanes_) l->stop();
  for (auto& l : lanes_) l->publish_totals();
  if (started_) UdpTransport::print_counters(dev_->name(), counters_->counters());
  lanes_.clear();
}

int Hub::start(std::string* why) {
  if (shared_) {
    // Each address's registry (addr_registry.h); QPN buckets for every lane, the same on each address.
    std::vector<AddressRegistry*> regs;
    for (const IpAddr& a : dev_->spec().addrs) {
      uint8_t gid[16];
      a.to_gid(gid);
      std::shared_ptr<AddressRegistry> r = AddressRegistry::open(gid, a.scope_id, roce::kRoceV2Port, why);
      if (!r) return EADDRINUSE;
      registries_.push_back(r);
      regs.push_back(r.get());
    }
    std::vector<std::vector<uint8_t>> buckets;
    std::vector<std::vector<int>> slots;
    if (!regs.empty()) {
      if (int e = AddressRegistry::claim(regs, uint32_t(lanes_.size()), &buckets, &slots, why)) return e;
      for (size_t i = 0; i < lanes_.size(); ++i) {
        for (uint8_t b : buckets[i]) lane_of_bucket_[b] = uint8_t(i);
        std::copy(buckets[i].begin(), buckets[i].end(), lane_qpns_[i].buckets);
        lane_qpns_[i].n = uint32_t(buckets[i].size());
        for (size_t r = 0; r < regs.size(); ++r)
          lanes_[i]->share(r, ShareJoin{regs[r], slots[r][i], mode_ == ShareMode::forward});
      }
      slots_ = slots;
    }
  }
  // Lane 0 first: an address it cannot bind the other lanes leave alone.
  for (auto& l : lanes_)
    if (int e = l->start(why)) return e;
  started_ = true;
  return 0;
}

int Hub::claim_gsi() {
  for (size_t r = 0; r < registries_.size() && r < slots_.size(); ++r)
    if (int e = registries_[r]->claim_gsi(slots_[r][0])) return e;
  // Bucket 0 is reserved on the address (no QPN but 1 is ever drawn from it), so its packets are
  // QP1's: lane 0 takes them. Read by the lanes' receive paths meanwhile, hence the atomic store.
  __atomic_store_n(&lane_of_bucket_[0], uint8_t(0), __ATOMIC_RELEASE);
  return 0;
}

Hub* Hub::acquire(SoftDevice* dev, int* err) {
  std::lock_guard<std::mutex> g(g_hubs_mu);
  Hub*& h = hubs()[dev];
  if (!h) {
    auto* n = new Hub(dev);
    std::string why;
    if (int e = n->start(&why)) {
      std::fprintf(stderr, "melondma soft: %s: cannot start the RoCEv2 transport: %s\n", dev->name(), why.c_str());
      delete n;
      hubs().erase(dev);
      *err = e;
      return nullptr;
    }
    h = n;
  }
  ++h->refs_;
  return h;
}

void Hub::release(Hub* hub) {
  std::lock_guard<std::mutex> g(g_hubs_mu);
  if (--hub->refs_ > 0) return;
  hubs().erase(hub->dev_);
  delete hub;
}

size_t Hub::choose_lane() {
  size_t best = 0;
  for (size_t i = 1; i < lanes_.size(); ++i)
    if (load_[i].load(std::memory_order_relaxed) < load_[best].load(std::memory_order_relaxed)) best = i;
  return best;
}

bool Hub::poll_progress(uint32_t mask) {
  bool got = false;
  each_lane(mask, [&](UdpTransport& l) { got |= l.poll_progress(); });
  return got;
}

void Hub::drain() {
  each_lane(~0u, [](UdpTransport& l) { l.drain(); });
}

void Hub::add_qp(uint32_t qpn, ibv_qp* qp) {
  std::lock_guard<std::mutex> g(map_mu_);
  qps_[qpn] = qp;
}
void Hub::remove_qp(uint32_t qpn) {
  std::lock_guard<std::mutex> g(map_mu_);
  qps_.erase(qpn);
}
void Hub::add_srq(uint32_t srqn, ibv_srq* srq) {
  std::lock_guard<std::mutex> g(map_mu_);
  srqs_[srqn] = srq;
}
void Hub::remove_srq(uint32_t srqn) {
  std::lock_guard<std::mutex> g(map_mu_);
  srqs_.erase(srqn);
}

rc::MemStatus LaneMemory::map(rc::KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len, uint32_t access,
                              rc::Span* first) {
  return hub_->map_key(cache_, kind, pd, key, addr, len, access, first);
}

rc::MemStatus Hub::map_key(MrTable::Cache& cache, rc::KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr,
                           uint32_t len, uint32_t access, rc::Span* first) {
  void* host = nullptr;
  // lkey and rkey live in separate key spaces (soft_mr.cpp).
  KeyKind k = kind == rc::KeyKind::local ? KeyKind::local : KeyKind::remote;
  switch (dev_->mrs().resolve_cached(cache, k, key, pd, addr, len, access, &host)) {
    case MrStatus::Ok: *first = {static_cast<uint8_t*>(host), len}; return rc::MemStatus::ok;
    case MrStatus::BadKey: return rc::MemStatus::bad_key;
    case MrStatus::WrongPd: return rc::MemStatus::wrong_pd;
    case MrStatus::OutOfRange: return rc::MemStatus::out_of_range;
    case MrStatus::NoAccess: return rc::MemStatus::no_access;
  }
  return rc::MemStatus::bad_key;
}

void Hub::qp_event(uint32_t qpn, rc::AsyncEvent ev) {
  if (ev == rc::AsyncEvent::cq_err) return;  // the CQ reports its own overrun
  std::lock_guard<std::mutex> g(map_mu_);
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return;
  ibv_async_event e{};
  e.element.qp = it->second;
  e.event_type = ibv_event_type(ev);
  verbs::post_async_event(it->second->context, e);
}

void Hub::srq_event(uint32_t srqn, rc::AsyncEvent ev) {
  std::lock_guard<std::mutex> g(map_mu_);
  auto it = srqs_.find(srqn);
  if (it == srqs_.end()) return;
  ibv_async_event e{};
  e.element.srq = it->second;
  e.event_type = ibv_event_type(ev);
  verbs::post_async_event(it->second->context, e);
}

bool CqForward::push(const rc::Wc& w) {
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = ibv_wc_status(w.status);
  wc.opcode = ibv_wc_opcode(w.opcode);
  wc.vendor_err = w.vendor_err;
  wc.byte_len = w.byte_len;
  if (w.wc_flags & rc::kWcWithInv)
    wc.invalidated_rkey = w.imm;
  else if (w.wc_flags & rc::kWcWithImm)
    wc.imm_data = htonl(w.imm);
  wc.qp_num = w.qp_num;
  wc.src_qp = w.src_qp;
  wc.sl = w.sl;
  wc.wc_flags = w.wc_flags;
  wc.pkey_index = w.pkey_index;
  return cq->push(wc, w.solicited);
}

}  // namespace melon::soft
