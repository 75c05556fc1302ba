// MODIFY_CQ with op_mod RESIZE_CQ: the boundary CQE in the old ring, the unpolled CQEs the consumer
// carries over, the new ring taking the next CQEs, and every refusal with its syndrome.
#include "harness.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace wo = prm::wqe_opcode;
namespace co = prm::cqe_opcode;
namespace rs = prm::cq_resize_select;

// A QP in ERR turns every signalled NOP into a CQE whose wqe_counter says which one it was:
// CQEs on demand, without a peer.
struct Rig {
  Harness h;
  Harness::CqRing cq;
  Harness::QpRing qp;
  explicit Rig(uint8_t log_size, bool oi = false) {
    h.bring_up();
    Result r = h.create_cq_raw(cq, log_size, h.eqn, [oi](uint8_t* in) {
      prm::create_cq_in::view(in).at(prm::create_cq_in::cq_context).set(prm::cqc::oi, oi);
    });
    EXPECT_TRUE(r.ok());
    EXPECT_TRUE(h.create_qp_raw(qp, prm::qpc_st::RC, cq, cq).ok());
    uint8_t ip[4] = {10, 0, 0, 9};
    EXPECT_TRUE(h.set_gid(0, ip).ok());
    EXPECT_TRUE(h.transition(op::QP_2ERR, qp.qpn).ok());
  }
  void nops(int n) {
    for (int i = 0; i < n; ++i) h.post_send(qp, wo::NOP, {});
    h.dev.service();
  }
  uint32_t status_of_cq() {
    auto q = cmd_in(op::QUERY_CQ, 16);
    prm::set(q.data(), prm::query_cq_in::cqn, cq.cqn);
    Result r = h.exec(q, Harness::out_size(op::QUERY_CQ));
    return uint32_t(prm::query_cq_out::cview(r.out.data()).at(prm::query_cq_out::cq_context).get(prm::cqc::status));
  }
  uint32_t log_size_of_cq() {
    auto q = cmd_in(op::QUERY_CQ, 16);
    prm::set(q.data(), prm::query_cq_in::cqn, cq.cqn);
    Result r = h.exec(q, Harness::out_size(op::QUERY_CQ));
    return uint32_t(
        prm::query_cq_out::cview(r.out.data()).at(prm::query_cq_out::cq_context).get(prm::cqc::log_cq_size));
  }
  // MODIFY_CQ op_mod RESIZE_CQ onto `ring` (pages of it; `pages` < 0: as many as it needs).
  Result resize(const TestHost::Buffer& ring, uint8_t log_size, uint32_t sel = rs::LOG_CQ_SIZE, int pages = -1,
                uint16_t op_mod = prm::kModifyCqOpModResize, uint32_t cqn = 0) {
    uint32_t n = pages < 0 ? ((64u << log_size) + 4095) / 4096 : uint32_t(pages);
    auto in = cmd_in(op::MODIFY_CQ, prm::modify_cq_in::size_bytes + 8 * n, op_mod);
    prm::modify_cq_in::view v(in.data());
    v.set(prm::modify_cq_in::cqn, cqn ? cqn : cq.cqn).set(prm::modify_cq_in::field_select, sel);
    v.at(prm::modify_cq_in::cq_context).set(prm::cqc::log_cq_size, log_size);
    for (uint32_t i = 0; i < n; ++i) prm::pas_set(v.elem(prm::modify_cq_in::pas, i), ring.iova + 4096ull * i);
    return h.exec(in, Harness::out_size(op::MODIFY_CQ));
  }
  TestHost::Buffer new_ring(uint8_t log_size) {
    TestHost::Buffer b = h.host.alloc(64u << log_size);
    for (uint32_t i = 0; i < (1u << log_size); ++i) static_cast<uint8_t*>(b.va)[64 * i + 63] = 0xf1;
    return b;
  }
};

uint8_t* cqe_at(const Harness::CqRing& cq, uint32_t i) {
  return static_cast<uint8_t*>(cq.buf.va) + 64 * (i & ((1u << cq.log_size) - 1));
}

TEST(EmuCqResize, CapabilityIsReported) {
  Harness h;
  h.bring_up();
  for (uint8_t mode : {prm::cap_mode::GET_MAX, prm::cap_mode::GET_CUR}) {
    auto q = cmd_in(op::QUERY_HCA_CAP, 16, prm::cap_op_mod(prm::cap_type::GENERAL_DEVICE, mode));
    Result r = h.exec(q, Harness::out_size(op::QUERY_HCA_CAP));
    ASSERT_TRUE(r.ok());
    const uint8_t* cap = prm::query_hca_cap_out::cview(r.out.data()).bytes(prm::query_hca_cap_out::capability);
    EXPECT_EQ(prm::get(cap, prm::cmd_hca_cap::cq_resize), 1u) << int(mode);
  }
}

