// Two emulated HCAs on an in-memory link, each with the driver core on top: one Side plays the
// provider's part (WQEs into the SQ ring, doorbell record, BlueFlame doorbell through the HAL, CQEs by
// owner bit, CQ arm) as rdma-core's mlx5 qp.c/cq.c do. Shared by the core's data-path tests and the
// uapi event tests.
#pragma once

#include <gtest/gtest.h>
#include <string.h>

#include <vector>

#include "mlx5/emu/wire.h"
#include "mlx5/prm/prm.h"
#include "rig.h"

namespace melon::mlx5::core::test {

namespace p = ::melon::mlx5::prm;
namespace emu = ::melon::mlx5::emu;

struct CompletionSink : EventSink {
  int completions = 0;
  std::vector<AsyncEvent> events;
  void on_completion(uint32_t) override { ++completions; }
  void on_async_event(const AsyncEvent& e) override { events.push_back(e); }
};

struct Side {
  Side(emu::MemoryLink& link, uint8_t last) : port(link.add_port()), r(options(port, last)), last(last) {
    link.attach(port, r.dev.get());
  }
  static RigOptions options(emu::FramePort* port, uint8_t last) {
    RigOptions o;
    o.wire = port;
    o.dev.mac[5] = last;
    return o;
  }
  emu::FramePort* port;
  Rig r;
  uint8_t last;
  Uar* uar = nullptr;
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  Qp* qp = nullptr;
  Mr* mr = nullptr;
  CompletionSink sink, qp_sink, srq_sink;
  DmaSegment cq_ring{}, cq_dbr{}, qp_ring{}, qp_dbr{}, data{};
  uint32_t cq_ci = 0, sq_pi = 0, rq_pi = 0;
  uint32_t log_cq = 6;  // set before build()
  static constexpr uint32_t kLogSq = 6, kLogRq = 4, kLogRqStride = 6;  // 64-byte receives

  uint8_t* va(uint64_t iova) { return static_cast<uint8_t*>(r.va(iova)); }
  uint8_t* bytes() { return va(data.iova); }
  void gid(uint8_t out[16]) const {
    uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, last};
    memcpy(out, g, 16);
  }

  QpType type = QpType::rc;
  static constexpr uint32_t kQkey = 0x11111111;
  Srq* srq = nullptr;
  DmaSegment srq_ring{}, srq_dbr{};
  uint32_t srq_pi = 0;
  static constexpr uint32_t kLogSrq = 4, kLogSrqStride = 6;
  void build(QpType t = QpType::rc, bool with_srq = false) {
    type = t;
    ASSERT_EQ(r.hca.bring_up(), Err::ok);
    ASSERT_EQ(r.set_gid(0, last), Err::ok);
    ASSERT_EQ(r.hca.alloc_uar(&uar), Err::ok);
    ASSERT_EQ(r.hca.alloc_pd(&pd), Err::ok);
    cq_ring = r.buffer(64u << log_cq), cq_dbr = r.buffer(4096);
    CqParams c;
    c.log_size = log_cq, c.uar = uar, c.buf = &cq_ring, c.nbuf = 1, c.dbr_iova = cq_dbr.iova, c.owner = &sink;
    ASSERT_EQ(r.hca.create_cq(c, &cq), Err::ok);
    qp_ring = r.buffer((1u << kLogRq << kLogRqStride) + (64u << kLogSq)), qp_dbr = r.buffer(4096);
    if (with_srq) {
      srq_ring = r.buffer(1u << kLogSrq << kLogSrqStride), srq_dbr = r.buffer(4096);
      SrqParams sp;
      sp.pd = pd, sp.log_size = kLogSrq, sp.log_stride = kLogSrqStride, sp.owner = &srq_sink;
      sp.buf = &srq_ring, sp.nbuf = 1, sp.dbr_iova = srq_dbr.iova;
      ASSERT_EQ(r.hca.create_srq(sp, &srq), Err::ok);
    }
    QpParams q;
    q.type = type;
    q.srq = srq;
    q.pd = pd, q.send_cq = cq, q.recv_cq = cq, q.uar = uar;
    q.log_sq_size = kLogSq, q.log_rq_size = kLogRq, q.log_rq_stride = kLogRqStride;
    q.buf = &qp_ring, q.nbuf = 1, q.dbr_iova = qp_dbr.iova, q.owner = &qp_sink;
    ASSERT_EQ(r.hca.create_qp(q, &qp), Err::ok);
    data = r.buffer(256 * 1024);
    uint32_t all = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;
    // The client's view of its buffer: VA = IOVA here, as a pinned range would keep its offsets.
    ASSERT_EQ(r.hca.create_mr(pd, data.iova, data.len, all, &data, 1, &mr), Err::ok);
  }

  void connect(Side& peer) {
    uint8_t dgid[16];
    peer.gid(dgid);
    connect_to(peer.qp->qpn, dgid, peer.r.hca.port().mac);
  }
  // To a QP whose owner is not a Side (e.g. one made through the uapi server).
  void connect_to(uint32_t dest_qpn, const uint8_t dgid[16], const uint8_t dmac[6]) {
    QpAttr a;
    a.qkey = kQkey;
    a.access = kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;
    a.dest_qpn = dest_qpn;
    a.mtu = p::qpc_mtu::MTU_1K_BYTES;
    a.rq_psn = 100, a.sq_psn = 100;
    a.max_rd_atomic = a.max_dest_rd_atomic = 8;
    a.path.sgid_index = 0;
    memcpy(a.path.dgid, dgid, 16);
    memcpy(a.path.dmac, dmac, 6);
    a.path.udp_sport = 0xc000 | last;
    using T = QpTransition;
    ASSERT_EQ(r.hca.modify_qp(qp, T::rst2init, a), Err::ok);
    ASSERT_EQ(r.hca.modify_qp(qp, T::init2rtr, a), Err::ok);
    ASSERT_EQ(r.hca.modify_qp(qp, T::rtr2rts, a), Err::ok);
  }

