// An emulated HCA and the soft provider (through the verbs API) over UDP on loopback: the emulator's
// wire against an independent RoCEv2 implementation of this project (WRITE, READ, SEND both ways,
// atomics). Addresses 127.0.7.2 (soft) and 127.0.7.3 (emulated HCA) on port 4791, this test's own:
// ctest runs tests side by side, and an address:4791 is bound by one process at a time.
#include <infiniband/verbs.h>

#include <chrono>
#include <thread>

#include "harness.h"
#include "mlx5/emu/wire.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace wo = prm::wqe_opcode;
namespace co = prm::cqe_opcode;

constexpr uint8_t kSoftAddr[4] = {127, 0, 7, 2};  // named by MELON_SOFT_DEVICES below
constexpr uint8_t kEmuAddr[4] = {127, 0, 7, 3};
constexpr uint32_t kEmuIp = uint32_t(kEmuAddr[0]) << 24 | kEmuAddr[1] << 16 | kEmuAddr[2] << 8 | kEmuAddr[3];
// An address's IPv4-mapped GID (GID index 0 of a RoCEv2 IPv4 port).
void gid_of(const uint8_t a[4], uint8_t gid[16]) {
  const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  memcpy(gid, prefix, 12);
  memcpy(gid + 12, a, 4);
}
constexpr size_t kBuf = 1 << 20;

class EmuSoftInterop : public ::testing::Test {
 protected:
  UdpWire wire{kEmuIp};
  std::unique_ptr<Harness> h;
  ibv_device** list = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> sbuf = std::vector<uint8_t>(kBuf);
  Harness::CqRing ecq;
  Harness::QpRing eqp;
  TestHost::Buffer emem;
  uint32_t ekey = 0;

  void SetUp() override {
    // A host without 127/8 on its loopback (macOS has 127.0.0.1 only) skips; an address in use is
    // another test on this test's address, a failure.
    int e = wire.open();
    if (e == EADDRNOTAVAIL) GTEST_SKIP() << "cannot bind 127.0.7.3:4791: " << strerror(e);
    ASSERT_EQ(e, 0) << "cannot bind 127.0.7.3:4791: " << strerror(e);
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    setenv("MELON_SOFT_DEVICES", "emupeer=127.0.7.2", 1);
    int n = 0;
    list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
    for (int i = 0; i < n; ++i)
      if (!strcmp(ibv_get_device_name(list[i]), "emupeer")) ctx = ibv_open_device(list[i]);
    ASSERT_NE(ctx, nullptr);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    mr = ibv_reg_mr(
        pd, sbuf.data(), kBuf,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 2;
    qp = ibv_create_qp(pd, &ia);
    ASSERT_TRUE(pd && cq && mr && qp);

    DeviceConfig cfg;
    cfg.init_delay_ns = 0;
    h.reset(new Harness(cfg, &wire, true));
    wire.attach(&h->dev);
    h->bring_up();
    ASSERT_TRUE(h->set_gid(0, kEmuAddr).ok());
    ASSERT_TRUE(h->enable_roce().ok());
    ecq = h->create_cq(6);
    ASSERT_TRUE(h->create_qp_raw(eqp, prm::qpc_st::RC, ecq, ecq).ok());
    emem = h->host.alloc(kBuf);
    ekey = h->create_mkey(emem, kBuf);

    // Soft side to RTS towards the emulated HCA.
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    ASSERT_EQ(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = IBV_MTU_1024;
    at.dest_qp_num = eqp.qpn;
    at.rq_psn = 500;
    at.max_dest_rd_atomic = 4;
    at.min_rnr_timer = 1;
    at.ah_attr.is_global = 1;
    at.ah_attr.port_num = 1;
    gid_of(kEmuAddr, at.ah_attr.grh.dgid.raw);
    ASSERT_EQ(ibv_modify_qp(qp, &at,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    at.qp_state = IBV_QPS_RTS;
    at.sq_psn = 900;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 4;
    ASSERT_EQ(ibv_modify_qp(qp, &at,
                            IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_MAX_QP_RD_ATOMIC),
              0);
    // Emulated side to RTS towards the soft device.
    ASSERT_TRUE(h->transition(op::RST2INIT_QP, eqp.qpn, [](prm::qpc::view q) {
                   q.at(prm::qpc::primary_address_path).set(prm::ads::vhca_port_num, 1);
                   q.set(prm::qpc::rwe, 1).set(prm::qpc::rre, 1).set(prm::qpc::rae, 1);
                 }).ok());
    uint32_t soft_qpn = qp->qp_num;
    Result r = h->transition(op::INIT2RTR_QP, eqp.qpn, [&](prm::qpc::view q) {
      q.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES)
          .set(prm::qpc::remote_qpn, soft_qpn)
          .set(prm::qpc::next_rcv_psn, 900);
      q.set(prm::qpc::log_rra_max, 2).set(prm::qpc::min_rnr_nak, 1);
      uint8_t sgid[16];
      gid_of(kSoftAddr, sgid);
      q.at(prm::qpc::primary_address_path).set(prm::ads::hop_limit, 64).set_bytes(prm::ads::rgid_rip, sgid);
    });
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(h->transition(op::RTR2RTS_QP, eqp.qpn, [](prm::qpc::view q) {
                   q.set(prm::qpc::next_send_psn, 500).set(prm::qpc::retry_count, 7).set(prm::qpc::rnr_retry, 7);
                   q.set(prm::qpc::log_sra_max, 2).at(prm::qpc::primary_address_path).set(prm::ads::ack_timeout, 14);
                 }).ok());
  }
  void TearDown() override {
    if (qp) ibv_destroy_qp(qp);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
    if (list) ibv_free_device_list(list);
  }
  // Runs the emulated HCA (the soft device has its own progress thread) until `done` or 5 s.
  template <class F>
  bool pump_until(F done) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < end) {
      wire.poll(1);
      while (h->dev.service()) {}
      if (done()) return true;
    }
    return false;
  }
  const uint8_t* emu_cqe() {
    const uint8_t* e = nullptr;
    pump_until([&] { return (e = h->poll_cq(ecq)) != nullptr; });
    return e;
  }
  bool soft_wc(ibv_wc* wc) {
    return pump_until([&] { return ibv_poll_cq(cq, 1, wc) == 1; });
  }
  uint8_t* ebytes() { return static_cast<uint8_t*>(emem.va); }
  uint64_t eva() { return reinterpret_cast<uint64_t>(emem.va); }
};

TEST_F(EmuSoftInterop, EmulatedHcaWritesAndReadsSoftMemory) {
  for (size_t i = 0; i < 65536; ++i) ebytes()[i] = uint8_t(i * 13);
  Harness::SendOpts o;
  o.raddr = uint64_t(uintptr_t(sbuf.data())) + 4096, o.rkey = mr->rkey;
  h->post_send(eqp, wo::RDMA_WRITE, {{eva(), 65536, ekey}}, o);
  const uint8_t* e = emu_cqe();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ)
      << "syndrome " << prm::get(e, prm::err_cqe::syndrome) << " bad icrc " << wire.bad_icrc() << " rx "
      << h->dev.stats().frames_rx << " tx " << h->dev.stats().frames_tx << " dropped " << h->dev.stats().frames_dropped;
  EXPECT_EQ(memcmp(sbuf.data() + 4096, ebytes(), 65536), 0);
  for (size_t i = 0; i < 10000; ++i) sbuf[200000 + i] = uint8_t(i ^ 0x77);
  o.raddr = uint64_t(uintptr_t(sbuf.data())) + 200000;
  h->post_send(eqp, wo::RDMA_READ, {{eva() + 300000, 10000, ekey}}, o);
  e = emu_cqe();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::sop_drop), wo::RDMA_READ);
  EXPECT_EQ(prm::get(e, prm::cqe64::byte_cnt), 10000u);
  EXPECT_EQ(memcmp(ebytes() + 300000, sbuf.data() + 200000, 10000), 0);
}

