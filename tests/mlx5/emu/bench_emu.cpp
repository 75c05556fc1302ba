// Benchmark (not a test): 64 KiB RDMA WRITEs between two emulated ConnectX-4 Lx over the in-memory
// link, against the same transfer between two soft devices over UDP loopback, in the same run.
// Both keep `depth` WRITEs in flight, MTU 4096, and count completed bytes over wall time.
//   cmake --preset release && cmake --build build/release --target bench_emu
//   build/release/tests/mlx5/emu/bench_emu [seconds=3] [depth=8]
// Results: docs/performance.md. The goal is emulated >= 0.5x soft.
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "harness.h"
#include "mlx5/emu/wire.h"

using namespace melon::mlx5::emu;
using namespace melon::mlx5::emu::testing;
namespace prm = melon::mlx5::prm;

namespace {

constexpr uint32_t kMsg = 64 * 1024;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ---- two emulated HCAs ----
struct EmuSide {
  EmuSide(MemoryLink& link, uint8_t o) : port(link.add_port()), h(cfg(o), port) { link.attach(port, &h.dev); }
  EmuSide(UdpWire& w, uint8_t o) : port(&w), h(cfg(o, 0), port, true) { w.attach(&h.dev); }
  static DeviceConfig cfg(uint8_t o, uint32_t init_delay_ns = 2'000'000) {
    DeviceConfig c;
    c.mac[5] = o;
    c.init_delay_ns = init_delay_ns;
    return c;
  }
  FramePort* port;
  Harness h;
  Harness::CqRing cq;
  Harness::QpRing qp;
  TestHost::Buffer mem;
  uint32_t key = 0;
  uint8_t ip[4] = {10, 9, 0, 0};
};

void emu_connect(EmuSide& s, EmuSide& peer) {
  namespace op = prm::opcode;
  s.h.transition(op::RST2INIT_QP, s.qp.qpn, [](prm::qpc::view q) {
    q.at(prm::qpc::primary_address_path).set(prm::ads::vhca_port_num, 1);
    q.set(prm::qpc::rwe, 1).set(prm::qpc::rre, 1);
  });
  uint8_t dgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, peer.ip[0], peer.ip[1], peer.ip[2], peer.ip[3]};
  uint32_t remote = peer.qp.qpn;
  s.h.transition(op::INIT2RTR_QP, s.qp.qpn, [&](prm::qpc::view q) {
    q.set(prm::qpc::mtu, prm::qpc_mtu::MTU_4K_BYTES).set(prm::qpc::remote_qpn, remote).set(prm::qpc::log_rra_max, 3);
    q.at(prm::qpc::primary_address_path).set(prm::ads::hop_limit, 64).set_bytes(prm::ads::rgid_rip, dgid);
  });
  s.h.transition(op::RTR2RTS_QP, s.qp.qpn, [](prm::qpc::view q) {
    q.set(prm::qpc::retry_count, 7).set(prm::qpc::rnr_retry, 7).set(prm::qpc::log_sra_max, 3);
    q.at(prm::qpc::primary_address_path).set(prm::ads::ack_timeout, 14);
  });
}

// over_udp: each device on its own UDP socket (127.0.6.4 and .5), both serviced by this thread.
double run_emu(double secs, int depth, bool over_udp) {
  MemoryLink link;
  UdpWire wa(0x7f000604), wb(0x7f000605);
  if (over_udp && (wa.open() || wb.open())) {
    fprintf(stderr, "cannot bind 127.0.6.4/5:4791\n");
    exit(1);
  }
  std::unique_ptr<EmuSide> pa(over_udp ? new EmuSide(wa, 4) : new EmuSide(link, 1));
  std::unique_ptr<EmuSide> pb(over_udp ? new EmuSide(wb, 5) : new EmuSide(link, 2));
  EmuSide &a = *pa, &b = *pb;
  if (over_udp)
    a.ip[0] = b.ip[0] = 127, a.ip[1] = b.ip[1] = 0, a.ip[2] = b.ip[2] = 6, a.ip[3] = 4, b.ip[3] = 5;
  else
    a.ip[3] = 1, b.ip[3] = 2;
  for (EmuSide* s : {&a, &b}) {
    s->h.bring_up();
    s->h.set_gid(0, s->ip);
    s->h.enable_roce();
    s->cq = s->h.create_cq(8);
    s->qp.log_sq = 8;
    s->h.create_qp_raw(s->qp, prm::qpc_st::RC, s->cq, s->cq);
    s->mem = s->h.host.alloc(kMsg * 2);
    s->key = s->h.create_mkey(s->mem, kMsg * 2);
  }
  emu_connect(a, b);
  emu_connect(b, a);
  Harness::SendOpts o;
  o.raddr = reinterpret_cast<uint64_t>(b.mem.va), o.rkey = b.key;
  std::vector<Harness::Seg> sg{{reinterpret_cast<uint64_t>(a.mem.va), kMsg, a.key}};
  int inflight = 0;
  uint64_t done = 0;
  auto t0 = Clock::now();
  while (seconds_since(t0) < secs) {
    while (inflight < depth) a.h.post_send(a.qp, prm::wqe_opcode::RDMA_WRITE, sg, o), ++inflight;
    if (over_udp) wa.poll(0), wb.poll(0);
    while (int(a.h.dev.service()) | int(b.h.dev.service())) {  // both, every round
      if (over_udp) wa.poll(0), wb.poll(0);
    }
    while (const uint8_t* e = a.h.poll_cq(a.cq)) {
      if (prm::get(e, prm::cqe64::opcode) != prm::cqe_opcode::REQ) {
        fprintf(stderr, "emu: error CQE syndrome 0x%x\n", unsigned(prm::get(e, prm::err_cqe::syndrome)));
        exit(1);
      }
      --inflight, ++done;
    }
  }
  return double(done) * kMsg / seconds_since(t0);
}

