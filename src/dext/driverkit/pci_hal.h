// The driver core's HAL (src/mlx5/core/hal.h) over PCIDriverKit: BAR0 through IOPCIDevice's
// MemoryRead32/MemoryWrite32/MemoryWrite64, configuration space (and FLR through the PCIe
// capability's Initiate Function Level Reset), DMA memory from IOBufferMemoryDescriptor mapped by
// IODMACommand, MSI-X vectors as IOInterruptDispatchSources (created by MlxPCIDriver, which owns
// their actions), IOLock, mach_absolute_time and os_log.
//
// DriverKit types only here and in the .iig classes; the logic is in src/mlx5/core and DextDevice.
#pragma once

#include <DriverKit/IOBufferMemoryDescriptor.h>
#include <DriverKit/IODMACommand.h>
#include <DriverKit/IOInterruptDispatchSource.h>
#include <PCIDriverKit/IOPCIDevice.h>

#include "mlx5/core/hal.h"

namespace melon::dext {

// A DMA buffer: its descriptor and the command that holds its IOVA mapping. The HAL's token and
// the queue platform's memory handle are pointers to one of these.
struct DmaRecord {
  IOMemoryDescriptor* md;  // an IOBufferMemoryDescriptor, or a client's memory (pinned MR)
  IODMACommand* cmd;
  uint64_t iova, size;
  void* va;  // the DEXT's own view (buffers only)
};

class PciHal final : public mlx5::core::Hal {
 public:
  static constexpr uint32_t kMaxVectors = 8;

  // `bar` is BAR0's memory index (GetBARInfo). `kick(ctx)` asks the owner for service() soon.
  PciHal(IOPCIDevice* pci, uint8_t bar, uint64_t bar_size, void (*kick)(void*), void* ctx);
  ~PciHal();

  // The vectors MlxPCIDriver created (disabled); vector i is sources[i].
  void set_vectors(IOInterruptDispatchSource* const* sources, uint32_t n);
  // From MlxPCIDriver::InterruptOccurred.
  void fire(uint32_t vector);

  // DMA shared with the queue platform: a buffer of `size` bytes whose IOVA is aligned to `align`
  // and contiguous (one segment), or a client range (`client_md`, already created).
  int map_buffer(uint64_t size, uint64_t align, DmaRecord** out);
  int map_client(IOMemoryDescriptor* client_md, uint64_t len, DmaRecord** out);
  void unmap(DmaRecord* r);
  uint64_t dma_records() const { return records_; }

  uint32_t read32(uint32_t off) override;
  void write32(uint32_t off, uint32_t value) override;
  void write64(uint32_t off, uint64_t value) override;
  uint64_t bar_size() override { return bar_size_; }
  uint16_t config_read16(uint32_t off) override;
  void config_write16(uint32_t off, uint16_t value) override;
  int function_reset() override;
  uint32_t host_page_size() override { return page_; }
  int dma_alloc(uint64_t size, uint64_t align, mlx5::core::DmaBuffer* out) override;
  void dma_free(const mlx5::core::DmaBuffer& buf) override;
  // The core pins client memory through the queue platform (MlxUserClient's descriptors), never here.
  int dma_pin(uint64_t, uint64_t, bool, mlx5::core::PinnedRange*) override { return mlx5::core::kHalUnsupported; }
  uint32_t dma_pinned_segments(const mlx5::core::PinnedRange&, uint32_t, mlx5::core::DmaSegment*, uint32_t) override {
    return 0;
  }
  void dma_unpin(const mlx5::core::PinnedRange&) override {}
  uint32_t vector_count() override { return nvec_; }
  int vector_enable(uint32_t vector, mlx5::core::VectorHandler* h) override;
  void vector_disable(uint32_t vector) override;
  void schedule_service() override { kick_(ctx_); }
  uint64_t now_ns() override;
  void delay_us(uint32_t us) override;
  void* lock_create() override;
  void lock_destroy(void* l) override;
  void lock(void* l) override;
  void unlock(void* l) override;
  void* mem_alloc(size_t size) override;
  void mem_free(void* p, size_t size) override;
  void log(mlx5::core::LogLevel level, const char* line) override;

 private:
  static constexpr uint32_t kMaxSavedVectors = 64;
  // What an FLR clears and function_reset() puts back.
  struct SavedConfig {
    uint32_t header[16];  // the type 0 header's dwords
    uint16_t devctl, devctl2;  // PCIe Device Control, Device Control 2
    uint32_t msix = 0;  // MSI-X capability offset, 0 if none
    uint16_t msix_ctl = 0;
    uint32_t table_off = 0, vectors = 0;
    uint32_t table[kMaxSavedVectors * 4];
  };
  uint32_t find_cap(uint32_t id);  // offset of capability `id`, 0 if none
  uint32_t pcie_cap();  // offset of the PCIe capability, 0 if none
  uint32_t config_read32(uint32_t off);
  bool wait_transactions(uint32_t pcie);
  void save_config(uint32_t pcie, SavedConfig* s);
  void restore_config(uint32_t pcie, const SavedConfig& s);

  IOPCIDevice* pci_;
  uint8_t bar_;
  uint64_t bar_size_;
  void (*kick_)(void*);
  void* ctx_;
  uint32_t page_ = 16384;  // IOVMPageSize (the constructor); the DMA sizes the core asks for are multiples
  uint32_t numer_ = 1, denom_ = 1;  // mach timebase
  IOInterruptDispatchSource* sources_[kMaxVectors] = {};
  mlx5::core::VectorHandler* handlers_[kMaxVectors] = {};
  bool live_[kMaxVectors] = {};  // enabled for the core: handlers may enter it
  uint32_t inflight_[kMaxVectors] = {};  // handlers between fire()'s entry and exit
  uint32_t nvec_ = 0;
  uint64_t records_ = 0;
};

}  // namespace melon::dext
