// The responder's checks (responder.cpp), one behaviour each, through the requester of a second
// engine (host kit Pair) or a hand-made frame: what goes back on the wire, how both sides complete,
// the responder's event and state.
#include <gtest/gtest.h>

#include "common/host_kit.h"
#include "roce/aeth.h"
#include "roce/opcode.h"

namespace {

using namespace melon::rc;
namespace kit = melon::kit;
namespace roce = melon::roce;

class ResponderTest : public testing::Test {
 protected:
  void SetUp() override {
    src_ = &p_.a.mem.add(1, 1 << 16, kLocalWrite);
    dst_ = &p_.b.mem.add(1, 1 << 16, kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
    QpInit init;
    init.pd = 1;
    ASSERT_EQ(p_.connect(init, {}, {}), 0);
  }
  int post(WrOpcode op, uint32_t len, uint64_t remote, uint32_t rkey) {
    sge_ = Sge{src_->va(), len, src_->lkey};
    SendWr w;
    w.wr_id = ++id_;
    w.opcode = op;
    w.send_flags = kSignaled;
    w.sg_list = &sge_;
    w.num_sge = 1;
    w.remote_addr = remote;
    w.rkey = rkey;
    return p_.a.engine->post_send(p_.a.qpn, w);
  }
  int recv(uint32_t lkey, uint32_t len) {
    Sge s{dst_->va(), len, lkey};
    RecvWr w;
    w.wr_id = 100;
    w.sg_list = &s;
    w.num_sge = 1;
    return p_.b.engine->post_recv(p_.b.qpn, w);
  }
  Wc first(kit::Cq& cq) {
    Wc wc;
    EXPECT_TRUE(cq.poll(&wc));
    return wc;
  }
  QpState b_state() {
    QpAttr a;
    p_.b.engine->query_qp(p_.b.qpn, &a, nullptr);
    return a.qp_state;
  }
  // The AETH syndromes of the ACK/NAK packets B has queued.
  std::vector<uint8_t> b_syndromes() {
    std::vector<uint8_t> v;
    for (const auto& f : p_.b.wire.frames) {
      roce::IpUdp ip;
      const uint8_t* r;
      size_t len;
      roce::Packet pkt;
      if (roce::read_frame(f.data(), f.size(), ip, &r, &len) == roce::ParseError::ok &&
          roce::parse_transport(r, len, pkt) == roce::ParseError::ok && pkt.info().is(roce::kAck))
        v.push_back(pkt.aeth.syndrome);
    }
    return v;
  }

  kit::Pair p_;
  kit::Region* src_ = nullptr;
  kit::Region* dst_ = nullptr;
  Sge sge_;
  uint64_t id_ = 0;
};

TEST_F(ResponderTest, BadRkeyIsRemoteAccessErrorWithQpAccessErrEvent) {
  ASSERT_EQ(post(WrOpcode::rdma_write, 64, dst_->va(), dst_->rkey + 1), 0);
  p_.pump(p_.a);
  EXPECT_EQ(b_syndromes(), std::vector<uint8_t>{roce::syndrome_nak(roce::NakCode::remote_access_error)});
  p_.pump(p_.b);
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::rem_access_err);
  EXPECT_EQ(b_state(), QpState::err);
  EXPECT_EQ(p_.b.events.count(AsyncEvent::qp_access_err), 1u);
}

TEST_F(ResponderTest, WriteBeyondTheRegionIsRemoteAccessError) {
  ASSERT_EQ(post(WrOpcode::rdma_write, 64, dst_->va(dst_->size() - 32), dst_->rkey), 0);
  p_.settle();
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::rem_access_err);
}

TEST_F(ResponderTest, MisalignedAtomicIsInvalidRequestWithQpReqErrEvent) {
  ASSERT_EQ(post(WrOpcode::atomic_fetch_and_add, 8, dst_->va(4), dst_->rkey), 0);
  p_.settle();
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::rem_inv_req_err);
  EXPECT_EQ(p_.b.events.count(AsyncEvent::qp_req_err), 1u);
  EXPECT_EQ(b_state(), QpState::err);
}

TEST_F(ResponderTest, SendWithoutReceiveWqeDrawsRnrNakAndCompletesOnceOnePosted) {
  ASSERT_EQ(post(WrOpcode::send, 64, 0, 0), 0);
  p_.pump(p_.a);
  EXPECT_EQ(b_syndromes(), std::vector<uint8_t>{roce::syndrome_rnr(1)});
  p_.pump(p_.b);
  EXPECT_EQ(b_state(), QpState::rts) << "RNR is not an error";
  ASSERT_EQ(recv(dst_->lkey, 4096), 0);
  p_.clock.t = p_.a.engine->next_deadline();  // the RNR back-off ends
  p_.a.engine->tick();
  p_.settle();
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::success);
  Wc r = first(p_.b.rcq);
  EXPECT_EQ(r.status, WcStatus::success);
  EXPECT_EQ(r.byte_len, 64u);
}

