// Requester (IBA 9.7.4): turns send WQEs into request packets. Segments by path MTU, assigns PSNs,
// asks for ACKs, keeps max_rd_atomic and the fence, and re-sends from a PSN on go-back-N.
#include <errno.h>
#include <string.h>

#include "rc/engine_impl.h"
#include "rc/scatter_gather.h"
#include "roce/psn.h"

namespace melon::rc {

using namespace roce;

namespace {

bool opcode_allowed(QpType t, WrOpcode op) {
  switch (op) {
    case WrOpcode::send:
    case WrOpcode::send_with_imm: return true;
    case WrOpcode::rdma_write:
    case WrOpcode::rdma_write_with_imm: return t != QpType::ud;
    case WrOpcode::rdma_read:
    case WrOpcode::atomic_cmp_and_swp:
    case WrOpcode::atomic_fetch_and_add:
    case WrOpcode::send_with_inv: return t == QpType::rc;
    default: return false;
  }
}

uint32_t packets_for(uint32_t len, uint32_t mtu) { return len == 0 ? 1 : (len + mtu - 1) / mtu; }

// The PSNs a WQE takes: one per request packet of a SEND/WRITE, one per response packet of a READ
// (IBA 9.7.4.1.4: a READ request consumes the PSNs of its responses), one for an atomic.
uint32_t wqe_packets(const SendWqe& w, uint32_t mtu) {
  return w.is_read_or_atomic() && w.wr.opcode != WrOpcode::rdma_read ? 1 : packets_for(w.length, mtu);
}

// Picks the wire opcode for packet `i` of `n` of a SEND/WRITE.
uint8_t segment_opcode(QpType t, WrOpcode op, uint32_t i, uint32_t n) {
  Transport tr = t == QpType::rc ? Transport::rc : t == QpType::uc ? Transport::uc : Transport::ud;
  bool first = i == 0, last = i + 1 == n;
  BaseOp b;
  switch (op) {
    case WrOpcode::send: b = first && last ? kSendOnly : first ? kSendFirst : last ? kSendLast : kSendMiddle; break;
    case WrOpcode::send_with_imm:
      b = first && last ? kSendOnlyImm : first ? kSendFirst : last ? kSendLastImm : kSendMiddle;
      break;
    case WrOpcode::send_with_inv:
      b = first && last ? kSendOnlyInv : first ? kSendFirst : last ? kSendLastInv : kSendMiddle;
      break;
    case WrOpcode::rdma_write:
      b = first && last ? kWriteOnly : first ? kWriteFirst : last ? kWriteLast : kWriteMiddle;
      break;
    default:  // rdma_write_with_imm
      b = first && last ? kWriteOnlyImm : first ? kWriteFirst : last ? kWriteLastImm : kWriteMiddle;
      break;
  }
  return make_opcode(tr, b);
}

}  // namespace

void EngineImpl::fill_tx_common(const Qp& qp, TxPacket& tx, uint8_t opcode, uint32_t psn) const {
  tx.pkt = Packet{};
  tx.pkt.bth.opcode = opcode;
  tx.pkt.bth.psn = psn & kPsnMask;
  tx.pkt.bth.dest_qp = qp.attr.dest_qp_num;
  tx.pkt.bth.pkey = 0xffff;
  tx.niov = 0;
  tx.payload_len = 0;
  tx.av = &qp.attr.av;
  tx.src_qpn = qp.qpn;
  uint32_t fl = qp.attr.av.flow_label ? qp.attr.av.flow_label : flow_label_for_qps(qp.qpn, qp.attr.dest_qp_num);
  tx.udp_sport = udp_sport_for_flow_label(fl);
}

int EngineImpl::post_send(Qp& qp, const SendWr& wr, uint64_t now) {
  if (qp.state == QpState::reset || qp.state == QpState::init || qp.state == QpState::rtr) return EINVAL;
  if (!opcode_allowed(qp.init.uc_verbs ? QpType::uc : qp.init.type, wr.opcode)) return EINVAL;
  if (wr.num_sge < 0 || uint32_t(wr.num_sge) > qp.init.cap.max_send_sge) return EINVAL;
  if (wr.num_sge && !wr.sg_list) return EINVAL;
  uint64_t length = 0;
  for (int i = 0; i < wr.num_sge; ++i) length += wr.sg_list[i].length;
  if (length > kMaxMessage) return EINVAL;
  bool is_atomic = wr.opcode == WrOpcode::atomic_cmp_and_swp || wr.opcode == WrOpcode::atomic_fetch_and_add;
  bool inl = (wr.send_flags & kInline) && (wr.opcode == WrOpcode::send || wr.opcode == WrOpcode::send_with_imm ||
                                           wr.opcode == WrOpcode::send_with_inv || wr.opcode == WrOpcode::rdma_write ||
                                           wr.opcode == WrOpcode::rdma_write_with_imm);
  if (inl && length > qp.init.cap.max_inline_data) return EINVAL;
  if (is_atomic && (wr.num_sge != 1 || length != 8)) return EINVAL;
  if (qp.init.type == QpType::ud) {
    if (!wr.ah || length > qp.mtu) return EINVAL;
  }
  if (qp.sq_count == qp.sq.size()) return ENOMEM;

  uint32_t slot = qp.sq_index(qp.sq_head + qp.sq_count);
  SendWqe& w = qp.sq[slot];
  w = SendWqe{};
  w.wr = wr;
  w.wr.sg_list = nullptr;
  w.length = uint32_t(length);
  if (inl) {
    uint8_t* buf = qp.inline_buf.data() + size_t(slot) * qp.init.cap.max_inline_data;
    uint32_t off = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      memcpy(buf + off, reinterpret_cast<const void*>(uintptr_t(wr.sg_list[i].addr)), wr.sg_list[i].length);
      off += wr.sg_list[i].length;
    }
    w.seg[0] = {uint64_t(uintptr_t(buf)), off, 0};
    w.nseg = off ? 1 : 0;
    w.inline_data = true;
  } else {
    uint32_t access = (wr.opcode == WrOpcode::rdma_read || is_atomic) ? kLocalWrite : 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      const Sge& s = wr.sg_list[i];
      if (!s.length) continue;
      if (check_range(mem_, KeyKind::local, qp.init.pd, s.lkey, s.addr, s.length, access) != MemStatus::ok)
        w.bad_lkey = true;
      w.seg[w.nseg++] = {s.addr, s.length, s.lkey};
    }
  }
  ++qp.sq_count;
  if (qp.state == QpState::err || qp.state == QpState::sqe) {  // posted in error: flushed (IBA 10.8.3.1)
    flush_sq(qp);
    return 0;
  }
  requester_progress(qp, now);
  return 0;
}

