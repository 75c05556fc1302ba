// MlxPCIDriver (MlxPCIDriver.iig): DriverKit's life cycle, translated to DextDevice. All the
// device logic is in src/mlx5/core; this file opens the function, checks it is there, sets up
// vectors, the service timer and the HAL, runs start()/stop(), and publishes MelonState.
#include <DriverKit/IODispatchQueue.h>
#include <DriverKit/IOInterruptDispatchSource.h>
#include <DriverKit/IOLib.h>
#include <DriverKit/IOTimerDispatchSource.h>
#include <DriverKit/IOUserClient.h>
#include <DriverKit/OSCollections.h>
#include <PCIDriverKit/PCIDriverKit.h>
#include <mach/mach_time.h>
#include <os/log.h>

#include <MlxPCIDriver.h>  // iig's output, from the build's include path (tests/driverkit/generated on Linux)
#include "dext/driverkit/dext_device.h"
#include "dext/driverkit/driver_parts.h"
#include "dext/driverkit/pci_devices.h"
#include "dext/driverkit/pci_hal.h"
#include "dext/driverkit/placement.h"
#include "dext/driverkit/queue_memory.h"
#include "uapi/iokit.h"

using melon::dext::DextDevice;
using melon::dext::DextState;
using melon::dext::DriverParts;
using melon::dext::PciHal;
using melon::dext::QueueMemory;
namespace core = melon::mlx5::core;

namespace {
constexpr uint32_t kWantVectors = 4;  // async EQ + completion EQs; more than the core uses is harmless
constexpr uint64_t kServicePeriodNs = 500ull * 1000 * 1000;  // the core polls health every 2 s itself
constexpr uint64_t kMaxInterruptIndex = 64;
}  // namespace

struct MlxPCIDriver_IVars {
  IOPCIDevice* pci;
  bool open;
  IODispatchQueue* irq_queue;
  IOInterruptDispatchSource* irq[PciHal::kMaxVectors];
  OSAction* irq_action[PciHal::kMaxVectors];
  uint32_t nvec;
  IOTimerDispatchSource* timer;
  OSAction* timer_action;
  IOMemoryDescriptor* bar_md;
  PciHal* hal;
  QueueMemory* queues;
  DextDevice* dev;
  DriverParts* parts;  // shared with the user clients (driver_parts.h)
  DextState published;  // what the registry shows, once `shown`
  bool shown;
  uint32_t numer, denom;  // mach timebase
};

bool MlxPCIDriver::init() {
  if (!super::init()) return false;
  ivars = IONewZero(MlxPCIDriver_IVars, 1);
  return ivars != nullptr;
}

void MlxPCIDriver::free() {
  IOSafeDeleteNULL(ivars, MlxPCIDriver_IVars, 1);
  super::free();
}

// MelonState in the registry (the operator scripts read it). A failed SetProperties is logged and
// left unpublished, so the service timer tries again.
static void publish_state(MlxPCIDriver* self, DextState s) {
  OSDictionary* d = OSDictionary::withCapacity(1);
  OSString* v = OSString::withCString(melon::dext::dext_state_name(s));
  kern_return_t r = d && v && d->setObject("MelonState", v) ? self->SetProperties(d) : kIOReturnNoMemory;
  OSSafeReleaseNULL(v);
  OSSafeReleaseNULL(d);
  if (r != kIOReturnSuccess) {
    os_log_error(OS_LOG_DEFAULT, "MlxPCIDriver: SetProperties(MelonState %{public}s) failed: 0x%x",
                 melon::dext::dext_state_name(s), r);
    return;
  }
  self->ivars->published = s;
  self->ivars->shown = true;
  os_log(OS_LOG_DEFAULT, "MlxPCIDriver: MelonState %{public}s", melon::dext::dext_state_name(s));
}

static uint64_t ns_to_abs(const MlxPCIDriver_IVars* iv, uint64_t ns) { return ns / iv->numer * iv->denom; }

static void kick(void* ctx) { static_cast<MlxPCIDriver*>(ctx)->KickService(); }

