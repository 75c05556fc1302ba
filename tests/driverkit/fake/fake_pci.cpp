// The fake hardware side: an IOPCIDevice whose BAR0 and configuration space are the emulated
// ConnectX-4 Lx's, buffer and client memory descriptors, IODMACommand mapping through the
// emulator's IOMMU (TestHost), dispatch queues, interrupt sources fed by the emulator's MSI-X
// messages, and timer sources on their own threads.
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <thread>

#include "fake.h"
#include "fake_internal.h"

namespace melon::dkfake {

namespace emu = mlx5::emu;

namespace {
std::atomic<long> g_timers{0};
std::atomic<int> g_handlers_running{0};  // interrupt handlers inside their action, all cards
std::atomic<long> g_freed_in_handler{0};  // buffers freed while one was
std::atomic<long> g_buffers{0};  // IOBufferMemoryDescriptors alive, all cards
thread_local bool t_in_handler = false;
constexpr uint32_t kLegacyIndex = 0;  // interrupt index 0 is INTx; MSI-X vector v is index v + 1

struct CardIrq {
  std::mutex mu;
  std::map<uint16_t, IOInterruptDispatchSource*> sources;  // by MSI-X vector
  bool msix = false;  // ConfigureInterrupts succeeded
};

struct IrqImpl {
  Card* card = nullptr;
  uint16_t vector = 0;
  IODispatchQueue* queue = nullptr;
  OSAction* action = nullptr;
  std::mutex mu;  // held while the handler runs; disable waits on it
  bool enabled = false;
};

struct TimerImpl {
  IODispatchQueue* queue = nullptr;
  OSAction* action = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t deadline = 0;  // 0: not armed
  bool cancelled = false;
  std::thread th;
};

struct DmaImpl {
  Card* card = nullptr;
  uint64_t iova = 0;
};

std::map<Card*, CardIrq*>& irq_tables() {
  static std::map<Card*, CardIrq*> m;
  return m;
}
std::mutex g_irq_tables_mu;
CardIrq* irq_table(Card* c) {
  std::lock_guard<std::mutex> l(g_irq_tables_mu);
  auto& t = irq_tables()[c];
  if (!t) t = new CardIrq;
  return t;
}
uint64_t now_ns() {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}
}  // namespace

// ---- the card -------------------------------------------------------------------------------------

Card::Card(const CardOptions& o) {
  emu::HostPorts ports;
  ports.dma = &host_;
  ports.irq = &host_;
  ports.wire = o.wire;
  emu::DeviceConfig cfg;
  cfg.msix_vectors = o.msix_vectors;
  cfg.max_log_uar_page_sz = o.max_log_uar_page_sz;
  cfg.pci_device_id = o.device_id;
  dma_segment_bytes_ = o.dma_segment_bytes;
  dma_segment_gaps_ = o.dma_segment_gaps;
  cfg.mac[5] = o.mac_last;
  cfg.node_guid = (cfg.node_guid & ~0xffull) | o.mac_last;
  dev_ = std::make_unique<emu::Device>(ports, cfg);
  pci_ = new IOPCIDevice;
  pci_->init();
  service_impl(pci_)->card = this;
  irq_table(this);
  no_msix_ = !o.configure_msix;
  host_.on_irq = [this](uint16_t v) {
    CardIrq* t = irq_table(this);
    IOInterruptDispatchSource* src = nullptr;
    {
      std::lock_guard<std::mutex> l(t->mu);
      auto it = t->sources.find(v);
      if (it != t->sources.end()) src = it->second;
      if (src) src->retain();  // a Stop may cancel and release the source meanwhile
    }
    if (!src) return;
    // Apple's contract: the handler runs on the source's queue; disabling does not wait for a
    // handler already running (its completion runs after). So the enable flag is read, and the
    // action taken, under the source's lock, and the action runs without it.
    auto* ii = static_cast<IrqImpl*>(src->impl_);
    OSAction* act = nullptr;
    IODispatchQueue* queue = nullptr;
    {
      std::lock_guard<std::mutex> g(ii->mu);
      if (ii->enabled && ii->action) {
        act = ii->action, queue = ii->queue;
        act->retain(), queue->retain();
      }
    }
    src->release();
    if (!act) return;
    {
      std::lock_guard<std::recursive_mutex> q(queue_lock(queue));
      g_handlers_running++;
      t_in_handler = true;
      act->call_(act->target_, act, 1, now_ns());
      t_in_handler = false;
      g_handlers_running--;
    }
    act->release(), queue->release();
  };
  dev_->start_worker();
}

Card::~Card() {
  dev_->stop_worker();
  host_.on_irq = nullptr;
  pci_->release();
  std::lock_guard<std::mutex> l(g_irq_tables_mu);
  delete irq_tables()[this];
  irq_tables().erase(this);
}

size_t Card::dma_mappings() const { return host_.mapped_bytes(); }

void Card::block_handler_store(uint64_t bar_offset) {
  std::lock_guard<std::mutex> l(hook_mu_);
  hook_off_ = bar_offset, hook_armed_ = true, hook_blocked_ = false;
}
bool Card::wait_handler_blocked(int ms) {
  std::unique_lock<std::mutex> l(hook_mu_);
  return hook_cv_.wait_for(l, std::chrono::milliseconds(ms), [&] { return hook_blocked_; });
}
void Card::release_handler() {
  std::lock_guard<std::mutex> l(hook_mu_);
  hook_armed_ = false;
  hook_cv_.notify_all();
}
void Card::handler_store_hook(uint64_t off) {
  std::unique_lock<std::mutex> l(hook_mu_);
  if (!hook_armed_ || off != hook_off_) return;
  hook_blocked_ = true;
  hook_cv_.notify_all();
  hook_cv_.wait(l, [&] { return !hook_armed_; });
}
long freed_while_a_handler_runs() { return g_freed_in_handler.load(); }
long live_buffers() { return g_buffers.load(); }

static Card* card_of(IOService* s) { return service_impl(s)->card; }

}  // namespace melon::dkfake

