// The macOS Transport: the DEXT's MlxUserClient through IOKit (uapi/iokit.h has the carriage
// rules). Control calls are IOConnectCallStructMethod with the uapi status in the IOReturn;
// mappings are IOConnectMapMemory64 of map_type(kind, handle). Built instead of
// transport_emud.cpp on macOS (MELON_TRANSPORT_IOKIT); on Linux it is built against the IOKit
// stand-in (tests/driverkit), where it reaches the DEXT glue in-process over the emulated card.
//
// Doorbells need no kick: the UAR page is mapped from BAR0, so the store reaches the card. Events:
// the driver answers an asynchronous call made at open with a mach message to this context's
// notification port whenever it queues an event; the event thread waits for it in kevent()
// (docs/macos.md "Events"). A driver that refuses the call is asked on a timer instead.
// Discovery (device_location/device_present) is a registry match on the driver's service name.
#include <IOKit/IOKitLib.h>
#include <errno.h>
#include <mach/message.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/event.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "providers/mlx5/transport.h"
#include "uapi/iokit.h"

namespace melon::mlx5prov {

namespace {

int errno_of_open(kern_return_t kr) {
  switch (kr) {
    case kIOReturnNotPermitted:
    case kIOReturnNotPrivileged: return EPERM;  // no userclient-access entitlement for our driver
    case kIOReturnNoResources: return EBUSY;  // the device's client limit
    case kIOReturnNotReady: return EAGAIN;  // the driver has not brought the card up
    case kIOReturnNoMemory: return ENOMEM;
    default: return ENODEV;
  }
}

class IokitTransport final : public Transport {
 public:
  using Transport::call;
  ~IokitTransport() override {
    if (conn_ != IO_OBJECT_NULL) IOServiceClose(conn_);
    stop_notifications();
  }

  bool open(const char* where, int* err) {
    const char* name = where && *where ? where : uapi::iokit::kServiceName;
    io_service_t svc = IOServiceGetMatchingService(kIOMainPortDefault, IOServiceNameMatching(name));
    if (svc == IO_OBJECT_NULL) {
      *err = ENODEV;
      return false;
    }
    kern_return_t kr = IOServiceOpen(svc, mach_task_self(), uapi::iokit::kUserClientType, &conn_);
    IOObjectRelease(svc);
    if (kr != kIOReturnSuccess) {
      conn_ = IO_OBJECT_NULL;
      *err = errno_of_open(kr);
      return false;
    }
    uapi::OpenReq rq{uapi::kAbiVersion, 0, ~0ull};
    uapi::OpenResp rp{};
    if (call(uapi::Selector::open, rq, &rp) != uapi::Status::ok || rp.abi_version != uapi::kAbiVersion) {
      *err = EPROTO;
      return false;
    }
    start_notifications();
    return true;
  }

  uapi::Status call(uapi::Selector sel, const void* in, uint32_t in_len, void* out, uint32_t out_cap) override {
    size_t out_len = out_cap;
    kern_return_t kr = IOConnectCallStructMethod(conn_, uint32_t(sel), in_len ? in : nullptr, in_len,
                                                 out_cap ? out : nullptr, &out_len);
    uapi::Status st;
    // Anything that is not one of the server's answers is the connection failing (the driver went
    // away, the kernel refused the call's shape): the device is gone for this client.
    return uapi::iokit::status_of_return(kr, &st) ? st : uapi::Status::device_dead;
  }

  void* map(uapi::MapKind kind, uint32_t handle, uint64_t* len, uapi::Status* st) override {
    mach_vm_address_t addr = 0;
    mach_vm_size_t size = 0;
    uint32_t type = uapi::map_type(kind, handle);
    kern_return_t kr = IOConnectMapMemory64(conn_, type, mach_task_self(), &addr, &size, kIOMapAnywhere);
    if (kr != kIOReturnSuccess) {
      if (!uapi::iokit::status_of_return(kr, st)) *st = uapi::Status::device_dead;
      return nullptr;
    }
    std::lock_guard<std::mutex> l(mu_);
    types_[addr] = type;
    *len = size;
    *st = uapi::Status::ok;
    return reinterpret_cast<void*>(uintptr_t(addr));
  }

  void unmap(void* addr, uint64_t) override {
    uint32_t type;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = types_.find(uint64_t(uintptr_t(addr)));
      if (it == types_.end()) return;
      type = it->second;
      types_.erase(it);
    }
    IOConnectUnmapMemory64(conn_, type, mach_task_self(), uint64_t(uintptr_t(addr)));
  }

