// How soon a thread blocked on a completion channel wakes after a SEND arrives on a soft device,
// beside a thread blocked in recv() on a UDP socket woken by a datagram, both measured in this run
// (a benchmark, not a test; docs/performance.md, "Soft path"). One process, two soft devices
// (bw0 = 127.0.19.2 sends, bw1 = 127.0.19.3 waits) and two UDP sockets (127.0.19.4 -> 127.0.19.5):
//   - soft: the waiter arms its CQ (ibv_req_notify_cq), blocks in ibv_get_cq_event, then takes the
//     completion with ibv_poll_cq; the sender times from just before ibv_post_send of an 8-byte
//     SEND to the waiter's return from ibv_poll_cq;
//   - udp: the waiter blocks in recv(); from just before sendto() of 8 bytes to recv()'s return.
// The sender waits `gap_us` between messages so that the waiter is asleep when each one arrives (a
// wake from idle, not from a spin). The two modes alternate in rounds of `per_round` messages, so
// the machine's load falls on both alike. Prints percentiles of both and the ratio of medians.
//
//   build/release/tools/bench_soft_wake [rounds] [per_round] [gap_us] [soft|udp|both]
//   (defaults 10, 200, 300, both; one mode alone is for perf stat / strace of that path)
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "bench_rc_connect.h"

namespace {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

[[noreturn]] void die(const char* what) {
  perror(what);
  exit(1);
}

void sleep_us(unsigned us) {
  timespec ts{0, long(us) * 1000};
  nanosleep(&ts, nullptr);
}

void connect_qp(ibv_qp* qp, uint32_t dest, uint8_t peer_octet) {
  if (const char* step = bench_connect_rc(qp, dest, 19, peer_octet, IBV_MTU_1024, IBV_ACCESS_LOCAL_WRITE)) die(step);
}

ibv_context* open_dev(ibv_device** list, int n, const char* want) {
  for (int j = 0; j < n; ++j)
    if (!strcmp(ibv_get_device_name(list[j]), want)) return ibv_open_device(list[j]);
  die(want);
}

int udp_socket(const char* addr, sockaddr_in* sa) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) die("socket");
  *sa = {};
  sa->sin_family = AF_INET;
  sa->sin_port = htons(47900);
  inet_pton(AF_INET, addr, &sa->sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(sa), sizeof *sa)) die("bind");
  return fd;
}

// Between the two threads, outside the timed span: the waiter says it is armed (ready) and that it
// took the message (done); the sender blocks on these (a futex), so nothing spins or wakes while a
// message is on its way.
struct Handshake {
  std::atomic<int> ready{0}, done{0};
  std::atomic<uint64_t> t0{0};
  static void set(std::atomic<int>& flag) {
    flag = 1;
    flag.notify_one();
  }
  static void wait_for(std::atomic<int>& flag) {
    flag.wait(0);
    flag = 0;
  }
};