using namespace melon::dkfake;

// ---- IOPCIDevice ------------------------------------------------------------------------------------

kern_return_t IOPCIDevice::Open(IOService* forClient, IOOptionBits) {
  ServiceImpl* si = service_impl(this);
  if (!si->card || !forClient) return kIOReturnBadArgument;
  if (si->open) return kIOReturnBusy;  // exclusive, as the SDK's session
  si->open = true;
  return kIOReturnSuccess;
}
void IOPCIDevice::Close(IOService*, IOOptionBits) { service_impl(this)->open = false; }

// Configuration space as Apple documents each accessor: the offset's bits 0 and 1 are ignored, so
// a 16-bit access always reaches the lower half of its dword. Reads fail as -1 when not open.
void IOPCIDevice::ConfigurationRead32(uint64_t off, uint32_t* v) {
  Card* c = card_of(this);
  *v = c && service_impl(this)->open ? c->device().config_read(uint32_t(off & ~3ull), 4) : 0xffffffffu;
}
void IOPCIDevice::ConfigurationRead16(uint64_t off, uint16_t* v) {
  Card* c = card_of(this);
  *v = c && service_impl(this)->open ? uint16_t(c->device().config_read(uint32_t(off & ~3ull), 2)) : 0xffff;
}
void IOPCIDevice::ConfigurationWrite32(uint64_t off, uint32_t v) {
  Card* c = card_of(this);
  if (!c || !service_impl(this)->open) return;
  off &= ~3ull;
  if (off == emu::kPciExpDevCtl && (v & emu::kPciExpDevCtlFlr)) c->flrs_++;
  c->device().config_write(uint32_t(off), 4, v);
}
void IOPCIDevice::ConfigurationWrite16(uint64_t off, uint16_t v) {
  Card* c = card_of(this);
  if (!c || !service_impl(this)->open) return;
  off &= ~3ull;
  if (off == emu::kPciExpDevCtl && (v & emu::kPciExpDevCtlFlr)) c->flrs_++;
  c->device().config_write(uint32_t(off), 2, v);
}
void IOPCIDevice::MemoryRead32(uint8_t idx, uint64_t off, uint32_t* v) {
  Card* c = card_of(this);
  *v = c && idx == 0 && service_impl(this)->open ? c->device().read32(off) : 0xffffffffu;
}
void IOPCIDevice::MemoryWrite32(uint8_t idx, uint64_t off, uint32_t v) {
  if (Card* c = card_of(this); c && t_in_handler) c->handler_store_hook(off);
  if (Card* c = card_of(this); c && idx == 0 && service_impl(this)->open) c->device().write32(off, v);
}
void IOPCIDevice::MemoryWrite64(uint8_t idx, uint64_t off, uint64_t v) {
  if (Card* c = card_of(this); c && idx == 0 && service_impl(this)->open) c->device().write64(off, v);
}
kern_return_t IOPCIDevice::GetBARInfo(uint8_t bar, uint8_t* memoryIndex, uint64_t* size, uint8_t* type) {
  if (bar != 0 || !card_of(this)) return kIOReturnBadArgument;
  *memoryIndex = 0;
  *size = melon::mlx5::emu::kBar0Bytes;
  *type = 2;  // 64-bit memory
  return kIOReturnSuccess;
}
kern_return_t IOPCIDevice::Reset(IOOptionBits type, IOOptionBits) {
  Card* c = card_of(this);
  if (!c || type != kIOPCIDeviceResetTypeFunctionReset) return kIOReturnUnsupported;
  // Apple does not document that Reset restores the configuration; this fake assumes the worst
  // and leaves it at the reset values the emulated card models (BARs, command, MSI-X).
  c->flrs_++;
  c->device().flr();
  return kIOReturnSuccess;
}
kern_return_t IOPCIDevice::ConfigureInterrupts(uint32_t type, uint32_t required, uint32_t requested, IOOptionBits) {
  Card* c = card_of(this);
  if (!c || c->no_msix_ || type != kIOInterruptTypePCIMessagedX) return kIOReturnUnsupported;
  if (required > c->device().config().msix_vectors) return kIOReturnNoResources;
  irq_table(c)->msix = true;
  (void)requested;
  return kIOReturnSuccess;
}
kern_return_t IOPCIDevice::_CopyDeviceMemoryWithIndex(uint64_t idx, IOMemoryDescriptor** memory, IOService*) {
  if (idx != 0 || !card_of(this)) return kIOReturnBadArgument;
  auto* md = new IOMemoryDescriptor;
  md->fake_device_ = true;
  md->fake_length_ = melon::mlx5::emu::kBar0Bytes;
  md->fake_card_ = card_of(this);
  *memory = md;
  return kIOReturnSuccess;
}

