// Reliable UC (MELON_UC_RELIABLE, device option uc=reliable; src/verbs/reliable_uc.h): a SEND that
// reaches a UC QP before its receive is posted is lost under the spec (IBA 9.7.5.1: UC has no RNR
// NAK) and kept with the option, which runs the QP as RC on the wire. JACCL re-sends as soon as a
// send completes, before the peer re-posts (ml-explore/mlx#3467), so this is the difference between
// an all_sum that finishes and ranks that fall out of step. Two soft devices in one process.
#include <arpa/inet.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "providers/soft/soft_fixture.h"

namespace {

using Clock = std::chrono::steady_clock;

struct End {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint32_t> buf = std::vector<uint32_t>(1024);  // 4 KiB: four packets at MTU 1024
};

class ReliableUc : public melon::test::SoftDeviceTest {
 protected:
  void SetUp() override {
    unsetenv("MELON_UC_RELIABLE");
    use_devices(
        "ru0=127.0.8.2/gid1=ipv4,ru1=127.0.8.3/gid1=ipv4,ruopt=127.0.8.4/gid1=ipv4/uc=reliable,"
        "ruopt2=127.0.8.5/gid1=ipv4/uc=reliable");
  }
  void TearDown() override {
    for (End* e : {&a, &b}) {
      if (e->qp) ibv_destroy_qp(e->qp);
      if (e->mr) ibv_dereg_mr(e->mr);
      if (e->cq) ibv_destroy_cq(e->cq);
      if (e->pd) ibv_dealloc_pd(e->pd);
      if (e->ctx) ibv_close_device(e->ctx);
    }
    unsetenv("MELON_UC_RELIABLE");
    SoftDeviceTest::TearDown();
  }

