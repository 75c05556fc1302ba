// The completer (completer.cpp), one behaviour each: which WQEs an ACK completes and in what order,
// what a stale or repeated ACK does (nothing), READ responses and atomic ACKs landing in local
// memory, a lost ACK recovered by the timer, and the one error path (fail_wqe) a NAK takes: that WQE
// in error, the rest flushed in order, the QP in ERR (IBA 9.7.5, 10.8.3, 11.6.2).
#include <gtest/gtest.h>

#include <string.h>

#include "rc/wire_view.h"
#include "roce/aeth.h"

namespace {

using namespace melon::rc;
namespace kit = melon::kit;
namespace roce = melon::roce;

class CompleterTest : public testing::Test {
 protected:
  void SetUp() override {
    src_ = &p_.a.mem.add(1, 1 << 16, kLocalWrite);
    for (size_t i = 0; i < src_->size(); ++i) src_->data()[i] = uint8_t(i * 13 + 1);
    dst_ = &p_.b.mem.add(1, 1 << 16, kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
    for (size_t i = 0; i < dst_->size(); ++i) dst_->data()[i] = uint8_t(i * 5 + 9);
    QpInit init;
    init.pd = 1;
    ASSERT_EQ(p_.connect(init, {}, {}), 0);
  }
  int post(WrOpcode op, uint32_t len, uint32_t flags = kSignaled, uint32_t rkey = 0, uint64_t local_off = 0) {
    sge_ = Sge{src_->va(local_off), len, src_->lkey};
    SendWr w;
    w.wr_id = ++id_;
    w.opcode = op;
    w.send_flags = flags;
    w.sg_list = &sge_;
    w.num_sge = 1;
    w.remote_addr = dst_->va();
    w.rkey = rkey ? rkey : dst_->rkey;
    w.compare_add = compare_add_;
    w.swap = swap_;
    return p_.a.engine->post_send(p_.a.qpn, w);
  }
  void recv(int n) {
    for (int i = 0; i < n; ++i) {
      Sge s{dst_->va(), 4096, dst_->lkey};
      RecvWr w;
      w.wr_id = 1000 + i;
      w.sg_list = &s;
      w.num_sge = 1;
      ASSERT_EQ(p_.b.engine->post_recv(p_.b.qpn, w), 0);
    }
  }
  QpState a_state() {
    QpAttr at;
    p_.a.engine->query_qp(p_.a.qpn, &at, nullptr);
    return at.qp_state;
  }
  uint64_t word(const kit::Region* r, size_t off) {
    uint64_t v;
    memcpy(&v, r->data() + off, 8);
    return v;
  }
  kit::Pair p_;
  kit::Region* src_ = nullptr;
  kit::Region* dst_ = nullptr;
  Sge sge_;
  uint64_t id_ = 0;
  uint64_t compare_add_ = 0, swap_ = 0;
};

TEST_F(CompleterTest, OneAckForTheLastOfSeveralWqesCompletesThemAllInPostOrder) {
  recv(3);
  p_.b.engine->begin_batch();  // B answers the batch with one ACK, for the newest PSN
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  ASSERT_EQ(post(WrOpcode::rdma_write, 100), 0);
  ASSERT_EQ(post(WrOpcode::send, 2000), 0);
  p_.pump(p_.a);
  p_.b.engine->end_batch();
  auto acks = kit::seen(p_.b);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].base_op, roce::kAcknowledge);
  p_.pump(p_.b);
  auto wcs = p_.a.scq.drain();
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].opcode, WcOpcode::send);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].opcode, WcOpcode::rdma_write);
  EXPECT_EQ(wcs[2].wr_id, 3u);
  for (const auto& wc : wcs) EXPECT_EQ(wc.status, WcStatus::success);
}

TEST_F(CompleterTest, AnUnsignaledWqeIsRetiredSilentlyAndItsSignaledSuccessorCompletes) {
  recv(2);
  ASSERT_EQ(post(WrOpcode::send, 8, 0), 0);
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  p_.settle();
  auto wcs = p_.a.scq.drain();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(p_.b.rcq.size(), 2u);
}

TEST_F(CompleterTest, ARepeatedAckCompletesNothingTwiceAndLeavesTheQpAsItWas) {
  recv(1);
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  p_.pump(p_.a);
  std::deque<std::vector<uint8_t>> acks = p_.b.wire.frames;
  ASSERT_EQ(acks.size(), 1u);
  p_.pump(p_.b);
  ASSERT_EQ(p_.a.scq.total(), 1u);
  for (int i = 0; i < 3; ++i) kit::deliver(*p_.a.engine, acks.front());  // late copies of the same ACK
  EXPECT_EQ(p_.a.scq.total(), 1u);
  EXPECT_EQ(p_.a.scq.errors(), 0u);
  EXPECT_EQ(a_state(), QpState::rts);
  recv(1);  // and the QP goes on
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  p_.settle();
  EXPECT_EQ(p_.a.scq.total(), 2u);
}

