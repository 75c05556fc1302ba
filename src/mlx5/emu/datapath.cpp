// The data path: send doorbells and WQEs read from IOVA rings (PRM "Send Queue", "Work Queue
// Elements"; rdma-core qp.c and wqe.h are the writers), receive WQEs fetched when a packet needs one,
// frames in and out, and CQEs written from the transport's completions (rdma-core cq.c is the reader).
#include <string.h>

#include "mlx5/emu/hca.h"
#include "rc/outcome.h"
#include "roce/frame.h"
#include "roce/ip_udp.h"

namespace melon::mlx5::emu {

namespace {
namespace w = prm::wqe_opcode;
constexpr uint32_t kInvalidLkey = 0x100;  // terminates a receive scatter list (rdma-core MLX5_INVALID_LKEY)

// wr_id the device gives the transport for a send WQE: what its CQE needs back.
uint64_t send_wr_id(uint16_t wqe_index, uint8_t opcode, uint32_t length) {
  return uint64_t(wqe_index) | uint64_t(opcode) << 16 | uint64_t(length) << 32;
}
uint16_t wr_wqe_index(uint64_t id) { return uint16_t(id); }
uint8_t wr_opcode(uint64_t id) { return uint8_t(id >> 16); }
uint32_t wr_length(uint64_t id) { return uint32_t(id >> 32); }

}  // namespace

void Hca::write_completion(const PendingCqe& p) {
  auto it = cqs_.find(p.cqn);
  if (it == cqs_.end()) return;
  if (!p.send) ++recv_cqes_;
  const rc::Wc& wc = p.wc;
  uint8_t cqe[prm::kCqeBytes] = {};
  prm::cqe64::view v(cqe);
  auto qit = qps_.find(wc.qp_num);
  uint32_t uidx = qit != qps_.end() ? qit->second.user_index : 0;
  v.set(prm::cqe64::qpn, wc.qp_num);
  v.set(prm::cqe64::srqn_uidx, uidx);
  if (wc.status != rc::WcStatus::success) {
    prm::err_cqe::view e(cqe);
    e.set(prm::err_cqe::opcode, p.send ? prm::cqe_opcode::REQ_ERR : prm::cqe_opcode::RESP_ERR);
    e.set(prm::err_cqe::syndrome, rc::mlx5_cqe_syndrome(wc.status));  // the transport's outcome table
    e.set(prm::err_cqe::vendor_err_synd, wc.vendor_err & 0xff);
    e.set(prm::err_cqe::wqe_counter, p.send ? wr_wqe_index(wc.wr_id) : uint16_t(wc.wr_id));
    if (p.send) e.set(prm::err_cqe::s_wqe_opcode, wr_opcode(wc.wr_id));
    post_cqe(it->second, cqe, false);
    return;
  }
  if (p.send) {
    uint8_t op = wr_opcode(wc.wr_id);
    v.set(prm::cqe64::opcode, prm::cqe_opcode::REQ).set(prm::cqe64::sop_drop, op);
    v.set(prm::cqe64::wqe_counter, wr_wqe_index(wc.wr_id));
    if (op == w::RDMA_READ || op == w::ATOMIC_CS || op == w::ATOMIC_FA)
      v.set(prm::cqe64::byte_cnt, wr_length(wc.wr_id));
    post_cqe(it->second, cqe, false);
    return;
  }
  uint8_t op = prm::cqe_opcode::RESP_SEND;
  if (wc.opcode == rc::WcOpcode::recv_rdma_with_imm)
    op = prm::cqe_opcode::RESP_WR_IMM;
  else if (wc.wc_flags & rc::kWcWithImm)
    op = prm::cqe_opcode::RESP_SEND_IMM;
  else if (wc.wc_flags & rc::kWcWithInv)
    op = prm::cqe_opcode::RESP_SEND_INV;
  v.set(prm::cqe64::opcode, op).set(prm::cqe64::byte_cnt, wc.byte_len);
  v.set(prm::cqe64::wqe_counter, uint16_t(wc.wr_id));
  if (wc.data_inline) {  // scatter to CQE: the data in the first 32 bytes, not in the receive's buffers
    memcpy(cqe, wc.inline_data, wc.byte_len);
    v.set(prm::cqe64::format, prm::cqe_format::INLINE_SCATTER_32);
  }
  if (wc.wc_flags & (rc::kWcWithImm | rc::kWcWithInv)) v.set(prm::cqe64::imm_inval_pkey, wc.imm);
  if (qit != qps_.end() && prm::qpc_st_datagram(qit->second.st)) {
    v.set(prm::cqe64::rqpn, wc.src_qp);
    // g (bits 5:4): a GRH came with it (rdma-core cq.c); bits 3:0, the SL's place: the RoCE packet type.
    if (wc.wc_flags & rc::kWcGrh) v.set(prm::cqe64::flags, 0x10 | (wc.sl & 0xf));
  }
  v.set(prm::cqe64::se, wc.solicited);
  post_cqe(it->second, cqe, wc.solicited);
}

bool Hca::qp_error_cqe(Qp& qp, uint16_t wqe_index, uint8_t wqe_opcode, uint8_t syndrome) {
  auto it = cqs_.find(qp.cqn_snd);
  if (it == cqs_.end()) return false;
  uint8_t cqe[prm::kCqeBytes] = {};
  prm::err_cqe::view e(cqe);
  e.set(prm::err_cqe::opcode, prm::cqe_opcode::REQ_ERR).set(prm::err_cqe::syndrome, syndrome);
  e.set(prm::err_cqe::s_wqe_opcode, wqe_opcode)
      .set(prm::err_cqe::qpn, qp.qpn)
      .set(prm::err_cqe::wqe_counter, wqe_index);
  prm::set(cqe, prm::cqe64::srqn_uidx, qp.user_index);
  return post_cqe(it->second, cqe, false);
}

void Hca::send_doorbell(const Doorbell& db) {
  uint32_t qpn = uint32_t(prm::get(db.bytes, prm::wqe_ctrl_seg::qpn));
  auto it = qps_.find(qpn);
  if (it == qps_.end() || it->second.uar != db.uar || it->second.no_sq) {
    ++stats_.doorbells_ignored;
    return;
  }
  sq_process(it->second);
}

// Reads `len` bytes of the send ring starting at WQEBB `bb` (wrapping at the end of the ring).
static bool read_sq(Hca& h, Qp& qp, uint32_t bb, uint32_t off_in_wqe, uint8_t* dst, uint32_t len) {
  uint64_t sq_base = h.rq_bytes(qp);
  uint32_t ring = uint32_t(prm::kSendWqeBB) << qp.log_sq_size;
  uint32_t at = ((bb & ((1u << qp.log_sq_size) - 1)) * prm::kSendWqeBB + off_in_wqe) % ring;
  while (len) {
    uint32_t n = ring - at < len ? ring - at : len;
    uint64_t iova;
    // Pages of a ring are contiguous in IOVA space only within a page: go page by page.
    uint64_t pg = 4096ull << qp.log_page_size;
    uint64_t rel = sq_base + at + qp.page_offset * 64u;
    uint32_t in_page = uint32_t(pg - rel % pg);
    if (n > in_page) n = in_page;
    if (!h.queue_addr(qp.pas, qp.log_page_size, qp.page_offset * 64u, sq_base + at, &iova) || !h.dma_read(iova, dst, n))
      return false;
    dst += n, len -= n, at = (at + n) % ring;
  }
  return true;
}

void Hca::sq_process(Qp& qp) {
  qp.state = tp_state(qp);
  if (qp.state != prm::qpc_state::RTS && qp.state != prm::qpc_state::ERR && qp.state != prm::qpc_state::SQER)
    return;  // WQEs wait in the ring until the QP can send
  uint8_t rec[8];
  if (!dma_read(qp.dbr, rec, sizeof rec)) return;
  uint16_t sw_pi = uint16_t(prm::get(rec, prm::qp_dbrec::snd_counter));
  while (uint16_t(qp.sq_pi) != sw_pi) {
    uint8_t ctrl[16];
    if (!read_sq(*this, qp, qp.sq_pi, 0, ctrl, sizeof ctrl)) return;
    prm::wqe_ctrl_seg::cview c(ctrl);
    uint8_t opcode = uint8_t(c.get(prm::wqe_ctrl_seg::opcode));
    uint32_t ds = uint32_t(c.get(prm::wqe_ctrl_seg::ds));
    uint16_t idx = uint16_t(c.get(prm::wqe_ctrl_seg::wqe_index));
    uint32_t nbb = (ds * 16 + prm::kSendWqeBB - 1) / prm::kSendWqeBB;
    // Blocks the doorbell record has posted from here: a WQE may not claim more (with the 16-bit
    // comparison above, stepping past the record would go round the whole counter, thousands of
    // error CQEs and the device's thread held: one client's bad WQE must not stall the others).
    uint32_t posted = uint16_t(sw_pi - uint16_t(qp.sq_pi));
    if (ds == 0 || nbb > posted || nbb > (1u << qp.log_sq_size) || c.get(prm::wqe_ctrl_seg::qpn) != qp.qpn ||
        idx != uint16_t(qp.sq_pi)) {
      // A WQE the device cannot parse: a local QP operation error, and the QP is done.
      qp_error_cqe(qp, uint16_t(qp.sq_pi), opcode, prm::cqe_syndrome::LOCAL_QP_OP_ERR);
      rc::QpAttr at;
      at.qp_state = rc::QpState::err;
      engine_->modify_qp(qp.qpn, at, rc::kAttrState);
      engine_done();
      qp.state = prm::qpc_state::ERR;
      qp.sq_pi += nbb && nbb <= posted ? nbb : posted;
      continue;
    }
    std::vector<uint8_t> wqe(ds * 16);
    if (!read_sq(*this, qp, qp.sq_pi, 0, wqe.data(), uint32_t(wqe.size()))) return;
    uint8_t fm = uint8_t(c.get(prm::wqe_ctrl_seg::fm)), ce = uint8_t(c.get(prm::wqe_ctrl_seg::ce));
    rc::SendWr wr;
    wr.send_flags =
        (ce == 2 ? rc::kSignaled : 0) | (c.get(prm::wqe_ctrl_seg::se) ? rc::kSolicited : 0) | (fm ? rc::kFence : 0);
    uint32_t imm = uint32_t(c.get(prm::wqe_ctrl_seg::imm));
    size_t off = 16;
    bool ok = true;
    switch (opcode) {
      case w::SEND: wr.opcode = rc::WrOpcode::send; break;
      case w::SEND_IMM: wr.opcode = rc::WrOpcode::send_with_imm, wr.imm = imm; break;
      case w::SEND_INVAL: wr.opcode = rc::WrOpcode::send_with_inv, wr.invalidate_rkey = imm; break;
      case w::RDMA_WRITE: wr.opcode = rc::WrOpcode::rdma_write; break;
      case w::RDMA_WRITE_IMM: wr.opcode = rc::WrOpcode::rdma_write_with_imm, wr.imm = imm; break;
      case w::RDMA_READ: wr.opcode = rc::WrOpcode::rdma_read; break;
      case w::ATOMIC_CS: wr.opcode = rc::WrOpcode::atomic_cmp_and_swp; break;
      case w::ATOMIC_FA: wr.opcode = rc::WrOpcode::atomic_fetch_and_add; break;
      case w::NOP: break;
      default: ok = false;
    }
    if (prm::qpc_st_datagram(qp.st) && ok && opcode != w::NOP) {
      if (off + prm::wqe_datagram_seg::size_bytes > wqe.size()) ok = false;
      if (ok) {
        prm::wqe_datagram_seg::cview d(wqe.data() + off);
        rc::AddressVector& av = qp.avs[qp.sq_pi & ((1u << qp.log_sq_size) - 1)];
        av = rc::AddressVector{};
        memcpy(av.dgid, d.bytes(prm::wqe_datagram_seg::rgid), 16);
        uint32_t gi = uint32_t(d.get(prm::wqe_datagram_seg::sgid_index));
        gids_[gi].gid(av.sgid);
        av.hop_limit = uint8_t(d.get(prm::wqe_datagram_seg::hop_limit));
        av.traffic_class = uint8_t(d.get(prm::wqe_datagram_seg::tclass));
        av.flow_label = uint32_t(d.get(prm::wqe_datagram_seg::flow_label));
        wr.ah = &av;
        wr.remote_qpn = uint32_t(d.get(prm::wqe_datagram_seg::dqpn));
        wr.remote_qkey = uint32_t(d.get(prm::wqe_datagram_seg::qkey));
        off += prm::wqe_datagram_seg::size_bytes;
      }
    }
    bool rdma = opcode == w::RDMA_WRITE || opcode == w::RDMA_WRITE_IMM || opcode == w::RDMA_READ;
    bool atomic = opcode == w::ATOMIC_CS || opcode == w::ATOMIC_FA;
    if (ok && (rdma || atomic)) {
      if (off + 16 > wqe.size()) {
        ok = false;
      } else {
        prm::wqe_raddr_seg::cview r(wqe.data() + off);
        wr.remote_addr = r.get(prm::wqe_raddr_seg::raddr);
        wr.rkey = uint32_t(r.get(prm::wqe_raddr_seg::rkey));
        off += 16;
      }
    }
    if (ok && atomic) {
      if (off + 16 > wqe.size()) {
        ok = false;
      } else {
        prm::wqe_atomic_seg::cview at(wqe.data() + off);
        if (opcode == w::ATOMIC_CS) {
          wr.swap = at.get(prm::wqe_atomic_seg::swap_add);
          wr.compare_add = at.get(prm::wqe_atomic_seg::compare);
        } else {
          wr.compare_add = at.get(prm::wqe_atomic_seg::swap_add);
        }
        off += 16;
      }
    }
    // The gather list: data segments, or one inline segment.
    rc::Sge sges[rc::kMaxSge];
    std::vector<uint8_t> inline_bytes;
    int n = 0;
    uint32_t length = 0;
    while (ok && opcode != w::NOP && off < wqe.size()) {
      uint32_t bc = uint32_t(prm::get_bits(wqe.data() + off, 0, 32));
      if (bc & prm::kInlineSegFlag) {
        uint32_t len = bc & ~prm::kInlineSegFlag;
        if (off + 4 + len > wqe.size() || n) {
          ok = false;
          break;
        }
        inline_bytes.assign(wqe.data() + off + 4, wqe.data() + off + 4 + len);
        if (len) sges[n++] = rc::Sge{uint64_t(uintptr_t(inline_bytes.data())), len, 0};  // 0 bytes: no gather entry
        wr.send_flags |= rc::kInline;
        length += len;
        break;  // inline data ends the WQE
      }
      if (off + 16 > wqe.size()) break;
      prm::wqe_data_seg::cview d(wqe.data() + off);
      if (n == int(rc::kMaxSge)) {
        ok = false;
        break;
      }
      sges[n++] = rc::Sge{d.get(prm::wqe_data_seg::addr), bc, uint32_t(d.get(prm::wqe_data_seg::lkey))};
      length += bc;
      off += 16;
    }
    uint16_t index = uint16_t(qp.sq_pi);
    qp.sq_pi += nbb;
    ++qp.sq_wqe_cnt;
    if (!ok) {
      qp_error_cqe(qp, index, opcode, prm::cqe_syndrome::LOCAL_QP_OP_ERR);
      rc::QpAttr at;
      at.qp_state = rc::QpState::err;
      engine_->modify_qp(qp.qpn, at, rc::kAttrState);
      engine_done();
      continue;
    }
    if (opcode == w::NOP) {
      if (ce == 2) {
        uint8_t cqe[prm::kCqeBytes] = {};
        prm::cqe64::view v(cqe);
        v.set(prm::cqe64::opcode, prm::cqe_opcode::REQ).set(prm::cqe64::sop_drop, w::NOP);
        v.set(prm::cqe64::qpn, qp.qpn).set(prm::cqe64::wqe_counter, index).set(prm::cqe64::srqn_uidx, qp.user_index);
        auto cq = cqs_.find(qp.cqn_snd);
        if (cq != cqs_.end()) post_cqe(cq->second, cqe, false);
      }
      continue;
    }
    wr.sg_list = sges;
    wr.num_sge = n;
    wr.wr_id = send_wr_id(index, opcode, atomic ? 8 : length);
    int r = engine_->post_send(qp.qpn, wr);
    engine_done();
    if (r) {
      // The transport refused the WQE as malformed (length, opcode for this QP type, too many SGEs).
      qp_error_cqe(qp, index, opcode,
                   length > rc::kMaxMessage ? prm::cqe_syndrome::LOCAL_LENGTH_ERR : prm::cqe_syndrome::LOCAL_QP_OP_ERR);
      rc::QpAttr at;
      at.qp_state = rc::QpState::err;
      engine_->modify_qp(qp.qpn, at, rc::kAttrState);
      engine_done();
    }
  }
}

// Reads one receive WQE's scatter list (data segments up to the invalid-lkey terminator).
static int read_scatter(Hca& h, const std::vector<uint64_t>& pas, uint8_t log_page_size, uint32_t page_offset,
                        uint64_t off, uint32_t stride, uint32_t skip, rc::Sge* sges) {
  std::vector<uint8_t> wqe(stride);
  uint64_t iova;
  if (!h.queue_addr(pas, log_page_size, page_offset, off, &iova) || !h.dma_read(iova, wqe.data(), stride)) return -1;
  int n = 0;
  for (uint32_t o = skip; o + 16 <= stride && n < int(rc::kMaxSge); o += 16) {
    prm::wqe_data_seg::cview d(wqe.data() + o);
    uint32_t lkey = uint32_t(d.get(prm::wqe_data_seg::lkey));
    if (lkey == kInvalidLkey) break;
    sges[n++] = rc::Sge{d.get(prm::wqe_data_seg::addr), uint32_t(d.get(prm::wqe_data_seg::byte_count)), lkey};
  }
  return n;
}

void Hca::rq_replenish(Qp& qp) {
  if (qp.rq_type == 1) {
    auto s = srqs_.find(qp.srqn);
    if (s != srqs_.end()) srq_replenish(s->second);
    return;
  }
  if (qp.rq_type != 0 || qp.state == prm::qpc_state::RST) return;
  uint8_t rec[8];
  if (!dma_read(qp.dbr, rec, sizeof rec)) return;
  uint16_t sw = uint16_t(prm::get(rec, prm::qp_dbrec::rcv_counter));
  uint32_t stride = 16u << qp.log_rq_stride;
  while (uint16_t(qp.rq_taken) != sw) {
    rc::Sge sges[rc::kMaxSge];
    uint64_t off = uint64_t(qp.rq_taken & ((1u << qp.log_rq_size) - 1)) * stride;
    int n = read_scatter(*this, qp.pas, qp.log_page_size, qp.page_offset * 64u, off, stride, 0, sges);
    if (n < 0) return;
    rc::RecvWr wr;
    wr.wr_id = qp.rq_taken & 0xffff;
    wr.sg_list = sges;
    wr.num_sge = n;
    if (engine_->post_recv(qp.qpn, wr) != 0) break;  // the transport's RQ is full: later
    ++qp.rq_taken;
  }
  engine_done();
}

void Hca::srq_replenish(Srq& s) {
  uint8_t rec[4];
  if (!s.engine_srq || !dma_read(s.dbr, rec, sizeof rec)) return;
  uint16_t sw = uint16_t(prm::get_bits(rec, 16, 16));  // the SRQ's WQE counter (rdma-core srq.c)
  uint32_t stride = 1u << s.log_stride;
  while (uint16_t(s.taken) != sw) {
    rc::Sge sges[rc::kMaxSge];
    uint64_t off = uint64_t(s.head & ((1u << s.log_size) - 1)) * stride;
    uint8_t next[16];
    uint64_t iova;
    if (!queue_addr(s.pas, s.log_page_size, s.page_offset * 64u, off, &iova) || !dma_read(iova, next, sizeof next))
      return;
    int n = read_scatter(*this, s.pas, s.log_page_size, s.page_offset * 64u, off, stride, 16, sges);
    if (n < 0) return;
    rc::RecvWr wr;
    wr.wr_id = s.head;
    wr.sg_list = sges;
    wr.num_sge = n;
    if (engine_->post_srq_recv(s.engine_srq, wr) != 0) break;
    s.head = uint16_t(next[2] << 8 | next[3]);  // next_wqe_index of the SRQ next segment
    ++s.taken;
  }
  engine_done();
}

void Hca::rx_frame(const std::vector<uint8_t>& f) {
  roce::IpUdp ip;
  const uint8_t* pkt = nullptr;
  size_t len = 0;
  if (roce::read_frame(f.data(), f.size(), ip, &pkt, &len) != roce::ParseError::ok || !roce_en_ ||
      port_oper_ != prm::kPortUp) {
    ++stats_.frames_dropped;
    return;
  }
  // Only frames for one of our addresses reach the RDMA engine (the NIC's steering).
  bool ours = false;
  for (const GidEntry& g : gids_) {
    uint8_t gid[16];
    g.gid(gid);
    ours = ours || (g.valid && memcmp(gid, ip.dst, 16) == 0);
  }
  if (!ours) {
    ++stats_.frames_dropped;
    return;
  }
  ++stats_.frames_rx;
  // Fetch receive WQEs the destination QP may need (hardware reads them when a packet asks).
  if (len >= 12) {
    uint32_t dqpn = uint32_t(pkt[5]) << 16 | uint32_t(pkt[6]) << 8 | pkt[7];
    auto it = qps_.find(dqpn);
    if (it != qps_.end()) rq_replenish(it->second);
  }
  engine_->receive(ip, pkt, len);
  engine_done();
}

}  // namespace melon::mlx5::emu