// ---- memory descriptors -----------------------------------------------------------------------------

kern_return_t IOMemoryDescriptor::GetLength(uint64_t* n) {
  *n = fake_length_;
  return kIOReturnSuccess;
}

kern_return_t IOMemoryDescriptor::CreateSubMemoryDescriptor(uint64_t, uint64_t offset, uint64_t length,
                                                            IOMemoryDescriptor* of, IOMemoryDescriptor** memory) {
  if (!of || !length || offset + length < offset || offset + length > of->fake_length_) return kIOReturnBadArgument;
  auto* md = new IOMemoryDescriptor;
  md->fake_parent_ = of;
  of->retain();
  md->fake_device_ = of->fake_device_;
  md->fake_card_ = of->fake_card_;
  md->fake_base_ = of->fake_base_ ? of->fake_base_ + offset : nullptr;
  md->fake_device_offset_ = of->fake_device_offset_ + offset;
  md->fake_length_ = length;
  *memory = md;
  return kIOReturnSuccess;
}

void IOMemoryDescriptor::free() {
  OSSafeReleaseNULL(fake_parent_);
  OSObject::free();
}

kern_return_t IOBufferMemoryDescriptor::Create(uint64_t, uint64_t capacity, uint64_t alignment,
                                               IOBufferMemoryDescriptor** memory) {
  if (!capacity) return kIOReturnBadArgument;
  size_t align = alignment < 16384 ? 16384 : size_t(alignment);
  size_t len = (capacity + align - 1) / align * align;
  void* p = aligned_alloc(align, len);
  if (!p) return kIOReturnNoMemory;
  memset(p, 0xa5, len);  // not zeroed: the glue must zero what it hands the core
  auto* b = new IOBufferMemoryDescriptor;
  g_buffers++;
  b->fake_base_ = static_cast<uint8_t*>(p);
  b->fake_capacity_ = capacity;
  b->fake_length_ = capacity;
  *memory = b;
  return kIOReturnSuccess;
}
kern_return_t IOBufferMemoryDescriptor::SetLength(uint64_t n) {
  if (n > fake_capacity_) return kIOReturnNoSpace;
  fake_length_ = n;
  return kIOReturnSuccess;
}
kern_return_t IOBufferMemoryDescriptor::GetAddressRange(IOAddressSegment* r) {
  *r = IOAddressSegment{uint64_t(uintptr_t(fake_base_)), fake_length_};
  return kIOReturnSuccess;
}
void IOBufferMemoryDescriptor::free() {
  if (g_handlers_running.load()) g_freed_in_handler++;
  if (fake_base_) g_buffers--;
  ::free(fake_base_);
  fake_base_ = nullptr;
  IOMemoryDescriptor::free();
}

