// A data-path exchange driven through the driver core between two emulated HCAs on an in-memory
// link: every object (UAR, PD, MR, CQ, RC QP) and every transition comes from src/mlx5/core; the
// test plays the provider's part (WQEs into the SQ ring, doorbell record, BlueFlame doorbell through
// the HAL, CQEs by owner bit, CQ arm) as rdma-core's mlx5 qp.c/cq.c do.
#include <gtest/gtest.h>
#include <string.h>

#include <vector>

#include "mlx5/emu/wire.h"
#include "mlx5/prm/prm.h"
#include "rig.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
namespace emu = melon::mlx5::emu;
using core::Err;
using core::test::Rig;
using core::test::RigOptions;

namespace {

struct CompletionSink : core::EventSink {
  int completions = 0;
  std::vector<core::AsyncEvent> events;
  void on_completion(uint32_t) override { ++completions; }
  void on_async_event(const core::AsyncEvent& e) override { events.push_back(e); }
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
  core::Uar* uar = nullptr;
  core::Pd* pd = nullptr;
  core::Cq* cq = nullptr;
  core::Qp* qp = nullptr;
  core::Mr* mr = nullptr;
  CompletionSink sink, qp_sink, srq_sink;
  core::DmaSegment cq_ring{}, cq_dbr{}, qp_ring{}, qp_dbr{}, data{};
  uint32_t cq_ci = 0, sq_pi = 0, rq_pi = 0;
  uint32_t log_cq = 6;  // set before build()
  static constexpr uint32_t kLogSq = 6, kLogRq = 4, kLogRqStride = 6;  // 64-byte receives

  uint8_t* va(uint64_t iova) { return static_cast<uint8_t*>(r.va(iova)); }
  uint8_t* bytes() { return va(data.iova); }
  void gid(uint8_t out[16]) const {
    uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, last};
    memcpy(out, g, 16);
  }

  core::QpType type = core::QpType::rc;
  static constexpr uint32_t kQkey = 0x11111111;
  core::Srq* srq = nullptr;
  core::DmaSegment srq_ring{}, srq_dbr{};
  uint32_t srq_pi = 0;
  static constexpr uint32_t kLogSrq = 4, kLogSrqStride = 6;
  void build(core::QpType t = core::QpType::rc, bool with_srq = false) {
    type = t;
    ASSERT_EQ(r.hca.bring_up(), Err::ok);
    ASSERT_EQ(r.set_gid(0, last), Err::ok);
    ASSERT_EQ(r.hca.alloc_uar(&uar), Err::ok);
    ASSERT_EQ(r.hca.alloc_pd(&pd), Err::ok);
    cq_ring = r.buffer(64u << log_cq), cq_dbr = r.buffer(4096);
    core::CqParams c;
    c.log_size = log_cq, c.uar = uar, c.buf = &cq_ring, c.nbuf = 1, c.dbr_iova = cq_dbr.iova, c.owner = &sink;
    ASSERT_EQ(r.hca.create_cq(c, &cq), Err::ok);
    qp_ring = r.buffer((1u << kLogRq << kLogRqStride) + (64u << kLogSq)), qp_dbr = r.buffer(4096);
    if (with_srq) {
      srq_ring = r.buffer(1u << kLogSrq << kLogSrqStride), srq_dbr = r.buffer(4096);
      core::SrqParams sp;
      sp.pd = pd, sp.log_size = kLogSrq, sp.log_stride = kLogSrqStride, sp.owner = &srq_sink;
      sp.buf = &srq_ring, sp.nbuf = 1, sp.dbr_iova = srq_dbr.iova;
      ASSERT_EQ(r.hca.create_srq(sp, &srq), Err::ok);
    }
    core::QpParams q;
    q.type = type;
    q.srq = srq;
    q.pd = pd, q.send_cq = cq, q.recv_cq = cq, q.uar = uar;
    q.log_sq_size = kLogSq, q.log_rq_size = kLogRq, q.log_rq_stride = kLogRqStride;
    q.buf = &qp_ring, q.nbuf = 1, q.dbr_iova = qp_dbr.iova, q.owner = &qp_sink;
    ASSERT_EQ(r.hca.create_qp(q, &qp), Err::ok);
    data = r.buffer(256 * 1024);
    uint32_t all =
        core::kAccessLocalWrite | core::kAccessRemoteWrite | core::kAccessRemoteRead | core::kAccessRemoteAtomic;
    // The client's view of its buffer: VA = IOVA here, as a pinned range would keep its offsets.
    ASSERT_EQ(r.hca.create_mr(pd, data.iova, data.len, all, &data, 1, &mr), Err::ok);
  }

