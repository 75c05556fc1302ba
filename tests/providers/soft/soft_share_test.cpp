// Many processes on one address (src/providers/soft/addr_registry.h, steering.h).
//
//  - The steering program, run by a small interpreter of what it emits (deterministic), and by the
//    kernel: a group of real sockets on 127.0.0.40 gets each bucket's datagram at the socket the
//    table names, probes at the index they carry, and the kernel moves the last socket into a
//    leaving one's slot (the rule the registry follows).
//  - The registry across processes: claims, and a SIGKILLed member's claims reclaimed.
//  - 16 processes with RC QPs of their own on 127.0.0.41, each WRITE and READ verified, against
//    one process on 127.0.0.42.
//  - 3 processes on 127.0.0.40; one closes its device and leaves in order while the others go on.
//  - 4 processes streaming on 127.0.0.43 towards 127.0.0.44; one is SIGKILLed mid-traffic, the
//    others go on (their sockets moved in the group: the program is rebuilt from probes), and its
//    claims are reclaimed.
// Processes are forked before the parent opens anything (no threads yet).
#include <arpa/inet.h>
#include <fcntl.h>
#if defined(__linux__)
#include <linux/filter.h>
#endif
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "providers/soft/addr_registry.h"
#include "providers/soft/steering.h"

namespace {

using namespace melon::soft;

// ---- the program, interpreted --------------------------------------------------------------------

std::vector<uint8_t> bth_to(uint32_t qpn) {
  std::vector<uint8_t> p(12, 0);
  p[0] = 0x04;  // RC SEND only
  p[5] = uint8_t(qpn >> 16), p[6] = uint8_t(qpn >> 8), p[7] = uint8_t(qpn);
  return p;
}

TEST(SoftSteering, BucketsGoToTheirIndexProbesToTheirsQp1ToTheGsiHook) {
  SteeringTable t;
  t.secret[0] = 0x11223344;
  t.secret[1] = 0x55667788;
  for (uint32_t b = 1; b < kQpnBuckets; ++b) t.index_of_bucket[b] = b % 7 == 0 ? kNoSocket : (b * 13) % 37;
  auto prog = build_steering_program(t);
  EXPECT_LT(prog.size(), 4096u);  // BPF_MAXINSNS
  for (uint32_t b = 0; b < kQpnBuckets; ++b) {
    auto p = bth_to(b << 16 | 0x1234);
    EXPECT_EQ(run_steering_program(prog, p.data(), p.size()), t.index_of_bucket[b]) << b;
  }
  auto qp1 = bth_to(1);
  EXPECT_EQ(run_steering_program(prog, qp1.data(), qp1.size()), kNoSocket);  // no CM agent yet
  t.gsi_index = 5;
  prog = build_steering_program(t);
  EXPECT_EQ(run_steering_program(prog, qp1.data(), qp1.size()), 5u);
  auto qp0x10001 = bth_to(0x10001);  // bucket 1, not QP1
  EXPECT_EQ(run_steering_program(prog, qp0x10001.data(), qp0x10001.size()), t.index_of_bucket[1]);

  uint8_t probe[kProbeLen];
  write_probe(probe, t.secret, {9, 3});
  EXPECT_EQ(run_steering_program(prog, probe, sizeof probe), 9u);
  Probe got{};
  ASSERT_TRUE(read_probe(probe, sizeof probe, t.secret, &got));
  EXPECT_EQ(got.index, 9u);
  EXPECT_EQ(got.generation, 3u);
  const uint32_t wrong[2] = {t.secret[0], t.secret[1] ^ 1};
  uint8_t forged[kProbeLen];
  write_probe(forged, wrong, {9, 3});
  EXPECT_EQ(run_steering_program(prog, forged, sizeof forged), kNoSocket);  // a remote guess: hashed
  EXPECT_FALSE(read_probe(forged, sizeof forged, t.secret, &got));
  EXPECT_TRUE(is_probe(forged, sizeof forged));
  const uint8_t tiny[3] = {1, 2, 3};
  EXPECT_EQ(run_steering_program(prog, tiny, sizeof tiny), 0u);  // too short for a BTH: index 0
}

TEST(SoftSteering, LaneQpnsStayInTheLanesBuckets) {
  const uint8_t buckets[3] = {7, 200, 33};
  for (uint32_t r : {0u, 1u, 0xffffffffu, 0x12345678u, 0x9abcdef0u}) {
    const uint32_t q = lane_qpn(r, buckets, 3);
    const uint32_t b = bucket_of_qpn(q);
    EXPECT_TRUE(b == 7 || b == 200 || b == 33) << std::hex << q;
    EXPECT_EQ(q & 0xffff, r & 0xffff);
  }
  EXPECT_EQ(lane_qpn(0xabcdef12, buckets, 0), 0xabcdef12u);  // no buckets: any QPN
}

#if defined(__linux__)  // SO_ATTACH_REUSEPORT_CBPF: Linux's (macOS shares no address: docs/macos.md)
// ---- the program, run by the kernel ---------------------------------------------------------------

int bound_member(const char* ip, uint16_t port) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, ip, &sa.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void send_to(const char* ip, uint16_t port, const uint8_t* p, size_t n) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, ip, &sa.sin_addr);
  ASSERT_EQ(sendto(fd, p, n, 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa), ssize_t(n));
  close(fd);
}