void report(const char* what, std::vector<uint64_t>& v) {
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return double(v[std::min(v.size() - 1, size_t(p * double(v.size())))]) / 1000.0; };
  printf("%-44s n %zu  p50 %8.2f  p90 %8.2f  p99 %8.2f  max %8.2f us\n", what, v.size(), pct(0.5), pct(0.9), pct(0.99),
         double(v.back()) / 1000.0);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 10;
  const int per_round = argc > 2 ? atoi(argv[2]) : 200;
  const unsigned gap_us = argc > 3 ? unsigned(atoi(argv[3])) : 300;
  const char* only = argc > 4 ? argv[4] : "both";
  const bool run_mode[2] = {strcmp(only, "udp") != 0, strcmp(only, "soft") != 0};
  setenv("MELON_SOFT_AUTO", "0", 1);
  setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
  setenv("MELON_SOFT_DEVICES", "bw0=127.0.19.2,bw1=127.0.19.3", 1);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) die("ibv_get_device_list");
  ibv_context* ctx[2] = {open_dev(list, n, "bw0"), open_dev(list, n, "bw1")};
  ibv_pd* pd[2];
  ibv_mr* mr[2];
  static uint8_t buf[2][4096];
  for (int i = 0; i < 2; ++i) {
    pd[i] = ibv_alloc_pd(ctx[i]);
    mr[i] = ibv_reg_mr(pd[i], buf[i], sizeof buf[i], IBV_ACCESS_LOCAL_WRITE);
    if (!mr[i]) die("reg_mr");
  }
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx[1]);
  if (!ch) die("create_comp_channel");
  ibv_cq* scq = ibv_create_cq(ctx[0], 64, nullptr, nullptr, 0);
  ibv_cq* wcq = ibv_create_cq(ctx[1], 64, nullptr, ch, 0);
  if (!scq || !wcq) die("create_cq");
  ibv_qp* qp[2];
  for (int i = 0; i < 2; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = i ? wcq : scq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    qp[i] = ibv_create_qp(pd[i], &ia);
    if (!qp[i]) die("create_qp");
  }
  connect_qp(qp[0], qp[1]->qp_num, 3);
  connect_qp(qp[1], qp[0]->qp_num, 2);
  auto post_recv = [&] {
    ibv_sge sge{uint64_t(uintptr_t(buf[1])), 64, mr[1]->lkey};
    ibv_recv_wr wr{}, *bad;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(qp[1], &wr, &bad)) die("post_recv");
  };
  post_recv();

  sockaddr_in ua, ub;
  const int us = udp_socket("127.0.19.4", &ua), ur = udp_socket("127.0.19.5", &ub);

  std::vector<uint64_t> lat[2];  // 0: soft, 1: udp
  Handshake hs;
  std::thread waiter([&] {
    for (int r = 0; r < rounds * 2; ++r) {
      const int m = r % 2;
      if (!run_mode[m]) continue;
      for (int i = 0; i < per_round; ++i) {
        if (m == 0) {
          if (ibv_req_notify_cq(wcq, 0)) die("req_notify_cq");
          hs.set(hs.ready);
          ibv_cq* got;
          void* cctx;
          ibv_wc wc;
          int k = 0;
          // Armed before the SEND was posted, so the event comes; poll after it for the completion.
          if (ibv_get_cq_event(ch, &got, &cctx)) die("get_cq_event");
          while ((k = ibv_poll_cq(wcq, 1, &wc)) == 0) {}
          const uint64_t t1 = now_ns();
          ibv_ack_cq_events(wcq, 1);
          if (k < 0 || wc.status != IBV_WC_SUCCESS) {
            fprintf(stderr, "receive completion: %s\n", k < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
            exit(1);
          }
          lat[0].push_back(t1 - hs.t0.load());
          post_recv();
        } else {
          hs.set(hs.ready);
          char b[64];
          if (recv(ur, b, sizeof b, 0) < 0) die("recv");
          lat[1].push_back(now_ns() - hs.t0.load());
        }
        hs.set(hs.done);
      }
    }
  });
  for (int r = 0; r < rounds * 2; ++r) {
    const int m = r % 2;
    if (!run_mode[m]) continue;
    for (int i = 0; i < per_round; ++i) {
      hs.wait_for(hs.ready);
      sleep_us(gap_us);  // the waiter is blocked by now
      if (m == 0) {
        ibv_sge sge{uint64_t(uintptr_t(buf[0])), 8, mr[0]->lkey};
        ibv_send_wr wr{}, *bad;
        wr.opcode = IBV_WR_SEND;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.send_flags = IBV_SEND_SIGNALED;
        hs.t0 = now_ns();
        if (ibv_post_send(qp[0], &wr, &bad)) die("post_send");
        hs.wait_for(hs.done);
        ibv_wc wc;
        int k;
        while ((k = ibv_poll_cq(scq, 1, &wc)) == 0) sleep_us(20);
        if (k < 0 || wc.status != IBV_WC_SUCCESS) {
          fprintf(stderr, "send completion: %s\n", k < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
          return 1;
        }
      } else {
        hs.t0 = now_ns();
        if (sendto(us, "8 bytes", 8, 0, reinterpret_cast<sockaddr*>(&ub), sizeof ub) != 8) die("sendto");
        hs.wait_for(hs.done);
      }
    }
  }
  waiter.join();
  printf("wake from idle, %d rounds of %d per mode, %u us apart:\n", rounds, per_round, gap_us);
  if (run_mode[0]) report("soft: post SEND -> get_cq_event + poll_cq", lat[0]);
  if (run_mode[1]) report("udp:  sendto -> blocked recv() returns", lat[1]);
  if (run_mode[0] && run_mode[1]) {
    const double a = double(lat[0][lat[0].size() / 2]), b = double(lat[1][lat[1].size() / 2]);
    printf("median ratio soft/udp %.3f\n", a / b);
  }

  close(us);
  close(ur);
  for (int i = 0; i < 2; ++i) ibv_destroy_qp(qp[i]);
  ibv_destroy_cq(scq);
  ibv_destroy_cq(wcq);
  ibv_destroy_comp_channel(ch);
  for (int i = 0; i < 2; ++i) {
    ibv_dereg_mr(mr[i]);
    ibv_dealloc_pd(pd[i]);
    ibv_close_device(ctx[i]);
  }
  ibv_free_device_list(list);
  return 0;
}
