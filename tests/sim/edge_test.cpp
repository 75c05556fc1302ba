// Named edge cases of the transport engine, each driven through the deterministic simulator and
// observed on the simulated wire. One behaviour per test; names read as the rule they check.
// MELON_SIM_SEED=<n> changes the seed (printed per test); MELON_SIM_TRACE=1 prints every frame.
#include <gtest/gtest.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <vector>

#include "roce/aeth.h"
#include "roce/icrc.h"
#include "roce/psn.h"
#include "sim/sim.h"

namespace {

using namespace melon::rc;
using namespace melon::sim;
namespace kit = melon::kit;
using melon::roce::AckType;
using melon::roce::BaseOp;

constexpr uint32_t kPd = 3;
constexpr uint64_t kMs = 1'000'000;

// A frame as a test remembers it.
struct Seen {
  int from, to;
  uint64_t t;
  uint8_t opcode;
  uint32_t psn;
  uint32_t qp;
  uint8_t syndrome;
  uint64_t atomic_orig;
  uint32_t payload_len;
  uint64_t reth_va;
  uint32_t reth_len;
  std::vector<uint8_t> frame;
  uint8_t base() const { return opcode & 0x1f; }
  bool is(BaseOp op) const { return base() == op; }
  AckType ack_type() const { return melon::roce::syndrome_type(syndrome); }
};

Seen remember(const WireFrame& w) {
  Seen s{};
  s.from = w.from;
  s.to = w.to;
  s.t = w.time;
  s.opcode = w.pkt.bth.opcode;
  s.psn = w.pkt.bth.psn;
  s.qp = w.pkt.bth.dest_qp;
  s.syndrome = w.pkt.info().has(melon::roce::kAeth) ? w.pkt.aeth.syndrome : 0;
  s.atomic_orig = w.pkt.atomic_orig;
  s.payload_len = w.pkt.payload_len;
  s.reth_va = w.pkt.reth.va;
  s.reth_len = w.pkt.reth.dma_len;
  s.frame = *w.frame;
  return s;
}

SendWr make_wr(WrOpcode op, uint64_t id, const Sge* sg, int n, uint32_t flags = kSignaled) {
  SendWr wr;
  wr.wr_id = id;
  wr.opcode = op;
  wr.sg_list = sg;
  wr.num_sge = n;
  wr.send_flags = flags;
  return wr;
}

class Edge : public testing::Test {
 protected:
  void SetUp() override {
    seed_ = test_seed(0xed6e5eed);
    printf("[sim] seed %llu (MELON_SIM_SEED to change)\n", (unsigned long long)seed_);
    sim_ = std::make_unique<Sim>(seed_);
    a_ = sim_->add_node("A", v6_);
    b_ = sim_->add_node("B", v6_);
    sim_->on_transmit = [this](const WireFrame& w) {
      tx_.push_back(remember(w));
      return !(drop_ && drop_(w));
    };
    sim_->on_deliver = [this](const WireFrame& w) {
      rx_.push_back(remember(w));
      if (on_rx_) on_rx_(w);
    };
  }
  void TearDown() override {
    for (const std::string& e : sim_->errors()) ADD_FAILURE() << "simulator: " << e;
  }

  Region& mr(int node, size_t size, uint32_t access, uint8_t fill = 0) {
    Region& r = sim_->mem(node).add(kPd, size, access);
    memset(r.data(), fill, size);
    return r;
  }
  void connect(QpOptions oa = {}, QpOptions ob = {}) {
    oa.pd = ob.pd = kPd;
    qa_ = {a_, 0, &scq_a_, &rcq_a_};
    qb_ = {b_, 0, &scq_b_, &rcq_b_};
    ASSERT_EQ(connect_pair(*sim_, qa_, qb_, oa, ob), 0);
  }
  int post(const QpEnd& e, const SendWr& wr) { return sim_->engine(e.node).post_send(e.qpn, wr); }
  int post_recv(const QpEnd& e, uint64_t id, const Sge* sg, int n) {
    RecvWr r;
    r.wr_id = id;
    r.sg_list = sg;
    r.num_sge = n;
    return sim_->engine(e.node).post_recv(e.qpn, r);
  }
  bool wait(kit::Cq& cq, size_t n, uint64_t ns = 100 * kMs) {
    return sim_->run_until([&] { return cq.size() >= n; }, sim_->now() + ns);
  }
  std::vector<Wc> drain(kit::Cq& cq) {
    std::vector<Wc> v;
    Wc wc;
    while (cq.poll(&wc)) v.push_back(wc);
    return v;
  }
  std::vector<Seen> sent(int from, uint8_t base_op) const {
    std::vector<Seen> v;
    for (const Seen& s : tx_)
      if (s.from == from && s.base() == base_op) v.push_back(s);
    return v;
  }

  bool v6_ = false;
  uint64_t seed_ = 0;
  std::unique_ptr<Sim> sim_;
  int a_ = 0, b_ = 1;
  kit::Cq scq_a_, rcq_a_, scq_b_, rcq_b_;
  QpEnd qa_, qb_;
  std::vector<Seen> tx_, rx_;
  std::function<bool(const WireFrame&)> drop_;
  std::function<void(const WireFrame&)> on_rx_;
};

// ---- frames -------------------------------------------------------------------------------------

// engine.h documents TxPacket::pkt's payload fields as unused; the BTH PadCnt must therefore come
// from TxPacket::payload_len (IBA 9.2.3: payload + pad is a multiple of 4).
TEST(WireFrames, PadCountFollowsTheTxPayloadLength) {
  // The frame writer must take PadCnt from the payload it gathers, not from tx.pkt.payload_len, which
  // requester.cpp/responder.cpp never set: else 1..3 zero bytes would count as payload.
  uint8_t payload[5] = {1, 2, 3, 4, 5};
  AddressVector av;
  melon::roce::gid_from_ipv4(av.sgid, 0x0a000001);
  melon::roce::gid_from_ipv4(av.dgid, 0x0a000002);
  TxPacket tx;
  tx.pkt.bth.opcode = melon::roce::make_opcode(melon::roce::Transport::rc, melon::roce::kSendOnly);
  tx.pkt.bth.dest_qp = 0x11;
  tx.iov[0] = {payload, 5};
  tx.niov = 1;
  tx.payload_len = 5;
  tx.av = &av;
  std::vector<uint8_t> f(melon::roce::frame_length(false, tx.pkt.bth.opcode, tx.payload_len));
  size_t n = melon::roce::write_frame(tx_ip(tx), tx.pkt, tx.iov, tx.niov, f.data());
  ASSERT_EQ(n, f.size());
  melon::roce::IpUdp ip;
  const uint8_t* roce;
  size_t len;
  ASSERT_EQ(melon::roce::read_frame(f.data(), n, ip, &roce, &len), melon::roce::ParseError::ok);
  EXPECT_EQ(ip.sport, tx.udp_sport) << "the frame carries the engine's entropy source port";
  melon::roce::Packet p;
  ASSERT_EQ(melon::roce::parse_transport(roce, len, p), melon::roce::ParseError::ok);
  EXPECT_EQ(p.bth.pad, 3) << "PadCnt taken from tx.pkt.payload_len (left 0 by the engine)";
  EXPECT_EQ(p.payload_len, 5u);
}

TEST(WireFrames, CorruptedFrameIsRejectedWithBadIcrcAndNeverReachesTheEngine) {
  Sim sim(test_seed(7));
  int a = sim.add_node("A"), b = sim.add_node("B");
  sim.faults().corrupt = 1.0;
  kit::Cq scq, rcq, scq2, rcq2;
  QpEnd qa{a, 0, &scq, &rcq}, qb{b, 0, &scq2, &rcq2};
  QpOptions o;
  o.timeout = 8;
  o.retry_cnt = 1;
  ASSERT_EQ(connect_pair(sim, qa, qb, o, o), 0);
  int delivered = 0;
  sim.on_deliver = [&](const WireFrame&) { ++delivered; };
  SendWr wr = make_wr(WrOpcode::send, 1, nullptr, 0);
  ASSERT_EQ(sim.engine(a).post_send(qa.qpn, wr), 0);
  ASSERT_TRUE(sim.run_until([&] { return scq.size() >= 1; }, sim.now() + 100 * kMs));
  Wc wc;
  ASSERT_TRUE(scq.poll(&wc));
  EXPECT_EQ(wc.status, WcStatus::retry_exc_err);
  EXPECT_EQ(delivered, 0);
  EXPECT_EQ(sim.stats().corrupted, 2u);  // the first try and one retry
  EXPECT_EQ(sim.stats().corrupt_rejected, sim.stats().corrupted);
  EXPECT_EQ(sim.stats().delivered, 0u);
  EXPECT_TRUE(sim.errors().empty());
}

// ---- RNR ----------------------------------------------------------------------------------------

TEST_F(Edge, RnrNakThenSuccessOnceAReceiveIsPosted) {
  QpOptions oa, ob;
  ob.min_rnr_timer = 4;  // B asks for 40 us (IBA Table 45)
  connect(oa, ob);
  Region& src = mr(a_, 100, 0, 0x5a);
  Region& dst = mr(b_, 256, kLocalWrite, 0);
  Sge s{src.va(), 100, src.lkey};
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 1, &s, 1)), 0);
  sim_->run_for(1 * kMs);
  EXPECT_EQ(scq_a_.size(), 0u) << "no receive posted: the SEND must not complete";
  int rnr = 0;
  for (const Seen& x : tx_)
    if (x.from == b_ && x.is(melon::roce::kAcknowledge) && x.ack_type() == AckType::rnr_nak) ++rnr;
  EXPECT_GE(rnr, 2);
  // Retries are spaced by at least the RNR timer B advertised (IBA 9.7.5.2.8).
  auto sends = sent(a_, melon::roce::kSendOnly);
  ASSERT_GE(sends.size(), 2u);
  for (size_t i = 1; i < sends.size(); ++i)
    EXPECT_GE(sends[i].t - sends[i - 1].t, melon::roce::rnr_timer_ns(4)) << "retry " << i;
  Sge d{dst.va(), 256, dst.lkey};
  ASSERT_EQ(post_recv(qb_, 77, &d, 1), 0);
  ASSERT_TRUE(wait(scq_a_, 1));
  auto wcs = drain(scq_a_);
  EXPECT_EQ(wcs[0].status, WcStatus::success) << describe(wcs[0]);
  EXPECT_EQ(wcs[0].opcode, WcOpcode::send);
  auto rwc = drain(rcq_b_);
  ASSERT_EQ(rwc.size(), 1u);
  EXPECT_EQ(rwc[0].wr_id, 77u);
  EXPECT_EQ(rwc[0].byte_len, 100u);
  EXPECT_EQ(memcmp(dst.data(), src.data(), 100), 0);
  EXPECT_GE(sim_->engine(a_).counters(qa_.qpn)->rnr_naks_received, 2u);
}

