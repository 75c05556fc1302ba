// Every object the core manages, on the emulator: create, query, modify, destroy, and the invalid
// cases (bad arguments refused before any command, wrong states, dependents, firmware refusals).
#include <gtest/gtest.h>
#include <string.h>

#include <vector>

#include "mlx5/emu/syndromes.h"
#include "mlx5/prm/prm.h"
#include "rig.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
using core::Err;
using core::test::Rig;

namespace {

struct Objects : ::testing::Test {
  Rig r;
  core::Pd* pd = nullptr;
  void SetUp() override {
    ASSERT_EQ(r.hca.bring_up(), Err::ok);
    ASSERT_EQ(r.hca.alloc_pd(&pd), Err::ok);
  }
  void TearDown() override {
    EXPECT_EQ(r.hca.teardown(), Err::ok);
    r.free_buffers();
    EXPECT_EQ(r.hal->dma_buffers(), 0u);
    EXPECT_EQ(r.hal->pinned_ranges(), 0u);
    EXPECT_EQ(r.dev->stats().fw_pages_held, 0u);
    EXPECT_EQ(r.host.dma_faults(), 0u);
  }
  core::Cq* cq(uint32_t log_size = 6) {
    core::CqParams c;
    c.log_size = log_size;
    core::DmaSegment ring = r.buffer(size_t(64) << log_size);
    core::DmaSegment dbr = r.buffer(4096);
    c.buf = &ring;
    c.nbuf = 1;
    c.dbr_iova = dbr.iova;
    core::Cq* out = nullptr;
    EXPECT_EQ(r.hca.create_cq(c, &out), Err::ok);
    return out;
  }
  core::Qp* qp(core::QpType t, core::Cq* scq, core::Cq* rcq, core::Srq* srq = nullptr) {
    core::QpParams q;
    q.type = t;
    q.pd = pd;
    q.send_cq = scq;
    q.recv_cq = rcq;
    q.srq = srq;
    core::DmaSegment ring = r.buffer(64 * 64 + 64 * 16), dbr = r.buffer(4096);
    q.buf = &ring;
    q.nbuf = 1;
    q.dbr_iova = dbr.iova;
    core::Qp* out = nullptr;
    EXPECT_EQ(r.hca.create_qp(q, &out), Err::ok);
    return out;
  }
};

TEST_F(Objects, PdAllocAndFree) {
  core::Pd* other = nullptr;
  ASSERT_EQ(r.hca.alloc_pd(&other), Err::ok);
  EXPECT_NE(other->pdn, pd->pdn);
  EXPECT_EQ(r.hca.live(core::ObjKind::pd), 2u);
  EXPECT_EQ(r.hca.free_pd(other), Err::ok);
  EXPECT_EQ(r.hca.live(core::ObjKind::pd), 1u);
}

TEST_F(Objects, UarHasTwoBlueFlameBuffersInsideItsPage) {
  core::Uar* u = nullptr;
  ASSERT_EQ(r.hca.alloc_uar(&u), Err::ok);
  EXPECT_GE(u->index, melon::mlx5::emu::kFirstUarIndex);
  EXPECT_EQ(u->bar_off, uint64_t(u->index) * p::kUarPageBytes);
  EXPECT_EQ(u->bf_off[0], u->bar_off + p::kUarBlueFlame);
  EXPECT_EQ(u->bf_off[1], u->bf_off[0] + u->bf_size);
  EXPECT_EQ(u->bf_size, p::bf_buffer_bytes(r.hca.caps().log_bf_reg_size));
  EXPECT_LE(u->bf_off[1] + u->bf_size, u->bar_off + p::kUarPageBytes);
  EXPECT_EQ(r.hca.free_uar(u), Err::ok);
}

TEST_F(Objects, MrOverDmaSegmentsQueriesBack) {
  core::DmaSegment seg = r.buffer(64 * 1024, 64 * 1024);
  core::Mr* mr = nullptr;
  uint32_t acc = core::kAccessLocalWrite | core::kAccessRemoteRead | core::kAccessRemoteWrite;
  ASSERT_EQ(r.hca.create_mr(pd, 0x7f0000100000ull, 64 * 1024, acc, &seg, 1, &mr), Err::ok);
  EXPECT_EQ(mr->mtts, 1u) << "one contiguous 64 KiB run at a 64 KiB-compatible offset";
  core::MrQuery q;
  ASSERT_EQ(r.hca.query_mr(mr, &q), Err::ok);
  EXPECT_EQ(q.pd, pd->pdn);
  EXPECT_EQ(q.start, 0x7f0000100000ull);
  EXPECT_EQ(q.len, 64u * 1024);
  EXPECT_EQ(q.access, acc);
  EXPECT_FALSE(q.free);
  EXPECT_EQ(r.hca.free_pd(pd), Err::in_use) << "an MR still uses the PD";
  EXPECT_EQ(r.hca.destroy_mr(mr), Err::ok);
}

TEST_F(Objects, UserMrOnSixteenKiBHostPagesSplitsOrCoalesces) {
  // A user buffer pinned page by page (16 KiB host pages, one IOVA window each).
  std::vector<uint8_t> mem(4 * 16384 + 16384);
  uintptr_t base = (uintptr_t(mem.data()) + 16383) & ~uintptr_t(16383);
  core::Mr* mr = nullptr;
  ASSERT_EQ(r.hca.register_user_mr(pd, base, 4 * 16384, core::kAccessLocalWrite, &mr), Err::ok);
  EXPECT_EQ(r.hal->pinned_ranges(), 1u);
  // Windows are 4 KiB aligned in IOVA space, so the HCA sees 4 KiB pages: four under each host page.
  EXPECT_EQ(mr->page_shift, 12u);
  EXPECT_EQ(mr->mtts, 16u);
  EXPECT_EQ(r.hca.destroy_mr(mr), Err::ok);
  EXPECT_EQ(r.hal->pinned_ranges(), 0u);
  // The same range pinned as one window coalesces to the largest page the range allows.
  core::DmaSegment one = r.buffer(4 * 16384, 4 * 16384);
  ASSERT_EQ(r.hca.create_mr(pd, one.iova, 4 * 16384, 0, &one, 1, &mr), Err::ok);
  EXPECT_EQ(mr->mtts, 1u);
  EXPECT_EQ(mr->page_shift, 16u);
  core::MrQuery q;
  ASSERT_EQ(r.hca.query_mr(mr, &q), Err::ok);
  EXPECT_EQ(q.log_page_size, 16u);
  EXPECT_EQ(r.hca.destroy_mr(mr), Err::ok);
  // And forced to 4 KiB pages it splits again.
  ASSERT_EQ(r.hca.create_mr(pd, one.iova, 4 * 16384, 0, &one, 1, &mr, 12), Err::ok);
  EXPECT_EQ(mr->mtts, 16u);
  EXPECT_EQ(r.hca.destroy_mr(mr), Err::ok);
}

TEST_F(Objects, MrInvalidCasesAreRefusedBeforeTheFirmware) {
  core::DmaSegment seg = r.buffer(4096);
  core::Mr* mr = nullptr;
  uint64_t cmds = r.hca.cmdq().commands_run();
  EXPECT_EQ(r.hca.create_mr(pd, 0x1000, 8192, 0, &seg, 1, &mr), Err::invalid) << "longer than its segments";
  EXPECT_EQ(r.hca.create_mr(pd, 0x1000, 4096, core::kAccessRemoteWrite, &seg, 1, &mr), Err::invalid)
      << "remote write without local write (IBA 10.6.3.1)";
  core::DmaSegment odd{seg.iova + 100, 1000};
  core::DmaSegment two[] = {odd, {seg.iova + 3000, 100}};
  EXPECT_EQ(r.hca.create_mr(pd, 0x1000, 1100, 0, two, 2, &mr), Err::invalid) << "a hole inside a page";
  EXPECT_EQ(r.hca.create_mr(nullptr, 0x1000, 4096, 0, &seg, 1, &mr), Err::invalid);
  EXPECT_EQ(r.hca.cmdq().commands_run(), cmds);
  EXPECT_EQ(r.hca.live(core::ObjKind::mr), 0u);
}

TEST_F(Objects, CqCreateQueryModifyDestroy) {
  core::Cq* c = cq(7);
  ASSERT_NE(c, nullptr);
  core::CqQuery q;
  ASSERT_EQ(r.hca.query_cq(c, &q), Err::ok);
  EXPECT_EQ(q.log_size, 7u);
  EXPECT_EQ(q.eqn, r.hca.comp_eqn(0));
  ASSERT_EQ(r.hca.modify_cq(c, 16, 8), Err::ok);
  ASSERT_EQ(r.hca.query_cq(c, &q), Err::ok);
  EXPECT_EQ(q.period, 16u);
  EXPECT_EQ(q.max_count, 8u);
  EXPECT_EQ(r.hca.modify_cq(c, 5000, 1), Err::invalid) << "cq_period is 12 bits";
  EXPECT_EQ(r.hca.destroy_cq(c), Err::ok);
}

// The core's half of a resize: the command, the new size in the record, the boundary CQE where the
// firmware left it, and the firmware's refusal of a ring too small for what is outstanding.
TEST_F(Objects, CqResize) {
  core::CqParams c;
  core::DmaSegment ring = r.buffer(64 << 6), dbr = r.buffer(4096);
  c.log_size = 6, c.buf = &ring, c.nbuf = 1, c.dbr_iova = dbr.iova;
  core::Cq* cq = nullptr;
  ASSERT_EQ(r.hca.create_cq(c, &cq), Err::ok);
  core::DmaSegment big = r.buffer(64 << 8);
  ASSERT_EQ(r.hca.resize_cq(cq, 8, &big, 1), Err::ok);
  EXPECT_EQ(cq->log_size, 8u);
  core::CqQuery q;
  ASSERT_EQ(r.hca.query_cq(cq, &q), Err::ok);
  EXPECT_EQ(q.log_size, 8u);
  const uint8_t* first = static_cast<const uint8_t*>(r.va(ring.iova));
  EXPECT_EQ(p::get(first, p::cqe64::opcode), p::cqe_opcode::RESIZE_CQ);
  EXPECT_TRUE(p::cqe_sw_owned(first, 0, 6));
  // Nobody polled that boundary: one CQE outstanding, so a 1-entry ring is refused by the firmware.
  core::DmaSegment tiny = r.buffer(4096);
  core::CmdFailure f;
  EXPECT_EQ(r.hca.resize_cq(cq, 0, &tiny, 1, &f), Err::cmd_status);
  EXPECT_EQ(f.opcode, p::opcode::MODIFY_CQ);
  EXPECT_EQ(f.status, p::cmd_status::BAD_PARAM_ERR);
  EXPECT_EQ(f.syndrome, melon::mlx5::emu::synd::RESIZE_TOO_SMALL);
  EXPECT_EQ(cq->log_size, 8u);
  EXPECT_EQ(r.hca.resize_cq(cq, 1, &tiny, 1), Err::ok);  // two entries hold it
  EXPECT_EQ(cq->log_size, 1u);
  // Refused before any command.
  uint64_t cmds = r.hca.cmdq().commands_run();
  EXPECT_EQ(r.hca.resize_cq(cq, 7, &tiny, 1), Err::invalid) << "8 KiB of CQEs on one page";
  EXPECT_EQ(r.hca.resize_cq(cq, 30, &big, 1), Err::invalid);
  EXPECT_EQ(r.hca.resize_cq(nullptr, 6, &big, 1), Err::invalid);
  EXPECT_EQ(r.hca.resize_cq(cq, 6, nullptr, 0), Err::invalid);
  EXPECT_EQ(r.hca.cmdq().commands_run(), cmds);
  EXPECT_EQ(r.hca.destroy_cq(cq), Err::ok);
}

TEST_F(Objects, CqInvalidCases) {
  core::CqParams c;
  core::DmaSegment ring = r.buffer(4096), dbr = r.buffer(4096);
  c.buf = &ring, c.nbuf = 1, c.dbr_iova = dbr.iova;
  core::Cq* out = nullptr;
  c.log_size = 7;  // 8 KiB of CQEs in a 4 KiB ring
  EXPECT_EQ(r.hca.create_cq(c, &out), Err::invalid);
  c.log_size = 6;
  c.comp_vector = 5;  // only one completion EQ
  EXPECT_EQ(r.hca.create_cq(c, &out), Err::invalid);
  c.comp_vector = 0;
  c.dbr_iova = dbr.iova + 4;  // doorbell record not 8-byte aligned
  EXPECT_EQ(r.hca.create_cq(c, &out), Err::invalid);
  EXPECT_EQ(r.hca.live(core::ObjKind::cq), 0u);
}

TEST_F(Objects, FirmwareRefusalLeavesNoRecord) {
  melon::mlx5::emu::Faults f;
  f.bad_status_opcode = p::opcode::CREATE_CQ;
  f.bad_status = p::cmd_status::LIM_ERR;
  f.bad_status_syndrome = 0x77;
  r.dev->set_faults(f);
  core::CqParams c;
  core::DmaSegment ring = r.buffer(4096), dbr = r.buffer(4096);
  c.buf = &ring, c.nbuf = 1, c.dbr_iova = dbr.iova;
  core::Cq* out = nullptr;
  EXPECT_EQ(r.hca.create_cq(c, &out), Err::cmd_status);
  EXPECT_EQ(r.hca.live(core::ObjKind::cq), 0u);
  EXPECT_TRUE(r.hal->logged("MlxCmd: CREATE_CQ(0x400) op_mod 0x0 failed: status LIM_ERR(0x8) syndrome 0x77"));
  EXPECT_EQ(r.hca.create_cq(c, &out), Err::ok) << "one-shot fault: the next one works";
}

TEST_F(Objects, SrqCreateQueryArmDestroy) {
  core::SrqParams s;
  s.pd = pd;
  s.log_size = 5;
  s.log_stride = 5;
  core::DmaSegment ring = r.buffer(32 * 32), dbr = r.buffer(4096);
  s.buf = &ring, s.nbuf = 1, s.dbr_iova = dbr.iova;
  core::Srq* srq = nullptr;
  ASSERT_EQ(r.hca.create_srq(s, &srq), Err::ok);
  core::SrqQuery q;
  ASSERT_EQ(r.hca.query_srq(srq, &q), Err::ok);
  EXPECT_EQ(q.log_size, 5u);
  EXPECT_EQ(q.pd, pd->pdn);
  ASSERT_EQ(r.hca.arm_srq(srq, 4), Err::ok);
  ASSERT_EQ(r.hca.query_srq(srq, &q), Err::ok);
  EXPECT_EQ(q.lwm, 4u);
  s.log_stride = 3;  // below the 16-byte minimum
  core::Srq* bad = nullptr;
  EXPECT_EQ(r.hca.create_srq(s, &bad), Err::invalid);
  EXPECT_EQ(r.hca.destroy_srq(srq), Err::ok);
}

TEST_F(Objects, RcQpWalksEveryTransitionWithARoceV2Path) {
  core::Cq* c = cq();
  core::Qp* q = qp(core::QpType::rc, c, c);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(r.hca.free_pd(pd), Err::in_use);
  EXPECT_EQ(r.hca.destroy_cq(c), Err::in_use);
  core::QpAttr a;
  a.access = core::kAccessRemoteWrite | core::kAccessRemoteRead | core::kAccessRemoteAtomic;
  a.dest_qpn = 0x123;
  a.rq_psn = 0x1000;
  a.sq_psn = 0x2000;
  a.mtu = p::qpc_mtu::MTU_1K_BYTES;
  a.path.sgid_index = 1;
  a.path.hop_limit = 17;
  a.path.tclass = 0x28;
  a.path.udp_sport = 0xc123;
  a.path.flow_label = 0x12345;
  uint8_t mac[6] = {0x02, 0, 0, 0, 0, 7};
  memcpy(a.path.dmac, mac, 6);
  uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
  memcpy(a.path.dgid, gid, 16);
  using T = core::QpTransition;
  ASSERT_EQ(r.set_gid(1, 1), Err::ok);
  EXPECT_EQ(r.hca.modify_qp(q, T::init2rtr, a), Err::bad_state) << "RST cannot go to RTR";
  ASSERT_EQ(r.hca.modify_qp(q, T::rst2init, a), Err::ok);
  ASSERT_EQ(r.hca.modify_qp(q, T::init2init, a), Err::ok);
  ASSERT_EQ(r.hca.modify_qp(q, T::init2rtr, a), Err::ok);
  ASSERT_EQ(r.hca.modify_qp(q, T::rtr2rts, a), Err::ok);
  ASSERT_EQ(r.hca.modify_qp(q, T::rts2rts, a), Err::ok);
  core::QpQuery qq;
  ASSERT_EQ(r.hca.query_qp(q, &qq), Err::ok);
  EXPECT_EQ(qq.state, core::QpState::rts);
  EXPECT_EQ(qq.st, p::qpc_st::RC);
  EXPECT_EQ(qq.remote_qpn, 0x123u);
  EXPECT_EQ(qq.next_rcv_psn, 0x1000u);
  EXPECT_EQ(qq.next_send_psn, 0x2000u);
  EXPECT_EQ(qq.mtu, p::qpc_mtu::MTU_1K_BYTES);
  EXPECT_EQ(qq.path.sgid_index, 1u);
  EXPECT_EQ(qq.path.hop_limit, 17u);
  EXPECT_EQ(qq.path.tclass, 0x28u);
  EXPECT_EQ(qq.path.udp_sport, 0xc123u);
  EXPECT_EQ(qq.path.flow_label, 0x12345u);
  EXPECT_EQ(memcmp(qq.path.dmac, mac, 6), 0);
  EXPECT_EQ(memcmp(qq.path.dgid, gid, 16), 0);
  EXPECT_EQ(qq.cqn_snd, c->cqn);
  ASSERT_EQ(r.hca.modify_qp(q, T::to_err, a), Err::ok);
  EXPECT_EQ(r.hca.modify_qp(q, T::rtr2rts, a), Err::bad_state);
  ASSERT_EQ(r.hca.modify_qp(q, T::to_rst, a), Err::ok);
  ASSERT_EQ(r.hca.modify_qp(q, T::rst2init, a), Err::ok) << "a reset QP starts over";
  EXPECT_EQ(r.hca.destroy_qp(q), Err::ok);
  EXPECT_EQ(r.hca.destroy_cq(c), Err::ok);
}

TEST_F(Objects, UcAndUdQps) {
  core::Cq* c = cq();
  core::Qp* uc = qp(core::QpType::uc, c, c);
  core::Qp* ud = qp(core::QpType::ud, c, c);
  ASSERT_TRUE(uc && ud);
  core::QpAttr a;
  a.qkey = 0x11111111;
  a.dest_qpn = 9;
  ASSERT_EQ(r.set_gid(0, 1), Err::ok);
  using T = core::QpTransition;
  for (auto t : {T::rst2init, T::init2rtr, T::rtr2rts}) {
    ASSERT_EQ(r.hca.modify_qp(uc, t, a), Err::ok) << core::qp_transition_name(t);
    ASSERT_EQ(r.hca.modify_qp(ud, t, a), Err::ok) << core::qp_transition_name(t);
  }
  core::QpQuery qq;
  ASSERT_EQ(r.hca.query_qp(ud, &qq), Err::ok);
  EXPECT_EQ(qq.st, p::qpc_st::UD);
  EXPECT_EQ(qq.qkey, 0x11111111u);
  EXPECT_EQ(qq.state, core::QpState::rts);
  ASSERT_EQ(r.hca.query_qp(uc, &qq), Err::ok);
  EXPECT_EQ(qq.st, p::qpc_st::UC);
  EXPECT_EQ(r.hca.destroy_qp(uc), Err::ok);
  EXPECT_EQ(r.hca.destroy_qp(ud), Err::ok);
}

TEST_F(Objects, GsiIsQpOneOncePerPort) {
  core::Cq* c = cq();
  core::Qp* gsi = qp(core::QpType::gsi, c, c);
  ASSERT_NE(gsi, nullptr);
  EXPECT_EQ(gsi->qpn, 1u);
  EXPECT_STREQ(core::qp_type_name(gsi->type), "GSI");
  // A second one: the firmware's RES_BUSY, as the core's own error, and no object left behind.
  core::QpParams q;
  q.type = core::QpType::gsi;
  q.pd = pd;
  q.send_cq = q.recv_cq = c;
  core::DmaSegment ring = r.buffer(64 * 64 + 64 * 16), dbr = r.buffer(4096);
  q.buf = &ring, q.nbuf = 1, q.dbr_iova = dbr.iova;
  core::Qp* second = nullptr;
  EXPECT_EQ(r.hca.create_qp(q, &second), Err::taken);
  EXPECT_EQ(second, nullptr);
  core::QpAttr a;
  a.qkey = p::kGsiQkey;
  using T = core::QpTransition;
  for (auto t : {T::rst2init, T::init2rtr, T::rtr2rts}) ASSERT_EQ(r.hca.modify_qp(gsi, t, a), Err::ok);
  core::QpQuery qq;
  ASSERT_EQ(r.hca.query_qp(gsi, &qq), Err::ok);
  EXPECT_EQ(qq.st, p::qpc_st::QP1);
  EXPECT_EQ(qq.qkey, p::kGsiQkey);
  EXPECT_EQ(qq.state, core::QpState::rts);
  EXPECT_EQ(r.hca.destroy_qp(gsi), Err::ok);
  ASSERT_EQ(r.hca.create_qp(q, &second), Err::ok) << "free again once the first is gone";
  EXPECT_EQ(second->qpn, 1u);
  EXPECT_EQ(r.hca.destroy_qp(second), Err::ok);
}

TEST_F(Objects, QpOnAnSrq) {
  core::Cq* c = cq();
  core::SrqParams s;
  s.pd = pd;
  core::DmaSegment ring = r.buffer(4096), dbr = r.buffer(4096);
  s.buf = &ring, s.nbuf = 1, s.dbr_iova = dbr.iova;
  core::Srq* srq = nullptr;
  ASSERT_EQ(r.hca.create_srq(s, &srq), Err::ok);
  core::Qp* q = qp(core::QpType::rc, c, c, srq);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(r.hca.destroy_srq(srq), Err::in_use);
  EXPECT_EQ(r.hca.destroy_qp(q), Err::ok);
  EXPECT_EQ(r.hca.destroy_srq(srq), Err::ok);
}

TEST_F(Objects, QpInvalidCases) {
  core::Cq* c = cq();
  core::QpParams q;
  q.pd = pd, q.send_cq = c, q.recv_cq = c;
  core::DmaSegment small = r.buffer(4096), dbr = r.buffer(4096);
  q.buf = &small, q.nbuf = 1, q.dbr_iova = dbr.iova;
  core::Qp* out = nullptr;
  EXPECT_EQ(r.hca.create_qp(q, &out), Err::invalid) << "64 send WQEBBs + 64 receives need more than 4 KiB";
  q.log_sq_size = 4, q.log_rq_size = 4;
  q.recv_cq = reinterpret_cast<core::Cq*>(pd);  // a PD where a CQ belongs
  EXPECT_EQ(r.hca.create_qp(q, &out), Err::invalid);
  q.recv_cq = c;
  ASSERT_EQ(r.hca.create_qp(q, &out), Err::ok);
  core::QpAttr a;
  a.mtu = 9;
  EXPECT_EQ(r.hca.modify_qp(out, core::QpTransition::rst2init, a), Err::ok);
  EXPECT_EQ(r.hca.modify_qp(out, core::QpTransition::init2rtr, a), Err::invalid) << "MTU enumeration 9";
  EXPECT_EQ(r.hca.destroy_qp(out), Err::ok);
}

TEST_F(Objects, GidTableThroughSetRoceAddress) {
  core::GidEntry g;
  uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 1};
  memcpy(g.gid, gid, 16);
  memcpy(g.mac, r.hca.port().mac, 6);
  g.version = p::roce_version::VERSION_2;
  g.l3_type = p::roce_l3_type::IPV4;
  ASSERT_EQ(r.hca.set_gid(3, g), Err::ok);
  core::GidEntry back;
  ASSERT_EQ(r.hca.query_gid(3, &back), Err::ok);
  EXPECT_EQ(memcmp(back.gid, gid, 16), 0);
  EXPECT_EQ(memcmp(back.mac, g.mac, 6), 0);
  EXPECT_EQ(back.version, p::roce_version::VERSION_2);
  EXPECT_EQ(back.l3_type, p::roce_l3_type::IPV4) << "an IPv4-mapped GID is stored as IPv4";
  uint8_t v6[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x4d, 0x45, 0xff, 0xfe, 0x4c, 0, 1};
  memcpy(g.gid, v6, 16);
  ASSERT_EQ(r.hca.set_gid(4, g), Err::ok);
  ASSERT_EQ(r.hca.query_gid(4, &back), Err::ok);
  EXPECT_EQ(memcmp(back.gid, v6, 16), 0);
  EXPECT_EQ(back.l3_type, p::roce_l3_type::IPV6);
  ASSERT_EQ(r.hca.clear_gid(3), Err::ok);
  ASSERT_EQ(r.hca.query_gid(3, &back), Err::ok);
  uint8_t zero[16] = {};
  EXPECT_EQ(memcmp(back.gid, zero, 16), 0);
  EXPECT_EQ(r.hca.set_gid(r.hca.caps().gid_table_size, g), Err::invalid);
}

