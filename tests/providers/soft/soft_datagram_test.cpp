// One RoCE packet per UDP datagram, whatever the soft provider sends (issue 19).
//
// RoCEv2 carries one BTH per UDP datagram and ends it with the ICRC, so a receiver checks the ICRC
// over the whole datagram. This executable defines sendmmsg(): every message the provider hands the
// kernel is cut into the datagrams the kernel forms from it (the UDP_SEGMENT rule: with a segment
// size s and more than s bytes, datagrams of s bytes, the last one shorter or equal; else one
// datagram), and each must be exactly one RoCE packet:
//   - its length agrees with its own headers (IBA 9.2-9.4: BTH, the extended headers its opcode
//     carries, pad count, ICRC) and the path MTU (IBA 9.7.7: FIRST and MIDDLE carry exactly one MTU,
//     LAST and ONLY at most one; requests for data and ACKs carry none);
//   - its ICRC is right for the IP and UDP headers the kernel writes for it (IBA Annex A17): from the
//     socket's address and port, DF set, IPv4 identification i for the i-th datagram of a send.
// The judge is tests/common/datagram_oracle.h (its CRC is zlib's, not src/roce's).
// Every datagram also goes to a pcap file that tshark's InfiniBand dissector must read without a
// malformed packet.
//
// Workloads, each over IPv4 and IPv6 and with UDP GSO on and off (MELON_SOFT_GSO=0): an RC
// ping-pong of busy-polling threads with random sizes (where held ACKs meet the next SEND), a random
// mix of RC WRITE, READ, atomics and SEND with several outstanding, UC SEND and WRITE, UD SEND. The
// process runs in a network namespace of its own (root), with fd19::2 and fd19::3 on its loopback.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/datagram_oracle.h"
#include "common/tshark_payloads.h"
#include "providers/soft/soft_fixture.h"
#include "providers/soft/soft_inject.h"

namespace {

using melon::test::Datagram;

std::mutex g_mu;
std::vector<Datagram> g_seen;  // guarded by g_mu
std::atomic<uint64_t> g_gso_sends{0};

void record(int fd, const msghdr& h) {
  std::vector<Datagram> ds = melon::test::kernel_datagrams(fd, h);
  if (ds.size() > 1) g_gso_sends++;
  std::lock_guard<std::mutex> g(g_mu);
  for (Datagram& d : ds)
    if (g_seen.size() < 400000) g_seen.push_back(std::move(d));
}

}  // namespace

extern "C" int sendmmsg(int fd, struct mmsghdr* v, unsigned n, int flags) {
  static auto real = reinterpret_cast<melon::test::SendmmsgFn>(dlsym(RTLD_NEXT, "sendmmsg"));
  return melon::test::send_snapshot(real, fd, v, n, flags, record);  // judged: what the kernel sent
}

namespace {

// The namespace, made once for the process: "" or why it could not be.
const std::string& private_network() {
  static const std::string why = []() -> std::string {
    if (geteuid() != 0) return "needs root (a network namespace of its own)";
    if (unshare(CLONE_NEWNET) != 0) return std::string("unshare(CLONE_NEWNET): ") + strerror(errno);
    if (system("ip link set lo up && ip -6 addr add fd19::2/128 dev lo nodad && "
               "ip -6 addr add fd19::3/128 dev lo nodad") != 0)
      return "cannot set up loopback in the namespace";
    return "";
  }();
  return why;
}

using Clock = std::chrono::steady_clock;
constexpr int kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint32_t kMtu = 1024;
constexpr size_t kBuf = 1 << 18;  // half for the data, half for 32 receives of 4 MTUs

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  ibv_ah* ah = nullptr;
  ibv_gid gid{};
  std::vector<uint8_t> buf = std::vector<uint8_t>(kBuf);
};

struct Mode {
  bool v6, gso;
};