  Wake wait_event(int stop_fd) override {
    if (kq_ < 0) return wait_readable(stop_fd, -1, kEventPollMs);
    struct kevent watch[2], got[2];
    EV_SET(&watch[0], uintptr_t(stop_fd), EVFILT_READ, EV_ADD | EV_ENABLE, 0, 0, nullptr);
    EV_SET(&watch[1], uintptr_t(port_), EVFILT_MACHPORT, EV_ADD | EV_ENABLE, 0, 0, nullptr);
    for (;;) {
      int n = kevent(kq_, watch, 2, got, 2, nullptr);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Wake::stop;
      bool event = false;
      for (int i = 0; i < n; i++) {
        if (got[i].flags & EV_ERROR) return Wake::stop;
        if (got[i].filter == EVFILT_READ) return Wake::stop;
        event = event || got[i].filter == EVFILT_MACHPORT;
      }
      if (!event) continue;
      drain_port();
      return Wake::event;
    }
  }
  int kick(uint32_t, uint32_t, uint64_t) override { return 0; }

  io_connect_t connection() const { return conn_; }

 private:
  // A driver that cannot wake us is asked for events this often.
  static constexpr int kEventPollMs = 5;

  // The notification port, a kqueue that watches it, and the driver told to answer there.
  void start_notifications() {
    notify_ = IONotificationPortCreate(kIOMainPortDefault);
    port_ = notify_ ? IONotificationPortGetMachPort(notify_) : MACH_PORT_NULL;
    kq_ = port_ != MACH_PORT_NULL ? kqueue() : -1;
    uint64_t ref[kOSAsyncRef64Count] = {};
    kern_return_t kr = kq_ >= 0 ? IOConnectCallAsyncStructMethod(conn_, uapi::iokit::kSelectorEventWake, port_, ref,
                                                                 kOSAsyncRef64Count, nullptr, 0, nullptr, nullptr)
                                : kIOReturnNoResources;
    if (kr == kIOReturnSuccess) return;
    if (getenv("MELON_MLX5_DEBUG"))
      fprintf(stderr, "melondma mlx5: no event notification (0x%x): asking every %d ms\n", unsigned(kr), kEventPollMs);
    stop_notifications();
  }
  void stop_notifications() {
    if (kq_ >= 0) close(kq_);
    kq_ = -1;
    if (notify_) IONotificationPortDestroy(notify_);
    notify_ = nullptr;
    port_ = MACH_PORT_NULL;
  }
  // The messages only say "look": take them all off, so the port reads empty until the next one.
  void drain_port() {
    struct {
      mach_msg_header_t header;
      uint8_t body[1024];
    } m;
    for (;;) {
      mach_msg_return_t r = mach_msg(&m.header, MACH_RCV_MSG | MACH_RCV_TIMEOUT, 0, sizeof m, port_, 0, MACH_PORT_NULL);
      if (r != MACH_MSG_SUCCESS && r != MACH_RCV_TOO_LARGE) return;  // TOO_LARGE: dequeued and destroyed
    }
  }

  io_connect_t conn_ = IO_OBJECT_NULL;
  IONotificationPortRef notify_ = nullptr;
  mach_port_t port_ = MACH_PORT_NULL;
  int kq_ = -1;
  std::mutex mu_;
  std::map<uint64_t, uint32_t> types_;  // mapped address -> memory type (unmap needs it)
};

}  // namespace

// `where` names the driver's service (default: MlxPCIDriver, uapi/iokit.h).
std::unique_ptr<Transport> open_iokit_transport(const char* where, int* err) {
  auto t = std::make_unique<IokitTransport>();
  if (!t->open(where, err)) return nullptr;
  return t;
}

#if MELON_TRANSPORT_IOKIT
std::unique_ptr<Transport> open_transport(const char* where, int* err) { return open_iokit_transport(where, err); }

// The device is the driver's service, by name: $MELON_IOKIT_SERVICE, else the personality's class.
std::string device_location() {
  const char* e = getenv("MELON_IOKIT_SERVICE");
  return e && *e ? e : uapi::iokit::kServiceName;
}

// The driver registers its service only once the card is up (MlxPCIDriver::Start), so a match is
// the device being there; looking it up opens no connection.
bool device_present(const std::string& where) {
  if (where.empty()) return false;
  io_service_t svc = IOServiceGetMatchingService(kIOMainPortDefault, IOServiceNameMatching(where.c_str()));
  if (svc == IO_OBJECT_NULL) return false;
  IOObjectRelease(svc);
  return true;
}
#endif

}  // namespace melon::mlx5prov
