// Responder (IBA 9.7.5): checks PSNs, answers duplicates (C9-105), places SEND payload into
// receive WQEs, executes RDMA WRITE/READ and atomics through the memory interface, and ACKs/NAKs.
// UC and UD use the same receive path without ACKs.
#include <string.h>

#include "rc/engine_impl.h"
#include "roce/aeth.h"
#include "roce/psn.h"

namespace melon::rc {

using namespace roce;

bool fill_recv_wqe(PostedRecv& w, const RecvWr& wr, uint32_t max_sge) {
  if (wr.num_sge < 0 || uint32_t(wr.num_sge) > max_sge || wr.num_sge > PostedRecv::kMaxSge) return false;
  if (wr.num_sge && !wr.sg_list) return false;
  w.wr_id = wr.wr_id;
  w.nsge = 0;
  for (int i = 0; i < wr.num_sge; ++i)
    if (wr.sg_list[i].length) w.sge[w.nsge++] = wr.sg_list[i];
  return true;
}

void resolve_recv(RecvWqe& w, const PostedRecv& in, Memory& mem, uint32_t pd) {
  w.wr_id = in.wr_id;
  w.nseg = 0;
  w.length = 0;
  w.bad = false;
  for (int i = 0; i < in.nsge; ++i) {
    const Sge& s = in.sge[i];
    uint8_t* p = mem.local(pd, s.lkey, s.addr, s.length, kLocalWrite);
    if (!p) w.bad = true;
    w.seg[w.nseg++] = {p, s.length};
    w.length += s.length;
  }
}

void copy_to_segments(const RecvWqe::Seg* seg, int nseg, uint32_t off, const uint8_t* src, uint32_t len) {
  for (int i = 0; i < nseg && len; ++i) {
    const auto& s = seg[i];
    if (off >= s.len) {
      off -= s.len;
      continue;
    }
    uint32_t n = s.len - off < len ? s.len - off : len;
    memcpy(s.ptr + off, src, n);
    src += n;
    len -= n;
    off = 0;
  }
}

bool scatter(const RecvWqe& w, uint32_t off, const uint8_t* src, uint32_t len) {
  if (uint64_t(off) + len > w.length) return false;
  copy_to_segments(w.seg, w.nseg, off, src, len);
  return true;
}

void EngineImpl::send_ack(Qp& qp, uint8_t syndrome, uint32_t psn) {
  TxPacket tx;
  fill_tx_common(qp, tx, make_opcode(Transport::rc, kAcknowledge), psn);
  tx.pkt.aeth.syndrome = syndrome;
  tx.pkt.aeth.msn = qp.msn & kPsnMask;
  ++qp.counters.tx_packets;
  link_.transmit(tx);
}

uint32_t EngineImpl::recv_pd(const Qp& qp) const { return qp.srq() ? qp.srq()->pd : qp.init.pd; }

Wc EngineImpl::recv_error(const Qp& qp, uint64_t wr_id, WcStatus status) const {
  Wc wc;
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = WcOpcode::recv;
  wc.qp_num = qp.qpn;
  return wc;
}

bool EngineImpl::push_recv_wc(Qp& qp, const Wc& wc) {
  if (qp.init.recv_cq && qp.init.recv_cq->push(wc)) return true;
  raise(qp, AsyncEvent::cq_err);
  to_error(qp);
  return false;
}

namespace {

// Serves READ responses for `len` bytes from host memory `src`, as packets `first`.. of a READ
// whose responses number `total` and start at PSN `psn0`. A re-issued READ (a duplicate whose PSN
// lies inside the original, IBA 9.7.5.1.5) is answered as the continuation of the original:
// MIDDLE/LAST, not FIRST/ONLY, as Linux rxe and ConnectX do.
void send_read_responses(EngineImpl& e, Qp& qp, const uint8_t* src, uint32_t len, uint32_t psn0, uint32_t first,
                         uint32_t total) {
  uint32_t n = len == 0 ? 1 : (len + qp.mtu - 1) / qp.mtu;
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t i = first + k;
    BaseOp b = total == 1 ? kReadRespOnly : i == 0 ? kReadRespFirst : i + 1 >= total ? kReadRespLast : kReadRespMiddle;
    TxPacket tx;
    e.fill_tx_common(qp, tx, make_opcode(Transport::rc, b), psn_add(psn0, int32_t(i)));
    tx.pkt.aeth.syndrome = syndrome_ack();
    tx.pkt.aeth.msn = qp.msn & kPsnMask;
    uint32_t off = k * qp.mtu;
    uint32_t chunk = len - off < qp.mtu ? len - off : qp.mtu;
    if (chunk) {
      tx.iov[0] = Iov{src + off, chunk};
      tx.niov = 1;
    }
    tx.payload_len = chunk;
    ++qp.counters.tx_packets;
    e.link_.transmit(tx);
  }
}

uint32_t read_packets(uint32_t len, uint32_t mtu) { return len == 0 ? 1 : (len + mtu - 1) / mtu; }

void send_atomic_ack(EngineImpl& e, Qp& qp, uint32_t psn, uint64_t orig) {
  TxPacket tx;
  e.fill_tx_common(qp, tx, make_opcode(Transport::rc, kAtomicAcknowledge), psn);
  tx.pkt.aeth.syndrome = syndrome_ack();
  tx.pkt.aeth.msn = qp.msn & kPsnMask;
  tx.pkt.atomic_orig = orig;
  ++qp.counters.tx_packets;
  e.link_.transmit(tx);
}

Resource* find_resource(Qp& qp, uint32_t psn) {
  for (auto& r : qp.resources)
    if (r.valid && psn_diff(psn, r.first_psn) >= 0 && psn_diff(psn, r.last_psn) <= 0) return &r;
  return nullptr;
}

Resource& new_resource(Qp& qp) {
  Resource& r = qp.resources[qp.res_next];
  qp.res_next = (qp.res_next + 1) % uint32_t(qp.resources.size());
  r = Resource{};
  r.valid = true;
  return r;
}

}  // namespace