  void connect(Side& peer) {
    core::QpAttr a;
    a.qkey = kQkey;
    a.access = core::kAccessRemoteWrite | core::kAccessRemoteRead | core::kAccessRemoteAtomic;
    a.dest_qpn = peer.qp->qpn;
    a.mtu = p::qpc_mtu::MTU_1K_BYTES;
    a.rq_psn = 100, a.sq_psn = 100;
    a.max_rd_atomic = a.max_dest_rd_atomic = 8;
    a.path.sgid_index = 0;
    peer.gid(a.path.dgid);
    memcpy(a.path.dmac, peer.r.hca.port().mac, 6);
    a.path.udp_sport = 0xc000 | last;
    using T = core::QpTransition;
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
                 const core::AddressVector* av = nullptr) {
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

class CoreDataPath : public ::testing::Test {
 protected:
  emu::MemoryLink link;
  Side a{link, 1}, b{link, 2};
  void SetUp() override {
    a.build();
    b.build();
    a.connect(b);
    b.connect(a);
  }
  void pump() {
    for (int i = 0; i < 100000; ++i)
      if (!(int(a.r.dev->service()) | int(b.r.dev->service()))) {  // both, always
        a.r.hca.poll_events();  // deliver completion events the way the vectors would
        b.r.hca.poll_events();
        return;
      }
    FAIL() << "devices never went idle";
  }
  void TearDown() override {
    EXPECT_EQ(a.r.hca.teardown(), Err::ok);
    EXPECT_EQ(b.r.hca.teardown(), Err::ok);
    EXPECT_EQ(a.r.host.dma_faults() + b.r.host.dma_faults(), 0u);
  }
};

TEST_F(CoreDataPath, RdmaWriteAndReadBetweenTwoHcas) {
  for (uint32_t i = 0; i < 65536; ++i) a.bytes()[i] = uint8_t(i * 13 + 7);
  a.post_send(p::wqe_opcode::RDMA_WRITE, a.data.iova, 65536, b.data.iova + 4096, b.mr->mkey);
  pump();
  const uint8_t* e = a.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::cqe64::opcode), p::cqe_opcode::REQ);
  EXPECT_EQ(p::get(e, p::cqe64::qpn), a.qp->qpn);
  EXPECT_EQ(memcmp(a.bytes(), b.bytes() + 4096, 65536), 0);
  // READ it back into another place of A's buffer.
  a.post_send(p::wqe_opcode::RDMA_READ, a.data.iova + 131072, 65536, b.data.iova + 4096, b.mr->mkey);
  pump();
  e = a.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::cqe64::opcode), p::cqe_opcode::REQ);
  EXPECT_EQ(p::get(e, p::cqe64::byte_cnt), 65536u);
  EXPECT_EQ(memcmp(a.bytes(), a.bytes() + 131072, 65536), 0);
  EXPECT_GE(link.frames(), 128u);
  // The QP's PSNs moved as the firmware says.
  core::QpQuery qq;
  ASSERT_EQ(a.r.hca.query_qp(a.qp, &qq), Err::ok);
  EXPECT_EQ(qq.state, core::QpState::rts);
  EXPECT_GT(qq.next_send_psn, 100u);
}

TEST_F(CoreDataPath, SendWithImmediateRaisesACompletionEventForTheCqOwner) {
  b.post_recv(b.data.iova + 8192, 4096);
  b.arm_cq();
  memcpy(a.bytes(), "hello through the driver core", 30);
  a.post_send(p::wqe_opcode::SEND_IMM, a.data.iova, 30, 0, 0, 0x12345678);
  pump();
  const uint8_t* e = b.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::cqe64::opcode), p::cqe_opcode::RESP_SEND_IMM);
  EXPECT_EQ(p::get(e, p::cqe64::byte_cnt), 30u);
  EXPECT_EQ(p::get(e, p::cqe64::imm_inval_pkey), 0x12345678u);
  EXPECT_EQ(memcmp(b.bytes() + 8192, "hello through the driver core", 30), 0);
  EXPECT_EQ(b.sink.completions, 1) << "the COMP event was routed to the CQ's owner";
  EXPECT_EQ(b.cq->completions, 1u);
  ASSERT_NE(a.poll_cq(), nullptr);
}

