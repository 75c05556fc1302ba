// The HAL of src/mlx5/core over the emulated ConnectX-4 Lx: what the emulator host daemon and the
// core's tests run the driver core on. It plays the kernel's part: BAR0 accesses become
// emu::Device MMIO (byte-swapped as ioread32be/iowrite32be do), DMA memory comes from the
// emulator's TestHost (an IOMMU with guard pages), MSI-X messages are dispatched to the core's
// vector handlers, locks are std::mutex, the log goes to stderr and a buffer tests can read.
//
// Two ways to run: deterministic (no device worker; every delay_us() runs the device's service()
// and, with a ManualClock, advances time by the delay, so timeouts pass instantly), or threaded
// (the device's worker runs; delay_us() sleeps).
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "mlx5/core/hal.h"
#include "mlx5/emu/device.h"
#include "mlx5/emu/test_host.h"

namespace melon::dext {

struct EmuHalOptions {
  uint32_t host_page_size = 16384;  // Apple silicon; 4096 for an x86 Mac
  bool interrupts = true;  // false: vector_count() == 0, the core polls its EQs
  bool pin_per_host_page = true;  // dma_pin maps each host page on its own (segments as on macOS)
  bool echo_log = false;  // also print log lines to stderr
  mlx5::core::LogLevel echo_level = mlx5::core::LogLevel::warn;
};

class EmuHal final : public mlx5::core::Hal {
 public:
  // `clock` is the device's clock when it is a ManualClock (deterministic runs), else null.
  EmuHal(mlx5::emu::Device& dev, mlx5::emu::TestHost& host, mlx5::emu::ManualClock* clock,
         const EmuHalOptions& opt = {});
  ~EmuHal();

  uint32_t read32(uint32_t off) override;
  void write32(uint32_t off, uint32_t value) override;
  void write64(uint32_t off, uint64_t value) override;
  uint64_t bar_size() override;
  uint16_t config_read16(uint32_t off) override;
  void config_write16(uint32_t off, uint16_t value) override;
  int function_reset() override;
  uint32_t host_page_size() override { return opt_.host_page_size; }
  int dma_alloc(uint64_t size, uint64_t align, mlx5::core::DmaBuffer* out) override;
  void dma_free(const mlx5::core::DmaBuffer& buf) override;
  int dma_pin(uint64_t addr, uint64_t len, bool writable, mlx5::core::PinnedRange* out) override;
  uint32_t dma_pinned_segments(const mlx5::core::PinnedRange& r, uint32_t first, mlx5::core::DmaSegment* out,
                               uint32_t max) override;
  void dma_unpin(const mlx5::core::PinnedRange& r) override;
  uint32_t vector_count() override;
  int vector_enable(uint32_t vector, mlx5::core::VectorHandler* h) override;
  void vector_disable(uint32_t vector) override;
  void schedule_service() override { service_requested_ = true; }
  bool random_bytes(void* p, size_t n) override;
  uint64_t now_ns() override;
  void delay_us(uint32_t us) override;
  void* lock_create() override;
  void lock_destroy(void* l) override;
  void lock(void* l) override;
  void unlock(void* l) override;
  void* mem_alloc(size_t size) override;
  void mem_free(void* p, size_t size) override;
  void log(mlx5::core::LogLevel level, const char* line) override;

  // For tests and the daemon.
  bool take_service_request() { return service_requested_.exchange(false); }
  uint64_t dma_buffers() const { return dma_live_.load(); }
  uint64_t pinned_ranges() const;
  int64_t mem_bytes() const { return mem_bytes_.load(); }
  uint64_t resets() const { return resets_.load(); }
  std::vector<std::string> log_lines() const;
  bool logged(const std::string& needle) const;
  void clear_log();
  // Makes the next `n` dma_alloc calls fail (out-of-memory tests).
  void fail_next_allocs(int n) { fail_allocs_ = n; }
  // Lets `n` dma_alloc calls succeed, then fails the next one (and only that one).
  void fail_after_allocs(int n) { fail_after_ = n; }

 private:
  mlx5::emu::Device& dev_;
  mlx5::emu::TestHost& host_;
  mlx5::emu::ManualClock* clock_;
  EmuHalOptions opt_;
  std::atomic<bool> service_requested_{false};
  std::atomic<uint64_t> dma_live_{0}, resets_{0};
  std::atomic<int64_t> mem_bytes_{0};
  std::atomic<int> fail_allocs_{0}, fail_after_{-1};
  mutable std::mutex mu_;
  std::mutex irq_mu_;  // held while a vector handler runs
  std::map<uint64_t, std::vector<mlx5::core::DmaSegment>> pins_;  // by token
  uint64_t next_pin_ = 1;
  mlx5::core::VectorHandler* handlers_[64] = {};
  std::vector<std::string> log_;
};

}  // namespace melon::dext