TEST_F(Edge, RnrRetryExhaustionCompletesWithRnrRetryExcErrAndFlushesTheRest) {
  QpOptions oa, ob;
  oa.rnr_retry = 3;
  ob.min_rnr_timer = 1;
  connect(oa, ob);
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 1, nullptr, 0)), 0);
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 2, nullptr, 0)), 0);
  ASSERT_TRUE(wait(scq_a_, 2));
  auto wcs = drain(scq_a_);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::rnr_retry_exc_err) << describe(wcs[0]);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, WcStatus::wr_flush_err) << describe(wcs[1]);
  // The first try and rnr_retry retries, each answered by an RNR NAK.
  uint32_t first_psn = sent(a_, melon::roce::kSendOnly).at(0).psn;
  int tries = 0, naks = 0;
  for (const Seen& x : tx_) {
    if (x.from == a_ && x.is(melon::roce::kSendOnly) && x.psn == first_psn) ++tries;
    if (x.from == b_ && x.is(melon::roce::kAcknowledge) && x.ack_type() == AckType::rnr_nak) ++naks;
  }
  EXPECT_EQ(tries, 4);
  EXPECT_EQ(naks, 4);
  EXPECT_EQ(qp_state(*sim_, a_, qa_.qpn), QpState::err);
}

// ---- transport retry ----------------------------------------------------------------------------

TEST_F(Edge, PeerGoneCompletesWithRetryExcErrAfterRetryCntPlusOneTimeouts) {
  QpOptions oa;
  oa.timeout = 10;  // 4.096 us * 2^10 = 4.194 ms
  oa.retry_cnt = 3;
  connect(oa, {});
  drop_ = [&](const WireFrame& w) { return w.to == b_; };  // B is gone: 100% loss
  sim_->run_for(1000);
  uint64_t t0 = sim_->now();
  Region& src = mr(a_, 64, 0, 1);
  Sge s{src.va(), 64, src.lkey};
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::rdma_write, 1, &s, 1)), 0);
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 2, &s, 1)), 0);
  ASSERT_TRUE(wait(scq_a_, 1, 1000 * kMs));
  uint64_t t = sim_->now() - t0;
  ASSERT_TRUE(wait(scq_a_, 2));
  auto wcs = drain(scq_a_);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::retry_exc_err) << describe(wcs[0]);
  // retry_cnt + 1 local ACK timeouts (IBA 9.7.6.1.3), each 4.096 us * 2^timeout.
  EXPECT_EQ(t, 4 * melon::roce::ack_timeout_ns(10)) << "virtual time to the error completion";
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, WcStatus::wr_flush_err) << describe(wcs[1]);
  // The write went out once and was retried retry_cnt times.
  uint32_t psn = sent(a_, melon::roce::kWriteOnly).at(0).psn;
  int tries = 0;
  for (const Seen& x : sent(a_, melon::roce::kWriteOnly)) tries += x.psn == psn;
  EXPECT_EQ(tries, 4);
  EXPECT_EQ(qp_state(*sim_, a_, qa_.qpn), QpState::err);
}

// A responder that takes nothing in for a while, as one whose only progress thread waits for a CPU
// on a loaded host (docs/performance.md, "Fourth part (timeouts)": 0.1-0.8 s measured at load 11):
// every frame A sends meanwhile reaches B, in order, when the stall ends. perftest's ACK timeout
// (14: 67.1 ms) and retry_cnt (7). A stall shorter than retry_cnt + 1 timeouts loses nothing and
// costs one AckReq'd probe per timeout, not a window; a longer one is what RETRY_EXC_ERR means.
class ResponderStall : public Edge {
 protected:
  static constexpr uint8_t kTimeout = 14, kRetryCnt = 7;
  static constexpr uint32_t kWrites = 8, kLen = 64 << 10;  // 128 packets at path MTU 4096: one window
  void run(uint64_t stall_ns) {
    QpOptions o;
    o.path_mtu = 5;
    o.timeout = kTimeout;
    o.retry_cnt = kRetryCnt;
    connect(o, o);
    src_ = &mr(a_, kWrites * kLen, 0, 0x5a);
    dst_ = &mr(b_, kWrites * kLen, kRemoteWrite);
    drop_ = [this, stall_ns](const WireFrame& w) {
      if (w.from != a_) return false;
      if (!stall_end_) stall_end_ = w.time + stall_ns;
      if (w.time >= stall_end_) return false;
      ++sent_in_stall_;
      sim_->inject(b_, *w.frame, stall_end_);
      return true;
    };
    start_ = sim_->now();
    for (uint32_t i = 0; i < kWrites; ++i) {
      Sge s{src_->va() + i * kLen, kLen, src_->lkey};
      SendWr wr = make_wr(WrOpcode::rdma_write, i, &s, 1);
      wr.remote_addr = dst_->va() + i * kLen;
      wr.rkey = dst_->rkey;
      ASSERT_EQ(post(qa_, wr), 0);
    }
    ASSERT_TRUE(wait(scq_a_, kWrites, 2000 * kMs));
    end_ = sim_->now();
  }
  uint64_t timeout_ns() const { return melon::roce::ack_timeout_ns(kTimeout); }
  Region *src_ = nullptr, *dst_ = nullptr;
  uint64_t stall_end_ = 0, start_ = 0, end_ = 0, sent_in_stall_ = 0;
};

TEST_F(ResponderStall, ShorterThanRetryCntPlusOneTimeoutsLosesNothingAndSendsOneProbePerTimeout) {
  run(timeout_ns() * 15 / 2);  // 7.5 timeouts: 503 ms
  for (const Wc& wc : drain(scq_a_)) EXPECT_EQ(wc.status, WcStatus::success) << describe(wc);
  EXPECT_EQ(src_->contents(), dst_->contents());
  const QpCounters& c = *sim_->engine(a_).counters(qa_.qpn);
  EXPECT_EQ(c.timeouts, 7u);
  EXPECT_EQ(c.retransmits, 7u);
  EXPECT_EQ(sent_in_stall_, 128u + 7u) << "the window once, then one probe per timeout";
  EXPECT_LT(end_ - stall_end_, kMs) << "the first ACK after the stall reopens the window";
}

TEST_F(ResponderStall, OfRetryCntPlusOneTimeoutsEndsInRetryExcErr) {
  run(timeout_ns() * 17 / 2);  // 8.5 timeouts: 570 ms
  std::vector<Wc> wcs = drain(scq_a_);
  ASSERT_EQ(wcs.size(), kWrites);
  EXPECT_EQ(wcs[0].status, WcStatus::retry_exc_err) << describe(wcs[0]);
  for (size_t i = 1; i < wcs.size(); ++i) EXPECT_EQ(wcs[i].status, WcStatus::wr_flush_err) << describe(wcs[i]);
  EXPECT_EQ(sim_->engine(a_).counters(qa_.qpn)->timeouts, kRetryCnt + 1u);
  EXPECT_EQ(end_ - start_, (kRetryCnt + 1u) * timeout_ns()) << "silence the requester waits before giving up";
}

// ---- remote access ------------------------------------------------------------------------------

struct AccessCase {
  const char* name;
  WrOpcode op;
  enum What { bad_rkey, out_of_bounds, no_mr_permission, no_qp_permission } what;
};
void PrintTo(const AccessCase& c, std::ostream* os) { *os << c.name; }

class RemoteAccess : public Edge, public testing::WithParamInterface<AccessCase> {};

