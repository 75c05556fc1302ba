// The requester (requester.cpp), one behaviour each, read off the wire: how many packets a WQE
// takes and with which opcodes and PSNs (IBA 9.4, 9.7.1), which headers carry what, what post_send
// refuses before anything is sent, the one error path for a WQE that cannot be sent, the window.
#include <gtest/gtest.h>

#include <errno.h>

#include "rc/wire_view.h"

namespace {

using namespace melon::rc;
namespace kit = melon::kit;
namespace roce = melon::roce;

constexpr uint32_t kMtu = 1024;  // QpParams' path_mtu 3
constexpr uint32_t kFirstPsn = 0x100;

class RequesterTest : public testing::Test {
 protected:
  void connect(QpType type = QpType::rc, const EngineConfig& ca = {}) {
    p_ = std::make_unique<kit::Pair>(ca);
    src_ = &p_->a.mem.add(1, 1 << 16, kLocalWrite);
    for (size_t i = 0; i < src_->size(); ++i) src_->data()[i] = uint8_t(i * 7 + 3);
    dst_ = &p_->b.mem.add(1, 1 << 16, kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
    QpInit init;
    init.type = type;
    init.pd = 1;
    kit::QpParams pa;
    pa.sq_psn = kFirstPsn;
    ASSERT_EQ(p_->connect(init, pa, {}), 0);
  }
  int post(WrOpcode op, uint32_t len, uint32_t flags = kSignaled, uint32_t lkey = 0) {
    sge_ = Sge{src_->va(), len, lkey ? lkey : src_->lkey};
    SendWr w;
    w.wr_id = ++id_;
    w.opcode = op;
    w.send_flags = flags;
    w.sg_list = &sge_;
    w.num_sge = 1;
    w.remote_addr = dst_->va();
    w.rkey = dst_->rkey;
    w.imm = 0xfeedf00d;
    w.compare_add = 5;
    return p_->a.engine->post_send(p_->a.qpn, w);
  }
  QpState a_state() {
    QpAttr at;
    p_->a.engine->query_qp(p_->a.qpn, &at, nullptr);
    return at.qp_state;
  }
  std::unique_ptr<kit::Pair> p_;
  kit::Region* src_ = nullptr;
  kit::Region* dst_ = nullptr;
  Sge sge_;
  uint64_t id_ = 0;
};

TEST_F(RequesterTest, AWriteLongerThanTheMtuIsFirstMiddleLastWithConsecutivePsnsAndTheRethOnlyFirst) {
  connect();
  ASSERT_EQ(post(WrOpcode::rdma_write, 2500), 0);
  auto v = kit::seen(p_->a);
  ASSERT_EQ(kit::base_ops(v), (std::vector<uint8_t>{roce::kWriteFirst, roce::kWriteMiddle, roce::kWriteLast}));
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i].pkt.bth.psn, kFirstPsn + i);
  EXPECT_EQ(v[0].pkt.reth.va, dst_->va());
  EXPECT_EQ(v[0].pkt.reth.rkey, dst_->rkey);
  EXPECT_EQ(v[0].pkt.reth.dma_len, 2500u);
  EXPECT_FALSE(v[1].pkt.info().has(roce::kReth));
  EXPECT_FALSE(v[2].pkt.info().has(roce::kReth));
  // The payload is the source, cut at the MTU; the last packet asks for the ACK.
  std::vector<uint8_t> joined;
  for (const auto& s : v) joined.insert(joined.end(), s.payload.begin(), s.payload.end());
  EXPECT_EQ(v[0].payload.size(), kMtu);
  EXPECT_EQ(v[1].payload.size(), kMtu);
  EXPECT_EQ(v[2].payload.size(), 2500 - 2 * kMtu);
  EXPECT_EQ(joined, std::vector<uint8_t>(src_->data(), src_->data() + 2500));
  EXPECT_TRUE(v[2].pkt.bth.ack_req);
}

struct Split {
  WrOpcode op;
  uint32_t len;
  std::vector<uint8_t> ops;
};

// gtest prints a parameter's bytes unless told otherwise; a failing case names its opcode and length.
void PrintTo(const Split& s, std::ostream* os) { *os << "opcode " << int(s.op) << ", " << s.len << " bytes"; }

class RequesterSplit : public RequesterTest, public testing::WithParamInterface<Split> {};

TEST_P(RequesterSplit, TheMessageTakesTheOpcodesItsLengthAndKindCallFor) {
  connect();
  ASSERT_EQ(post(GetParam().op, GetParam().len), 0);
  auto v = kit::seen(p_->a);
  EXPECT_EQ(kit::base_ops(v), GetParam().ops);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i].pkt.bth.psn, kFirstPsn + i);
}

INSTANTIATE_TEST_SUITE_P(
    Lengths, RequesterSplit,
    testing::Values(Split{WrOpcode::send, 0, {roce::kSendOnly}}, Split{WrOpcode::send, 1, {roce::kSendOnly}},
                    Split{WrOpcode::send, kMtu, {roce::kSendOnly}},
                    Split{WrOpcode::send, kMtu + 1, {roce::kSendFirst, roce::kSendLast}},
                    Split{WrOpcode::send_with_imm, kMtu + 1, {roce::kSendFirst, roce::kSendLastImm}},
                    Split{WrOpcode::send_with_imm, 8, {roce::kSendOnlyImm}},
                    Split{WrOpcode::rdma_write, 0, {roce::kWriteOnly}},
                    Split{WrOpcode::rdma_write, kMtu, {roce::kWriteOnly}},
                    Split{WrOpcode::rdma_write_with_imm, 8, {roce::kWriteOnlyImm}},
                    Split{WrOpcode::rdma_write_with_imm,
                          2 * kMtu + 1,
                          {roce::kWriteFirst, roce::kWriteMiddle, roce::kWriteLastImm}},
                    Split{WrOpcode::rdma_read, 3 * kMtu, {roce::kReadRequest}},
                    Split{WrOpcode::atomic_fetch_and_add, 8, {roce::kFetchAdd}},
                    Split{WrOpcode::atomic_cmp_and_swp, 8, {roce::kCompareSwap}}));

