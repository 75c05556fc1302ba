// Engine facade: object lifetimes, argument checks, packet dispatch by destination QP, timers.
#include "rc/engine.h"

#include <errno.h>

#include "rc/engine_impl.h"
#include "roce/psn.h"

namespace melon::rc {

using namespace roce;

Engine::Engine(const Host& host, const EngineConfig& config) : impl_(new EngineImpl(host, config)) {}
Engine::~Engine() = default;

int Engine::create_qp(const QpInit& init, uint32_t* qpn) {
  EngineImpl& e = *impl_;
  if (!qpn) return EINVAL;
  if (init.type != QpType::rc && init.type != QpType::uc && init.type != QpType::ud) return EINVAL;
  const QpCaps& c = init.cap;
  if (c.max_send_wr == 0 || c.max_send_wr > kMaxQpWr || c.max_send_sge > kMaxSge || c.max_recv_sge > kMaxSge ||
      c.max_inline_data > kMaxInlineData)
    return EINVAL;
  if (!init.srq && (c.max_recv_wr == 0 || c.max_recv_wr > kMaxQpWr)) return EINVAL;
  if (!init.send_cq || !init.recv_cq) return EINVAL;
  if (init.srq && init.srq->pd != init.pd) return EINVAL;
  if (init.scatter_to_wc > kWcInlineMax || (init.scatter_to_wc && (init.srq || init.type == QpType::ud))) return EINVAL;

  if (e.nqps_ >= kMaxQp) return ENOMEM;
  // The other QPs share kMaxQp - 1 slots: QP1's is kept for it.
  const bool has_gsi = e.slots_.size() > 1 && e.slots_[1];
  if (!init.fixed_qpn && e.nqps_ - (has_gsi ? 1 : 0) >= kMaxQp - 1) return ENOMEM;
  auto qp = std::make_unique<Qp>();
  uint32_t slot = 0;
  uint32_t n = 0;
  if (init.fixed_qpn) {
    n = init.fixed_qpn & kPsnMask;
    slot = n & EngineImpl::kQpnSlotMask;
    if (slot < e.slots_.size() && e.slots_[slot]) return EBUSY;
  } else {
    n = e.choose_qpn(&slot);
  }
  qp->qpn = n;
  qp->init = init;
  qp->attr.cap = c;
  qp->sq.resize(c.max_send_wr);
  qp->inline_buf.resize(size_t(c.max_send_wr) * c.max_inline_data);
  if (!init.srq) qp->rq.init(c.max_recv_wr, c.max_recv_sge);
  qp->resp.resources.assign(1, Resource{});
  *qpn = n;
  if (slot >= e.slots_.size()) e.slots_.resize(slot + 1);
  e.slots_[slot] = std::move(qp);
  ++e.nqps_;
  return 0;
}

uint32_t EngineImpl::choose_qpn(uint32_t* slot) {
  // QPN 0 and 1 are the SMI and GSI, 0xFFFFFF the multicast QPN. Sequential: from first_qpn, the
  // next whose slot is free. Random: a random QPN whose slot is free; when the table is nearly
  // full, a random tag on a free slot.
  auto usable = [&](uint32_t n) {
    uint32_t s = n & kQpnSlotMask;
    // Slot 1 is QP1's (fixed_qpn), free or not, so the GSI can always be made later.
    return n > 1 && n != kPsnMask && s != 1 && (s >= slots_.size() || !slots_[s]);
  };
  uint32_t n = 0;
  if (cfg_.random_qpn) {
    for (int i = 0; i < 64; ++i) {
      n = cfg_.random_qpn(cfg_.random_qpn_arg) & kPsnMask;
      if (usable(n)) break;
    }
    if (!usable(n)) {
      uint32_t s = 0;
      while (s < slots_.size() && (slots_[s] || s == 1)) ++s;
      do n = (cfg_.random_qpn(cfg_.random_qpn_arg) & ~kQpnSlotMask & kPsnMask) | s;
      while (!usable(n));
    }
  } else {
    do n = next_qpn_++ & kPsnMask;
    while (!usable(n));
  }
  *slot = n & kQpnSlotMask;
  return n;
}

void EngineImpl::schedule(Qp& qp) {
  uint64_t d = qp.deadline();
  if (d && (!qp.timer_at || d < qp.timer_at)) {
    timers_.push({d, qp.qpn});
    qp.timer_at = d;
  }
}

uint64_t EngineImpl::earliest_deadline() {
  while (!timers_.empty()) {
    Timer t = timers_.top();
    Qp* qp = find(t.qpn);
    if (qp && qp->timer_at == t.at) {
      uint64_t d = qp->deadline();
      if (d == t.at) return d;
      qp->timer_at = 0;  // the deadline moved or went away: re-file it
      timers_.pop();
      schedule(*qp);
      continue;
    }
    timers_.pop();  // destroyed QP, or one with a newer entry
  }
  return UINT64_MAX;
}

int Engine::modify_qp(uint32_t qpn, const QpAttr& attr, uint32_t mask) {
  Qp* qp = impl_->find(qpn);
  if (!qp) return EINVAL;
  int r = impl_->modify(*qp, attr, mask, impl_->now());
  impl_->schedule(*qp);
  return r;
}

int Engine::query_qp(uint32_t qpn, QpAttr* attr, QpInit* init) const {
  Qp* qp = impl_->find(qpn);
  if (!qp) return EINVAL;
  if (attr) {
    *attr = qp->attr;
    attr->qp_state = attr->cur_qp_state = qp->state;
    attr->sq_draining = qp->state == QpState::sqd && !qp->sq_drained();
    // Live PSNs once the QP runs, as rxe's ibv_query_qp reports them (the emulated HCA's QUERY_QP
    // shows them in next_send_psn / next_rcv_psn).
    if (qp->state != QpState::reset && qp->state != QpState::init) attr->rq_psn = qp->resp.next_rcv_psn;
    if (qp->state == QpState::rts || qp->state == QpState::sqd || qp->state == QpState::sqe)
      attr->sq_psn = qp->req.next_send_psn;
  }
  if (init) *init = qp->init;
  return 0;
}

int Engine::destroy_qp(uint32_t qpn) {
  EngineImpl& e = *impl_;
  if (!e.find(qpn)) return EINVAL;
  std::unique_ptr<Qp>& slot = e.slots_[qpn & EngineImpl::kQpnSlotMask];
  if (slot->sending) --e.sending_qps_;
  e.inflight_total_ -= slot->counted_inflight;
  add_counters(e.retired_, slot->counters);
  slot.reset();
  --e.nqps_;
  return 0;
}

int Engine::create_srq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit, Srq** srq, uint32_t* srqn) {
  if (!srq || max_wr == 0 || max_wr > kMaxSrqWr || max_sge == 0 || max_sge > kMaxSge || limit > max_wr) return EINVAL;
  auto s = std::make_unique<Srq>();
  s->srqn = impl_->next_srqn_++;
  s->pd = pd;
  s->limit = limit;
  s->rq.init(max_wr, max_sge);
  *srq = s.get();
  if (srqn) *srqn = s->srqn;
  impl_->srqs_[s->srqn] = std::move(s);
  return 0;
}

