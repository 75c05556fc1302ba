#include "dext/driverkit/pci_hal.h"

#include <DriverKit/IOLib.h>
#include <mach/mach_time.h>
#include <os/log.h>
#include <string.h>

namespace melon::dext {

namespace core = mlx5::core;

PciHal::PciHal(IOPCIDevice* pci, uint8_t bar, uint64_t bar_size, void (*kick)(void*), void* ctx)
    : pci_(pci), bar_(bar), bar_size_(bar_size), kick_(kick), ctx_(ctx) {
  // The system's page (16 KiB on Apple silicon, 4 KiB on Intel Macs); DriverKit's IOLib.h has it.
  if (IOVMPageSize >= 4096 && IOVMPageSize <= (1u << 20) && !(IOVMPageSize & (IOVMPageSize - 1)))
    page_ = uint32_t(IOVMPageSize);
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

// The handler counts itself in before it looks whether its vector is live, and vector_disable
// marks it dead before it looks at the count: one of the two sees the other (sequentially
// consistent), so after vector_disable no handler is inside the core for that vector.
void PciHal::fire(uint32_t vector) {
  if (vector >= nvec_) return;
  __atomic_add_fetch(&inflight_[vector], 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&live_[vector], __ATOMIC_SEQ_CST) && handlers_[vector]) handlers_[vector]->on_vector(vector);
  __atomic_sub_fetch(&inflight_[vector], 1, __ATOMIC_SEQ_CST);
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
uint32_t PciHal::pcie_cap() { return find_cap(0x10); }

// ---- Function-level reset (PCIe Base 6.6.2), the sequence of Linux's pci_reset_function:
// wait for Transactions Pending to clear, save what the reset clears, reset, wait 100 ms and for
// the function to answer, restore. After an FLR the BARs, the command register, Device Control
// and MSI-X (enable and table) are back at their reset values: left so, MMIO reads all ones and
// no interrupt is delivered. IOPCIDevice::Reset does the reset where the SDK has it; the
// restore is ours either way (writing back what it already restored changes nothing).
namespace {
constexpr uint32_t kDevCapFlr = 1u << 28;
constexpr uint16_t kDevCtlFlr = 1u << 15, kDevStaTransPending = 1u << 5;
constexpr uint32_t kMsixCapId = 0x11;
constexpr uint16_t kMsixEnable = 1u << 15, kMsixMaskAll = 1u << 14;
}  // namespace

uint32_t PciHal::find_cap(uint32_t id) {
  uint32_t at = config_read16(0x34) & 0xfc;
  for (int hops = 0; at >= 0x40 && hops < 48; hops++) {
    uint16_t head = config_read16(at);
    if ((head & 0xff) == id) return at;
    at = (head >> 8) & 0xfc;
  }
  return 0;
}

// Linux pci_wait_for_pending: look 4 times, 100, 200 and 400 ms apart; reset anyway after that.
bool PciHal::wait_transactions(uint32_t pcie) {
  for (int i = 0; i < 4; i++) {
    if (i) IOSleep(100u << (i - 1));
    if (!(config_read16(pcie + 0x0a) & kDevStaTransPending)) return true;
  }
  os_log_error(OS_LOG_DEFAULT, "MlxPCIDriver: transactions still pending after 700 ms; resetting the function anyway");
  return false;
}

void PciHal::save_config(uint32_t pcie, SavedConfig* s) {
  for (uint32_t i = 0; i < 16; i++) s->header[i] = config_read32(i * 4);
  s->devctl = config_read16(pcie + 0x08);
  s->devctl2 = config_read16(pcie + 0x28);
  s->msix = find_cap(kMsixCapId);
  s->vectors = 0;
  if (!s->msix) return;
  s->msix_ctl = config_read16(s->msix + 2);
  uint32_t table = config_read32(s->msix + 4);
  if ((table & 7) != bar_) return;  // the table is in another BAR: not ours to save
  s->table_off = table & ~7u;
  s->vectors = (s->msix_ctl & 0x7ff) + 1;
  if (s->vectors > kMaxSavedVectors) s->vectors = kMaxSavedVectors;
  for (uint32_t i = 0; i < s->vectors * 4; i++) pci_->MemoryRead32(bar_, s->table_off + i * 4, &s->table[i]);
}

// Linux pci_restore_state's order: PCIe Device Control, the header (BARs before the command
// register that enables decoding them), then MSI-X masked, its table, and unmasked.
void PciHal::restore_config(uint32_t pcie, const SavedConfig& s) {
  config_write16(pcie + 0x08, uint16_t(s.devctl & ~kDevCtlFlr));
  config_write16(pcie + 0x28, s.devctl2);
  for (uint32_t i = 15; i >= 2; i--) pci_->ConfigurationWrite32(i * 4, s.header[i]);
  pci_->ConfigurationWrite16(0x04, uint16_t(s.header[1]));  // command (status is write-one-to-clear)
  if (!s.msix) return;
  config_write16(s.msix + 2, uint16_t(s.msix_ctl | kMsixEnable | kMsixMaskAll));
  for (uint32_t i = 0; i < s.vectors * 4; i++) pci_->MemoryWrite32(bar_, s.table_off + i * 4, s.table[i]);
  config_write16(s.msix + 2, s.msix_ctl);
}

int PciHal::function_reset() {
  uint32_t cap = pcie_cap();
  if (!cap) return core::kHalUnsupported;
  if (!(config_read32(cap + 4) & kDevCapFlr)) return core::kHalUnsupported;
  wait_transactions(cap);
  SavedConfig s;
  save_config(cap, &s);
  if (pci_->Reset(kIOPCIDeviceResetTypeFunctionReset, kIOPCIDeviceResetOptionNone) != kIOReturnSuccess)
    config_write16(cap + 8, uint16_t(config_read16(cap + 8) | kDevCtlFlr));
  IOSleep(100);
  // The function may answer with Configuration Request Retry for a while (PCIe 2.3.1): up to 1 s more.
  for (int i = 0; i < 10 && (config_read32(0) & 0xffff) == 0xffff; i++) IOSleep(100);
  if ((config_read32(0) & 0xffff) == 0xffff) return core::kHalGone;
  restore_config(cap, s);
  return core::kHalOk;
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
  // The core and the queue platform want one IOVA-contiguous range. PrepareForDMA may describe it
  // as several segments; those that follow each other are one range (docs/macos.md: unverified how
  // often the DART hands out a range that does not).
  uint64_t contiguous = n ? segs[0].length : 0;
  for (uint32_t i = 1; i < n && segs[i].address == segs[0].address + contiguous; i++) contiguous += segs[i].length;
  if (!n || contiguous < len) {
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
  __atomic_store_n(&live_[vector], true, __ATOMIC_SEQ_CST);
  if (sources_[vector]->SetEnableWithCompletion(true, nullptr) != kIOReturnSuccess) {
    __atomic_store_n(&live_[vector], false, __ATOMIC_SEQ_CST);
    handlers_[vector] = nullptr;
    return core::kHalFault;
  }
  return core::kHalOk;
}

// Apple's SetEnableWithCompletion(false) returns before a handler already running on the interrupt
// queue has finished (only its completion runs after). The core frees the EQ right after this
// returns, so it waits here until no handler of the vector is inside the core. Never called from
// the vector's own handler.
void PciHal::vector_disable(uint32_t vector) {
  if (vector >= nvec_ || !handlers_[vector]) return;
  __atomic_store_n(&live_[vector], false, __ATOMIC_SEQ_CST);
  if (sources_[vector]) sources_[vector]->SetEnableWithCompletion(false, nullptr);
  while (__atomic_load_n(&inflight_[vector], __ATOMIC_SEQ_CST)) IOSleep(1);
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