void EngineImpl::rewind(Qp& qp, uint32_t psn) {
  // Find the WQE that holds `psn`, from the oldest; everything from there is sent again.
  for (uint32_t k = 0; k < qp.sq_count; ++k) {
    SendWqe& w = qp.sq[qp.sq_index(qp.sq_head + k)];
    if (!w.started) break;
    if (w.done) continue;
    if (psn_diff(psn, w.first_psn) < 0) psn = w.first_psn;  // an earlier WQE is done; start at this one
    if (psn_diff(psn, w.last_psn) > 0) continue;
    qp.sq_cur = qp.sq_head + k;
    qp.req.next_send_psn = psn;
    if (w.wr.opcode == WrOpcode::rdma_read) w.read_next_psn = psn;
    return;
  }
}

// A READ longer than the window is asked for in several requests, each for a chunk of its response
// packets with its own RETH VA/length and PSN range (the form a re-issue after lost responses has
// always had), so that the responses in flight towards us never exceed the window:
// the window is what our receive buffer was sized for, and a whole multi-MiB READ answered at once
// overflows it. A shorter READ stays one request, as rxe sends it. With max_rd_atomic >= 2 several
// chunks are in flight (up to 4, a quarter window each), so the next is asked for while earlier
// responses still arrive.
uint32_t EngineImpl::read_chunk(const Qp& qp, uint32_t npkts) const {
  uint32_t window = cfg_.max_inflight_packets ? cfg_.max_inflight_packets : 1;
  if (npkts <= window) return npkts ? npkts : 1;
  uint32_t ways = qp.attr.max_rd_atomic < 1 ? 1 : qp.attr.max_rd_atomic > 4 ? 4 : qp.attr.max_rd_atomic;
  return window / ways ? window / ways : 1;
}