int Engine::modify_srq(Srq* srq, uint32_t limit) {
  if (!srq || !impl_->srqs_.count(srq->srqn) || limit > srq->rq.capacity()) return EINVAL;
  srq->limit = limit;
  return 0;
}

int Engine::query_srq(const Srq* srq, uint32_t* limit) const {
  if (!srq || !limit || !impl_->srqs_.count(srq->srqn)) return EINVAL;
  *limit = srq->limit;
  return 0;
}

int Engine::destroy_srq(Srq* srq) {
  if (!srq) return EINVAL;
  for (auto& qp : impl_->slots_)
    if (qp && qp->init.srq == srq) return EBUSY;
  return impl_->srqs_.erase(srq->srqn) ? 0 : EINVAL;
}

int Engine::post_send(uint32_t qpn, const SendWr& wr) {
  Qp* qp = impl_->find(qpn);
  if (!qp) return EINVAL;
  int r = impl_->post_send(*qp, wr, impl_->now());
  impl_->schedule(*qp);
  return r;
}

bool Engine::awaiting_ack(uint32_t qpn) const {
  const Qp* qp = impl_->find(qpn);
  return qp && qp->init.type == QpType::rc && (qp->state == QpState::rts || qp->state == QpState::sqd) &&
         psn_diff(qp->req.next_send_psn, qp->comp.una_psn) > 0 && qp->comp.retrans_deadline;
}