TEST_P(RemoteAccess, ViolationCompletesWithRemAccessErrMovesQpToErrAndFlushesTheRest) {
  const AccessCase& c = GetParam();
  QpOptions oa, ob;
  if (c.what == AccessCase::no_qp_permission) ob.access = kLocalWrite;  // B's QP allows no remote access
  connect(oa, ob);
  uint32_t mr_access = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  if (c.what == AccessCase::no_mr_permission)
    mr_access = c.op == WrOpcode::rdma_write ? (kLocalWrite | kRemoteRead) : kLocalWrite | kRemoteWrite;
  Region& target = mr(b_, 4096, mr_access, 0xee);
  Region& local = mr(a_, 4096, kLocalWrite, 0x11);
  std::vector<uint8_t> before = target.contents();
  bool atomic = c.op == WrOpcode::atomic_fetch_and_add;
  Sge s{local.va(), atomic ? 8u : 512u, local.lkey};
  SendWr bad = make_wr(c.op, 1, &s, 1);
  bad.remote_addr = target.va(c.what == AccessCase::out_of_bounds ? 4096 - 256 : 0);
  bad.rkey = c.what == AccessCase::bad_rkey ? target.rkey ^ 0x1000 : target.rkey;
  if (atomic) bad.compare_add = 1;
  ASSERT_EQ(post(qa_, bad), 0);
  Sge s2{local.va(), 16, local.lkey};
  SendWr good = make_wr(WrOpcode::rdma_write, 2, &s2, 1);
  good.remote_addr = target.va(1024);
  good.rkey = target.rkey;
  ASSERT_EQ(post(qa_, good), 0);
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 3, &s2, 1)), 0);
  ASSERT_TRUE(wait(scq_a_, 3));
  auto wcs = drain(scq_a_);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::rem_access_err) << describe(wcs[0]);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(wcs[size_t(i)].wr_id, uint64_t(i + 1));
    EXPECT_EQ(wcs[size_t(i)].status, WcStatus::wr_flush_err) << describe(wcs[size_t(i)]);
  }
  EXPECT_EQ(qp_state(*sim_, a_, qa_.qpn), QpState::err);
  // B sent a NAK with Remote Access Error (IBA 9.7.5.2.4, Table 44 code 2).
  bool nak = false;
  for (const Seen& x : tx_)
    if (x.from == b_ && x.is(melon::roce::kAcknowledge) &&
        x.syndrome == melon::roce::syndrome_nak(melon::roce::NakCode::remote_access_error))
      nak = true;
  EXPECT_TRUE(nak);
  EXPECT_EQ(target.contents(), before) << "nothing of the failed or flushed WRs may reach B's memory";
}

INSTANTIATE_TEST_SUITE_P(
    Rc, RemoteAccess,
    testing::Values(AccessCase{"WriteWithBadRkey", WrOpcode::rdma_write, AccessCase::bad_rkey},
                    AccessCase{"WriteOutOfBounds", WrOpcode::rdma_write, AccessCase::out_of_bounds},
                    AccessCase{"WriteWithoutRemoteWriteOnTheMr", WrOpcode::rdma_write, AccessCase::no_mr_permission},
                    AccessCase{"WriteWithoutRemoteWriteOnTheQp", WrOpcode::rdma_write, AccessCase::no_qp_permission},
                    AccessCase{"ReadWithBadRkey", WrOpcode::rdma_read, AccessCase::bad_rkey},
                    AccessCase{"ReadOutOfBounds", WrOpcode::rdma_read, AccessCase::out_of_bounds},
                    AccessCase{"ReadWithoutRemoteReadOnTheMr", WrOpcode::rdma_read, AccessCase::no_mr_permission},
                    AccessCase{"AtomicWithBadRkey", WrOpcode::atomic_fetch_and_add, AccessCase::bad_rkey},
                    AccessCase{"AtomicWithoutRemoteAtomicOnTheMr", WrOpcode::atomic_fetch_and_add,
                               AccessCase::no_mr_permission}),
    [](const testing::TestParamInfo<AccessCase>& i) { return std::string(i.param.name); });

// ---- zero length --------------------------------------------------------------------------------

TEST_F(Edge, ZeroLengthSendWriteAndReadCompleteWithByteLenZero) {
  connect();
  Region& target = mr(b_, 64, kLocalWrite | kRemoteWrite | kRemoteRead, 0x33);
  Region& local = mr(a_, 64, kLocalWrite, 0x44);
  Region& rbuf = mr(b_, 64, kLocalWrite, 0x55);
  Sge r0{rbuf.va(), 32, rbuf.lkey}, r1{rbuf.va(32), 32, rbuf.lkey};
  ASSERT_EQ(post_recv(qb_, 100, &r0, 1), 0);
  ASSERT_EQ(post_recv(qb_, 101, &r1, 1), 0);
  Sge empty{local.va(), 0, local.lkey};
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 1, nullptr, 0)), 0);  // no SGE at all
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send_with_imm, 2, &empty, 1)), 0);  // one empty SGE
  SendWr w = make_wr(WrOpcode::rdma_write, 3, nullptr, 0);
  w.remote_addr = target.va();
  w.rkey = target.rkey;
  ASSERT_EQ(post(qa_, w), 0);
  SendWr r = make_wr(WrOpcode::rdma_read, 4, &empty, 1);
  r.remote_addr = target.va();
  r.rkey = target.rkey;
  ASSERT_EQ(post(qa_, r), 0);
  ASSERT_TRUE(wait(scq_a_, 4));
  auto wcs = drain(scq_a_);
  ASSERT_EQ(wcs.size(), 4u);
  const WcOpcode ops[] = {WcOpcode::send, WcOpcode::send, WcOpcode::rdma_write, WcOpcode::rdma_read};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, WcStatus::success) << describe(wcs[i]);
    EXPECT_EQ(wcs[i].opcode, ops[i]);
    EXPECT_EQ(wcs[i].byte_len, 0u);
  }
  auto rwc = drain(rcq_b_);
  ASSERT_EQ(rwc.size(), 2u);
  EXPECT_EQ(rwc[0].wr_id, 100u);
  EXPECT_EQ(rwc[0].byte_len, 0u);
  EXPECT_EQ(rwc[1].wr_id, 101u);
  EXPECT_EQ(rwc[1].byte_len, 0u);
  EXPECT_TRUE(rwc[1].wc_flags & kWcWithImm);
  for (uint8_t x : target.contents()) ASSERT_EQ(x, 0x33);
  for (uint8_t x : local.contents()) ASSERT_EQ(x, 0x44);
  for (uint8_t x : rbuf.contents()) ASSERT_EQ(x, 0x55);
  // Zero-length messages are one packet each, with no payload.
  for (const Seen& x : tx_)
    if (x.from == a_) EXPECT_EQ(x.payload_len, 0u);
}

// A zero-length RDMA access touches no memory, so the responder does not validate R_Key or VA
// (IBA 9.7.5.1.5 / C9-?? as rxe's check_rkey: "DMA length 0: no R_Key check").
TEST_F(Edge, ZeroLengthRdmaIsNotCheckedAgainstTheRkey) {
  connect();
  SendWr w = make_wr(WrOpcode::rdma_write, 1, nullptr, 0);
  w.remote_addr = 0xdead0000;
  w.rkey = 0xbadbad;
  ASSERT_EQ(post(qa_, w), 0);
  SendWr r = make_wr(WrOpcode::rdma_read, 2, nullptr, 0);
  r.remote_addr = 0xdead0000;
  r.rkey = 0xbadbad;
  ASSERT_EQ(post(qa_, r), 0);
  ASSERT_TRUE(wait(scq_a_, 2));
  auto wcs = drain(scq_a_);
  EXPECT_EQ(wcs[0].status, WcStatus::success) << describe(wcs[0]);
  EXPECT_EQ(wcs[1].status, WcStatus::success) << describe(wcs[1]);
}

// ---- max_rd_atomic ------------------------------------------------------------------------------

TEST_F(Edge, NeverMoreThanMaxRdAtomicReadsOrAtomicsOutstandingOnTheWire) {
  QpOptions oa, ob;
  oa.max_rd_atomic = 3;
  ob.max_dest_rd_atomic = 3;
  oa.path_mtu = 3;  // 1024: READs of a few KiB take several response packets
  ob.path_mtu = 3;
  connect(oa, ob);
  Region& target = mr(b_, 64 * 1024, kLocalWrite | kRemoteRead | kRemoteAtomic, 0x21);
  Region& sink = mr(a_, 64 * 1024, kLocalWrite, 0);
  // Outstanding = requests A put on the wire whose last response has not yet reached A.
  int outstanding = 0, peak = 0;
  std::vector<uint32_t> issued;
  drop_ = [&](const WireFrame& w) {
    if (w.from == a_ && (w.pkt.info().is(melon::roce::kReadReq) || w.pkt.info().is(melon::roce::kAtomic))) {
      bool retry = false;
      for (uint32_t p : issued) retry = retry || p == w.pkt.bth.psn;
      if (!retry) {
        issued.push_back(w.pkt.bth.psn);
        peak = std::max(peak, ++outstanding);
      }
    }
    return false;
  };
  on_rx_ = [&](const WireFrame& w) {
    const auto& oi = w.pkt.info();
    if (w.to == a_ && ((oi.is(melon::roce::kReadResp) && oi.is(melon::roce::kEnd)) || oi.is(melon::roce::kAtomicAck)))
      --outstanding;
  };
  std::vector<Sge> sg(24);
  for (int i = 0; i < 24; ++i) {
    bool atomic = i % 3 == 2;
    sg[size_t(i)] = Sge{sink.va(size_t(i) * 2048), atomic ? 8u : 2000u, sink.lkey};
    SendWr wr =
        make_wr(atomic ? WrOpcode::atomic_fetch_and_add : WrOpcode::rdma_read, uint64_t(i + 1), &sg[size_t(i)], 1);
    wr.remote_addr = target.va(size_t(i) * 2048);
    wr.rkey = target.rkey;
    wr.compare_add = 1;
    ASSERT_EQ(post(qa_, wr), 0);
  }
  ASSERT_TRUE(wait(scq_a_, 24));
  for (const Wc& wc : drain(scq_a_)) EXPECT_EQ(wc.status, WcStatus::success) << describe(wc);
  EXPECT_EQ(issued.size(), 24u);
  EXPECT_LE(peak, 3) << "more READ/atomic requests in flight than max_rd_atomic (IBA 9.5)";
  EXPECT_EQ(peak, 3) << "the requester should pipeline up to max_rd_atomic";
}

