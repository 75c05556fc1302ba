// Runs freestanding code with no C++ runtime linked: returns nonzero if any check fails.
#include <stdlib.h>
#include <string.h>

#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/page_list.h"

#include "roce/crc32.h"
#include "roce/icrc.h"
#include "roce/ip_udp.h"
#include "roce/packet.h"
#include "roce/psn.h"
#include "uapi/doorbell.h"

using namespace melon::roce;
namespace core = melon::mlx5::core;

// A HAL with nothing behind its BAR (reads all ones, like a removed card): the driver core must
// run, fail cleanly at its first stage and leave nothing behind, all without a C++ runtime.
struct EmptySlotHal final : core::Hal {
  int live = 0, lines = 0;
  uint32_t read32(uint32_t) override { return 0xffffffffu; }
  void write32(uint32_t, uint32_t) override {}
  void write64(uint32_t, uint64_t) override {}
  uint64_t bar_size() override { return 1 << 25; }
  uint16_t config_read16(uint32_t) override { return 0; }
  void config_write16(uint32_t, uint16_t) override {}
  int function_reset() override { return 0; }
  uint32_t host_page_size() override { return 16384; }
  int dma_alloc(uint64_t size, uint64_t align, core::DmaBuffer* out) override {
    void* p = aligned_alloc(align, size);
    if (!p) return core::kHalNoMemory;
    *out = {p, uint64_t(uintptr_t(p)), size, 0};
    ++live;
    return 0;
  }
  void dma_free(const core::DmaBuffer& b) override { free(b.va), --live; }
  int dma_pin(uint64_t, uint64_t, bool, core::PinnedRange*) override { return core::kHalUnsupported; }
  uint32_t dma_pinned_segments(const core::PinnedRange&, uint32_t, core::DmaSegment*, uint32_t) override { return 0; }
  void dma_unpin(const core::PinnedRange&) override {}
  uint32_t vector_count() override { return 0; }
  int vector_enable(uint32_t, core::VectorHandler*) override { return core::kHalUnsupported; }
  void vector_disable(uint32_t) override {}
  void schedule_service() override {}
  uint64_t now_ns() override { return 0; }
  void delay_us(uint32_t) override {}
  void* lock_create() override { return malloc(1); }
  void lock_destroy(void* l) override { free(l); }
  void lock(void*) override {}
  void unlock(void*) override {}
  void* mem_alloc(size_t n) override { return calloc(1, n); }
  void mem_free(void* p, size_t) override { free(p); }
  void log(core::LogLevel, const char*) override { ++lines; }
};

static int core_checks() {
  int failures = 0;
  char buf[64];
  core::format(buf, sizeof buf, "%s %u 0x%08x", "MlxCmd:", 5u, 0xabcu);
  if (strcmp(buf, "MlxCmd: 5 0x00000abc") != 0) ++failures;
  core::DmaSegment segs[] = {{0x100000, 16384}, {0x104000, 16384}};
  if (core::best_page_shift(segs, 2, 0x7f0000100000ull, 30) != 15) ++failures;
  EmptySlotHal hal;
  static core::Hca hca;  // large: keep it off the stack
  hca.attach(&hal);
  if (hca.bring_up() != core::Err::dead) ++failures;
  if (hca.last_failure().stage != core::Stage::wait_fw) ++failures;
  if (hca.teardown() != core::Err::ok || hal.live != 0 || hal.lines == 0) ++failures;
  return failures;
}

int main() {
  int failures = 0;
  // Standard CRC-32 check value.
  const char* digits = "123456789";
  if (crc32_update(0, digits, 9) != 0xcbf43926u) ++failures;
  if (crc32_table_update(0, digits, 9) != 0xcbf43926u) ++failures;
  if (psn_add(0xffffff, 2) != 1) ++failures;

  // Build an RC SEND_ONLY and check it round-trips with a valid ICRC.
  uint8_t frame[128];
  IpUdp ip;
  gid_from_ipv4(ip.src, 0x7f000002);
  gid_from_ipv4(ip.dst, 0x7f000003);
  Packet p;
  p.bth.opcode = make_opcode(Transport::rc, kSendOnly);
  p.bth.dest_qp = 0x12;
  p.bth.psn = 0xfffffe;
  p.payload_len = 5;
  size_t roce_len = transport_header_len(p.bth.opcode) + 8 + kIcrcSize;
  size_t n = write_ip_udp(ip, roce_len, frame);
  n += write_transport_headers(p, frame + n);
  memcpy(frame + n, "hello\0\0\0", 8);
  n += 8;
  store_icrc(frame + n, icrc_of_frame(frame, n));
  if (!icrc_frame_ok(frame, n + kIcrcSize)) ++failures;
  Packet q;
  if (parse_transport(frame + 28, roce_len, q) != ParseError::ok || q.payload_len != 5 || q.bth.psn != 0xfffffe)
    ++failures;
  failures += core_checks();

  // The UAR watch block's handshake compiles to plain atomics (no runtime).
  static uint8_t uar[4096];
  melon::uapi::UarWatch* w = melon::uapi::uar_watch(uar);
  if (melon::uapi::uar_watch_sleeping(w)) ++failures;
  w->sleeping = 1;
  if (!melon::uapi::uar_watch_sleeping(w)) ++failures;
  melon::uapi::uar_watch_kick(w);
  if (w->kick != 1 || uar[melon::uapi::kUarWatchOffset] != 1) ++failures;
  return failures;
}
