// What MlxPCIDriver shares with its user clients in the same process (MlxPCIDriver::CoreDevice
// returns one of these; iig's LOCAL methods take no project types, hence the void*). Counted: the
// driver holds one reference and each attached client one, and whoever lets go last frees it with
// the device, its queue memory and its HAL. Apple does not promise that a provider's Stop comes
// after its clients' Stop; a client that outlives the driver's Stop finds a stopped device
// (device_dead), never freed memory.
#pragma once

#include <stdint.h>

#include "dext/driverkit/dext_device.h"

namespace melon::dext {

class QueueMemory;

struct DriverParts {
  DextDevice* dev;
  QueueMemory* queues;
  void (*free_all)(DriverParts*);  // the device, the queues, the HAL and this
  uint32_t refs;
};

// MlxUserClient's answer to its clients' wake calls (DextDevice::set_wake; `host` is the
// MlxUserClient a client was attached with). MlxPCIDriver installs it when it makes the device.
DextDevice::WakeTarget* user_client_wake();

inline void retain_parts(DriverParts* p) { __atomic_add_fetch(&p->refs, 1, __ATOMIC_ACQ_REL); }
inline void release_parts(DriverParts* p) {
  if (p && __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) == 0) p->free_all(p);
}

}  // namespace melon::dext