  uint8_t* sq(uint32_t i) {
    return va(qp_ring.iova) + (1u << kLogRq << kLogRqStride) + 64 * (i & ((1u << kLogSq) - 1));
  }
  uint8_t* rq(uint32_t i) { return va(qp_ring.iova) + (1u << kLogRqStride) * (i & ((1u << kLogRq) - 1)); }

  // One signalled WQE: ctrl, optional raddr, one data segment. Doorbell record, then BlueFlame.
  void post_send(uint8_t opcode, uint64_t laddr, uint32_t len, uint64_t raddr = 0, uint32_t rkey = 0, uint32_t imm = 0,
                 const AddressVector* av = nullptr) {
    uint8_t w[128] = {};
    uint32_t ds = 1;
    if (av) {  // UD: the address vector the core built, as the provider copies it into each WQE
      memcpy(w + 16, av->bytes, sizeof av->bytes);
      ds += sizeof av->bytes / 16;
    }
    if (opcode == p::wqe_opcode::RDMA_WRITE || opcode == p::wqe_opcode::RDMA_READ) {
      p::wqe_raddr_seg::view(w + 16 * ds++).set(p::wqe_raddr_seg::raddr, raddr).set(p::wqe_raddr_seg::rkey, rkey);
    }
    p::wqe_data_seg::view(w + 16 * ds++)
        .set(p::wqe_data_seg::byte_count, len)
        .set(p::wqe_data_seg::lkey, mr->mkey)
        .set(p::wqe_data_seg::addr, laddr);
    p::wqe_ctrl_seg::view(w)
        .set(p::wqe_ctrl_seg::opcode, opcode)
        .set(p::wqe_ctrl_seg::wqe_index, sq_pi & 0xffff)
        .set(p::wqe_ctrl_seg::qpn, qp->qpn)
        .set(p::wqe_ctrl_seg::ds, ds)
        .set(p::wqe_ctrl_seg::ce, 2)
        .set(p::wqe_ctrl_seg::imm, imm);
    uint32_t bbs = (ds * 16 + 63) / 64;
    for (uint32_t i = 0; i < bbs; ++i) memcpy(sq(sq_pi + i), w + 64 * i, 64);
    sq_pi += bbs;
    p::set(va(qp_dbr.iova), p::qp_dbrec::snd_counter, sq_pi & 0xffff);
    // The first 8 bytes of the WQE, in memory order, to the QP's UAR (BlueFlame register 0).
    r.hal->write64(uar->bf_off[0], p::get_bits(w, 0, 64));
  }

  void post_recv(uint64_t laddr, uint32_t len) {
    uint8_t* w = rq(rq_pi);
    memset(w, 0, 1u << kLogRqStride);
    p::wqe_data_seg::view(w)
        .set(p::wqe_data_seg::byte_count, len)
        .set(p::wqe_data_seg::lkey, mr->mkey)
        .set(p::wqe_data_seg::addr, laddr);
    p::wqe_data_seg::view(w + 16).set(p::wqe_data_seg::lkey, 0x100);  // MLX5_INVALID_LKEY ends the list
    ++rq_pi;
    p::set(va(qp_dbr.iova), p::qp_dbrec::rcv_counter, rq_pi & 0xffff);
  }

  // An SRQ receive: the next segment (next_wqe_index, linked list in ring order), then the scatter.
  void post_srq_recv(uint64_t laddr, uint32_t len) {
    uint8_t* w = va(srq_ring.iova) + (1u << kLogSrqStride) * (srq_pi & ((1u << kLogSrq) - 1));
    memset(w, 0, 1u << kLogSrqStride);
    uint16_t next = uint16_t((srq_pi + 1) & ((1u << kLogSrq) - 1));
    w[2] = uint8_t(next >> 8), w[3] = uint8_t(next);
    p::wqe_data_seg::view(w + 16)
        .set(p::wqe_data_seg::byte_count, len)
        .set(p::wqe_data_seg::lkey, mr->mkey)
        .set(p::wqe_data_seg::addr, laddr);
    p::wqe_data_seg::view(w + 32).set(p::wqe_data_seg::lkey, 0x100);
    ++srq_pi;
    p::set_bits(va(srq_dbr.iova), 16, 16, srq_pi & 0xffff);  // the SRQ's WQE counter (rdma-core srq.c)
  }

  const uint8_t* poll_cq() {
    const uint8_t* e = va(cq_ring.iova) + 64 * (cq_ci & ((1u << log_cq) - 1));
    if (!p::cqe_sw_owned(e, cq_ci, log_cq)) return nullptr;
    ++cq_ci;
    p::set(va(cq_dbr.iova), p::cq_dbrec::set_ci, cq_ci & 0xffffff);
    return e;
  }

  // Request an event for the next completion (arm word in the record, then the UAR doorbell).
  void arm_cq() {
    uint8_t* rec = va(cq_dbr.iova);
    p::set(rec, p::cq_dbrec::arm_cmd, p::kCqArmNext);
    p::set(rec, p::cq_dbrec::arm_ci, cq_ci & 0xffffff);
    uint8_t db[8] = {};
    p::set(db, p::cq_uar_db::cmd, p::kCqArmNext);
    p::set(db, p::cq_uar_db::ci, cq_ci & 0xffffff);
    p::set(db, p::cq_uar_db::cqn, cq->cqn);
    r.hal->write64(uint32_t(uar->bar_off + p::kUarCqDoorbell), p::get_bits(db, 0, 64));
  }
};

}  // namespace melon::mlx5::core::test