  // The QP as JACCL makes it: UC, depth 32, one SGE.
  void open(End& e, const char* name) {
    e.ctx = ibv_open_device(dev(name));
    ASSERT_NE(e.ctx, nullptr);
    e.pd = ibv_alloc_pd(e.ctx);
    e.cq = ibv_create_cq(e.ctx, 64, nullptr, nullptr, 0);
    ASSERT_NE(e.cq, nullptr);
    e.mr = ibv_reg_mr(e.pd, e.buf.data(), e.buf.size() * 4, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(e.mr, nullptr);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = e.cq;
    ia.qp_type = IBV_QPT_UC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 32;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    e.qp = ibv_create_qp(e.pd, &ia);
    ASSERT_NE(e.qp, nullptr) << strerror(errno);
  }
  // UC's attributes only (IBA Table 91), MTU 1024, sq_psn 7, sgid_index 1: JACCL's.
  void connect(End& e, const End& peer, const char* peer_addr) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(ibv_modify_qp(e.qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    at = {};
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = IBV_MTU_1024;
    at.dest_qp_num = peer.qp->qp_num;
    at.rq_psn = 7;
    at.ah_attr.is_global = 1;
    at.ah_attr.port_num = 1;
    at.ah_attr.grh.sgid_index = 1;
    at.ah_attr.grh.hop_limit = 1;
    at.ah_attr.grh.dgid.raw[10] = at.ah_attr.grh.dgid.raw[11] = 0xff;
    inet_pton(AF_INET, peer_addr, at.ah_attr.grh.dgid.raw + 12);
    ASSERT_EQ(ibv_modify_qp(e.qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN),
              0);
    at = {};
    at.qp_state = IBV_QPS_RTS;
    at.sq_psn = 7;
    ASSERT_EQ(ibv_modify_qp(e.qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  }
  void pair(const char* da, const char* aa, const char* db, const char* ba) {
    open(a, da);
    open(b, db);
    connect(a, b, ba);
    connect(b, a, aa);
  }

  // A 4 KiB SEND of `value` in every word.
  void send(End& e, uint32_t value, uint64_t id) {
    for (auto& w : e.buf) w = value;
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buf.data()), uint32_t(e.buf.size() * 4), e.mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ASSERT_EQ(ibv_post_send(e.qp, &wr, &bad), 0);
  }
  void post_recv(End& e, uint64_t id) {
    std::fill(e.buf.begin(), e.buf.end(), 0u);
    ibv_sge sge{reinterpret_cast<uintptr_t>(e.buf.data()), uint32_t(e.buf.size() * 4), e.mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ASSERT_EQ(ibv_post_recv(e.qp, &wr, &bad), 0);
  }
  // Polls `e` (which also receives: a polling application drives its device) for up to `ms`; true
  // with a completion in *wc.
  static bool poll_for(End& e, int ms, ibv_wc* wc) {
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    do {
      if (ibv_poll_cq(e.cq, 1, wc) == 1) return true;
    } while (Clock::now() < end);
    return false;
  }
  // Drives both ends for `ms`, expecting nothing to complete.
  void idle_both(int ms) {
    ibv_wc wc;
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end) {
      ASSERT_FALSE(poll_for(a, 1, &wc)) << "a: wr_id " << wc.wr_id << " status " << wc.status;
      ASSERT_FALSE(poll_for(b, 1, &wc)) << "b: wr_id " << wc.wr_id << " status " << wc.status;
    }
  }

  // SEND 1 before b posts a receive, then (receive posted) SEND 2; returns the value b receives
  // first, after checking both sends completed.
  uint32_t early_then_late() {
    ibv_wc wc{};
    send(a, 1, 101);
    bool first_done = poll_for(a, 200, &wc);  // UC: done when sent; reliable: not until received
    if (first_done) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    // b drives its device with no receive posted: the message arrives and finds none.
    EXPECT_FALSE(poll_for(b, 100, &wc)) << "b completed wr_id " << wc.wr_id << " with no receive posted";
    post_recv(b, 201);
    if (!first_done) {  // reliable UC: the retried message lands now and only then completes
      ibv_wc got{};
      bool received = false;
      const auto end = Clock::now() + std::chrono::seconds(5);
      while (!(first_done && received) && Clock::now() < end) {
        if (!first_done && ibv_poll_cq(a.cq, 1, &wc) == 1) first_done = true;
        if (!received && ibv_poll_cq(b.cq, 1, &got) == 1) received = true;
      }
      EXPECT_TRUE(first_done && received);
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(got.status, IBV_WC_SUCCESS);
      EXPECT_EQ(got.wr_id, 201u);
      EXPECT_EQ(got.byte_len, 4096u);
      uint32_t first = b.buf[0];
      post_recv(b, 202);
      send(a, 2, 102);
      EXPECT_TRUE(poll_for(a, 5000, &wc));
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_TRUE(poll_for(b, 5000, &got));
      EXPECT_EQ(b.buf[0], 2u);
      return first;
    }
    send(a, 2, 102);
    EXPECT_TRUE(poll_for(a, 5000, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    ibv_wc got;
    EXPECT_TRUE(poll_for(b, 5000, &got));
    EXPECT_EQ(got.status, IBV_WC_SUCCESS);
    EXPECT_EQ(got.wr_id, 201u);
    for (uint32_t w : b.buf) EXPECT_EQ(w, b.buf[0]) << "a message mixed from two sends";
    return b.buf[0];
  }

  End a, b;
};

TEST_F(ReliableUc, SpecUcLosesASendThatArrivesBeforeItsReceive) {
  pair("ru0", "127.0.8.2", "ru1", "127.0.8.3");
  EXPECT_EQ(early_then_late(), 2u) << "spec UC drops a message that finds no receive posted";
}

TEST_F(ReliableUc, WithTheOptionTheEarlySendWaitsForItsReceive) {
  setenv("MELON_UC_RELIABLE", "1", 1);
  pair("ru0", "127.0.8.2", "ru1", "127.0.8.3");
  EXPECT_EQ(early_then_late(), 1u);
}

TEST_F(ReliableUc, ADeviceListOrTheConfigOptionTurnsItOnAndZeroTurnsItOff) {
  // The first value b receives: 1 when a's early SEND waited for its receive, 2 when it was lost.
  struct {
    const char* env;  // MELON_UC_RELIABLE, or unset
    const char *dev_a, *addr_a, *dev_b, *addr_b;
    uint32_t first;
  } rows[] = {{"ru1,ru0", "ru0", "127.0.8.2", "ru1", "127.0.8.3", 1},
              {nullptr, "ruopt", "127.0.8.4", "ruopt2", "127.0.8.5", 1},  // uc=reliable on both
              {"ru1", "ruopt", "127.0.8.4", "ru1", "127.0.8.3", 1},  // ruopt's option, ru1 by the list
              {"0", "ruopt", "127.0.8.4", "ruopt2", "127.0.8.5", 2}};  // 0 overrides the device option
  for (auto& r : rows) {
    SCOPED_TRACE(std::string(r.env ? r.env : "(unset)") + " " + r.dev_a + " " + r.dev_b);
    if (r.env)
      setenv("MELON_UC_RELIABLE", r.env, 1);
    else
      unsetenv("MELON_UC_RELIABLE");
    pair(r.dev_a, r.addr_a, r.dev_b, r.addr_b);
    EXPECT_EQ(early_then_late(), r.first);
    TearDown();
    a = {};
    b = {};
    SetUp();
  }
}

TEST_F(ReliableUc, TheVerbsStillSeeUc) {
  setenv("MELON_UC_RELIABLE", "1", 1);
  pair("ru0", "127.0.8.2", "ru1", "127.0.8.3");
  ibv_qp_attr at;
  ibv_qp_init_attr ia;
  ASSERT_EQ(ibv_query_qp(a.qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RNR_RETRY, &ia), 0);
  EXPECT_EQ(ia.qp_type, IBV_QPT_UC);
  EXPECT_EQ(at.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(at.sq_psn, 7u);
  EXPECT_EQ(at.timeout, 0);
  EXPECT_EQ(at.retry_cnt, 0);
  EXPECT_EQ(at.rnr_retry, 0);
  EXPECT_EQ(at.max_rd_atomic, 0);
  // UC has no RDMA READ or atomics, with or without the option.
  ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf.data()), 8, a.mr->lkey};
  for (ibv_wr_opcode op : {IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_CMP_AND_SWP}) {
    ibv_send_wr wr{}, *bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b.buf.data());
    wr.wr.rdma.rkey = b.mr->rkey;
    EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL) << "opcode " << op;
  }
  // RDMA WRITE, which UC has, lands.
  a.buf[0] = 0xfeedf00d;
  ibv_send_wr wr{}, *bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b.buf.data());
  wr.wr.rdma.rkey = b.mr->rkey;
  ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
  ibv_wc wc;
  ASSERT_TRUE(poll_for(a, 5000, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(b.buf[0], 0xfeedf00du);
}

TEST_F(ReliableUc, APeerWithoutTheOptionFailsTheSenderInsteadOfLosingSilently) {
  setenv("MELON_UC_RELIABLE", "ru0", 1);  // a runs RC on the wire, b is spec UC
  pair("ru0", "127.0.8.2", "ru1", "127.0.8.3");
  post_recv(b, 201);
  send(a, 1, 101);
  ibv_wc wc{}, got;
  bool done = false;
  const auto end = Clock::now() + std::chrono::seconds(30);  // 8 tries of 1.07 s, and a busy machine
  while (!done && Clock::now() < end) {
    done = ibv_poll_cq(a.cq, 1, &wc) == 1;
    ASSERT_NE(ibv_poll_cq(b.cq, 1, &got), 1) << "a spec UC QP took an RC packet";
  }
  ASSERT_TRUE(done);
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
}

}  // namespace
