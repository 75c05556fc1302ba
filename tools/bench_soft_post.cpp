// How long ibv_post_send takes on a soft device while another thread keeps the same device's
// transport busy (a benchmark, not a test; docs/performance.md, "Soft path"). Two devices in this
// process (bp0 = 127.0.8.2, bp1 = 127.0.8.3), two RC QP pairs between them:
//   - a streaming thread keeps `stream_depth` 64 KiB RDMA WRITEs in flight on the first pair, so the
//     progress thread and the streaming thread send and receive all the time;
//   - the main thread posts 8-byte RDMA WRITEs on the second pair (every 32nd signaled, at most 256
//     outstanding) and times each ibv_post_send call.
// Prints the distribution of post times and the 8-byte message rate. Run it with LD_LIBRARY_PATH
// pointing at the libibverbs to measure (the build's lib/ by default, through its rpath).
//
//   build/release/tools/bench_soft_post [seconds] [stream_depth]   (defaults 3, 16; depth 0: no stream)
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

struct Side {
  ibv_context* ctx;
  ibv_pd* pd;
  std::vector<uint8_t> buf = std::vector<uint8_t>(16 << 20);
  ibv_mr* mr;
};

struct Pair {
  ibv_cq* cq[2];
  ibv_qp* qp[2];
};

void connect(ibv_qp* qp, uint32_t dest, uint8_t peer_octet) {
  if (const char* step =
          bench_connect_rc(qp, dest, 8, peer_octet, IBV_MTU_4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))
    die(step);
}

Pair make_pair(Side* s) {
  Pair p;
  for (int i = 0; i < 2; ++i) {
    p.cq[i] = ibv_create_cq(s[i].ctx, 1024, nullptr, nullptr, 0);
    if (!p.cq[i]) die("create_cq");
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = p.cq[i];
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 512;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    p.qp[i] = ibv_create_qp(s[i].pd, &ia);
    if (!p.qp[i]) die("create_qp");
  }
  connect(p.qp[0], p.qp[1]->qp_num, 3);
  connect(p.qp[1], p.qp[0]->qp_num, 2);
  return p;
}

int post_write(ibv_qp* qp, Side& from, Side& to, size_t off, uint32_t len, bool signaled, uint64_t id) {
  ibv_sge sge{uint64_t(uintptr_t(from.buf.data() + off)), len, from.mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = id;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.wr.rdma.remote_addr = uint64_t(uintptr_t(to.buf.data() + off));
  wr.wr.rdma.rkey = to.mr->rkey;
  return ibv_post_send(qp, &wr, &bad);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? atof(argv[1]) : 3;
  const int depth = argc > 2 ? atoi(argv[2]) : 16;
  setenv("MELON_SOFT_AUTO", "0", 1);
  setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
  setenv("MELON_SOFT_DEVICES", "bp0=127.0.8.2,bp1=127.0.8.3", 1);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  Side side[2];
  for (int i = 0; i < 2; ++i) {
    const char* want = i ? "bp1" : "bp0";
    side[i].ctx = nullptr;
    for (int j = 0; j < n; ++j)
      if (!strcmp(ibv_get_device_name(list[j]), want)) side[i].ctx = ibv_open_device(list[j]);
    if (!side[i].ctx) die(want);
    side[i].pd = ibv_alloc_pd(side[i].ctx);
    side[i].mr = ibv_reg_mr(side[i].pd, side[i].buf.data(), side[i].buf.size(),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!side[i].mr) die("reg_mr");
  }
  Pair stream = make_pair(side), small = make_pair(side);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> streamed{0};
  std::thread streamer([&] {
    int out = 0;
    uint64_t id = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      while (out < depth) {
        if (post_write(stream.qp[0], side[0], side[1], (id % 64) << 16, 65536, true, id)) die("stream post");
        ++id;
        ++out;
      }
      ibv_wc wc[16];
      int got = ibv_poll_cq(stream.cq[0], 16, wc);
      for (int i = 0; i < got; ++i)
        if (wc[i].status != IBV_WC_SUCCESS) {
          fprintf(stderr, "stream: %s\n", ibv_wc_status_str(wc[i].status));
          exit(1);
        }
      out -= got;
      streamed += uint64_t(got) * 65536;
    }
    while (out > 0) {  // let the stream finish before teardown
      ibv_wc wc[16];
      out -= ibv_poll_cq(stream.cq[0], 16, wc);
    }
  });

  std::vector<uint32_t> samples;
  samples.reserve(1 << 22);
  const uint64_t t0 = now_ns(), end = t0 + uint64_t(seconds * 1e9);
  uint64_t posted = 0, completed = 0;
  while (now_ns() < end) {
    // Keep at most 256 outstanding; every 32nd is signaled, so one completion frees 32 slots.
    while (posted - completed < 256) {
      const bool sig = posted % 32 == 31;
      const uint64_t a = now_ns();
      if (post_write(small.qp[0], side[0], side[1], (8 << 20) + (posted % 1024) * 8, 8, sig, posted)) die("post");
      samples.push_back(uint32_t(std::min<uint64_t>(now_ns() - a, UINT32_MAX)));
      ++posted;
    }
    ibv_wc wc[8];
    int got = ibv_poll_cq(small.cq[0], 8, wc);
    for (int i = 0; i < got; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        fprintf(stderr, "8-byte WRITE: %s\n", ibv_wc_status_str(wc[i].status));
        return 1;
      }
      completed = wc[i].wr_id + 1;
    }
  }
  const double elapsed = double(now_ns() - t0) / 1e9;
  stop = true;
  streamer.join();
  while (completed < posted - posted % 32) {  // drain the signaled tail
    ibv_wc wc;
    if (ibv_poll_cq(small.cq[0], 1, &wc) == 1) completed = wc.wr_id + 1;
  }
  std::sort(samples.begin(), samples.end());
  auto pct = [&](double p) { return samples[std::min(samples.size() - 1, size_t(p * double(samples.size())))]; };
  printf(
      "ibv_post_send of an 8-byte WRITE, %s: %zu posts, median %u ns, p90 %u ns, p99 %u ns, p99.9 %u ns, max %u ns\n",
      depth ? "another thread streaming 64 KiB WRITEs on the same device" : "alone", samples.size(), pct(0.5), pct(0.9),
      pct(0.99), pct(0.999), samples.back());
  printf("8-byte WRITEs: %.3f M msg/s; stream: %.1f MB/s\n", double(completed) / elapsed / 1e6,
         double(streamed.load()) / elapsed / 1e6);
  for (Pair* p : {&stream, &small})
    for (int i = 0; i < 2; ++i) {
      ibv_destroy_qp(p->qp[i]);
      ibv_destroy_cq(p->cq[i]);
    }
  for (Side& s : side) {
    ibv_dereg_mr(s.mr);
    ibv_dealloc_pd(s.pd);
    ibv_close_device(s.ctx);
  }
  ibv_free_device_list(list);
  return 0;
}
