// QP1 (CREATE_QP with st = QP1): one per port, number 1 on the wire, the GSI's Q_Key enforced, UD
// receive semantics (40-byte GRH area first); and 2ERR flushing the receives posted before it.
#include "harness.h"
#include "mlx5/emu/hca.h"
#include "mlx5/emu/wire.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace wo = prm::wqe_opcode;
namespace co = prm::cqe_opcode;
namespace cs = prm::cmd_status;

constexpr uint32_t kGrh = 40;

struct Side {
  Side(MemoryLink& link, uint8_t last_octet) : port(link.add_port()), h(config(last_octet), port) {
    link.attach(port, &h.dev);
    ip[3] = last_octet;
  }
  static DeviceConfig config(uint8_t o) {
    DeviceConfig c;
    c.mac[5] = o;
    return c;
  }
  void gid(uint8_t out[16]) const {
    uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ip[0], ip[1], ip[2], ip[3]};
    memcpy(out, g, 16);
  }
  uint64_t va() const { return reinterpret_cast<uint64_t>(mem.va); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(mem.va); }
  FramePort* port;
  Harness h;
  uint8_t ip[4] = {10, 0, 0, 0};
  Harness::CqRing cq;
  Harness::QpRing qp;
  TestHost::Buffer mem;
  uint32_t key = 0;
};

// RST -> INIT -> RTR -> RTS the way Linux brings up QP1: port 1, P_Key index 0, a Q_Key.
void bring_to_rts(Harness& h, uint32_t qpn, uint32_t qkey) {
  ASSERT_TRUE(h.transition(op::RST2INIT_QP, qpn, [&](prm::qpc::view q) {
                 q.at(prm::qpc::primary_address_path).set(prm::ads::vhca_port_num, 1);
                 q.set(prm::qpc::q_key, qkey);
               }).ok());
  ASSERT_TRUE(h.transition(op::INIT2RTR_QP, qpn).ok());
  ASSERT_TRUE(h.transition(op::RTR2RTS_QP, qpn, [](prm::qpc::view q) { q.set(prm::qpc::next_send_psn, 0); }).ok());
}

TEST(EmuGsi, OnePerPortNumberedOneAndFreeAgainOnceDestroyed) {
  Harness h;
  h.bring_up();
  Harness::CqRing cq = h.create_cq();
  Harness::QpRing first, second, again;
  ASSERT_TRUE(h.create_qp_raw(first, prm::qpc_st::QP1, cq, cq).ok());
  EXPECT_EQ(first.qpn, 1u);
  Result r = h.create_qp_raw(second, prm::qpc_st::QP1, cq, cq);
  EXPECT_EQ(r.status, cs::RES_BUSY);
  EXPECT_EQ(r.syndrome, synd::GSI_TAKEN);
  // An ordinary UD QP is still fine, and never gets number 1.
  Harness::QpRing ud;
  ASSERT_TRUE(h.create_qp_raw(ud, prm::qpc_st::UD, cq, cq).ok());
  EXPECT_GT(ud.qpn, 1u);
  auto dq = cmd_in(op::DESTROY_QP, 16);
  prm::set(dq.data(), prm::destroy_qp_in::qpn, first.qpn);
  ASSERT_TRUE(h.exec(dq, 16).ok());
  ASSERT_TRUE(h.create_qp_raw(again, prm::qpc_st::QP1, cq, cq).ok());
  EXPECT_EQ(again.qpn, 1u);
}

class EmuGsiWire : public ::testing::Test {
 protected:
  MemoryLink link;
  Side a{link, 1}, b{link, 2};
  Harness::QpRing a_ud;  // an ordinary UD QP on a, whose sends carry the WQE's Q_Key as it is

  void SetUp() override {
    for (Side* s : {&a, &b}) {
      s->h.bring_up();
      ASSERT_TRUE(s->h.set_gid(0, s->ip).ok());
      ASSERT_TRUE(s->h.enable_roce().ok());
      s->cq = s->h.create_cq(8);
      ASSERT_TRUE(s->h.create_qp_raw(s->qp, prm::qpc_st::QP1, s->cq, s->cq).ok());
      ASSERT_EQ(s->qp.qpn, 1u);
      // The context's Q_Key is not the GSI's: QP1 takes the well-known one anyway.
      bring_to_rts(s->h, s->qp.qpn, 0x1234);
      s->mem = s->h.host.alloc(64 * 1024);
      s->key = s->h.create_mkey(s->mem, 64 * 1024);
    }
    ASSERT_TRUE(a.h.create_qp_raw(a_ud, prm::qpc_st::UD, a.cq, a.cq).ok());
    bring_to_rts(a.h, a_ud.qpn, 0x77);
  }
  void pump() {
    for (int i = 0; i < 100000; ++i)
      if (!(int(a.h.dev.service()) | int(b.h.dev.service()))) return;
    FAIL() << "devices never went idle";
  }
  // A 256-byte "MAD" from a's QP `from` to b's QP1, the WQE carrying this Q_Key.
  void send_mad(Harness::QpRing& from, uint32_t qkey, uint8_t fill) {
    for (int i = 0; i < 256; ++i) a.bytes()[i] = uint8_t(fill + i);
    Harness::SendOpts o;
    o.dqpn = 1;
    o.qkey = qkey;
    b.gid(o.dgid);
    a.h.post_send(from, wo::SEND, {{a.va(), 256, a.key}}, o);
    pump();
  }
  const rc::QpCounters& b_counters() { return *b.h.dev.hca().engine_->counters(1); }
};

