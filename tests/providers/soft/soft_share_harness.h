// What the many-processes-on-one-address tests share (soft_share_test.cpp: reuseport mode;
// soft_share_forward_test.cpp: forward mode): RC endpoints, a child process's WRITE/READ rounds
// against the parent, and a fixture that forks children on one address before the parent opens
// anything (no threads yet).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "providers/soft/addr_registry.h"

namespace {

using namespace melon::soft;

std::shared_ptr<AddressRegistry> registry_of(const char* ip) {
  uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  inet_pton(AF_INET, ip, gid + 12);
  std::string why;
  auto r = AddressRegistry::open(gid, 0, 4791, &why);
  EXPECT_NE(r, nullptr) << why;
  return r;
}

// ---- processes with QPs on one address ------------------------------------------------------------

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr uint32_t kRegion = 64 << 10;

struct Endpoint {  // what the two sides of an RC connection exchange
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
  uint8_t gid[16];
};

ibv_context* open_device(const char* name) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && !ctx; ++i)
    if (!strcmp(ibv_get_device_name(list[i]), name)) ctx = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  return ctx;
}

bool to_rts(ibv_qp* qp, const Endpoint& peer) {
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.qp_access_flags = kAll;
  if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return false;
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = IBV_MTU_1024;
  at.dest_qp_num = peer.qpn;
  at.rq_psn = 0;
  at.max_dest_rd_atomic = 4;
  at.min_rnr_timer = 1;
  at.ah_attr.is_global = 1;
  at.ah_attr.port_num = 1;
  memcpy(at.ah_attr.grh.dgid.raw, peer.gid, 16);
  if (ibv_modify_qp(qp, &at,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return false;
  at.qp_state = IBV_QPS_RTS;
  at.sq_psn = 0;
  at.timeout = 16;  // 268 ms x 7 tries: longer than a loaded 2-core machine stalls 17 processes
  at.retry_cnt = 7;
  at.rnr_retry = 7;
  at.max_rd_atomic = 4;
  return ibv_modify_qp(qp, &at,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

// One device's objects with `nqp` RC QPs and a buffer of 2 * kRegion per QP.
struct Node {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<ibv_qp*> qps;
  std::vector<uint8_t> buf;
  bool open(const char* dev, int nqp) {
    if (!(ctx = open_device(dev))) return false;
    buf.assign(size_t(nqp) * 2 * kRegion, 0);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
    if (!pd || !cq || !(mr = ibv_reg_mr(pd, buf.data(), buf.size(), kAll))) return false;
    for (int i = 0; i < nqp; ++i) {
      ibv_qp_init_attr ia{};
      ia.send_cq = ia.recv_cq = cq;
      ia.qp_type = IBV_QPT_RC;
      ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
      ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
      ibv_qp* q = ibv_create_qp(pd, &ia);
      if (!q) return false;
      qps.push_back(q);
    }
    return true;
  }
  Endpoint endpoint(int i) {
    Endpoint e{qps[i]->qp_num, mr->rkey, uint64_t(uintptr_t(buf.data() + size_t(i) * 2 * kRegion)), {}};
    ibv_gid g;
    ibv_query_gid(ctx, 1, 0, &g);
    memcpy(e.gid, g.raw, 16);
    return e;
  }
  // One signaled WRITE or READ of kRegion bytes from/into local region `off`; true on success.
  bool rdma(int i, ibv_wr_opcode op, size_t off, const Endpoint& peer, uint64_t peer_off) {
    ibv_sge sge{uint64_t(uintptr_t(buf.data() + off)), kRegion, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = off;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = peer.addr + peer_off;
    wr.wr.rdma.rkey = peer.rkey;
    if (ibv_post_send(qps[i], &wr, &bad)) return false;
    ibv_wc wc{};
    for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
         std::chrono::steady_clock::now() < end;) {
      if (ibv_poll_cq(cq, 1, &wc) == 1) return wc.status == IBV_WC_SUCCESS;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return false;
  }
  ~Node() {
    for (ibv_qp* q : qps) ibv_destroy_qp(q);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

bool read_all(int fd, void* p, size_t n) {
  auto* c = static_cast<uint8_t*>(p);
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r, n -= size_t(r);
  }
  return true;
}

// A child: one QP on device "cli", connected to the parent's QP `i`. Each round WRITEs a pattern of
// its own into its region of the parent's buffer and READs it back, and reports the round on
// `up`; `rounds` 0: until `down` closes; > 0: that many, then it waits for `down` to close; < 0:
// that many, then it closes its device (leaving the group in order) and exits. Returns the exit code.
int child_rounds(int i, int up, int down, int rounds) {
  Node n;
  Endpoint mine{}, peer{};
  if (!n.open("cli", 1)) return 1;
  mine = n.endpoint(0);
  if (write(up, &mine, sizeof mine) != ssize_t(sizeof mine) || !read_all(down, &peer, sizeof peer) ||
      !to_rts(n.qps[0], peer))
    return 1;
  if (rounds == 0) fcntl(down, F_SETFL, O_NONBLOCK);
  const uint32_t last = uint32_t(rounds < 0 ? -rounds : rounds);
  for (uint32_t round = 1; rounds == 0 || round <= last; ++round) {
    for (uint32_t j = 0; j < kRegion; ++j) n.buf[j] = uint8_t(j * 7 + i * 31 + round);
    if (!n.rdma(0, IBV_WR_RDMA_WRITE, 0, peer, 0) || !n.rdma(0, IBV_WR_RDMA_READ, kRegion, peer, 0) ||
        memcmp(n.buf.data(), n.buf.data() + kRegion, kRegion) != 0)
      return 2;
    if (write(up, &round, sizeof round) != ssize_t(sizeof round)) return 0;
    char c;
    if (rounds == 0 && read(down, &c, 1) == 0) return 0;  // the parent says stop
  }
  char c;
  while (rounds > 0 && read(down, &c, 1) > 0) {}
  return 0;  // the device closes here, before the process ends
}

[[noreturn]] void child_main(int i, int up, int down, int rounds) { _exit(child_rounds(i, up, down, rounds)); }

class SoftShare : public ::testing::Test {
 protected:
  // MELON_SOFT_SHARE for the children and the parent (nullptr: the default, reuseport on Linux).
  virtual const char* mode() const { return nullptr; }
  void SetUp() override {
    if (mode()) {
      setenv("MELON_SOFT_SHARE", mode(), 1);
    } else {
#if !defined(__linux__)
      GTEST_SKIP() << "no kernel steering off Linux (docs/macos.md, \"One address, many processes\")";
#endif
      unsetenv("MELON_SOFT_SHARE");
    }
    char tmpl[] = "/tmp/melon-stats-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    stats_dir_ = tmpl;
    setenv("MELON_STATS_DIR", tmpl, 1);
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
  }
  void TearDown() override {
    if (!stats_dir_.empty()) ASSERT_EQ(system(("rm -rf '" + stats_dir_ + "'").c_str()), 0);
  }

  struct Child {
    pid_t pid;
    int up, down;
  };
  // `n` children on `cli_ip`, forked before this process opens anything.
  std::vector<Child> spawn(int n, const char* cli_ip, int rounds) {
    setenv("MELON_SOFT_DEVICES", (std::string("cli=") + cli_ip).c_str(), 1);
    std::vector<Child> c;
    for (int i = 0; i < n; ++i) {
      int up[2], down[2];
      EXPECT_EQ(pipe(up), 0);
      EXPECT_EQ(pipe(down), 0);
      pid_t pid = fork();
      if (pid == 0) {
        for (const Child& o : c) close(o.up), close(o.down);
        close(up[0]);
        close(down[1]);
        child_main(i, up[1], down[0], rounds);
      }
      close(up[1]);
      close(down[0]);
      c.push_back({pid, up[0], down[1]});
    }
    return c;
  }
  // The parent's side: device "srv" on `srv_ip` with a QP per child, each connected.
  void serve(Node& srv, const char* srv_ip, std::vector<Child>& c) {
    setenv("MELON_SOFT_DEVICES", (std::string("srv=") + srv_ip).c_str(), 1);
    ASSERT_TRUE(srv.open("srv", int(c.size())));
    for (size_t i = 0; i < c.size(); ++i) {
      Endpoint peer{};
      ASSERT_TRUE(read_all(c[i].up, &peer, sizeof peer)) << "child " << i << " did not start";
      ASSERT_TRUE(to_rts(srv.qps[i], peer));
      Endpoint mine = srv.endpoint(int(i));
      ASSERT_EQ(write(c[i].down, &mine, sizeof mine), ssize_t(sizeof mine));
    }
  }
  static int exit_code(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  std::string stats_dir_;
};

}  // namespace
