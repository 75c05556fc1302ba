// Transport engine benchmarks on the host kit (tests/common/host_kit.h), timed in thread CPU time so that a
// loaded machine slows the run without changing the figures much.
//
//   bench_engine [message_bytes] [messages]
//     Throughput: two engines joined by an in-memory wire of whole RoCEv2 frames (serialisation,
//     ICRC on send, ICRC check on receive); packets/s and GB/s beside memcpy in the same process.
//   bench_engine qps [iterations]
//     Cost per post and per received packet with 1, 100 and 1000 QPs on each engine. One QP
//     carries the traffic; every other QP has a request outstanding (so a retransmit timer
//     armed), as on a busy host. "post" is post_send + next_deadline (what a host does after every
//     verb); "receive" is receive() per frame + one tick() + next_deadline per batch of 32.
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/host_kit.h"
#include "rc/engine.h"

using namespace melon::rc;
namespace kit = melon::kit;

namespace {

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

void connect(Engine& e, uint32_t qpn, uint32_t peer, uint8_t mtu, uint8_t timeout = 14) {
  kit::QpParams p;
  p.path_mtu = mtu;
  p.dest_qpn = peer;
  p.timeout = timeout;
  p.max_rd_atomic = p.max_dest_rd_atomic = 16;
  p.av = kit::av_v4(2, 3);
  kit::bring_up(e, qpn, p);
}

// Hands every frame queued on `from` to `to` (ICRC checked) and recycles the buffers.
size_t pump(kit::FrameWire& from, Engine& to) {
  size_t n = 0;
  while (!from.frames.empty()) {
    std::vector<uint8_t> f = std::move(from.frames.front());
    from.frames.pop_front();
    kit::deliver(to, f);
    from.recycle(std::move(f));
    ++n;
  }
  return n;
}

double memcpy_gbps(size_t size) {
  std::vector<uint8_t> a(size, 1), b(size);
  size_t total = 0;
  double t0 = cpu_now();
  while (cpu_now() - t0 < 0.3) {
    memcpy(b.data(), a.data(), size);
    a[total % size] = uint8_t(total);
    total += size;
  }
  return total / (cpu_now() - t0) / 1e9;
}

// Two engines on the kit with any address accepted (no key checks to pay for), frames not parsed
// back by the wire (the receiving engine checks them).
struct Bench {
  kit::FrameWire la, lb;
  kit::Memory ma, mb;
  kit::ManualClock clock;
  Engine a{Host{ma, la, clock}}, b{Host{mb, lb, clock}};
  kit::Cq sa, ra, sb, rb;
  Bench() {
    la.check = lb.check = false;
    ma.accept_any(true);
    mb.accept_any(true);
  }
  void pair(uint32_t* qa, uint32_t* qb, uint8_t mtu, uint8_t timeout = 14) {
    QpInit init;
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    init.send_cq = &sa;
    init.recv_cq = &ra;
    a.create_qp(init, qa);
    init.send_cq = &sb;
    init.recv_cq = &rb;
    b.create_qp(init, qb);
    connect(a, *qa, *qb, mtu, timeout);
    connect(b, *qb, *qa, mtu, timeout);
  }
};

void run(const char* name, WrOpcode op, uint8_t mtu, size_t msg, size_t count, double memcpy_bw) {
  Bench x;
  uint32_t qa, qb;
  x.pair(&qa, &qb, mtu);
  std::vector<uint8_t> src(msg, 0x5a), dst(msg);
  Sge s{uint64_t(uintptr_t(src.data())), uint32_t(msg), 1};
  Sge r{uint64_t(uintptr_t(dst.data())), uint32_t(msg), 1};
  SendWr w;
  w.opcode = op;
  w.sg_list = op == WrOpcode::rdma_read ? &r : &s;
  w.num_sge = 1;
  w.send_flags = kSignaled;
  w.remote_addr = uint64_t(uintptr_t(op == WrOpcode::rdma_read ? src.data() : dst.data()));
  RecvWr rw;
  rw.sg_list = &r;
  rw.num_sge = 1;
  double t0 = cpu_now();
  size_t posted = 0;
  while (x.sa.total() < count) {
    while (posted < count && posted - x.sa.total() < 64) {
      if (op == WrOpcode::send) x.b.post_recv(qb, rw);
      x.a.post_send(qa, w);
      ++posted;
    }
    pump(x.la, x.b);
    pump(x.lb, x.a);
    x.sa.drain();
    x.rb.drain();
  }
  double sec = cpu_now() - t0;
  uint64_t pkts = x.la.packets + x.lb.packets;
  double gbps = double(msg) * count / sec / 1e9;
  std::printf("%-6s mtu %4u msg %8zu: %9.0f packets/s  %6.2f GB/s  (memcpy %.2f GB/s, ratio %.3f)%s\n", name,
              128u << mtu, msg, pkts / sec, gbps, memcpy_bw, gbps / memcpy_bw, x.sa.errors() ? "  ERRORS" : "");
}

void scaling(size_t nqps, size_t iterations) {
  Bench x;
  std::vector<uint32_t> qa(nqps), qb(nqps);
  // Idle QPs: one 64-byte WRITE each whose frame is dropped, so each keeps a retransmit timer
  // armed (timeout 20: about 4 s of virtual time, which never passes here).
  std::vector<uint8_t> src(4096, 1), dst(4096);
  Sge s{uint64_t(uintptr_t(src.data())), 64, 1};
  SendWr w;
  w.opcode = WrOpcode::rdma_write;
  w.sg_list = &s;
  w.num_sge = 1;
  w.remote_addr = uint64_t(uintptr_t(dst.data()));
  for (size_t i = 0; i < nqps; ++i) {
    x.pair(&qa[i], &qb[i], 5, 20);
    if (i) x.a.post_send(qa[i], w);
  }
  x.la.frames.clear();
  w.send_flags = kSignaled;
  double t_post = 0, t_rx = 0;
  uint64_t posts = 0, rx_packets = 0;
  for (size_t it = 0; it < iterations; ++it) {
    double t0 = cpu_now();
    for (int k = 0; k < 32; ++k) {
      x.a.post_send(qa[0], w);
      (void)x.a.next_deadline();
    }
    t_post += cpu_now() - t0;
    posts += 32;
    // B receives the batch (and ACKs), then A receives the ACKs: each a batch as the UDP transport
    // runs one (receive per frame, then tick and next_deadline once).
    for (auto [from, to] : {std::pair{&x.la, &x.b}, std::pair{&x.lb, &x.a}}) {
      t0 = cpu_now();
      size_t n = pump(*from, *to);
      to->tick();
      (void)to->next_deadline();
      t_rx += cpu_now() - t0;
      rx_packets += n;
    }
    x.sa.drain();
  }
  std::printf("%5zu QPs: post %7.1f ns   receive %7.1f ns/packet   (%llu posts, %llu packets)%s\n", nqps,
              t_post / double(posts) * 1e9, t_rx / double(rx_packets) * 1e9, (unsigned long long)posts,
              (unsigned long long)rx_packets, x.sa.errors() ? "  ERRORS" : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && !strcmp(argv[1], "qps")) {
    size_t iterations = argc > 2 ? size_t(atol(argv[2])) : 2000;
    std::printf("engine cost per post and per received packet against the number of QPs (thread CPU time)\n");
    for (size_t n : {1, 100, 1000}) scaling(n, iterations);
    std::printf("rerun: build/release/tools/bench_engine qps %zu\n", iterations);
    return 0;
  }
  size_t msg = argc > 1 ? size_t(atol(argv[1])) : 65536;
  size_t count = argc > 2 ? size_t(atol(argv[2])) : 4000;
  double bw = memcpy_gbps(msg);
  std::printf("engine over an in-memory wire, whole frames with ICRC both ways; %zu messages each (thread CPU time)\n",
              count);
  for (uint8_t mtu : {3, 5}) {
    run("WRITE", WrOpcode::rdma_write, mtu, msg, count, bw);
    run("SEND", WrOpcode::send, mtu, msg, count, bw);
    run("READ", WrOpcode::rdma_read, mtu, msg, count, bw);
  }
  std::printf("rerun: build/release/tools/bench_engine %zu %zu\n", msg, count);
  return 0;
}
