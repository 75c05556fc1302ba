// The driver core's QueuePlatform in the DEXT (src/mlx5/core/uapi_backend.h): queue memory is an
// IOBufferMemoryDescriptor the device reaches through IODMACommand and the client maps through
// CopyClientMemoryForType; a UAR page is a piece of BAR0's device memory; an MR pins the client's
// range through IOUserClient::CreateMemoryDescriptorFromClient. A MapRegion's `memory` is a
// DmaRecord (queue buffers) or the BAR record; descriptor_for() turns a region into the
// descriptor CopyClientMemoryForType returns.
#pragma once

#include <DriverKit/IOUserClient.h>

#include "dext/driverkit/pci_hal.h"
#include "mlx5/core/uapi_backend.h"

namespace melon::dext {

class QueueMemory final : public mlx5::core::QueuePlatform {
 public:
  // `bar_md` is BAR0's device memory (IOPCIDevice::_CopyDeviceMemoryWithIndex), retained here;
  // null leaves UARs unmappable (alloc_uar then fails with no_memory).
  QueueMemory(PciHal& hal, IOMemoryDescriptor* bar_md, void (*kick)(void*), void* ctx);
  ~QueueMemory();

  int queue_alloc(uint64_t size, Mem* out) override;
  void queue_free(const Mem& m) override;
  int uar_map(const mlx5::core::Uar& u, uapi::MapRegion* out) override;
  void uar_unmap(const mlx5::core::Uar&) override {}
  // `host` is the MlxUserClient of the calling client (uapi::Client::host).
  int pin_client(void* host, uint64_t addr, uint64_t len, bool writable, uint64_t* iova, uint64_t* token) override;
  void unpin_client(uint64_t token) override;
  void events_pending() override { kick_(ctx_); }

  // A new reference to the descriptor for `r` (a sub-range of its memory object), or null.
  IOMemoryDescriptor* descriptor_for(const uapi::MapRegion& r);
  uint64_t live() const { return live_; }

 private:
  PciHal& hal_;
  IOMemoryDescriptor* bar_md_;
  void (*kick_)(void*);
  void* ctx_;
  DmaRecord bar_{};  // the UAR regions' memory object
  uint64_t live_ = 0;
};

}  // namespace melon::dext