// Which of `fds` received a datagram (-1: none within 1 s); the datagram is consumed.
int who_got(const std::vector<int>& fds) {
  std::vector<pollfd> p;
  for (int fd : fds) p.push_back({fd, POLLIN, 0});
  if (poll(p.data(), p.size(), 1000) <= 0) return -1;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i].revents & POLLIN) {
      uint8_t buf[64];
      recv(fds[i], buf, sizeof buf, 0);
      return int(i);
    }
  return -1;
}

void attach(int fd, const SteeringTable& t) {
  auto prog = build_steering_program(t);
  sock_fprog fp{static_cast<unsigned short>(prog.size()), reinterpret_cast<sock_filter*>(prog.data())};
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &fp, sizeof fp), 0) << strerror(errno);
}

TEST(SoftSteering, TheKernelSteersAsTheTableSaysAndMovesTheLastSocketIntoAGap) {
  constexpr const char* kIp = "127.0.0.40";
  constexpr uint16_t kPort = 4790;  // not 4791: nothing of the library's on it
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) {
    fds.push_back(bound_member(kIp, kPort));
    ASSERT_GE(fds.back(), 0) << strerror(errno);
  }
  SteeringTable t;
  t.secret[0] = 1, t.secret[1] = 2;
  for (uint32_t b = 1; b < 40; ++b) t.index_of_bucket[b] = b % 5;
  attach(fds[2], t);  // any member may attach the group's program
  for (uint32_t b = 1; b < 40; ++b) {
    auto p = bth_to(b << 16 | 77);
    send_to(kIp, kPort, p.data(), p.size());
    EXPECT_EQ(who_got(fds), int(b % 5)) << "bucket " << b;
  }
  for (uint32_t i = 0; i < 5; ++i) {
    uint8_t probe[kProbeLen];
    write_probe(probe, t.secret, {i, 1});
    send_to(kIp, kPort, probe, sizeof probe);
    EXPECT_EQ(who_got(fds), int(i)) << "probe " << i;
  }
  // Socket 1 leaves: the kernel moves the last (4) into index 1 (reuseport_detach_sock).
  close(fds[1]);
  fds.erase(fds.begin() + 1);  // now 0, 2, 3, 4 by fd; by group index 0, 4, 2, 3
  for (uint32_t i = 0; i < 4; ++i) {
    uint8_t probe[kProbeLen];
    write_probe(probe, t.secret, {i, 2});
    send_to(kIp, kPort, probe, sizeof probe);
    const int expect[4] = {0, 3, 1, 2};  // the fds vector's position of group index i
    EXPECT_EQ(who_got(fds), expect[i]) << "probe " << i << " after the leave";
  }
  for (int fd : fds) close(fd);
}

