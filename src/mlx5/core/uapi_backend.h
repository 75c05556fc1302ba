// uapi::Backend over the driver core: what the DEXT and melon-emud plug into the uapi::Server. It
// lives with the core because the layer table lets the core serve the ABI, not the ABI reach into
// the core. Queue memory, UAR mappings and client-memory pinning come from the platform (QueuePlatform)
// because that is where the DEXT and the daemon differ (IOBufferMemoryDescriptor and
// IOMemoryDescriptor::withAddressRange vs memfd and the emulator's IOMMU).
//
// Events arrive from the core's event sink, possibly in interrupt context; they are queued here under
// a HAL lock and handed to the Server by drain_events() from the host's serialized context.
//
// Freestanding.
#pragma once

#include <stdint.h>

#include "mlx5/core/hca.h"
#include "uapi/backend.h"
#include "uapi/server.h"

namespace melon::mlx5::core {

class QueuePlatform {
 public:
  // Zeroed, page-aligned memory the device reaches at `iova` and the client can map (`memory`).
  struct Mem {
    uint64_t memory = 0, iova = 0, size = 0, token = 0;
    void* va = nullptr;
  };
  virtual int queue_alloc(uint64_t, Mem*) { return kHalUnsupported; }
  virtual void queue_free(const Mem&) {}
  // How a client maps this UAR page.
  virtual int uar_map(const Uar&, uapi::MapRegion*) { return kHalUnsupported; }
  virtual void uar_unmap(const Uar&) {}
  // Pins [addr, addr+len) of the client `host` (page-rounded) as one IOVA-contiguous range.
  virtual int pin_client(void*, uint64_t, uint64_t, bool, uint64_t*, uint64_t*) { return kHalUnsupported; }
  virtual void unpin_client(uint64_t) {}
  // An event was queued: the host should call UapiBackend::drain_events() soon.
  virtual void events_pending() {}
  // A CQ (kind 1) or QP (kind 2) now rings through this UAR, and its doorbell record is at `dbr`
  // (host view) until unbind, which comes before that memory is freed. Hosts whose UAR pages are
  // memory, not MMIO, watch the records too.
  virtual void doorbell_bind(const Uar&, uint8_t, uint32_t, void*) {}
  virtual void doorbell_unbind(uint8_t, uint32_t) {}
  // The QP went to RESET: its counters (and its doorbell record, which the client clears) start
  // over at 0.
  virtual void doorbell_rewind(uint8_t, uint32_t) {}
  // The stable-driver gate (UapiBackend::stable_cycle): arm or clear an emulated device's firmware
  // 14.22 roce_en quirk (a real card has it or not: kHalUnsupported), and what the device itself
  // counts (firmware pages it holds, bytes its IOMMU maps); false when the host cannot tell.
  virtual int set_roce_en_quirk(bool) { return kHalUnsupported; }
  virtual bool device_counts(uint64_t* /*pages_held*/, uint64_t* /*iova_bytes*/) { return false; }

 protected:
  ~QueuePlatform() = default;
};

class UapiBackend final : public uapi::Backend, private EventSink {
 public:
  // Event routes for every CQ, QP and SRQ the device quotas allow (fill_limits() keeps the quotas
  // within `routes`).
  static constexpr uint32_t kRoutes = uapi::kDeviceQuotas.cq + uapi::kDeviceQuotas.qp + uapi::kDeviceQuotas.srq;
  UapiBackend(Hca& hca, QueuePlatform& plat, uint32_t routes = kRoutes);
  ~UapiBackend();
  UapiBackend(const UapiBackend&) = delete;
  UapiBackend& operator=(const UapiBackend&) = delete;

  // Hands queued events to the server (from the host's serialized context).
  void drain_events(uapi::Server& srv);
  // Limits for the Server: the device's, as query_device() states them (the one place), and device
  // quotas no larger than the device's object counts and the event routes.
  void fill_limits(uapi::Limits* lim);
  uint64_t queue_bytes() const { return queue_bytes_; }
  uint64_t pinned() const { return pinned_; }
  // Frees the queue memory and client pins of objects destroyed while the device was fatal. Their
  // destroy commands could not reach the firmware, so the device may still write that memory until
  // the function is reset: the host calls this after Hca::teardown() or Hca::recover(). It frees
  // only what was parked before the core's latest function reset, and nothing while the device is
  // fatal. Returns how many objects it freed.
  uint32_t release_dead();
  // Objects waiting for release_dead().
  uint32_t dead_objects() const { return ndead_; }

