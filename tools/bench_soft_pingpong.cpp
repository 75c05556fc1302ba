// The CPU cost of one busy-poll ping-pong round trip through the soft provider, beside the same
// ping-pong over two plain UDP sockets (a benchmark, not a test; docs/performance.md, "Fourth part
// (lat)"). One thread plays both ends, so no time is spent waiting for a peer or a scheduler: on
// loopback a datagram is in the receiving socket when the sending call returns, and every poll
// finds what it looks for. What is left per round trip is the work of the path itself, which the
// machine's load moves far less than a two-process latency run.
//   - soft: two devices in this process (bl0 = 127.0.29.2, bl1 = 127.0.29.3), one RC QP each, as
//     ib_send_lat -s 8 does it: each end posts an 8-byte signaled SEND, polls its receive CQ for the
//     peer's SEND and its send CQ for its own SEND's completion, and reposts the receive. The busy
//     polls take the busy-poll lease (udp_transport.h), so ACKs leave with the next SEND.
//   - udp: 14-byte datagrams (sockperf's smallest) between two sockets, sendto + a nonblocking
//     recvfrom on each end (sockperf ping-pong -F r --nonblocked).
// Prints per round trip: wall time, the process's CPU time (all threads), and the polls that found
// nothing (0 when each datagram was delivered within its send, as it should be on loopback).
//
//   build/release/tools/bench_soft_pingpong [round_trips] [soft|udp|both]   (defaults 200000, both)
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

#include "bench_rc_connect.h"

