// Engine facade: object lifetimes, argument checks, packet dispatch by destination QP, timers.
#include "rc/engine.h"

#include <errno.h>

#include "rc/engine_impl.h"
#include "roce/psn.h"

namespace melon::rc {

using namespace roce;

Engine::Engine(Link& link, Memory& memory, EventSink* events, const EngineConfig& config)
    : impl_(new EngineImpl(link, memory, events, config)) {}
Engine::~Engine() = default;

int Engine::create_qp(const QpInit& init, uint32_t* qpn) {
  EngineImpl& e = *impl_;
  if (!qpn) return EINVAL;
  if (init.type != QpType::rc && init.type != QpType::uc && init.type != QpType::ud) return EINVAL;
  const QpCaps& c = init.cap;
  if (c.max_send_wr == 0 || c.max_send_wr > 32768 || c.max_send_sge > uint32_t(SendWqe::kMaxSge) ||
      c.max_recv_sge > uint32_t(RecvWqe::kMaxSge) || c.max_inline_data > 4096)
    return EINVAL;
  if (!init.srq && (c.max_recv_wr == 0 || c.max_recv_wr > 32768)) return EINVAL;
  if (!init.send_cq || !init.recv_cq) return EINVAL;
  if (init.srq && init.srq->pd != init.pd) return EINVAL;

  auto qp = std::make_unique<Qp>();
  uint32_t n = e.choose_qpn();
  qp->qpn = n;
  qp->init = init;
  qp->attr.cap = c;
  qp->sq.resize(c.max_send_wr);
  qp->inline_buf.resize(size_t(c.max_send_wr) * c.max_inline_data);
  if (!init.srq) qp->rq.init(c.max_recv_wr, c.max_recv_sge);
  qp->resources.assign(1, Resource{});
  *qpn = n;
  e.qps_[n] = std::move(qp);
  return 0;
}

uint32_t EngineImpl::choose_qpn() {
  constexpr uint32_t kQpnMask = 0xffffff;  // QPNs are 24 bits
  for (;;) {  // terminates: far fewer QPs than QPNs
    uint32_t n = (cfg_.random_qpn ? cfg_.random_qpn(cfg_.random_qpn_arg) : next_qpn_++) & kQpnMask;
    if (n > 1 && n != kQpnMask && !qps_.count(n)) return n;
  }
}

int Engine::modify_qp(uint32_t qpn, const QpAttr& attr, uint32_t mask, uint64_t now) {
  Qp* qp = impl_->find(qpn);
  return qp ? impl_->modify(*qp, attr, mask, now) : EINVAL;
}

int Engine::query_qp(uint32_t qpn, QpAttr* attr, QpInit* init) const {
  Qp* qp = impl_->find(qpn);
  if (!qp) return EINVAL;
  if (attr) {
    *attr = qp->attr;
    attr->qp_state = attr->cur_qp_state = qp->state;
    attr->sq_draining = qp->state == QpState::sqd && qp->sq_cur != qp->sq_head;
  }
  if (init) *init = qp->init;
  return 0;
}

int Engine::destroy_qp(uint32_t qpn) { return impl_->qps_.erase(qpn) ? 0 : EINVAL; }

int Engine::create_srq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit, Srq** srq, uint32_t* srqn) {
  if (!srq || max_wr == 0 || max_wr > 32768 || max_sge == 0 || max_sge > uint32_t(RecvWqe::kMaxSge) || limit > max_wr)
    return EINVAL;
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

int Engine::destroy_srq(Srq* srq) {
  if (!srq) return EINVAL;
  for (auto& [n, qp] : impl_->qps_)
    if (qp->init.srq == srq) return EBUSY;
  return impl_->srqs_.erase(srq->srqn) ? 0 : EINVAL;
}

int Engine::post_send(uint32_t qpn, const SendWr& wr, uint64_t now) {
  Qp* qp = impl_->find(qpn);
  return qp ? impl_->post_send(*qp, wr, now) : EINVAL;
}

int Engine::post_recv(uint32_t qpn, const RecvWr& wr) {
  EngineImpl& e = *impl_;
  Qp* qp = e.find(qpn);
  if (!qp || qp->init.srq || qp->state == QpState::reset) return EINVAL;
  if (qp->rq.full()) return ENOMEM;
  PostedRecv tmp;
  if (!fill_recv_wqe(tmp, wr, qp->rq.max_sge())) return EINVAL;
  qp->rq.push_slot() = tmp;
  if (qp->state == QpState::err) e.flush_rq(*qp);
  return 0;
}

int Engine::post_srq_recv(Srq* srq, const RecvWr& wr) {
  if (!srq || !impl_->srqs_.count(srq->srqn)) return EINVAL;
  if (srq->rq.full()) return ENOMEM;
  PostedRecv tmp;
  if (!fill_recv_wqe(tmp, wr, srq->rq.max_sge())) return EINVAL;
  srq->rq.push_slot() = tmp;
  return 0;
}

void Engine::receive(const IpUdp& ip, const uint8_t* roce, size_t len, uint64_t now) {
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
  if (op.is(kRequest)) {
    e.on_request(*qp, ip, p, now);
  } else {
    ++qp->counters.rx_packets;
    e.on_response(*qp, p, now);
  }
}

void Engine::tick(uint64_t now) {
  for (auto& [n, qp] : impl_->qps_) {
    impl_->on_timer(*qp, now);
    impl_->requester_progress(*qp, now);
  }
}

uint64_t Engine::next_deadline() const {
  uint64_t d = UINT64_MAX;
  for (auto& [n, qp] : impl_->qps_) {
    if (qp->retrans_deadline && qp->retrans_deadline < d) d = qp->retrans_deadline;
    if (qp->rnr_deadline && qp->rnr_deadline < d) d = qp->rnr_deadline;
  }
  return d;
}

const QpCounters* Engine::counters(uint32_t qpn) const {
  Qp* qp = impl_->find(qpn);
  return qp ? &qp->counters : nullptr;
}

uint64_t Engine::dropped_packets() const { return impl_->dropped_; }

const char* wc_status_name(WcStatus s) {
  static const char* const names[] = {"success",
                                      "local length error",
                                      "local QP operation error",
                                      "local EE context operation error",
                                      "local protection error",
                                      "Work Request Flushed Error",
                                      "memory management operation error",
                                      "bad response error",
                                      "local access error",
                                      "remote invalid request error",
                                      "remote access error",
                                      "remote operation error",
                                      "transport retry counter exceeded",
                                      "RNR retry counter exceeded",
                                      "local RDD violation error",
                                      "remote invalid RD request",
                                      "aborted error",
                                      "invalid EE context number",
                                      "invalid EE context state",
                                      "fatal error",
                                      "response timeout error",
                                      "general error"};
  unsigned i = unsigned(s);
  return i < sizeof names / sizeof names[0] ? names[i] : "unknown";
}

const char* qp_state_name(QpState s) {
  static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  unsigned i = unsigned(s);
  return i < 7 ? names[i] : "?";
}

}  // namespace melon::rc
