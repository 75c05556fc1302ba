// One ConnectX function as the DEXT runs it, with no DriverKit type in sight: the driver core
// (src/mlx5/core) on a HAL, the user-client server (src/uapi) over the core's backend, one lock
// that serializes every call into the server (each IOUserClient has its own dispatch queue, so
// calls from different clients can arrive at once), and the device state the registry shows as
// MelonState. MlxPCIDriver and MlxUserClient (the DriverKit glue) only translate to and from this.
//
//   DextDevice d(hal, queue_platform);
//   d.start();                                  // MlxPCIDriver::Start: ready or fatal
//   d.attach(&client, user_client);             // MlxUserClient::Start
//   d.call(client, selector, in, len, out, cap) // ExternalMethod
//   d.mapping(client, type, &region)            // CopyClientMemoryForType
//   d.detach(client);                           // MlxUserClient::Stop (close or death)
//   d.stop();                                   // MlxPCIDriver::Stop
//
// Freestanding (tests/freestanding links it without the C++ library).
#pragma once

#include <stdint.h>

#include "mlx5/core/hca.h"
#include "mlx5/core/uapi_backend.h"
#include "uapi/server.h"

namespace melon::dext {

// The MelonState registry property's values (scripts/macos read them; docs/macos.md).
#define MELON_DEXT_STATES(V) \
  V(starting, "starting")    \
  V(ready, "ready")          \
  V(fatal, "fatal")          \
  V(stopped, "stopped")

#define MELON_DEXT_STATE_ENUM(n, s) n,
enum class DextState : uint8_t { MELON_DEXT_STATES(MELON_DEXT_STATE_ENUM) };
#undef MELON_DEXT_STATE_ENUM
const char* dext_state_name(DextState s);

class DextDevice {
 public:
  DextDevice(mlx5::core::Hal& hal, mlx5::core::QueuePlatform& plat);
  ~DextDevice();
  DextDevice(const DextDevice&) = delete;
  DextDevice& operator=(const DextDevice&) = delete;

  // Bring-up, GID 0, the backend and the server. On failure the device is left torn down (nothing
  // allocated) and the state is fatal; last_failure() says where.
  mlx5::core::Err start();
  // Detaches every client still attached (Apple does not promise that a provider's Stop comes
  // after its clients': their later calls get device_dead), then tears the device down; returns
  // Err::leak if anything of the core's was left.
  mlx5::core::Err stop();
  DextState state() const { return state_; }
  const mlx5::core::Failure& last_failure() const { return failure_; }

  uapi::Status attach(uapi::Client* c, void* host);
  uint32_t detach(uapi::Client& c);
  uapi::Reply call(uapi::Client& c, uint32_t selector, const void* in, uint32_t in_len, void* out, uint32_t out_cap);
  uapi::Status mapping(uapi::Client& c, uint64_t memory_type, uapi::MapRegion* out);
  // What a client holds, for the registry (MelonQPCount, MelonMRCount).
  static uint32_t held(const uapi::Client& c, uapi::ObjType t) { return c.count[uint8_t(t)]; }

  // Told, under the device lock, when an event is queued for a client whose wake-up is armed
  // (uapi::Client::wake_armed): `host` is what attach() was given. MlxUserClient sends the
  // client's notification port a message (docs/macos.md "Events").
  // (An interface, not a function pointer: UBSan checks indirect calls against RTTI the
  // freestanding build has not got.)
  class WakeTarget {
   public:
    virtual void wake(void* host) = 0;

   protected:
    ~WakeTarget() = default;
  };
  void set_wake(WakeTarget* t) { notify_.target = t; }
  // Under the device lock: `*slot = value` (what the wake target reads; the old value is returned),
  // then the client is woken once, so events queued before it could be woken are read.
  void* install_wake(uapi::Client& c, void** slot, void* value);

  // Deferred work (the service timer): the core's page requests and health poll, then queued
  // events handed to the clients.
  void service();
  // A vector fired (the interrupt queue; never takes the device lock).
  void on_vector(uint32_t vector) { hca_.on_vector(vector); }

  // For tests and logs.
  mlx5::core::Hca& hca() { return hca_; }
  uint32_t clients() const { return srv_ ? srv_->clients() : 0; }

 private:
  void release_server();

  struct Notify final : uapi::EventNotify {
    WakeTarget* target = nullptr;
    void event_queued(uapi::Client& c) override {
      if (target) target->wake(c.host);
    }
  };

  mlx5::core::Hal& hal_;
  mlx5::core::QueuePlatform& plat_;
  mlx5::core::Hca hca_;
  void* lock_ = nullptr;
  DextState state_ = DextState::starting;
  mlx5::core::Failure failure_;  // start()'s, kept across the teardown that follows it
  mlx5::core::UapiBackend* backend_ = nullptr;
  uapi::Server* srv_ = nullptr;
  Notify notify_;
  uapi::Client* attached_[uapi::kMaxClients] = {};  // the clients attach() took, for stop()
  alignas(16) unsigned char backend_mem_[sizeof(mlx5::core::UapiBackend)];
  alignas(16) unsigned char server_mem_[sizeof(uapi::Server)];
};

}  // namespace melon::dext