namespace {

uint64_t clock_ns(clockid_t c) {
  timespec ts;
  clock_gettime(c, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

[[noreturn]] void die(const char* what) {
  perror(what);
  exit(1);
}

struct Result {
  double wall_ns, cpu_ns, empty;
};

void print(const char* mode, uint64_t n, const Result& r) {
  printf("%-4s %llu round trips: %.0f ns wall, %.0f ns CPU, %.2f empty polls per round trip\n", mode,
         (unsigned long long)n, r.wall_ns, r.cpu_ns, r.empty);
}

struct End {
  ibv_context* ctx;
  ibv_pd* pd;
  ibv_cq *scq, *rcq;
  ibv_qp* qp;
  ibv_mr* mr;
  uint8_t buf[64];
};

void post_recv(End& e) {
  ibv_sge sge{uint64_t(uintptr_t(e.buf + 32)), 32, e.mr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (ibv_post_recv(e.qp, &wr, &bad)) die("post_recv");
}

void post_send(End& e) {
  ibv_sge sge{uint64_t(uintptr_t(e.buf)), 8, e.mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(e.qp, &wr, &bad)) die("post_send");
}

// Polls until one completion; counts the polls that found none.
void poll1(ibv_cq* cq, uint64_t* empty) {
  ibv_wc wc;
  int got;
  while ((got = ibv_poll_cq(cq, 1, &wc)) == 0) ++*empty;
  if (got < 0 || wc.status != IBV_WC_SUCCESS) {
    fprintf(stderr, "poll: %s\n", got < 0 ? "error" : ibv_wc_status_str(wc.status));
    exit(1);
  }
}

Result run_soft(uint64_t n) {
  setenv("MELON_SOFT_AUTO", "0", 1);
  setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
  setenv("MELON_SOFT_DEVICES", "bl0=127.0.29.2,bl1=127.0.29.3", 1);
  int nd = 0;
  ibv_device** list = ibv_get_device_list(&nd);
  End end[2];
  for (int i = 0; i < 2; ++i) {
    End& e = end[i];
    const char* want = i ? "bl1" : "bl0";
    e.ctx = nullptr;
    for (int j = 0; j < nd; ++j)
      if (!strcmp(ibv_get_device_name(list[j]), want)) e.ctx = ibv_open_device(list[j]);
    if (!e.ctx) die(want);
    if (!(e.pd = ibv_alloc_pd(e.ctx))) die("alloc_pd");
    if (!(e.mr = ibv_reg_mr(e.pd, e.buf, sizeof e.buf, IBV_ACCESS_LOCAL_WRITE))) die("reg_mr");
    e.scq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
    e.rcq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
    if (!e.scq || !e.rcq) die("create_cq");
    ibv_qp_init_attr ia{};
    ia.send_cq = e.scq;
    ia.recv_cq = e.rcq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    if (!(e.qp = ibv_create_qp(e.pd, &ia))) die("create_qp");
  }
  for (int i = 0; i < 2; ++i)
    if (const char* step = bench_connect_rc(end[i].qp, end[1 - i].qp->qp_num, 29, uint8_t(3 - i), IBV_MTU_1024,
                                            IBV_ACCESS_LOCAL_WRITE))
      die(step);
  post_recv(end[0]);
  post_recv(end[1]);
  // Round trip i: A sends, B takes it (and the ACK of its previous SEND) and its own previous
  // SEND's completion, reposts and answers; A the same. Each end's SEND completes when the peer's
  // next message carries the ACK, one half round trip later, as in a two-process ping-pong.
  uint64_t empty = 0, t0 = 0, c0 = 0;
  const uint64_t warm = n / 10 + 1000;
  bool b_sent = false;
  for (uint64_t i = 0; i < warm + n; ++i) {
    if (i == warm) {
      empty = 0;
      t0 = clock_ns(CLOCK_MONOTONIC);
      c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    }
    End &a = end[0], &b = end[1];
    post_send(a);
    poll1(b.rcq, &empty);
    if (b_sent) poll1(b.scq, &empty);
    post_recv(b);
    post_send(b);
    b_sent = true;
    poll1(a.rcq, &empty);
    poll1(a.scq, &empty);
    post_recv(a);
  }
  Result r{double(clock_ns(CLOCK_MONOTONIC) - t0) / double(n),
           double(clock_ns(CLOCK_PROCESS_CPUTIME_ID) - c0) / double(n), double(empty) / double(n)};
  // B's last SEND completes with A's ACK, which A holds until it polls again.
  poll1(end[1].scq, &empty);
  for (End& e : end) {
    ibv_destroy_qp(e.qp);
    ibv_destroy_cq(e.scq);
    ibv_destroy_cq(e.rcq);
    ibv_dereg_mr(e.mr);
    ibv_dealloc_pd(e.pd);
    ibv_close_device(e.ctx);
  }
  ibv_free_device_list(list);
  return r;
}

int udp_socket(const char* addr, sockaddr_in* sa) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) die("socket");
  *sa = {};
  sa->sin_family = AF_INET;
  sa->sin_port = htons(47929);
  inet_pton(AF_INET, addr, &sa->sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(sa), sizeof *sa)) die("bind");
  return fd;
}

void udp_hop(int from, int to, const sockaddr_in& to_addr, uint64_t* empty) {
  char msg[14] = {}, in[64];
  if (sendto(from, msg, sizeof msg, 0, reinterpret_cast<const sockaddr*>(&to_addr), sizeof to_addr) != sizeof msg)
    die("sendto");
  sockaddr_in src;
  socklen_t len;
  for (;;) {
    len = sizeof src;
    if (recvfrom(to, in, sizeof in, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&src), &len) == sizeof msg) return;
    ++*empty;
  }
}

Result run_udp(uint64_t n) {
  sockaddr_in sa, sb;
  int a = udp_socket("127.0.29.4", &sa), b = udp_socket("127.0.29.5", &sb);
  uint64_t empty = 0, t0 = 0, c0 = 0;
  const uint64_t warm = n / 10 + 1000;
  for (uint64_t i = 0; i < warm + n; ++i) {
    if (i == warm) {
      empty = 0;
      t0 = clock_ns(CLOCK_MONOTONIC);
      c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    }
    udp_hop(a, b, sb, &empty);
    udp_hop(b, a, sa, &empty);
  }
  Result r{double(clock_ns(CLOCK_MONOTONIC) - t0) / double(n),
           double(clock_ns(CLOCK_PROCESS_CPUTIME_ID) - c0) / double(n), double(empty) / double(n)};
  close(a);
  close(b);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 200000;
  const char* mode = argc > 2 ? argv[2] : "both";
  const bool soft = strcmp(mode, "udp") != 0, udp = strcmp(mode, "soft") != 0;
  Result s{}, u{};
  if (udp) print("udp", n, u = run_udp(n));
  if (soft) print("soft", n, s = run_soft(n));
  if (soft && udp) printf("soft / udp: %.3f wall, %.3f CPU\n", s.wall_ns / u.wall_ns, s.cpu_ns / u.cpu_ns);
  return 0;
}