// ---- QP to ERR ----------------------------------------------------------------------------------

TEST_F(Edge, ModifyToErrorFlushesAllOutstandingWrsInOrder) {
  connect();
  drop_ = [&](const WireFrame& w) { return w.to == b_; };  // nothing gets acknowledged
  Region& local = mr(a_, 4096, kLocalWrite, 0);
  Sge s{local.va(), 100, local.lkey};
  for (uint64_t i = 1; i <= 10; ++i) {
    WrOpcode op = i % 3 == 0 ? WrOpcode::rdma_read : i % 3 == 1 ? WrOpcode::send : WrOpcode::rdma_write;
    SendWr wr = make_wr(op, i, &s, 1);
    wr.remote_addr = 0x1000;
    wr.rkey = 0x1234;
    ASSERT_EQ(post(qa_, wr), 0);
  }
  for (uint64_t i = 1; i <= 5; ++i) ASSERT_EQ(post_recv(qa_, 100 + i, &s, 1), 0);
  sim_->run_for(20'000);
  EXPECT_EQ(scq_a_.size(), 0u);
  ASSERT_EQ(to_error(*sim_, a_, qa_.qpn), 0);
  uint64_t t_err = sim_->now();
  sim_->run_for(10 * kMs);
  auto wcs = drain(scq_a_);
  ASSERT_EQ(wcs.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, WcStatus::wr_flush_err) << describe(wcs[i]);
    EXPECT_EQ(wcs[i].qp_num, qa_.qpn);
  }
  auto rwc = drain(rcq_a_);
  ASSERT_EQ(rwc.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(rwc[i].wr_id, 101 + i);
    EXPECT_EQ(rwc[i].status, WcStatus::wr_flush_err);
  }
  // Its retransmit timer was armed: moving to ERR (as a QP destroyed at the end of a run goes)
  // retires it without counting a timeout.
  sim_->run_for(2 * melon::roce::ack_timeout_ns(12));
  EXPECT_EQ(sim_->engine(a_).counters(qa_.qpn)->timeouts, 0u);
  for (const Seen& x : tx_)
    if (x.from == a_) EXPECT_LE(x.t, t_err) << "a QP in ERR sends nothing";
}

// ---- UC -----------------------------------------------------------------------------------------

TEST_F(Edge, UcLossDropsThatMessageAndTheNextOneArrivesIntact) {
  QpOptions o;
  o.type = QpType::uc;
  o.path_mtu = 1;  // 256
  connect(o, o);
  Region& src = mr(a_, 2048, 0);
  for (size_t i = 0; i < 2048; ++i) src.data()[i] = uint8_t(i * 7 + 1);
  Region& dst = mr(b_, 4096, kLocalWrite, 0);
  Sge r0{dst.va(), 1024, dst.lkey}, r1{dst.va(2048), 1024, dst.lkey};
  ASSERT_EQ(post_recv(qb_, 10, &r0, 1), 0);
  ASSERT_EQ(post_recv(qb_, 11, &r1, 1), 0);
  // Lose the SEND_MIDDLE of the first message (4 packets).
  bool dropped = false;
  drop_ = [&](const WireFrame& w) {
    if (w.from == a_ && (w.pkt.bth.opcode & 0x1f) == melon::roce::kSendMiddle && !dropped) return dropped = true;
    return false;
  };
  Sge m1{src.va(), 1000, src.lkey}, m2{src.va(1024), 600, src.lkey};
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 1, &m1, 1)), 0);
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 2, &m2, 1)), 0);
  ASSERT_TRUE(wait(scq_a_, 2));
  for (const Wc& wc : drain(scq_a_)) EXPECT_EQ(wc.status, WcStatus::success) << describe(wc);
  ASSERT_TRUE(dropped);
  sim_->run_for(10 * kMs);
  auto rwc = drain(rcq_b_);
  ASSERT_EQ(rwc.size(), 1u) << "only the intact message completes";
  EXPECT_EQ(rwc[0].status, WcStatus::success);
  EXPECT_EQ(rwc[0].byte_len, 600u);
  // The receive WQE the broken message had started is used for the next one (IBA 9.8.3 UC
  // responder: drop until a new FIRST/ONLY; the WQE is not consumed by the lost message).
  EXPECT_EQ(rwc[0].wr_id, 10u);
  size_t off = rwc[0].wr_id == 10 ? 0 : 2048;
  EXPECT_EQ(memcmp(dst.data() + off, src.data() + 1024, 600), 0);
}

// ---- UD -----------------------------------------------------------------------------------------

class Ud : public Edge, public testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    v6_ = GetParam();
    Edge::SetUp();
  }
};

TEST_P(Ud, WrongQkeyIsDroppedAndTheGrhFillsTheFirst40Bytes) {
  QpOptions o;
  o.type = QpType::ud;
  o.qkey = 0x1234;
  o.pd = kPd;
  uint32_t qa, qb;
  ASSERT_EQ(create_qp(*sim_, a_, &scq_a_, &rcq_a_, o, &qa), 0);
  ASSERT_EQ(create_qp(*sim_, b_, &scq_b_, &rcq_b_, o, &qb), 0);
  ASSERT_EQ(connect_qp(*sim_, a_, qa, b_, 0, 0, o), 0);
  ASSERT_EQ(connect_qp(*sim_, b_, qb, a_, 0, 0, o), 0);
  qa_ = {a_, qa, &scq_a_, &rcq_a_};
  qb_ = {b_, qb, &scq_b_, &rcq_b_};
  Region& src = mr(a_, 256, 0);
  for (size_t i = 0; i < 256; ++i) src.data()[i] = uint8_t(0xa0 + i);
  Region& dst = mr(b_, 2 * 512, kLocalWrite, 0xcc);
  Sge r0{dst.va(), 512, dst.lkey}, r1{dst.va(512), 512, dst.lkey};
  ASSERT_EQ(post_recv(qb_, 20, &r0, 1), 0);
  ASSERT_EQ(post_recv(qb_, 21, &r1, 1), 0);
  AddressVector av = sim_->av_to(a_, b_);
  Sge s{src.va(), 200, src.lkey};
  SendWr bad = make_wr(WrOpcode::send, 1, &s, 1);
  bad.ah = &av;
  bad.remote_qpn = qb;
  bad.remote_qkey = 0x9999;
  ASSERT_EQ(post(qa_, bad), 0);
  SendWr good = bad;
  good.wr_id = 2;
  good.remote_qkey = 0x1234;
  ASSERT_EQ(post(qa_, good), 0);
  ASSERT_TRUE(wait(scq_a_, 2));
  for (const Wc& wc : drain(scq_a_)) EXPECT_EQ(wc.status, WcStatus::success) << describe(wc);
  sim_->run_for(1 * kMs);
  auto rwc = drain(rcq_b_);
  ASSERT_EQ(rwc.size(), 1u) << "the datagram with the wrong Q_Key is dropped (IBA 10.2.4, C10-15)";
  const Wc& wc = rwc[0];
  EXPECT_EQ(wc.wr_id, 20u);
  EXPECT_EQ(wc.status, WcStatus::success);
  EXPECT_EQ(wc.byte_len, 40u + 200u);
  EXPECT_TRUE(wc.wc_flags & kWcGrh);
  EXPECT_EQ(wc.src_qp, qa);
  EXPECT_EQ(memcmp(dst.data() + 40, src.data(), 200), 0) << "payload follows the 40-byte GRH";
  // GRH: what the delivered frame's IP header says (RoCEv2: IPv4 in the last 20 bytes).
  ASSERT_FALSE(rx_.empty());
  const Seen& last = rx_.back();
  melon::roce::IpUdp ip;
  ASSERT_EQ(melon::roce::parse_ip_udp(last.frame.data(), last.frame.size(), ip), melon::roce::ParseError::ok);
  uint8_t grh[40];
  melon::roce::write_ud_grh(ip, ip.udp_len - melon::roce::kUdpHeaderSize, grh);
  EXPECT_EQ(memcmp(dst.data(), grh, 40), 0);
  const uint8_t* g = dst.data();
  if (GetParam()) {
    EXPECT_EQ(g[0] >> 4, 6);
    EXPECT_EQ(memcmp(g + 8, sim_->node(a_).gid, 16), 0) << "source GID";
    EXPECT_EQ(memcmp(g + 24, sim_->node(b_).gid, 16), 0) << "destination GID";
  } else {
    for (int i = 0; i < 20; ++i) EXPECT_EQ(g[i], 0) << "byte " << i;
    EXPECT_EQ(g[20], 0x45);
    EXPECT_EQ(memcmp(g + 32, sim_->node(a_).gid + 12, 4), 0) << "source IPv4";
    EXPECT_EQ(memcmp(g + 36, sim_->node(b_).gid + 12, 4), 0) << "destination IPv4";
  }
  for (size_t i = 512; i < 1024; ++i) ASSERT_EQ(dst.data()[i], 0xcc) << "second receive untouched";
}

INSTANTIATE_TEST_SUITE_P(Ip, Ud, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "Ipv6" : "Ipv4"; });

// ---- PSN wrap -----------------------------------------------------------------------------------