TEST_F(RequesterTest, TheImmediateRidesOnTheLastPacketOnly) {
  connect();
  ASSERT_EQ(post(WrOpcode::send_with_imm, kMtu + 1), 0);
  auto v = kit::seen(p_->a);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_FALSE(v[0].pkt.info().has(roce::kImmDt));
  ASSERT_TRUE(v[1].pkt.info().has(roce::kImmDt));
  EXPECT_EQ(v[1].pkt.imm, 0xfeedf00du);
}

TEST_F(RequesterTest, AReadIsOneRequestButTakesAPsnPerResponsePacket) {
  connect();
  ASSERT_EQ(post(WrOpcode::rdma_read, 3000), 0);  // three responses at 1024
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  auto v = kit::seen(p_->a);
  ASSERT_EQ(kit::base_ops(v), (std::vector<uint8_t>{roce::kReadRequest, roce::kSendOnly}));
  EXPECT_EQ(v[0].pkt.reth.dma_len, 3000u);
  EXPECT_TRUE(v[0].payload.empty());
  EXPECT_EQ(v[1].pkt.bth.psn, kFirstPsn + 3);
}

TEST_F(RequesterTest, AnAtomicCarriesItsOperandsAndTakesOnePsn) {
  connect();
  ASSERT_EQ(post(WrOpcode::atomic_fetch_and_add, 8), 0);
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  auto v = kit::seen(p_->a);
  ASSERT_EQ(kit::base_ops(v), (std::vector<uint8_t>{roce::kFetchAdd, roce::kSendOnly}));
  EXPECT_EQ(v[0].pkt.atomic.va, dst_->va());
  EXPECT_EQ(v[0].pkt.atomic.rkey, dst_->rkey);
  EXPECT_EQ(v[0].pkt.atomic.swap_add, 5u);
  EXPECT_EQ(v[1].pkt.bth.psn, kFirstPsn + 1);
}

TEST_F(RequesterTest, UcRefusesReadsAndAtomicsAtPostAndSendsNothing) {
  connect(QpType::uc);
  EXPECT_EQ(post(WrOpcode::rdma_read, 8), EINVAL);
  EXPECT_EQ(post(WrOpcode::atomic_fetch_and_add, 8), EINVAL);
  EXPECT_EQ(post(WrOpcode::atomic_cmp_and_swp, 8), EINVAL);
  EXPECT_TRUE(p_->a.wire.frames.empty());
  ASSERT_EQ(post(WrOpcode::rdma_write, 8), 0);  // the QP is still usable
  EXPECT_EQ(kit::base_ops(kit::seen(p_->a)), (std::vector<uint8_t>{roce::kWriteOnly}));
}

TEST_F(RequesterTest, MoreSgesThanTheQpWasMadeForIsRefusedAtPost) {
  connect();
  Sge sges[5];
  for (auto& s : sges) s = Sge{src_->va(), 8, src_->lkey};
  SendWr w;
  w.opcode = WrOpcode::send;
  w.sg_list = sges;
  w.num_sge = 5;  // QpCaps' max_send_sge is 4
  EXPECT_EQ(p_->a.engine->post_send(p_->a.qpn, w), EINVAL);
  w.num_sge = 4;
  EXPECT_EQ(p_->a.engine->post_send(p_->a.qpn, w), 0);
  auto v = kit::seen(p_->a);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].payload.size(), 32u);  // four SGEs gathered into one packet
}

TEST_F(RequesterTest, ABadLkeyFailsThatWqeWithoutAPacketAndFlushesTheOnesAfterIt) {
  connect();
  ASSERT_EQ(post(WrOpcode::send, 8, kSignaled, src_->lkey + 1), 0);
  ASSERT_EQ(post(WrOpcode::send, 8), 0);
  EXPECT_TRUE(p_->a.wire.frames.empty());
  auto wcs = p_->a.scq.drain();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::loc_prot_err);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, WcStatus::wr_flush_err);
  EXPECT_EQ(a_state(), QpState::err);
}

TEST_F(RequesterTest, NoMoreThanTheWindowIsInFlightAndTheRestGoesAsAcksComeBack) {
  EngineConfig c;
  c.max_inflight_packets = 8;
  connect(QpType::rc, c);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(post(WrOpcode::rdma_write, 3 * kMtu), 0);  // 12 packets
  auto first = kit::seen(p_->a);
  EXPECT_LE(first.size(), 8u);
  EXPECT_GT(first.size(), 0u);
  p_->settle();
  auto wcs = p_->a.scq.drain();
  ASSERT_EQ(wcs.size(), 4u);
  for (const auto& wc : wcs) EXPECT_EQ(wc.status, WcStatus::success);
  EXPECT_EQ(std::vector<uint8_t>(dst_->data(), dst_->data() + 3 * kMtu),
            std::vector<uint8_t>(src_->data(), src_->data() + 3 * kMtu));
}

}  // namespace
