// QPs of the soft provider: verbs calls translated to the transport engine, under its lock.
#include "providers/soft/soft_qp.h"
#include "providers/soft/random.h"
#include "providers/soft/addr_registry.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "roce/ip_udp.h"

namespace melon::soft {

static_assert(sizeof(ibv_sge) == sizeof(rc::Sge) && offsetof(ibv_sge, lkey) == offsetof(rc::Sge, lkey),
              "ibv_sge and rc::Sge share a layout, so scatter/gather lists pass through uncopied");
static_assert(int(IBV_WR_SEND_WITH_INV) == int(rc::WrOpcode::send_with_inv) &&
                  int(IBV_WC_RECV_RDMA_WITH_IMM) == int(rc::WcOpcode::recv_rdma_with_imm) &&
                  int(IBV_WC_RNR_RETRY_EXC_ERR) == int(rc::WcStatus::rnr_retry_exc_err) &&
                  int(IBV_QP_DEST_QPN) == int(rc::kAttrDestQpn) &&
                  int(IBV_ACCESS_REMOTE_ATOMIC) == int(rc::kRemoteAtomic),
              "the engine uses verbs' numeric values");

using rc::kMaxQpWr;
using rc::kMaxRdAtomic;
using rc::kMaxSge;

// ---- hub ----------------------------------------------------------------------------------------

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
  if (const char* env = getenv("MELON_SOFT_WINDOW")) {
    unsigned long v = strtoul(env, nullptr, 10);
    if (v >= 1 && v <= kMaxQpWr) w.per_qp = uint32_t(v);
  }
  w.shared = uint32_t(std::clamp<uint64_t>(half, w.per_qp, kMaxQpWr));
  if (const char* env = getenv("MELON_SOFT_SHARED_WINDOW"); env && !strcmp(env, "0")) w.shared = 0;
  if (getenv("MELON_SOFT_DEBUG") && rmem_max < (8u << 20))
    fprintf(stderr,
            "melondma soft: net.core.rmem_max = %llu caps the 8 MiB receive buffer asked for; requester window "
            "%u packets per QP, %u per lane, at path MTU %u (raise rmem_max for more)\n",
            rmem_max, w.per_qp, w.shared, pmtu);
  return w;
}

// How many lanes a device runs (soft_qp.h): MELON_SOFT_LANES=N (1..kMaxLanes), else one per online
// CPU up to 4; 1 where the kernel cannot steer datagrams by QPN (said with MELON_SOFT_DEBUG=1), and
// then the device's addresses are its own (*shared false).
uint32_t lane_count(const char* device, bool* shared) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  uint32_t n = uint32_t(std::clamp<long>(cpus, 1, 4));
  if (const char* env = getenv("MELON_SOFT_LANES")) {
    unsigned long v = strtoul(env, nullptr, 10);
    if (v >= 1 && v <= kMaxLanes) n = uint32_t(v);
  }
  std::string why;
  *shared = steering_available(&why);
  if (!*shared) {
    if (getenv("MELON_SOFT_DEBUG"))
      fprintf(stderr, "melondma soft: %s: one lane instead of %u, addresses not shared with other processes: %s\n",
              device, n, why.c_str());
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
  const uint32_t n = lane_count(dev->name(), &shared_);
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
        for (size_t r = 0; r < regs.size(); ++r) lanes_[i]->share(r, ShareJoin{regs[r], slots[r][i]});
      }
    }
  }
  // Lane 0 first: an address it cannot bind the other lanes leave alone.
  for (auto& l : lanes_)
    if (int e = l->start(why)) return e;
  started_ = true;
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

// ---- context ------------------------------------------------------------------------------------

Hub* SoftContext::hub(int* err) {
  std::lock_guard<std::mutex> g(hub_mu_);
  if (!hub_) hub_.store(Hub::acquire(dev_, err), std::memory_order_release);
  return hub_;
}

void SoftContext::cq_uses_lane(SoftCq* cq, size_t lane) {
  cq->lanes.fetch_or(1u << lane, std::memory_order_relaxed);
  if (ibv_comp_channel* ch = cq->ibv.channel) {
    std::lock_guard<std::mutex> g(hub_mu_);
    channel_lanes_[ch->fd] |= 1u << lane;
  }
}