// Each request counts against max_rd_atomic from when it is first sent until its last response
// arrives: an atomic's one, and each chunk of a READ not yet fully received. Re-issues after a loss
// replace requests already counted. Walks the started WQEs, only when a READ/atomic is to be sent.
uint32_t EngineImpl::rd_atomic_requests(const Qp& qp) const {
  uint32_t n = 0;
  for (uint32_t k = 0; k < qp.sq_count; ++k) {
    const SendWqe& w = qp.sq[qp.sq_index(qp.sq_head + k)];
    if (!w.started) break;
    if (w.done || !w.is_read_or_atomic()) continue;
    if (w.wr.opcode != WrOpcode::rdma_read) {
      ++n;
      continue;
    }
    uint32_t got = uint32_t(psn_diff(w.read_next_psn, w.first_psn));
    if (w.read_issued > got) n += (w.read_issued + w.read_chunk - 1) / w.read_chunk - got / w.read_chunk;
  }
  return n;
}

void EngineImpl::note_sending(Qp& qp) {
  const int32_t d = psn_diff(qp.req.next_send_psn, qp.comp.una_psn);
  const uint32_t inflight =
      qp.init.type == QpType::rc && qp.state != QpState::err && qp.state != QpState::reset && d > 0 ? uint32_t(d) : 0;
  inflight_total_ = inflight_total_ - qp.counted_inflight + inflight;
  qp.counted_inflight = inflight;
  if ((inflight > 0) == qp.sending) return;
  qp.sending = inflight > 0;
  sending_qps_ += qp.sending ? 1 : uint32_t(-1);
}

uint32_t EngineImpl::window(const Qp& qp) const {
  const uint32_t own = cfg_.max_inflight_packets ? cfg_.max_inflight_packets : 1;
  if (!cfg_.max_inflight_total) return own;
  const uint32_t share = cfg_.max_inflight_total / (sending_qps_ + (qp.sending ? 0 : 1));
  return share < kMinSharedWindow ? (own < kMinSharedWindow ? own : kMinSharedWindow) : share < own ? share : own;
}

bool EngineImpl::budget_full(const Qp& qp, uint32_t own) const {
  if (!cfg_.max_inflight_total || own < kMinSharedWindow) return false;
  return inflight_total_ - qp.counted_inflight + own >= cfg_.max_inflight_total;
}

void EngineImpl::requester_progress(Qp& qp, uint64_t now) {
  note_sending(qp);
  send_more(qp, now);
  note_sending(qp);
}

// May `w` send its next packet now? Everything that holds a requester back: the window (own and
// shared), a probe after a timeout, max_rd_atomic, the fence, SQD. For a READ, sets the span of
// response packets [read_off, read_end) the request at next_send_psn asks for, up to the end of its
// chunk: it goes only if they fit the window (READ responses and our own packets share one budget)
// and, unless it re-issues a range already asked for, max_rd_atomic.
bool EngineImpl::may_send(const Qp& qp, const SendWqe& w, uint32_t win, uint32_t own, ReadSpan* rs) const {
  const bool rc = qp.init.type == QpType::rc;
  if (rc && (own >= win || budget_full(qp, own))) return false;
  if (rc && qp.comp.probing && psn_diff(qp.req.next_send_psn, qp.comp.probe_psn) > 0) return false;
  const uint32_t max_rd = qp.attr.max_rd_atomic ? qp.attr.max_rd_atomic : 1;
  if (w.wr.opcode == WrOpcode::rdma_read) {
    uint32_t npkts = w.started ? w.npkts : wqe_packets(w, qp.mtu);
    uint32_t chunk = w.started ? w.read_chunk : read_chunk(qp, npkts);
    rs->off = w.started ? uint32_t(psn_diff(qp.req.next_send_psn, w.first_psn)) : 0;
    rs->end = (rs->off / chunk + 1) * chunk < npkts ? (rs->off / chunk + 1) * chunk : npkts;
    int32_t inflight = psn_diff(qp.req.next_send_psn, qp.comp.una_psn);
    // With nothing in flight a chunk goes even if a shared window has shrunk below it.
    if (inflight > 0 && uint32_t(inflight) + (rs->end - rs->off) > win) return false;
    bool fresh = !w.started || rs->off >= w.read_issued;
    if (fresh && rd_atomic_requests(qp) >= max_rd) return false;
  }
  if (w.started) return true;
  if (qp.state == QpState::sqd) return false;  // SQD: finish what started, start nothing new
  if (rc && (w.wr.send_flags & kFence) && rd_atomic_requests(qp)) return false;  // IBA 10.8.3.3
  if (rc && w.is_read_or_atomic() && w.wr.opcode != WrOpcode::rdma_read && rd_atomic_requests(qp) >= max_rd)
    return false;
  return true;
}

