// Responder (IBA 9.7.5.1) as rxe and the spec read it: a chain of checks, each a small function
// returning a named Outcome (rc/outcome.h) - PSN, opcode sequence, length, key and access,
// resources - then execute, then acknowledge. Any outcome but ok goes to respond(), which acts on
// the outcome table's row: the NAK, the receive WQE's status, the event, ERR. UC runs the same
// chain without answers (an error abandons the message); UD has its own short path.
#include <string.h>

#include "rc/engine_impl.h"
#include "rc/scatter_gather.h"
#include "roce/aeth.h"
#include "roce/psn.h"

namespace melon::rc {

using namespace roce;

bool fill_recv_wqe(RecvWqe& w, const RecvWr& wr, uint32_t max_sge) {
  if (wr.num_sge < 0 || uint32_t(wr.num_sge) > max_sge) return false;
  if (wr.num_sge && !wr.sg_list) return false;
  w.wr_id = wr.wr_id;
  w.nseg = 0;
  w.length = 0;
  w.bad = false;
  for (int i = 0; i < wr.num_sge; ++i) {
    const Sge& s = wr.sg_list[i];
    if (!s.length) continue;
    w.seg[w.nseg++] = {s.addr, s.length, s.lkey};
    w.length += s.length;
  }
  return true;
}

bool recv_wqe_writable(const RecvWqe& w, HostMemory& mem, uint32_t pd) {
  for (int i = 0; i < w.nseg; ++i)
    if (check_range(mem, KeyKind::local, pd, w.seg[i].lkey, w.seg[i].addr, w.seg[i].len, kLocalWrite) != MemStatus::ok)
      return false;
  return true;
}

void EngineImpl::write_ack(Qp& qp, uint8_t syndrome, uint32_t psn, uint32_t msn) {
  TxPacket tx;
  fill_tx_common(qp, tx, make_opcode(Transport::rc, kAcknowledge), psn);
  tx.pkt.aeth.syndrome = syndrome;
  tx.pkt.aeth.msn = msn & kPsnMask;
  ++qp.counters.tx_packets;
  link_.transmit(tx);
}

// Responses of one QP leave in PSN order: an ACK still owed from this batch goes before a NAK, a
// READ response or an atomic ACK; and while READ responses or atomic ACKs of earlier requests are
// still to go (answer()), the ACKs and NAKs of later ones wait for them.
void EngineImpl::flush_ack(Qp& qp) {
  if (!qp.resp.ack_pending || answering(qp)) return;
  qp.resp.ack_pending = false;
  write_ack(qp, syndrome_ack(), qp.resp.ack_psn, qp.resp.ack_msn);
}

void EngineImpl::send_ack(Qp& qp, uint8_t syndrome, uint32_t psn) {
  ResponderState& r = qp.resp;
  if (answering(qp)) {
    if (syndrome == syndrome_ack()) {
      r.ack_pending = true;
      r.ack_psn = psn;
      r.ack_msn = r.rmsn;
    } else {
      r.nak_owed = true;
      r.nak_syndrome = syndrome;
      r.nak_psn = psn;
    }
    return;
  }
  flush_ack(qp);
  write_ack(qp, syndrome, psn, r.rmsn);
}

bool EngineImpl::answering(const Qp& qp) const { return qp.resp.answer_at != 0; }

bool EngineImpl::push_recv_wc(Qp& qp, const Wc& wc) {
  if (qp.init.recv_cq && qp.init.recv_cq->push(wc)) return true;
  raise(qp, AsyncEvent::cq_err);
  to_error(qp);
  return false;
}

namespace {

uint32_t read_packets(uint32_t len, uint32_t mtu) { return len == 0 ? 1 : (len + mtu - 1) / mtu; }

// Response packet `i` of the READ `r`. A re-issued READ (a duplicate whose PSN lies inside the
// original, IBA 9.7.5.1.5) is answered as the continuation of the original: MIDDLE/LAST, not
// FIRST/ONLY, as Linux rxe and ConnectX do. False: the region is gone.
bool send_read_response(EngineImpl& e, Qp& qp, const Resource& r, uint32_t i) {
  const uint32_t total = read_packets(r.len, qp.mtu);
  BaseOp b = total == 1 ? kReadRespOnly : i == 0 ? kReadRespFirst : i + 1 >= total ? kReadRespLast : kReadRespMiddle;
  TxPacket tx;
  e.fill_tx_common(qp, tx, make_opcode(Transport::rc, b), psn_add(r.first_psn, int32_t(i)));
  tx.pkt.aeth.syndrome = syndrome_ack();
  tx.pkt.aeth.msn = qp.resp.rmsn & kPsnMask;
  uint64_t off = uint64_t(i) * qp.mtu;
  uint32_t chunk = r.len - off < qp.mtu ? uint32_t(r.len - off) : qp.mtu;
  // The range was checked when the request arrived; a region gone since ends the responses (the
  // requester's timer re-issues and then meets the access error).
  if (append_spans(e.mem_, KeyKind::remote, qp.init.pd, r.rkey, r.va + off, chunk, kRemoteRead, tx, r.len - off) !=
      MemStatus::ok)
    return false;
  ++qp.counters.tx_packets;
  e.link_.transmit(tx);
  return true;
}

void send_atomic_ack(EngineImpl& e, Qp& qp, uint32_t psn, uint64_t orig) {
  TxPacket tx;
  e.fill_tx_common(qp, tx, make_opcode(Transport::rc, kAtomicAcknowledge), psn);
  tx.pkt.aeth.syndrome = syndrome_ack();
  tx.pkt.aeth.msn = qp.resp.rmsn & kPsnMask;
  tx.pkt.atomic_orig = orig;
  ++qp.counters.tx_packets;
  e.link_.transmit(tx);
}

Resource* find_resource(Qp& qp, uint32_t psn) {
  for (auto& r : qp.resp.resources)
    if (r.valid && psn_diff(psn, r.first_psn) >= 0 && psn_diff(psn, r.last_psn) <= 0) return &r;
  return nullptr;
}

Resource& new_resource(Qp& qp) {
  Resource& r = qp.resp.resources[qp.resp.res_next];
  qp.resp.res_next = (qp.resp.res_next + 1) % uint32_t(qp.resp.resources.size());
  r = Resource{};
  r.valid = true;
  return r;
}

// A re-issued request: the requester went back to it (go-back-N), so it re-issues every later
// READ/atomic as well; their answers still to go are dropped and come again with those.
void rewind_after(Qp& qp, const Resource& from) {
  const uint32_t n = uint32_t(qp.resp.resources.size());
  for (uint32_t k = 0; k < n; ++k) {
    Resource& r = qp.resp.resources[k];
    if (r.answering() && psn_diff(r.first_psn, from.first_psn) > 0) r.next = r.stop;
  }
}

// ---- the checks (IBA 9.7.5.1), in chain order --------------------------------------------------

// PSN (9.7.5.1.1): the expected one is executed, an earlier one is a duplicate, a later one means
// packets were lost.
Outcome check_psn(const Qp& qp, const Packet& p) {
  int32_t d = psn_diff(p.bth.psn, qp.resp.next_rcv_psn);
  return d == 0 ? Outcome::ok : d < 0 ? Outcome::duplicate : Outcome::psn_sequence_error;
}

// UC (9.7.5.1.1 without answers): a gap abandons the message in progress; the responder resyncs on
// the next FIRST/ONLY and drops everything until then.
Outcome check_psn_uc(Qp& qp, const Packet& p) {
  ResponderState& r = qp.resp;
  const bool start = p.info().is(kStart);
  if (p.bth.psn != r.next_rcv_psn) {
    r.in_send = r.in_write = false;
    r.recv_offset = 0;
    if (!start) {
      r.uc_drop = true;
      return Outcome::psn_sequence_error;
    }
    r.next_rcv_psn = p.bth.psn;
  }
  if (r.uc_drop && !start) {
    r.next_rcv_psn = psn_add(p.bth.psn, 1);
    return Outcome::psn_sequence_error;
  }
  r.uc_drop = false;
  return Outcome::ok;
}

// Opcode sequence (9.7.5.1.3, C9-92): MIDDLE/LAST only inside a message of their kind, and nothing
// else while one is in progress.
Outcome check_opcode_sequence(const Qp& qp, const Packet& p) {
  const OpInfo& op = p.info();
  const bool send = op.is(kSend), write = op.is(kWrite), start = op.is(kStart);
  const ResponderState& r = qp.resp;
  if (r.in_send) return send && !start ? Outcome::ok : Outcome::opcode_sequence_error;
  if (r.in_write) return write && !start ? Outcome::ok : Outcome::opcode_sequence_error;
  return (send || write) && !start ? Outcome::opcode_sequence_error : Outcome::ok;
}

// Length (9.7.5.1.4, C9-87): FIRST and MIDDLE carry exactly one MTU, LAST and ONLY at most one; an
// RDMA WRITE carries exactly the RETH's DMA length in all; no message is longer than 2^31 bytes.
Outcome check_length(const Qp& qp, const Packet& p) {
  const OpInfo& op = p.info();
  if ((op.is(kReadReq) || (op.is(kWrite) && op.is(kStart))) && p.reth.dma_len > kMaxMessage)
    return Outcome::message_too_long;
  if (!op.is(kSend) && !op.is(kWrite)) return Outcome::ok;
  if (op.is(kEnd) ? p.payload_len > qp.mtu : p.payload_len != qp.mtu) return Outcome::length_error;
  if (op.is(kWrite)) {
    uint64_t done = op.is(kStart) ? 0 : qp.resp.write_offset;
    uint64_t total = op.is(kStart) ? p.reth.dma_len : qp.resp.write_total;
    if (done + p.payload_len > total || (op.is(kEnd) && done + p.payload_len != total)) return Outcome::length_error;
  }
  return Outcome::ok;
}

// Key and access (9.7.5.1.5, C9-88; C9-37 for atomics): the QP's access flags, then the R_Key's
// region (PD, range, rights) for the whole DMA length, checked once at the start of the message.
Outcome check_access(EngineImpl& e, const Qp& qp, const Packet& p) {
  const OpInfo& op = p.info();
  auto key_ok = [&](uint32_t rkey, uint64_t va, uint32_t len, uint32_t access) {
    return len == 0 || check_range(e.mem_, KeyKind::remote, qp.init.pd, rkey, va, len, access) == MemStatus::ok;
  };
  const uint32_t allowed = qp.attr.qp_access_flags;
  if (op.is(kWrite) && op.is(kStart)) {
    if (!(allowed & kRemoteWrite) || !key_ok(p.reth.rkey, p.reth.va, p.reth.dma_len, kRemoteWrite))
      return Outcome::remote_access_error;
  } else if (op.is(kReadReq)) {
    if (!(allowed & kRemoteRead) || !key_ok(p.reth.rkey, p.reth.va, p.reth.dma_len, kRemoteRead))
      return Outcome::remote_access_error;
  } else if (op.is(kAtomic)) {
    if (!(allowed & kRemoteAtomic)) return Outcome::remote_access_error;
    if (p.atomic.va & 7) return Outcome::misaligned_atomic;
    if (!key_ok(p.atomic.rkey, p.atomic.va, 8, kRemoteAtomic)) return Outcome::remote_access_error;
  }
  return Outcome::ok;
}

bool needs_recv_wqe(const OpInfo& op) { return op.is(kSend) || (op.is(kWrite) && op.is(kImm) && op.is(kEnd)); }

// Resources (9.7.5.1.6): a receive WQE for a SEND (or a WRITE with immediate), a responder resource
// for a READ or an atomic.
Outcome check_resources(Qp& qp, const Packet& p) {
  const OpInfo& op = p.info();
  if (needs_recv_wqe(op) && !qp.resp.have_wqe && qp.recv_queue().empty()) return Outcome::rnr;
  if (op.is(kReadReq) || op.is(kAtomic)) {
    if (qp.resp.resources.empty()) return Outcome::no_rd_atomic_resources;
    // The oldest resource, which this request would take, is still being answered: the peer has
    // more READ/atomic requests outstanding than max_dest_rd_atomic allows. A NAK, not a lost replay
    // entry (C9-98, o9-22). A finished one is free: the requester issues request N+1 only once it
    // has the answers of the oldest.
    if (qp.resp.resources[qp.resp.res_next].answering()) return Outcome::too_many_rd_atomic;
  }
  return Outcome::ok;
}

}  // namespace

// ---- acting on outcomes ------------------------------------------------------------------------

void EngineImpl::respond(Qp& qp, const Packet& p, Outcome o) {
  const OutcomeRow& row = outcome_row(o);
  ResponderState& r = qp.resp;
  if (o != Outcome::rnr) ++qp.counters.dropped;
  // A receive WQE the message had taken completes with the row's status (flushes come from ERR).
  if (r.have_wqe && row.responder_wc != WcStatus::success && row.responder_wc != WcStatus::wr_flush_err) {
    r.have_wqe = false;
    Wc wc;
    wc.wr_id = r.cur_wqe.wr_id;
    wc.status = row.responder_wc;
    wc.opcode = WcOpcode::recv;
    wc.qp_num = qp.qpn;
    if (!push_recv_wc(qp, wc)) return;
  }
  if (qp.init.type != QpType::rc) {  // UC: no answers; the message is abandoned
    if (o != Outcome::psn_sequence_error) {
      r.in_send = r.in_write = false;
      r.uc_drop = true;
    }
    return;
  }
  // A NAK that ends the QP goes now: nothing of it is answered after (to_error drops the rest).
  if (row.responder_to_error) r.answer_at = 0;
  switch (row.reply) {
    case Reply::nak:
      if (o == Outcome::psn_sequence_error) {  // C9-100: once, naming the expected PSN
        if (r.nak_sent) break;
        r.nak_sent = true;
        ++qp.counters.seq_naks_sent;
        send_ack(qp, syndrome_nak(row.nak), r.next_rcv_psn);
      } else {
        send_ack(qp, syndrome_nak(row.nak), p.bth.psn);
      }
      break;
    case Reply::rnr_nak:
      ++qp.counters.rnr_naks_sent;
      send_ack(qp, syndrome_rnr(qp.attr.min_rnr_timer), p.bth.psn);
      break;
    default: break;
  }
  if (row.responder_event) raise(qp, row.event);
  if (row.responder_to_error) to_error(qp);
}

// C9-105: re-ACK a SEND/WRITE, serve a READ again from the region as it is now, replay an atomic's
// original value from the cache. Nothing is executed twice.
void EngineImpl::answer_duplicate(Qp& qp, const Packet& p) {
  const OpInfo& op = p.info();
  const uint32_t psn = p.bth.psn;
  ++qp.counters.duplicates;
  if (op.is(kReadReq)) {
    Resource* r = find_resource(qp, psn);
    if (!r || r->atomic) return void(++qp.counters.dropped);
    uint64_t skip = uint64_t(psn_diff(psn, r->first_psn)) * qp.mtu;
    if (p.reth.va != r->va + skip || uint64_t(p.reth.dma_len) + skip > r->len) return void(++qp.counters.dropped);
    if (p.reth.dma_len && check_range(mem_, KeyKind::remote, qp.init.pd, p.reth.rkey, p.reth.va, p.reth.dma_len,
                                      kRemoteRead) != MemStatus::ok)
      return void(++qp.counters.dropped);
    const uint32_t first = uint32_t(psn_diff(psn, r->first_psn));
    rewind_after(qp, *r);
    r->rkey = p.reth.rkey;
    r->next = first;
    r->stop = first + read_packets(p.reth.dma_len, qp.mtu);
    return answer(qp, now());
  }
  if (op.is(kAtomic)) {
    Resource* r = find_resource(qp, psn);
    if (!r || !r->atomic || r->first_psn != psn) return void(++qp.counters.dropped);
    rewind_after(qp, *r);
    r->next = 0;
    r->stop = 1;
    return answer(qp, now());
  }
  send_ack(qp, syndrome_ack(), psn_add(qp.resp.next_rcv_psn, -1));
}

// UD (10.2.5, 11.4.1.2): one packet per message, the Q_Key checked, the GRH placed first; no
// answers, so an error loses the datagram.
void EngineImpl::receive_datagram(Qp& qp, const IpUdp& ip, const Packet& p) {
  const OpInfo& op = p.info();
  if (p.deth.qkey != qp.attr.qkey) return respond(qp, p, Outcome::qkey_violation);
  RecvQueue& rq = qp.recv_queue();
  if (rq.empty()) return void(++qp.counters.dropped);  // UD has no RNR
  const uint32_t total = uint32_t(kGrhSize) + p.payload_len;
  if (total > rq.front().length) return void(++qp.counters.dropped);
  RecvWqe w = rq.front();
  rq.pop();
  uint8_t grh[kGrhSize];
  write_ud_grh(ip, op.hdr_len + p.payload_len + pad_for(p.payload_len) + kIcrcSize, grh);
  const uint32_t pd = recv_pd(qp);
  Wc wc;
  wc.wr_id = w.wr_id;
  wc.opcode = WcOpcode::recv;
  wc.qp_num = qp.qpn;
  if (!recv_wqe_writable(w, mem_, pd) || scatter(mem_, pd, w.seg, w.nseg, 0, grh, kGrhSize) != MemStatus::ok ||
      scatter(mem_, pd, w.seg, w.nseg, kGrhSize, p.payload, p.payload_len) != MemStatus::ok) {
    // A local protection error completes the WQE in error and ends the QP (10.6.3).
    wc.status = outcome_row(Outcome::recv_protection_error).responder_wc;
    if (push_recv_wc(qp, wc)) to_error(qp);
    return;
  }
  wc.byte_len = total;
  wc.src_qp = p.deth.src_qp;
  wc.sl = ip.v6 ? kRoceV2Ipv6 : kRoceV2Ipv4;
  wc.wc_flags = kWcGrh | (op.is(kImm) ? kWcWithImm : 0);
  wc.imm = p.imm;
  wc.solicited = p.bth.se;
  push_recv_wc(qp, wc);
}

uint32_t EngineImpl::recv_pd(const Qp& qp) const { return qp.srq() ? qp.srq()->pd : qp.init.pd; }

// Takes the next receive WQE for the message starting now; its buffers are checked as they are now
// (10.6.3: the rights in force when the data is placed).
void EngineImpl::take_recv_wqe(Qp& qp) {
  ResponderState& r = qp.resp;
  RecvQueue& rq = qp.recv_queue();
  r.cur_wqe = rq.front();
  rq.pop();
  r.have_wqe = true;
  r.recv_offset = 0;
  r.data_inline = false;
  r.cur_wqe.bad = !recv_wqe_writable(r.cur_wqe, mem_, recv_pd(qp));
  if (Srq* s = qp.srq(); s && s->limit && s->rq.size() < s->limit) {
    s->limit = 0;  // one-shot, re-armed by modify_srq (IBA 10.2.9.3)
    if (events_) events_->srq_event(s->srqn, AsyncEvent::srq_limit_reached);
  }
}

// Executes a request that passed every check. Placement can still fail (the receive WQE is too
// short or not writable, a region went away): that outcome is returned.
Outcome EngineImpl::execute(Qp& qp, const Packet& p) {
  const OpInfo& op = p.info();
  ResponderState& r = qp.resp;
  const uint32_t psn = p.bth.psn;
  if (needs_recv_wqe(op) && !r.have_wqe) take_recv_wqe(qp);
  if (op.is(kSend)) {
    if (r.cur_wqe.bad) return Outcome::recv_protection_error;
    if (uint64_t(r.recv_offset) + p.payload_len > r.cur_wqe.length) return Outcome::recv_length_error;
    if (op.is(kStart) && op.is(kEnd) && p.payload_len <= qp.init.scatter_to_wc && !qp.srq()) {
      // Kept for the completion (scatter to CQE); the keys were checked when the WQE was taken.
      memcpy(r.inline_data, p.payload, p.payload_len);
      r.data_inline = true;
    } else if (scatter(mem_, recv_pd(qp), r.cur_wqe.seg, r.cur_wqe.nseg, r.recv_offset, p.payload, p.payload_len) !=
               MemStatus::ok) {
      return Outcome::recv_protection_error;
    }
    r.recv_offset += p.payload_len;
    r.in_send = !op.is(kEnd);
    return Outcome::ok;
  }
  if (op.is(kWrite)) {
    if (op.is(kStart)) {
      r.write_total = p.reth.dma_len;
      r.write_offset = 0;
      r.write_va = p.reth.va;
      r.write_rkey = p.reth.rkey;
    }
    if (p.payload_len && copy_in(mem_, KeyKind::remote, qp.init.pd, r.write_rkey, r.write_va + r.write_offset,
                                 p.payload, p.payload_len, kRemoteWrite) != MemStatus::ok)
      return Outcome::remote_access_error;
    r.write_offset += p.payload_len;
    r.in_write = !op.is(kEnd);
    return Outcome::ok;
  }
  if (op.is(kReadReq)) {
    uint32_t n = read_packets(p.reth.dma_len, qp.mtu);
    Resource& res = new_resource(qp);
    res.first_psn = psn;
    res.last_psn = psn_add(psn, int32_t(n - 1));
    res.va = p.reth.va;
    res.rkey = p.reth.rkey;
    res.len = p.reth.dma_len;
    res.stop = n;
    ++r.rmsn;
    r.next_rcv_psn = psn_add(psn, int32_t(n));
    ++qp.counters.rx_packets;
    answer(qp, now());
    return Outcome::ok;
  }
  // Atomic (9.4.5): one 8-byte word, executed once; the original value is kept for duplicates.
  Span t;
  if (mem_.map(KeyKind::remote, qp.init.pd, p.atomic.rkey, p.atomic.va, 8, kRemoteAtomic, &t) != MemStatus::ok ||
      t.len < 8)
    return Outcome::remote_access_error;
  uint64_t* target = reinterpret_cast<uint64_t*>(t.ptr);
  uint64_t orig;
  if (p.bth.opcode == make_opcode(Transport::rc, kCompareSwap)) {
    orig = p.atomic.compare;
    __atomic_compare_exchange_n(target, &orig, p.atomic.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  } else {
    orig = __atomic_fetch_add(target, p.atomic.swap_add, __ATOMIC_SEQ_CST);
  }
  Resource& res = new_resource(qp);
  res.atomic = true;
  res.first_psn = res.last_psn = psn;
  res.va = p.atomic.va;
  res.rkey = p.atomic.rkey;
  res.orig = orig;
  res.stop = 1;
  ++r.rmsn;
  r.next_rcv_psn = psn_add(psn, 1);
  ++qp.counters.rx_packets;
  answer(qp, now());
  return Outcome::ok;
}

// One turn of answers, oldest resource first: at most max_read_burst packets, then the next turn at
// the next tick. Once every resource is answered, the ACK and NAK that waited behind them go.
void EngineImpl::answer(Qp& qp, uint64_t now) {
  ResponderState& s = qp.resp;
  s.answer_at = 0;
  uint32_t budget = cfg_.max_read_burst ? cfg_.max_read_burst : 1;
  const uint32_t n = uint32_t(s.resources.size());
  for (uint32_t k = 0; k < n; ++k) {
    Resource& r = s.resources[(s.res_next + k) % n];
    if (!r.answering()) continue;
    if (s.ack_pending && psn_diff(s.ack_psn, r.first_psn) < 0) {  // an earlier request's ACK first
      s.ack_pending = false;
      write_ack(qp, syndrome_ack(), s.ack_psn, s.ack_msn);
    }
    for (; r.answering() && budget; --budget, ++r.next) {
      if (r.atomic) {
        send_atomic_ack(*this, qp, r.first_psn, r.orig);
      } else if (!send_read_response(*this, qp, r, r.next)) {
        r.next = r.stop;
        break;
      }
    }
    if (r.answering()) {
      s.answer_at = now + 1;  // a later time, so tick() returns between turns
      return;
    }
  }
  if (s.ack_pending) {
    s.ack_pending = false;
    write_ack(qp, syndrome_ack(), s.ack_psn, s.ack_msn);
  }
  if (s.nak_owed) {
    s.nak_owed = false;
    write_ack(qp, s.nak_syndrome, s.nak_psn, s.rmsn);
  }
}

// A SEND or WRITE packet was placed: advance, complete the message at its end, ACK when asked.
void EngineImpl::acknowledge(Qp& qp, const Packet& p) {
  const OpInfo& op = p.info();
  ResponderState& r = qp.resp;
  ++qp.counters.rx_packets;
  r.next_rcv_psn = psn_add(p.bth.psn, 1);
  if (op.is(kEnd)) {
    ++r.rmsn;
    if (r.have_wqe) {
      Wc wc;
      wc.wr_id = r.cur_wqe.wr_id;
      wc.opcode = op.is(kSend) ? WcOpcode::recv : WcOpcode::recv_rdma_with_imm;
      wc.byte_len = op.is(kSend) ? r.recv_offset : r.write_total;
      wc.qp_num = qp.qpn;
      wc.src_qp = qp.attr.dest_qp_num;
      wc.solicited = p.bth.se;
      if (op.is(kSend) && r.data_inline) {
        wc.data_inline = true;
        memcpy(wc.inline_data, r.inline_data, wc.byte_len);
        r.data_inline = false;
      }
      if (op.is(kImm)) {
        wc.wc_flags |= kWcWithImm;
        wc.imm = p.imm;
      }
      if (op.is(kInv)) {
        wc.wc_flags |= kWcWithInv;
        wc.imm = p.ieth_rkey;
        mem_.invalidate(qp.init.pd, p.ieth_rkey);
      }
      r.have_wqe = false;
      r.recv_offset = 0;
      if (!push_recv_wc(qp, wc)) return;
    }
  }
  if (qp.init.type != QpType::rc || !p.bth.ack_req) return;
  // IBA 9.7.5.1: an ACK acknowledges its PSN and every earlier one, and a responder may coalesce
  // them; so inside a receive batch one ACK for the newest AckReq'd packet answers them all, sent
  // when the batch ends, well within the requester's timeout. NAKs are never held back (send_ack).
  if (!in_batch_) return send_ack(qp, syndrome_ack(), p.bth.psn);
  if (r.ack_pending)
    ++qp.counters.acks_coalesced;
  else
    ack_owed_.push_back(qp.qpn);
  r.ack_pending = true;
  r.ack_psn = p.bth.psn;
  r.ack_msn = r.rmsn;
}

void EngineImpl::on_request(Qp& qp, const IpUdp& ip, const Packet& p) {
  if (qp.state != QpState::rtr && qp.state != QpState::rts && qp.state != QpState::sqd && qp.state != QpState::sqe)
    return void(++qp.counters.dropped);
  if (qp.init.type == QpType::ud) return receive_datagram(qp, ip, p);
  const OpInfo& op = p.info();
  if (!op.is(kSend) && !op.is(kWrite) && !op.is(kReadReq) && !op.is(kAtomic)) return void(++qp.counters.dropped);
  const bool rc = qp.init.type == QpType::rc;

  Outcome o = rc ? check_psn(qp, p) : check_psn_uc(qp, p);
  if (o == Outcome::duplicate) return answer_duplicate(qp, p);
  if (o == Outcome::ok) {
    qp.resp.nak_sent = false;
    o = check_opcode_sequence(qp, p);
  }
  if (o == Outcome::ok) o = check_length(qp, p);
  if (o == Outcome::ok) o = check_access(*this, qp, p);
  if (o == Outcome::ok) o = check_resources(qp, p);
  if (o == Outcome::ok) o = execute(qp, p);
  if (o != Outcome::ok) return respond(qp, p, o);
  if (op.is(kSend) || op.is(kWrite)) acknowledge(qp, p);
}

}  // namespace melon::rc
