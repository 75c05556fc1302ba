// A driver on an emulated card through the DriverKit stand-in, and an application's connection to
// it through the stand-in IOKit user side: what dext_glue_test and iokit_transport_test share.
#pragma once

#include <gtest/gtest.h>

#include <IOKit/IOKitLib.h>

#include <memory>

#include "MlxPCIDriver.h"
#include "MlxUserClient.h"
#include "fake.h"
#include "uapi/abi.h"
#include "uapi/iokit.h"

namespace melon::dktest {

// Everything the stand-in counts, to compare before and after.
struct Ledger {
  long objects = dkfake::live_objects();
  long long bytes = dkfake::malloc_bytes();
  long locks = dkfake::live_locks();
  long mismatches = dkfake::free_mismatches();
  long timers = dkfake::live_timers();
};

inline void expect_same(const Ledger& before, const Ledger& after) {
  EXPECT_EQ(after.objects, before.objects) << "OSObjects leaked";
  EXPECT_EQ(after.bytes, before.bytes) << "IOMalloc bytes leaked";
  EXPECT_EQ(after.locks, before.locks) << "IOLocks leaked";
  EXPECT_EQ(after.mismatches, before.mismatches) << "IOFree with a size IOMalloc did not give";
  EXPECT_EQ(after.timers, before.timers) << "timer sources leaked";
}

// An application's connection (IOServiceOpen) with calls in uapi terms.
struct Conn {
  io_connect_t port = IO_OBJECT_NULL;
  kern_return_t open_result = kIOReturnError;

  Conn() : Conn(IOServiceGetMatchingService(kIOMainPortDefault, IOServiceNameMatching(uapi::iokit::kServiceName))) {}
  explicit Conn(io_service_t s) {
    open_result = s ? IOServiceOpen(s, mach_task_self(), uapi::iokit::kUserClientType, &port) : kIOReturnNotFound;
    IOObjectRelease(s);
  }
  ~Conn() {
    if (port) IOServiceClose(port);
  }
  // The raw IOReturn of one call.
  kern_return_t raw(uint32_t sel, const void* in, size_t in_len, void* out, size_t* out_len) {
    return IOConnectCallStructMethod(port, sel, in, in_len, out, out_len);
  }
  uapi::Status call(uint32_t sel, const void* in, size_t in_len, void* out, size_t out_cap) {
    size_t n = out_cap;
    uapi::Status st;
    kern_return_t kr = raw(sel, in, in_len, out, &n);
    EXPECT_TRUE(uapi::iokit::status_of_return(kr, &st)) << std::hex << kr;
    return st;
  }
  template <class Req, class Resp>
  uapi::Status call(uapi::Selector s, const Req& rq, Resp* rp) {
    return call(uint32_t(s), &rq, uapi::wire_size<Req>, rp, uapi::wire_size<Resp>);
  }
  uapi::Status open() {
    uapi::OpenResp rp{};
    return call(uapi::Selector::open, uapi::OpenReq{uapi::kAbiVersion, 0, 0}, &rp);
  }
  IOUserClient* client() { return dkfake::user_client_of(port); }
};

// A started driver on a fresh card; stopped (and checked) by the test.
struct Driver {
  explicit Driver(const dkfake::CardOptions& o = {}) : card(o) { service = dkfake::start_driver(card, &start_result); }
  ~Driver() {
    if (service) stop();
  }
  kern_return_t stop() {
    kern_return_t r = start_result == kIOReturnSuccess ? dkfake::stop_driver(service) : kIOReturnSuccess;
    if (start_result != kIOReturnSuccess) service->release();  // a failed Start is never stopped
    service = nullptr;
    return r;
  }
  dkfake::Card card;
  kern_return_t start_result = kIOReturnError;
  IOService* service = nullptr;
};

}  // namespace melon::dktest