int Engine::post_recv(uint32_t qpn, const RecvWr& wr) {
  EngineImpl& e = *impl_;
  Qp* qp = e.find(qpn);
  if (!qp || qp->init.srq || qp->state == QpState::reset) return EINVAL;
  if (qp->rq.full()) return ENOMEM;
  RecvWqe tmp;
  if (!fill_recv_wqe(tmp, wr, qp->rq.max_sge())) return EINVAL;
  qp->rq.push_slot() = tmp;
  if (qp->state == QpState::err) e.flush_rq(*qp);
  return 0;
}

int Engine::post_srq_recv(Srq* srq, const RecvWr& wr) {
  if (!srq || !impl_->srqs_.count(srq->srqn)) return EINVAL;
  if (srq->rq.full()) return ENOMEM;
  RecvWqe tmp;
  if (!fill_recv_wqe(tmp, wr, srq->rq.max_sge())) return EINVAL;
  srq->rq.push_slot() = tmp;
  return 0;
}

void Engine::receive(const IpUdp& ip, const uint8_t* roce, size_t len) {
  EngineImpl& e = *impl_;
  Packet p;
  if (parse_transport(roce, len, p) != ParseError::ok) {
    ++e.dropped_;
    return;
  }
  Qp* qp = e.find(p.bth.dest_qp);
  const OpInfo& op = p.info();
  if (!qp || op.is(kCnp)) {
    ++e.dropped_;
    return;
  }
  // The opcode's transport must be the QP's.
  Transport t = op_transport(p.bth.opcode);
  QpType want = t == Transport::rc ? QpType::rc : t == Transport::uc ? QpType::uc : QpType::ud;
  if (t == Transport::rd || t == Transport::cnp || want != qp->init.type) {
    ++qp->counters.dropped;
    ++e.dropped_;
    return;
  }
  uint64_t now = e.now();
  if (op.is(kRequest)) {
    e.on_request(*qp, ip, p);
  } else {
    ++qp->counters.rx_packets;
    e.on_response(*qp, p, now);
  }
  e.schedule(*qp);
}

void Engine::begin_batch() { impl_->in_batch_ = true; }

void Engine::end_batch() {
  EngineImpl& e = *impl_;
  e.in_batch_ = false;
  for (uint32_t qpn : e.ack_owed_)
    if (Qp* qp = e.find(qpn)) e.flush_ack(*qp);  // gone or reset since: nothing owed
  e.ack_owed_.clear();
}

void Engine::tick() {
  EngineImpl& e = *impl_;
  uint64_t now = e.now();
  while (!e.timers_.empty() && e.timers_.top().at <= now) {
    EngineImpl::Timer t = e.timers_.top();
    e.timers_.pop();
    Qp* qp = e.find(t.qpn);
    if (!qp || qp->timer_at != t.at) continue;  // stale entry
    qp->timer_at = 0;
    e.on_timer(*qp, now);
    e.requester_progress(*qp, now);
    if (qp->resp.answer_at && qp->resp.answer_at <= now) e.answer(*qp, now);
    e.schedule(*qp);
  }
}

uint64_t Engine::next_deadline() const { return impl_->earliest_deadline(); }

const QpCounters* Engine::counters(uint32_t qpn) const {
  Qp* qp = impl_->find(qpn);
  return qp ? &qp->counters : nullptr;
}

uint64_t Engine::dropped_packets() const { return impl_->dropped_; }

void add_counters(QpCounters& sum, const QpCounters& c) {
  sum.tx_packets += c.tx_packets;
  sum.rx_packets += c.rx_packets;
  sum.retransmits += c.retransmits;
  sum.timeouts += c.timeouts;
  sum.rnr_naks_sent += c.rnr_naks_sent;
  sum.rnr_naks_received += c.rnr_naks_received;
  sum.seq_naks_sent += c.seq_naks_sent;
  sum.seq_naks_received += c.seq_naks_received;
  sum.duplicates += c.duplicates;
  sum.dropped += c.dropped;
  sum.acks_coalesced += c.acks_coalesced;
}

QpCounters Engine::totals() const {
  QpCounters sum = impl_->retired_;
  for (const auto& qp : impl_->slots_)
    if (qp) add_counters(sum, qp->counters);
  return sum;
}

const char* qp_state_name(QpState s) {
  static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  unsigned i = unsigned(s);
  return i < 7 ? names[i] : "?";
}

}  // namespace melon::rc