// Vectors: the function's MSI-X messages as interrupt sources on their own queue (never the default
// queue, which Start() blocks while bring-up waits for the firmware). Fewer than asked, or none,
// is fine: the core then polls.
static void setup_vectors(MlxPCIDriver* self) {
  MlxPCIDriver_IVars* iv = self->ivars;
  if (IODispatchQueue::Create("MlxInterrupts", 0, 0, &iv->irq_queue) != kIOReturnSuccess) {
    iv->irq_queue = nullptr;
    return;
  }
  if (iv->pci->ConfigureInterrupts(kIOInterruptTypePCIMessagedX, 1, kWantVectors, 0) != kIOReturnSuccess)
    os_log(OS_LOG_DEFAULT, "MlxPCIDriver: MSI-X not configured; using what the function offers");
  for (uint32_t index = 0; index < kMaxInterruptIndex && iv->nvec < kWantVectors; index++) {
    uint64_t type = 0;
    if (IOInterruptDispatchSource::GetInterruptType(iv->pci, index, &type) != kIOReturnSuccess) break;
    if (!(type & (kIOInterruptTypePCIMessaged | kIOInterruptTypePCIMessagedX))) continue;
    IOInterruptDispatchSource* src = nullptr;
    OSAction* act = nullptr;
    if (IOInterruptDispatchSource::Create(iv->pci, index, iv->irq_queue, &src) != kIOReturnSuccess) break;
    if (self->CreateActionInterruptOccurred(sizeof(uint32_t), &act) != kIOReturnSuccess ||
        src->SetHandler(act) != kIOReturnSuccess) {
      OSSafeReleaseNULL(act);
      OSSafeReleaseNULL(src);
      break;
    }
    *static_cast<uint32_t*>(act->GetReference()) = iv->nvec;
    iv->irq[iv->nvec] = src;
    iv->irq_action[iv->nvec] = act;
    iv->nvec++;
  }
}

static kern_return_t setup_timer(MlxPCIDriver* self) {
  MlxPCIDriver_IVars* iv = self->ivars;
  IODispatchQueue* q = nullptr;
  kern_return_t ret = self->CopyDispatchQueue(kIOServiceDefaultQueueName, &q);
  if (ret != kIOReturnSuccess) return ret;
  ret = IOTimerDispatchSource::Create(q, &iv->timer);
  q->release();
  if (ret != kIOReturnSuccess) return ret;
  ret = self->CreateActionServiceTimer(0, &iv->timer_action);
  if (ret == kIOReturnSuccess) ret = iv->timer->SetHandler(iv->timer_action);
  return ret;
}

// The device, its queue memory and its HAL, and the parts that share them: freed by whoever lets
// go last, the driver's Stop or a user client's (driver_parts.h).
struct OwnedParts {
  DriverParts parts;  // first: a DriverParts* is an OwnedParts*
  PciHal* hal;
};

static void free_device(DextDevice* dev, QueueMemory* queues, PciHal* hal) {
  if (dev) {
    dev->~DextDevice();
    IOFree(dev, sizeof(DextDevice));
  }
  if (queues) {
    queues->~QueueMemory();
    IOFree(queues, sizeof(QueueMemory));
  }
  if (hal) {
    hal->~PciHal();
    IOFree(hal, sizeof(PciHal));
  }
}

static void free_parts(DriverParts* p) {
  OwnedParts* o = reinterpret_cast<OwnedParts*>(p);
  free_device(p->dev, p->queues, o->hal);
  IOFree(o, sizeof(OwnedParts));
}

