// The soft provider's data path through the verbs API, two devices in one process over UDP
// loopback (127.0.2.2 and 127.0.2.3): what applications rely on beyond the stock tools.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/verbs_kit.h"

namespace {

constexpr int kDepth = 16;
constexpr size_t kBuf = 1 << 16;

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* ch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kBuf);
};

// The next completion of `cq`, waiting on its completion channel (every CQ here has one): arm,
// look once more (a completion may have arrived before the arming), then block until the channel
// signals. No sleeping and no spinning, so the progress threads keep the CPU on a busy machine.
ibv_wc wait_wc(ibv_cq* cq, int ms = 5000) {
  ibv_wc wc{};
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    if (ibv_poll_cq(cq, 1, &wc) == 1) return wc;
    if (ibv_req_notify_cq(cq, 0) != 0) break;
    if (ibv_poll_cq(cq, 1, &wc) == 1) return wc;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
    pollfd p{cq->channel->fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, int(left)) != 1) break;
    ibv_cq* ev_cq;
    void* ev_ctx;
    if (ibv_get_cq_event(cq->channel, &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
  }
  ADD_FAILURE() << "no completion";
  wc.status = IBV_WC_GENERAL_ERR;
  return wc;
}

class SoftLoopback : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    setenv("MELON_SOFT_DEVICES", "lb0=127.0.2.2,lb1=127.0.2.3", 1);
    int n;
    list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
    for (int i = 0; i < n; ++i) {
      if (!strcmp(ibv_get_device_name(list[i]), "lb0")) a.ctx = ibv_open_device(list[i]);
      if (!strcmp(ibv_get_device_name(list[i]), "lb1")) b.ctx = ibv_open_device(list[i]);
    }
    ASSERT_NE(a.ctx, nullptr);
    ASSERT_NE(b.ctx, nullptr);
    for (Side* s : {&a, &b}) {
      s->pd = ibv_alloc_pd(s->ctx);
      s->ch = ibv_create_comp_channel(s->ctx);
      s->cq = ibv_create_cq(s->ctx, 4 * kDepth, nullptr, s->ch, 0);
      ASSERT_NE(s->cq, nullptr);
    }
  }
  void TearDown() override {
    for (Side* s : {&a, &b}) {
      if (s->qp) ibv_destroy_qp(s->qp);
      if (srq && s == &b) ibv_destroy_srq(srq);
      if (s->mr) ibv_dereg_mr(s->mr);
      ibv_destroy_cq(s->cq);
      ibv_destroy_comp_channel(s->ch);
      ibv_dealloc_pd(s->pd);
      ibv_close_device(s->ctx);
    }
    ibv_free_device_list(list);
  }

  void reg(Side& s, int access) {
    s.mr = ibv_reg_mr(s.pd, s.buf.data(), s.buf.size(), access);
    ASSERT_NE(s.mr, nullptr);
  }

  void make_qp(Side& s, ibv_srq* with_srq = nullptr) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = s.cq;
    ia.srq = with_srq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = kDepth;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 2;
    s.qp = ibv_create_qp(s.pd, &ia);
    ASSERT_NE(s.qp, nullptr);
  }

  void connect(Side& s, Side& peer, uint8_t peer_last_octet, int access, uint32_t psn = 0xfffff0) {
    melon::testkit::RcPath p;
    p.dest_qpn = peer.qp->qp_num;
    const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 2, peer_last_octet};
    memcpy(p.dgid.raw, gid, 16);
    p.sq_psn = p.rq_psn = psn;
    p.access = access;
    melon::testkit::rc_to_rts(s.qp, p);
  }

  void pair(int access_b = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC) {
    const int all =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    reg(a, all);
    reg(b, IBV_ACCESS_LOCAL_WRITE | access_b);
    make_qp(a);
    make_qp(b, srq);
    connect(a, b, 3, all);
    connect(b, a, 2, all);
  }

  int post(Side& s, ibv_wr_opcode op, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t id = 1) {
    ibv_sge sge{uint64_t(uintptr_t(s.buf.data() + off)), len, s.mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = id;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(s.qp, &wr, &bad);
  }

  // RESET, then INIT..RTS again: how an application restarts QPs that went to ERR.
  void restart() {
    const int all =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    for (Side* s : {&a, &b}) {
      ibv_qp_attr at{};
      at.qp_state = IBV_QPS_RESET;
      ASSERT_EQ(ibv_modify_qp(s->qp, &at, IBV_QP_STATE), 0);
    }
    // New PSNs, as applications do: a packet of the old connection still in flight (a
    // retransmission) must not pass for one of the new.
    psn_ = (psn_ + 0x10000) & 0xffffff;
    connect(a, b, 3, all, psn_);
    connect(b, a, 2, all, psn_);
  }
  uint32_t psn_ = 0xfffff0;

  int post_recv(Side& s, void* addr, uint32_t len, uint32_t lkey, uint64_t id) {
    ibv_sge sge{uint64_t(uintptr_t(addr)), len, lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(s.qp, &wr, &bad);
  }

  static ibv_qp_state state(ibv_qp* qp) {
    ibv_qp_attr at{};
    ibv_qp_init_attr ia{};
    EXPECT_EQ(ibv_query_qp(qp, &at, IBV_QP_STATE, &ia), 0);
    return at.qp_state;
  }

  Side a, b;
  ibv_srq* srq = nullptr;
  ibv_device** list = nullptr;
};

TEST_F(SoftLoopback, WriteAndReadCompleteWithoutTheTargetCallingAnyVerb) {
  pair();
  for (size_t i = 0; i < 5000; ++i) a.buf[i] = uint8_t(i * 7);
  uint64_t dst = uint64_t(uintptr_t(b.buf.data())) + 1000;
  ASSERT_EQ(post(a, IBV_WR_RDMA_WRITE, 0, 5000, dst, b.mr->rkey), 0);
  ibv_wc wc = wait_wc(a.cq);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(memcmp(b.buf.data() + 1000, a.buf.data(), 5000), 0);
  ASSERT_EQ(post(a, IBV_WR_RDMA_READ, 10000, 3001, dst + 17, b.mr->rkey, 2), 0);
  wc = wait_wc(a.cq);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc.byte_len, 3001u);
  EXPECT_EQ(memcmp(a.buf.data() + 10000, a.buf.data() + 17, 3001), 0);
}