// ---- DMA --------------------------------------------------------------------------------------------

kern_return_t IODMACommand::Create(IOService* device, uint64_t, const IODMACommandSpecification* spec,
                                   IODMACommand** command) {
  IOPCIDevice* pci = OSDynamicCast(IOPCIDevice, device);
  if (!pci || !card_of(pci) || !spec || spec->maxAddressBits < 32) return kIOReturnBadArgument;
  auto* c = new IODMACommand;
  auto* d = new DmaImpl;
  d->card = card_of(pci);
  c->impl_ = d;
  *command = c;
  return kIOReturnSuccess;
}

kern_return_t IODMACommand::PrepareForDMA(uint64_t, IOMemoryDescriptor* md, uint64_t offset, uint64_t length,
                                          uint64_t* flags, uint32_t* count, IOAddressSegment segments[32]) {
  auto* d = static_cast<DmaImpl*>(impl_);
  if (d->iova) return kIOReturnBusy;  // one preparation at a time, as the SDK's
  if (!md || md->fake_device_ || !md->fake_base_ || !length || offset + length > md->fake_length_ || !*count)
    return kIOReturnBadArgument;
  // A DART maps 16 KiB pages: page-aligned memory gets a 16 KiB-aligned IOVA.
  uint64_t iova = d->card->host().map(md->fake_base_ + offset, length, 16384);
  if (!iova) return kIOReturnNoResources;
  d->iova = iova;
  // Apple's PrepareForDMA may describe one mapping as several segments (up to *count): with
  // dma_segment_bytes set the fake reports the IOVA range in pieces of that size.
  uint64_t piece = d->card->dma_segment_bytes_ ? d->card->dma_segment_bytes_ : length;
  uint32_t n = 0;
  // dma_segment_gaps: the pieces are reported apart, as an IOMMU that could not map the range in
  // one run would (the addresses past the first piece then lead nowhere: the driver must refuse).
  uint64_t gap = d->card->dma_segment_gaps_ ? 0x100000 : 0;
  for (uint64_t at = 0; at < length && n < *count; at += piece, n++)
    segments[n] = IOAddressSegment{iova + at + n * gap, length - at < piece ? length - at : piece};
  if (uint64_t(n) * piece < length) {  // more pieces than the caller has room for
    d->card->host().unmap(iova);
    d->iova = 0;
    return kIOReturnNoSpace;
  }
  *count = n;
  *flags = 0;
  return kIOReturnSuccess;
}

kern_return_t IODMACommand::CompleteDMA(uint64_t) {
  auto* d = static_cast<DmaImpl*>(impl_);
  if (!d->iova) return kIOReturnNotReady;
  d->card->host().unmap(d->iova);
  d->iova = 0;
  return kIOReturnSuccess;
}

void IODMACommand::free() {
  auto* d = static_cast<DmaImpl*>(impl_);
  if (d && d->iova) d->card->host().unmap(d->iova);  // the SDK completes a prepared command on release
  delete d;
  impl_ = nullptr;
  OSObject::free();
}

