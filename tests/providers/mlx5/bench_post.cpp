// What posting one send WQE costs in the mlx5 provider (a benchmark, not a test; docs/performance.md):
// write_send_wqe() into a 256-WQEBB ring, then ring_send_doorbell() (doorbell record, fences, the
// 64-bit UAR store; here the UAR is plain memory, so no wire and no device) plus the doorbell-watch
// check a watched UAR adds (uapi/doorbell.h, watcher awake). Baseline in the same run: memcpy of
// one 64-byte WQEBB into the same ring.
//
//   build/release/tests/providers/mlx5/bench_mlx5_post --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "providers/mlx5/wqe.h"
#include "uapi/doorbell.h"

namespace mp = melon::mlx5prov;

namespace {

constexpr uint32_t kBbs = 256;

struct Ring {
  Ring() : mem(kBbs * 64), wrid(kBbs), next(kBbs), uar(4096) {
    sq.buf = mem.data();
    sq.wqe_cnt = kBbs;
    sq.max_gs = sq.state_max_gs = 4;
    sq.max_inline = 256;
    sq.qpn = 0x42;
    sq.type = IBV_QPT_RC;
    sq.wrid = wrid.data();
    sq.next_tail = next.data();
  }
  std::vector<uint8_t> mem;
  std::vector<uint64_t> wrid;
  std::vector<uint32_t> next;
  std::vector<uint8_t> uar;
  uint32_t dbrec[2] = {};
  mp::SendQueue sq;
};

// `locked`: also take the two mutexes mlx5_post_send holds (the QP's send lock, the UAR's lock).
void post_loop(benchmark::State& st, ibv_wr_opcode op, uint32_t len, unsigned flags, int nsge, bool locked = false) {
  std::mutex sq_mu, uar_mu;
  Ring r;
  std::vector<uint8_t> data(4096, 0x5a);
  ibv_sge sg[4];
  for (int i = 0; i < 4; i++) sg[i] = {uint64_t(uintptr_t(data.data() + i * 1024)), len, 0x1234};
  ibv_send_wr wr{};
  wr.opcode = op;
  wr.sg_list = sg;
  wr.num_sge = nsge;
  wr.send_flags = flags;
  wr.wr.rdma.remote_addr = 0x10000;
  wr.wr.rdma.rkey = 0x77;
  auto* reg = reinterpret_cast<volatile uint64_t*>(r.uar.data() + 0x800);
  auto* watch = melon::uapi::uar_watch(r.uar.data());
  for (auto _ : st) {
    if (locked) sq_mu.lock();
    if (mp::write_send_wqe(r.sq, wr, nullptr) != 0) st.SkipWithError("post refused");
    if (locked) uar_mu.lock();
    mp::ring_send_doorbell(r.sq, &r.dbrec[1], reg);
    if (melon::uapi::uar_watch_sleeping(watch)) melon::uapi::uar_watch_kick(watch);
    if (locked) uar_mu.unlock(), sq_mu.unlock();
    r.sq.tail = r.sq.cur_post;  // completed at once: the ring never fills
  }
  benchmark::DoNotOptimize(r.mem.data());
}

void BM_PostSend1Sge(benchmark::State& st) { post_loop(st, IBV_WR_SEND, 64, IBV_SEND_SIGNALED, 1); }
void BM_PostSend1SgeLocked(benchmark::State& st) { post_loop(st, IBV_WR_SEND, 64, IBV_SEND_SIGNALED, 1, true); }
void BM_PostWrite1Sge(benchmark::State& st) { post_loop(st, IBV_WR_RDMA_WRITE, 64, IBV_SEND_SIGNALED, 1); }
void BM_PostSend4Sge(benchmark::State& st) { post_loop(st, IBV_WR_SEND, 64, IBV_SEND_SIGNALED, 4); }
void BM_PostSendInline64(benchmark::State& st) {
  post_loop(st, IBV_WR_SEND, 64, IBV_SEND_SIGNALED | IBV_SEND_INLINE, 1);
}

void BM_MemcpyWqebb(benchmark::State& st) {
  Ring r;
  uint8_t src[64];
  memset(src, 0x5a, sizeof src);
  uint32_t i = 0;
  for (auto _ : st) {
    memcpy(r.mem.data() + 64 * (i++ & (kBbs - 1)), src, 64);
    benchmark::ClobberMemory();
  }
}

BENCHMARK(BM_MemcpyWqebb);
BENCHMARK(BM_PostSend1Sge);
BENCHMARK(BM_PostSend1SgeLocked);
BENCHMARK(BM_PostWrite1Sge);
BENCHMARK(BM_PostSend4Sge);
BENCHMARK(BM_PostSendInline64);

// Records each benchmark's CPU time per iteration (the median aggregate when repeated).
class Recorder : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration || r.aggregate_name == "median")
        ns[r.run_name.function_name] = r.GetAdjustedCPUTime();
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> ns;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  Recorder rec;
  benchmark::RunSpecifiedBenchmarks(&rec);
  double base = rec.ns["BM_MemcpyWqebb"];
  std::printf(
      "\nmlx5 provider post cost (CPU ns per WQE, WQE write + doorbell record + UAR store), memcpy of "
      "64 B = %.2f ns\n",
      base);
  for (const auto& [name, v] : rec.ns)
    if (name != "BM_MemcpyWqebb")
      std::printf("  %-22s %7.2f ns   %5.1f x memcpy\n", name.c_str(), v, base > 0 ? v / base : 0);
  std::printf(
      "rerun: build/release/tests/providers/mlx5/bench_mlx5_post --benchmark_repetitions=5 "
      "--benchmark_report_aggregates_only=true\n");
  return 0;
}
