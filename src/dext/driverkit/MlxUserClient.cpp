// MlxUserClient (MlxUserClient.iig): one application's connection, translated to DextDevice. The
// trust boundary's rules are src/uapi's (uapi::Server): this file only checks the opener's
// entitlement, moves bytes between IOKit's arguments and the server, and keeps the registry's
// counts current.
#include <DriverKit/IOLib.h>
#include <DriverKit/IOUserClient.h>
#include <DriverKit/OSCollections.h>
#include <os/log.h>
#include <string.h>

#include <MlxPCIDriver.h>  // iig's output, from the build's include path
#include <MlxUserClient.h>
#include "dext/driverkit/dext_device.h"
#include "dext/driverkit/driver_parts.h"
#include "dext/driverkit/placement.h"
#include "dext/driverkit/queue_memory.h"
#include "uapi/iokit.h"

#ifndef MLX_DEXT_ID
#error "MLX_DEXT_ID (src/dext/bundle.env) must be defined by the build"
#endif

namespace uapi = melon::uapi;
using melon::dext::DextDevice;
using melon::dext::DriverParts;

namespace {
constexpr const char* kUserClientAccess = "com.apple.developer.driverkit.userclient-access";
constexpr uint32_t kMaxResponse = 512;  // the largest response (DeviceAttr) is 128 bytes
// Descriptors handed out, one per memory type: every mapping the quotas allow (4 UARs, 64 QPs of
// SQ/RQ and record, 64 CQs of ring and record, 16 SRQs of ring and record) fits.
constexpr uint32_t kMaxMaps = 512;
struct MapEntry {
  uint64_t type;
  IOMemoryDescriptor* md;  // the table's reference
};
}  // namespace

struct MlxUserClient_IVars {
  DriverParts* parts;
  uapi::Client* client;
  bool attached;
  bool published;
  uint32_t qps, mrs;
  uint32_t nmaps;
  MapEntry maps[kMaxMaps];
  void*
      wake;  // OSAction*: the client's asynchronous wake call (kSelectorEventWake), retained; set and read under the device lock
};

// The descriptors of a destroyed object's memory types go with it (map_type's low 24 bits are its
// handle), or its queue memory would stay until the client goes; a resized CQ's ring descriptor
// goes too (`kind` Cqe), so the next CopyClientMemoryForType describes the new ring.
static void forget_maps(MlxUserClient_IVars* iv, uint32_t handle, uint32_t kind = 0) {
  for (uint32_t i = 0; i < iv->nmaps;) {
    if ((iv->maps[i].type & 0xffffffu) == (handle & 0xffffffu) && (!kind || (iv->maps[i].type >> 24) == kind)) {
      OSSafeReleaseNULL(iv->maps[i].md);
      iv->maps[i] = iv->maps[--iv->nmaps];
    } else {
      i++;
    }
  }
}

static void forget_all_maps(MlxUserClient_IVars* iv) {
  for (uint32_t i = 0; i < iv->nmaps; i++) OSSafeReleaseNULL(iv->maps[i].md);
  iv->nmaps = 0;
}

bool MlxUserClient::init() {
  if (!super::init()) return false;
  ivars = IONewZero(MlxUserClient_IVars, 1);
  return ivars != nullptr;
}

void MlxUserClient::free() {
  IOSafeDeleteNULL(ivars, MlxUserClient_IVars, 1);
  super::free();
}

// The opener must hold userclient-access naming this driver (a string or an array of strings).
// The kernel checks the same through the personality's IOServiceDEXTEntitlements; checking here too
// keeps a driver that is loaded with a wrong personality from serving anyone.
static bool entitled(MlxUserClient* self) {
  OSDictionary* ents = nullptr;
  if (self->CopyClientEntitlements(&ents) != kIOReturnSuccess || !ents) return false;
  bool ok = false;
  OSObject* v = ents->getObject(kUserClientAccess);
  if (OSString* s = OSDynamicCast(OSString, v)) {
    ok = s->isEqualTo(MLX_DEXT_ID);
  } else if (OSArray* a = OSDynamicCast(OSArray, v)) {
    for (uint32_t i = 0; i < a->getCount() && !ok; i++) {
      OSString* s = OSDynamicCast(OSString, a->getObject(i));
      ok = s && s->isEqualTo(MLX_DEXT_ID);
    }
  }
  ents->release();
  return ok;
}

