// ./melon demo: two endpoints on this machine (two processes, loopback, soft provider) run a
// datapath matrix through the standard verbs API — SEND/RECV, WRITE, WRITE_IMM, READ, CMP_SWAP,
// FETCH_ADD over sizes 1 B .. 1 MiB — verify every byte, and print operation x size: Gbit/s, us,
// verified. The server is a forked child; the two sides exchange QP data over a socketpair.
//
//   melon-demo [--server-dev NAME] [--client-dev NAME] [--iters N]
// With no device names it uses the first two devices whose first GID is IPv4 on 127.0.0.0/8.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kBuf = 1 << 20;
constexpr int kDepth = 64;

struct Dest {
  uint32_t qpn, psn, rkey;
  uint64_t addr, atomic_addr;
  uint8_t gid[16];
  uint32_t mtu;
};

// Control messages on the socketpair.
struct Msg {
  uint32_t cmd;  // kPrepare, kCheck, kDone
  uint32_t op;
  uint32_t size;
  uint32_t iters;
  uint64_t value;  // pattern seed / atomic expectation / result
  uint32_t ok;
};
enum : uint32_t { kPrepare = 1, kCheck = 2, kQuit = 3 };
enum Op : uint32_t { kSend, kWrite, kWriteImm, kRead, kCmpSwap, kFetchAdd, kOps };
const char* const kOpNames[] = {"SEND/RECV", "WRITE", "WRITE_IMM", "READ", "CMP_SWAP", "FETCH_ADD"};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "melon-demo: %s failed: %s\n", what, std::strerror(errno));
  std::exit(2);
}

void xfer(int fd, void* p, size_t n, bool send) {
  auto* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = send ? write(fd, c, n) : read(fd, c, n);
    if (r <= 0) die(send ? "control write" : "control read");
    c += r;
    n -= size_t(r);
  }
}

uint8_t pattern(uint64_t seed, size_t i) { return uint8_t((seed * 131 + i * 7 + (i >> 8)) & 0xff); }

struct Endpoint {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(2 * kBuf + 64);
  uint8_t* src() { return buf.data(); }
  uint8_t* dst() { return buf.data() + kBuf; }
  uint64_t* atomic() { return reinterpret_cast<uint64_t*>(buf.data() + 2 * kBuf); }
  uint64_t* atomic_result() { return atomic() + 1; }
  ibv_port_attr port{};
  int gid_index = 0;

  void open(const char* name) {
    int n;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) die("ibv_get_device_list");
    for (int i = 0; i < n && !ctx; ++i)
      if (!std::strcmp(ibv_get_device_name(list[i]), name)) ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx) {
      std::fprintf(stderr, "melon-demo: device %s not found\n", name);
      std::exit(2);
    }
    if (ibv_query_port(ctx, 1, &port)) die("ibv_query_port");
    pd = ibv_alloc_pd(ctx);
    if (!pd) die("ibv_alloc_pd");
    mr = ibv_reg_mr(
        pd, buf.data(), buf.size(),
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    if (!mr) die("ibv_reg_mr");
    cq = ibv_create_cq(ctx, 4 * kDepth, nullptr, nullptr, 0);
    if (!cq) die("ibv_create_cq");
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = kDepth;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    qp = ibv_create_qp(pd, &ia);
    if (!qp) die("ibv_create_qp");
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
  }

  Dest local() {
    Dest d{};
    d.qpn = qp->qp_num;
    d.psn = uint32_t(getpid() * 7919) & 0xffffff;
    d.rkey = mr->rkey;
    d.addr = uint64_t(uintptr_t(buf.data()));
    d.atomic_addr = uint64_t(uintptr_t(atomic()));
    union ibv_gid g;
    if (ibv_query_gid(ctx, 1, gid_index, &g)) die("ibv_query_gid");
    std::memcpy(d.gid, g.raw, 16);
    d.mtu = port.active_mtu;
    return d;
  }

  void connect(const Dest& me, const Dest& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = ibv_mtu(me.mtu < peer.mtu ? me.mtu : peer.mtu);
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.sgid_index = uint8_t(gid_index);
    std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      die("RTR");
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = me.psn;
    // 1 s (4.096 us << 18): both ends are processes on this machine, so an ACK is as late as the
    // scheduler makes it; 67 ms (14) x 8 tries gave up within stalls of a loaded machine.
    a.timeout = 18;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_MAX_QP_RD_ATOMIC))
      die("RTS");
  }

  // Set by a completion error (an RC QP in error completes nothing more) or by kStallSeconds with
  // no completion (the peer's QP failed): the matrix stops, rather than wait for ever.
  bool broken = false;
  static constexpr int kStallSeconds = 30;

  // Waits for n completions; returns false if any failed, or if the endpoint is (or becomes) broken.
  bool wait(int n, std::vector<ibv_wc>* out = nullptr) {
    bool ok = true;
    ibv_wc wc[16];
    auto last = std::chrono::steady_clock::now();
    while (n > 0 && !broken) {
      int got = ibv_poll_cq(cq, 16, wc);
      if (got < 0) die("ibv_poll_cq");
      auto now = std::chrono::steady_clock::now();
      if (got) last = now;
      if (now - last > std::chrono::seconds(kStallSeconds)) {
        std::fprintf(stderr, "melon-demo: no completion for %d s\n", kStallSeconds);
        broken = true;
      }
      for (int i = 0; i < got; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          std::fprintf(stderr, "melon-demo: completion error: %s (wr %llu)\n", ibv_wc_status_str(wc[i].status),
                       (unsigned long long)wc[i].wr_id);
          broken = true;
        }
        if (out) out->push_back(wc[i]);
      }
      n -= got;
    }
    return ok && !broken;
  }

  void post_recv(uint8_t* at, uint32_t len, uint64_t id) {
    ibv_sge s{uint64_t(uintptr_t(at)), len, mr->lkey};
    ibv_recv_wr w{};
    ibv_recv_wr* bad;
    w.wr_id = id;
    w.sg_list = &s;
    w.num_sge = 1;
    if (int rc = ibv_post_recv(qp, &w, &bad)) {
      errno = rc;
      die("ibv_post_recv");
    }
  }
};