TEST(CoreAddressVector, DatagramSegmentCarriesTheRoceV2Path) {
  core::AddressPath ap;
  ap.sgid_index = 2, ap.hop_limit = 9, ap.tclass = 0x10, ap.udp_sport = 0xd00d, ap.flow_label = 0xabcde;
  uint8_t mac[6] = {1, 2, 3, 4, 5, 6};
  memcpy(ap.dmac, mac, 6);
  for (int i = 0; i < 16; ++i) ap.dgid[i] = uint8_t(i);
  core::AddressVector av;
  core::make_address_vector(ap, 0x4321, 0x11111111, &av);
  p::wqe_datagram_seg::cview v(av.bytes);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::dqpn), 0x4321u);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::qkey), 0x11111111u);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::ext), 1u);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::grh), 1u);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::sgid_index), 2u);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::hop_limit), 9u);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::tclass), 0x10u);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::rlid), 0xd00du);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::flow_label), 0xabcdeu);
  EXPECT_EQ(v.get(p::wqe_datagram_seg::rmac), 0x010203040506u);
  EXPECT_EQ(memcmp(v.bytes(p::wqe_datagram_seg::rgid), ap.dgid, 16), 0);
}

TEST_F(Objects, TeardownDestroysLiveObjectsInDependencyOrder) {
  core::Cq* c = cq();
  core::SrqParams s;
  s.pd = pd;
  core::DmaSegment ring = r.buffer(4096), dbr = r.buffer(4096);
  s.buf = &ring, s.nbuf = 1, s.dbr_iova = dbr.iova;
  core::Srq* srq = nullptr;
  ASSERT_EQ(r.hca.create_srq(s, &srq), Err::ok);
  qp(core::QpType::rc, c, c, srq);
  qp(core::QpType::ud, c, c);
  core::DmaSegment seg = r.buffer(8192);
  core::Mr* mr = nullptr;
  ASSERT_EQ(r.hca.create_mr(pd, seg.iova, 8192, 0, &seg, 1, &mr), Err::ok);
  core::Uar* u = nullptr;
  ASSERT_EQ(r.hca.alloc_uar(&u), Err::ok);
  // TearDown's teardown() must take all of it down and succeed.
}

}  // namespace