TEST_F(SoftLoopback, WriteWithoutRemoteWriteAccessIsRemoteAccessErrorAndTheQpFlushes) {
  pair(IBV_ACCESS_REMOTE_READ);  // B's MR does not allow remote writes
  uint64_t dst = uint64_t(uintptr_t(b.buf.data()));
  std::vector<uint8_t> before = b.buf;
  ASSERT_EQ(post(a, IBV_WR_RDMA_WRITE, 0, 100, dst, b.mr->rkey, 1), 0);
  ASSERT_EQ(post(a, IBV_WR_RDMA_WRITE, 0, 100, dst, b.mr->rkey, 2), 0);
  ibv_wc wc = wait_wc(a.cq);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
  wc = wait_wc(a.cq);
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(b.buf, before);  // nothing written
  ibv_qp_attr at{};
  ibv_qp_init_attr ia{};
  ASSERT_EQ(ibv_query_qp(a.qp, &at, IBV_QP_STATE, &ia), 0);
  EXPECT_EQ(at.qp_state, IBV_QPS_ERR);
}

TEST_F(SoftLoopback, BadSendArgumentsAreEinvalAndNothingIsSent) {
  pair();
  ibv_sge sge[3] = {};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = sge;
  wr.num_sge = 3;  // max_send_sge is 2
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  wr.num_sge = 1;
  wr.opcode = IBV_WR_BIND_MW;  // not on a soft device
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
  // Nothing went out: a good SEND posted now is the first thing either side completes (the QP
  // sends in order, so a refused WR that had been queued would complete, or arrive, before it).
  ASSERT_EQ(post_recv(b, b.buf.data(), 64, b.mr->lkey, 50), 0);
  ASSERT_EQ(post(a, IBV_WR_SEND, 0, 8, 0, 0, 51), 0);
  ibv_wc wc = wait_wc(b.cq);
  EXPECT_EQ(wc.wr_id, 50u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 8u);
  wc = wait_wc(a.cq);
  EXPECT_EQ(wc.wr_id, 51u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_poll_cq(a.cq, 1, &wc), 0);
  EXPECT_EQ(ibv_poll_cq(b.cq, 1, &wc), 0);
}