TEST_F(ResponderTest, SendLongerThanTheReceiveWqeIsRecvLengthError) {
  ASSERT_EQ(recv(dst_->lkey, 16), 0);
  ASSERT_EQ(post(WrOpcode::send, 64, 0, 0), 0);
  p_.settle();
  EXPECT_EQ(first(p_.b.rcq).status, WcStatus::loc_len_err);
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::rem_inv_req_err);
  EXPECT_EQ(b_state(), QpState::err);
}

TEST_F(ResponderTest, ReceiveWqeWithABadKeyIsRemoteOperationalError) {
  ASSERT_EQ(recv(dst_->lkey + 1, 4096), 0) << "keys are checked when the WQE is used, not at post";
  ASSERT_EQ(post(WrOpcode::send, 64, 0, 0), 0);
  p_.settle();
  EXPECT_EQ(first(p_.b.rcq).status, WcStatus::loc_prot_err);
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::rem_op_err);
}

TEST_F(ResponderTest, DuplicateWriteIsAckedAgainNotExecutedAgain) {
  ASSERT_EQ(post(WrOpcode::rdma_write, 64, dst_->va(), dst_->rkey), 0);
  ASSERT_EQ(p_.a.wire.frames.size(), 1u);
  std::vector<uint8_t> copy = p_.a.wire.frames.front();
  p_.settle();
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::success);
  dst_->data()[0] ^= 0xff;  // a re-execution would overwrite this
  uint8_t marker = dst_->data()[0];
  ASSERT_TRUE(kit::deliver(*p_.b.engine, copy));
  EXPECT_EQ(b_syndromes(), std::vector<uint8_t>{roce::syndrome_ack()});
  EXPECT_EQ(dst_->data()[0], marker);
  EXPECT_EQ(p_.b.engine->counters(p_.b.qpn)->duplicates, 1u);
}

TEST_F(ResponderTest, PsnGapDrawsOneSequenceNakNamingTheExpectedPsn) {
  ASSERT_EQ(post(WrOpcode::rdma_write, 4096, dst_->va(), dst_->rkey), 0);  // 4 packets at MTU 1024
  ASSERT_EQ(p_.a.wire.frames.size(), 4u);
  p_.a.wire.frames.pop_front();  // the first is lost
  p_.pump(p_.a);
  EXPECT_EQ(b_syndromes(), std::vector<uint8_t>{roce::syndrome_nak(roce::NakCode::psn_seq_error)})
      << "one NAK for three packets after the gap";
  EXPECT_EQ(p_.b.engine->counters(p_.b.qpn)->seq_naks_sent, 1u);
  p_.settle();  // the NAK makes A go back; everything completes
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::success);
  EXPECT_EQ(b_state(), QpState::rts);
}

TEST_F(ResponderTest, MiddleWithoutFirstIsOpcodeSequenceError) {
  roce::Packet pkt;
  pkt.bth.opcode = roce::make_opcode(roce::Transport::rc, roce::kSendMiddle);
  pkt.bth.dest_qp = p_.b.qpn;
  pkt.bth.psn = 0;  // the expected PSN
  std::vector<uint8_t> payload(1024, 7);
  roce::Span piece{payload.data(), 1024};
  AddressVector av = kit::av_v4(1, 2);
  TxPacket tx;
  tx.av = &av;
  roce::IpUdp ip = tx_ip(tx);
  std::vector<uint8_t> f(roce::frame_length(false, pkt.bth.opcode, 1024));
  roce::write_frame(ip, pkt, &piece, 1, f.data());
  ASSERT_EQ(recv(dst_->lkey, 4096), 0);
  ASSERT_TRUE(kit::deliver(*p_.b.engine, f));
  EXPECT_EQ(b_syndromes(), std::vector<uint8_t>{roce::syndrome_nak(roce::NakCode::invalid_request)});
  EXPECT_EQ(p_.b.events.count(AsyncEvent::qp_req_err), 1u);
  EXPECT_EQ(b_state(), QpState::err);
  EXPECT_EQ(first(p_.b.rcq).status, WcStatus::wr_flush_err) << "the untouched receive WQE is flushed by ERR";
}

TEST_F(ResponderTest, ReadServesTheRegionAndKeepsAResourceForDuplicates) {
  for (int i = 0; i < 3000; ++i) dst_->data()[i] = uint8_t(i * 3);
  ASSERT_EQ(post(WrOpcode::rdma_read, 3000, dst_->va(), dst_->rkey), 0);
  p_.settle();
  EXPECT_EQ(first(p_.a.scq).status, WcStatus::success);
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(src_->data()[i], uint8_t(i * 3)) << i;
}

}  // namespace