TEST_F(CoreDataPath, RemoteAccessErrorWithABadKey) {
  a.post_send(p::wqe_opcode::RDMA_WRITE, a.data.iova, 64, b.data.iova, b.mr->mkey ^ 0x100);
  pump();
  const uint8_t* e = a.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::cqe64::opcode), p::cqe_opcode::REQ_ERR);
  core::QpQuery qq;
  ASSERT_EQ(a.r.hca.query_qp(a.qp, &qq), Err::ok);
  EXPECT_EQ(qq.state, core::QpState::err) << "an error completion moves the QP to ERR";
  EXPECT_EQ(a.qp->state, core::QpState::err);
  // The responder found the bad R_Key: its QP went to ERR with a WQ_ACCESS_ERROR event (IBA 11.6.3.1
  // local access violation work queue error), routed by the core to that QP's owner.
  ASSERT_EQ(b.qp_sink.events.size(), 1u);
  EXPECT_EQ(b.qp_sink.events[0].type, p::event_type::WQ_ACCESS_ERROR);
  EXPECT_EQ(b.qp_sink.events[0].number, b.qp->qpn);
  EXPECT_STREQ(b.qp_sink.events[0].name, "WQ_ACCESS_ERROR");
  EXPECT_EQ(b.qp->events, 1u);
  ASSERT_EQ(b.r.hca.query_qp(b.qp, &qq), Err::ok);
  EXPECT_EQ(qq.state, core::QpState::err);
  EXPECT_TRUE(a.qp_sink.events.empty()) << "the requester learns it from its error CQE";
  EXPECT_TRUE(b.sink.events.empty() && a.sink.events.empty()) << "not a CQ event";
}

class CoreDataPathCqOverrun : public CoreDataPath {
 protected:
  void SetUp() override {
    a.log_cq = 1;  // 2 CQEs
    CoreDataPath::SetUp();
  }
};

// Completions from the data path that do not fit: the device writes a CQ_ERROR EQE (syndrome
// CQ_OVERRUN) and fails the QP that lost its completion (WQ_CATAS_ERROR); the core routes the first
// to the CQ's owner and the second to the QP's owner.
TEST_F(CoreDataPathCqOverrun, OverrunIsRoutedToTheCqOwnerAndTheQpGoesToErr) {
  for (int i = 0; i < 3; ++i) {
    a.post_send(p::wqe_opcode::RDMA_WRITE, a.data.iova, 64, b.data.iova, b.mr->mkey);
    pump();
  }
  ASSERT_EQ(a.sink.events.size(), 1u);
  EXPECT_EQ(a.sink.events[0].type, p::event_type::CQ_ERROR);
  EXPECT_EQ(a.sink.events[0].number, a.cq->cqn);
  EXPECT_STREQ(a.sink.events[0].name, "CQ_ERROR");
  EXPECT_EQ(a.cq->errors, 1u);
  ASSERT_EQ(a.qp_sink.events.size(), 1u);
  EXPECT_EQ(a.qp_sink.events[0].type, p::event_type::WQ_CATAS_ERROR);
  EXPECT_EQ(a.qp_sink.events[0].number, a.qp->qpn);
  EXPECT_EQ(a.r.hca.stats().unrouted_events, 0u);
  ASSERT_NE(a.poll_cq(), nullptr);
  ASSERT_NE(a.poll_cq(), nullptr);
  EXPECT_EQ(a.poll_cq(), nullptr);
  core::QpQuery qq;
  ASSERT_EQ(a.r.hca.query_qp(a.qp, &qq), Err::ok);
  EXPECT_EQ(qq.state, core::QpState::err);
  EXPECT_TRUE(b.sink.events.empty() && b.qp_sink.events.empty()) << "the peer saw nothing wrong";
}

