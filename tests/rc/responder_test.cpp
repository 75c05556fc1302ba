// The responder's checks (responder.cpp), one behaviour each, through the requester of a second
// engine (host kit Pair) or a hand-made frame: what goes back on the wire, how both sides complete,
// the responder's event and state.
#include <gtest/gtest.h>

#include "common/host_kit.h"
#include "rc/wire_view.h"
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
    for (const auto& s : kit::seen(p_.b))
      if (s.pkt.info().is(roce::kAck)) v.push_back(s.pkt.aeth.syndrome);
    return v;
  }

  // A request as a hostile or a hardware peer may send it, straight into B.
  bool deliver_request(roce::BaseOp op, uint32_t psn, uint64_t va, uint32_t rkey, uint32_t dma_len,
                       uint32_t payload_len = 0) {
    roce::Packet pkt;
    pkt.bth.opcode = roce::make_opcode(roce::Transport::rc, op);
    pkt.bth.dest_qp = p_.b.qpn;
    pkt.bth.psn = psn;
    pkt.bth.ack_req = true;
    pkt.reth.va = va;
    pkt.reth.rkey = rkey;
    pkt.reth.dma_len = dma_len;
    std::vector<uint8_t> payload(payload_len, 7);
    roce::Span piece{payload.data(), payload_len};
    AddressVector av = kit::av_v4(1, 2);
    TxPacket tx;
    tx.av = &av;
    roce::IpUdp ip = tx_ip(tx);
    std::vector<uint8_t> f(roce::frame_length(false, pkt.bth.opcode, payload_len));
    roce::write_frame(ip, pkt, &piece, payload_len ? 1 : 0, f.data());
    return kit::deliver(*p_.b.engine, f);
  }
  // B's queued READ response packets, taken off its wire.
  size_t take_b_read_responses() {
    size_t n = 0;
    for (const auto& s : kit::seen(p_.b)) n += s.pkt.info().is(roce::kReadResp);
    p_.drop(p_.b);
    return n;
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

// One READ request of 1 MiB (1024 responses at MTU 1024) from a peer: the responder does not queue
// them all at once, but at most max_read_burst (128) per turn, the rest at the next ticks, in order.
TEST_F(ResponderTest, ALongReadIsAnsweredInTurnsOfABoundedBurst) {
  kit::Region& big = p_.b.mem.add(1, 1 << 20, kLocalWrite | kRemoteRead);
  ASSERT_TRUE(deliver_request(roce::kReadRequest, 0, big.va(), big.rkey, 1 << 20));
  EXPECT_EQ(take_b_read_responses(), 128u) << "a turn is bounded";
  size_t total = 128;
  for (int turn = 0; turn < 20 && total < 1024; ++turn) {
    ASSERT_LE(p_.b.engine->next_deadline(), p_.clock.t + 1) << "the next turn is due at once";
    p_.clock.t = p_.b.engine->next_deadline();
    p_.b.engine->tick();
    size_t n = take_b_read_responses();
    EXPECT_LE(n, 128u);
    total += n;
  }
  EXPECT_EQ(total, 1024u);
  EXPECT_EQ(b_state(), QpState::rts);
}

// The same, end to end: a READ longer than a turn completes at the requester with every byte.
TEST_F(ResponderTest, AReadAnsweredInTurnsCompletesWithEveryByte) {
  kit::Pair q({}, [] {
    EngineConfig c;
    c.max_read_burst = 3;
    return c;
  }());
  kit::Region& from = q.a.mem.add(1, 1 << 16, kLocalWrite);
  kit::Region& at = q.b.mem.add(1, 1 << 16, kLocalWrite | kRemoteRead);
  for (int i = 0; i < 20000; ++i) at.data()[i] = uint8_t(i * 7);
  QpInit init;
  init.pd = 1;
  ASSERT_EQ(q.connect(init, {}, {}), 0);
  Sge s{from.va(), 20000, from.lkey};
  SendWr w;
  w.opcode = WrOpcode::rdma_read;
  w.send_flags = kSignaled;
  w.sg_list = &s;
  w.num_sge = 1;
  w.remote_addr = at.va();
  w.rkey = at.rkey;
  ASSERT_EQ(q.a.engine->post_send(q.a.qpn, w), 0);
  for (int i = 0; i < 100; ++i) {
    q.settle();
    if (q.b.engine->next_deadline() > q.clock.t + 1) break;
    q.clock.t = q.b.engine->next_deadline();
    q.b.engine->tick();
  }
  Wc wc;
  ASSERT_TRUE(q.a.scq.poll(&wc));
  EXPECT_EQ(wc.status, WcStatus::success);
  for (int i = 0; i < 20000; ++i) ASSERT_EQ(from.data()[i], uint8_t(i * 7)) << i;
}

// IBA 9.7.5.1.4: a message is at most 2^31 bytes; a READ or WRITE asking for more is NAKed Invalid
// Request (before its key is even looked at).
TEST_F(ResponderTest, AReadOrWriteLongerThan2To31IsNakedInvalidRequest) {
  ASSERT_TRUE(deliver_request(roce::kReadRequest, 0, dst_->va(), dst_->rkey, 0x80000001u));
  EXPECT_EQ(b_syndromes(), std::vector<uint8_t>{roce::syndrome_nak(roce::NakCode::invalid_request)});
  EXPECT_EQ(p_.b.events.count(AsyncEvent::qp_req_err), 1u);
  EXPECT_EQ(b_state(), QpState::err);
}

TEST_F(ResponderTest, AWriteLongerThan2To31IsNakedInvalidRequest) {
  ASSERT_TRUE(deliver_request(roce::kWriteFirst, 0, dst_->va(), dst_->rkey, 0xffffffffu, 1024));
  EXPECT_EQ(b_syndromes(), std::vector<uint8_t>{roce::syndrome_nak(roce::NakCode::invalid_request)});
  EXPECT_EQ(b_state(), QpState::err);
}

// IBA C9-98, o9-22: a peer with more READs outstanding than max_dest_rd_atomic (4) is NAKed
// Invalid Request, rather than its oldest READ losing the resource it is still answered from.
TEST_F(ResponderTest, MoreReadsOutstandingThanMaxDestRdAtomicAreNakedInvalidRequest) {
  kit::Region& big = p_.b.mem.add(1, 1 << 20, kLocalWrite | kRemoteRead);
  for (uint32_t k = 0; k < 4; ++k)
    ASSERT_TRUE(deliver_request(roce::kReadRequest, k * 1024, big.va(), big.rkey, 1 << 20));
  EXPECT_TRUE(b_syndromes().empty()) << "four are allowed";
  ASSERT_TRUE(deliver_request(roce::kReadRequest, 4 * 1024, big.va(), big.rkey, 1 << 20));
  EXPECT_EQ(b_syndromes(), std::vector<uint8_t>{roce::syndrome_nak(roce::NakCode::invalid_request)});
  EXPECT_EQ(p_.b.events.count(AsyncEvent::qp_req_err), 1u);
  EXPECT_EQ(b_state(), QpState::err);
}

// A peer within the limit is never NAKed: READs answered in full free their resource for the next.
TEST_F(ResponderTest, ReadsAnsweredInFullFreeTheirResources) {
  for (uint32_t k = 0; k < 12; ++k) ASSERT_TRUE(deliver_request(roce::kReadRequest, k, dst_->va(), dst_->rkey, 64));
  EXPECT_EQ(take_b_read_responses(), 12u);
  EXPECT_EQ(b_state(), QpState::rts);
}

}  // namespace
