// Benchmark (not a test): melon-emud's data path seen from a client that posts raw WQEs (the way
// the mlx5 provider does): 8-byte RDMA WRITE post-to-CQE time and 64 KiB WRITE bandwidth.
//
//   build/<preset>/tests/dext/emuhost/bench_emud [rounds]
//
// Compares, in one run:
//   - latency with the daemon's doorbell watcher always polling (--spin-us 1000000) against a
//     watcher that sleeps as soon as it finds nothing (--spin-us 0), so every doorbell pays the
//     kick (uapi/doorbell.h): what the sleep costs a client;
//   - bandwidth (64 KiB, MTU 4096, 8 in flight) between two clients of one daemon (frames loop
//     through its own UDP socket) against two daemons on their own wires.
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "dext/emuhost/raw_client.h"

using namespace melon::dext::rawclient;
using Clock = std::chrono::steady_clock;

namespace {

struct Lat {
  double p50, p99, kicked;  // kicked: the fraction of doorbells that found the watcher asleep
};

[[noreturn]] void no_completion() {
  fprintf(stderr, "bench_emud: no completion\n");
  exit(1);
}

Lat latency(Endpoint& a, Endpoint& b, int rounds) {
  std::vector<double> us;
  us.reserve(size_t(rounds));
  uint32_t k0 = melon::uapi::uar_watch(a.uar_page)->kick;
  for (int i = 0; i < rounds; i++) {
    auto t0 = Clock::now();
    a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 8, a.lkey, uint64_t(uintptr_t(b.buf)), b.rkey);
    if (!a.poll_cq()) no_completion();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  double kicked = double(melon::uapi::uar_watch(a.uar_page)->kick - k0) / rounds;
  std::sort(us.begin(), us.end());
  return Lat{us[us.size() / 2], us[us.size() * 99 / 100], kicked};
}

double bandwidth_mbs(Endpoint& a, Endpoint& b, int messages) {
  constexpr uint32_t kMsg = 64 * 1024, kDepth = 8;
  auto t0 = Clock::now();
  int posted = 0, done = 0;
  while (done < messages) {
    while (posted < messages && posted - done < int(kDepth)) {
      a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), kMsg, a.lkey, uint64_t(uintptr_t(b.buf)),
                  b.rkey);
      posted++;
    }
    if (!a.poll_cq()) no_completion();
    done++;
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return double(messages) * kMsg / s / 1e6;
}

// A connected pair, MTU 4096, with 1 MiB buffers.
void pair(Endpoint& a, Endpoint& b, const Daemon& da, const Daemon& db) {
  a.build(da.sock, 1 << 20);
  b.build(db.sock, 1 << 20);
  a.path_mtu = b.path_mtu = 5;  // IBV_MTU_4096
  a.connect(b);
  b.connect(a);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 2000;
  Daemon poll_a, poll_b, sleepy;
  if (!poll_a.start("127.0.8.5", "1000000") || !poll_b.start("127.0.8.6", "1000000") ||
      !sleepy.start("127.0.8.7", "0")) {
    fprintf(stderr, "bench_emud: melon-emud did not start\n");
    return 1;
  }
  Lat polling, sleeping;
  double one_bw, two_bw;
  {
    Endpoint a, b;
    pair(a, b, poll_a, poll_a);
    polling = latency(a, b, rounds);
    one_bw = bandwidth_mbs(a, b, rounds / 4);
  }
  {
    Endpoint a, b;
    pair(a, b, sleepy, sleepy);
    sleeping = latency(a, b, rounds);
  }
  {
    Endpoint a, b;
    pair(a, b, poll_a, poll_b);
    two_bw = bandwidth_mbs(a, b, rounds / 4);
  }
  printf("melon-emud data path, raw WQEs from the client, %d rounds\n", rounds);
  printf("| case | p50 | p99 | doorbells that kicked |\n|---|---:|---:|---:|\n");
  printf("| 8 B WRITE post->CQE, watcher polling | %.1f us | %.1f us | %.0f %% |\n", polling.p50, polling.p99,
         100 * polling.kicked);
  printf("| 8 B WRITE post->CQE, watcher sleeping | %.1f us | %.1f us | %.0f %% |\n", sleeping.p50, sleeping.p99,
         100 * sleeping.kicked);
  printf("ratio sleeping/polling p50: %.2f\n", sleeping.p50 / polling.p50);
  printf("64 KiB WRITE, 8 in flight: one daemon %.0f MB/s, two daemons %.0f MB/s, ratio %.2f\n", one_bw, two_bw,
         two_bw / one_bw);
  printf("rerun: %s %d\n", argv[0], rounds);
  int rc = poll_a.stop() | poll_b.stop() | sleepy.stop();
  if (rc) fprintf(stderr, "bench_emud: a daemon did not stop cleanly\n");
  return rc ? 1 : 0;
}
