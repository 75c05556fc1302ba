// The QP state machine (IBA 10.3.1): send queue drain (SQD) and its event, SQD -> RTS, and the send
// queue error state of UC/UD (SQE) and SQE -> RTS.
#include <gtest/gtest.h>

#include "common/host_kit.h"

namespace {

using namespace melon::rc;
namespace kit = melon::kit;

class QpStateTest : public testing::Test {
 protected:
  void SetUp() override {
    src_ = &p_.a.mem.add(1, 1 << 16, kLocalWrite);
    dst_ = &p_.b.mem.add(1, 1 << 16, kLocalWrite | kRemoteWrite);
    QpInit init;
    init.pd = 1;
    ASSERT_EQ(p_.connect(init, {}, {}), 0);
  }
  // An RDMA WRITE of `len` bytes from A to B.
  int write(uint64_t wr_id, uint32_t len = 2048) {
    sge_ = Sge{src_->va(), len, src_->lkey};
    SendWr w;
    w.wr_id = wr_id;
    w.opcode = WrOpcode::rdma_write;
    w.send_flags = kSignaled;
    w.sg_list = &sge_;
    w.num_sge = 1;
    w.remote_addr = dst_->va();
    w.rkey = dst_->rkey;
    return p_.a.engine->post_send(p_.a.qpn, w);
  }
  int to_state(QpState s, uint32_t extra_mask = 0, uint8_t notify = 0) {
    QpAttr a;
    a.qp_state = s;
    a.en_sqd_async_notify = notify;
    return p_.a.engine->modify_qp(p_.a.qpn, a, kAttrState | extra_mask);
  }
  QpAttr query() {
    QpAttr a;
    EXPECT_EQ(p_.a.engine->query_qp(p_.a.qpn, &a, nullptr), 0);
    return a;
  }

  kit::Pair p_;
  kit::Region* src_ = nullptr;
  kit::Region* dst_ = nullptr;
  Sge sge_;
};

TEST_F(QpStateTest, SqDrainedComesWhenTheAcksDrainTheSendQueue) {
  ASSERT_EQ(write(1), 0);
  ASSERT_EQ(write(2), 0);
  ASSERT_EQ(to_state(QpState::sqd, kAttrEnSqdAsyncNotify, 1), 0);
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 0u) << "requests are still unacknowledged";
  EXPECT_EQ(query().qp_state, QpState::sqd);
  EXPECT_EQ(query().sq_draining, 1);
  p_.pump(p_.a);  // the WRITEs reach B
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 0u);
  p_.pump(p_.b);  // B's ACKs drain A's send queue
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 1u);
  EXPECT_EQ(p_.a.events.log.back().num, p_.a.qpn);
  EXPECT_EQ(query().sq_draining, 0);
  EXPECT_EQ(p_.a.scq.total(), 2u);
  p_.settle();
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 1u) << "once per drain";
}

TEST_F(QpStateTest, SqDrainedComesAtOnceWhenTheSendQueueIsAlreadyEmpty) {
  ASSERT_EQ(to_state(QpState::sqd, kAttrEnSqdAsyncNotify, 1), 0);
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 1u);
  EXPECT_EQ(query().sq_draining, 0);
}

TEST_F(QpStateTest, NoSqDrainedWithoutEnSqdAsyncNotify) {
  ASSERT_EQ(write(1), 0);
  ASSERT_EQ(to_state(QpState::sqd), 0);
  p_.settle();
  EXPECT_EQ(p_.a.scq.total(), 1u);
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 0u);
  ASSERT_EQ(to_state(QpState::rts), 0);
  ASSERT_EQ(to_state(QpState::sqd, kAttrEnSqdAsyncNotify, 0), 0);
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 0u) << "the mask bit with en_sqd_async_notify = 0";
}