// ---- dispatch ----------------------------------------------------------------------------------------

namespace melon::dkfake {
std::recursive_mutex& queue_lock(IODispatchQueue* q) { return static_cast<QueueImpl*>(q->impl_)->m; }
}  // namespace melon::dkfake

kern_return_t IODispatchQueue::Create(const char*, uint64_t, uint64_t, IODispatchQueue** queue) {
  auto* q = new IODispatchQueue;
  q->impl_ = new QueueImpl;
  *queue = q;
  return kIOReturnSuccess;
}
void IODispatchQueue::free() {
  delete static_cast<QueueImpl*>(impl_);
  impl_ = nullptr;
  OSObject::free();
}

kern_return_t IODispatchSource::SetEnableWithCompletion(bool, IODispatchSourceCancelHandler) {
  return kIOReturnUnsupported;
}
kern_return_t IODispatchSource::Cancel(IODispatchSourceCancelHandler) { return kIOReturnUnsupported; }

kern_return_t IOInterruptDispatchSource::GetInterruptType(IOService* provider, uint32_t index, uint64_t* type) {
  Card* c = card_of(provider);
  if (!c) return kIOReturnBadArgument;
  if (index == kLegacyIndex) {
    *type = kIOInterruptTypeLevel;
    return kIOReturnSuccess;
  }
  if (!irq_table(c)->msix || index > c->device().config().msix_vectors) return kIOReturnNoInterrupt;
  *type = kIOInterruptTypePCIMessagedX;
  return kIOReturnSuccess;
}

kern_return_t IOInterruptDispatchSource::Create(IOService* provider, uint32_t index, IODispatchQueue* queue,
                                                IOInterruptDispatchSource** source) {
  Card* c = card_of(provider);
  uint64_t type = 0;
  if (!c || !queue || GetInterruptType(provider, index, &type) != kIOReturnSuccess) return kIOReturnBadArgument;
  if (index == kLegacyIndex) return kIOReturnUnsupported;  // the emulator raises MSI-X only
  auto* s = new IOInterruptDispatchSource;
  auto* ii = new IrqImpl;
  ii->card = c;
  ii->vector = uint16_t(index - 1);
  ii->queue = queue;
  queue->retain();
  s->impl_ = ii;
  CardIrq* t = irq_table(c);
  std::lock_guard<std::mutex> l(t->mu);
  if (t->sources.count(ii->vector)) {
    ii->queue->release();
    delete ii;
    s->impl_ = nullptr;
    s->release();
    return kIOReturnExclusiveAccess;
  }
  t->sources[ii->vector] = s;
  *source = s;
  return kIOReturnSuccess;
}

kern_return_t IOInterruptDispatchSource::SetHandler(OSAction* action) {
  auto* ii = static_cast<IrqImpl*>(impl_);
  std::lock_guard<std::mutex> g(ii->mu);
  if (action) action->retain();
  if (ii->action) ii->action->release();
  ii->action = action;
  return kIOReturnSuccess;
}

// Apple: the completion runs after pending handlers complete, so disabling itself returns at once,
// possibly while a handler still runs on the source's queue. The completion then runs on that
// queue, after the handler.
kern_return_t IOInterruptDispatchSource::SetEnableWithCompletion(bool enable, IODispatchSourceCancelHandler done) {
  auto* ii = static_cast<IrqImpl*>(impl_);
  IODispatchQueue* queue = nullptr;
  {
    std::lock_guard<std::mutex> g(ii->mu);
    ii->enabled = enable;
    queue = ii->queue;
  }
  if (done) {
    std::thread([queue, done] {
      std::lock_guard<std::recursive_mutex> q(queue_lock(queue));
      done();
    }).detach();
  }
  return kIOReturnSuccess;
}

