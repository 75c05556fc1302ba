#include "dext/driverkit/dext_device.h"

#include <string.h>

#include "dext/driverkit/placement.h"

namespace melon::dext {

namespace core = mlx5::core;

const char* dext_state_name(DextState s) {
#define MELON_DEXT_STATE_NAME(n, str) \
  case DextState::n: return str;
  switch (s) { MELON_DEXT_STATES(MELON_DEXT_STATE_NAME) }
#undef MELON_DEXT_STATE_NAME
  return "?";
}

DextDevice::DextDevice(core::Hal& hal, core::QueuePlatform& plat) : hal_(hal), plat_(plat) {
  lock_ = hal_.lock_create();
}

DextDevice::~DextDevice() {
  release_server();
  hca_.detach();
  if (lock_) hal_.lock_destroy(lock_);
}

// GID 0 is the port's IPv6 link-local address from its MAC (fe80::/64 + modified EUI-64), the
// default GID Linux gives every RoCE port. IPv4 GIDs need the host's addresses, which a driver
// extension does not see; a selector to set them is future work (docs/macos.md).
static void link_local_gid(const uint8_t mac[6], uint8_t gid[16]) {
  memset(gid, 0, 16);
  gid[0] = 0xfe, gid[1] = 0x80;
  gid[8] = mac[0] ^ 2, gid[9] = mac[1], gid[10] = mac[2], gid[11] = 0xff;
  gid[12] = 0xfe, gid[13] = mac[3], gid[14] = mac[4], gid[15] = mac[5];
}

core::Err DextDevice::start() {
  if (!lock_) {
    state_ = DextState::fatal;
    return core::Err::no_memory;
  }
  state_ = DextState::starting;
  hca_.attach(&hal_);
  core::Err e = hca_.bring_up();
  if (e == core::Err::ok) {
    core::GidEntry g;
    link_local_gid(hca_.port().mac, g.gid);
    memcpy(g.mac, hca_.port().mac, 6);
    g.l3_type = 1;  // IPv6
    e = hca_.set_gid(0, g);
  }
  if (e != core::Err::ok) {
    failure_ = hca_.last_failure();
    failure_.err = e;
    if (hca_.state() != core::HcaState::detached) hca_.teardown();
    hca_.detach();
    state_ = DextState::fatal;
    return e;
  }
  backend_ = new (backend_mem_) core::UapiBackend(hca_, plat_);
  uapi::Limits lim;
  backend_->fill_limits(&lim);
  srv_ = new (server_mem_) uapi::Server(*backend_, lim);
  srv_->set_notify(&notify_);
  state_ = DextState::ready;
  return core::Err::ok;
}

void DextDevice::release_server() {
  if (srv_) srv_->~Server();
  srv_ = nullptr;
  if (backend_) backend_->~UapiBackend();
  backend_ = nullptr;
}

core::Err DextDevice::stop() {
  core::Err e = core::Err::ok;
  {
    core::HalLock l(hal_, lock_);
    for (uapi::Client*& c : attached_) {
      if (!c) continue;
      if (srv_ && c->attached) srv_->detach(*c);
      c = nullptr;
    }
    if (backend_) backend_->drain_events(*srv_);
    if (srv_) srv_->~Server();
    srv_ = nullptr;
    if (hca_.state() != core::HcaState::detached) e = hca_.teardown();
    // Queues and MRs whose destroy met a dead device are freed only now that teardown has reset it.
    if (backend_) backend_->release_dead();
    release_server();
    state_ = DextState::stopped;
  }
  hca_.detach();
  return e;
}

uapi::Status DextDevice::attach(uapi::Client* c, void* host) {
  core::HalLock l(hal_, lock_);
  if (!srv_ || state_ != DextState::ready) return uapi::Status::device_dead;
  uapi::Status st = srv_->attach(c, host);
  if (st != uapi::Status::ok) return st;
  for (uapi::Client*& slot : attached_)
    if (!slot) {
      slot = c;
      return st;
    }
  srv_->detach(*c);  // more than the server's own limit: cannot happen
  return uapi::Status::quota_device;
}

uint32_t DextDevice::detach(uapi::Client& c) {
  core::HalLock l(hal_, lock_);
  for (uapi::Client*& slot : attached_)
    if (slot == &c) slot = nullptr;
  if (!srv_ || !c.attached) return 0;
  return srv_->detach(c);
}

uapi::Reply DextDevice::call(uapi::Client& c, uint32_t selector, const void* in, uint32_t in_len, void* out,
                             uint32_t out_cap) {
  core::HalLock l(hal_, lock_);
  if (!srv_ || !c.attached) return {uapi::Status::device_dead, 0};
  uapi::Reply r = srv_->handle(c, selector, in, in_len, out, out_cap);
  backend_->drain_events(*srv_);  // what the call caused (or what was waiting) reaches the queue now
  return r;
}

void* DextDevice::install_wake(uapi::Client& c, void** slot, void* value) {
  core::HalLock l(hal_, lock_);
  void* old = *slot;
  *slot = value;
  if (srv_ && c.attached && notify_.target) {
    c.wake_armed = false;  // this wake-up stands until the client drains to no_event
    notify_.target->wake(c.host);
  }
  return old;
}

uapi::Status DextDevice::mapping(uapi::Client& c, uint64_t memory_type, uapi::MapRegion* out) {
  core::HalLock l(hal_, lock_);
  if (!srv_ || !c.attached) return uapi::Status::device_dead;
  if (memory_type > 0xffffffffu) return uapi::Status::invalid;
  return srv_->mapping(c, uint32_t(memory_type), out);
}

void DextDevice::service() {
  core::HalLock l(hal_, lock_);
  if (hca_.state() == core::HcaState::detached) return;
  hca_.service();
  if (state_ == DextState::ready && hca_.state() == core::HcaState::fatal) state_ = DextState::fatal;
  if (srv_) backend_->drain_events(*srv_);
}

}  // namespace melon::dext
