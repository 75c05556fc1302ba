// MMIO trapping for an emulated BAR mapped into the program (tests/vfio, docs/emulator.md "VFIO
// interposer"). The BAR is an anonymous mapping with no access at all (PROT_NONE): every load and
// store the program makes to it faults, and the SIGSEGV handler turns the faulting instruction into
// one MMIO transaction on the emulated device, with its width, at that moment and in program order,
// as a PCIe posted write or a non-posted read would reach a real function.
//
// Stores (and the plain loads compilers emit for mmio_read*/mmio_write*: MOV, MOVZX, MOVNTI, the
// SSE moves) are decoded and emulated: the value goes to the device (or comes from it into the
// destination register) and the program continues after the instruction; the page never becomes
// accessible, so no other thread can slip a store past the device. Any other load (CMP/TEST with a
// memory operand, ...) is single-stepped on a read-only page refreshed from the device for the
// bytes it reads (one thread at a time); any other store is refused loudly (the program aborts with
// the instruction bytes), never silently lost.
//
// x86-64 Linux only.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace melon::vfio {

class MmioTarget {
 public:
  virtual ~MmioTarget() = default;
  // `off` from the start of the BAR; bytes in memory order (little-endian as the CPU stored them).
  virtual void mmio_load(uint64_t off, void* dst, size_t len) = 0;
  virtual void mmio_store(uint64_t off, const void* src, size_t len) = 0;
};

// Registers [base, base + len) (page aligned, PROT_NONE) as trapped MMIO for `target`. Installs the
// signal handlers on first use. Thread-safe.
void mmio_trap_register(void* base, size_t len, MmioTarget* target);
void mmio_trap_unregister(void* base);

struct MmioTrapStats {
  uint64_t emulated_loads, emulated_stores, stepped_loads;
};
MmioTrapStats mmio_trap_stats();

}  // namespace melon::vfio