void EngineImpl::on_request(Qp& qp, const IpUdp& ip, const Packet& p, uint64_t now) {
  const QpType type = qp.init.type;
  const OpInfo& op = p.info();
  const uint32_t psn = p.bth.psn;
  const bool rc = type == QpType::rc;
  auto drop = [&] { ++qp.counters.dropped; };
  auto nak = [&](NakCode c) {  // Class B/C/D: NAK and the responder QP goes to ERR
    send_ack(qp, syndrome_nak(c), psn);
    to_error(qp);
  };

  if (qp.state != QpState::rtr && qp.state != QpState::rts && qp.state != QpState::sqd && qp.state != QpState::sqe)
    return drop();

  // ---- UD: one packet per message, Q_Key checked, GRH first (IBA 10.2.5, 11.4.1.2).
  if (type == QpType::ud) {
    if (p.deth.qkey != qp.attr.qkey) return drop();
    RecvQueue& rq = qp.recv_queue();
    if (rq.empty()) return drop();  // UD has no RNR: the datagram is lost
    RecvWqe w;
    resolve_recv(w, rq.front(), mem_, recv_pd(qp));
    uint32_t total = uint32_t(kGrhSize) + p.payload_len;
    if (w.bad) {  // a local protection error completes the WQE in error and ends the QP
      rq.pop();
      push_recv_wc(qp, recv_error(qp, w.wr_id, WcStatus::loc_prot_err));
      return to_error(qp);
    }
    if (total > w.length) return drop();
    rq.pop();
    uint8_t grh[kGrhSize];
    write_ud_grh(ip, op.hdr_len + p.payload_len + pad_for(p.payload_len) + kIcrcSize, grh);
    scatter(w, 0, grh, kGrhSize);
    scatter(w, kGrhSize, p.payload, p.payload_len);
    Wc wc;
    wc.wr_id = w.wr_id;
    wc.opcode = WcOpcode::recv;
    wc.byte_len = total;
    wc.qp_num = qp.qpn;
    wc.src_qp = p.deth.src_qp;
    wc.wc_flags = kWcGrh | (op.is(kImm) ? kWcWithImm : 0);
    wc.imm = p.imm;
    wc.solicited = p.bth.se;
    push_recv_wc(qp, wc);
    return;
  }

  // ---- PSN check (IBA 9.7.5.1.1; UC: 9.7.5.1.1 applies without NAKs).
  int32_t d = psn_diff(psn, qp.epsn);
  if (!rc) {
    if (d != 0) {  // a lost packet: the message in progress is abandoned, resync on FIRST/ONLY
      qp.in_send = qp.in_write = false;
      qp.recv_offset = 0;
      if (!op.is(kStart)) {
        qp.uc_drop = true;
        return drop();
      }
      qp.epsn = psn;
    }
    if (qp.uc_drop && !op.is(kStart)) {
      qp.epsn = psn_add(psn, 1);
      return drop();
    }
    qp.uc_drop = false;
  } else if (d > 0) {
    if (!qp.nak_sent) {  // NAK once, then silence until the expected PSN arrives
      qp.nak_sent = true;
      ++qp.counters.seq_naks_sent;
      send_ack(qp, syndrome_nak(NakCode::psn_seq_error), qp.epsn);
    }
    return drop();
  } else if (d < 0) {
    // Duplicate (C9-105): re-ACK SEND/WRITE, re-serve READ, replay atomics from the cache.
    ++qp.counters.duplicates;
    if (op.is(kReadReq)) {
      Resource* r = find_resource(qp, psn);
      if (!r || r->atomic) return drop();
      uint64_t skip = uint64_t(psn_diff(psn, r->first_psn)) * qp.mtu;
      if (p.reth.va != r->va + skip || uint64_t(p.reth.dma_len) + skip > r->len) return drop();
      uint8_t* src =
          p.reth.dma_len ? mem_.remote(qp.init.pd, p.reth.rkey, p.reth.va, p.reth.dma_len, kRemoteRead) : nullptr;
      if (p.reth.dma_len && !src) return drop();
      send_read_responses(*this, qp, src, p.reth.dma_len, r->first_psn, uint32_t(psn_diff(psn, r->first_psn)),
                          read_packets(r->len, qp.mtu));
      return;
    }
    if (op.is(kAtomic)) {
      Resource* r = find_resource(qp, psn);
      if (r && r->atomic && r->first_psn == psn)
        send_atomic_ack(*this, qp, psn, r->orig);
      else
        drop();
      return;
    }
    send_ack(qp, syndrome_ack(), psn_add(qp.epsn, -1));
    return;
  }
  qp.nak_sent = false;

  // ---- Opcode sequence (IBA 9.7.5.1.3 / C9-92): MIDDLE/LAST only inside a message of that kind.
  bool send = op.is(kSend), write = op.is(kWrite);
  if ((qp.in_send && !(send && !op.is(kStart))) || (qp.in_write && !(write && !op.is(kStart))) ||
      (!qp.in_send && !qp.in_write && (send || write) && !op.is(kStart))) {
    if (rc) return nak(NakCode::invalid_request);
    qp.in_send = qp.in_write = false;
    qp.uc_drop = true;
    return drop();
  }
  // ---- Length (C9-87): FIRST/MIDDLE carry exactly one MTU, LAST/ONLY at most one.
  if ((send || write) && (op.is(kEnd) ? p.payload_len > qp.mtu : p.payload_len != qp.mtu)) {
    if (rc) return nak(NakCode::invalid_request);
    return drop();
  }

  if (send || (write && op.is(kImm) && op.is(kEnd))) {
    // Needs a receive WQE: take one at the start of a SEND (or for WRITE with immediate at its end).
    if (!qp.have_wqe) {
      RecvQueue& rq = qp.recv_queue();
      if (rq.empty()) {
        if (!rc) return drop();
        ++qp.counters.rnr_naks_sent;
        send_ack(qp, syndrome_rnr(qp.attr.min_rnr_timer), psn);
        return;
      }
      resolve_recv(qp.cur_wqe, rq.front(), mem_, recv_pd(qp));
      rq.pop();
      qp.have_wqe = true;
      qp.recv_offset = 0;
      if (Srq* s = qp.srq(); s && s->limit && s->rq.size() < s->limit) {
        s->limit = 0;  // one-shot, re-armed by modify_srq (IBA 10.2.9.3)
        if (events_) events_->srq_event(s->srqn, AsyncEvent::srq_limit_reached);
      }
    }
  }

  if (send) {
    if (qp.cur_wqe.bad || !scatter(qp.cur_wqe, qp.recv_offset, p.payload, p.payload_len)) {
      const bool prot = qp.cur_wqe.bad;
      qp.have_wqe = false;
      push_recv_wc(qp, recv_error(qp, qp.cur_wqe.wr_id, prot ? WcStatus::loc_prot_err : WcStatus::loc_len_err));
      // A receive WQE the responder cannot use (a protection error of its own) is a Remote
      // Operational Error to the requester (AETH NAK code 3, as ConnectX and rxe answer); a message
      // longer than the WQE is an Invalid Request.
      if (rc) return nak(prot ? NakCode::remote_operational_error : NakCode::invalid_request);
      qp.in_send = false;
      qp.uc_drop = true;
      return;
    }
    qp.recv_offset += p.payload_len;
    qp.in_send = !op.is(kEnd);
  } else if (write) {
    if (op.is(kStart)) {
      if (!(qp.attr.qp_access_flags & kRemoteWrite)) return rc ? nak(NakCode::remote_access_error) : drop();
      qp.write_total = p.reth.dma_len;
      qp.write_offset = 0;
      qp.write_ptr =
          p.reth.dma_len ? mem_.remote(qp.init.pd, p.reth.rkey, p.reth.va, p.reth.dma_len, kRemoteWrite) : nullptr;
      if (p.reth.dma_len && !qp.write_ptr) {
        if (rc) return nak(NakCode::remote_access_error);
        qp.uc_drop = true;
        return drop();
      }
    }
    if (uint64_t(qp.write_offset) + p.payload_len > qp.write_total ||
        (op.is(kEnd) && qp.write_offset + p.payload_len != qp.write_total)) {
      if (rc) return nak(NakCode::invalid_request);
      qp.in_write = false;
      qp.uc_drop = true;
      return drop();
    }
    if (p.payload_len) memcpy(qp.write_ptr + qp.write_offset, p.payload, p.payload_len);
    qp.write_offset += p.payload_len;
    qp.in_write = !op.is(kEnd);
  } else if (op.is(kReadReq)) {
    if (!(qp.attr.qp_access_flags & kRemoteRead)) return nak(NakCode::remote_access_error);
    if (qp.resources.empty()) return nak(NakCode::invalid_request);  // max_dest_rd_atomic 0
    uint8_t* src =
        p.reth.dma_len ? mem_.remote(qp.init.pd, p.reth.rkey, p.reth.va, p.reth.dma_len, kRemoteRead) : nullptr;
    if (p.reth.dma_len && !src) return nak(NakCode::remote_access_error);
    uint32_t n = p.reth.dma_len == 0 ? 1 : (p.reth.dma_len + qp.mtu - 1) / qp.mtu;
    Resource& r = new_resource(qp);
    r.first_psn = psn;
    r.last_psn = psn_add(psn, int32_t(n - 1));
    r.va = p.reth.va;
    r.rkey = p.reth.rkey;
    r.len = p.reth.dma_len;
    ++qp.msn;
    qp.epsn = psn_add(psn, int32_t(n));
    ++qp.counters.rx_packets;
    send_read_responses(*this, qp, src, p.reth.dma_len, psn, 0, n);
    return;
  } else if (op.is(kAtomic)) {
    if (!(qp.attr.qp_access_flags & kRemoteAtomic)) return nak(NakCode::remote_access_error);
    if (p.atomic.va & 7) return nak(NakCode::invalid_request);  // C9-37: naturally aligned
    if (qp.resources.empty()) return nak(NakCode::invalid_request);
    uint8_t* t = mem_.remote(qp.init.pd, p.atomic.rkey, p.atomic.va, 8, kRemoteAtomic);
    if (!t) return nak(NakCode::remote_access_error);
    uint64_t* target = reinterpret_cast<uint64_t*>(t);
    uint64_t orig;
    if (p.bth.opcode == make_opcode(Transport::rc, kCompareSwap)) {
      orig = p.atomic.compare;
      __atomic_compare_exchange_n(target, &orig, p.atomic.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    } else {
      orig = __atomic_fetch_add(target, p.atomic.swap_add, __ATOMIC_SEQ_CST);
    }
    Resource& r = new_resource(qp);
    r.atomic = true;
    r.first_psn = r.last_psn = psn;
    r.va = p.atomic.va;
    r.rkey = p.atomic.rkey;
    r.orig = orig;
    ++qp.msn;
    qp.epsn = psn_add(psn, 1);
    ++qp.counters.rx_packets;
    send_atomic_ack(*this, qp, psn, orig);
    return;
  } else {
    return drop();  // a response opcode sent to a responder
  }

  // SEND / WRITE packet accepted.
  ++qp.counters.rx_packets;
  qp.epsn = psn_add(psn, 1);
  if (op.is(kEnd)) {
    ++qp.msn;
    if (qp.have_wqe) {
      Wc wc;
      wc.wr_id = qp.cur_wqe.wr_id;
      wc.opcode = send ? WcOpcode::recv : WcOpcode::recv_rdma_with_imm;
      wc.byte_len = send ? qp.recv_offset : qp.write_total;
      wc.qp_num = qp.qpn;
      wc.src_qp = qp.attr.dest_qp_num;
      wc.solicited = p.bth.se;
      if (op.is(kImm)) {
        wc.wc_flags |= kWcWithImm;
        wc.imm = p.imm;
      }
      if (op.is(kInv)) {
        wc.wc_flags |= kWcWithInv;
        wc.imm = p.ieth_rkey;
        mem_.invalidate(qp.init.pd, p.ieth_rkey);
      }
      qp.have_wqe = false;
      qp.recv_offset = 0;
      if (!push_recv_wc(qp, wc)) return;
    }
  }
  if (rc && p.bth.ack_req) send_ack(qp, syndrome_ack(), psn);
  (void)now;
}

}  // namespace melon::rc