TEST_F(Edge, PsnWrapsAcrossTwoToThe24WithARetransmissionAcrossTheWrap) {
  QpOptions oa, ob;
  oa.sq_psn = 0xfffff8;
  oa.path_mtu = ob.path_mtu = 1;  // 256
  connect(oa, ob);
  Region& src = mr(a_, 16384, 0);
  for (size_t i = 0; i < src.size(); ++i) src.data()[i] = uint8_t(i ^ (i >> 8));
  Region& dst = mr(b_, 16384, kLocalWrite | kRemoteWrite, 0);
  bool dropped = false;
  drop_ = [&](const WireFrame& w) {
    if (w.from == a_ && w.pkt.bth.psn == 1 && !dropped) return dropped = true;  // just after the wrap
    return false;
  };
  Sge s{src.va(), 16384, src.lkey};
  SendWr wr = make_wr(WrOpcode::rdma_write, 1, &s, 1);
  wr.remote_addr = dst.va();
  wr.rkey = dst.rkey;
  ASSERT_EQ(post(qa_, wr), 0);
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::rdma_write, 2, nullptr, 0)), 0);
  ASSERT_TRUE(wait(scq_a_, 2));
  auto wcs = drain(scq_a_);
  EXPECT_EQ(wcs[0].status, WcStatus::success) << describe(wcs[0]);
  EXPECT_EQ(wcs[1].status, WcStatus::success) << describe(wcs[1]);
  EXPECT_TRUE(dropped);
  EXPECT_EQ(dst.contents(), src.contents());
  // 64 packets: PSNs 0xfffff8 .. 0x000037, then the zero-length write at 0x000038.
  std::vector<uint32_t> psns;
  for (const Seen& x : tx_)
    if (x.from == a_ && (x.opcode & 0x1f) <= melon::roce::kWriteOnlyImm) psns.push_back(x.psn);
  ASSERT_GE(psns.size(), 66u);
  EXPECT_EQ(psns.front(), 0xfffff8u);
  int retransmitted_one = 0;
  for (size_t i = 1; i < psns.size(); ++i) retransmitted_one += psns[i] == 1;
  EXPECT_GE(retransmitted_one, 2) << "PSN 1 sent, lost, and sent again";
  EXPECT_EQ(sent(a_, melon::roce::kWriteOnly).back().psn, 0x38u);
}

// ---- fence --------------------------------------------------------------------------------------

class Fence : public Edge, public testing::WithParamInterface<bool> {};

// IBA 10.8.3.3: a WR with the fence indicator is not started until all prior READ and atomic WRs
// on the send queue have completed. Without the fence the WRITE goes out at once.
TEST_P(Fence, FencedWrWaitsForEarlierReadsAndAtomicsToComplete) {
  bool fenced = GetParam();
  QpOptions oa, ob;
  oa.path_mtu = ob.path_mtu = 3;  // 1024
  connect(oa, ob);
  Region& target = mr(b_, 65536, kLocalWrite | kRemoteRead | kRemoteWrite | kRemoteAtomic, 0x12);
  Region& sink = mr(a_, 65536, kLocalWrite, 0);
  uint64_t last_resp_at_a = 0;
  on_rx_ = [&](const WireFrame& w) {
    const auto& oi = w.pkt.info();
    if (w.to == a_ && ((oi.is(melon::roce::kReadResp) && oi.is(melon::roce::kEnd)) || oi.is(melon::roce::kAtomicAck)))
      last_resp_at_a = w.time;
  };
  Sge rs{sink.va(), 32768, sink.lkey};
  SendWr rd = make_wr(WrOpcode::rdma_read, 1, &rs, 1, 0);
  rd.remote_addr = target.va();
  rd.rkey = target.rkey;
  ASSERT_EQ(post(qa_, rd), 0);
  Sge as{sink.va(40000), 8, sink.lkey};
  SendWr at = make_wr(WrOpcode::atomic_fetch_and_add, 2, &as, 1, 0);
  at.remote_addr = target.va(40000);
  at.rkey = target.rkey;
  at.compare_add = 1;
  ASSERT_EQ(post(qa_, at), 0);
  Sge ws{sink.va(50000), 64, sink.lkey};
  SendWr wr = make_wr(WrOpcode::rdma_write, 3, &ws, 1, kSignaled | (fenced ? kFence : 0));
  wr.remote_addr = target.va(50000);
  wr.rkey = target.rkey;
  ASSERT_EQ(post(qa_, wr), 0);
  ASSERT_TRUE(wait(scq_a_, 1));
  auto wcs = drain(scq_a_);
  EXPECT_EQ(wcs[0].status, WcStatus::success) << describe(wcs[0]);
  auto writes = sent(a_, melon::roce::kWriteOnly);
  ASSERT_EQ(writes.size(), 1u);
  ASSERT_GT(last_resp_at_a, 0u);
  if (fenced)
    EXPECT_GE(writes[0].t, last_resp_at_a) << "the fenced WRITE left before the READ/atomic responses arrived";
  else
    EXPECT_LT(writes[0].t, last_resp_at_a) << "an unfenced WRITE need not wait";
}

INSTANTIATE_TEST_SUITE_P(Rc, Fence, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "Fenced" : "Unfenced"; });

// ---- atomic replay ------------------------------------------------------------------------------

class AtomicReplay : public Edge, public testing::WithParamInterface<WrOpcode> {};

// IBA 9.7.5.1.2 / o9-38 (C9-105 for atomics): a duplicate atomic request is answered from the
// responder's replay cache with the original value; the operation is not executed again.
TEST_P(AtomicReplay, DuplicateAtomicIsAnsweredFromTheReplayCacheWithoutReExecuting) {
  WrOpcode op = GetParam();
  connect();
  Region& target = mr(b_, 64, kLocalWrite | kRemoteAtomic, 0);
  Region& sink = mr(a_, 64, kLocalWrite, 0);
  uint64_t init = 100;
  memcpy(target.data(), &init, 8);
  std::vector<uint8_t> request;
  drop_ = [&](const WireFrame& w) {
    if (w.from == a_ && w.pkt.info().is(melon::roce::kAtomic)) request = *w.frame;
    return false;
  };
  Sge s{sink.va(), 8, sink.lkey};
  SendWr wr = make_wr(op, 1, &s, 1);
  wr.remote_addr = target.va();
  wr.rkey = target.rkey;
  wr.compare_add = op == WrOpcode::atomic_cmp_and_swp ? 100 : 5;
  wr.swap = 200;
  ASSERT_EQ(post(qa_, wr), 0);
  ASSERT_TRUE(wait(scq_a_, 1));
  auto wcs = drain(scq_a_);
  ASSERT_EQ(wcs[0].status, WcStatus::success) << describe(wcs[0]);
  uint64_t after, orig;
  memcpy(&after, target.data(), 8);
  memcpy(&orig, sink.data(), 8);
  uint64_t want = op == WrOpcode::atomic_cmp_and_swp ? 200 : 105;
  EXPECT_EQ(orig, 100u);
  EXPECT_EQ(after, want);
  ASSERT_FALSE(request.empty());
  // The same request frame again, as a late duplicate from the network.
  size_t acks_before = tx_.size();
  sim_->inject(b_, request, sim_->now() + 1000);
  sim_->run_for(1 * kMs);
  memcpy(&after, target.data(), 8);
  EXPECT_EQ(after, want) << "the duplicate atomic was executed again";
  bool replayed = false;
  for (size_t i = acks_before; i < tx_.size(); ++i) {
    const Seen& x = tx_[i];
    if (x.from == b_ && x.is(melon::roce::kAtomicAcknowledge)) {
      replayed = true;
      EXPECT_EQ(x.atomic_orig, 100u) << "the replayed ATOMIC ACKNOWLEDGE carries the original value";
    }
  }
  EXPECT_TRUE(replayed) << "B must answer the duplicate with an ATOMIC ACKNOWLEDGE";
  EXPECT_EQ(scq_a_.size(), 0u) << "a stale atomic ACK completes nothing at A";
  memcpy(&orig, sink.data(), 8);
  EXPECT_EQ(orig, 100u);
}

INSTANTIATE_TEST_SUITE_P(Rc, AtomicReplay,
                         testing::Values(WrOpcode::atomic_fetch_and_add, WrOpcode::atomic_cmp_and_swp),
                         [](const testing::TestParamInfo<WrOpcode>& i) {
                           return i.param == WrOpcode::atomic_cmp_and_swp ? "CompareSwap" : "FetchAdd";
                         });

}  // namespace

// ---- retransmission corner cases (each one found by the property test) ---------------------------

