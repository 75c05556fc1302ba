// Transport engine throughput in simulation: two engines joined by an in-memory link that carries
// whole RoCEv2 frames (serialisation, ICRC on send, ICRC check on receive). Prints packets/s and
// GB/s beside memcpy bandwidth measured in the same process, and their ratio.
//   build/release/tools/bench_engine [message_bytes] [messages]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "host_kit/host_kit.h"
#include "rc/engine.h"

using namespace melon::rc;
namespace kit = melon::kit;
using WallClock = std::chrono::steady_clock;

namespace {

void connect(Engine& e, uint32_t qpn, uint32_t peer, uint8_t mtu) {
  kit::QpParams p;
  p.path_mtu = mtu;
  p.dest_qpn = peer;
  p.max_rd_atomic = p.max_dest_rd_atomic = 16;
  p.av = kit::av_v4(2, 3);
  kit::bring_up(e, qpn, p);
}

// Hands every frame queued on `from` to `to` (ICRC checked) and recycles the buffers.
void pump(kit::FrameWire& from, Engine& to) {
  while (!from.frames.empty()) {
    std::vector<uint8_t> f = std::move(from.frames.front());
    from.frames.pop_front();
    kit::deliver(to, f);
    from.recycle(std::move(f));
  }
}

double memcpy_gbps(size_t size) {
  std::vector<uint8_t> a(size, 1), b(size);
  size_t total = 0;
  auto t0 = WallClock::now();
  while (std::chrono::duration<double>(WallClock::now() - t0).count() < 0.3) {
    memcpy(b.data(), a.data(), size);
    a[total % size] = uint8_t(total);
    total += size;
  }
  return total / std::chrono::duration<double>(WallClock::now() - t0).count() / 1e9;
}

void run(const char* name, WrOpcode op, uint8_t mtu, size_t msg, size_t count, double memcpy_bw) {
  // The host kit with any address accepted (no key checks to pay for), frames not parsed back.
  kit::FrameWire la, lb;
  la.check = lb.check = false;
  kit::Memory ma, mb;
  ma.accept_any(true);
  mb.accept_any(true);
  kit::ManualClock clock;
  Engine a(Host{ma, la, clock}), b(Host{mb, lb, clock});
  kit::Cq sa, ra, sb, rb;
  QpInit init;
  init.cap.max_send_wr = 256;
  init.send_cq = &sa;
  init.recv_cq = &ra;
  uint32_t qa, qb;
  a.create_qp(init, &qa);
  init.send_cq = &sb;
  init.recv_cq = &rb;
  init.cap.max_recv_wr = 256;
  b.create_qp(init, &qb);
  connect(a, qa, qb, mtu);
  connect(b, qb, qa, mtu);
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
  auto t0 = WallClock::now();
  size_t posted = 0;
  while (sa.total() < count) {
    while (posted < count && posted - sa.total() < 64) {
      if (op == WrOpcode::send) b.post_recv(qb, rw);
      a.post_send(qa, w);
      ++posted;
    }
    pump(la, b);
    pump(lb, a);
    sa.drain();
    ra.drain();
    sb.drain();
    rb.drain();
  }
  double sec = std::chrono::duration<double>(WallClock::now() - t0).count();
  uint64_t pkts = la.packets + lb.packets;
  double gbps = double(msg) * count / sec / 1e9;
  std::printf("%-6s mtu %4u msg %8zu: %9.0f packets/s  %6.2f GB/s  (memcpy %.2f GB/s, ratio %.3f)%s\n", name,
              128u << mtu, msg, pkts / sec, gbps, memcpy_bw, gbps / memcpy_bw, sa.errors() ? "  ERRORS" : "");
}

}  // namespace

int main(int argc, char** argv) {
  size_t msg = argc > 1 ? size_t(atol(argv[1])) : 65536;
  size_t count = argc > 2 ? size_t(atol(argv[2])) : 4000;
  double bw = memcpy_gbps(msg);
  std::printf("engine over an in-memory link, whole frames with ICRC both ways; %zu messages each\n", count);
  for (uint8_t mtu : {3, 5}) {
    run("WRITE", WrOpcode::rdma_write, mtu, msg, count, bw);
    run("SEND", WrOpcode::send, mtu, msg, count, bw);
    run("READ", WrOpcode::rdma_read, mtu, msg, count, bw);
  }
  std::printf("rerun: build/release/tools/bench_engine %zu %zu\n", msg, count);
  return 0;
}
