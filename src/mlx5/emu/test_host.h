// A ready-made host for the emulated device: DMA memory with an IOMMU, MSI-X counting, and a clock.
// Tests and the Linux HAL of src/mlx5/core use it.
//
// IOVAs are deliberately unlike virtual addresses: they start at kIovaBase, every allocation gets
// its own IOVA window with an unmapped guard page after it, so a driver that hands the device a
// virtual address, a stale IOVA or an off-by-one length gets an IOMMU fault (DmaPort::read/write
// return false and the fault is recorded), as on hardware.
//
// Thread-safe: the device's worker may DMA while the host allocates.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>

#include "mlx5/emu/device.h"

namespace melon::mlx5::emu {

class TestHost : public DmaPort, public IrqSink {
 public:
  static constexpr uint64_t kIovaBase = 0x00000dd000000000ull;
  static constexpr size_t kPage = 4096;

  struct Buffer {
    void* va = nullptr;
    uint64_t iova = 0;
    size_t len = 0;
    explicit operator bool() const { return va != nullptr; }
  };

  TestHost() = default;
  ~TestHost() override;
  TestHost(const TestHost&) = delete;
  TestHost& operator=(const TestHost&) = delete;

  // Zeroed host memory of `len` bytes (rounded up to pages), mapped for the device. IOVA and VA are
  // both page aligned; `align` (a power of two, > 4096) aligns the IOVA further.
  Buffer alloc(size_t len, size_t align = kPage);
  // Unmaps and frees an allocation made by alloc(). Returns false for an unknown IOVA.
  bool free(uint64_t iova);
  // Maps memory the host owns (a user buffer being pinned): returns the IOVA of `va`, which keeps
  // va's offset inside its page. The caller keeps the memory alive until unmap(). `align` aligns the
  // window's IOVA further (an IOMMU with larger pages: Apple's DART maps 16 KiB pages).
  uint64_t map(void* va, size_t len, size_t align = kPage);
  bool unmap(uint64_t iova);

  // Host-side view of an IOVA (what the driver's own pointer is), or nullptr if not mapped.
  void* va(uint64_t iova, size_t len = 1) const;
  uint64_t iova_of(const void* va) const;  // 0 if not inside a mapping

  // DmaPort
  bool read(uint64_t iova, void* dst, size_t len) override;
  bool write(uint64_t iova, const void* src, size_t len) override;
  bool writable(uint64_t iova, size_t len) override;  // a fault is counted as for write()
  // Called after each device write that landed (outside the lock): tests that check the device
  // writes the bytes it was asked to and no others.
  std::function<void(uint64_t iova, size_t len)> on_write;
  // The same for each device read that was served (tests that check what the device fetches).
  std::function<void(uint64_t iova, size_t len)> on_read;
  uint64_t dma_faults() const { return faults_.load(); }
  uint64_t last_fault_iova() const { return last_fault_.load(); }
  size_t mapped_bytes() const;

  // IrqSink: counts per vector, wakes wait_irq(), then calls on_irq (if set) outside the lock.
  void raise(uint16_t vector) override;
  uint64_t irq_count(uint16_t vector) const;
  // Waits until vector's count exceeds `seen` or `timeout_ms` passes; returns the count.
  uint64_t wait_irq(uint16_t vector, uint64_t seen, unsigned timeout_ms);
  std::function<void(uint16_t)> on_irq;

 private:
  struct Mapping {
    uint64_t iova;  // page aligned start of the window
    size_t len;  // bytes mapped (page multiple)
    uint8_t* host;  // host address of iova
    bool owned;  // alloc() memory, freed on free()
  };
  const Mapping* find(uint64_t iova, size_t len) const;  // caller holds mu_
  uint8_t* bytes_at(uint64_t iova, size_t len);  // caller holds mu_; nullptr (a fault counted) if unmapped

  mutable std::mutex mu_;
  std::map<uint64_t, Mapping> maps_;  // by IOVA
  uint64_t next_iova_ = kIovaBase;
  std::atomic<uint64_t> faults_{0}, last_fault_{0};
  static constexpr int kVectors = 2048;
  std::atomic<uint64_t> irqs_[kVectors] = {};
  std::mutex irq_mu_;
  std::condition_variable irq_cv_;
};

// A clock tests step by hand.
class ManualClock : public Clock {
 public:
  explicit ManualClock(uint64_t start_ns = 1'000'000'000ull) : now_(start_ns) {}
  uint64_t now_ns() override { return now_.load(); }
  void advance(uint64_t ns) { now_ += ns; }

 private:
  std::atomic<uint64_t> now_;
};

}  // namespace melon::mlx5::emu
