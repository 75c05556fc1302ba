// Verbs-level test helpers shared by the provider and library tests (tests/providers/*,
// tests/verbs): an RC QP taken to RTS, a completion waited for, one work request posted, and
// melon-emud as a child process serving mlx5_0. Header only: the tests link either the object build
// of libibverbs or the shared library, and both see the same <infiniband/verbs.h> (ours).
#pragma once
#include <gtest/gtest.h>

#include <infiniband/verbs.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

namespace melon::testkit {

inline uint64_t addr_of(const void* p) { return uint64_t(uintptr_t(p)); }

// What an RC QP needs to reach RTS towards its peer (IBA Table 91's attributes for each step).
struct RcPath {
  uint32_t dest_qpn = 0;
  ibv_gid dgid{};
  uint32_t sq_psn = 0;  // this side's first PSN
  uint32_t rq_psn = 0;  // the peer's first PSN
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  uint8_t timeout = 14;  // 67 ms: these tests are not about timeouts, and a loaded machine is slow
  ibv_mtu mtu = IBV_MTU_1024;
  bool reset_first = false;  // from any state (a QP in ERR after a refused request)
};

// INIT -> RTR -> RTS (after RESET with reset_first); a failing step fails the calling test.
inline void rc_to_rts(ibv_qp* qp, const RcPath& p) {
  ibv_qp_attr at{};
  if (p.reset_first) {
    at.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(qp, &at, IBV_QP_STATE), 0);
  }
  at = {};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.qp_access_flags = p.access;
  ASSERT_EQ(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  at = {};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = p.mtu;
  at.dest_qp_num = p.dest_qpn;
  at.rq_psn = p.rq_psn;
  at.max_dest_rd_atomic = 4;
  at.min_rnr_timer = 1;
  at.ah_attr.is_global = 1;
  at.ah_attr.port_num = 1;
  at.ah_attr.grh.dgid = p.dgid;
  at.ah_attr.grh.hop_limit = 64;
  ASSERT_EQ(ibv_modify_qp(qp, &at,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            0);
  at = {};
  at.qp_state = IBV_QPS_RTS;
  at.sq_psn = p.sq_psn;
  at.timeout = p.timeout;
  at.retry_cnt = 7;
  at.rnr_retry = 7;
  at.max_rd_atomic = 4;
  ASSERT_EQ(ibv_modify_qp(qp, &at,
                          IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                              IBV_QP_MAX_QP_RD_ATOMIC),
            0);
}

// The next completion of `cq`, polled every `nap_us` for at most `ms`; a timeout fails the test and
// reads as IBV_WC_GENERAL_ERR.
inline ibv_wc wait_wc(ibv_cq* cq, int ms = 10000, int nap_us = 50) {
  ibv_wc wc{};
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n == 1) return wc;
    EXPECT_EQ(n, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(nap_us));
  }
  ADD_FAILURE() << "no completion";
  wc.status = IBV_WC_GENERAL_ERR;
  return wc;
}

// One send WR with one SGE; ibv_post_send's result.
struct Post {
  ibv_wr_opcode op = IBV_WR_SEND;
  uint64_t laddr = 0;
  uint32_t len = 0;
  uint32_t lkey = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  unsigned flags = IBV_SEND_SIGNALED;
  uint64_t wr_id = 1;
};
inline int post_one(ibv_qp* qp, const Post& p) {
  ibv_sge sg{p.laddr, p.len, p.lkey};
  ibv_send_wr wr{};
  wr.wr_id = p.wr_id;
  wr.opcode = p.op;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.send_flags = p.flags;
  wr.wr.rdma.remote_addr = p.raddr;
  wr.wr.rdma.rkey = p.rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

inline int post_recv_one(ibv_qp* qp, uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t wr_id) {
  ibv_sge sg{laddr, len, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

// melon-emud as a child process for a whole test program (a gtest Environment): its socket in a
// directory of its own, MELON_EMUD_SOCKET pointing there; at the end SIGTERM, and the daemon must
// exit 0 (every client object released, nothing leaked in the core).
class EmudChild : public ::testing::Environment {
 public:
  EmudChild(const char* bin, const char* wire, const char* tmp_prefix) : bin_(bin), wire_(wire), prefix_(tmp_prefix) {}
  void SetUp() override {
    std::string tmpl = std::string("/tmp/") + prefix_ + "-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    sock_ = dir_ + "/emud.sock";
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      execl(bin_, "melon-emud", "--socket", sock_.c_str(), "--wire", wire_, nullptr);
      _exit(127);
    }
    struct stat st;
    for (int i = 0; i < 400 && stat(sock_.c_str(), &st) != 0; i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    ASSERT_EQ(stat(sock_.c_str(), &st), 0) << "melon-emud did not come up";
    setenv("MELON_EMUD_SOCKET", sock_.c_str(), 1);
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      waitpid(pid_, &st, 0);
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "melon-emud status " << st;
    }
    unlink(sock_.c_str());
    unlink((sock_ + ".guid").c_str());
    rmdir(dir_.c_str());
  }

 private:
  const char* bin_;
  const char* wire_;
  const char* prefix_;
  std::string dir_, sock_;
  pid_t pid_ = -1;
};

}  // namespace melon::testkit