#endif

// ---- the registry across processes ----------------------------------------------------------------

std::shared_ptr<AddressRegistry> registry_of(const char* ip) {
  uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  inet_pton(AF_INET, ip, gid + 12);
  std::string why;
  auto r = AddressRegistry::open(gid, 0, 4791, &why);
  EXPECT_NE(r, nullptr) << why;
  return r;
}

TEST(SoftShareRegistry, AKilledMembersClaimsAreReclaimed) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    auto r = registry_of("127.0.0.45");
    std::vector<std::vector<uint8_t>> b;
    std::vector<std::vector<int>> s;
    std::string why;
    char ok = r && AddressRegistry::claim({r.get()}, 3, &b, &s, &why) == 0 ? 'y' : 'n';
    (void)!write(ready[1], &ok, 1);
    pause();  // until SIGKILL
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  EXPECT_EQ(ok, 'y');
  auto r = registry_of("127.0.0.45");
  ASSERT_NE(r, nullptr);
  auto v = r->view();
  EXPECT_EQ(v.members, 2u);
  EXPECT_EQ(v.sockets, 3u);
  EXPECT_GE(v.buckets_claimed, 3u);
  const uint32_t reclaimed = v.reclaimed;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  v = r->view();
  EXPECT_EQ(v.members, 1u);
  EXPECT_EQ(v.sockets, 0u);
  EXPECT_EQ(v.buckets_claimed, 0u);
  EXPECT_EQ(v.reclaimed, reclaimed + 1);
  close(ready[0]);
  close(ready[1]);
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
  void SetUp() override {
#if !defined(__linux__)
    GTEST_SKIP() << "one process per address off Linux (docs/macos.md, \"One address, many processes\")";
#endif
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

TEST_F(SoftShare, SixteenProcessesWithQpsOfTheirOwnOnOneAddress) {
  constexpr int kProcs = 16;
  std::vector<Child> c = spawn(kProcs, "127.0.0.41", 2);
  Node srv;
  serve(srv, "127.0.0.42", c);
  // While every child is connected: one group of sockets, every index known from the joins.
  auto reg = registry_of("127.0.0.41");
  ASSERT_NE(reg, nullptr);
  for (size_t i = 0; i < c.size(); ++i)
    for (uint32_t want : {1u, 2u}) {
      uint32_t round = 0;
      ASSERT_TRUE(read_all(c[i].up, &round, sizeof round))
          << "child " << i << " failed round " << want << ": exit code " << exit_code(c[i].pid);
      EXPECT_EQ(round, want);
    }
  auto v = reg->view();
  EXPECT_EQ(v.members, uint32_t(kProcs + 1));  // and this process, looking
  EXPECT_GE(v.sockets, uint32_t(kProcs));  // a lane or more each
  EXPECT_EQ(v.unknown, 0u);
  for (size_t i = 0; i < c.size(); ++i) {
    close(c[i].down);
    EXPECT_EQ(exit_code(c[i].pid), 0) << "child " << i;
    // Its region of our buffer holds what it wrote last (round 2).
    const uint8_t* r = srv.buf.data() + i * 2 * kRegion;
    bool same = true;
    for (uint32_t j = 0; j < kRegion && same; ++j) same = r[j] == uint8_t(j * 7 + int(i) * 31 + 2);
    EXPECT_TRUE(same) << "child " << i << "'s data";
    close(c[i].up);
  }
}

TEST_F(SoftShare, AProcessKilledMidTrafficLeavesTheOthersRunningAndItsClaimsReclaimed) {
  constexpr int kProcs = 4;
  std::vector<Child> c = spawn(kProcs, "127.0.0.43", 0);
  Node srv;
  serve(srv, "127.0.0.44", c);
  auto reg = registry_of("127.0.0.43");
  ASSERT_NE(reg, nullptr);
  auto rounds_of = [&](size_t i, uint32_t at_least) {
    uint32_t r = 0;
    while (r < at_least)
      if (!read_all(c[i].up, &r, sizeof r)) return false;
    return true;
  };
  for (size_t i = 0; i < c.size(); ++i) ASSERT_TRUE(rounds_of(i, 3)) << "child " << i;
  const auto before = reg->view();
  // The first child joined first: its sockets are at the front, and the last ones move into their
  // slots when it dies.
  kill(c[0].pid, SIGKILL);
  EXPECT_EQ(exit_code(c[0].pid), 128 + SIGKILL);
  // The others go on: each completes more rounds (reads of the pipe drain what they reported).
  for (size_t i = 1; i < c.size(); ++i) {
    uint32_t r = 0, first = 0;
    ASSERT_TRUE(read_all(c[i].up, &first, sizeof first));
    while (r < first + 10) ASSERT_TRUE(read_all(c[i].up, &r, sizeof r)) << "child " << i << " stopped";
  }
  auto after = reg->view();
  // The verification round of probes (one tick after the first) may still be under way.
  for (int i = 0; i < 200 && after.unknown; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    after = reg->view();
  }
  EXPECT_EQ(after.members, before.members - 1);
  EXPECT_EQ(after.sockets, before.sockets - before.sockets / kProcs);
  EXPECT_LT(after.buckets_claimed, before.buckets_claimed);
  EXPECT_GT(after.generation, before.generation);  // probes taught the survivors their new indices
  EXPECT_EQ(after.unknown, 0u);
  for (size_t i = 1; i < c.size(); ++i) {
    close(c[i].down);  // stop
    uint32_t r;
    while (read(c[i].up, &r, sizeof r) > 0) {}
    EXPECT_EQ(exit_code(c[i].pid), 0) << "child " << i;
    close(c[i].up);
  }
  close(c[0].up);
  close(c[0].down);
}

}  // namespace