class SoftDatagram : public melon::test::SoftDeviceTest, public ::testing::WithParamInterface<Mode> {
 protected:
  void SetUp() override {
    if (!private_network().empty()) GTEST_SKIP() << private_network();
    {
      std::lock_guard<std::mutex> g(g_mu);
      g_seen.clear();
    }
    g_gso_sends = 0;
    if (GetParam().gso)
      unsetenv("MELON_SOFT_GSO");
    else
      setenv("MELON_SOFT_GSO", "0", 1);
    setenv("MELON_SOFT_BUSY_NS", "2000000", 1);  // busy-polling threads take the sockets (the join)
    use_devices(GetParam().v6 ? "dg0=fd19::2,dg1=fd19::3" : "dg0=127.0.19.2,dg1=127.0.19.3");
  }
  void TearDown() override {
    for (Side* s : {&a, &b}) {
      if (s->ah) ibv_destroy_ah(s->ah);
      if (s->qp) ibv_destroy_qp(s->qp);
      if (s->mr) ibv_dereg_mr(s->mr);
      if (s->cq) ibv_destroy_cq(s->cq);
      if (s->pd) ibv_dealloc_pd(s->pd);
      if (s->ctx) ibv_close_device(s->ctx);
    }
    unsetenv("MELON_SOFT_GSO");
    unsetenv("MELON_SOFT_BUSY_NS");
    SoftDeviceTest::TearDown();
  }

  void open(ibv_qp_type type) {
    for (Side* s : {&a, &b}) {
      const char* want = s == &a ? "dg0" : "dg1";
      s->ctx = ibv_open_device(dev(want));
      ASSERT_NE(s->ctx, nullptr) << want;
      ASSERT_EQ(ibv_query_gid(s->ctx, 1, 0, &s->gid), 0);
      s->pd = ibv_alloc_pd(s->ctx);
      s->cq = ibv_create_cq(s->ctx, 256, nullptr, nullptr, 0);
      s->mr = ibv_reg_mr(s->pd, s->buf.data(), s->buf.size(), kAccess);
      ASSERT_TRUE(s->pd && s->cq && s->mr);
      ibv_qp_init_attr ia{};
      ia.send_cq = ia.recv_cq = s->cq;
      ia.qp_type = type;
      ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
      ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
      s->qp = ibv_create_qp(s->pd, &ia);
      ASSERT_NE(s->qp, nullptr) << strerror(errno);
    }
    for (Side* s : {&a, &b}) bring_up(*s, s == &a ? b : a, type);
  }

  static ibv_ah_attr ah_to(const Side& peer) {
    ibv_ah_attr ah{};
    ah.is_global = 1;
    ah.port_num = 1;
    ah.grh.dgid = peer.gid;
    ah.grh.hop_limit = 64;
    return ah;
  }

  static void bring_up(Side& s, const Side& peer, ibv_qp_type type) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (type == IBV_QPT_UD) {
      at.qkey = 0x11111111;
      mask |= IBV_QP_QKEY;
    } else {
      at.qp_access_flags = type == IBV_QPT_RC ? kAccess : IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
      mask |= IBV_QP_ACCESS_FLAGS;
    }
    ASSERT_EQ(ibv_modify_qp(s.qp, &at, mask), 0);
    at.qp_state = IBV_QPS_RTR;
    mask = IBV_QP_STATE;
    if (type != IBV_QPT_UD) {
      at.path_mtu = IBV_MTU_1024;
      at.dest_qp_num = peer.qp->qp_num;
      at.ah_attr = ah_to(peer);
      mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (type == IBV_QPT_RC) {
        at.max_dest_rd_atomic = 4;
        at.min_rnr_timer = 1;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
    }
    ASSERT_EQ(ibv_modify_qp(s.qp, &at, mask), 0);
    at.qp_state = IBV_QPS_RTS;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (type == IBV_QPT_RC) {
      at.timeout = 18;  // 1 s: a loaded machine must not make retransmissions of its own
      at.retry_cnt = 7;
      at.rnr_retry = 7;
      at.max_rd_atomic = 4;
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    ASSERT_EQ(ibv_modify_qp(s.qp, &at, mask), 0);
    if (type == IBV_QPT_UD) {
      ibv_ah_attr ah = ah_to(peer);
      s.ah = ibv_create_ah(s.pd, &ah);
      ASSERT_NE(s.ah, nullptr) << strerror(errno);
    }
  }

  static int post_recv(Side& s, size_t off, uint32_t len, uint64_t id) {
    ibv_sge sge{uint64_t(uintptr_t(s.buf.data() + off)), len, s.mr->lkey};
    ibv_recv_wr r{}, *bad = nullptr;
    r.wr_id = id;
    r.sg_list = &sge;
    r.num_sge = 1;
    return ibv_post_recv(s.qp, &r, &bad);
  }

  // One work request from s to peer: `len` bytes at `off` of both buffers.
  static int post(Side& s, const Side& peer, ibv_wr_opcode op, size_t off, uint32_t len, uint64_t id) {
    ibv_sge sge{uint64_t(uintptr_t(s.buf.data() + off)), len, s.mr->lkey};
    ibv_send_wr w{}, *bad = nullptr;
    w.wr_id = id;
    w.opcode = op;
    w.sg_list = len ? &sge : nullptr;
    w.num_sge = len ? 1 : 0;
    w.send_flags = IBV_SEND_SIGNALED;
    if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      w.wr.atomic.remote_addr = uint64_t(uintptr_t(peer.buf.data() + (off & ~size_t(7))));
      w.wr.atomic.rkey = peer.mr->rkey;
      w.wr.atomic.compare_add = 1;
      w.wr.atomic.swap = 2;
    } else if (op == IBV_WR_SEND && s.ah) {
      w.wr.ud.ah = s.ah;
      w.wr.ud.remote_qpn = peer.qp->qp_num;
      w.wr.ud.remote_qkey = 0x11111111;
    } else {
      w.wr.rdma.remote_addr = uint64_t(uintptr_t(peer.buf.data() + off));
      w.wr.rdma.rkey = peer.mr->rkey;
    }
    return ibv_post_send(s.qp, &w, &bad);
  }

