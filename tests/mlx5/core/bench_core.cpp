// The driver core's life-cycle costs on the emulated ConnectX-4 Lx (a benchmark, not a test; see
// docs/performance.md): bring-up, teardown, a no-FLR re-init cycle, recovery by FLR, and one
// command's round trip in polling and in event (MSI-X) mode.
//
// Two hosts: "deterministic" (no device thread; the core's waits run the device and move a manual
// clock, so the time measured is the CPU work of core + emulator alone) and "threaded" (the
// device's worker thread, the steady clock, real sleeps: what the emulator host daemon does).
//
//   build/release/tests/mlx5/core/bench_core [cycles] [host,...]   (hosts polled, msix, threaded, run in that order; default all three)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dext/emuhost/emu_hal.h"
#include "mlx5/core/hca.h"
#include "mlx5/prm/prm.h"

namespace core = melon::mlx5::core;
namespace emu = melon::mlx5::emu;
namespace p = melon::mlx5::prm;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Host {
  explicit Host(bool threaded, bool interrupts) {
    emu::HostPorts ports;
    ports.dma = &host;
    ports.irq = &host;
    ports.clock = threaded ? nullptr : &manual;
    dev = std::make_unique<emu::Device>(ports);
    melon::dext::EmuHalOptions o;
    o.interrupts = interrupts;
    hal = std::make_unique<melon::dext::EmuHal>(*dev, host, threaded ? nullptr : &manual, o);
    if (threaded) dev->start_worker();
    hca.attach(hal.get());
  }
  ~Host() {
    hca.detach();
    dev->stop_worker();
  }
  emu::TestHost host;
  emu::ManualClock manual;
  std::unique_ptr<emu::Device> dev;
  std::unique_ptr<melon::dext::EmuHal> hal;
  core::Hca hca;
};

void check(core::Err e, const char* what) {
  if (e != core::Err::ok) {
    fprintf(stderr, "bench_core: %s failed: %s\n", what, core::err_name(e));
    exit(1);
  }
}

void run(const char* name, bool threaded, bool interrupts, int cycles) {
  Host h(threaded, interrupts);
  std::vector<double> up, down, reinit, flr, cmd;
  uint64_t cmds_up = 0, cmds_cycle = 0;
  for (int i = 0; i < 5; ++i) {
    uint64_t c0 = h.hca.cmdq().commands_run();
    auto t0 = Clock::now();
    check(h.hca.bring_up(), "bring_up");
    up.push_back(us_since(t0));
    cmds_up = h.hca.cmdq().commands_run() - c0;
    t0 = Clock::now();
    check(h.hca.teardown(), "teardown");
    down.push_back(us_since(t0));
  }
  check(h.hca.bring_up(), "bring_up");
  for (int i = 0; i < cycles; ++i) {
    uint64_t c0 = h.hca.cmdq().commands_run();
    auto t0 = Clock::now();
    bool used_reset = false;
    check(h.hca.reinit(&used_reset), "reinit");
    reinit.push_back(us_since(t0));
    cmds_cycle = h.hca.cmdq().commands_run() - c0;
    if (used_reset) fprintf(stderr, "bench_core: re-init fell back to FLR\n");
  }
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    check(h.hca.recover(), "recover");
    flr.push_back(us_since(t0));
  }
  // One command's round trip: ALLOC_PD + DEALLOC_PD pairs, halved.
  for (int i = 0; i < 2000; ++i) {
    core::Pd* pd = nullptr;
    auto t0 = Clock::now();
    check(h.hca.alloc_pd(&pd), "alloc_pd");
    check(h.hca.free_pd(pd), "free_pd");
    cmd.push_back(us_since(t0) / 2);
  }
  uint32_t pages = h.hca.pages().given();
  check(h.hca.teardown(), "teardown");
  if (!name) return;  // the warm-up host
  printf("| %s | %.0f | %.0f | %.0f | %.0f | %.1f | %llu / %llu | %u |\n", name, median(up), median(down),
         median(reinit), median(flr), median(cmd), (unsigned long long)cmds_up, (unsigned long long)cmds_cycle, pages);
}

}  // namespace

int main(int argc, char** argv) {
  int cycles = argc > 1 ? atoi(argv[1]) : 100;
  printf("driver core life cycle on the emulated ConnectX-4 Lx, medians in microseconds (%d re-init cycles)\n", cycles);
  printf(
      "| host | bring-up | teardown | no-FLR re-init | FLR + bring-up | command | commands: bring-up / re-init | fw "
      "pages |\n");
  printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  // A discarded host first. Whichever host runs first in a process is ~20x slower at bring-up and
  // re-init, in either EQ mode (msix,polled gives the slow row to MSI-X): its DMA pages fault in at
  // every bring-up (perf: memset in TestHost::alloc -> page faults, dear in this VM), the later
  // hosts' do not. That, not the core's poll loop, made the polled row look 15x slower
  // (docs/performance.md).
  run(nullptr, false, true, cycles);
  // Hosts in the order given (default polled,msix,threaded).
  std::string order = argc > 2 ? argv[2] : "polled,msix,threaded";
  for (size_t at = 0; at < order.size();) {
    size_t end = order.find(',', at);
    if (end == std::string::npos) end = order.size();
    std::string h = order.substr(at, end - at);
    at = end + 1;
    if (h == "polled")
      run("deterministic, polled", false, false, cycles);
    else if (h == "msix")
      run("deterministic, MSI-X", false, true, cycles);
    else if (h == "threaded")
      run("threaded, MSI-X", true, true, cycles);
    else
      fprintf(stderr, "bench_core: unknown host %s (polled, msix, threaded)\n", h.c_str());
  }
  printf("rerun: build/release/tests/mlx5/core/bench_core %d\n", cycles);
  return 0;
}