// Everything Start() made, in reverse; safe on a partial Start. Clients still attached are
// detached by stop() and keep the stopped device until they go.
static void release_all(MlxPCIDriver* self) {
  MlxPCIDriver_IVars* iv = self->ivars;
  if (iv->timer) iv->timer->Cancel(nullptr);
  if (iv->dev) {
    core::Err e = iv->dev->stop();
    if (e != core::Err::ok) os_log_error(OS_LOG_DEFAULT, "MlxPCIDriver: stop: %{public}s", core::err_name(e));
  }
  if (iv->hal) iv->hal->set_vectors(nullptr, 0);  // the sources go below; a HAL kept alive must not reach them
  if (iv->parts) {
    release_parts(iv->parts);
  } else {
    free_device(iv->dev, iv->queues, iv->hal);
  }
  iv->parts = nullptr, iv->dev = nullptr, iv->queues = nullptr, iv->hal = nullptr;
  for (uint32_t v = 0; v < iv->nvec; v++) {
    iv->irq[v]->Cancel(nullptr);
    OSSafeReleaseNULL(iv->irq[v]);
    OSSafeReleaseNULL(iv->irq_action[v]);
  }
  iv->nvec = 0;
  OSSafeReleaseNULL(iv->timer);
  OSSafeReleaseNULL(iv->timer_action);
  OSSafeReleaseNULL(iv->irq_queue);
  OSSafeReleaseNULL(iv->bar_md);
  if (iv->open) iv->pci->Close(self, 0);
  iv->open = false;
  iv->pci = nullptr;
}

template <class T, class... A>
static T* make(A&&... a) {
  void* m = IOMallocZero(sizeof(T));
  return m ? new (m) T(static_cast<A&&>(a)...) : nullptr;
}

static kern_return_t start_device(MlxPCIDriver* self, IOService* provider) {
  MlxPCIDriver_IVars* iv = self->ivars;
  iv->pci = OSDynamicCast(IOPCIDevice, provider);
  if (!iv->pci) return kIOReturnNoDevice;
  kern_return_t ret = iv->pci->Open(self, 0);
  if (ret != kIOReturnSuccess) {
    os_log_error(OS_LOG_DEFAULT, "MlxPCIDriver: cannot open the PCI function: 0x%x", ret);
    return ret;
  }
  iv->open = true;
  // A card that lost power or its link answers every read with all ones: nothing can bring it back
  // but a cold power cycle (scripts/macos look for exactly this line). Vendor and device ID are one
  // dword: Apple's ConfigurationRead16 ignores offset bits 0 and 1, so 0x02 would read 0x00 again.
  uint32_t id = 0xffffffffu;
  iv->pci->ConfigurationRead32(kIOPCIConfigurationOffsetVendorID, &id);
  uint16_t vendor = uint16_t(id), device = uint16_t(id >> 16);
  if (vendor == 0xffff) {
    os_log_error(OS_LOG_DEFAULT, "MlxPCIDriver: config space reads 0xffff");
    return kIOReturnNoDevice;
  }
  // Only what the core drives (pci_devices.h), refused before anything touches the function: the
  // card goes back to the next driver that matches it.
  const melon::dext::PciDevice* known = melon::dext::find_pci_device(vendor, device);
  if (!known) {
    os_log_error(OS_LOG_DEFAULT, "MlxPCIDriver: %04x:%04x is not a device this driver supports; leaving it", vendor,
                 device);
    return kIOReturnUnsupported;
  }
  os_log(OS_LOG_DEFAULT, "MlxPCIDriver: function %04x:%04x (%{public}s)", vendor, device, known->family);

  uint8_t bar = 0, bar_type = 0;
  uint64_t bar_size = 0;
  ret = iv->pci->GetBARInfo(0, &bar, &bar_size, &bar_type);
  if (ret != kIOReturnSuccess || !bar_size) {
    os_log_error(OS_LOG_DEFAULT, "MlxPCIDriver: no BAR0: 0x%x", ret);
    return ret != kIOReturnSuccess ? ret : kIOReturnNoDevice;
  }
  if (iv->pci->_CopyDeviceMemoryWithIndex(bar, &iv->bar_md, self) != kIOReturnSuccess) {
    iv->bar_md = nullptr;
    os_log(OS_LOG_DEFAULT, "MlxPCIDriver: BAR0 not mappable; clients get no UAR");
  }
  mach_timebase_info_data_t tb{};
  mach_timebase_info(&tb);
  iv->numer = tb.numer ? tb.numer : 1, iv->denom = tb.denom ? tb.denom : 1;

  setup_vectors(self);
  if ((ret = setup_timer(self)) != kIOReturnSuccess) return ret;
  iv->hal = make<PciHal>(iv->pci, bar, bar_size, kick, static_cast<void*>(self));
  if (iv->hal) iv->queues = make<QueueMemory>(*iv->hal, iv->bar_md, kick, static_cast<void*>(self));
  if (iv->queues) iv->dev = make<DextDevice>(*iv->hal, *iv->queues);
  if (!iv->dev) return kIOReturnNoMemory;
  iv->dev->set_wake(melon::dext::user_client_wake());
  iv->hal->set_vectors(iv->irq, iv->nvec);
  OwnedParts* o = make<OwnedParts>();
  if (!o) return kIOReturnNoMemory;
  *o = OwnedParts{DriverParts{iv->dev, iv->queues, free_parts, 1}, iv->hal};
  iv->parts = &o->parts;

  core::Err e = iv->dev->start();
  if (e != core::Err::ok) {
    const core::Failure& f = iv->dev->last_failure();
    os_log_error(OS_LOG_DEFAULT,
                 "MlxPCIDriver: bring-up failed at %{public}s: %{public}s (opcode 0x%x status 0x%x syndrome 0x%x)",
                 core::stage_name(f.stage), core::err_name(f.err), f.cmd.opcode, f.cmd.status, f.cmd.syndrome);
    return kIOReturnNotReady;
  }
  iv->timer->WakeAtTime(kIOTimerClockMachAbsoluteTime, mach_absolute_time() + ns_to_abs(iv, kServicePeriodNs), 0);
  return kIOReturnSuccess;
}