TEST_F(EmuSoftInterop, SoftWritesReadsAndSendsToTheEmulatedHca) {
  for (size_t i = 0; i < 32768; ++i) sbuf[i] = uint8_t(i * 3 + 1);
  ibv_sge sge{uint64_t(uintptr_t(sbuf.data())), 32768, mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = eva() + 8192;
  wr.wr.rdma.rkey = ekey;
  ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(soft_wc(&wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(ebytes() + 8192, sbuf.data(), 32768), 0);
  // SEND with immediate into a receive the emulated HCA fetches from its RQ.
  h->post_recv(eqp, {{eva() + 500000, 4096, ekey}});
  sge.length = 3000;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htobe32(0xcafe);
  ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
  const uint8_t* e = emu_cqe();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::RESP_SEND_IMM);
  EXPECT_EQ(prm::get(e, prm::cqe64::byte_cnt), 3000u);
  EXPECT_EQ(prm::get(e, prm::cqe64::imm_inval_pkey), 0xcafeu);
  EXPECT_EQ(memcmp(ebytes() + 500000, sbuf.data(), 3000), 0);
  ASSERT_TRUE(soft_wc(&wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  // READ of the emulated HCA's memory.
  for (size_t i = 0; i < 5000; ++i) ebytes()[700000 + i] = uint8_t(i * 11);
  sge.addr = uint64_t(uintptr_t(sbuf.data())) + 600000;
  sge.length = 5000;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.wr.rdma.remote_addr = eva() + 700000;
  ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
  ASSERT_TRUE(soft_wc(&wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(memcmp(sbuf.data() + 600000, ebytes() + 700000, 5000), 0);
}

TEST_F(EmuSoftInterop, EmulatedHcaSendsAndDoesAtomicsOnSoftMemory) {
  ibv_sge rs{uint64_t(uintptr_t(sbuf.data())) + 100, 2048, mr->lkey};
  ibv_recv_wr rw{}, *rbad = nullptr;
  rw.wr_id = 42;
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(qp, &rw, &rbad), 0);
  memset(ebytes(), 0x6e, 1500);
  h->post_send(eqp, wo::SEND, {{eva(), 1500, ekey}});
  ibv_wc wc{};
  ASSERT_TRUE(soft_wc(&wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.byte_len, 1500u);
  EXPECT_EQ(wc.wr_id, 42u);
  EXPECT_EQ(sbuf[100 + 1499], 0x6e);
  ASSERT_NE(emu_cqe(), nullptr);
  uint64_t v = 40;
  memcpy(sbuf.data() + 4096, &v, 8);
  Harness::SendOpts o;
  o.raddr = uint64_t(uintptr_t(sbuf.data())) + 4096, o.rkey = mr->rkey, o.swap_add = 2;
  h->post_send(eqp, wo::ATOMIC_FA, {{eva() + 64, 8, ekey}}, o);
  const uint8_t* e = emu_cqe();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::cqe64::opcode), co::REQ);
  uint64_t orig, now;
  memcpy(&orig, ebytes() + 64, 8);
  memcpy(&now, sbuf.data() + 4096, 8);
  EXPECT_EQ(orig, 40u);
  EXPECT_EQ(now, 42u);
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
