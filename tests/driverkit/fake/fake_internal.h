// Shared between the fake's files (not for tests).
#pragma once

#include <DriverKit/standin.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>

namespace melon::dkfake {

class Card;

void free_collection(OSObject* o);
void each_entry(OSDictionary* d, const std::function<void(const std::string&, OSObject*)>& f);

// A service's registry entry.
struct ServiceImpl {
  OSDictionary* props = nullptr;
  IOService* provider = nullptr;  // not retained (the provider outlives it)
  IODispatchQueue* queue = nullptr;  // its default queue
  OSDictionary* entitlements = nullptr;  // user clients: the opening task's
  Card* card = nullptr;  // IOPCIDevice: the function behind it
  bool registered = false, open = false;
};
ServiceImpl* service_impl(IOService* s);

// A serial dispatch queue: actions run holding this lock.
struct QueueImpl {
  std::recursive_mutex m;
};
std::recursive_mutex& queue_lock(IODispatchQueue* q);

// The reference of the action an asynchronous ExternalMethod call carries (fake_mach.cpp answers it).
struct AsyncReference {
  uint32_t wake_port;
  uint64_t words[8];  // the caller's reference (kOSAsyncRef64Count)
};

}  // namespace melon::dkfake