TEST_F(CompleterTest, ReadResponsesLandInTheLocalBufferAndCompleteTheReadWithItsLength) {
  ASSERT_EQ(post(WrOpcode::rdma_read, 2500, kSignaled, 0, 512), 0);
  p_.pump(p_.a);
  auto resp = kit::seen(p_.b);
  EXPECT_EQ(kit::base_ops(resp),
            (std::vector<uint8_t>{roce::kReadRespFirst, roce::kReadRespMiddle, roce::kReadRespLast}));
  p_.pump(p_.b);
  auto wcs = p_.a.scq.drain();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::success);
  EXPECT_EQ(wcs[0].opcode, WcOpcode::rdma_read);
  EXPECT_EQ(wcs[0].byte_len, 2500u);
  EXPECT_EQ(std::vector<uint8_t>(src_->data() + 512, src_->data() + 512 + 2500),
            std::vector<uint8_t>(dst_->data(), dst_->data() + 2500));
}

TEST_F(CompleterTest, AnAtomicAckPutsTheOriginalValueInTheLocalBuffer) {
  const uint64_t before = word(dst_, 0);
  compare_add_ = 0x10;
  ASSERT_EQ(post(WrOpcode::atomic_fetch_and_add, 8), 0);
  p_.settle();
  EXPECT_EQ(word(src_, 0), before);
  EXPECT_EQ(word(dst_, 0), before + 0x10);
  compare_add_ = before + 0x10;  // matches: swapped
  swap_ = 0x1234;
  ASSERT_EQ(post(WrOpcode::atomic_cmp_and_swp, 8, kSignaled, 0, 8), 0);
  p_.settle();
  EXPECT_EQ(word(src_, 8), before + 0x10);
  EXPECT_EQ(word(dst_, 0), 0x1234u);
  compare_add_ = 1;  // does not match: left alone, the original still returned
  swap_ = 0x9999;
  ASSERT_EQ(post(WrOpcode::atomic_cmp_and_swp, 8, kSignaled, 0, 16), 0);
  p_.settle();
  EXPECT_EQ(word(src_, 16), 0x1234u);
  EXPECT_EQ(word(dst_, 0), 0x1234u);
  auto wcs = p_.a.scq.drain();
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].opcode, WcOpcode::fetch_add);
  EXPECT_EQ(wcs[1].opcode, WcOpcode::comp_swap);
  for (const auto& wc : wcs) {
    EXPECT_EQ(wc.status, WcStatus::success);
    EXPECT_EQ(wc.byte_len, 8u);
  }
}

TEST_F(CompleterTest, ALostAckIsRecoveredByTheTimerWithOneRetransmissionAndOneCompletion) {
  recv(1);
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  p_.pump(p_.a);
  ASSERT_EQ(p_.drop(p_.b), 1u);  // the ACK is lost
  EXPECT_EQ(p_.a.scq.total(), 0u);
  const uint64_t deadline = p_.a.engine->next_deadline();
  ASSERT_NE(deadline, UINT64_MAX);
  p_.clock.t = deadline;
  p_.a.engine->tick();
  auto again = kit::seen(p_.a);
  ASSERT_EQ(kit::base_ops(again), (std::vector<uint8_t>{roce::kSendOnly}));
  p_.settle();  // B sees a duplicate: ACKs it, delivers nothing twice
  EXPECT_EQ(p_.a.scq.total(), 1u);
  EXPECT_EQ(p_.b.rcq.total(), 1u);
  EXPECT_EQ(p_.a.engine->counters(p_.a.qpn)->retransmits, 1u);
}

TEST_F(CompleterTest, ANakFailsItsWqeFlushesTheRestInOrderAndMovesTheQpToErr) {
  recv(1);
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  ASSERT_EQ(post(WrOpcode::rdma_write, 64, kSignaled, dst_->rkey ^ 0x100), 0);  // a key B refuses
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  ASSERT_EQ(post(WrOpcode::rdma_write, 8, 0), 0);  // unsignaled, but flushed WQEs always complete
  p_.settle();
  auto wcs = p_.a.scq.drain();
  ASSERT_EQ(wcs.size(), 4u);
  EXPECT_EQ(wcs[0].status, WcStatus::success);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, WcStatus::rem_access_err);
  EXPECT_EQ(wcs[2].wr_id, 3u);
  EXPECT_EQ(wcs[2].status, WcStatus::wr_flush_err);
  EXPECT_EQ(wcs[3].wr_id, 4u);
  EXPECT_EQ(wcs[3].status, WcStatus::wr_flush_err);
  EXPECT_EQ(a_state(), QpState::err);
  // In ERR a new post completes at once with a flush, sends nothing.
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  EXPECT_TRUE(p_.a.wire.frames.empty());
  auto more = p_.a.scq.drain();
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].status, WcStatus::wr_flush_err);
}

}  // namespace