namespace {

// IBA 9.7.5.2.8: after an RNR NAK the requester waits out the RNR timer and retries; only
// rnr_retry limits that. A PSN-sequence NAK for the same PSN (the responder saw the packets that
// were already in flight behind the RNR-NAKed SEND) is no new error and must not use up retry_cnt.
TEST_F(Edge, RnrNakFollowedBySequenceNakForTheSamePsnDoesNotUseUpRetryCnt) {
  // engine bug: completer.cpp decrements retry_left for every sequence NAK, also the one that
  // follows each RNR NAK for the same PSN, so rnr_retry 7 ends in RETRY_EXC_ERR after retry_cnt+1
  // RNR cycles.
  QpOptions oa, ob;
  oa.retry_cnt = 1;
  oa.rnr_retry = 7;
  ob.min_rnr_timer = 1;  // 10 us
  connect(oa, ob);
  Region& target = mr(b_, 4096, kLocalWrite | kRemoteWrite, 0);
  Region& rbuf = mr(b_, 64, kLocalWrite, 0);
  ASSERT_EQ(post(qa_, make_wr(WrOpcode::send, 1, nullptr, 0)), 0);
  SendWr w = make_wr(WrOpcode::rdma_write, 2, nullptr, 0);
  w.remote_addr = target.va();
  w.rkey = target.rkey;
  ASSERT_EQ(post(qa_, w), 0);
  sim_->run_for(1 * kMs);  // ~50 RNR cycles
  Sge r{rbuf.va(), 64, rbuf.lkey};
  ASSERT_EQ(post_recv(qb_, 9, &r, 1), 0);
  ASSERT_TRUE(wait(scq_a_, 2));
  for (const Wc& wc : drain(scq_a_)) EXPECT_EQ(wc.status, WcStatus::success) << describe(wc);
}

// A READ response lost in the middle: the requester re-issues the READ from the missing PSN
// (IBA 9.7.5.1.4, implied NAK) and the data arrives complete.
TEST_F(Edge, ReadResponseLostInTheMiddleIsRecoveredByReissuingTheRead) {
  QpOptions o;
  o.path_mtu = 3;  // 1024
  connect(o, o);
  Region& target = mr(b_, 8192, kRemoteRead, 0);
  for (size_t i = 0; i < 8192; ++i) target.data()[i] = uint8_t(i * 13 + 5);
  Region& sink = mr(a_, 8192, kLocalWrite, 0);
  int seen = 0;
  drop_ = [&](const WireFrame& w) { return w.from == b_ && w.pkt.info().is(melon::roce::kReadResp) && ++seen == 3; };
  Sge s{sink.va(), 8192, sink.lkey};
  SendWr r = make_wr(WrOpcode::rdma_read, 1, &s, 1);
  r.remote_addr = target.va();
  r.rkey = target.rkey;
  ASSERT_EQ(post(qa_, r), 0);
  ASSERT_TRUE(wait(scq_a_, 1));
  auto wcs = drain(scq_a_);
  EXPECT_EQ(wcs[0].status, WcStatus::success) << describe(wcs[0]);
  EXPECT_EQ(sink.contents(), target.contents());
}

// One hole in a READ's response stream costs one re-issued READ request, not one per response
// packet that arrives after the hole (each re-issue makes the responder send the rest again: with
// one request per late packet a single loss in a 1 MiB READ becomes a storm of millions of frames).
TEST_F(Edge, OneLostReadResponseCausesOneReissuedReadRequest) {
  QpOptions o;
  o.path_mtu = 3;  // 1024: 64 response packets
  connect(o, o);
  Region& target = mr(b_, 65536, kRemoteRead, 0x77);
  Region& sink = mr(a_, 65536, kLocalWrite, 0);
  int seen = 0;
  drop_ = [&](const WireFrame& w) { return w.from == b_ && w.pkt.info().is(melon::roce::kReadResp) && ++seen == 2; };
  Sge s{sink.va(), 65536, sink.lkey};
  SendWr r = make_wr(WrOpcode::rdma_read, 1, &s, 1);
  r.remote_addr = target.va();
  r.rkey = target.rkey;
  ASSERT_EQ(post(qa_, r), 0);
  wait(scq_a_, 1);
  EXPECT_EQ(sent(a_, melon::roce::kReadRequest).size(), 2u) << "the original READ and one re-issue";
}

// ---- READ pacing --------------------------------------------------------------------------------

// What the wire says about one READ in flight towards A: response packets its requests asked for
// (the furthest PSN any READ request covered) minus those that arrived in order (a go-back-N
// receiver drops what follows a hole), and READ requests whose last response has not arrived.
struct ReadFlight {
  uint32_t mtu = 1024;
  bool begun = false;
  uint32_t base = 0;  // PSN of the first request
  int64_t asked = 0, next = 0, peak = 0;
  std::map<int64_t, int64_t> open;  // first response -> end of each request asked for once
  size_t requests = 0, peak_requests = 0;

  int64_t rel(uint32_t psn) const { return melon::roce::psn_diff(psn, base); }
  void request(const WireFrame& w) {
    if (!begun) base = w.pkt.bth.psn, begun = true;
    int64_t p = rel(w.pkt.bth.psn), n = w.pkt.reth.dma_len ? (w.pkt.reth.dma_len + mtu - 1) / mtu : 1;
    ++requests;
    if (p + n > asked) {  // asks for responses never asked for before
      open[p] = p + n;
      asked = p + n;
    }
    peak = std::max(peak, asked - next);
    peak_requests = std::max(peak_requests, open.size());
  }
  void response(const WireFrame& w) {
    if (!begun || rel(w.pkt.bth.psn) != next) return;
    ++next;
    while (!open.empty() && open.begin()->second <= next) open.erase(open.begin());
  }
};

class ReadPacing : public Edge {
 protected:
  static constexpr uint32_t kLen = 1 << 20;  // 1024 responses at path MTU 1024: 8 windows of 128
  static constexpr uint32_t kWindow = 128;  // EngineConfig::max_inflight_packets (the default)

  // One kLen READ from B to A; `lose` may drop frames. Returns A's completions.
  std::vector<Wc> read_once(const std::function<bool(const WireFrame&)>& lose) {
    QpOptions o;
    o.path_mtu = 3;  // 1024
    connect(o, o);
    Region& target = mr(b_, kLen, kRemoteRead, 0);
    for (size_t i = 0; i < kLen; ++i) target.data()[i] = uint8_t(i * 131 + (i >> 10));
    Region& sink = mr(a_, kLen, kLocalWrite, 0);
    drop_ = [&](const WireFrame& w) {
      if (w.from == a_ && w.pkt.info().is(melon::roce::kReadReq)) flight_.request(w);
      return lose && lose(w);
    };
    on_rx_ = [&](const WireFrame& w) {
      if (w.to == a_ && w.pkt.info().is(melon::roce::kReadResp)) flight_.response(w);
    };
    Sge s{sink.va(), kLen, sink.lkey};
    SendWr r = make_wr(WrOpcode::rdma_read, 7, &s, 1);
    r.remote_addr = target.va();
    r.rkey = target.rkey;
    EXPECT_EQ(post(qa_, r), 0);
    EXPECT_TRUE(wait(scq_a_, 1, 2000 * kMs));
    sim_->run_for(100 * kMs);  // anything still to come (a second completion, stray responses)
    data_ok_ = sink.contents() == target.contents();
    return drain(scq_a_);
  }
  void expect_one_good_completion(const std::vector<Wc>& wcs) {
    ASSERT_EQ(wcs.size(), 1u) << "a READ completes once, after its last response";
    EXPECT_EQ(wcs[0].status, WcStatus::success) << describe(wcs[0]);
    EXPECT_EQ(wcs[0].wr_id, 7u);
    EXPECT_EQ(wcs[0].opcode, WcOpcode::rdma_read);
    EXPECT_EQ(wcs[0].byte_len, kLen);
    EXPECT_TRUE(data_ok_) << "the data read differs from the target's";
    EXPECT_EQ(flight_.next, int64_t(kLen / 1024)) << "every response arrived in order in the end";
  }
  void expect_paced() {
    EXPECT_LE(flight_.peak, int64_t(kWindow)) << "more READ responses in flight than the window";
    EXPECT_GT(flight_.peak, int64_t(kWindow / 2)) << "the window should be kept busy, not stop-and-wait";
    EXPECT_LE(flight_.peak_requests, 4u) << "more READ requests outstanding than max_rd_atomic";
  }
  ReadFlight flight_;
  bool data_ok_ = false;
};

// A READ many windows long is asked for a chunk at a time, the next as earlier responses arrive,
// so that at most the window's worth of responses is ever in flight towards the requester.
TEST_F(ReadPacing, ReadOfEightWindowsNeverHasMoreThanTheWindowOfResponsesInFlight) {
  auto wcs = read_once(nullptr);
  expect_one_good_completion(wcs);
  expect_paced();
  EXPECT_GE(flight_.requests, size_t(kLen / 1024 / kWindow)) << "one request cannot fit a window";
  const QpCounters* c = sim_->engine(a_).counters(qa_.qpn);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->timeouts, 0u) << "on a lossless link the next chunk must never wait for the ACK timer";
  EXPECT_EQ(c->retransmits, 0u);
}

// A response lost in the middle: the requester re-issues from the hole (a chunk's remainder and
// the chunks after it) and still never asks for more than the window.
TEST_F(ReadPacing, LostResponseInTheMiddleIsReissuedWithinTheWindow) {
  int seen = 0;
  auto wcs = read_once(
      [&](const WireFrame& w) { return w.from == b_ && w.pkt.info().is(melon::roce::kReadResp) && ++seen == 300; });
  expect_one_good_completion(wcs);
  expect_paced();
  EXPECT_GT(flight_.requests, size_t(kLen / 1024 / 32)) << "a re-issue after the loss";
}

// The request for a later chunk is lost and so is the last response of the chunk before it: the
// responder's sequence NAK names the lost request's PSN, but the READ must resume at the missing
// response, not there (a NAK inside a READ acknowledges none of its responses).
TEST_F(ReadPacing, SequenceNakForALostChunkRequestResumesAtTheFirstMissingResponse) {
  int requests = 0;
  bool lost_response = false;
  auto wcs = read_once([&](const WireFrame& w) {
    if (w.from == a_ && w.pkt.info().is(melon::roce::kReadReq)) return ++requests == 3;
    if (w.from == b_ && w.pkt.info().is(melon::roce::kReadResp) && !lost_response && flight_.begun &&
        flight_.rel(w.pkt.bth.psn) == 63) {
      lost_response = true;
      return true;
    }
    return false;
  });
  EXPECT_TRUE(lost_response);
  expect_one_good_completion(wcs);
  EXPECT_LE(flight_.peak, int64_t(kWindow));
  bool nak = false;
  for (const Seen& s : tx_)
    nak = nak || (s.from == b_ && s.is(melon::roce::kAcknowledge) && s.ack_type() == AckType::nak);
  EXPECT_TRUE(nak) << "the responder should have NAKed the request after the lost one";
}