  uapi::Status query_device(uapi::DeviceAttr*) override;
  uapi::Status query_port(uint32_t, uapi::PortAttr*) override;
  uapi::Status query_gid(uint32_t, uint32_t, uapi::GidResp*) override;
  uapi::Status alloc_pd(void**) override;
  uapi::Status dealloc_pd(void*) override;
  uapi::Status alloc_uar(uapi::Created*, uapi::UarResp*) override;
  uapi::Status free_uar(void*) override;
  uapi::Status reg_mr(void*, void*, const uapi::RegMrReq&, void**, uapi::RegMrResp*) override;
  uapi::Status dereg_mr(void*) override;
  uapi::Status create_cq(const uapi::CqSpec&, uapi::Created*, uapi::CreateCqResp*) override;
  uapi::Status destroy_cq(void*) override;
  uapi::Status resize_cq(void*, uint32_t, uapi::MapRegion*, uapi::ResizeCqResp*) override;
  uapi::Status create_srq(const uapi::SrqSpec&, uapi::Created*, uapi::CreateSrqResp*) override;
  uapi::Status modify_srq(void*, uint32_t) override;
  uapi::Status destroy_srq(void*) override;
  uapi::Status create_qp(const uapi::QpSpec&, uapi::Created*, uapi::CreateQpResp*) override;
  uapi::Status modify_qp(void*, uapi::Transition, const uapi::ModifyQpReq&) override;
  uapi::Status query_qp(void*, uapi::QpAttr*) override;
  uapi::Status destroy_qp(void*) override;
  uapi::Status make_av(const uapi::AddressReq&, uint8_t*) override;
  void usage(uapi::UsageResp*) override;
  uapi::Status stable_cycle(const uapi::CycleReq&, uapi::CycleResp*) override;
  uint64_t queue_cost(uint64_t ring) override;

 private:
  struct Queue;  // a CQ, SRQ or QP with its memory
  struct MrObj;  // an MR with its client pin
  struct Route {
    uint8_t kind;  // 0 free, 1 CQ, 2 QP, 3 SRQ
    uint32_t number;  // CQN / QPN / SRQN
    uint64_t tag;
  };
  void on_async_event(const AsyncEvent& e) override;
  void on_completion(uint32_t cqn) override;
  uapi::Status queue_mem(uint64_t ring_bytes, Queue* q, uapi::Created* c, uapi::MapKind ring_kind,
                         uapi::MapKind second_kind);
  void free_queue(Queue* q);
  bool fatal() const { return hca_.state() == HcaState::fatal; }
  // A destroy failed because the device is gone (its command could not reach the firmware, or the
  // core knows the device is fatal): only a function reset ends what the object was doing.
  bool dead(uapi::Status s) const { return s == uapi::Status::device_dead || fatal(); }
  void park_queue(Queue* q, uint8_t route_kind, uint32_t number);
  void free_mr(MrObj* m);
  bool route_add(uint8_t kind, uint32_t number, uint64_t tag);
  void route_del(uint8_t kind, uint32_t number);
  void push(uint8_t kind, uint32_t number, uint32_t event_type);

  Hca& hca_;
  QueuePlatform& plat_;
  void* lock_ = nullptr;
  uint32_t nroutes_;
  Route* routes_ = nullptr;  // nroutes_ entries, HAL memory
  static constexpr uint32_t kPending = 1024;
  struct Pending {
    uint8_t kind;
    uint32_t event_type;
    uint64_t tag;  // the object's route when the device posted the event (0: a device event)
  };
  Pending* pending_ = nullptr;  // ring, HAL memory
  uint32_t pend_head_ = 0, pend_count_ = 0;
  uint64_t queue_bytes_ = 0, pinned_ = 0;
  // Destroyed while the device was fatal, freed by release_dead() (intrusive lists).
  Queue* dead_queues_ = nullptr;
  MrObj* dead_mrs_ = nullptr;
  uint32_t ndead_ = 0;
};

// Server status for a core error.
uapi::Status status_of(Err e);

}  // namespace melon::mlx5::core
