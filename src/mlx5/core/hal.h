// The HAL: everything the driver core asks of a platform (docs/DESIGN.md, "The HAL").
//
// The core never touches hardware, memory allocators, clocks or logs except through this one
// interface. DriverKit implements it with IOPCIDevice (BAR0, config space, reset),
// IOBufferMemoryDescriptor + IODMACommand (DMA), IOInterruptDispatchSource (vectors), IOLock and
// os_log. On Linux, the emulator host implements it over the emulated ConnectX-4 Lx, so the same
// core code is tested here that the DEXT runs.
//
// Freestanding: no C++ library, no exceptions, no RTTI. Virtual calls only.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace melon::mlx5::core {

// A buffer the device can read and write: kernel virtual address and the IOVA the device uses.
// Coherent (no cache maintenance needed) and zeroed on allocation.
struct DmaBuffer {
  void* va = nullptr;
  uint64_t iova = 0;
  uint64_t size = 0;
  uint64_t token = 0;  // the platform's handle; the core never interprets it
};

// One IOVA-contiguous piece of a pinned user range.
struct DmaSegment {
  uint64_t iova;
  uint64_t len;
};

// A pinned user range: its segments stay valid (and the pages resident) until unpin().
struct PinnedRange {
  uint64_t token = 0;
  uint32_t segments = 0;
};

// Called by the platform when a vector fires (from its interrupt context, or from a poller).
// Empty default, not a pure virtual: see Hal below.
class VectorHandler {
 public:
  virtual void on_vector(uint32_t) {}

 protected:
  ~VectorHandler() = default;
};

enum class LogLevel : uint8_t { error, warn, info, debug };

// Platform error codes the HAL returns (0 is success); kept apart from errno, whose values differ
// between Darwin and Linux.
enum HalStatus : int { kHalOk = 0, kHalNoMemory = 1, kHalFault = 2, kHalUnsupported = 3, kHalGone = 4 };

// Every method has a safe default (no device, no memory), never a pure virtual: a pure virtual
// needs the C++ runtime's __cxa_pure_virtual, which the DEXT's freestanding link does not have.
// A platform overrides all of them (EmuHal and the DriverKit HAL are `final`).
class Hal {
 public:
  // ---- BAR0 (the initialization segment, UAR pages). Values are the PRM's big-endian dwords:
  // read32 returns what ioread32be would, write64 stores the MSB first (doorbells).
  virtual uint32_t read32(uint32_t) { return 0xffffffffu; }
  virtual void write32(uint32_t, uint32_t) {}
  virtual void write64(uint32_t, uint64_t) {}
  virtual uint64_t bar_size() { return 0; }

  // ---- PCI configuration space and reset.
  // 16-bit accesses: the core only touches the command register (bus master, memory space).
  virtual uint16_t config_read16(uint32_t) { return 0xffff; }
  virtual void config_write16(uint32_t, uint16_t) {}
  // Function-level reset; returns once the function is usable again (PCIe: 100 ms later).
  virtual int function_reset() { return kHalUnsupported; }

  // ---- DMA memory. Sizes are multiples of host_page_size() (16 KiB on Apple silicon, 4 KiB
  // on x86 Linux); the IOVA is aligned to at least `align`.
  virtual uint32_t host_page_size() { return 4096; }
  virtual int dma_alloc(uint64_t, uint64_t, DmaBuffer*) { return kHalUnsupported; }
  virtual void dma_free(const DmaBuffer&) {}
  // Pins [addr, addr+len) of the calling client's memory; segments come out in address order.
  virtual int dma_pin(uint64_t, uint64_t, bool, PinnedRange*) { return kHalUnsupported; }
  virtual uint32_t dma_pinned_segments(const PinnedRange&, uint32_t, DmaSegment*, uint32_t) { return 0; }
  virtual void dma_unpin(const PinnedRange&) {}

  // ---- Interrupt vectors. vector_count() == 0 means polling: the core then drains its event
  // queues itself while it waits, and service() polls them too.
  virtual uint32_t vector_count() { return 0; }
  virtual int vector_enable(uint32_t, VectorHandler*) { return kHalUnsupported; }
  virtual void vector_disable(uint32_t) {}

  // ---- Deferred work: ask the platform to call Hca::service() soon from a context that may
  // issue commands (a work queue; never the interrupt context that asked).
  virtual void schedule_service() {}

  // ---- Randomness: fills with unpredictable bytes (memory key variants); false when the platform
  // has none, and the core falls back to a counter.
  virtual bool random_bytes(void*, size_t) { return false; }

  // ---- Time.
  virtual uint64_t now_ns() { return 0; }  // monotonic
  virtual void delay_us(uint32_t) {}

  // ---- Locks (non-recursive; may sleep) and kernel memory for the core's own bookkeeping.
  virtual void* lock_create() { return nullptr; }
  virtual void lock_destroy(void*) {}
  virtual void lock(void*) {}
  virtual void unlock(void*) {}
  virtual void* mem_alloc(size_t) { return nullptr; }  // zeroed; nullptr on failure
  virtual void mem_free(void*, size_t) {}

  // ---- Log sink: one finished line, already prefixed with its component ("MlxCmd: ...").
  virtual void log(LogLevel, const char*) {}

 protected:
  ~Hal() = default;
};

// Scoped lock over a HAL lock.
class HalLock {
 public:
  HalLock(Hal& hal, void* l) : hal_(hal), l_(l) { hal_.lock(l_); }
  ~HalLock() { hal_.unlock(l_); }
  HalLock(const HalLock&) = delete;
  HalLock& operator=(const HalLock&) = delete;

 private:
  Hal& hal_;
  void* l_;
};

}  // namespace melon::mlx5::core
