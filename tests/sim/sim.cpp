#include "sim/sim.h"

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "roce/psn.h"

namespace melon::sim {

using namespace melon::rc;

// ---- link and event loop ----------------------------------------------------------------------

static bool parse_frame(const std::vector<uint8_t>& f, WireFrame& w) {
  const uint8_t* roce;
  size_t len;
  if (roce::read_frame(f.data(), f.size(), w.ip, &roce, &len) != roce::ParseError::ok) return false;
  return roce::parse_transport(roce, len, w.pkt) == roce::ParseError::ok;
}

Sim::Sim(uint64_t seed, const Faults& faults) : rng_(seed), faults_(faults) {
  const char* t = getenv("MELON_SIM_TRACE");
  trace_ = t && *t && *t != '0';
}

void Sim::trace(const char* what, int from, int to, const std::vector<uint8_t>& frame) {
  WireFrame w;
  if (!parse_frame(frame, w)) {
    fprintf(stderr, "[t=%llu] %s %d->%d unparsable frame (%zu bytes)\n", (unsigned long long)now_, what, from, to,
            frame.size());
    return;
  }
  const roce::Packet& p = w.pkt;
  const roce::OpInfo& oi = p.info();
  fprintf(stderr, "[t=%llu] %s %s->%s %s qp 0x%x psn 0x%06x%s len %u", (unsigned long long)now_, what,
          from >= 0 ? nodes_[from]->name.c_str() : "?", nodes_[to]->name.c_str(), oi.name ? oi.name : "?",
          p.bth.dest_qp, p.bth.psn, p.bth.ack_req ? " A" : "", p.payload_len);
  if (oi.has(roce::kAeth)) fprintf(stderr, " aeth 0x%02x msn %u", p.aeth.syndrome, p.aeth.msn);
  if (oi.has(roce::kReth))
    fprintf(stderr, " reth va 0x%llx rkey 0x%x len %u", (unsigned long long)p.reth.va, p.reth.rkey, p.reth.dma_len);
  if (oi.has(roce::kAtomicEth))
    fprintf(stderr, " atomic va 0x%llx rkey 0x%x", (unsigned long long)p.atomic.va, p.atomic.rkey);
  if (oi.has(roce::kAtomicAckEth)) fprintf(stderr, " orig 0x%llx", (unsigned long long)p.atomic_orig);
  fprintf(stderr, "\n");
}
Sim::~Sim() {
  // Engines first: they hold references to the links and memories.
  for (auto& n : nodes_) n->engine.reset();
}

int Sim::add_node(const std::string& name, bool v6, const EngineConfig& config) {
  int idx = int(nodes_.size());
  auto n = std::make_unique<Node>();
  n->name = name;
  n->v6 = v6;
  if (v6) {
    n->gid[0] = 0xfd;
    n->gid[15] = uint8_t(idx + 1);
  } else {
    roce::gid_from_ipv4(n->gid, 0x0a000001u + uint32_t(idx));
  }
  n->mem = std::make_unique<kit::Memory>(0x1000u * uint32_t(idx + 1) + 0x42);
  n->wire = std::make_unique<kit::FrameWire>();
  n->wire->on_frame = [this, idx](std::vector<uint8_t>&& f, const TxPacket& p) { transmit(idx, std::move(f), p); };
  n->engine = std::make_unique<Engine>(Host{*n->mem, *n->wire, clock_, nullptr}, config);
  nodes_.push_back(std::move(n));
  return idx;
}

AddressVector Sim::av_to(int from, int to) const {
  AddressVector av;
  memcpy(av.sgid, nodes_[from]->gid, 16);
  memcpy(av.dgid, nodes_[to]->gid, 16);
  return av;
}

uint64_t Sim::uniform(uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_); }
bool Sim::chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

void Sim::schedule(uint64_t t, Event ev) { events_.emplace(std::make_pair(t, seq_++), std::move(ev)); }

void Sim::at(uint64_t t, std::function<void()> fn) {
  Event ev;
  ev.fn = std::move(fn);
  schedule(t < now_ ? now_ : t, std::move(ev));
}

void Sim::inject(int to, const std::vector<uint8_t>& frame, uint64_t t) {
  Event ev;
  ev.to = to;
  ev.injected = true;
  ev.frame = frame;
  schedule(t < now_ ? now_ : t, std::move(ev));
}