TEST_F(SoftLoopback, SendWithImmediateWakesTheCompletionChannel) {
  pair();
  ibv_sge rs{uint64_t(uintptr_t(b.buf.data())), 256, b.mr->lkey};
  ibv_recv_wr rw{}, *rbad;
  rw.wr_id = 77;
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(b.qp, &rw, &rbad), 0);
  ASSERT_EQ(ibv_req_notify_cq(b.cq, 0), 0);
  memcpy(a.buf.data(), "hello, soft roce", 16);
  ibv_sge sge{uint64_t(uintptr_t(a.buf.data())), 16, a.mr->lkey};
  ibv_send_wr wr{}, *bad;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(0xabcd0001);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
  pollfd p{b.ch->fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  ibv_cq* ev_cq;
  void* ev_ctx;
  ASSERT_EQ(ibv_get_cq_event(b.ch, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, b.cq);
  ibv_ack_cq_events(ev_cq, 1);
  ibv_wc wc = wait_wc(b.cq);
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.byte_len, 16u);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(wc.imm_data), 0xabcd0001u);
  EXPECT_EQ(wc.qp_num, b.qp->qp_num);
  EXPECT_EQ(memcmp(b.buf.data(), "hello, soft roce", 16), 0);
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_SUCCESS);
}

TEST_F(SoftLoopback, SrqLimitEventFiresOnceWhenTheResponderDrainsBelowIt) {
  const int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_srq_init_attr si{};
  si.attr.max_wr = 8;
  si.attr.max_sge = 1;
  srq = ibv_create_srq(b.pd, &si);
  ASSERT_NE(srq, nullptr);
  pair(all);
  ibv_sge rs{uint64_t(uintptr_t(b.buf.data())), 64, b.mr->lkey};
  ibv_recv_wr rw{}, *rbad;
  rw.sg_list = &rs;
  rw.num_sge = 1;
  for (int i = 0; i < 4; ++i) {
    rw.wr_id = uint64_t(i);
    ASSERT_EQ(ibv_post_srq_recv(srq, &rw, &rbad), 0);
  }
  ibv_srq_attr at{};
  at.srq_limit = 3;
  ASSERT_EQ(ibv_modify_srq(srq, &at, IBV_SRQ_LIMIT), 0);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(post(a, IBV_WR_SEND, 0, 8, 0, 0, uint64_t(10 + i)), 0);
  for (int i = 0; i < 2; ++i) {
    ibv_wc wc = wait_wc(b.cq);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, uint64_t(i));  // FIFO
  }
  pollfd p{b.ctx->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(b.ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, srq);
  ibv_ack_async_event(&ev);
  ASSERT_EQ(ibv_query_srq(srq, &at), 0);
  EXPECT_EQ(at.srq_limit, 0u);  // disarmed: one event per arming
  EXPECT_EQ(poll(&p, 1, 100), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);  // b's QP still uses it
  ibv_destroy_qp(b.qp);
  b.qp = nullptr;
}

TEST_F(SoftLoopback, AtomicsAreSerialAndReturnTheOriginalValue) {
  pair();
  uint64_t* target = reinterpret_cast<uint64_t*>(b.buf.data() + 4096);
  *target = 100;
  for (int i = 0; i < 10; ++i) {
    ibv_sge sge{uint64_t(uintptr_t(a.buf.data() + 8 * i)), 8, a.mr->lkey};
    ibv_send_wr wr{}, *bad;
    wr.wr_id = uint64_t(i);
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = uint64_t(uintptr_t(target));
    wr.wr.atomic.rkey = b.mr->rkey;
    wr.wr.atomic.compare_add = 5;
    ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
  }
  for (int i = 0; i < 10; ++i) {
    ibv_wc wc = wait_wc(a.cq);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_FETCH_ADD);
    uint64_t got;
    memcpy(&got, a.buf.data() + 8 * i, 8);
    EXPECT_EQ(got, 100u + 5u * uint64_t(i));
  }
  EXPECT_EQ(*target, 150u);
  // Misaligned: NAK invalid request.
  ibv_sge sge{uint64_t(uintptr_t(a.buf.data())), 8, a.mr->lkey};
  ibv_send_wr wr{}, *bad;
  wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.atomic.remote_addr = uint64_t(uintptr_t(target)) + 4;
  wr.wr.atomic.rkey = b.mr->rkey;
  ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_REM_INV_REQ_ERR);
}

}  // namespace

// ---- ibv_rereg_mr keeps protection (issue 8 items 3 and 4) ------------------------------------------

