// The mlx5 provider's only door to the driver: the user-client ABI (src/uapi, docs/uapi.md) as
// four operations. On Linux it is melon-emud's Unix socket (transport_emud.cpp, over
// dext::UapiClient); on macOS an IOUserClient (IOConnectCallStructMethod / IOConnectMapMemory64).
// The provider never learns which one it has.
//
// Doorbells: the provider writes a doorbell into its mapped UAR page exactly as it would on
// hardware, then calls kick() with the same bytes. On a real card (the DEXT mapping the BAR's UAR
// page) kick() does nothing; an emulated device, whose UAR page is plain memory, learns of the
// write from it.
#pragma once

#include <errno.h>
#include <poll.h>
#include <stdint.h>

#include <memory>
#include <string>

#include "uapi/abi.h"

namespace melon::mlx5prov {

class Transport {
 public:
  virtual ~Transport() = default;

  // One control call: request `in` (in_len bytes) -> response `out` (at most out_cap bytes).
  virtual uapi::Status call(uapi::Selector sel, const void* in, uint32_t in_len, void* out, uint32_t out_cap) = 0;
  // Map (kind, handle) into this process: the address and length, or nullptr with *st set.
  // unmap() undoes it.
  virtual void* map(uapi::MapKind kind, uint32_t handle, uint64_t* len, uapi::Status* st) = 0;
  virtual void unmap(void* addr, uint64_t len) = 0;
  // Blocks until the driver has queued an event for this client (Wake::event) or `stop_fd` is
  // readable or the wait fails (Wake::stop). After an event the caller drains get_event until
  // no_event, which arms the driver's next wake-up (docs/uapi.md "Events"). Linux: melon-emud's
  // eventfd; macOS: a mach message on the context's notification port (docs/macos.md "Events").
  enum class Wake { event, stop };
  virtual Wake wait_event(int stop_fd) = 0;
  // A doorbell was written to UAR `uar` (a handle) at byte `offset` (0x20 CQ arm, the UAR's
  // db_offset for send doorbells / BlueFlame); `value` is the 64-bit doorbell as written (bytes in
  // the order they sit in memory). Returns 0 or an errno value.
  virtual int kick(uint32_t uar, uint32_t offset, uint64_t value) = 0;
  // True when the device is emulated by threads on this host's CPUs (melon-emud): an application
  // spinning on an empty CQ then starves the very device it waits for on a small machine, so the
  // provider yields the CPU on an empty poll. A real card needs no CPU of ours.
  virtual bool device_needs_host_cpu() const { return false; }

  template <class Req, class Resp>
  uapi::Status call(uapi::Selector s, const Req& rq, Resp* rp) {
    return call(s, &rq, uapi::wire_size<Req>, rp, uapi::wire_size<Resp>);
  }
};

// poll() for `fd` (none if -1) or `stop_fd`: event when `fd` is readable or `timeout_ms` passed
// (a transport that cannot be woken asks on a timer), stop when `stop_fd` is readable or on error.
inline Transport::Wake wait_readable(int stop_fd, int fd, int timeout_ms) {
  pollfd fds[2] = {{stop_fd, POLLIN, 0}, {fd, POLLIN, 0}};
  for (;;) {
    int n = poll(fds, fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || fds[0].revents) return Transport::Wake::stop;
    if (n == 0) return Transport::Wake::event;
    if (fds[1].revents & (POLLERR | POLLHUP | POLLNVAL)) return Transport::Wake::stop;
    return Transport::Wake::event;
  }
}

// The platform's transport to the device behind `where` (Linux: melon-emud's socket path), opened
// (uapi Open done). nullptr with *err (an errno value) when it cannot be reached.
std::unique_ptr<Transport> open_transport(const char* where, int* err);

// The IOKit transport (macOS; on Linux against the stand-in of tests/driverkit), whichever
// open_transport the build uses.
std::unique_ptr<Transport> open_iokit_transport(const char* where, int* err);

// Discovery, per platform: where the device is (Linux: $MELON_EMUD_SOCKET, else melon-emud's
// default socket), and whether something answers there now, cheaply (no Open).
std::string device_location();
bool device_present(const std::string& where);

}  // namespace melon::mlx5prov