namespace {

// A member that closes its device leaves in order: the group's last socket takes its index (as the
// kernel moves it), the program is rebuilt before the close, no probe is needed, and the others'
// traffic goes on.
TEST_F(SoftShare, AProcessThatLeavesInOrderNeedsNoProbesAndTheOthersGoOn) {
  std::vector<Child> c = spawn(3, "127.0.0.40", 0);
  Node srv;
  serve(srv, "127.0.0.42", c);
  auto reg = registry_of("127.0.0.40");
  ASSERT_NE(reg, nullptr);
  uint32_t r = 0;
  for (size_t i = 0; i < c.size(); ++i) ASSERT_TRUE(read_all(c[i].up, &r, sizeof r)) << "child " << i;
  const auto before = reg->view();
  EXPECT_EQ(before.unknown, 0u);
  close(c[0].down);  // child 0 stops, closes its device and exits
  while (read(c[0].up, &r, sizeof r) > 0) {}
  EXPECT_EQ(exit_code(c[0].pid), 0);
  const auto left = reg->view();
  EXPECT_EQ(left.members, before.members - 1);
  EXPECT_EQ(left.sockets, before.sockets - before.sockets / 3);
  EXPECT_EQ(left.generation, before.generation);  // nothing moved unseen
  EXPECT_EQ(left.reclaimed, before.reclaimed);  // it left; nobody had to reclaim it
  EXPECT_EQ(left.unknown, 0u);
  for (size_t i = 1; i < c.size(); ++i) {
    uint32_t first = 0;
    ASSERT_TRUE(read_all(c[i].up, &first, sizeof first));
    for (r = first; r < first + 10;) ASSERT_TRUE(read_all(c[i].up, &r, sizeof r)) << "child " << i << " stopped";
  }
  EXPECT_EQ(reg->view().generation, before.generation);
  for (size_t i = 1; i < c.size(); ++i) {
    close(c[i].down);
    while (read(c[i].up, &r, sizeof r) > 0) {}
    EXPECT_EQ(exit_code(c[i].pid), 0) << "child " << i;
    close(c[i].up);
  }
  close(c[0].up);
}

}  // namespace
