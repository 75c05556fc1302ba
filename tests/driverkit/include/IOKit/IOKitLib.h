// Stand-in: the user side of IOKit (IOKit.framework's IOKitLib.h), the calls the mlx5 provider's
// IOKit transport makes (with the notification port its event wake-ups arrive on). In the stand-in build they reach the fake kernel in the same process
// (tests/driverkit/fake/iokit_user.cpp), which creates MlxUserClient through the driver's
// NewUserClient and calls its ExternalMethod and CopyClientMemoryForType.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "DriverKit/IOReturn.h"

typedef uint32_t mach_port_t;
typedef mach_port_t io_object_t;
typedef io_object_t io_service_t;
typedef io_object_t io_connect_t;
typedef mach_port_t task_port_t;
typedef uint64_t mach_vm_address_t;
typedef uint64_t mach_vm_size_t;
typedef uint32_t IOOptionBits;
typedef struct __CFDictionary* CFMutableDictionaryRef;
typedef const struct __CFDictionary* CFDictionaryRef;
typedef struct IONotificationPort* IONotificationPortRef;

#define IO_OBJECT_NULL ((io_object_t)0)
#define MACH_PORT_NULL ((mach_port_t)0)
extern const mach_port_t kIOMainPortDefault;

enum { kOSAsyncRef64Count = 8 };  // IOKit/OSMessageNotification.h: an async call's reference words
enum { kIOMapAnywhere = 0x00000001, kIOMapDefaultCache = 0x00000000, kIOMapWriteCombineCache = 0x00000400 };

extern "C" {
mach_port_t mach_task_self(void);
CFMutableDictionaryRef IOServiceNameMatching(const char* name);
io_service_t IOServiceGetMatchingService(mach_port_t mainPort, CFDictionaryRef matching);  // consumes `matching`
kern_return_t IOServiceOpen(io_service_t service, task_port_t owningTask, uint32_t type, io_connect_t* connect);
kern_return_t IOServiceClose(io_connect_t connect);
kern_return_t IOObjectRelease(io_object_t object);
kern_return_t IOConnectCallStructMethod(mach_port_t connection, uint32_t selector, const void* inputStruct,
                                        size_t inputStructCnt, void* outputStruct, size_t* outputStructCnt);
kern_return_t IOConnectCallAsyncStructMethod(mach_port_t connection, uint32_t selector, mach_port_t wake_port,
                                             uint64_t* reference, uint32_t referenceCnt, const void* inputStruct,
                                             size_t inputStructCnt, void* outputStruct, size_t* outputStructCnt);
IONotificationPortRef IONotificationPortCreate(mach_port_t mainPort);
void IONotificationPortDestroy(IONotificationPortRef notify);
mach_port_t IONotificationPortGetMachPort(IONotificationPortRef notify);
kern_return_t IOConnectMapMemory64(io_connect_t connect, uint32_t memoryType, task_port_t intoTask,
                                   mach_vm_address_t* atAddress, mach_vm_size_t* ofSize, IOOptionBits options);
kern_return_t IOConnectUnmapMemory64(io_connect_t connect, uint32_t memoryType, task_port_t fromTask,
                                     mach_vm_address_t atAddress);
}