TEST(EmuCqResize, UnpolledCqesSurviveAndTheNewRingTakesTheNext) {
  Rig g(2);  // 4 entries
  g.nops(3);
  const uint8_t* e = g.h.poll_cq(g.cq);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::wqe_counter), 0u);
  TestHost::Buffer ring = g.new_ring(4);
  Result r = g.resize(ring, 4);
  ASSERT_TRUE(r.ok()) << std::hex << r.syndrome;
  EXPECT_EQ(g.log_size_of_cq(), 4u);
  // The boundary sits where the fourth CQE would have gone, owned by software.
  const uint8_t* b = cqe_at(g.cq, 3);
  EXPECT_TRUE(prm::cqe_sw_owned(b, 3, g.cq.log_size));
  EXPECT_EQ(prm::get(b, prm::cqe64::opcode), co::RESIZE_CQ);
  // The consumer's copy: old index i goes to new index i + 1, with the new ring's owner bit.
  Harness::CqRing next = g.cq;
  next.buf = ring;
  next.log_size = 4;
  uint32_t i = g.cq.ci;
  for (; prm::get(cqe_at(g.cq, i), prm::cqe64::opcode) != co::RESIZE_CQ; ++i) {
    uint8_t* d = cqe_at(next, i + 1);
    memcpy(d, cqe_at(g.cq, i), 64);
    prm::cqe64::view(d).set(prm::cqe64::owner, ((i + 1) >> next.log_size) & 1);
    ASSERT_LT(i, g.cq.ci + 4) << "no RESIZE_CQ CQE in the old ring";
  }
  EXPECT_EQ(i, 3u);
  next.ci = g.cq.ci + 1;
  for (uint32_t want = 1; want < 3; ++want) {
    e = g.h.poll_cq(next);
    ASSERT_NE(e, nullptr) << want;
    EXPECT_EQ(prm::get(e, prm::cqe64::wqe_counter), want);
  }
  EXPECT_EQ(g.h.poll_cq(next), nullptr);
  // More than the old ring held, in order, in the new one.
  g.nops(9);
  for (uint32_t want = 3; want < 12; ++want) {
    e = g.h.poll_cq(next);
    ASSERT_NE(e, nullptr) << want;
    EXPECT_EQ(prm::get(e, prm::cqe64::wqe_counter), want);
  }
  EXPECT_EQ(g.h.poll_cq(next), nullptr);
  EXPECT_EQ(g.status_of_cq(), prm::cqc_status::OK);
}

TEST(EmuCqResize, RefusesBadRequests) {
  Rig g(2);
  TestHost::Buffer ring = g.new_ring(4);
  auto expect = [](const Result& r, uint8_t status, uint32_t syndrome) {
    EXPECT_EQ(r.status, status);
    EXPECT_EQ(r.syndrome, syndrome) << std::hex << r.syndrome;
  };
  using S = prm::cmd_status::Value;
  expect(g.resize(ring, 4, 0), S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);  // no log_cq_size
  expect(g.resize(ring, 4, rs::LOG_CQ_SIZE | 0x8), S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  expect(g.resize(ring, 23, rs::LOG_CQ_SIZE, 1), S::BAD_PARAM_ERR, synd::BAD_QUEUE_SIZE);
  expect(g.resize(ring, 7, rs::LOG_CQ_SIZE, 1), S::BAD_PARAM_ERR, synd::PAS_TOO_SHORT);  // 8 KiB on 1 page
  expect(g.resize(ring, 4, rs::LOG_CQ_SIZE, -1, 2), S::BAD_PARAM_ERR, synd::BAD_OP_MOD);
  expect(g.resize(ring, 4, rs::LOG_CQ_SIZE, -1, prm::kModifyCqOpModResize, 0x7777), S::BAD_RES_ERR, synd::UNKNOWN_CQ);
  EXPECT_EQ(g.log_size_of_cq(), 2u);
}

TEST(EmuCqResize, RefusesANewRingSmallerThanTheOutstandingCqes) {
  Rig g(2);
  g.nops(3);
  TestHost::Buffer ring = g.new_ring(1);
  Result r = g.resize(ring, 1);  // 2 entries for 3 CQEs
  EXPECT_EQ(r.status, prm::cmd_status::BAD_PARAM_ERR);
  EXPECT_EQ(r.syndrome, synd::RESIZE_TOO_SMALL);
  // Nothing moved: no boundary, the three CQEs where they were, then the ring goes on as before.
  EXPECT_EQ(g.log_size_of_cq(), 2u);
  for (uint32_t want = 0; want < 3; ++want) {
    const uint8_t* e = g.h.poll_cq(g.cq);
    ASSERT_NE(e, nullptr);
    EXPECT_NE(prm::get(e, prm::cqe64::opcode), co::RESIZE_CQ);
    EXPECT_EQ(prm::get(e, prm::cqe64::wqe_counter), want);
  }
  EXPECT_EQ(g.h.poll_cq(g.cq), nullptr);
  // Once polled, the same small ring is enough.
  EXPECT_TRUE(g.resize(ring, 1).ok());
}

TEST(EmuCqResize, RefusesACqInError) {
  Rig g(1);  // 2 entries: the third CQE overruns
  g.nops(3);
  ASSERT_EQ(g.status_of_cq(), prm::cqc_status::CQ_OVERFLOW);
  TestHost::Buffer ring = g.new_ring(4);
  Result r = g.resize(ring, 4);
  EXPECT_EQ(r.status, prm::cmd_status::BAD_RES_STATE_ERR);
  EXPECT_EQ(r.syndrome, synd::CQ_IN_ERROR);
}

TEST(EmuCqResize, RefusesAFullRingThatHasNoRoomForTheBoundary) {
  Rig g(1, /*oi=*/true);  // overrun ignored: the ring can fill without an error
  g.nops(2);
  TestHost::Buffer ring = g.new_ring(4);
  Result r = g.resize(ring, 4);
  EXPECT_EQ(r.status, prm::cmd_status::BAD_RES_STATE_ERR);
  EXPECT_EQ(r.syndrome, synd::CQ_RING_FULL);
  EXPECT_NE(g.h.poll_cq(g.cq), nullptr);
  ASSERT_TRUE(g.resize(ring, 4).ok());
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