void Sim::transmit(int from, std::vector<uint8_t>&& frame, const TxPacket& p) {
  ++stats_.frames;
  int to = -1;
  if (p.av) {
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (memcmp(nodes_[i]->gid, p.av->dgid, 16) == 0) to = int(i);
  } else {
    errors_.push_back("TxPacket without an address vector");
  }
  if (to < 0) {
    ++stats_.unroutable;
    if (trace_)
      fprintf(stderr, "[t=%llu] tx from %s: no node has the destination GID\n", (unsigned long long)now_,
              nodes_[from]->name.c_str());
    return;
  }
  Event ev;
  ev.from = from;
  ev.to = to;
  ev.frame = std::move(frame);
  if (trace_) trace("tx", from, to, ev.frame);
  if (on_transmit) {
    WireFrame w;
    w.from = from;
    w.to = to;
    w.time = now_;
    w.frame = &ev.frame;
    if (!parse_frame(ev.frame, w)) errors_.push_back("transmitted frame does not parse");
    if (!on_transmit(w)) {
      if (trace_) fprintf(stderr, "  (dropped by the test)\n");
      ++stats_.hook_dropped;
      return;
    }
  }
  if (chance(faults_.loss)) {
    if (trace_) fprintf(stderr, "  (lost)\n");
    ++stats_.lost;
    return;
  }
  if (chance(faults_.dup)) {
    ++stats_.duplicated;
    Event copy = ev;
    schedule(now_ + faults_.base_delay_ns + uniform(0, faults_.reorder_ns), std::move(copy));
  }
  if (chance(faults_.corrupt) && ev.frame.size() > 0) {
    // Flip bits in the RoCE part (BTH .. ICRC), but not in the BTH byte the ICRC masks out
    // (FECN/BECN/reserved: A17.3.3) since a router may change that one.
    roce::IpUdp ip;
    if (roce::parse_ip_udp(ev.frame.data(), ev.frame.size(), ip) == roce::ParseError::ok) {
      size_t pos;
      do pos = uniform(ip.hdr_len, ev.frame.size() - 1);
      while (pos == size_t(ip.hdr_len) + 4);
      ev.frame[pos] ^= uint8_t(uniform(1, 255));
      ev.corrupted = true;
      ++stats_.corrupted;
    }
  }
  uint64_t t;
  if (chance(faults_.reorder)) {
    ++stats_.reordered;
    t = now_ + faults_.base_delay_ns + uniform(0, faults_.reorder_ns);
  } else {
    uint64_t& tail = fifo_tail_[{from, to}];
    t = now_ + faults_.base_delay_ns + uniform(0, faults_.jitter_ns);
    if (t < tail) t = tail;
    tail = t;
  }
  schedule(t, std::move(ev));
}

void Sim::deliver(Event& ev) {
  if (ev.fn) {
    ev.fn();
    return;
  }
  roce::IpUdp ip;
  const uint8_t* roce;
  size_t len;
  roce::ParseError e = roce::read_frame(ev.frame.data(), ev.frame.size(), ip, &roce, &len);
  if (ev.corrupted) {
    if (e == roce::ParseError::bad_icrc) {
      ++stats_.corrupt_rejected;
    } else {
      errors_.push_back(std::string("corrupted frame: read_frame returned ") + roce::parse_error_name(e) +
                        ", not bad_icrc");
    }
    return;
  }
  if (e != roce::ParseError::ok) {
    errors_.push_back(std::string("read_frame rejected an intact frame: ") + roce::parse_error_name(e));
    return;
  }
  if (ev.injected) ++stats_.injected;
  if (on_deliver) {
    WireFrame w;
    w.from = ev.from;
    w.to = ev.to;
    w.time = now_;
    w.frame = &ev.frame;
    w.ip = ip;
    if (roce::parse_transport(roce, len, w.pkt) == roce::ParseError::ok) on_deliver(w);
  }
  ++stats_.delivered;
  if (trace_) trace("rx", ev.from, ev.to, ev.frame);
  nodes_[ev.to]->engine->receive(ip, roce, len);
}

bool Sim::step(uint64_t limit) {
  uint64_t t_ev = events_.empty() ? UINT64_MAX : events_.begin()->first.first;
  uint64_t t_dl = UINT64_MAX;
  for (auto& n : nodes_) {
    uint64_t d = n->engine->next_deadline();
    if (d < t_dl) t_dl = d;
  }
  uint64_t t = t_ev < t_dl ? t_ev : t_dl;
  if (t == UINT64_MAX || t > limit) return false;
  if (t > now_) {
    now_ = t;
    spins_ = 0;
  }
  if (t_dl <= t_ev) {
    // Timers first: a retransmission due at the same instant as an arriving ACK goes out, as it
    // would on a host whose timer interrupt won the race.
    for (auto& n : nodes_) {
      if (n->engine->next_deadline() <= now_) {
        ++stats_.ticks;
        n->engine->tick();
      }
    }
    if (++spins_ > 100000) {
      errors_.push_back("engine livelock: next_deadline() stays <= now after tick(now) at t=" + std::to_string(now_));
      return false;
    }
    return true;
  }
  auto node = events_.extract(events_.begin());
  ++stats_.events;
  Event& ev = node.mapped();
  if (!rx_batch_ns || ev.fn) {
    deliver(ev);
    return true;
  }
  // A receive batch: this frame and the next ones for the same node that arrive within the window,
  // stopping at anything else (another node's frame, a callback, a due timer).
  rc::Engine& engine = *nodes_[ev.to]->engine;
  const int to = ev.to;
  const uint64_t end = std::min(now_ + rx_batch_ns, limit);
  engine.begin_batch();
  deliver(ev);
  while (!events_.empty()) {
    auto it = events_.begin();
    const uint64_t t = it->first.first;
    if (t > end || it->second.fn || it->second.to != to || engine.next_deadline() <= t) break;
    now_ = t;
    auto next = events_.extract(it);
    ++stats_.events;
    deliver(next.mapped());
  }
  engine.end_batch();
  return true;
}