// ---- server: prepares memory and receives, then verifies what arrived
int server(int fd, const char* dev) {
  Endpoint e;
  e.open(dev);
  Dest me = e.local(), peer;
  xfer(fd, &me, sizeof me, true);
  xfer(fd, &peer, sizeof peer, false);
  e.connect(me, peer);
  for (;;) {
    Msg m;
    xfer(fd, &m, sizeof m, false);
    if (m.cmd == kQuit) break;
    if (m.cmd == kPrepare) {
      std::memset(e.dst(), 0, m.size);
      if (m.op == kRead)
        for (size_t i = 0; i < m.size; ++i) e.src()[i] = pattern(m.value, i);
      if (m.op == kCmpSwap || m.op == kFetchAdd) *e.atomic() = m.value;
      if (m.op == kSend || m.op == kWriteImm)
        for (uint32_t i = 0; i < m.iters; ++i) {
          if (i >= kDepth) break;
          e.post_recv(e.dst(), m.op == kSend ? m.size : 0, i);
        }
      m.ok = 1;
      xfer(fd, &m, sizeof m, true);
      if (m.op == kSend || m.op == kWriteImm) {
        // Keep the receive queue topped up while the client streams.
        std::vector<ibv_wc> wcs;
        uint32_t done = 0, posted = m.iters < kDepth ? m.iters : kDepth;
        bool ok = true;
        while (done < m.iters && !e.broken) {
          wcs.clear();
          ok &= e.wait(1, &wcs);
          for (auto& wc : wcs) {
            ++done;
            bool want_imm = m.op == kWriteImm;
            ok &= wc.opcode == (want_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV);
            ok &= wc.byte_len == m.size;
            ok &= !want_imm || ((wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == uint32_t(m.value));
            if (posted < m.iters) e.post_recv(e.dst(), m.op == kSend ? m.size : 0, posted++);
          }
        }
        Msg r = m;
        r.ok = ok;
        xfer(fd, &r, sizeof r, true);
      }
    } else if (m.cmd == kCheck) {
      bool ok = true;
      if (m.op == kSend || m.op == kWrite || m.op == kWriteImm)
        for (size_t i = 0; i < m.size && ok; ++i) ok = e.dst()[i] == pattern(m.value, i);
      if (m.op == kCmpSwap || m.op == kFetchAdd) ok = *e.atomic() == m.value;
      m.ok = ok;
      xfer(fd, &m, sizeof m, true);
    }
  }
  ibv_destroy_qp(e.qp);
  ibv_destroy_cq(e.cq);
  ibv_dereg_mr(e.mr);
  ibv_dealloc_pd(e.pd);
  ibv_close_device(e.ctx);
  return 0;
}

struct Result {
  double gbps = 0, usec = 0;
  bool verified = false;
};

// ---- client: drives each cell of the matrix
Result run_cell(int fd, Endpoint& e, const Dest& peer, Op op, uint32_t size, uint32_t iters) {
  Result res;
  uint64_t seed = uint64_t(op) * 1000003 + size;
  bool atomic = op == kCmpSwap || op == kFetchAdd;
  uint64_t atomic_start = 0x1000 + seed;
  Msg m{kPrepare, op, size, iters, atomic ? atomic_start : seed, 0};
  xfer(fd, &m, sizeof m, true);
  xfer(fd, &m, sizeof m, false);
  for (size_t i = 0; i < size; ++i) e.src()[i] = pattern(seed, i);
  std::memset(e.dst(), 0, size);

  auto post = [&](uint32_t i, bool signaled) {
    ibv_sge s{uint64_t(uintptr_t(op == kRead ? e.dst() : e.src())), size, e.mr->lkey};
    ibv_send_wr w{};
    ibv_send_wr* bad;
    w.wr_id = i;
    w.sg_list = &s;
    w.num_sge = 1;
    w.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    switch (op) {
      case kSend: w.opcode = IBV_WR_SEND; break;
      case kWrite: w.opcode = IBV_WR_RDMA_WRITE; break;
      case kWriteImm:
        w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w.imm_data = htonl(uint32_t(seed));
        break;
      case kRead: w.opcode = IBV_WR_RDMA_READ; break;
      case kCmpSwap:
      case kFetchAdd:
        s.addr = uint64_t(uintptr_t(e.atomic_result()));
        s.length = 8;
        w.opcode = op == kCmpSwap ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
        w.wr.atomic.remote_addr = peer.atomic_addr;
        w.wr.atomic.rkey = peer.rkey;
        w.wr.atomic.compare_add = op == kCmpSwap ? atomic_start + i : 1;
        w.wr.atomic.swap = atomic_start + i + 1;
        w.send_flags |= IBV_SEND_SIGNALED;
        break;
      default: break;
    }
    if (!atomic) {
      w.wr.rdma.remote_addr = peer.addr + (op == kRead ? 0 : kBuf);
      w.wr.rdma.rkey = peer.rkey;
    }
    if (int rc = ibv_post_send(e.qp, &w, &bad)) {
      errno = rc;
      die("ibv_post_send");
    }
  };

  bool ok = true;
  using Clock = std::chrono::steady_clock;
  // Latency: one operation at a time.
  uint32_t lat_iters = iters < 200 ? iters : 200;
  if (atomic) lat_iters = iters;  // the atomic chain is checked as one sequence
  auto t0 = Clock::now();
  for (uint32_t i = 0; i < lat_iters && !e.broken; ++i) {
    post(i, true);
    std::vector<ibv_wc> wcs;
    ok &= e.wait(1, &wcs);
    if (atomic) ok &= *e.atomic_result() == atomic_start + i;  // each op saw the previous one's result
  }
  res.usec = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / lat_iters;
  // Bandwidth: up to kDepth - 8 WRs in flight, every 8th signaled (a completion retires the WRs
  // posted before it, which is how the send queue frees up).
  uint32_t bw_iters = atomic ? 0 : iters - lat_iters;
  t0 = Clock::now();
  uint32_t posted = 0, retired = 0;
  while (retired < bw_iters && !e.broken) {
    while (posted < bw_iters && posted - retired < kDepth - 8) {
      bool sig = (posted % 8 == 7) || posted + 1 == bw_iters;
      post(lat_iters + posted, sig);
      ++posted;
    }
    std::vector<ibv_wc> wcs;
    ok &= e.wait(1, &wcs);
    for (auto& wc : wcs) retired = uint32_t(wc.wr_id) - lat_iters + 1;
  }
  double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  if (bw_iters)
    res.gbps = double(size) * bw_iters * 8 / sec / 1e9;
  else
    res.gbps = double(atomic ? 8 : size) * lat_iters * 8 / (res.usec * lat_iters / 1e6) / 1e9;

  if (op == kSend || op == kWriteImm) {
    Msg r;
    xfer(fd, &r, sizeof r, false);
    ok &= r.ok == 1;
  }
  if (op == kRead)
    for (size_t i = 0; i < size && ok; ++i) ok = e.dst()[i] == pattern(seed, i);
  Msg c{kCheck, op, size, iters, atomic ? atomic_start + lat_iters : seed, 0};
  xfer(fd, &c, sizeof c, true);
  xfer(fd, &c, sizeof c, false);
  res.verified = ok && c.ok == 1;
  return res;
}

std::vector<std::string> loopback_devices() {
  std::vector<std::string> out;
  int n;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; ++i) {
    ibv_context* c = ibv_open_device(list[i]);
    if (!c) continue;
    union ibv_gid g;
    if (!ibv_query_gid(c, 1, 0, &g) && g.raw[10] == 0xff && g.raw[11] == 0xff && g.raw[12] == 127)
      out.push_back(ibv_get_device_name(list[i]));
    ibv_close_device(c);
  }
  if (list) ibv_free_device_list(list);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sdev, cdev;
  uint32_t iters = 1000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--server-dev" && i + 1 < argc)
      sdev = argv[++i];
    else if (a == "--client-dev" && i + 1 < argc)
      cdev = argv[++i];
    else if (a == "--iters" && i + 1 < argc)
      iters = uint32_t(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: melon-demo [--server-dev NAME] [--client-dev NAME] [--iters N]\n");
      return 2;
    }
  }
  if (sdev.empty() || cdev.empty()) {
    auto devs = loopback_devices();
    if (devs.size() < 2) {
      std::fprintf(stderr, "melon-demo: need two soft devices on 127.0.0.x (see docs/verbs.md)\n");
      return 2;
    }
    sdev = devs[0];
    cdev = devs[1];
  }
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp)) die("socketpair");
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    close(sp[0]);
    _exit(server(sp[1], sdev.c_str()));
  }
  close(sp[1]);
  int fd = sp[0];
  Endpoint e;
  e.open(cdev.c_str());
  Dest me = e.local(), peer;
  xfer(fd, &peer, sizeof peer, false);
  xfer(fd, &me, sizeof me, true);
  e.connect(me, peer);

  std::printf("MelonDMA demo: %s (client) -> %s (server), RC, path MTU %u, RoCEv2 over UDP loopback\n", cdev.c_str(),
              sdev.c_str(), 128u << std::min(me.mtu, peer.mtu));
  std::printf("%-10s %9s %10s %10s  %s\n", "operation", "size", "Gbit/s", "us/op", "verified");
  const uint32_t sizes[] = {1, 64, 4096, 65536, 1048576};
  int failures = 0;
  for (uint32_t op = 0; op < kOps; ++op) {
    bool atomic = op == kCmpSwap || op == kFetchAdd;
    for (uint32_t size : sizes) {
      if (atomic && size != 1) continue;
      uint32_t sz = atomic ? 8 : size;
      if (e.broken) {  // the QP is in error: nothing after this cell can run
        failures++;
        std::printf("%-10s %9u %10s %10s  %s\n", kOpNames[op], sz, "-", "-", "not run");
        continue;
      }
      uint32_t n = size >= 1048576 ? iters / 20 + 10 : size >= 65536 ? iters / 4 + 10 : iters;
      Result r = run_cell(fd, e, peer, Op(op), sz, n);
      failures += !r.verified;
      std::printf("%-10s %9u %10.3f %10.2f  %s\n", kOpNames[op], sz, r.gbps, r.usec, r.verified ? "yes" : "NO");
      std::fflush(stdout);
    }
  }
  Msg q{kQuit, 0, 0, 0, 0, 0};
  xfer(fd, &q, sizeof q, true);
  int status = 0;
  waitpid(pid, &status, 0);
  ibv_destroy_qp(e.qp);
  ibv_destroy_cq(e.cq);
  ibv_dereg_mr(e.mr);
  ibv_dealloc_pd(e.pd);
  ibv_close_device(e.ctx);
  std::printf("%s: %d cell(s) failed verification or did not run\n", failures ? "FAILED" : "all verified", failures);
  return failures || !WIFEXITED(status) || WEXITSTATUS(status) ? 1 : 0;
}