  static bool spin_for(ibv_cq* cq, ibv_wc* wc, int ms) {
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end)
      if (ibv_poll_cq(cq, 1, wc) == 1) return true;
    return false;
  }

  // Checks every datagram recorded so far; then tshark must dissect the lot as RoCE without a
  // malformed packet. `min_gso`: GSO sends the workload must have made (with GSO on).
  void check_all(const char* what) {
    std::vector<Datagram> seen;
    {
      std::lock_guard<std::mutex> g(g_mu);
      seen.swap(g_seen);
    }
    ASSERT_FALSE(seen.empty()) << what << ": nothing sent";
    size_t bad = 0;
    for (const Datagram& d : seen) {
      const std::string why = melon::test::check_datagram(d, kMtu);
      if (!why.empty() && bad++ < 5)
        ADD_FAILURE() << what << ": a datagram of a send with UDP_SEGMENT " << d.seg << ": " << why;
    }
    EXPECT_EQ(bad, 0u) << what << ": of " << seen.size() << " datagrams";
    if (GetParam().gso) {
      EXPECT_GT(g_gso_sends.load(), 0u) << what << ": no GSO send made: the test did not test them";
    } else {
      EXPECT_EQ(g_gso_sends.load(), 0u) << what << ": a GSO send with MELON_SOFT_GSO=0";
    }
    const std::string pcap = getenv("KEEP_PCAP") ? std::string(getenv("KEEP_PCAP")) : stats_dir + "/sent.pcap";
    melon::test::write_pcap(pcap, seen);
    const std::string cmd = "tshark -n -r '" + pcap + "' -d udp.port==4791,infiniband" +
                            melon::test::tshark_plain_payloads() +
                            " -T fields -e frame.number "
                            "-e infiniband.bth.opcode -e _ws.malformed 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char line[512];
    size_t rows = 0, malformed = 0, no_bth = 0;
    while (fgets(line, sizeof line, p)) {
      ++rows;
      std::vector<std::string> cols;
      std::string cur;
      for (const char* c = line; *c && *c != '\n'; ++c) {
        if (*c == '\t') {
          cols.push_back(cur);
          cur.clear();
        } else {
          cur += *c;
        }
      }
      cols.push_back(cur);
      if (cols.size() < 2 || cols[1].empty()) ++no_bth;
      if (cols.size() >= 3 && !cols[2].empty()) ++malformed;
    }
    ASSERT_EQ(pclose(p), 0) << cmd;
    EXPECT_EQ(rows, seen.size()) << what << ": tshark read another number of frames";
    EXPECT_EQ(no_bth, 0u) << what << ": frames tshark does not see a BTH in";
    EXPECT_EQ(malformed, 0u) << what << ": frames tshark calls malformed";
  }

  std::mt19937 rng{std::random_device{}()};
  uint32_t size_upto(uint32_t max) { return std::uniform_int_distribution<uint32_t>(1, max)(rng); }

  Side a, b;
};