// MelonQPCount / MelonMRCount: the operator scripts refuse to deactivate while any client holds
// QPs or MRs (docs/macos.md), so they must never lag behind a create.
static void publish_counts(MlxUserClient* self) {
  MlxUserClient_IVars* iv = self->ivars;
  uint32_t qps = DextDevice::held(*iv->client, uapi::ObjType::qp);
  uint32_t mrs = DextDevice::held(*iv->client, uapi::ObjType::mr);
  if (iv->published && qps == iv->qps && mrs == iv->mrs) return;
  OSDictionary* d = OSDictionary::withCapacity(2);
  OSNumber* q = OSNumber::withNumber(qps, 32);
  OSNumber* m = OSNumber::withNumber(mrs, 32);
  kern_return_t r = d && q && m && d->setObject("MelonQPCount", q) && d->setObject("MelonMRCount", m)
                        ? self->SetProperties(d)
                        : kIOReturnNoMemory;
  if (r == kIOReturnSuccess) {
    iv->published = true, iv->qps = qps, iv->mrs = mrs;
  } else {  // tried again after the next call
    os_log_error(OS_LOG_DEFAULT, "MlxUserClient: SetProperties(MelonQPCount %u, MelonMRCount %u) failed: 0x%x", qps,
                 mrs, r);
  }
  OSSafeReleaseNULL(q);
  OSSafeReleaseNULL(m);
  OSSafeReleaseNULL(d);
}

static void release_client(MlxUserClient_IVars* iv) {
  forget_all_maps(iv);
  if (iv->client) {
    if (iv->attached) {
      uint32_t failed = iv->parts->dev->detach(*iv->client);
      if (failed) os_log_error(OS_LOG_DEFAULT, "MlxUserClient: %u objects did not release cleanly", failed);
    }
    OSAction* wake = static_cast<OSAction*>(iv->wake);  // detached: the device no longer wakes this client
    iv->wake = nullptr;
    OSSafeReleaseNULL(wake);
    iv->attached = false;
    iv->client->~Client();
    IOFree(iv->client, sizeof(uapi::Client));
    iv->client = nullptr;
  }
  melon::dext::release_parts(iv->parts);  // the device may go with it, if the driver stopped first
  iv->parts = nullptr;
}

kern_return_t IMPL(MlxUserClient, Start) {
  kern_return_t ret = Start(provider, SUPERDISPATCH);
  if (ret != kIOReturnSuccess) return ret;
  MlxPCIDriver* driver = OSDynamicCast(MlxPCIDriver, provider);
  ivars->parts = driver ? static_cast<DriverParts*>(driver->CoreDevice()) : nullptr;
  if (ivars->parts) melon::dext::retain_parts(ivars->parts);
  if (!ivars->parts) {
    ret = kIOReturnNotReady;
  } else if (!entitled(this)) {
    os_log_error(OS_LOG_DEFAULT, "MlxUserClient: refused: the opener lacks %{public}s for %{public}s",
                 kUserClientAccess, MLX_DEXT_ID);
    ret = kIOReturnNotPermitted;
  } else {
    void* m = IOMallocZero(sizeof(uapi::Client));
    ivars->client = m ? new (m) uapi::Client() : nullptr;
    uapi::Status st = ivars->client ? ivars->parts->dev->attach(ivars->client, this) : uapi::Status::no_memory;
    ivars->attached = st == uapi::Status::ok;
    ret = ivars->attached                    ? kIOReturnSuccess
          : st == uapi::Status::quota_device ? kIOReturnNoResources
          : st == uapi::Status::no_memory    ? kIOReturnNoMemory
                                             : kIOReturnNotReady;
  }
  if (ret != kIOReturnSuccess) {
    release_client(ivars);
    Stop(provider, SUPERDISPATCH);
    return ret;
  }
  publish_counts(this);
  return kIOReturnSuccess;
}

// Close and client death arrive here alike: everything the client held goes now.
kern_return_t IMPL(MlxUserClient, Stop) {
  release_client(ivars);
  return Stop(provider, SUPERDISPATCH);
}

// DextDevice's wake target (driver_parts.h), under the device lock: one message to the port the
// client's wake call named. AsyncCompletion sends without waiting; a full port drops it, and one
// queued message is all a waiting client needs (docs/macos.md "Events").
namespace {
struct UserClientWake final : DextDevice::WakeTarget {
  void wake(void* host) override {
    MlxUserClient* self = static_cast<MlxUserClient*>(host);
    if (OSAction* a = static_cast<OSAction*>(self->ivars->wake)) {
      IOUserClientAsyncArgumentsArray none = {};
      self->AsyncCompletion(a, kIOReturnSuccess, none, 0);
    }
  }
};
UserClientWake g_wake;
}  // namespace
DextDevice::WakeTarget* melon::dext::user_client_wake() { return &g_wake; }

