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

#include "rc/engine.h"
#include "rc/wire.h"

using namespace melon::rc;
using WallClock = std::chrono::steady_clock;

namespace {

struct FlatMemory : HostMemory {
  MemStatus map(KeyKind, uint32_t, uint32_t, uint64_t a, uint32_t len, uint32_t, Span* first) override {
    *first = Span{reinterpret_cast<uint8_t*>(a), len};
    return MemStatus::ok;
  }
};

struct FixedClock : melon::rc::Clock {
  uint64_t now() override { return 1; }
};

struct CountCq : CompletionSink {
  size_t n = 0, bad = 0;
  bool push(const Wc& wc) override {
    ++n;
    bad += wc.status != WcStatus::success;
    return true;
  }
};

// Frames queue here; the pump hands them to the other engine. Buffers are recycled (no allocation
// per packet once warm).
struct Wire : FrameLink {
  std::deque<std::vector<uint8_t>> q, pool;
  uint64_t packets = 0, bytes = 0;
  void transmit(const TxPacket& t) override {
    std::vector<uint8_t> f;
    if (!pool.empty()) {
      f.swap(pool.back());
      pool.pop_back();
    }
    f.resize(frame_size(t, false));
    frame_from_tx(t, f.data());
    ++packets;
    bytes += t.payload_len;
    q.push_back(std::move(f));
  }
};

void connect(Engine& e, uint32_t qpn, uint32_t peer, uint8_t mtu) {
  QpAttr a;
  a.qp_state = QpState::init;
  a.qp_access_flags = kRemoteWrite | kRemoteRead | kRemoteAtomic;
  e.modify_qp(qpn, a, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrAccessFlags);
  a.qp_state = QpState::rtr;
  a.path_mtu = mtu;
  a.dest_qp_num = peer;
  a.max_dest_rd_atomic = 16;
  a.av.sgid[10] = a.av.sgid[11] = a.av.dgid[10] = a.av.dgid[11] = 0xff;
  a.av.sgid[15] = 2;
  a.av.dgid[15] = 3;
  e.modify_qp(
      qpn, a,
      kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic | kAttrMinRnrTimer);
  a.qp_state = QpState::rts;
  a.max_rd_atomic = 16;
  e.modify_qp(qpn, a, kAttrState | kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic);
}

void pump(Wire& from, Engine& to) {
  while (!from.q.empty()) {
    std::vector<uint8_t> f = std::move(from.q.front());
    from.q.pop_front();
    melon::roce::IpUdp ip;
    const uint8_t* roce;
    size_t len;
    if (frame_to_rx(f.data(), f.size(), ip, &roce, &len) == melon::roce::ParseError::ok) to.receive(ip, roce, len);
    from.pool.push_back(std::move(f));
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
  Wire la, lb;
  FlatMemory ma, mb;
  FixedClock clock;
  Engine a(Host{ma, la, clock}), b(Host{mb, lb, clock});
  CountCq sa, ra, sb, rb;
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
  while (sa.n < count) {
    while (posted < count && posted - sa.n < 64) {
      if (op == WrOpcode::send) b.post_recv(qb, rw);
      a.post_send(qa, w);
      ++posted;
    }
    pump(la, b);
    pump(lb, a);
  }
  double sec = std::chrono::duration<double>(WallClock::now() - t0).count();
  uint64_t pkts = la.packets + lb.packets;
  double gbps = double(msg) * count / sec / 1e9;
  std::printf("%-6s mtu %4u msg %8zu: %9.0f packets/s  %6.2f GB/s  (memcpy %.2f GB/s, ratio %.3f)%s\n", name,
              128u << mtu, msg, pkts / sec, gbps, memcpy_bw, gbps / memcpy_bw, sa.bad ? "  ERRORS" : "");
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