bool Sim::run_until(const std::function<bool()>& done, uint64_t deadline) {
  while (!done()) {
    if (!errors_.empty() && errors_.back().rfind("engine livelock", 0) == 0) return false;
    if (!step(deadline)) return done();
  }
  return true;
}

void Sim::run_for(uint64_t ns) {
  uint64_t end = now_ + ns;
  while (step(end)) {
    if (!errors_.empty() && errors_.back().rfind("engine livelock", 0) == 0) break;
  }
  if (now_ < end) now_ = end;
}

// ---- QP helpers --------------------------------------------------------------------------------

int create_qp(Sim& sim, int node, kit::Cq* scq, kit::Cq* rcq, const QpOptions& o, uint32_t* qpn) {
  QpInit init;
  init.type = o.type;
  init.pd = o.pd;
  init.send_cq = scq;
  init.recv_cq = rcq;
  init.cap = o.cap;
  init.sq_sig_all = o.sq_sig_all;
  int rc = sim.engine(node).create_qp(init, qpn);
  if (rc) return rc;
  QpAttr a;
  a.qp_state = QpState::init;
  a.pkey_index = 0;
  uint32_t mask = kAttrState | kAttrPkeyIndex | kAttrPort;
  if (o.type == QpType::ud) {
    a.qkey = o.qkey;
    mask |= kAttrQkey;
  } else {
    a.qp_access_flags = o.access;
    mask |= kAttrAccessFlags;
  }
  return sim.engine(node).modify_qp(*qpn, a, mask);
}

int connect_qp(Sim& sim, int node, uint32_t qpn, int peer, uint32_t peer_qpn, uint32_t peer_sq_psn,
               const QpOptions& o) {
  Engine& e = sim.engine(node);
  QpAttr a;
  a.qp_state = QpState::rtr;
  uint32_t mask = kAttrState;
  if (o.type != QpType::ud) {
    a.path_mtu = o.path_mtu;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = peer_sq_psn;
    a.av = sim.av_to(node, peer);
    mask |= kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn;
    if (o.type == QpType::rc) {
      a.max_dest_rd_atomic = o.max_dest_rd_atomic;
      a.min_rnr_timer = o.min_rnr_timer;
      mask |= kAttrMaxDestRdAtomic | kAttrMinRnrTimer;
    }
  }
  if (int rc = e.modify_qp(qpn, a, mask)) return rc;
  QpAttr b;
  b.qp_state = QpState::rts;
  b.sq_psn = o.sq_psn;
  mask = kAttrState | kAttrSqPsn;
  if (o.type == QpType::rc) {
    b.timeout = o.timeout;
    b.retry_cnt = o.retry_cnt;
    b.rnr_retry = o.rnr_retry;
    b.max_rd_atomic = o.max_rd_atomic;
    mask |= kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic;
  }
  return e.modify_qp(qpn, b, mask);
}

int connect_pair(Sim& sim, QpEnd& a, QpEnd& b, const QpOptions& oa, const QpOptions& ob) {
  if (int rc = create_qp(sim, a.node, a.scq, a.rcq, oa, &a.qpn)) return rc;
  if (int rc = create_qp(sim, b.node, b.scq, b.rcq, ob, &b.qpn)) return rc;
  if (int rc = connect_qp(sim, a.node, a.qpn, b.node, b.qpn, ob.sq_psn, oa)) return rc;
  return connect_qp(sim, b.node, b.qpn, a.node, a.qpn, oa.sq_psn, ob);
}

int to_error(Sim& sim, int node, uint32_t qpn) {
  QpAttr a;
  a.qp_state = QpState::err;
  return sim.engine(node).modify_qp(qpn, a, kAttrState);
}

QpState qp_state(Sim& sim, int node, uint32_t qpn) {
  QpAttr a;
  QpInit i;
  if (sim.engine(node).query_qp(qpn, &a, &i)) return QpState(0xff);
  return a.qp_state;
}

uint64_t test_seed(uint64_t fallback) {
  const char* s = getenv("MELON_SIM_SEED");
  uint64_t seed = s && *s ? strtoull(s, nullptr, 0) : fallback;
  return seed;
}

double sim_scale() {
  const char* s = getenv("MELON_SIM_SCALE");
  double v = s && *s ? atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}

// status is the ibv_wc_status value (verbs_values_oracle_test pins them); ibv_wc_status_str names it.
std::string describe(const Wc& wc) {
  char buf[200];
  snprintf(buf, sizeof buf, "wc{wr_id=%llu status=%d opcode=%d byte_len=%u imm=0x%x flags=0x%x qp=0x%x}",
           (unsigned long long)wc.wr_id, int(wc.status), int(wc.opcode), wc.byte_len, wc.imm, wc.wc_flags, wc.qp_num);
  return buf;
}

}  // namespace melon::sim