ibv_qp* SoftContext::create_qp(ibv_qp_init_attr_ex* attr) {
  auto fail = [](int e) -> ibv_qp* {
    errno = e;
    return nullptr;
  };
  // Creation flags and a TSO header size are accepted when they ask for nothing (rdma-core's
  // own tests set the mask with zero values); any flag or a TSO header is not supported (the
  // device reports tso_caps.max_tso 0), nor are XRC domains, RSS or indirection tables.
  const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                         IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
  if (attr->comp_mask & ~known) return fail(EOPNOTSUPP);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) return fail(EOPNOTSUPP);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) && attr->max_tso_header) return fail(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !owns(attr->pd)) return fail(EINVAL);
  rc::QpType type;
  const bool reliable_uc =
      attr->qp_type == IBV_QPT_UC && verbs::reliable_uc_wanted(device()->name(), device()->spec().uc_reliable);
  switch (attr->qp_type) {
    case IBV_QPT_RC: type = rc::QpType::rc; break;
    case IBV_QPT_UC: type = reliable_uc ? rc::QpType::rc : rc::QpType::uc; break;
    case IBV_QPT_UD: type = rc::QpType::ud; break;
    default: return fail(EOPNOTSUPP);  // RAW_PACKET, XRC, DRIVER
  }
  if (!owns(attr->send_cq) || !owns(attr->recv_cq)) return fail(EINVAL);
  if (attr->srq && attr->srq->context != &vctx.context) return fail(EINVAL);
  ibv_qp_cap& cap = attr->cap;
  if (cap.max_send_wr > kMaxQpWr || cap.max_send_sge > kMaxSge || cap.max_inline_data > rc::kMaxInlineData ||
      (!attr->srq && (cap.max_recv_wr > kMaxQpWr || cap.max_recv_sge > kMaxSge)))
    return fail(EINVAL);
  int err = 0;
  Hub* h = hub(&err);
  if (!h) return fail(err);

  // The SRQ's lane, or the least busy one.
  const size_t lane = attr->srq ? SoftSrq::from(attr->srq)->lane : h->choose_lane();
  auto* qp = new SoftQp();
  qp->ctx = this;
  qp->hub = h;
  qp->lane = &h->lane(lane);
  qp->lane_index = lane;
  qp->scq.cq = SoftCq::from(attr->send_cq);
  qp->rcq.cq = SoftCq::from(attr->recv_cq);
  rc::QpInit init;
  init.type = type;
  init.pd = attr->pd->handle;
  init.send_cq = &qp->scq;
  init.recv_cq = &qp->rcq;
  init.srq = attr->srq ? SoftSrq::from(attr->srq)->engine : nullptr;
  init.sq_sig_all = attr->sq_sig_all != 0;
  init.uc_verbs = reliable_uc;
  // Grant at least one of everything, and inline up to what was asked (rounded to 64 bytes).
  cap.max_send_wr = cap.max_send_wr ? cap.max_send_wr : 1;
  cap.max_send_sge = cap.max_send_sge ? cap.max_send_sge : 1;
  cap.max_inline_data = (cap.max_inline_data + 63) / 64 * 64;
  if (attr->srq) {
    cap.max_recv_wr = cap.max_recv_sge = 0;
  } else {
    cap.max_recv_wr = cap.max_recv_wr ? cap.max_recv_wr : 1;
    cap.max_recv_sge = cap.max_recv_sge ? cap.max_recv_sge : 1;
  }
  init.cap.max_send_wr = cap.max_send_wr;
  init.cap.max_recv_wr = cap.max_recv_wr;
  init.cap.max_send_sge = cap.max_send_sge;
  init.cap.max_recv_sge = cap.max_recv_sge;
  init.cap.max_inline_data = cap.max_inline_data;
  err = qp->lane->with_engine([&](rc::Engine& e) { return e.create_qp(init, &qp->qpn); });
  if (err) {
    delete qp;
    return fail(err);
  }
  verbs::init_qp_fields(qp, &vctx.context, attr);
  qp->reliable_uc = reliable_uc;
  ibv_qp& q = qp->ibv.qp_base;
  q.qp_num = qp->qpn;
  q.handle = qp->qpn;
  if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    if (int e = verbs::init_qp_ex_ops(qp, attr->send_ops_flags)) {
      qp->lane->with_engine([&](rc::Engine& en) { return en.destroy_qp(qp->qpn); });
      delete qp;
      return fail(e);
    }
  }
  verbs::record_qp_init(qp, attr, cap);
  h->add_qp(qp->qpn, &q);
  h->use(lane);
  // Polling these CQs receives on this lane (soft_device.cpp, poll_cq).
  cq_uses_lane(qp->scq.cq, lane);
  cq_uses_lane(qp->rcq.cq, lane);
  SoftPd::users(attr->pd)++;
  qp->scq.cq->users++;
  qp->rcq.cq->users++;
  return &q;
}

