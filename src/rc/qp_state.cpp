// QP state machine (IBA 10.3.1, Figure 124 and Table 91): which transitions exist and which
// attributes each requires per transport; flush on ERR; RESET clears everything.
#include <errno.h>

#include "rc/engine_impl.h"
#include "roce/psn.h"

namespace melon::rc {

namespace {

struct Transition {
  QpState from, to;
  uint32_t required[3];  // by QP type: RC, UC, UD
};

constexpr uint32_t kRcRtr =
    kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic | kAttrMinRnrTimer;
constexpr uint32_t kRcRts = kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic;

constexpr Transition kTransitions[] = {
    {QpState::reset,
     QpState::init,
     {kAttrPkeyIndex | kAttrPort | kAttrAccessFlags, kAttrPkeyIndex | kAttrPort | kAttrAccessFlags,
      kAttrPkeyIndex | kAttrPort | kAttrQkey}},
    {QpState::init, QpState::init, {0, 0, 0}},
    {QpState::init, QpState::rtr, {kRcRtr, kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn, 0}},
    {QpState::rtr, QpState::rts, {kRcRts, kAttrSqPsn, kAttrSqPsn}},
    {QpState::rts, QpState::rts, {0, 0, 0}},
    {QpState::rts, QpState::sqd, {0, 0, 0}},
    {QpState::sqd, QpState::rts, {0, 0, 0}},
    {QpState::sqd, QpState::sqd, {0, 0, 0}},
    {QpState::sqe, QpState::rts, {0, 0, 0}},
};

int type_index(QpType t) { return t == QpType::rc ? 0 : t == QpType::uc ? 1 : 2; }

}  // namespace

int EngineImpl::modify(Qp& qp, const QpAttr& a, uint32_t mask, uint64_t now) {
  QpState cur = qp.state;
  if ((mask & kAttrCurState) && a.cur_qp_state != cur) return EINVAL;
  QpState to = (mask & kAttrState) ? a.qp_state : cur;
  if (uint8_t(to) > uint8_t(QpState::err)) return EINVAL;
  if ((mask & kAttrPathMtu) && (a.path_mtu < 1 || a.path_mtu > 5)) return EINVAL;
  if ((mask & kAttrTimeout) && a.timeout > 31) return EINVAL;
  if ((mask & kAttrRetryCnt) && a.retry_cnt > 7) return EINVAL;
  if ((mask & kAttrRnrRetry) && a.rnr_retry > 7) return EINVAL;
  if ((mask & kAttrMinRnrTimer) && a.min_rnr_timer > 31) return EINVAL;
  if ((mask & kAttrDestQpn) && a.dest_qp_num > roce::kPsnMask) return EINVAL;

  if (to != QpState::reset && to != QpState::err) {
    const Transition* t = nullptr;
    for (const auto& c : kTransitions)
      if (c.from == cur && c.to == to) t = &c;
    if (!t) return EINVAL;
    uint32_t req = t->required[type_index(qp.init.type)];
    if ((mask & req) != req) return EINVAL;
  }

  // Apply.
  QpAttr& s = qp.attr;
  if (mask & kAttrAccessFlags) s.qp_access_flags = a.qp_access_flags;
  if (mask & kAttrPkeyIndex) s.pkey_index = a.pkey_index;
  if (mask & kAttrQkey) s.qkey = a.qkey;
  if (mask & kAttrAv) s.av = a.av;
  if (mask & kAttrPathMtu) {
    s.path_mtu = a.path_mtu;
    qp.mtu = mtu_bytes(a.path_mtu);
  }
  if (mask & kAttrTimeout) s.timeout = a.timeout;
  if (mask & kAttrRetryCnt) s.retry_cnt = qp.comp.cur_retry_count = a.retry_cnt;
  if (mask & kAttrRnrRetry) s.rnr_retry = qp.comp.cur_rnr_retry = a.rnr_retry;
  if (mask & kAttrRqPsn) s.rq_psn = qp.resp.next_rcv_psn = a.rq_psn & roce::kPsnMask;
  if (mask & kAttrSqPsn) s.sq_psn = qp.req.next_send_psn = qp.comp.una_psn = a.sq_psn & roce::kPsnMask;
  if (mask & kAttrMaxQpRdAtomic) s.max_rd_atomic = a.max_rd_atomic;
  if (mask & kAttrMaxDestRdAtomic) {
    s.max_dest_rd_atomic = a.max_dest_rd_atomic;
    qp.resp.resources.assign(a.max_dest_rd_atomic, Resource{});
    qp.resp.res_next = 0;
  }
  if (mask & kAttrMinRnrTimer) s.min_rnr_timer = a.min_rnr_timer;
  if (mask & kAttrDestQpn) s.dest_qp_num = a.dest_qp_num;
  if (qp.init.type == QpType::ud) qp.mtu = 4096;  // UD messages are bounded by the port MTU

  if (to == QpState::reset) {
    reset(qp);
    return 0;
  }
  if (to == QpState::err) {
    to_error(qp);
    return 0;
  }
  qp.state = to;
  s.qp_state = to;
  // IBA 10.3.1.4: the Send Queue Drained event comes when the last request sent before RTS -> SQD
  // is acknowledged, and only if the transition asked for it.
  if (to == QpState::sqd && cur != QpState::sqd)
    qp.sqd_notify = (mask & kAttrEnSqdAsyncNotify) && a.en_sqd_async_notify;
  if (to != QpState::sqd) qp.sqd_notify = false;
  check_sq_drained(qp);
  if (to == QpState::rts) requester_progress(qp, now);
  return 0;
}

void EngineImpl::flush_sq(Qp& qp) {
  while (qp.sq_count) {
    SendWqe& w = qp.sq[qp.sq_index(qp.sq_head)];
    if (!complete_send(qp, w, outcome_row(Outcome::flushed).requester_wc)) {
      // CQ overflow while flushing: drop the rest (the CQ error event has been raised).
      qp.sq_head += qp.sq_count;
      qp.sq_count = 0;
    }
  }
  qp.sq_cur = qp.sq_head;
  qp.comp.retrans_deadline = qp.req.rnr_deadline = 0;
}

void EngineImpl::flush_rq(Qp& qp, bool entering_err) {
  auto flush_one = [&](uint64_t wr_id) {
    Wc wc;
    wc.wr_id = wr_id;
    wc.status = outcome_row(Outcome::flushed).responder_wc;
    wc.opcode = WcOpcode::recv;
    wc.qp_num = qp.qpn;
    if (qp.init.recv_cq) qp.init.recv_cq->push(wc);
  };
  if (qp.resp.have_wqe) {
    flush_one(qp.resp.cur_wqe.wr_id);
    qp.resp.have_wqe = false;
  }
  if (qp.srq()) {  // an SRQ's WQEs belong to the SRQ, not this QP (IBA 10.2.9.5)
    // Once, on the move to ERR: a QP already there (modified to ERR again, or an error after the
    // application's own move) has no later "last WQE". UCX asserts on a second one.
    if (entering_err) raise(qp, AsyncEvent::qp_last_wqe_reached);
    return;
  }
  while (!qp.rq.empty()) {
    flush_one(qp.rq.front().wr_id);
    qp.rq.pop();
  }
}

void EngineImpl::check_sq_drained(Qp& qp) {
  if (qp.state != QpState::sqd || !qp.sqd_notify || !qp.sq_drained()) return;
  qp.sqd_notify = false;
  raise(qp, AsyncEvent::sq_drained);
}

void EngineImpl::to_sq_error(Qp& qp) {
  // IBA 10.3.1.5: UC and UD QPs take send-side errors to SQE; the receive queue keeps working.
  qp.state = QpState::sqe;
  qp.attr.qp_state = QpState::sqe;
  flush_sq(qp);
}

void EngineImpl::to_error(Qp& qp) {
  const bool entering = qp.state != QpState::err;
  qp.state = QpState::err;
  qp.attr.qp_state = QpState::err;
  note_sending(qp);
  qp.resp.in_send = qp.resp.in_write = qp.resp.ack_pending = false;  // ERR sends nothing
  qp.resp.nak_owed = false;
  qp.resp.answer_at = 0;
  for (auto& r : qp.resp.resources) r.next = r.stop;
  flush_sq(qp);
  flush_rq(qp, entering);
}

void EngineImpl::reset(Qp& qp) {
  qp.state = QpState::reset;
  qp.attr.qp_state = QpState::reset;
  note_sending(qp);
  qp.sq_head = qp.sq_cur = qp.sq_count = 0;
  qp.comp.retrans_deadline = qp.req.rnr_deadline = 0;
  qp.comp.probing = false;
  qp.req.pkts_since_ackreq = 0;
  qp.sqd_notify = false;
  qp.rq.clear();
  qp.resp.in_send = qp.resp.in_write = qp.resp.have_wqe = qp.resp.nak_sent = qp.resp.uc_drop = false;
  qp.resp.ack_pending = qp.resp.nak_owed = false;
  qp.resp.answer_at = 0;
  qp.resp.rmsn = 0;
  for (auto& r : qp.resp.resources) r.valid = false;
}

}  // namespace melon::rc