// ---- two soft devices ----
double run_soft(double secs, int depth) {
  setenv("MELON_SOFT_AUTO", "0", 1);
  setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
  setenv("MELON_SOFT_DEVICES", "bench0=127.0.6.2,bench1=127.0.6.3", 1);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context *ca = nullptr, *cb = nullptr;
  for (int i = 0; i < n; ++i) {
    if (!strcmp(ibv_get_device_name(list[i]), "bench0")) ca = ibv_open_device(list[i]);
    if (!strcmp(ibv_get_device_name(list[i]), "bench1")) cb = ibv_open_device(list[i]);
  }
  if (!ca || !cb) {
    fprintf(stderr, "soft devices not available\n");
    exit(1);
  }
  struct S {
    ibv_context* ctx;
    ibv_pd* pd;
    ibv_cq* cq;
    ibv_qp* qp;
    ibv_mr* mr;
    std::vector<uint8_t> buf = std::vector<uint8_t>(kMsg * 2);
  } a{ca, nullptr, nullptr, nullptr, nullptr}, b{cb, nullptr, nullptr, nullptr, nullptr};
  for (S* s : {&a, &b}) {
    s->pd = ibv_alloc_pd(s->ctx);
    s->cq = ibv_create_cq(s->ctx, 256, nullptr, nullptr, 0);
    s->mr = ibv_reg_mr(s->pd, s->buf.data(), s->buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = s->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 256;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    s->qp = ibv_create_qp(s->pd, &ia);
  }
  auto connect = [](S& s, S& peer, uint8_t last) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    ibv_modify_qp(s.qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = IBV_MTU_4096;
    at.dest_qp_num = peer.qp->qp_num;
    at.max_dest_rd_atomic = 4;
    at.ah_attr.is_global = 1;
    at.ah_attr.port_num = 1;
    const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 6, last};
    memcpy(at.ah_attr.grh.dgid.raw, gid, 16);
    ibv_modify_qp(s.qp, &at,
                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    at.qp_state = IBV_QPS_RTS;
    at.timeout = 14, at.retry_cnt = 7, at.rnr_retry = 7, at.max_rd_atomic = 4;
    ibv_modify_qp(
        s.qp, &at,
        IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  };
  connect(a, b, 3);
  connect(b, a, 2);
  ibv_sge sge{uint64_t(uintptr_t(a.buf.data())), kMsg, a.mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = uint64_t(uintptr_t(b.buf.data()));
  wr.wr.rdma.rkey = b.mr->rkey;
  int inflight = 0;
  uint64_t done = 0;
  auto t0 = Clock::now();
  ibv_wc wc[16];
  while (seconds_since(t0) < secs) {
    while (inflight < depth && ibv_post_send(a.qp, &wr, &bad) == 0) ++inflight;
    int k = ibv_poll_cq(a.cq, 16, wc);
    for (int i = 0; i < k; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        fprintf(stderr, "soft: %s\n", ibv_wc_status_str(wc[i].status));
        exit(1);
      }
      --inflight, ++done;
    }
  }
  double rate = double(done) * kMsg / seconds_since(t0);
  for (S* s : {&a, &b}) {
    ibv_destroy_qp(s->qp);
    ibv_dereg_mr(s->mr);
    ibv_destroy_cq(s->cq);
    ibv_dealloc_pd(s->pd);
    ibv_close_device(s->ctx);
  }
  ibv_free_device_list(list);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 3.0;
  int depth = argc > 2 ? atoi(argv[2]) : 8;
  double soft = run_soft(secs, depth);
  double emu = run_emu(secs, depth, false);
  double emu_udp = run_emu(secs, depth, true);
  printf("64 KiB RDMA WRITE, %d in flight, MTU 4096, %.1f s each\n", depth, secs);
  printf("  two soft devices (UDP loopback):            %8.1f MB/s\n", soft / 1e6);
  printf("  two emulated ConnectX-4 Lx (memory link):    %8.1f MB/s  emulated / soft = %.2f\n", emu / 1e6, emu / soft);
  printf("  two emulated ConnectX-4 Lx (UDP loopback):   %8.1f MB/s  emulated / soft = %.2f\n", emu_udp / 1e6,
         emu_udp / soft);
  printf("  goal: emulated / soft >= 0.5\n");
  printf("rerun: build/release/tests/mlx5/emu/bench_emu %.0f %d\n", secs, depth);
  return 0;
}