// A WQE's first packet: its PSN range. The one place that says how many PSNs a WQE takes.
void EngineImpl::start_wqe(const Qp& qp, SendWqe& w) const {
  w.started = true;
  w.first_psn = qp.req.next_send_psn;
  w.npkts = wqe_packets(w, qp.mtu);
  w.last_psn = psn_add(w.first_psn, int32_t(w.npkts - 1));
  w.read_next_psn = w.first_psn;
  if (w.wr.opcode == WrOpcode::rdma_read) {
    w.read_chunk = read_chunk(qp, w.npkts);
    w.read_issued = 0;
  }
}

// A first READ request, the next chunk, or a re-issue from the first missing response.
void EngineImpl::build_read_request(Qp& qp, SendWqe& w, const ReadSpan& rs, TxPacket& tx) {
  fill_tx_common(qp, tx, make_opcode(Transport::rc, kReadRequest), qp.req.next_send_psn);
  uint64_t skip = uint64_t(rs.off) * qp.mtu;
  uint64_t stop = uint64_t(rs.end) * qp.mtu < w.length ? uint64_t(rs.end) * qp.mtu : w.length;
  tx.pkt.reth.va = w.wr.remote_addr + skip;
  tx.pkt.reth.rkey = w.wr.rkey;
  tx.pkt.reth.dma_len = uint32_t(stop > skip ? stop - skip : 0);
  tx.pkt.bth.ack_req = true;
  if (rs.end > w.read_issued) w.read_issued = rs.end;
  qp.req.next_send_psn = psn_add(w.first_psn, int32_t(rs.end));
}

void EngineImpl::build_atomic(Qp& qp, SendWqe& w, TxPacket& tx) {
  bool cas = w.wr.opcode == WrOpcode::atomic_cmp_and_swp;
  fill_tx_common(qp, tx, make_opcode(Transport::rc, cas ? kCompareSwap : kFetchAdd), qp.req.next_send_psn);
  tx.pkt.atomic.va = w.wr.remote_addr;
  tx.pkt.atomic.rkey = w.wr.rkey;
  tx.pkt.atomic.swap_add = cas ? w.wr.swap : w.wr.compare_add;
  tx.pkt.atomic.compare = cas ? w.wr.compare_add : 0;
  tx.pkt.bth.ack_req = true;
  qp.req.next_send_psn = psn_add(qp.req.next_send_psn, 1);
}