// kSelectorEventWake: keep the call's completion to answer whenever an event is queued; a second
// call replaces the first. Nothing in, nothing out.
static kern_return_t arm_wake(MlxUserClient* self, IOUserClientMethodArguments* args) {
  if (!args || !args->completion || args->scalarInputCount || args->structureInput || args->structureInputDescriptor ||
      args->structureOutputDescriptor)
    return kIOReturnBadArgument;
  args->completion->retain();
  void* old = self->ivars->parts->dev->install_wake(*self->ivars->client, &self->ivars->wake, args->completion);
  OSAction* replaced = static_cast<OSAction*>(old);
  OSSafeReleaseNULL(replaced);
  return kIOReturnSuccess;
}

kern_return_t MlxUserClient::ExternalMethod(uint64_t selector, IOUserClientMethodArguments* args,
                                            const IOUserClientMethodDispatch*, OSObject*, void*) {
  MlxUserClient_IVars* iv = ivars;
  if (!iv->attached) return kIOReturnNotOpen;
  if (selector == uapi::iokit::kSelectorEventWake) return arm_wake(this, args);
  // The uapi is structures in, structures out, synchronous, inline (uapi/iokit.h); only the wake
  // call above is asynchronous.
  if (!args || args->completion || args->scalarInputCount || args->structureInputDescriptor ||
      args->structureOutputDescriptor)
    return kIOReturnBadArgument;
  if (selector > 0xffffffffu) return uapi::iokit::return_of(uapi::Status::unknown_selector);
  const void* in = args->structureInput ? args->structureInput->getBytesNoCopy() : nullptr;
  size_t in_len = args->structureInput ? args->structureInput->getLength() : 0;
  if (in_len > uapi::iokit::kMaxInline) return kIOReturnBadArgument;
  uint8_t out[kMaxResponse];
  uint64_t cap = args->structureOutputMaximumSize < kMaxResponse ? args->structureOutputMaximumSize : kMaxResponse;
  uapi::Reply r = iv->parts->dev->call(*iv->client, uint32_t(selector), in, uint32_t(in_len), out, uint32_t(cap));
  uint32_t sel = uint32_t(selector);
  if (r.status == uapi::Status::ok && in_len >= sizeof(uapi::HandleReq) &&
      (sel == uint32_t(uapi::Selector::destroy_qp) || sel == uint32_t(uapi::Selector::destroy_cq) ||
       sel == uint32_t(uapi::Selector::destroy_srq))) {
    uapi::HandleReq h;
    memcpy(&h, in, sizeof h);
    forget_maps(iv, h.handle);
  }
  if (r.status == uapi::Status::ok && in_len >= sizeof(uapi::ResizeCqReq) &&
      sel == uint32_t(uapi::Selector::resize_cq)) {
    uapi::ResizeCqReq rq;
    memcpy(&rq, in, sizeof rq);
    forget_maps(iv, rq.handle, uint32_t(uapi::MapKind::cqe));
  }
  if (r.status == uapi::Status::ok && r.out_len) {
    args->structureOutput = OSData::withBytes(out, r.out_len);
    if (!args->structureOutput) return kIOReturnNoMemory;
  }
  publish_counts(this);
  return uapi::iokit::return_of(r.status);
}

kern_return_t IMPL(MlxUserClient, CopyClientMemoryForType) {
  MlxUserClient_IVars* iv = ivars;
  if (!iv->attached) return kIOReturnNotOpen;
  uapi::MapRegion reg;
  uapi::Status st = iv->parts->dev->mapping(*iv->client, type, &reg);
  if (st != uapi::Status::ok) return uapi::iokit::return_of(st);
  // Apple: for one user client and one type, the same descriptor every time (the server has just
  // said the type still names a live object of this client); the caller consumes one reference.
  *options = 0;  // read-write: the client writes WQEs, doorbell records and doorbells
  for (uint32_t i = 0; i < iv->nmaps; i++)
    if (iv->maps[i].type == type) {
      iv->maps[i].md->retain();
      *memory = iv->maps[i].md;
      return kIOReturnSuccess;
    }
  IOMemoryDescriptor* md = iv->parts->queues->descriptor_for(reg);
  if (!md) return kIOReturnNoMemory;
  if (iv->nmaps == kMaxMaps) {
    md->release();
    return kIOReturnNoResources;
  }
  md->retain();
  iv->maps[iv->nmaps++] = MapEntry{type, md};
  *memory = md;
  return kIOReturnSuccess;
}