kern_return_t IOInterruptDispatchSource::Cancel(IODispatchSourceCancelHandler) {
  auto* ii = static_cast<IrqImpl*>(impl_);
  if (!ii) return kIOReturnSuccess;
  {
    CardIrq* t = irq_table(ii->card);
    std::lock_guard<std::mutex> l(t->mu);
    auto it = t->sources.find(ii->vector);
    if (it != t->sources.end() && it->second == this) t->sources.erase(it);
  }
  std::lock_guard<std::mutex> g(ii->mu);
  ii->enabled = false;
  return kIOReturnSuccess;
}

void IOInterruptDispatchSource::free() {
  if (auto* ii = static_cast<IrqImpl*>(impl_)) {
    Cancel(nullptr);
    if (ii->action) ii->action->release();
    ii->queue->release();
    delete ii;
  }
  impl_ = nullptr;
  OSObject::free();
}

// Timers: one thread each. The handler runs holding the queue's lock; the thread gives up waiting
// for that lock when the timer is cancelled (the canceller may hold it: Stop runs on the same queue).
kern_return_t IOTimerDispatchSource::Create(IODispatchQueue* queue, IOTimerDispatchSource** source) {
  if (!queue) return kIOReturnBadArgument;
  auto* s = new IOTimerDispatchSource;
  auto* ti = new TimerImpl;
  ti->queue = queue;
  queue->retain();
  s->impl_ = ti;
  g_timers++;
  ti->th = std::thread([ti] {
    std::unique_lock<std::mutex> l(ti->mu);
    for (;;) {
      if (ti->cancelled) return;
      if (!ti->deadline) {
        ti->cv.wait(l);
        continue;
      }
      uint64_t now = now_ns();
      if (now < ti->deadline) {
        ti->cv.wait_for(l, std::chrono::nanoseconds(ti->deadline - now));
        continue;
      }
      ti->deadline = 0;
      OSAction* a = ti->action;
      if (!a) continue;
      a->retain();
      l.unlock();
      auto& qm = queue_lock(ti->queue);
      bool got = false;
      while (!(got = qm.try_lock())) {
        {
          std::lock_guard<std::mutex> g(ti->mu);
          if (ti->cancelled) break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (got) {
        a->call_(a->target_, a, now_ns(), 0);
        qm.unlock();
      }
      a->release();
      l.lock();
    }
  });
  *source = s;
  return kIOReturnSuccess;
}

kern_return_t IOTimerDispatchSource::SetHandler(OSAction* action) {
  auto* ti = static_cast<TimerImpl*>(impl_);
  std::lock_guard<std::mutex> g(ti->mu);
  if (action) action->retain();
  if (ti->action) ti->action->release();
  ti->action = action;
  return kIOReturnSuccess;
}

kern_return_t IOTimerDispatchSource::WakeAtTime(uint64_t, uint64_t deadline, uint64_t) {
  auto* ti = static_cast<TimerImpl*>(impl_);
  std::lock_guard<std::mutex> g(ti->mu);
  if (ti->cancelled) return kIOReturnNotReady;
  ti->deadline = deadline ? deadline : 1;
  ti->cv.notify_all();
  return kIOReturnSuccess;
}

kern_return_t IOTimerDispatchSource::SetEnableWithCompletion(bool, IODispatchSourceCancelHandler) {
  return kIOReturnSuccess;
}

kern_return_t IOTimerDispatchSource::Cancel(IODispatchSourceCancelHandler) {
  auto* ti = static_cast<TimerImpl*>(impl_);
  {
    std::lock_guard<std::mutex> g(ti->mu);
    if (ti->cancelled) return kIOReturnSuccess;
    ti->cancelled = true;
    ti->cv.notify_all();
  }
  if (ti->th.joinable() && ti->th.get_id() != std::this_thread::get_id()) ti->th.join();
  return kIOReturnSuccess;
}

void IOTimerDispatchSource::free() {
  if (auto* ti = static_cast<TimerImpl*>(impl_)) {
    Cancel(nullptr);
    if (ti->th.joinable()) ti->th.detach();
    if (ti->action) ti->action->release();
    ti->queue->release();
    delete ti;
    g_timers--;
  }
  impl_ = nullptr;
  OSObject::free();
}

namespace melon::dkfake {
long live_timers() { return g_timers.load(); }
}  // namespace melon::dkfake
