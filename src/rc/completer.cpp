// Completer (IBA 9.7.5.2 requester side): matches ACKs, NAKs, READ responses and atomic ACKs to
// send WQEs, completes them in order, and drives retransmission (go-back-N), the local ACK timer,
// retry_cnt and the RNR back-off.
#include <string.h>

#include "rc/engine_impl.h"
#include "rc/scatter_gather.h"
#include "roce/aeth.h"
#include "roce/psn.h"

namespace melon::rc {

using namespace roce;

namespace {

WcOpcode wc_opcode_for(WrOpcode op) {
  switch (op) {
    case WrOpcode::rdma_write:
    case WrOpcode::rdma_write_with_imm: return WcOpcode::rdma_write;
    case WrOpcode::rdma_read: return WcOpcode::rdma_read;
    case WrOpcode::atomic_cmp_and_swp: return WcOpcode::comp_swap;
    case WrOpcode::atomic_fetch_and_add: return WcOpcode::fetch_add;
    case WrOpcode::local_inv: return WcOpcode::local_inv;
    case WrOpcode::bind_mw: return WcOpcode::bind_mw;
    default: return WcOpcode::send;
  }
}

}  // namespace

bool EngineImpl::complete_send(Qp& qp, SendWqe& w, WcStatus st) {
  // Always the head: completions are in order.
  bool signaled = qp.init.sq_sig_all || (w.wr.send_flags & kSignaled) || st != WcStatus::success;
  Wc wc;
  wc.wr_id = w.wr.wr_id;
  wc.status = st;
  wc.opcode = wc_opcode_for(w.wr.opcode);
  wc.byte_len = w.length;
  wc.qp_num = qp.qpn;
  bool is_cur = qp.sq_cur == qp.sq_head;
  ++qp.sq_head;
  --qp.sq_count;
  if (is_cur) {
    // The requester was (re)sending this WQE: it continues after it, never reusing its PSNs.
    ++qp.sq_cur;
    if (w.started && psn_diff(psn_add(w.last_psn, 1), qp.req.next_send_psn) > 0)
      qp.req.next_send_psn = psn_add(w.last_psn, 1);
  }
  if (signaled && (!qp.init.send_cq || !qp.init.send_cq->push(wc))) {
    raise(qp, AsyncEvent::cq_err);
    if (qp.state != QpState::err) to_error(qp);
    return false;
  }
  check_sq_drained(qp);
  return true;
}

void EngineImpl::fail_wqe(Qp& qp, SendWqe& w, WcStatus st) {
  complete_send(qp, w, st);
  if (qp.state == QpState::err) return;  // complete_send's CQ overflow moved it already
  if (qp.init.type == QpType::rc)
    to_error(qp);
  else
    to_sq_error(qp);
}

void EngineImpl::arm_retrans(Qp& qp, uint64_t now) {
  uint64_t t = ack_timeout_ns(qp.attr.timeout);
  qp.comp.retrans_deadline = (t && qp.sq_count) ? now + t : 0;
}

// A NAK (RNR or not) against the oldest WQE (IBA 9.7.5.2.3-9.7.5.2.8).
EngineImpl::Step EngineImpl::match_nak(Qp& qp, SendWqe& w, const Packet& p, bool& progressed, uint64_t now) {
  const uint32_t psn = p.bth.psn;
  const AckType type = syndrome_type(p.aeth.syndrome);
  // NAKs carry the PSN they refer to; everything before it is implicitly acknowledged.
  if (psn_diff(psn, w.first_psn) < 0) return Step::stop;  // stale NAK for an earlier PSN
  if (psn_diff(psn, w.last_psn) > 0 && !w.is_read_or_atomic()) {
    progressed = true;
    if (!complete_send(qp, w, WcStatus::success)) return Step::leave;
    return Step::next;
  }
  if (psn_diff(psn, w.last_psn) > 0) {  // a READ/atomic before the NAKed PSN got no response
    rewind(qp, w.read_next_psn);
    return Step::stop;
  }
  // The NAKed PSN acknowledges everything before it (IBA 9.7.5.2.3): that is progress. Not inside a
  // READ asked for in several requests: a NAK of a later request's PSN says nothing of whether the
  // earlier requests' responses arrived, so the READ resumes at the first one missing.
  const uint32_t from = w.wr.opcode == WrOpcode::rdma_read ? w.read_next_psn : psn;
  if (psn_diff(from, qp.comp.una_psn) > 0) progressed = true;
  qp.comp.una_psn = from;
  if (type == AckType::rnr_nak) {
    ++qp.counters.rnr_naks_received;
    if (qp.req.rnr_deadline && !progressed) return Step::leave;  // a duplicate of the NAK being waited out
    if (qp.attr.rnr_retry != 7) {
      if (qp.comp.cur_rnr_retry == 0) {
        fail_wqe(qp, w, outcome_row(Outcome::rnr_retry_exceeded).requester_wc);
        return Step::leave;
      }
      --qp.comp.cur_rnr_retry;
    }
    rewind(qp, psn);
    qp.req.rnr_deadline = now + rnr_timer_ns(syndrome_value(p.aeth.syndrome));
    qp.comp.retrans_deadline = 0;
    return Step::leave;
  }
  if (type == AckType::nak && NakCode(syndrome_value(p.aeth.syndrome)) == NakCode::psn_seq_error) {
    ++qp.counters.seq_naks_received;
    // Packets already in flight behind an RNR-NAKed one draw a sequence NAK for the same PSN
    // (rxe-rc-rnr.pcap); the RNR back-off already covers them, and only rnr_retry may count.
    if (qp.req.rnr_deadline) return Step::leave;
    // One retry per NAKed PSN: a duplicated or reordered copy of a NAK already acted on
    // must not cost another retry (only new information does).
    if (!progressed && qp.comp.seq_nak_pending && qp.comp.seq_nak_psn == psn) return Step::leave;
    qp.comp.seq_nak_pending = true;
    qp.comp.seq_nak_psn = psn;
    if (progressed) qp.comp.cur_retry_count = qp.attr.retry_cnt;
    if (qp.comp.cur_retry_count == 0) {
      fail_wqe(qp, w, outcome_row(Outcome::retry_exceeded).requester_wc);
      return Step::leave;
    }
    --qp.comp.cur_retry_count;
    rewind(qp, from);
    ++qp.counters.retransmits;
    arm_retrans(qp, now);
    requester_progress(qp, now);
    return Step::leave;
  }
  // Class B/C/D errors: the WQE fails, the QP goes to ERR (IBA 9.9.3.1.2).
  fail_wqe(qp, w, outcome_for_nak(NakCode(syndrome_value(p.aeth.syndrome))).requester_wc);
  return Step::leave;
}

// A READ response against the oldest WQE (IBA 9.7.5.2.2; implied NAK 9.7.5.1.6).
EngineImpl::Step EngineImpl::match_read_response(Qp& qp, SendWqe& w, const Packet& p, bool& progressed, uint64_t now) {
  const OpInfo& op = p.info();
  const uint32_t psn = p.bth.psn;
  const bool rd = w.wr.opcode == WrOpcode::rdma_read;
  const bool at = w.is_read_or_atomic() && !rd;
  if (psn_diff(psn, w.first_psn) < 0) return Step::stop;  // duplicate response
  if (!rd) {
    if (psn_diff(psn, w.last_psn) > 0 && !at) {  // implicitly acknowledges earlier SEND/WRITE
      progressed = true;
      if (!complete_send(qp, w, WcStatus::success)) return Step::leave;
      return Step::next;
    }
    return Step::stop;  // a READ response where an atomic/SEND is outstanding: ignore
  }
  if (psn != w.read_next_psn) {
    // A response past the one expected (inside this READ, or belonging to a later one) means
    // responses were lost: implied NAK (IBA 9.7.5.1.6), re-issue from the hole. Once per gap:
    // later out-of-order responses are ignored until an in-order one arrives.
    if (psn_diff(psn, w.read_next_psn) > 0 && !(qp.comp.read_gap_pending && qp.comp.read_gap_psn == w.read_next_psn)) {
      qp.comp.read_gap_pending = true;
      qp.comp.read_gap_psn = w.read_next_psn;
      ++qp.counters.retransmits;
      rewind(qp, w.read_next_psn);
      requester_progress(qp, now);
    }
    return Step::leave;
  }
  qp.comp.read_gap_pending = false;
  // Each request (a chunk of the READ, requester.cpp) is answered FIRST..LAST or ONLY; a re-issue
  // is answered as a continuation (MIDDLE..LAST), which rxe does even from a chunk's first PSN.
  const uint32_t i = uint32_t(psn_diff(psn, w.first_psn));
  const uint32_t chunk_end =
      (i / w.read_chunk + 1) * w.read_chunk < w.npkts ? (i / w.read_chunk + 1) * w.read_chunk : w.npkts;
  uint32_t off = i * qp.mtu;
  bool first = op.is(kStart), last = op.is(kEnd);
  // Length rules for responses (mirrors the responder's C9-87 checks).
  uint32_t remaining = (uint64_t(chunk_end) * qp.mtu < w.length ? chunk_end * qp.mtu : w.length) - off;
  bool bad = (first && i % w.read_chunk != 0) || last != (i + 1 == chunk_end) || (!last && p.payload_len != qp.mtu) ||
             (last && p.payload_len != remaining);
  if (bad) {
    fail_wqe(qp, w, outcome_row(Outcome::bad_response).requester_wc);
    return Step::leave;
  }
  if (scatter(mem_, qp.init.pd, w.seg, w.nseg, off, p.payload, p.payload_len) != MemStatus::ok) {
    fail_wqe(qp, w, outcome_row(Outcome::local_protection_error).requester_wc);  // the region went away after post_send
    return Step::leave;
  }
  w.read_next_psn = psn_add(psn, 1);
  qp.comp.una_psn = w.read_next_psn;
  progressed = true;
  if (i + 1 == w.npkts) {  // the last response of the last request
    w.done = true;
    if (!complete_send(qp, w, WcStatus::success)) return Step::leave;
  }
  return Step::stop;
}

// An atomic ACK against the oldest WQE.
EngineImpl::Step EngineImpl::match_atomic_ack(Qp& qp, SendWqe& w, const Packet& p, bool& progressed, uint64_t) {
  const uint32_t psn = p.bth.psn;
  const bool rd = w.wr.opcode == WrOpcode::rdma_read;
  const bool at = w.is_read_or_atomic() && !rd;
  if (psn_diff(psn, w.first_psn) < 0) return Step::stop;
  if (!at) {
    if (!rd && psn_diff(psn, w.last_psn) > 0) {
      progressed = true;
      if (!complete_send(qp, w, WcStatus::success)) return Step::leave;
      return Step::next;
    }
    if (rd && psn_diff(psn, w.last_psn) > 0) {  // READ responses missing: implied NAK
      rewind(qp, w.read_next_psn);
    }
    return Step::stop;
  }
  if (psn != w.first_psn) {
    if (psn_diff(psn, w.first_psn) > 0) rewind(qp, w.first_psn);
    return Step::stop;
  }
  // The original value lands in host order, as rxe does.
  if (w.nseg && scatter(mem_, qp.init.pd, w.seg, w.nseg, 0, reinterpret_cast<const uint8_t*>(&p.atomic_orig), 8) !=
                    MemStatus::ok) {
    fail_wqe(qp, w, outcome_row(Outcome::local_protection_error).requester_wc);
    return Step::leave;
  }
  qp.comp.una_psn = psn_add(psn, 1);
  progressed = true;
  w.done = true;
  if (!complete_send(qp, w, WcStatus::success)) return Step::leave;
  return Step::stop;
}

// A plain (coalesced) ACK against the oldest WQE: acknowledges every PSN up to its own.
EngineImpl::Step EngineImpl::match_ack(Qp& qp, SendWqe& w, const Packet& p, bool& progressed, uint64_t now) {
  const uint32_t psn = p.bth.psn;
  const bool rd = w.wr.opcode == WrOpcode::rdma_read;
  // Plain ACK (coalesced): acknowledges every PSN up to and including `psn`.
  if (psn_diff(psn, w.first_psn) < 0) return Step::stop;
  if (w.is_read_or_atomic()) {
    // An ACK covering a READ/atomic whose response never came: implied NAK (IBA 9.7.5.1.6).
    // Once per WQE until progress: duplicates draw re-ACKs, and rewinding on each would feed a
    // retransmission storm; the ACK timer covers a lost re-issue.
    if (qp.comp.implied_nak_pending && qp.comp.implied_nak_psn == w.first_psn) return Step::leave;
    qp.comp.implied_nak_pending = true;
    qp.comp.implied_nak_psn = w.first_psn;
    rewind(qp, w.read_next_psn == w.first_psn || !rd ? w.first_psn : w.read_next_psn);
    ++qp.counters.retransmits;
    requester_progress(qp, now);
    return Step::leave;
  }
  if (psn_diff(psn, w.last_psn) >= 0) {
    progressed = true;
    w.done = true;
    if (!complete_send(qp, w, WcStatus::success)) return Step::leave;
    return Step::next;
  }
  // Partial acknowledgement of a multi-packet message.
  if (psn_diff(psn_add(psn, 1), qp.comp.una_psn) > 0) {
    qp.comp.una_psn = psn_add(psn, 1);
    progressed = true;
  }
  return Step::stop;
}

void EngineImpl::on_response(Qp& qp, const Packet& p, uint64_t now) {
  if (qp.state != QpState::rts && qp.state != QpState::sqd && qp.state != QpState::sqe) {
    ++qp.counters.dropped;
    return;
  }
  const OpInfo& op = p.info();
  AckType type = op.has(kAeth) ? syndrome_type(p.aeth.syndrome) : AckType::ack;
  bool progressed = false;

  // Walk the send queue from the oldest WQE.
  while (qp.sq_count) {
    SendWqe& w = qp.sq[qp.sq_index(qp.sq_head)];
    if (!w.started) break;
    Step s = type != AckType::ack ? match_nak(qp, w, p, progressed, now)
             : op.is(kReadResp)   ? match_read_response(qp, w, p, progressed, now)
             : op.is(kAtomicAck)  ? match_atomic_ack(qp, w, p, progressed, now)
                                  : match_ack(qp, w, p, progressed, now);
    if (s == Step::leave) return;
    if (s == Step::stop) break;
  }

  if (progressed) {
    qp.comp.probing = false;
    qp.comp.implied_nak_pending = false;
    qp.comp.seq_nak_pending = false;
    qp.comp.cur_retry_count = qp.attr.retry_cnt;
    qp.comp.cur_rnr_retry = qp.attr.rnr_retry;
    // The oldest unacknowledged PSN: the head WQE's first one (or later, after a partial ACK), or
    // the next to send when nothing started is outstanding (else the window would stay shut).
    const SendWqe* h = qp.sq_count ? &qp.sq[qp.sq_index(qp.sq_head)] : nullptr;
    if (!h || !h->started) {
      qp.comp.una_psn = qp.req.next_send_psn;
    } else if (psn_diff(h->first_psn, qp.comp.una_psn) > 0) {
      qp.comp.una_psn = h->first_psn;
    }
    arm_retrans(qp, now);
  }
  requester_progress(qp, now);
}

void EngineImpl::on_timer(Qp& qp, uint64_t now) {
  if (qp.req.rnr_deadline && now >= qp.req.rnr_deadline) {
    qp.req.rnr_deadline = 0;
    arm_retrans(qp, now);
    requester_progress(qp, now);
  }
  if (qp.comp.retrans_deadline && now >= qp.comp.retrans_deadline) {
    qp.comp.retrans_deadline = 0;
    if (!qp.sq_count) return;
    SendWqe& w = qp.sq[qp.sq_index(qp.sq_head)];
    if (!w.started) {  // nothing on the wire: just move on
      requester_progress(qp, now);
      return;
    }
    ++qp.counters.timeouts;
    if (qp.comp.cur_retry_count == 0) {
      fail_wqe(qp, w, outcome_row(Outcome::retry_exceeded).requester_wc);
      return;
    }
    --qp.comp.cur_retry_count;
    ++qp.counters.retransmits;
    qp.comp.read_gap_pending = false;
    qp.comp.implied_nak_pending = false;
    qp.comp.seq_nak_pending = false;
    rewind(qp, w.wr.opcode == WrOpcode::rdma_read ? w.read_next_psn : qp.comp.una_psn);
    qp.comp.probing = true;
    qp.comp.probe_psn = qp.req.next_send_psn;
    arm_retrans(qp, now);
    requester_progress(qp, now);
  }
}

}  // namespace melon::rc
