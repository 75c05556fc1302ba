// Lanes of a soft device (src/providers/soft/soft_qp.h): several transports per device, one
// SO_REUSEPORT group per address steered by destination QPN. Each QP lands in the lane its QPN
// names and its packets arrive at that lane's socket; RC, SRQ, a CQ shared across lanes and UD
// all work on every lane; packets the kernel steered to the wrong lane (a GRO buffer of two QPs)
// are handed over; the address is shared with other devices and processes (addr_registry.h); and
// where the steering program cannot be attached the device runs one lane on an address of its own.
//
// The executable's setsockopt() is setsockopt_spy.cpp's: it records each call and can make an
// option fail.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "providers/soft/soft_qp.h"
#include "providers/soft/setsockopt_spy.h"
#include "providers/soft/soft_fixture.h"
#include "providers/soft/soft_inject.h"

namespace {

using melon::soft::Hub;
using melon::soft::SoftContext;
using melon::soft::SoftQp;

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t kBuf = 1 << 20;
const uint8_t kGidA[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 11, 2};
const uint8_t kGidB[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 11, 3};

// One device's objects: a PD, one CQ for every QP (so it collects from several lanes), a buffer.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  ibv_srq* srq = nullptr;
  std::vector<ibv_qp*> qps;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kBuf);

  std::string open(ibv_device* d) {
    ctx = ibv_open_device(d);
    if (!ctx) return "open";
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 1024, nullptr, nullptr, 0);
    if (!pd || !cq) return "pd/cq";
    mr = ibv_reg_mr(pd, buf.data(), buf.size(), kAll);
    return mr ? "" : "reg_mr";
  }
  ibv_qp* add_qp(ibv_qp_type type, bool on_srq = false) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.srq = on_srq ? srq : nullptr;
    ia.qp_type = type;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &ia);
    if (qp) qps.push_back(qp);
    return qp;
  }
  Hub* hub() const { return SoftContext::from(ctx)->hub_if_started(); }
  ~Side() {
    for (ibv_qp* q : qps) ibv_destroy_qp(q);
    if (srq) ibv_destroy_srq(srq);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

size_t lane_index(ibv_qp* qp) { return SoftQp::from(qp)->lane_index; }
// The lane a QPN steers to: its bucket's (src/providers/soft/steering.h).
size_t lane_of_qpn(ibv_qp* qp) { return SoftQp::from(qp)->hub->lane_index_of(qp->qp_num); }

// RC qp (on gid `self`) to peer (QPN `dest`, on `dgid`), INIT -> RTR -> RTS at path MTU 1024.
std::string connect_rc(ibv_qp* qp, uint32_t dest, const uint8_t dgid[16]) {
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.qp_access_flags = kAll;
  if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return "INIT";
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = IBV_MTU_1024;
  at.dest_qp_num = dest;
  at.rq_psn = 0x100;
  at.max_dest_rd_atomic = 4;
  at.min_rnr_timer = 1;
  at.ah_attr.is_global = 1;
  at.ah_attr.port_num = 1;
  memcpy(at.ah_attr.grh.dgid.raw, dgid, 16);
  if (ibv_modify_qp(qp, &at,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return "RTR";
  at.qp_state = IBV_QPS_RTS;
  at.sq_psn = 0x100;
  at.timeout = 14;
  at.retry_cnt = 7;
  at.rnr_retry = 7;
  at.max_rd_atomic = 4;
  if (ibv_modify_qp(qp, &at,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_MAX_QP_RD_ATOMIC))
    return "RTS";
  return "";
}

std::string connect_pair(ibv_qp* a, ibv_qp* b) {
  std::string e = connect_rc(a, b->qp_num, kGidB);
  return e.empty() ? connect_rc(b, a->qp_num, kGidA) : "a: " + e;
}

// The next completion on `cq` (polling: this also receives on the CQ's lanes), or status
// IBV_WC_GENERAL_ERR after 10 s.
ibv_wc next_wc(ibv_cq* cq) {
  ibv_wc wc{};
  for (int i = 0; i < 10000; ++i) {
    if (ibv_poll_cq(cq, 1, &wc) == 1) return wc;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  wc.status = IBV_WC_GENERAL_ERR;
  return wc;
}

// One signaled RDMA op of `len` bytes between the same offset of a's and b's buffers.
ibv_wc rdma(Side& a, ibv_qp* qp, Side& b, ibv_wr_opcode op, size_t off, uint32_t len, uint64_t id) {
  ibv_sge sge{uint64_t(uintptr_t(a.buf.data() + off)), len, a.mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = id;
  wr.opcode = op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = uint64_t(uintptr_t(b.buf.data() + off));
  wr.wr.rdma.rkey = b.mr->rkey;
  if (ibv_post_send(qp, &wr, &bad)) {
    ibv_wc wc{};
    wc.status = IBV_WC_GENERAL_ERR;
    return wc;
  }
  return next_wc(a.cq);
}

std::vector<uint64_t> lane_rx(Hub* h) {
  std::vector<uint64_t> v;
  for (size_t i = 0; i < h->lanes(); ++i) v.push_back(h->lane(i).lane_rx_packets());
  return v;
}

class SoftLanes : public melon::test::SoftDeviceTest {
 protected:
  void SetUp() override {
    melon::test::sockopt_reset();
    setenv("MELON_SOFT_LANES", "3", 1);  // three, not a power of two, whatever the CPU count
    // ln0b sits on ln0's address: a second device there must be refused, as a second process is.
    use_devices("ln0=127.0.11.2,ln1=127.0.11.3,ln0b=127.0.11.2");
  }
  void TearDown() override {
    melon::test::sockopt_reset();
    SoftDeviceTest::TearDown();
  }
};

// Three RC pairs: every QP is in the lane its QPN steers to, the lanes are all used, and a WRITE and a
// READ on each pair arrive at the lanes of their target QPs only.
TEST_F(SoftLanes, EachQpIsInTheLaneItsQpnNamesAndItsPacketsArriveThere) {
  Side a, b;
  ASSERT_EQ(a.open(dev("ln0")), "");
  ASSERT_EQ(b.open(dev("ln1")), "");
  for (int i = 0; i < 3; ++i) {
    ASSERT_NE(a.add_qp(IBV_QPT_RC), nullptr) << strerror(errno);
    ASSERT_NE(b.add_qp(IBV_QPT_RC), nullptr) << strerror(errno);
  }
  ASSERT_EQ(a.hub()->lanes(), 3u);
  std::set<size_t> used_a, used_b;
  for (int i = 0; i < 3; ++i) {
    for (ibv_qp* q : {a.qps[i], b.qps[i]}) {
      EXPECT_EQ(lane_of_qpn(q), lane_index(q)) << std::hex << q->qp_num;
      EXPECT_GT(q->qp_num, 1u);
    }
    used_a.insert(lane_index(a.qps[i]));
    used_b.insert(lane_index(b.qps[i]));
    ASSERT_EQ(connect_pair(a.qps[i], b.qps[i]), "");
  }
  EXPECT_EQ(used_a.size(), 3u);  // one QP per lane: the least busy lane takes the next QP
  EXPECT_EQ(used_b.size(), 3u);

  constexpr uint32_t kLen = 64 << 10;  // 64 packets at path MTU 1024
  for (int i = 0; i < 3; ++i) {
    const size_t off = size_t(i) * 2 * kLen;
    for (uint32_t j = 0; j < kLen; ++j) a.buf[off + j] = uint8_t(j * 7 + i);
    auto before_a = lane_rx(a.hub()), before_b = lane_rx(b.hub());
    ibv_wc wc = rdma(a, a.qps[i], b, IBV_WR_RDMA_WRITE, off, kLen, 100 + i);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.qp_num, a.qps[i]->qp_num);
    EXPECT_EQ(memcmp(a.buf.data() + off, b.buf.data() + off, kLen), 0);
    for (uint32_t j = 0; j < kLen; ++j) b.buf[off + kLen + j] = uint8_t(j * 3 + i);
    wc = rdma(a, a.qps[i], b, IBV_WR_RDMA_READ, off + kLen, kLen, 200 + i);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(memcmp(a.buf.data() + off + kLen, b.buf.data() + off + kLen, kLen), 0);
    auto after_a = lane_rx(a.hub()), after_b = lane_rx(b.hub());
    for (size_t l = 0; l < 3; ++l) {
      // b: the WRITE's 64 packets and the READ request; a: ACKs and the 64 READ responses.
      if (l == lane_index(b.qps[i]))
        EXPECT_GE(after_b[l] - before_b[l], 65u) << "lane " << l;
      else
        EXPECT_EQ(after_b[l], before_b[l]) << "lane " << l << " of b received packets of another lane's QP";
      if (l == lane_index(a.qps[i]))
        EXPECT_GE(after_a[l] - before_a[l], 65u) << "lane " << l;
      else
        EXPECT_EQ(after_a[l], before_a[l]) << "lane " << l << " of a received packets of another lane's QP";
    }
  }
  // The counter file holds the device's totals: the sum over its lanes.
  auto cb = melon::test::read_counters(stats_dir, "ln1");
  uint64_t sum = 0;
  for (uint64_t v : lane_rx(b.hub())) sum += v;
  EXPECT_EQ(cb["lanes"], 3u);
  EXPECT_EQ(cb["rx_packets"], sum);
  EXPECT_GE(sum, 3 * 65u);
  EXPECT_EQ(cb["rx_lane_handovers"], 0u);  // one QP at a time: nothing merged across QPs
  EXPECT_EQ(cb["rx_engine_dropped"], 0u);

  const std::string out = melonctl_stat();
  EXPECT_NE(out.find(" lanes 3 "), std::string::npos) << out;
  EXPECT_NE(out.find(" rx_packets " + std::to_string(sum) + " "), std::string::npos) << out;
}

// An SRQ lives in one lane, so its QPs are created there; the sender's QPs are in two lanes and
// complete on one CQ, all at the same time.
TEST_F(SoftLanes, QpsOnAnSrqShareItsLaneAndOneCqCollectsFromSeveralLanes) {
  Side a, b;
  ASSERT_EQ(a.open(dev("ln0")), "");
  ASSERT_EQ(b.open(dev("ln1")), "");
  ASSERT_NE(b.add_qp(IBV_QPT_RC), nullptr);  // lane 0 busy: the SRQ goes elsewhere
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 64;
  sa.attr.max_sge = 1;
  b.srq = ibv_create_srq(b.pd, &sa);
  ASSERT_NE(b.srq, nullptr) << strerror(errno);
  const size_t srq_lane = melon::soft::SoftSrq::from(b.srq)->lane;
  EXPECT_NE(srq_lane, lane_index(b.qps[0]));
  ibv_qp* r1 = b.add_qp(IBV_QPT_RC, true);
  ibv_qp* r2 = b.add_qp(IBV_QPT_RC, true);
  ASSERT_TRUE(r1 && r2) << strerror(errno);
  EXPECT_EQ(lane_index(r1), srq_lane);
  EXPECT_EQ(lane_index(r2), srq_lane);
  EXPECT_EQ(lane_of_qpn(r1), srq_lane);
  EXPECT_EQ(lane_of_qpn(r2), srq_lane);
  ibv_qp* s1 = a.add_qp(IBV_QPT_RC);
  ibv_qp* s2 = a.add_qp(IBV_QPT_RC);
  ASSERT_TRUE(s1 && s2);
  EXPECT_NE(lane_index(s1), lane_index(s2));
  ASSERT_EQ(connect_pair(s1, r1), "");
  ASSERT_EQ(connect_pair(s2, r2), "");

  constexpr int kMsgs = 16;
  constexpr uint32_t kLen = 4096;
  for (int i = 0; i < 2 * kMsgs; ++i) {
    ibv_sge sge{uint64_t(uintptr_t(b.buf.data() + size_t(i) * kLen)), kLen, b.mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = 1000 + i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ASSERT_EQ(ibv_post_srq_recv(b.srq, &wr, &bad), 0);
  }
  // Both senders post all their SENDs before any completion is reaped: the two lanes run at once.
  for (int i = 0; i < kMsgs; ++i)
    for (int k = 0; k < 2; ++k) {
      const size_t off = size_t(2 * i + k) * kLen;
      memset(a.buf.data() + off, 0x40 + 2 * i + k, kLen);
      ibv_sge sge{uint64_t(uintptr_t(a.buf.data() + off)), kLen, a.mr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.wr_id = uint64_t(k) << 32 | uint64_t(i);
      wr.opcode = IBV_WR_SEND;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      ASSERT_EQ(ibv_post_send(k ? s2 : s1, &wr, &bad), 0);
    }
  int sent[2] = {0, 0};
  for (int i = 0; i < 2 * kMsgs; ++i) {
    ibv_wc wc = next_wc(a.cq);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    const int k = int(wc.wr_id >> 32);
    EXPECT_EQ(wc.qp_num, (k ? s2 : s1)->qp_num);
    EXPECT_EQ(int(wc.wr_id & 0xffffffff), sent[k]++);  // in order per QP
  }
  std::set<uint8_t> seen;
  int from[2] = {0, 0};
  for (int i = 0; i < 2 * kMsgs; ++i) {
    ibv_wc wc = next_wc(b.cq);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    ASSERT_EQ(wc.opcode, IBV_WC_RECV);
    ASSERT_EQ(wc.byte_len, kLen);
    from[wc.qp_num == r2->qp_num]++;
    const uint8_t* got = b.buf.data() + size_t(wc.wr_id - 1000) * kLen;
    seen.insert(got[0]);
    EXPECT_EQ(got[kLen - 1], got[0]);
  }
  EXPECT_EQ(from[0], kMsgs);
  EXPECT_EQ(from[1], kMsgs);
  EXPECT_EQ(seen.size(), size_t(2 * kMsgs));  // every message landed once
}

// A lane whose QP table is full still draws QPNs of its own: the engine's last resort (a random
// QPN on the first free slot, once random draws keep hitting used slots) keeps the bits that name
// the lane. 4095 QPs on one SRQ fill its lane's table (slot 1 is kept for QP1, the GSI); every
// QPN steers to that lane.
TEST_F(SoftLanes, AFullLaneStillDrawsQpnsOfItsOwn) {
  Side b;
  ASSERT_EQ(b.open(dev("ln1")), "");
  ASSERT_NE(b.add_qp(IBV_QPT_UD), nullptr);  // lane 0 taken: the SRQ's lane has a non-zero index
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 1;
  sa.attr.max_sge = 1;
  b.srq = ibv_create_srq(b.pd, &sa);
  ASSERT_NE(b.srq, nullptr);
  const size_t lane = melon::soft::SoftSrq::from(b.srq)->lane;
  ASSERT_NE(lane, 0u);
  std::set<uint32_t> qpns;
  for (;;) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = b.cq;
    ia.srq = b.srq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_send_sge = 1;
    ibv_qp* qp = ibv_create_qp(b.pd, &ia);
    if (!qp) {
      EXPECT_EQ(errno, ENOMEM);  // the lane's engine holds rc::kMaxQp, one slot of them QP1's
      break;
    }
    b.qps.push_back(qp);
    ASSERT_EQ(lane_of_qpn(qp), lane) << std::hex << qp->qp_num << " after " << std::dec << qpns.size();
    ASSERT_TRUE(qpns.insert(qp->qp_num).second);
    ASSERT_LE(qpns.size(), size_t(melon::rc::kMaxQp));
  }
  EXPECT_EQ(qpns.size(), size_t(melon::rc::kMaxQp - 1));
}

// UD QPs in different lanes of one device: each receives a datagram sent to it through the verbs
// API, and a UDP GSO send holding one packet for each (as GRO would merge them) reaches the lane of
// the first, which hands the second over.
TEST_F(SoftLanes, UdInEveryLaneAndPacketsGroMergedAcrossLanesAreHandedOver) {
  Side b;
  ASSERT_EQ(b.open(dev("ln1")), "");
  melon::test::UdReceiver r[3];
  for (auto& x : r) ASSERT_EQ(x.open(b.ctx), "");
  std::set<size_t> lanes;
  for (auto& x : r) {
    lanes.insert(lane_index(x.qp));
    EXPECT_EQ(lane_of_qpn(x.qp), lane_index(x.qp));
  }
  EXPECT_EQ(lanes.size(), 3u);

  // Through the verbs API from ln0 (its own QP in some lane) to the receiver in each lane.
  {
    Side a;
    ASSERT_EQ(a.open(dev("ln0")), "");
    ibv_qp* ud = a.add_qp(IBV_QPT_UD);
    ASSERT_NE(ud, nullptr);
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qkey = melon::test::UdReceiver::kQkey;
    ASSERT_EQ(ibv_modify_qp(ud, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
    at.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(ibv_modify_qp(ud, &at, IBV_QP_STATE), 0);
    at.qp_state = IBV_QPS_RTS;
    at.sq_psn = 1;
    ASSERT_EQ(ibv_modify_qp(ud, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
    ibv_ah_attr ah{};
    ah.is_global = 1;
    ah.port_num = 1;
    memcpy(ah.grh.dgid.raw, kGidB, 16);
    ibv_ah* h = ibv_create_ah(a.pd, &ah);
    ASSERT_NE(h, nullptr);
    for (int i = 0; i < 3; ++i) {
      const std::string msg = "to lane " + std::to_string(lane_index(r[i].qp));
      memcpy(a.buf.data(), msg.data(), msg.size());
      ibv_sge sge{uint64_t(uintptr_t(a.buf.data())), uint32_t(msg.size()), a.mr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.opcode = IBV_WR_SEND;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.ud.ah = h;
      wr.wr.ud.remote_qpn = r[i].qp->qp_num;
      wr.wr.ud.remote_qkey = melon::test::UdReceiver::kQkey;
      ASSERT_EQ(ibv_post_send(ud, &wr, &bad), 0);
      EXPECT_EQ(next_wc(a.cq).status, IBV_WC_SUCCESS);
      ibv_wc wc = r[i].wait(5000);
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << i;
      EXPECT_EQ(wc.src_qp, ud->qp_num);
      EXPECT_EQ(r[i].payload(msg.size()), msg);
    }
    ibv_destroy_ah(h);
  }

  // Two more receives, then one GSO send from a plain socket: a segment for r[0], then one for r[1].
  melon::test::UdReceiver g0, g1;
  ASSERT_EQ(g0.open(b.ctx), "");
  ASSERT_EQ(g1.open(b.ctx), "");
  ASSERT_NE(lane_index(g0.qp), lane_index(g1.qp));
  int off = 0;
  int s = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(s, 0);
  if (setsockopt(s, SOL_UDP, UDP_SEGMENT, &off, sizeof off) != 0) {
    close(s);
    GTEST_SKIP() << "this kernel has no UDP_SEGMENT";
  }
  const int pmtu = IP_PMTUDISC_DO;  // DF: the segments get IPv4 identifications 0 and 1
  ASSERT_EQ(setsockopt(s, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu), 0);
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  from.sin_port = htons(49153);
  inet_pton(AF_INET, "127.0.11.2", &from.sin_addr);
  inet_pton(AF_INET, "127.0.11.3", &to.sin_addr);
  to.sin_port = htons(4791);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&from), sizeof from), 0) << strerror(errno);
  std::vector<uint8_t> both;
  size_t seg = 0;
  int id = 0;
  for (ibv_qp* q : {g0.qp, g1.qp}) {
    const std::string payload = "merged " + std::to_string(id);
    auto d = melon::test::ud_send_datagram(false, kGidA, kGidB, 49153, q->qp_num, melon::test::UdReceiver::kQkey, 0x99,
                                           payload);
    std::vector<uint8_t> roce(d.begin() + 8, d.end());  // the socket writes the UDP header
    melon::roce::IpUdp h;
    h.v6 = false;
    memcpy(h.src, kGidA, 16);
    memcpy(h.dst, kGidB, 16);
    h.sport = 49153;
    h.dport = melon::roce::kRoceV2Port;
    h.ip_id = uint16_t(id);  // the ICRC covers the identification the kernel gives this segment
    melon::roce::store_icrc(roce.data() + roce.size() - 4,
                            melon::roce::icrc_for_udp_payload(h, roce.data(), roce.size() - 4));
    seg = roce.size();
    both.insert(both.end(), roce.begin(), roce.end());
    ++id;
  }
  const uint64_t handed_before = b.hub()->lane(lane_index(g0.qp)).lane_handed_over();
  char ctrl[CMSG_SPACE(sizeof(uint16_t))] = {};
  iovec iov{both.data(), both.size()};
  msghdr m{};
  m.msg_name = &to;
  m.msg_namelen = sizeof to;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  const uint16_t seg16 = uint16_t(seg);
  memcpy(CMSG_DATA(c), &seg16, sizeof seg16);
  ASSERT_EQ(sendmsg(s, &m, 0), ssize_t(both.size())) << strerror(errno);
  close(s);
  ibv_wc w0 = g0.wait(5000), w1 = g1.wait(5000);
  EXPECT_EQ(w0.status, IBV_WC_SUCCESS);
  EXPECT_EQ(w1.status, IBV_WC_SUCCESS);
  EXPECT_EQ(g0.payload(8), "merged 0");
  EXPECT_EQ(g1.payload(8), "merged 1");
  auto cb = melon::test::read_counters(stats_dir, "ln1");
  EXPECT_EQ(cb["rx_bad_icrc"], 0u);
  // On loopback the kernel hands a GSO send to a UDP_GRO socket whole: one buffer, steered by its
  // first packet (g0's lane), which passes g1's packet on.
  if (cb["rx_gro_buffers"] > 0) {
    EXPECT_EQ(b.hub()->lane(lane_index(g0.qp)).lane_handed_over() - handed_before, 1u);
    EXPECT_EQ(cb["rx_lane_handovers"], 1u);
  } else {
    ADD_FAILURE() << "the GSO send was not delivered as one GRO buffer: the hand-over was not exercised";
  }
}

// The address is shared (addr_registry.h): a second device on it in this process and a second
// process both get QPs there, with QPNs of their own buckets; a plain socket without SO_REUSEPORT
// still cannot bind it.
TEST_F(SoftLanes, ASecondDeviceAndASecondProcessShareTheAddress) {
  Side a;
  ASSERT_EQ(a.open(dev("ln0")), "");
  ibv_qp* qa = a.add_qp(IBV_QPT_UD);
  ASSERT_NE(qa, nullptr);
  ASSERT_EQ(a.hub()->lanes(), 3u);
  ASSERT_TRUE(a.hub()->shared());
  {
    Side dup;
    ASSERT_EQ(dup.open(dev("ln0b")), "");
    ibv_qp* qd = dup.add_qp(IBV_QPT_UD);
    ASSERT_NE(qd, nullptr) << strerror(errno);
    EXPECT_NE(melon::soft::bucket_of_qpn(qd->qp_num), melon::soft::bucket_of_qpn(qa->qp_num));
    auto v = a.hub()->registries()[0]->view();
    EXPECT_EQ(v.sockets, 6u);  // three lanes each
    EXPECT_EQ(v.unknown, 0u);  // every index known from the joins, no probe needed
  }
  EXPECT_EQ(a.hub()->registries()[0]->view().sockets, 3u);  // the second device left
  // Another process: this test binary, running only the child case below.
  std::string cmd = "MELON_LANES_CHILD=1 /proc/" + std::to_string(getpid()) +
                    "/exe --gtest_also_run_disabled_tests --gtest_filter=SoftLanes.DISABLED_ChildSharesTheAddress "
                    "> /dev/null 2>&1";
  int st = system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "the second process could not use the address";
  int s = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(4791);
  inet_pton(AF_INET, "127.0.11.2", &sa.sin_addr);
  EXPECT_NE(bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  EXPECT_EQ(errno, EADDRINUSE);
  close(s);
}

// Run by the test above in a process of its own.
TEST_F(SoftLanes, DISABLED_ChildSharesTheAddress) {
  if (!getenv("MELON_LANES_CHILD")) GTEST_SKIP() << "runs as the second process of ASecondDevice...";
  Side a;
  ASSERT_EQ(a.open(dev("ln0")), "");
  ASSERT_NE(a.add_qp(IBV_QPT_UD), nullptr) << strerror(errno);
}

// Where the steering program cannot be attached, the device runs one lane (said with
// MELON_SOFT_DEBUG=1, and shown as lanes 1) and works.
TEST_F(SoftLanes, OneLaneWhereTheSteeringProgramCannotBeAttached) {
  melon::test::sockopt_fail(SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, EINVAL);
  setenv("MELON_SOFT_DEBUG", "1", 1);
  Side a, b;
  ASSERT_EQ(a.open(dev("ln0")), "");
  ASSERT_EQ(b.open(dev("ln1")), "");
  testing::internal::CaptureStderr();
  ibv_qp* qa = a.add_qp(IBV_QPT_RC);
  std::string out = testing::internal::GetCapturedStderr();
  unsetenv("MELON_SOFT_DEBUG");
  ASSERT_NE(qa, nullptr) << strerror(errno);
  EXPECT_NE(out.find("ln0: one lane instead of 3, addresses not shared with other processes: "
                     "setsockopt(SO_ATTACH_REUSEPORT_CBPF)"),
            std::string::npos)
      << out;
  ibv_qp* qb = b.add_qp(IBV_QPT_RC);
  ASSERT_NE(qb, nullptr);
  EXPECT_EQ(a.hub()->lanes(), 1u);
  EXPECT_EQ(melon::test::read_counters(stats_dir, "ln0")["lanes"], 1u);
  ASSERT_EQ(connect_pair(qa, qb), "");
  for (uint32_t j = 0; j < 8192; ++j) a.buf[j] = uint8_t(j);
  ibv_wc wc = rdma(a, qa, b, IBV_WR_RDMA_WRITE, 0, 8192, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(a.buf.data(), b.buf.data(), 8192), 0);
}

// Without steering the address is the device's alone, as before sharing: a second device on it
// fails at bind.
TEST_F(SoftLanes, WithoutSteeringASecondDeviceGetsEaddrinuse) {
  melon::test::sockopt_fail(SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, EINVAL);
  Side a, dup;
  ASSERT_EQ(a.open(dev("ln0")), "");
  ASSERT_NE(a.add_qp(IBV_QPT_UD), nullptr);
  EXPECT_FALSE(a.hub()->shared());
  ASSERT_EQ(dup.open(dev("ln0b")), "");
  testing::internal::CaptureStderr();
  errno = 0;
  EXPECT_EQ(dup.add_qp(IBV_QPT_UD), nullptr);
  const int err = errno;
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, EADDRINUSE) << strerror(err);
  EXPECT_NE(out.find("ln0b: cannot start the RoCEv2 transport: bind(127.0.11.2 port 4791): Address already in use"),
            std::string::npos)
      << out;
}

// MELON_SOFT_LANES=1: one transport, still in the address's group (so other processes can share it).
TEST_F(SoftLanes, OneLaneJoinsTheGroupToo) {
  setenv("MELON_SOFT_LANES", "1", 1);
  Side a, b, dup;
  ASSERT_EQ(a.open(dev("ln0")), "");
  ASSERT_EQ(b.open(dev("ln1")), "");
  ibv_qp* qa = a.add_qp(IBV_QPT_RC);
  ibv_qp* qb = b.add_qp(IBV_QPT_RC);
  ASSERT_TRUE(qa && qb);
  EXPECT_EQ(a.hub()->lanes(), 1u);
  EXPECT_TRUE(melon::test::sockopt_seen(SOL_SOCKET, SO_REUSEPORT));
  EXPECT_TRUE(melon::test::sockopt_seen(SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF));
  ASSERT_EQ(connect_pair(qa, qb), "");
  for (uint32_t j = 0; j < 8192; ++j) a.buf[j] = uint8_t(j * 5);
  EXPECT_EQ(rdma(a, qa, b, IBV_WR_RDMA_WRITE, 0, 8192, 1).status, IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(a.buf.data(), b.buf.data(), 8192), 0);
  EXPECT_EQ(melon::test::read_counters(stats_dir, "ln1")["lanes"], 1u);
  ASSERT_EQ(dup.open(dev("ln0b")), "");
  EXPECT_NE(dup.add_qp(IBV_QPT_UD), nullptr) << strerror(errno);
}

}  // namespace