// Busy-polling ping-pong: b answers each SEND of a with a SEND; both spin on their CQs, so a
// receive holds its ACK for the next post (udp_transport.h, "busy-poll lease").
TEST_P(SoftDatagram, RcPingPongOfRandomSizes) {
  open(IBV_QPT_RC);
  constexpr int kRounds = 80;
  std::vector<uint32_t> sizes(2 * kRounds);
  for (uint32_t& s : sizes) s = rng() % 4 ? size_upto(64) : size_upto(3 * kMtu + 100);  // mostly small
  const size_t rx = kBuf / 2;
  ASSERT_EQ(post_recv(a, rx, 4 * kMtu, 0), 0);
  ASSERT_EQ(post_recv(b, rx, 4 * kMtu, 0), 0);
  // One round of a side: its SEND's completion and the peer's SEND, in either order; then a receive.
  auto finish = [&](Side& s) {
    bool sent = false, got = false;
    while (!sent || !got) {
      ibv_wc wc{};
      if (!spin_for(s.cq, &wc, 5000)) return false;
      if (wc.status != IBV_WC_SUCCESS) {
        ADD_FAILURE() << ibv_wc_status_str(wc.status) << " wr " << wc.wr_id;
        return false;
      }
      if (wc.opcode == IBV_WC_SEND) {
        sent = true;
      } else {
        if (got || post_recv(s, rx, 4 * kMtu, 0)) return false;
        got = true;
      }
    }
    return true;
  };
  std::atomic<bool> b_ok{true};
  std::thread pong([&] {  // b: each RECV is answered with a SEND; the SENDs complete in between
    int recvs = 0, sends = 0;
    while (b_ok && (recvs < kRounds || sends < recvs)) {
      ibv_wc wc{};
      if (!spin_for(b.cq, &wc, 5000) || wc.status != IBV_WC_SUCCESS) {
        b_ok = false;
      } else if (wc.opcode == IBV_WC_SEND) {
        ++sends;
      } else if (post_recv(b, rx, 4 * kMtu, 0) || post(b, a, IBV_WR_SEND, 0, sizes[2 * recvs + 1], recvs)) {
        b_ok = false;
      } else {
        ++recvs;
      }
    }
  });
  bool a_ok = true;
  for (int i = 0; i < kRounds && a_ok && b_ok; ++i)
    a_ok = post(a, b, IBV_WR_SEND, 0, sizes[2 * i], i) == 0 && finish(a);
  pong.join();
  ASSERT_TRUE(a_ok && b_ok) << "the ping-pong stopped";
  check_all("RC ping-pong");
}

// A random mix of RC requests from a, up to 8 outstanding: WRITE and READ of 1 B to 4 MTUs,
// atomics, SENDs (b spins to re-post its receives), so ACKs, READ responses and atomic ACKs meet
// requests in one batch.
TEST_P(SoftDatagram, RcRandomMixWithSeveralOutstanding) {
  open(IBV_QPT_RC);
  std::atomic<bool> stop{false};
  for (int i = 0; i < 32; ++i) ASSERT_EQ(post_recv(b, kBuf / 2 + size_t(i) * 4 * kMtu, 4 * kMtu, i), 0);
  std::thread target([&] {
    ibv_wc wc{};
    while (!stop)
      if (ibv_poll_cq(b.cq, 1, &wc) == 1 && (wc.opcode & IBV_WC_RECV))
        post_recv(b, kBuf / 2 + wc.wr_id * 4 * kMtu, 4 * kMtu, wc.wr_id);
  });
  const ibv_wr_opcode ops[] = {IBV_WR_RDMA_WRITE,         IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
                               IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_SEND,      IBV_WR_RDMA_WRITE_WITH_IMM};
  int outstanding = 0, done = 0, failed = 0;
  constexpr int kOps = 150;
  for (int i = 0; i < kOps || outstanding;) {
    while (i < kOps && outstanding < 8) {
      const ibv_wr_opcode op = ops[rng() % std::size(ops)];
      const bool atomic = op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP;
      const uint32_t len = atomic ? 8 : size_upto(4 * kMtu + 17);
      const size_t off = atomic ? 8 * (rng() % 64) : rng() % (kBuf / 2 - len);
      if (op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_SEND) {
        ASSERT_EQ(post(a, b, op, off, std::min<uint32_t>(len, 4 * kMtu), i), 0);
      } else {
        ASSERT_EQ(post(a, b, op, off, len, i), 0);
      }
      ++i, ++outstanding;
    }
    ibv_wc wc{};
    if (!spin_for(a.cq, &wc, 5000)) break;
    --outstanding, ++done;
    if (wc.status != IBV_WC_SUCCESS && failed++ == 0)
      ADD_FAILURE() << "op " << wc.wr_id << ": " << ibv_wc_status_str(wc.status) << " opcode " << wc.opcode;
  }
  stop = true;
  target.join();
  EXPECT_EQ(done, kOps);
  EXPECT_EQ(failed, 0);
  check_all("RC mix");
}

