// How the user-client ABI rides on IOKit (docs/uapi.md, docs/macos.md): the one place both ends
// read it, MlxUserClient in the DEXT (src/dext/driverkit) and the mlx5 provider's IOKit transport.
//
//   call:  IOConnectCallStructMethod(conn, selector, request, request_len, response, &response_len)
//          selector = the uapi Selector value; no scalars. The uapi status is the call's IOReturn:
//          ok is kIOReturnSuccess, any other status s is return_of(s), an IOReturn in the
//          vendor-specific block (sys_iokit | sub_iokit_vendor_specific | s), so it can never be
//          mistaken for one of the kernel's own errors (kIOReturnNotPermitted, ...).
//   map:   IOConnectMapMemory64(conn, map_type(kind, handle), ...) -> CopyClientMemoryForType.
//   open:  IOServiceOpen(service, task, kUserClientType, &conn) on the service named kServiceName.
//   wake:  IOConnectCallAsyncStructMethod(conn, kSelectorEventWake, port, ref, kOSAsyncRef64Count,
//          nothing in, nothing out) once after open: the driver keeps the call's completion and
//          answers it (AsyncCompletion: one mach message to `port`) whenever an event is queued
//          for this client while its wake-up is armed; a get_event that finds no event arms it
//          again (docs/uapi.md "Events"). Not a uapi selector: the server never sees it.
//
// Freestanding: <stdint.h> only.
#pragma once

#include <stdint.h>

#include "uapi/abi.h"

namespace melon::uapi::iokit {

inline constexpr uint32_t kUserClientType = 0;  // IOServiceOpen's type argument
inline constexpr const char* kServiceName = "MlxPCIDriver";  // the personality's IOUserClass
inline constexpr uint32_t kSelectorEventWake = 0x1f00;
#define MELON_IOKIT_NOT_WAKE(name, value, req, resp) static_assert(value != kSelectorEventWake);
MELON_UAPI_SELECTORS(MELON_IOKIT_NOT_WAKE)
#undef MELON_IOKIT_NOT_WAKE
// The largest request or response the call carries inline (IOKit passes structures above 4096 bytes
// as memory descriptors; the uapi has none that large).
inline constexpr uint32_t kMaxInline = 4096;

// sys_iokit = err_system(0x38), sub_iokit_vendor_specific = err_sub(-2) (IOKit's IOReturn.h).
inline constexpr uint32_t kVendorBlock = 0xe0000000u | 0x03ff8000u;
inline constexpr uint32_t kVendorMask = 0xffffc000u;  // system + subsystem bits

inline constexpr int32_t return_of(Status s) {
  return s == Status::ok ? 0 : int32_t(kVendorBlock | (uint32_t(s) & 0x3fffu));
}
// The uapi status a call's IOReturn carries; false when it is not one of ours (an IPC or
// kernel error: the connection, not the request, failed).
inline constexpr bool status_of_return(int32_t kr, Status* s) {
  if (kr == 0) {
    *s = Status::ok;
    return true;
  }
  if ((uint32_t(kr) & kVendorMask) != kVendorBlock) return false;
  *s = Status(uint32_t(kr) & 0x3fffu);
  return true;
}
static_assert(return_of(Status::bad_handle) == int32_t(0xe3ff8009u));

}  // namespace melon::uapi::iokit
