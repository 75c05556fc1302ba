// Stand-in: IOKit return codes (sys_iokit | sub_iokit_common | code), the values of Apple's
// IOReturn.h that the glue, the transport and the tests use. Shared by the DriverKit and the
// user-side (IOKit/IOKitLib.h) stand-ins.
#pragma once

#include <stdint.h>

typedef int kern_return_t;
typedef kern_return_t IOReturn;

#define kIOReturnSuccess 0
#define kIOReturnError ((IOReturn)0xe00002bc)
#define kIOReturnNoMemory ((IOReturn)0xe00002bd)
#define kIOReturnNoResources ((IOReturn)0xe00002be)
#define kIOReturnNoDevice ((IOReturn)0xe00002c0)
#define kIOReturnNotPrivileged ((IOReturn)0xe00002c1)
#define kIOReturnBadArgument ((IOReturn)0xe00002c2)
#define kIOReturnExclusiveAccess ((IOReturn)0xe00002c5)
#define kIOReturnUnsupported ((IOReturn)0xe00002c7)
#define kIOReturnNotOpen ((IOReturn)0xe00002cd)
#define kIOReturnBusy ((IOReturn)0xe00002d5)
#define kIOReturnNotReady ((IOReturn)0xe00002d8)
#define kIOReturnNoSpace ((IOReturn)0xe00002db)
#define kIOReturnNoInterrupt ((IOReturn)0xe00002df)
#define kIOReturnNotPermitted ((IOReturn)0xe00002e2)
#define kIOReturnNotFound ((IOReturn)0xe00002f0)