TEST_F(EmuGsiWire, MadFromQp1ReachesQp1WithTheGrhAreaFirst) {
  b.h.post_recv(b.qp, {{b.va(), kGrh + 256, b.key}});
  // The WQE's Q_Key has its high bit set: the sender's own (the GSI's) goes on the wire (IBA 10.2.5).
  send_mad(a.qp, prm::kGsiQkey, 3);
  const uint8_t* e = b.h.poll_cq(b.cq);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::RESP_SEND);
  EXPECT_EQ(prm::get(e, prm::cqe64::qpn), 1u);
  EXPECT_EQ(prm::get(e, prm::cqe64::byte_cnt), kGrh + 256);
  EXPECT_EQ(prm::get(e, prm::cqe64::rqpn), 1u);  // sent from QP1: source QPN 1 on the wire
  EXPECT_EQ(prm::get(e, prm::cqe64::flags) & 0x30, 0x10u);  // a GRH came with it
  EXPECT_EQ(memcmp(b.bytes() + kGrh, a.bytes(), 256), 0);
  // IPv4 RoCEv2: the IPv4 header sits in the last 20 bytes of the GRH area, from a's address.
  EXPECT_EQ(b.bytes()[20] >> 4, 4);
  EXPECT_EQ(memcmp(b.bytes() + 20 + 12, a.ip, 4), 0);
  const uint8_t* s = a.h.poll_cq(a.cq);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(prm::get(s, prm::cqe64::opcode), co::REQ);
  EXPECT_EQ(prm::get(s, prm::cqe64::qpn), 1u);
}

TEST_F(EmuGsiWire, AWrongQkeyIsDroppedAndCounted) {
  b.h.post_recv(b.qp, {{b.va(), kGrh + 256, b.key}});
  uint64_t before = b_counters().dropped;
  send_mad(a_ud, 0x1234, 1);  // b's context value, not the GSI's: QP1 ignored it
  EXPECT_EQ(b.h.poll_cq(b.cq), nullptr);
  EXPECT_EQ(b_counters().dropped, before + 1);
  // The receive is still there for the next, right one.
  send_mad(a.qp, prm::kGsiQkey, 2);
  const uint8_t* e = b.h.poll_cq(b.cq);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::RESP_SEND);
  EXPECT_EQ(b.bytes()[kGrh], 2);
}

TEST(EmuQpErr, ToErrFlushesTheReceivesPostedBeforeIt) {
  Harness h;
  h.bring_up();
  Harness::CqRing cq = h.create_cq();
  Harness::QpRing q;
  ASSERT_TRUE(h.create_qp_raw(q, prm::qpc_st::UD, cq, cq).ok());
  bring_to_rts(h, q.qpn, 0x11);
  TestHost::Buffer mem = h.host.alloc(4096);
  uint32_t key = h.create_mkey(mem, 4096);
  uint64_t va = reinterpret_cast<uint64_t>(mem.va);
  for (int i = 0; i < 3; ++i) h.post_recv(q, {{va + 512u * i, 512, key}});
  EXPECT_EQ(h.poll_cq(cq), nullptr);  // nothing arrived: nothing completes yet
  ASSERT_TRUE(h.transition(op::QP_2ERR, q.qpn).ok());
  h.dev.service();
  for (uint32_t i = 0; i < 3; ++i) {
    const uint8_t* e = h.poll_cq(cq);
    ASSERT_NE(e, nullptr) << "receive " << i;
    EXPECT_EQ(prm::get(e, prm::err_cqe::opcode), co::RESP_ERR);
    EXPECT_EQ(prm::get(e, prm::err_cqe::syndrome), prm::cqe_syndrome::WR_FLUSH_ERR);
    EXPECT_EQ(prm::get(e, prm::err_cqe::wqe_counter), i);
  }
  EXPECT_EQ(h.poll_cq(cq), nullptr);
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