class CoreDataPathUd : public CoreDataPath {
 protected:
  void SetUp() override {
    a.build(core::QpType::ud);
    b.build(core::QpType::ud);
    a.connect(b);
    b.connect(a);
  }
};

TEST_F(CoreDataPathUd, SendThroughAnAddressVectorFromTheCore) {
  b.post_recv(b.data.iova, 40 + 512);  // UD receives start with the 40-byte GRH
  core::AddressPath path;
  b.gid(path.dgid);
  memcpy(path.dmac, b.r.hca.port().mac, 6);
  path.sgid_index = 0;
  path.hop_limit = 64;
  path.udp_sport = 0xc101;
  core::AddressVector av;
  core::make_address_vector(path, b.qp->qpn, Side::kQkey, &av);
  for (int i = 0; i < 512; ++i) a.bytes()[i] = uint8_t(i * 3);
  a.post_send(p::wqe_opcode::SEND, a.data.iova, 512, 0, 0, 0, &av);
  pump();
  const uint8_t* e = b.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::cqe64::opcode), p::cqe_opcode::RESP_SEND);
  EXPECT_EQ(p::get(e, p::cqe64::byte_cnt), 40u + 512) << "GRH + payload";
  EXPECT_EQ(memcmp(b.bytes() + 40, a.bytes(), 512), 0);
  ASSERT_NE(a.poll_cq(), nullptr);
}

class CoreDataPathSrq : public CoreDataPath {
 protected:
  void SetUp() override {
    a.build();
    b.build(core::QpType::rc, true);
    a.connect(b);
    b.connect(a);
  }
};

TEST_F(CoreDataPathSrq, ReceivesComeFromTheSrqAndItsLimitEventReachesItsOwner) {
  for (int i = 0; i < 4; ++i) b.post_srq_recv(b.data.iova + 4096 * i, 4096);
  ASSERT_EQ(b.r.hca.arm_srq(b.srq, 3), Err::ok);
  for (int i = 0; i < 2; ++i) {
    memset(a.bytes(), 'a' + i, 100);
    a.post_send(p::wqe_opcode::SEND, a.data.iova, 100);
    pump();
  }
  const uint8_t* e = b.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::cqe64::opcode), p::cqe_opcode::RESP_SEND);
  EXPECT_EQ(p::get(e, p::cqe64::byte_cnt), 100u);
  EXPECT_EQ(b.bytes()[0], 'a');
  ASSERT_NE(b.poll_cq(), nullptr);
  EXPECT_EQ(b.bytes()[4096], 'b') << "the second SEND took the next SRQ WQE in the linked list";
  ASSERT_EQ(b.srq_sink.events.size(), 1u) << "fewer than 3 WQEs left: one SRQ limit event";
  EXPECT_EQ(b.srq_sink.events[0].type, p::event_type::SRQ_RQ_LIMIT);
  EXPECT_EQ(b.srq_sink.events[0].number, b.srq->srqn);
  EXPECT_EQ(b.srq->errors, 1u);
  EXPECT_TRUE(b.qp_sink.events.empty()) << "an SRQ event is not the QP's";
}

// A QP on an SRQ going to ERR: its SRQ's WQEs are not flushed (they belong to the SRQ), so the
// device tells the QP's owner when the last WQE is done (SRQ_LAST_WQE, IBA 10.3.1 / 11.6.3.1).
TEST_F(CoreDataPathSrq, QpOnAnSrqGoingToErrRaisesLastWqeReachedForTheQpOwner) {
  b.post_srq_recv(b.data.iova, 4096);
  ASSERT_EQ(b.r.hca.modify_qp(b.qp, core::QpTransition::to_err, {}), Err::ok);
  pump();
  ASSERT_EQ(b.qp_sink.events.size(), 1u);
  EXPECT_EQ(b.qp_sink.events[0].type, p::event_type::SRQ_LAST_WQE);
  EXPECT_EQ(b.qp_sink.events[0].number, b.qp->qpn);
  EXPECT_TRUE(b.srq_sink.events.empty()) << "about the QP, not the SRQ";
  EXPECT_EQ(b.r.hca.stats().unrouted_events, 0u);
}

}  // namespace