// A PSN-sequence NAK implicitly acknowledges every PSN before it (IBA 9.7.5.2.3), so a NAK further
// into a long message is forward progress and the retry counter starts again.
TEST_F(Edge, SequenceNaksThatAdvanceAreProgressAndDoNotExhaustRetryCnt) {
  // engine bug: completer.cpp resets retry_left only when a whole WQE completes, so a long
  // message hit by retry_cnt+1 separate losses fails with RETRY_EXC_ERR.
  QpOptions oa, ob;
  oa.path_mtu = ob.path_mtu = 1;  // 256: 64 packets
  oa.retry_cnt = 1;
  connect(oa, ob);
  Region& src = mr(a_, 16384, 0, 0x3c);
  Region& dst = mr(b_, 16384, kLocalWrite | kRemoteWrite, 0);
  // Lose PSN first+10k on its k-th transmission (k = 1..4): each go-back-N pass meets a new hole
  // further on, so the responder sends four sequence NAKs with increasing PSNs.
  std::map<uint32_t, int> count;
  uint32_t first = 0;
  bool started = false;
  drop_ = [&](const WireFrame& w) {
    if (w.from != a_ || !w.pkt.info().is(melon::roce::kWrite)) return false;
    if (!started) {
      started = true;
      first = w.pkt.bth.psn;
    }
    int k = ++count[w.pkt.bth.psn];
    for (int i = 1; i <= 4; ++i)
      if (w.pkt.bth.psn == melon::roce::psn_add(first, 10 * i) && k == i) return true;
    return false;
  };
  Sge s{src.va(), 16384, src.lkey};
  SendWr w = make_wr(WrOpcode::rdma_write, 1, &s, 1);
  w.remote_addr = dst.va();
  w.rkey = dst.rkey;
  ASSERT_EQ(post(qa_, w), 0);
  ASSERT_TRUE(wait(scq_a_, 1));
  auto wcs = drain(scq_a_);
  EXPECT_EQ(wcs[0].status, WcStatus::success) << describe(wcs[0]);
  EXPECT_EQ(dst.contents(), src.contents());
}

// A responder that is slow, not lossy (an emulated card on a loaded host): it serves one request
// frame per 300 us, so the 64 packets of one 64 KiB message (one AckReq) wait 19 ms in its queue,
// longer than the 17 ms local ACK timeout. Nothing is lost; the timeout is spurious. Resending the whole window on each timeout
// would put another window's work in front of the ACK the requester waits for (the queue grows
// faster than it drains, until retry_cnt runs out: IBV_WC_RETRY_EXC_ERR through melon-emud, and
// here before the fix). After a timeout the requester sends one AckReq'd packet, and the full
// window again once an ACK shows progress.
TEST(SlowResponder, TimeoutResendsOnePacketNotTheWindow) {
  Sim sim(test_seed(0x510e));
  const int a = sim.add_node("A"), b = sim.add_node("B");
  kit::Cq scq_a, rcq_a, scq_b, rcq_b;
  QpEnd qa{a, 0, &scq_a, &rcq_a}, qb{b, 0, &scq_b, &rcq_b};
  QpOptions o;
  o.pd = kPd;
  o.path_mtu = 3;  // 1024
  o.timeout = 12;  // 16.8 ms
  o.retry_cnt = 3;
  ASSERT_EQ(connect_pair(sim, qa, qb, o, o), 0);
  constexpr uint32_t kMsgs = 8, kLen = 65536;  // 64 packets each, as perftest's default size
  Region& src = sim.mem(a).add(kPd, kMsgs * kLen, kLocalWrite);
  Region& dst = sim.mem(b).add(kPd, kMsgs * kLen, kRemoteWrite | kLocalWrite);
  for (size_t i = 0; i < src.size(); ++i) src.data()[i] = uint8_t(i * 7 + (i >> 10));
  memset(dst.data(), 0, dst.size());
  // B's queue: each request frame is served 300 us after the one before it.
  uint64_t busy_until = 0, requests = 0;
  sim.on_transmit = [&](const WireFrame& w) {
    if (w.from != a) return true;
    ++requests;
    busy_until = std::max(busy_until, w.time) + 300'000;
    sim.inject(b, *w.frame, busy_until);
    return false;
  };
  for (uint32_t i = 0; i < kMsgs; ++i) {
    Sge s{src.va() + i * kLen, kLen, src.lkey};
    SendWr wr = make_wr(WrOpcode::rdma_write, i, &s, 1);
    wr.remote_addr = dst.va() + i * kLen;
    wr.rkey = dst.rkey;
    ASSERT_EQ(sim.engine(a).post_send(qa.qpn, wr), 0);
  }
  sim.run_until([&] { return scq_a.size() >= kMsgs; }, sim.now() + 2000 * kMs);
  std::vector<Wc> wcs = scq_a.drain();
  ASSERT_EQ(wcs.size(), kMsgs);
  for (const Wc& wc : wcs) EXPECT_EQ(wc.status, WcStatus::success) << describe(wc);
  EXPECT_EQ(src.contents(), dst.contents());
  EXPECT_TRUE(sim.errors().empty()) << (sim.errors().empty() ? "" : sim.errors()[0]);
  const QpCounters req = *sim.engine(a).counters(qa.qpn);
  EXPECT_GE(req.timeouts, 1u);  // the queue outlasted the timer: the case under test happened
  // Resent packets stay fewer than the data (going back a window per timeout would not converge).
  EXPECT_LT(requests, 2 * kMsgs * 64) << req.timeouts << " timeouts";
}

}  // namespace

// ---- ACK coalescing in receive batches ----------------------------------------------------------

// Sixteen 4 KiB WRITEs at path MTU 1024 (64 packets, an AckReq on each message's last), the 10th
// packet lost once; the same run with frames handed to the responder one at a time and in receive
// batches (Sim::rx_batch_ns, Engine::begin_batch/end_batch).
struct CoalesceRun {
  size_t acks = 0;  // plain ACKs the responder sent
  size_t naks = 0;
  uint64_t nak_delay = UINT64_MAX;  // from the arrival of the packet after the hole to the NAK
  QpCounters req, resp;
  std::vector<Wc> wcs;
  bool data_equal = false;
  std::vector<std::string> errors;
};

CoalesceRun run_coalesce(bool batched) {
  CoalesceRun out;
  Sim sim(test_seed(0xac5eed));
  sim.rx_batch_ns = batched ? 20000 : 0;
  const int a = sim.add_node("A"), b = sim.add_node("B");
  kit::Cq scq_a, rcq_a, scq_b, rcq_b;
  QpEnd qa{a, 0, &scq_a, &rcq_a}, qb{b, 0, &scq_b, &rcq_b};
  QpOptions o;
  o.pd = kPd;
  o.path_mtu = 3;  // 1024
  if (connect_pair(sim, qa, qb, o, o)) return out;
  Region& src = sim.mem(a).add(kPd, 16 * 4096, kLocalWrite);
  Region& dst = sim.mem(b).add(kPd, 16 * 4096, kRemoteWrite | kLocalWrite);
  for (size_t i = 0; i < src.size(); ++i) src.data()[i] = uint8_t(i * 31 + (i >> 12));
  memset(dst.data(), 0, dst.size());
  int data_seen = 0;
  uint64_t hole_next_at = 0;
  sim.on_transmit = [&](const WireFrame& w) {
    if (w.from == b && w.pkt.info().is(melon::roce::kAck)) {
      if (melon::roce::syndrome_type(w.pkt.aeth.syndrome) == AckType::ack) ++out.acks;
      if (melon::roce::syndrome_type(w.pkt.aeth.syndrome) == AckType::nak) {
        ++out.naks;
        out.nak_delay = w.time - hole_next_at;
      }
    }
    return !(w.from == a && ++data_seen == 10);  // the 10th frame A sends: its first try is lost
  };
  sim.on_deliver = [&](const WireFrame& w) {
    if (w.to == b && !hole_next_at && w.pkt.bth.psn == 10) hole_next_at = w.time;  // PSN 10: after the hole
  };
  for (uint32_t i = 0; i < 16; ++i) {
    Sge s{src.va() + i * 4096, 4096, src.lkey};
    SendWr wr = make_wr(WrOpcode::rdma_write, i, &s, 1);
    wr.remote_addr = dst.va() + i * 4096;
    wr.rkey = dst.rkey;
    if (sim.engine(a).post_send(qa.qpn, wr)) return out;
  }
  sim.run_until([&] { return scq_a.size() >= 16; }, sim.now() + 100 * kMs);
  out.wcs = scq_a.drain();
  out.req = *sim.engine(a).counters(qa.qpn);
  out.resp = *sim.engine(b).counters(qb.qpn);
  out.data_equal = src.contents() == dst.contents();
  out.errors = sim.errors();
  return out;
}