// The next packet of a SEND or WRITE. False when its payload can no longer be gathered.
bool EngineImpl::build_segment(Qp& qp, SendWqe& w, uint32_t win, uint32_t own, TxPacket& tx) {
  const QpType type = qp.init.type;
  uint32_t i = uint32_t(psn_diff(qp.req.next_send_psn, w.first_psn));
  uint32_t off = i * qp.mtu;
  uint32_t len = w.length - off < qp.mtu ? w.length - off : qp.mtu;
  uint8_t op = segment_opcode(type, w.wr.opcode, i, w.npkts);
  fill_tx_common(qp, tx, op, qp.req.next_send_psn);
  const OpInfo& info = op_info(op);
  if (info.has(kReth)) {
    tx.pkt.reth.va = w.wr.remote_addr;
    tx.pkt.reth.rkey = w.wr.rkey;
    tx.pkt.reth.dma_len = w.length;
  }
  if (info.has(kImmDt)) tx.pkt.imm = w.wr.imm;
  if (info.has(kIeth)) tx.pkt.ieth_rkey = w.wr.invalidate_rkey;
  if (type == QpType::ud) {
    tx.av = w.wr.ah;
    tx.pkt.bth.dest_qp = w.wr.remote_qpn;
    // IBA 10.2.5: a Q_Key with the high bit set means "use the QP's own".
    tx.pkt.deth.qkey = (w.wr.remote_qkey & 0x80000000u) ? qp.attr.qkey : w.wr.remote_qkey;
    tx.pkt.deth.src_qp = qp.qpn;
    uint32_t fl = w.wr.ah->flow_label ? w.wr.ah->flow_label : flow_label_for_qps(qp.qpn, w.wr.remote_qpn);
    tx.udp_sport = udp_sport_for_flow_label(fl);
  }
  bool last = info.is(kEnd);
  if (last && (w.wr.send_flags & kSolicited)) tx.pkt.bth.se = true;
  if (gather(mem_, qp.init.pd, w.seg, w.nseg, w.inline_data, off, len, tx) != MemStatus::ok) return false;
  if (type == QpType::rc) {
    ++qp.req.pkts_since_ackreq;
    // A packet after which this QP stops asks for the ACK that restarts it, or the QP would
    // wait for its ACK timer: one that fills a window smaller than ack_every (a full window of
    // ack_every or more always holds an AckReq'd packet), and one after which the shared
    // budget is full, whatever the QP's share (the budget can stop a QP at any count).
    const bool fills = (win < cfg_.ack_every && own + 1 >= win) || budget_full(qp, own + 1);
    if (last || fills || qp.comp.probing || qp.req.pkts_since_ackreq >= cfg_.ack_every) {
      tx.pkt.bth.ack_req = true;
      qp.req.pkts_since_ackreq = 0;
    }
  }
  qp.req.next_send_psn = psn_add(qp.req.next_send_psn, 1);
  return true;
}

void EngineImpl::send_more(Qp& qp, uint64_t now) {
  if (qp.state != QpState::rts && qp.state != QpState::sqd) return;
  if (qp.req.rnr_deadline) return;  // waiting out an RNR NAK
  const QpType type = qp.init.type;
  for (;;) {
    if (qp.sq_cur - qp.sq_head >= qp.sq_count) break;  // everything posted has been sent
    SendWqe& w = qp.sq[qp.sq_index(qp.sq_cur)];
    if (w.done) {  // completed WQEs can lie in the rewound range only if acknowledged meanwhile
      ++qp.sq_cur;
      if (psn_diff(psn_add(w.last_psn, 1), qp.req.next_send_psn) > 0) qp.req.next_send_psn = psn_add(w.last_psn, 1);
      continue;
    }
    if (w.bad_lkey) {
      if (qp.sq_cur != qp.sq_head) break;  // completes in order once everything before it is done
      return fail_wqe(qp, w, outcome_row(Outcome::local_protection_error).requester_wc);
    }
    const uint32_t win = window(qp);
    const int32_t own_d = psn_diff(qp.req.next_send_psn, qp.comp.una_psn);
    const uint32_t own = own_d > 0 ? uint32_t(own_d) : 0;
    ReadSpan rs;
    if (!may_send(qp, w, win, own, &rs)) break;
    if (!w.started) start_wqe(qp, w);

    TxPacket tx;
    if (w.wr.opcode == WrOpcode::rdma_read) {
      build_read_request(qp, w, rs, tx);
    } else if (w.is_read_or_atomic()) {
      build_atomic(qp, w, tx);
    } else if (!build_segment(qp, w, win, own, tx)) {
      w.bad_lkey = true;  // the region went away after post_send checked it: fails in order
      continue;
    }
    ++qp.counters.tx_packets;
    link_.transmit(tx);

    bool wqe_sent = psn_diff(qp.req.next_send_psn, w.last_psn) > 0;
    if (type != QpType::rc) {
      if (wqe_sent) {  // UC and UD complete once sent: there is no ACK
        w.done = true;
        qp.comp.una_psn = qp.req.next_send_psn;
        ++qp.sq_cur;
        // In order: everything before is already done for UC/UD.
        while (qp.sq_count && qp.sq[qp.sq_index(qp.sq_head)].done) {
          if (!complete_send(qp, qp.sq[qp.sq_index(qp.sq_head)], WcStatus::success)) return;
        }
      }
      continue;
    }
    if (!qp.comp.retrans_deadline) arm_retrans(qp, now);
    if (wqe_sent) ++qp.sq_cur;
  }
}

}  // namespace melon::rc
