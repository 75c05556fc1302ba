// A data-path exchange driven through the driver core between two emulated HCAs on an in-memory
// link: every object (UAR, PD, MR, CQ, RC QP) and every transition comes from src/mlx5/core; the
// test plays the provider's part (WQEs into the SQ ring, doorbell record, BlueFlame doorbell through
// the HAL, CQEs by owner bit, CQ arm) as rdma-core's mlx5 qp.c/cq.c do.
#include <gtest/gtest.h>
#include <string.h>

#include <vector>

#include "mlx5/emu/wire.h"
#include "mlx5/prm/prm.h"
#include "two_hcas.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
namespace emu = melon::mlx5::emu;
using core::Err;
using core::test::Rig;
using core::test::RigOptions;
using core::test::Side;

namespace {

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

// RTS->RTS with the access flags as an optional attribute: the core sets RWE in opt_param_mask (from
// prm/qp_modify.h) and the device applies it; without the bit the firmware ignores the new value.
TEST_F(CoreDataPath, RtsToRtsAccessChangeIsAppliedThroughTheOptionalMask) {
  core::QpAttr at;
  at.access = core::kAccessRemoteRead;  // remote write no longer allowed
  at.optional = p::qp_optpar::RRE | p::qp_optpar::RAE | p::qp_optpar::RWE;
  ASSERT_EQ(b.r.hca.modify_qp(b.qp, core::QpTransition::rts2rts, at), Err::ok);
  a.post_send(p::wqe_opcode::RDMA_WRITE, a.data.iova, 64, b.data.iova, b.mr->mkey);
  pump();
  const uint8_t* e = a.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::err_cqe::opcode), p::cqe_opcode::REQ_ERR);
  EXPECT_EQ(p::get(e, p::err_cqe::syndrome), p::cqe_syndrome::REMOTE_ACCESS_ERR);
}

TEST_F(CoreDataPath, OptionalAttributesATransitionDoesNotTakeAreRefused) {
  core::QpAttr at;
  at.optional = p::qp_optpar::RETRY_COUNT;  // RTS2RTS takes no retry count (Linux mlx5_ib opt_mask)
  uint64_t before = a.r.hca.cmdq().commands_run();
  EXPECT_EQ(a.r.hca.modify_qp(a.qp, core::QpTransition::rts2rts, at), Err::invalid);
  EXPECT_EQ(a.r.hca.cmdq().commands_run(), before) << "refused before any command";
  at.optional = p::qp_optpar::ALT_ADDR_PATH;  // no field for it: no APM
  EXPECT_EQ(a.r.hca.modify_qp(a.qp, core::QpTransition::rts2rts, at), Err::invalid);
  // SQD is unreachable on mlx5 (no RTS->SQD command): SQD_RTS is refused from RTS by the core.
  EXPECT_EQ(a.r.hca.modify_qp(a.qp, core::QpTransition::sqd2rts, {}), Err::bad_state);
  core::QpQuery qq;
  ASSERT_EQ(a.r.hca.query_qp(a.qp, &qq), Err::ok);
  EXPECT_EQ(qq.state, core::QpState::rts);
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

class CoreDataPathGsi : public CoreDataPath {
 protected:
  void SetUp() override {
    a.build(core::QpType::gsi);
    b.build(core::QpType::gsi);
    a.connect(b);
    b.connect(a);
  }
};

TEST_F(CoreDataPathGsi, MadFromQp1ToQp1WithTheGsiQkey) {
  ASSERT_EQ(a.qp->qpn, 1u);
  ASSERT_EQ(b.qp->qpn, 1u);
  b.post_recv(b.data.iova, 40 + 256);
  core::AddressPath path;
  b.gid(path.dgid);
  memcpy(path.dmac, b.r.hca.port().mac, 6);
  path.hop_limit = 64;
  core::AddressVector av;
  core::make_address_vector(path, 1, p::kGsiQkey, &av);
  for (int i = 0; i < 256; ++i) a.bytes()[i] = uint8_t(i + 5);
  a.post_send(p::wqe_opcode::SEND, a.data.iova, 256, 0, 0, 0, &av);
  pump();
  const uint8_t* e = b.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::cqe64::opcode), p::cqe_opcode::RESP_SEND);
  EXPECT_EQ(p::get(e, p::cqe64::byte_cnt), 40u + 256);
  EXPECT_EQ(p::get(e, p::cqe64::rqpn), 1u);
  EXPECT_EQ(memcmp(b.bytes() + 40, a.bytes(), 256), 0);
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