TEST(AckCoalescing, ReceiveBatchesSendFewerAcksAndRetransmitExactlyAsBefore) {
  const CoalesceRun one = run_coalesce(false), batch = run_coalesce(true);
  for (const CoalesceRun* r : {&one, &batch}) {
    SCOPED_TRACE(r == &one ? "one frame at a time" : "receive batches");
    EXPECT_TRUE(r->errors.empty()) << (r->errors.empty() ? "" : r->errors[0]);
    ASSERT_EQ(r->wcs.size(), 16u);
    for (size_t i = 0; i < r->wcs.size(); ++i) {
      EXPECT_EQ(r->wcs[i].status, WcStatus::success) << describe(r->wcs[i]);
      EXPECT_EQ(r->wcs[i].wr_id, i);  // in order
    }
    EXPECT_TRUE(r->data_equal);
    // The hole costs one sequence NAK, sent as the packet after it arrives (never held for the
    // batch's end), and one go-back; no timeout.
    EXPECT_EQ(r->naks, 1u);
    EXPECT_EQ(r->nak_delay, 0u);
    EXPECT_EQ(r->resp.seq_naks_sent, 1u);
    EXPECT_EQ(r->req.retransmits, 1u);
    EXPECT_EQ(r->req.timeouts, 0u);
  }
  // Without batches each AckReq'd packet that arrived in order drew its own ACK.
  EXPECT_GE(one.acks, 14u);
  EXPECT_EQ(one.resp.acks_coalesced, 0u);
  EXPECT_LE(batch.acks * 3, one.acks) << batch.acks << " ACKs in batches, " << one.acks << " one at a time";
  EXPECT_GT(batch.resp.acks_coalesced, 0u);
}

// A window shared by the QPs of an engine (EngineConfig::max_inflight_total, what the soft provider
// sizes to a socket's receive buffer): four QPs streaming long WRITEs at once never have more than
// the budget in flight together, though each alone may use its whole per-QP window, and every
// WRITE completes with its data.
TEST(SharedWindow, StreamingQpsTogetherStayWithinTheEnginesBudget) {
  constexpr int kQps = 4;
  constexpr uint32_t kPerQp = 64, kTotal = 96, kLen = 256 << 10, kWrites = 4;  // 256 packets per WRITE
  Sim sim(test_seed(0x5a4ed));
  EngineConfig c;
  c.max_inflight_packets = kPerQp;
  c.max_inflight_total = kTotal;
  const int a = sim.add_node("A", false, c), b = sim.add_node("B", false, c);
  kit::Cq scq[kQps], rcq[kQps], scq_b[kQps], rcq_b[kQps];
  QpEnd ea[kQps], eb[kQps];
  std::map<uint32_t, uint32_t> a_of_b;  // B's QPN -> its peer's on A
  for (int i = 0; i < kQps; ++i) {
    ea[i] = {a, 0, &scq[i], &rcq[i]};
    eb[i] = {b, 0, &scq_b[i], &rcq_b[i]};
    QpOptions o;
    o.pd = kPd;
    ASSERT_EQ(connect_pair(sim, ea[i], eb[i], o, o), 0);
    a_of_b[eb[i].qpn] = ea[i].qpn;
  }
  Region& src = sim.mem(a).add(kPd, kLen, 0);
  for (uint32_t i = 0; i < kLen; ++i) src.data()[i] = uint8_t(i * 7 + (i >> 12));
  Region& dst = sim.mem(b).add(kPd, size_t(kQps) * kLen, kRemoteWrite);

  // Packets in flight per QP of A: data sent (PSNs start at 0 and stay far from wrapping) less what
  // B's ACKs acknowledged.
  std::map<uint32_t, uint32_t> sent_end, acked_end;
  uint32_t peak = 0, peak_one = 0;
  sim.on_transmit = [&](const WireFrame& w) {
    if (w.from == a) {
      if (!w.pkt.payload_len) return true;
      uint32_t& e = sent_end[a_of_b[w.pkt.bth.dest_qp]];
      e = std::max(e, w.pkt.bth.psn + 1);
    } else if (w.pkt.info().is(melon::roce::kAcknowledge) &&
               melon::roce::syndrome_type(w.pkt.aeth.syndrome) == AckType::ack) {
      uint32_t& e = acked_end[w.pkt.bth.dest_qp];
      e = std::max(e, w.pkt.bth.psn + 1);
    }
    uint32_t total = 0;
    for (auto& [qpn, end] : sent_end) {
      const uint32_t one = end - std::min(end, acked_end[qpn]);
      total += one;
      peak_one = std::max(peak_one, one);
    }
    peak = std::max(peak, total);
    return true;
  };
  for (uint32_t k = 0; k < kWrites; ++k)
    for (int i = 0; i < kQps; ++i) {
      Sge s{src.va(), kLen, src.lkey};
      SendWr wr = make_wr(WrOpcode::rdma_write, k, &s, 1);
      wr.remote_addr = dst.va() + uint64_t(i) * kLen;
      wr.rkey = dst.rkey;
      ASSERT_EQ(sim.engine(a).post_send(ea[i].qpn, wr), 0);
    }
  ASSERT_TRUE(sim.run_until(
      [&] {
        for (auto& q : scq)
          if (q.size() < kWrites) return false;
        return true;
      },
      sim.now() + 5000 * kMs));
  for (auto& q : scq) {
    Wc wc;
    while (q.poll(&wc)) EXPECT_EQ(wc.status, WcStatus::success);
  }
  for (int i = 0; i < kQps; ++i) EXPECT_EQ(memcmp(dst.data() + size_t(i) * kLen, src.data(), kLen), 0) << "QP " << i;
  // The budget, plus the few packets (kMinSharedWindow, 4) a QP may always have out so that ACKs
  // keep coming to it.
  EXPECT_LE(peak, kTotal + kQps * 4) << "the QPs together had more than the engine's budget in flight";
  uint64_t timeouts = 0;
  for (const QpEnd& e : ea) timeouts += sim.engine(a).counters(e.qpn)->timeouts;
  EXPECT_EQ(timeouts, 0u) << "a QP held below ack_every by its share must still ask for its ACK";
  EXPECT_GE(peak, kTotal * 3 / 4) << "the budget should be used, not starved";
  EXPECT_LE(peak_one, kPerQp);
  for (const std::string& e : sim.errors()) ADD_FAILURE() << "simulator: " << e;
}

// The soft provider's windows on loopback (path MTU 4096): 128 packets per QP, 512 for a lane, and
// perftest's pattern: `ib_write_bw -q 8` posts its 64 KiB WRITEs (16 packets) QP after QP. The
// first four QPs fill the budget; each later one may still send kMinSharedWindow (4) packets, and
// its share (512 / 5..8 = 64..102 packets) is not below ack_every, so no window rule asked for an
// ACK on them: the budget stopped those QPs with four packets out and none AckReq'd, nothing
// answered them, and each waited out its 67 ms ACK timer (the "8 timeouts with nothing dropped" of
// `ib_write_bw -q 16` over two lanes). The packet after which the budget stops a QP must ask for
// the ACK that restarts it.
TEST(SharedWindow, AQpTheBudgetStopsAsksForTheAckThatRestartsIt) {
  constexpr int kQps = 8;
  constexpr uint32_t kLen = 64 << 10, kWrites = 16;
  Sim sim(test_seed(0xb0d6e7));
  EngineConfig c;
  c.max_inflight_packets = 128;
  c.max_inflight_total = 512;
  const int a = sim.add_node("A", false, c), b = sim.add_node("B", false, c);
  kit::Cq scq[kQps], rcq[kQps], scq_b[kQps], rcq_b[kQps];
  QpEnd ea[kQps], eb[kQps];
  for (int i = 0; i < kQps; ++i) {
    ea[i] = {a, 0, &scq[i], &rcq[i]};
    eb[i] = {b, 0, &scq_b[i], &rcq_b[i]};
    QpOptions o;
    o.pd = kPd;
    o.path_mtu = 5;  // 4096
    o.timeout = 14;  // 67 ms, perftest's
    ASSERT_EQ(connect_pair(sim, ea[i], eb[i], o, o), 0);
  }
  Region& src = sim.mem(a).add(kPd, kLen, 0);
  for (uint32_t i = 0; i < kLen; ++i) src.data()[i] = uint8_t(i * 13 + (i >> 12));
  Region& dst = sim.mem(b).add(kPd, size_t(kQps) * kLen, kRemoteWrite);
  for (int i = 0; i < kQps; ++i)
    for (uint32_t k = 0; k < kWrites; ++k) {
      Sge s{src.va(), kLen, src.lkey};
      SendWr wr = make_wr(WrOpcode::rdma_write, k, &s, 1);
      wr.remote_addr = dst.va() + uint64_t(i) * kLen;
      wr.rkey = dst.rkey;
      ASSERT_EQ(sim.engine(a).post_send(ea[i].qpn, wr), 0);
    }
  const uint64_t start = sim.now(), timeout_ns = melon::roce::ack_timeout_ns(14);
  ASSERT_TRUE(sim.run_until(
      [&] {
        for (auto& q : scq)
          if (q.size() < kWrites) return false;
        return true;
      },
      start + 10 * timeout_ns));
  for (auto& q : scq) {
    Wc wc;
    while (q.poll(&wc)) EXPECT_EQ(wc.status, WcStatus::success) << describe(wc);
  }
  for (int i = 0; i < kQps; ++i) {
    EXPECT_EQ(sim.engine(a).counters(ea[i].qpn)->timeouts, 0u) << "QP " << i << " waited for its ACK timer";
    EXPECT_EQ(memcmp(dst.data() + size_t(i) * kLen, src.data(), kLen), 0) << "QP " << i;
  }
  // On a link that loses nothing every WRITE completes long before one ACK timeout.
  EXPECT_LT(sim.now() - start, timeout_ns / 10);
  for (const std::string& e : sim.errors()) ADD_FAILURE() << "simulator: " << e;
}
