// Memory ordering against the device: the three barriers rdma-core's providers use (rdma-core
// util/udma_barrier.h gives their meaning; the instructions per architecture are its facts).
// A C++ fence orders memory between CPUs only (on arm64, std::atomic_thread_fence is `dmb ish`,
// the inner shareable domain, which a PCIe device is not in), so every store that hands work to
// the HCA and every load that takes work back from it goes through one of these.
//
//   udma_to_device_barrier    before the store that lets the device read what was written
//                             before it (doorbell record after WQEs, command ownership byte)
//   udma_from_device_barrier  after the load that says the device has written (CQE, EQE or
//                             command owner bit), before reading what it wrote
//   mmio_flush_writes         after a store to a (write-combining) UAR page, so the write leaves
//                             the CPU before the next doorbell of another CPU can; also before
//                             it (rdma-core's mmio_wc_start), so the record precedes the doorbell
//
// Freestanding (src/mlx5/core and the provider include it): inline asm only.
#pragma once

namespace melon::mlx5 {

#if defined(__aarch64__) || defined(__arm64__)
inline void udma_to_device_barrier() { asm volatile("dmb oshst" ::: "memory"); }
inline void udma_from_device_barrier() { asm volatile("dmb oshld" ::: "memory"); }
inline void mmio_flush_writes() { asm volatile("dsb st" ::: "memory"); }
#elif defined(__x86_64__)
// x86-64 keeps stores in order and loads in order towards the device already: to the device a
// compiler barrier, from the device an lfence, and sfence to drain write-combining buffers.
inline void udma_to_device_barrier() { asm volatile("" ::: "memory"); }
inline void udma_from_device_barrier() { asm volatile("lfence" ::: "memory"); }
inline void mmio_flush_writes() { asm volatile("sfence" ::: "memory"); }
#else
#error "melon::mlx5 barriers: only x86-64 and arm64 are defined (rdma-core util/udma_barrier.h has the others)"
#endif

// Before a store to write-combining MMIO: everything earlier (the doorbell record) first.
inline void mmio_wc_start() { mmio_flush_writes(); }

}  // namespace melon::mlx5