// A receive posted on the old buffer before IBV_REREG_MR_CHANGE_TRANSLATION must not be written:
// the application may already have freed that memory (pyverbs does, and the SEND used to land in
// the freed heap chunk). The responder finds the SGE outside the MR as it is now: the receive
// completes with a local protection error, the requester sees a remote operational error, both
// QPs go to ERR; restarted, they carry traffic into the new buffer.
TEST_F(SoftLoopback, ReregTranslationFailsAReceivePostedOnTheOldBuffer) {
  pair();
  std::vector<uint8_t> before = b.buf;
  ASSERT_EQ(post_recv(b, b.buf.data(), 256, b.mr->lkey, 7), 0);
  std::vector<uint8_t> fresh(kBuf, 0);
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, fresh.data(), fresh.size(), 0), 0);
  memcpy(a.buf.data(), "after the rereg", 15);
  ASSERT_EQ(post(a, IBV_WR_SEND, 0, 15, 0, 0, 1), 0);
  ibv_wc wc = wait_wc(b.cq);
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
  wc = wait_wc(a.cq);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR);
  EXPECT_EQ(b.buf, before);  // the old buffer was not touched
  EXPECT_EQ(state(a.qp), IBV_QPS_ERR);
  EXPECT_EQ(state(b.qp), IBV_QPS_ERR);

  restart();
  ASSERT_EQ(post_recv(b, fresh.data() + 100, 256, b.mr->lkey, 8), 0);
  ASSERT_EQ(post(a, IBV_WR_SEND, 0, 15, 0, 0, 2), 0);
  wc = wait_wc(b.cq);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 8u);
  EXPECT_EQ(memcmp(fresh.data() + 100, "after the rereg", 15), 0);
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dereg_mr(b.mr), 0);  // before `fresh` goes
  b.mr = nullptr;
}

// IBV_REREG_MR_CHANGE_PD to a PD other than the QP's: the MR no longer serves that QP, so the
// first message fails (requester: remote operational error). Moved back and the QPs restarted,
// traffic passes; the PD the MR visited can then be deallocated.
TEST_F(SoftLoopback, ReregToAForeignPdFailsTrafficUntilMovedBack) {
  pair();
  ibv_pd* foreign = ibv_alloc_pd(b.ctx);
  ASSERT_NE(foreign, nullptr);
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, foreign, nullptr, 0, 0), 0);
  EXPECT_EQ(b.mr->pd, foreign);
  EXPECT_EQ(ibv_dealloc_pd(foreign), EBUSY);  // the MR is in it now
  ASSERT_EQ(post_recv(b, b.buf.data(), 64, b.mr->lkey, 1), 0);
  ASSERT_EQ(post(a, IBV_WR_SEND, 0, 8, 0, 0, 2), 0);
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_REM_OP_ERR);
  EXPECT_EQ(wait_wc(b.cq).status, IBV_WC_LOC_PROT_ERR);

  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, b.pd, nullptr, 0, 0), 0);
  restart();
  ASSERT_EQ(post_recv(b, b.buf.data(), 64, b.mr->lkey, 3), 0);
  ASSERT_EQ(post(a, IBV_WR_SEND, 0, 8, 0, 0, 4), 0);
  EXPECT_EQ(wait_wc(b.cq).status, IBV_WC_SUCCESS);
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_dealloc_pd(foreign), 0);
}

// A WRITE aimed with an rkey that is no longer valid - its MR deregistered, or re-registered (which
// draws new keys) - or with an lkey in place of the rkey, is a remote access error and writes nothing.
TEST_F(SoftLoopback, WriteWithAStaleRkeyIsRemoteAccessError) {
  pair();
  uint64_t dst = uint64_t(uintptr_t(b.buf.data()));
  std::vector<uint8_t> before = b.buf;
  memset(a.buf.data(), 0x5a, 64);
  auto expect_rejected = [&](uint32_t rkey, const char* what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(post(a, IBV_WR_RDMA_WRITE, 0, 64, dst, rkey, 9), 0);
    EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(b.buf, before);
    restart();
  };
  uint32_t old_rkey = b.mr->rkey;
  expect_rejected(b.mr->lkey, "lkey used as an rkey");
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
            0);
  EXPECT_NE(b.mr->rkey, old_rkey);
  expect_rejected(old_rkey, "rkey from before the re-registration");
  ASSERT_EQ(post(a, IBV_WR_RDMA_WRITE, 0, 64, dst, b.mr->rkey, 10), 0);  // the new one works
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_SUCCESS);
  EXPECT_EQ(b.buf[0], 0x5a);
  before = b.buf;
  uint32_t dead = b.mr->rkey;
  ASSERT_EQ(ibv_dereg_mr(b.mr), 0);
  b.mr = nullptr;
  expect_rejected(dead, "rkey of a deregistered MR");
}