TEST_F(QpStateTest, SqdFinishesTheStartedMessageAndStartsNoNewOne) {
  // 8 KiB at MTU 1024: eight packets, of which the requester sends them all before SQD; the WR
  // posted in SQD waits.
  ASSERT_EQ(write(1, 8192), 0);
  ASSERT_EQ(to_state(QpState::sqd, kAttrEnSqdAsyncNotify, 1), 0);
  ASSERT_EQ(write(2), 0) << "posting in SQD is allowed";
  EXPECT_EQ(p_.a.wire.frames.size(), 8u) << "only the started WRITE went out";
  p_.settle();
  EXPECT_EQ(p_.a.scq.total(), 1u);
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 1u);
  EXPECT_EQ(query().sq_draining, 0);
  // SQD -> RTS: the waiting WR goes.
  ASSERT_EQ(to_state(QpState::rts), 0);
  p_.settle();
  EXPECT_EQ(p_.a.scq.total(), 2u);
  Wc wc;
  ASSERT_TRUE(p_.a.scq.poll(&wc));
  EXPECT_EQ(wc.wr_id, 1u);
  ASSERT_TRUE(p_.a.scq.poll(&wc));
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.status, WcStatus::success);
}

TEST_F(QpStateTest, SqdToSqdAndBackToRtsKeepTheQpUsable) {
  ASSERT_EQ(to_state(QpState::sqd), 0);
  ASSERT_EQ(to_state(QpState::sqd), 0) << "SQD -> SQD (attribute changes while drained)";
  ASSERT_EQ(to_state(QpState::rts), 0);
  ASSERT_EQ(write(7), 0);
  p_.settle();
  Wc wc;
  ASSERT_TRUE(p_.a.scq.poll(&wc));
  EXPECT_EQ(wc.status, WcStatus::success);
  EXPECT_EQ(query().qp_state, QpState::rts);
}

TEST_F(QpStateTest, LeavingSqdBeforeTheDrainCancelsTheEvent) {
  ASSERT_EQ(write(1), 0);
  ASSERT_EQ(to_state(QpState::sqd, kAttrEnSqdAsyncNotify, 1), 0);
  ASSERT_EQ(to_state(QpState::rts), 0);
  p_.settle();
  EXPECT_EQ(p_.a.events.count(AsyncEvent::sq_drained), 0u);
}

TEST_F(QpStateTest, TransitionsTheTableDoesNotListAreRefused) {
  EXPECT_EQ(to_state(QpState::sqe), EINVAL) << "RTS -> SQE is the engine's, not the user's";
  EXPECT_EQ(to_state(QpState::rtr), EINVAL);
  ASSERT_EQ(to_state(QpState::sqd), 0);
  EXPECT_EQ(to_state(QpState::init), EINVAL);
  EXPECT_EQ(query().qp_state, QpState::sqd);
}