// UC SENDs and WRITEs of 1 B to 3 MTUs; the receiver keeps receives posted.
TEST_P(SoftDatagram, UcSendsAndWrites) {
  open(IBV_QPT_UC);
  for (int i = 0; i < 32; ++i) ASSERT_EQ(post_recv(b, kBuf / 2 + size_t(i) * 4 * kMtu, 4 * kMtu, i), 0);
  int got = 0;
  for (int i = 0; i < 100; ++i) {
    const ibv_wr_opcode op = i % 2 ? IBV_WR_RDMA_WRITE : IBV_WR_SEND;
    ASSERT_EQ(post(a, b, op, 0, size_upto(3 * kMtu + 9), i), 0);
    ibv_wc wc{};
    ASSERT_TRUE(spin_for(a.cq, &wc, 5000));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    if (op == IBV_WR_SEND && spin_for(b.cq, &wc, 2000) && wc.status == IBV_WC_SUCCESS) {
      ++got;
      ASSERT_EQ(post_recv(b, kBuf / 2 + wc.wr_id * 4 * kMtu, 4 * kMtu, wc.wr_id), 0);
    }
  }
  EXPECT_GT(got, 0);
  check_all("UC");
}

// UD SENDs of 1 B to one MTU, eight posted at once: of one size (a GSO run) or of random sizes.
TEST_P(SoftDatagram, UdSends) {
  open(IBV_QPT_UD);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(post_recv(b, kBuf / 2 + size_t(i) * 2 * kMtu, kMtu + 40, i), 0);
  for (int burst = 0; burst < 8; ++burst) {
    // One ibv_post_send of eight WRs (one batch: equal sizes make one GSO send), or eight posts.
    const uint32_t same = burst % 2 ? size_upto(kMtu) : 0;
    ibv_sge sge[8];
    ibv_send_wr w[8]{}, *bad = nullptr;
    for (int i = 0; i < 8; ++i) {
      sge[i] = {uint64_t(uintptr_t(a.buf.data())), same ? same : size_upto(kMtu), a.mr->lkey};
      w[i].wr_id = uint64_t(i);
      w[i].opcode = IBV_WR_SEND;
      w[i].sg_list = &sge[i];
      w[i].num_sge = 1;
      w[i].send_flags = IBV_SEND_SIGNALED;
      w[i].wr.ud = {a.ah, b.qp->qp_num, 0x11111111};
      w[i].next = same && i < 7 ? &w[i + 1] : nullptr;
    }
    if (same) {
      ASSERT_EQ(ibv_post_send(a.qp, &w[0], &bad), 0);
    } else {
      for (int i = 0; i < 8; ++i) ASSERT_EQ(ibv_post_send(a.qp, &w[i], &bad), 0);
    }
    for (int i = 0; i < 8; ++i) {
      ibv_wc wc{};
      ASSERT_TRUE(spin_for(a.cq, &wc, 5000));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    }
  }
  check_all("UD");
}

INSTANTIATE_TEST_SUITE_P(Modes, SoftDatagram,
                         ::testing::Values(Mode{false, true}, Mode{false, false}, Mode{true, true}, Mode{true, false}),
                         [](const ::testing::TestParamInfo<Mode>& i) {
                           return std::string(i.param.v6 ? "Ipv6" : "Ipv4") + (i.param.gso ? "Gso" : "NoGso");
                         });

}  // namespace
