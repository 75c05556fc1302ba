#include "dext/driverkit/queue_memory.h"

namespace melon::dext {

namespace core = mlx5::core;

QueueMemory::QueueMemory(PciHal& hal, IOMemoryDescriptor* bar_md, void (*kick)(void*), void* ctx)
    : hal_(hal), bar_md_(bar_md), kick_(kick), ctx_(ctx) {
  if (bar_md_) bar_md_->retain();
  bar_.md = bar_md_;
  bar_.size = hal_.bar_size();
}

QueueMemory::~QueueMemory() { OSSafeReleaseNULL(bar_md_); }

int QueueMemory::queue_alloc(uint64_t size, Mem* out) {
  DmaRecord* r = nullptr;
  if (int e = hal_.map_buffer(size, hal_.host_page_size(), &r); e != core::kHalOk) return e;
  *out = Mem{uint64_t(uintptr_t(r)), r->iova, size, uint64_t(uintptr_t(r)), r->va};
  live_++;
  return core::kHalOk;
}

void QueueMemory::queue_free(const Mem& m) {
  if (!m.memory) return;
  hal_.unmap(reinterpret_cast<DmaRecord*>(uintptr_t(m.memory)));
  live_--;
}

// A client maps whole host pages, so its UAR region is the host page the UAR starts, and the core
// allocates UARs a host page at a time (Hca::alloc_uar) so that page holds no one else's doorbells.
// A UAR not at a host page boundary would share its page: refused, never mapped.
int QueueMemory::uar_map(const core::Uar& u, uapi::MapRegion* out) {
  uint64_t page = hal_.host_page_size();
  if (!bar_md_ || u.bar_off % page || u.bar_off + page > bar_.size) return core::kHalUnsupported;
  *out =
      uapi::MapRegion{uint8_t(uapi::MapKind::uar), uapi::kMapWriteCombine, uint64_t(uintptr_t(&bar_)), u.bar_off, page};
  return core::kHalOk;
}

int QueueMemory::pin_client(void* host, uint64_t addr, uint64_t len, bool writable, uint64_t* iova, uint64_t* token) {
  IOUserClient* uc = static_cast<IOUserClient*>(host);
  if (!uc || !len) return core::kHalFault;
  IOAddressSegment seg{addr, len};
  IOMemoryDescriptor* md = nullptr;
  uint64_t dir = writable ? kIOMemoryDirectionInOut : kIOMemoryDirectionOut;
  if (uc->CreateMemoryDescriptorFromClient(dir, 1, &seg, &md) != kIOReturnSuccess || !md) return core::kHalFault;
  DmaRecord* r = nullptr;
  int e = hal_.map_client(md, len, &r);
  md->release();  // the record holds its own reference
  if (e != core::kHalOk) return e;
  *iova = r->iova;
  *token = uint64_t(uintptr_t(r));
  live_++;
  return core::kHalOk;
}

void QueueMemory::unpin_client(uint64_t token) {
  if (!token) return;
  hal_.unmap(reinterpret_cast<DmaRecord*>(uintptr_t(token)));
  live_--;
}

IOMemoryDescriptor* QueueMemory::descriptor_for(const uapi::MapRegion& r) {
  DmaRecord* rec = reinterpret_cast<DmaRecord*>(uintptr_t(r.memory));
  if (!rec || !rec->md || !r.length || r.offset + r.length < r.offset) return nullptr;
  IOMemoryDescriptor* sub = nullptr;
  if (IOMemoryDescriptor::CreateSubMemoryDescriptor(kIOMemoryDirectionInOut, r.offset, r.length, rec->md, &sub) !=
      kIOReturnSuccess)
    return nullptr;
  return sub;
}

}  // namespace melon::dext
