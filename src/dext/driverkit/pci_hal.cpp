#include "dext/driverkit/pci_hal.h"

#include <DriverKit/IOLib.h>
#include <mach/mach_time.h>
#include <os/log.h>
#include <string.h>

namespace melon::dext {

namespace core = mlx5::core;

PciHal::PciHal(IOPCIDevice* pci, uint8_t bar, uint64_t bar_size, void (*kick)(void*), void* ctx)
    : pci_(pci), bar_(bar), bar_size_(bar_size), kick_(kick), ctx_(ctx) {
  mach_timebase_info_data_t tb{};
  if (mach_timebase_info(&tb) == 0 && tb.numer && tb.denom) numer_ = tb.numer, denom_ = tb.denom;
}

PciHal::~PciHal() {
  for (uint32_t v = 0; v < nvec_; v++) vector_disable(v);
}

void PciHal::set_vectors(IOInterruptDispatchSource* const* sources, uint32_t n) {
  nvec_ = n < kMaxVectors ? n : kMaxVectors;
  for (uint32_t v = 0; v < nvec_; v++) sources_[v] = sources[v];
}

void PciHal::fire(uint32_t vector) {
  if (vector < nvec_ && handlers_[vector]) handlers_[vector]->on_vector(vector);
}

// ---- BAR0: the device's registers are big-endian, PCI moves little-endian dwords (hal.h).
uint32_t PciHal::read32(uint32_t off) {
  uint32_t v = 0xffffffffu;
  pci_->MemoryRead32(bar_, off, &v);
  return __builtin_bswap32(v);
}
void PciHal::write32(uint32_t off, uint32_t value) { pci_->MemoryWrite32(bar_, off, __builtin_bswap32(value)); }
void PciHal::write64(uint32_t off, uint64_t value) { pci_->MemoryWrite64(bar_, off, __builtin_bswap64(value)); }

// Configuration space in dwords: Apple's accessors ignore the offset's bits 0 and 1, so a 16-bit
// field in a dword's upper half (Device ID, Status, PCIe DevCap's upper half, Device Status) is
// read as part of its dword, and written with the lower half it reads.
uint32_t PciHal::config_read32(uint32_t off) {
  uint32_t v = 0xffffffffu;
  pci_->ConfigurationRead32(off & ~3u, &v);
  return v;
}
uint16_t PciHal::config_read16(uint32_t off) { return uint16_t(config_read32(off) >> ((off & 2) * 8)); }
void PciHal::config_write16(uint32_t off, uint16_t value) {
  if (!(off & 2)) {
    pci_->ConfigurationWrite16(off, value);
    return;
  }
  pci_->ConfigurationWrite32(off & ~3u, (config_read32(off) & 0xffffu) | uint32_t(value) << 16);
}

// The capability list (PCI Local Bus 6.7): pointer at 0x34, entries of (id, next); PCIe's id is 0x10.
uint32_t PciHal::pcie_cap() {
  uint32_t at = config_read16(0x34) & 0xfc;
  for (int hops = 0; at >= 0x40 && hops < 48; hops++) {
    uint16_t head = config_read16(at);
    if ((head & 0xff) == 0x10) return at;
    at = (head >> 8) & 0xfc;
  }
  return 0;
}

// FLR through configuration space (PCIe Base 6.6.2): DevCap bit 28 says the function can, Device
// Control bit 15 starts it, and the function is usable again 100 ms later.
int PciHal::function_reset() {
  uint32_t cap = pcie_cap();
  if (!cap) return core::kHalUnsupported;
  uint32_t devcap = config_read32(cap + 4);
  if (!(devcap & (1u << 28))) return core::kHalUnsupported;
  config_write16(cap + 8, uint16_t(config_read16(cap + 8) | 0x8000));
  IOSleep(100);
  return config_read16(0) == 0xffff ? core::kHalGone : core::kHalOk;
}

// ---- DMA ----------------------------------------------------------------------------------------

static int prepare(IOPCIDevice* pci, IOMemoryDescriptor* md, uint64_t len, DmaRecord* r) {
  IODMACommandSpecification spec{};
  spec.options = kIODMACommandSpecificationNoOptions;
  spec.maxAddressBits = 64;
  if (IODMACommand::Create(pci, kIODMACommandCreateNoOptions, &spec, &r->cmd) != kIOReturnSuccess) {
    r->cmd = nullptr;
    return core::kHalNoMemory;
  }
  uint64_t flags = 0;
  uint32_t n = 32;
  IOAddressSegment segs[32] = {};
  if (r->cmd->PrepareForDMA(kIODMACommandPrepareForDMANoOptions, md, 0, len, &flags, &n, segs) != kIOReturnSuccess) {
    OSSafeReleaseNULL(r->cmd);
    return core::kHalFault;
  }
  // The core and the queue platform want one IOVA-contiguous range (docs/macos.md: unverified how
  // often the DART hands out more than one segment for a buffer).
  if (n != 1 || segs[0].length < len) {
    r->cmd->CompleteDMA(kIODMACommandCompleteDMANoOptions);
    OSSafeReleaseNULL(r->cmd);
    return core::kHalFault;
  }
  r->iova = segs[0].address;
  r->size = len;
  return core::kHalOk;
}

int PciHal::map_buffer(uint64_t size, uint64_t align, DmaRecord** out) {
  DmaRecord* r = static_cast<DmaRecord*>(IOMallocZero(sizeof(DmaRecord)));
  if (!r) return core::kHalNoMemory;
  IOBufferMemoryDescriptor* b = nullptr;
  if (IOBufferMemoryDescriptor::Create(kIOMemoryDirectionInOut, size, align < page_ ? page_ : align, &b) !=
      kIOReturnSuccess) {
    IOFree(r, sizeof(DmaRecord));
    return core::kHalNoMemory;
  }
  IOAddressSegment range{};
  if (b->SetLength(size) != kIOReturnSuccess || b->GetAddressRange(&range) != kIOReturnSuccess || !range.address) {
    b->release();
    IOFree(r, sizeof(DmaRecord));
    return core::kHalNoMemory;
  }
  r->md = b;
  r->va = reinterpret_cast<void*>(range.address);
  memset(r->va, 0, size);
  if (int e = prepare(pci_, b, size, r); e != core::kHalOk || (align && r->iova % align)) {
    if (r->cmd) {
      r->cmd->CompleteDMA(kIODMACommandCompleteDMANoOptions);
      r->cmd->release();
    }
    b->release();
    IOFree(r, sizeof(DmaRecord));
    return e != core::kHalOk ? e : core::kHalFault;
  }
  records_++;
  *out = r;
  return core::kHalOk;
}

int PciHal::map_client(IOMemoryDescriptor* client_md, uint64_t len, DmaRecord** out) {
  DmaRecord* r = static_cast<DmaRecord*>(IOMallocZero(sizeof(DmaRecord)));
  if (!r) return core::kHalNoMemory;
  r->md = client_md;
  if (int e = prepare(pci_, client_md, len, r); e != core::kHalOk) {
    IOFree(r, sizeof(DmaRecord));
    return e;
  }
  client_md->retain();
  records_++;
  *out = r;
  return core::kHalOk;
}

void PciHal::unmap(DmaRecord* r) {
  if (!r) return;
  if (r->cmd) {
    r->cmd->CompleteDMA(kIODMACommandCompleteDMANoOptions);
    r->cmd->release();
  }
  if (r->md) r->md->release();
  IOFree(r, sizeof(DmaRecord));
  records_--;
}

int PciHal::dma_alloc(uint64_t size, uint64_t align, core::DmaBuffer* out) {
  DmaRecord* r = nullptr;
  if (int e = map_buffer(size, align, &r); e != core::kHalOk) return e;
  *out = core::DmaBuffer{r->va, r->iova, size, uint64_t(uintptr_t(r))};
  return core::kHalOk;
}

void PciHal::dma_free(const core::DmaBuffer& buf) { unmap(reinterpret_cast<DmaRecord*>(uintptr_t(buf.token))); }

// ---- vectors ------------------------------------------------------------------------------------

int PciHal::vector_enable(uint32_t vector, core::VectorHandler* h) {
  if (vector >= nvec_ || !sources_[vector]) return core::kHalUnsupported;
  handlers_[vector] = h;
  if (sources_[vector]->SetEnableWithCompletion(true, nullptr) != kIOReturnSuccess) {
    handlers_[vector] = nullptr;
    return core::kHalFault;
  }
  return core::kHalOk;
}

// Disabling waits for a handler in flight (SetEnableWithCompletion's contract), so the core may free
// the EQ right after.
void PciHal::vector_disable(uint32_t vector) {
  if (vector >= nvec_ || !sources_[vector] || !handlers_[vector]) return;
  sources_[vector]->SetEnableWithCompletion(false, nullptr);
  handlers_[vector] = nullptr;
}

// ---- time, locks, memory, log -------------------------------------------------------------------

uint64_t PciHal::now_ns() {
  uint64_t t = mach_absolute_time();
  return numer_ == denom_ ? t : (t / denom_) * numer_ + (t % denom_) * numer_ / denom_;
}

void PciHal::delay_us(uint32_t us) {
  if (us >= 1000) IOSleep(us / 1000);
  if (us % 1000) IODelay(us % 1000);
}

void* PciHal::lock_create() { return IOLockAlloc(); }
void PciHal::lock_destroy(void* l) { IOLockFree(static_cast<IOLock*>(l)); }
void PciHal::lock(void* l) { IOLockLock(static_cast<IOLock*>(l)); }
void PciHal::unlock(void* l) { IOLockUnlock(static_cast<IOLock*>(l)); }
void* PciHal::mem_alloc(size_t size) { return IOMallocZero(size); }
void PciHal::mem_free(void* p, size_t size) {
  if (p) IOFree(p, size);
}

void PciHal::log(core::LogLevel level, const char* line) {
  os_log_type_t t = level == core::LogLevel::error  ? OS_LOG_TYPE_ERROR
                    : level == core::LogLevel::warn ? OS_LOG_TYPE_DEFAULT
                    : level == core::LogLevel::info ? OS_LOG_TYPE_INFO
                                                    : OS_LOG_TYPE_DEBUG;
  os_log_with_type(OS_LOG_DEFAULT, t, "%{public}s", line);
}

}  // namespace melon::dext