kern_return_t IMPL(MlxPCIDriver, Start) {
  kern_return_t ret = Start(provider, SUPERDISPATCH);
  if (ret != kIOReturnSuccess) return ret;
  publish_state(this, DextState::starting);
  ret = start_device(this, provider);
  if (ret != kIOReturnSuccess) {
    release_all(this);
    publish_state(this, DextState::fatal);
    Stop(provider, SUPERDISPATCH);
    return ret;
  }
  publish_state(this, DextState::ready);
  return RegisterService();
}

kern_return_t IMPL(MlxPCIDriver, Stop) {
  release_all(this);
  publish_state(this, DextState::stopped);
  return Stop(provider, SUPERDISPATCH);
}

kern_return_t IMPL(MlxPCIDriver, NewUserClient) {
  if (!ivars->dev || ivars->dev->state() != DextState::ready) return kIOReturnNotReady;
  if (type != melon::uapi::iokit::kUserClientType) return kIOReturnBadArgument;
  IOService* s = nullptr;
  kern_return_t ret = Create(this, "MlxUserClientProperties", &s);
  if (ret != kIOReturnSuccess) {
    os_log_error(OS_LOG_DEFAULT, "MlxPCIDriver: cannot create the user client: 0x%x", ret);
    return ret;
  }
  *userClient = OSDynamicCast(IOUserClient, s);
  if (!*userClient) {
    s->release();
    return kIOReturnError;
  }
  return kIOReturnSuccess;
}

void IMPL(MlxPCIDriver, InterruptOccurred) {
  if (ivars->hal) ivars->hal->fire(*static_cast<uint32_t*>(action->GetReference()));
}

void IMPL(MlxPCIDriver, ServiceTimer) {
  MlxPCIDriver_IVars* iv = ivars;
  if (!iv->dev || !iv->timer) return;
  iv->dev->service();
  if (iv->dev->state() != iv->published || !iv->shown) publish_state(this, iv->dev->state());
  iv->timer->WakeAtTime(kIOTimerClockMachAbsoluteTime, mach_absolute_time() + ns_to_abs(iv, kServicePeriodNs), 0);
}

void* MlxPCIDriver::CoreDevice() {
  return ivars && ivars->dev && ivars->parts && ivars->dev->state() == DextState::ready ? ivars->parts : nullptr;
}

void MlxPCIDriver::KickService() {
  if (ivars && ivars->timer) ivars->timer->WakeAtTime(kIOTimerClockMachAbsoluteTime, mach_absolute_time(), 0);
}
