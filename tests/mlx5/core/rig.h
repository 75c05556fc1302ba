// One emulated ConnectX-4 Lx with the driver core on top, through the emulator host's HAL:
// TestHost (DMA with an IOMMU) + ManualClock + emu::Device + EmuHal + core::Hca.
// Deterministic by default: no device worker; the core's waits run the device and move time.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>
#include <string.h>

#include <memory>

#include "dext/emuhost/emu_hal.h"
#include "mlx5/core/hca.h"
#include "mlx5/emu/device.h"
#include "mlx5/emu/test_host.h"

namespace melon::mlx5::core::test {

struct RigOptions {
  bool threaded = false;  // the device's worker thread and the steady clock, real sleeps
  emu::FramePort* wire = nullptr;  // the Ethernet port's link (src/mlx5/emu/wire.h), if any
  dext::EmuHalOptions hal;
  HcaConfig cfg;
  emu::DeviceConfig dev;
};

struct Rig {
  explicit Rig(const RigOptions& o = {}) {
    emu::HostPorts ports;
    ports.dma = &host;
    ports.irq = &host;
    ports.clock = o.threaded ? nullptr : &clock;
    ports.wire = o.wire;
    dev = std::make_unique<emu::Device>(ports, o.dev);
    dext::EmuHalOptions ho = o.hal;
    if (getenv("MELON_CORE_LOG")) ho.echo_log = true, ho.echo_level = LogLevel::debug;  // to debug a test
    hal = std::make_unique<dext::EmuHal>(*dev, host, o.threaded ? nullptr : &clock, ho);
    if (o.threaded) dev->start_worker();
    hca.attach(hal.get(), o.cfg);
  }
  ~Rig() {
    hca.detach();
    dev->stop_worker();
  }

  // A DMA buffer for queues the test owns (as a client's pinned memory would be).
  DmaSegment buffer(size_t len, size_t align = 4096) {
    auto b = host.alloc(len, align);
    bufs.push_back(b.iova);
    return {b.iova, len};
  }
  void* va(uint64_t iova) { return host.va(iova); }
  // A RoCEv2 GID (IPv4-mapped 10.0.0.<last>) with the port's MAC at `index`.
  Err set_gid(uint32_t index, uint8_t last) {
    GidEntry g;
    uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, last};
    memcpy(g.gid, gid, 16);
    memcpy(g.mac, hca.port().mac, 6);
    return hca.set_gid(index, g);
  }
  void free_buffers() {
    for (uint64_t i : bufs) host.free(i);
    bufs.clear();
  }
  // Runs deferred work the core asked the platform for (page requests).
  void service() {
    while (hal->take_service_request()) hca.service();
    hca.service();
  }

  emu::TestHost host;
  emu::ManualClock clock;
  std::unique_ptr<emu::Device> dev;
  std::unique_ptr<dext::EmuHal> hal;
  Hca hca;
  std::vector<uint64_t> bufs;
};

}  // namespace melon::mlx5::core::test