int SoftContext::modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  if (ibqp->context != &vctx.context) return EINVAL;
  SoftQp* qp = SoftQp::from(ibqp);
  ibv_qp_attr filled;
  const ibv_qp_attr* a = attr;
  if (qp->reliable_uc) {
    filled = *attr;
    mask = verbs::reliable_uc_complete(ibqp->state, &filled, mask);
    a = &filled;
  }
  // No alternate paths (APM) or rate limits on a soft device.
  if (mask & (IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_RATE_LIMIT)) return EINVAL;
  if ((mask & IBV_QP_PORT) && a->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)))
    return EINVAL;
  rc::QpAttr r;
  r.qp_state = rc::QpState(a->qp_state);
  r.cur_qp_state = rc::QpState(a->cur_qp_state);
  r.path_mtu = uint8_t(a->path_mtu);
  r.qkey = a->qkey;
  r.rq_psn = a->rq_psn;
  r.sq_psn = a->sq_psn;
  r.dest_qp_num = a->dest_qp_num;
  r.qp_access_flags = a->qp_access_flags;
  r.pkey_index = a->pkey_index;
  r.max_rd_atomic = a->max_rd_atomic;
  r.max_dest_rd_atomic = a->max_dest_rd_atomic;
  r.min_rnr_timer = a->min_rnr_timer;
  r.timeout = a->timeout;
  r.retry_cnt = a->retry_cnt;
  r.rnr_retry = a->rnr_retry;
  r.en_sqd_async_notify = a->en_sqd_async_notify;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a->ah_attr;
    if (!ah.is_global) return EINVAL;  // RoCE needs the GRH
    int err = 0;
    const IpAddr* src = qp->ctx->device()->source_address(ah.grh.sgid_index, ah.grh.dgid.raw, &err);
    if (!src) return err;
    std::memcpy(r.av.dgid, ah.grh.dgid.raw, 16);
    src->to_gid(r.av.sgid);
    r.av.flow_label = verbs::flow_label_of(ah.grh);
    r.av.hop_limit = ah.grh.hop_limit ? ah.grh.hop_limit : 64;
    r.av.traffic_class = ah.grh.traffic_class;
  }
  uint32_t emask = uint32_t(mask) & ~uint32_t(IBV_QP_PORT);
  if (mask & IBV_QP_PORT) emask |= rc::kAttrPort;
  int err = qp->lane->with_engine([&](rc::Engine& e) { return e.modify_qp(qp->qpn, r, emask); });
  if (!err && (mask & IBV_QP_STATE)) ibqp->state = a->qp_state;
  return err;
}

int SoftContext::query_qp(ibv_qp* ibqp, ibv_qp_attr* a, int mask, ibv_qp_init_attr* init) {
  if (ibqp->context != &vctx.context) return EINVAL;
  SoftQp* qp = SoftQp::from(ibqp);
  rc::QpAttr r;
  int err = qp->lane->with_engine([&](rc::Engine& e) { return e.query_qp(qp->qpn, &r, nullptr); });
  if (err) return err;
  (void)mask;  // everything is cheap to report
  std::memset(a, 0, sizeof *a);
  a->qp_state = ibv_qp_state(r.qp_state);
  a->cur_qp_state = ibv_qp_state(r.cur_qp_state);
  a->path_mtu = ibv_mtu(r.path_mtu);
  a->path_mig_state = IBV_MIG_MIGRATED;
  a->qkey = r.qkey;
  a->rq_psn = r.rq_psn;
  a->sq_psn = r.sq_psn;
  a->dest_qp_num = r.dest_qp_num;
  a->qp_access_flags = r.qp_access_flags;
  a->cap = qp->init.cap;
  a->ah_attr.is_global = 1;
  a->ah_attr.port_num = 1;
  std::memcpy(a->ah_attr.grh.dgid.raw, r.av.dgid, 16);
  a->ah_attr.grh.flow_label = r.av.flow_label;
  a->ah_attr.grh.hop_limit = r.av.hop_limit;
  a->ah_attr.grh.traffic_class = r.av.traffic_class;
  a->pkey_index = r.pkey_index;
  a->sq_draining = r.sq_draining;
  a->max_rd_atomic = r.max_rd_atomic;
  a->max_dest_rd_atomic = r.max_dest_rd_atomic;
  a->min_rnr_timer = r.min_rnr_timer;
  a->port_num = 1;
  a->timeout = r.timeout;
  a->retry_cnt = r.retry_cnt;
  a->rnr_retry = r.rnr_retry;
  if (qp->reliable_uc) verbs::reliable_uc_hide(a);
  *init = qp->init;
  return 0;
}