// UD: a send-side local error takes the QP to SQE (IBA 10.3.1.5): the failing WR completes with
// its error, later sends are flushed, receives keep working, and SQE -> RTS resumes sending.
TEST(UdSqe, LocalProtectionErrorGoesToSqeAndSqeToRtsResumes) {
  kit::Pair p;
  kit::Region& src = p.a.mem.add(1, 4096, kLocalWrite);
  kit::Region& rbuf = p.b.mem.add(1, 4096, kLocalWrite);
  kit::Region& arbuf = p.a.mem.add(1, 4096, kLocalWrite);
  QpInit init;
  init.type = QpType::ud;
  init.pd = 1;
  ASSERT_EQ(p.connect(init, {}, {}), 0);
  AddressVector to_b = kit::av_v4(1, 2), to_a = kit::av_v4(2, 1);
  auto send = [&](kit::Pair::Side& s, uint32_t dest, const AddressVector* av, Sge sge, uint64_t id) {
    SendWr w;
    w.wr_id = id;
    w.opcode = WrOpcode::send;
    w.send_flags = kSignaled;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.ah = av;
    w.remote_qpn = dest;
    w.remote_qkey = 0x11111111;
    return s.engine->post_send(s.qpn, w);
  };
  auto recv = [&](kit::Pair::Side& s, kit::Region& r) {
    Sge sge{r.va(), 4096, r.lkey};
    RecvWr w;
    w.sg_list = &sge;
    w.num_sge = 1;
    return s.engine->post_recv(s.qpn, w);
  };
  ASSERT_EQ(send(p.a, p.b.qpn, &to_b, Sge{src.va(), 64, src.lkey + 1}, 1), 0);  // a key A never issued
  QpAttr q;
  ASSERT_EQ(p.a.engine->query_qp(p.a.qpn, &q, nullptr), 0);
  EXPECT_EQ(q.qp_state, QpState::sqe);
  Wc wc;
  ASSERT_TRUE(p.a.scq.poll(&wc));
  EXPECT_EQ(wc.status, WcStatus::loc_prot_err);
  ASSERT_EQ(send(p.a, p.b.qpn, &to_b, Sge{src.va(), 64, src.lkey}, 2), 0);
  ASSERT_TRUE(p.a.scq.poll(&wc));
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.status, WcStatus::wr_flush_err) << "sends posted in SQE are flushed";
  EXPECT_TRUE(p.a.wire.frames.empty());

  // The receive queue works in SQE.
  ASSERT_EQ(recv(p.a, arbuf), 0);
  ASSERT_EQ(send(p.b, p.a.qpn, &to_a, Sge{rbuf.va(), 32, rbuf.lkey}, 3), 0);
  p.settle();
  ASSERT_TRUE(p.a.rcq.poll(&wc));
  EXPECT_EQ(wc.status, WcStatus::success);
  EXPECT_EQ(wc.byte_len, 40u + 32u);

  // SQE -> RTS, and sending works again.
  QpAttr a;
  a.qp_state = QpState::rts;
  ASSERT_EQ(p.a.engine->modify_qp(p.a.qpn, a, kAttrState), 0);
  ASSERT_EQ(recv(p.b, rbuf), 0);
  ASSERT_EQ(send(p.a, p.b.qpn, &to_b, Sge{src.va(), 64, src.lkey}, 4), 0);
  p.settle();
  ASSERT_TRUE(p.a.scq.poll(&wc));
  EXPECT_EQ(wc.wr_id, 4u);
  EXPECT_EQ(wc.status, WcStatus::success);
  ASSERT_TRUE(p.b.rcq.poll(&wc));
  EXPECT_EQ(wc.byte_len, 40u + 64u);
}

// A QP on an SRQ tells its owner once that its last WQE is done: on the move to ERR (IBA 11.6.3.1),
// not again when it is modified to ERR while there (UCX moves its QPs to ERR twice on teardown and
// asserts on a second event); a QP reset and moved to ERR anew tells it again.
TEST(QpStateSrq, LastWqeReachedOnceOnTheMoveToErr) {
  kit::Pair p;
  Srq* srq = nullptr;
  uint32_t srqn = 0;
  ASSERT_EQ(p.b.engine->create_srq(1, 8, 1, 0, &srq, &srqn), 0);
  QpInit init;
  init.pd = 1;
  init.srq = srq;
  init.send_cq = &p.b.scq;
  init.recv_cq = &p.b.rcq;
  uint32_t qpn = 0;
  ASSERT_EQ(p.b.engine->create_qp(init, &qpn), 0);
  QpAttr a;
  a.qp_state = QpState::err;
  ASSERT_EQ(p.b.engine->modify_qp(qpn, a, kAttrState), 0);
  EXPECT_EQ(p.b.events.count(AsyncEvent::qp_last_wqe_reached), 1u);
  ASSERT_EQ(p.b.engine->modify_qp(qpn, a, kAttrState), 0);
  EXPECT_EQ(p.b.events.count(AsyncEvent::qp_last_wqe_reached), 1u) << "already in ERR";
  QpAttr r;
  r.qp_state = QpState::reset;
  ASSERT_EQ(p.b.engine->modify_qp(qpn, r, kAttrState), 0);
  ASSERT_EQ(p.b.engine->modify_qp(qpn, a, kAttrState), 0);
  EXPECT_EQ(p.b.events.count(AsyncEvent::qp_last_wqe_reached), 2u);
  for (const auto& e : p.b.events.log)
    if (e.ev == AsyncEvent::qp_last_wqe_reached) EXPECT_EQ(e.num, qpn) << "an event of the QP, not the SRQ";
}

}  // namespace