int SoftContext::destroy_qp(ibv_qp* ibqp) {
  if (ibqp->context != &vctx.context) return EINVAL;
  SoftQp* qp = SoftQp::from(ibqp);
  qp->hub->remove_qp(qp->qpn);
  qp->hub->unuse(qp->lane_index);
  // Queued packets may carry this QP's inline data, which lives in its send queue: send them first.
  qp->lane->drain();
  qp->lane->with_engine([&](rc::Engine& e) { return e.destroy_qp(qp->qpn); });
  SoftPd::users(ibqp->pd)--;
  qp->scq.cq->users--;
  qp->rcq.cq->users--;
  verbs::release_qp_ex_ops(qp);
  verbs::destroy_sync_fields(&ibqp->mutex, &ibqp->cond);
  delete qp;
  return 0;
}

// ---- data path ----------------------------------------------------------------------------------

int soft_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  SoftQp* qp = SoftQp::from(ibqp);
  return qp->lane->post_send_engine(qp->qpn, [&](rc::Engine& e) {
    for (; wr; wr = wr->next) {
      rc::SendWr w;
      w.wr_id = wr->wr_id;
      w.opcode = rc::WrOpcode(wr->opcode);
      w.send_flags = wr->send_flags;
      w.sg_list = reinterpret_cast<const rc::Sge*>(wr->sg_list);
      w.num_sge = wr->num_sge;
      int err = 0;
      switch (wr->opcode) {
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_RDMA_WRITE_WITH_IMM: w.imm = ntohl(wr->imm_data); break;
        case IBV_WR_SEND_WITH_INV: w.invalidate_rkey = wr->invalidate_rkey; break;
        default: break;
      }
      switch (wr->opcode) {
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
        case IBV_WR_RDMA_READ:
          w.remote_addr = wr->wr.rdma.remote_addr;
          w.rkey = wr->wr.rdma.rkey;
          break;
        case IBV_WR_ATOMIC_CMP_AND_SWP:
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
          w.remote_addr = wr->wr.atomic.remote_addr;
          w.rkey = wr->wr.atomic.rkey;
          w.compare_add = wr->wr.atomic.compare_add;
          w.swap = wr->wr.atomic.swap;
          break;
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_SEND_WITH_INV: break;
        default: err = EINVAL;  // LOCAL_INV, BIND_MW, TSO, DRIVER1: not on a soft device
      }
      if (ibqp->qp_type == IBV_QPT_UD) {
        if (!wr->wr.ud.ah || wr->wr.ud.ah->context != ibqp->context)
          err = EINVAL;
        else {
          w.ah = &reinterpret_cast<SoftAh*>(wr->wr.ud.ah)->av;
          w.remote_qpn = wr->wr.ud.remote_qpn;
          w.remote_qkey = wr->wr.ud.remote_qkey;
        }
      }
      if (!err) err = e.post_send(qp->qpn, w);
      if (err) {
        if (bad) *bad = wr;
        return err;
      }
    }
    return 0;
  });
}

int soft_post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  SoftQp* qp = SoftQp::from(ibqp);
  return qp->lane->post_engine([&](rc::Engine& e) {
    for (; wr; wr = wr->next) {
      rc::RecvWr r;
      r.wr_id = wr->wr_id;
      r.sg_list = reinterpret_cast<const rc::Sge*>(wr->sg_list);
      r.num_sge = wr->num_sge;
      int err = e.post_recv(qp->qpn, r);
      if (err) {
        if (bad) *bad = wr;
        return err;
      }
    }
    return 0;
  });
}

}  // namespace melon::soft
