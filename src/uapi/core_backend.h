// uapi::Backend over the driver core (src/mlx5/core): what the DEXT and melon-emud plug into the
// Server. Queue memory, UAR mappings and client-memory pinning come from the platform (QueuePlatform)
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

namespace melon::uapi {

class Server;

class QueuePlatform {
 public:
  // Zeroed, page-aligned memory the device reaches at `iova` and the client can map (`memory`).
  struct Mem {
    uint64_t memory = 0, iova = 0, size = 0, token = 0;
    void* va = nullptr;
  };
  virtual int queue_alloc(uint64_t, Mem*) { return mlx5::core::kHalUnsupported; }
  virtual void queue_free(const Mem&) {}
  // How a client maps this UAR page.
  virtual int uar_map(const mlx5::core::Uar&, MapRegion*) { return mlx5::core::kHalUnsupported; }
  virtual void uar_unmap(const mlx5::core::Uar&) {}
  // Pins [addr, addr+len) of the client `host` (page-rounded) as one IOVA-contiguous range.
  virtual int pin_client(void*, uint64_t, uint64_t, bool, uint64_t*, uint64_t*) { return mlx5::core::kHalUnsupported; }
  virtual void unpin_client(uint64_t) {}
  // An event was queued: the host should call CoreBackend::drain_events() soon.
  virtual void events_pending() {}

 protected:
  ~QueuePlatform() = default;
};

class CoreBackend final : public Backend, private mlx5::core::EventSink {
 public:
  CoreBackend(mlx5::core::Hca& hca, QueuePlatform& plat);
  ~CoreBackend();
  CoreBackend(const CoreBackend&) = delete;
  CoreBackend& operator=(const CoreBackend&) = delete;

  // Hands queued events to the server (from the host's serialized context).
  void drain_events(Server& srv);
  // Limits for the Server, from the device's capabilities.
  void fill_limits(struct Limits* lim);
  uint64_t queue_bytes() const { return queue_bytes_; }
  uint64_t pinned() const { return pinned_; }

  Status query_device(DeviceAttr*) override;
  Status query_port(uint32_t, PortAttr*) override;
  Status query_gid(uint32_t, uint32_t, GidResp*) override;
  Status alloc_pd(void**) override;
  Status dealloc_pd(void*) override;
  Status alloc_uar(Created*, UarResp*) override;
  Status free_uar(void*) override;
  Status reg_mr(void*, void*, const RegMrReq&, void**, RegMrResp*) override;
  Status dereg_mr(void*) override;
  Status create_cq(const CqSpec&, Created*, CreateCqResp*) override;
  Status destroy_cq(void*) override;
  Status create_srq(const SrqSpec&, Created*, CreateSrqResp*) override;
  Status modify_srq(void*, uint32_t) override;
  Status destroy_srq(void*) override;
  Status create_qp(const QpSpec&, Created*, CreateQpResp*) override;
  Status modify_qp(void*, Transition, const ModifyQpReq&) override;
  Status query_qp(void*, QpAttr*) override;
  Status destroy_qp(void*) override;
  Status make_av(const AddressReq&, uint8_t*) override;
  void usage(UsageResp*) override;

 private:
  struct Queue;  // a CQ, SRQ or QP with its memory
  struct Route {
    uint8_t kind;  // 0 free, 1 CQ, 2 QP, 3 SRQ
    uint32_t number;  // CQN / QPN / SRQN
    uint32_t tag;
  };
  void on_async_event(const mlx5::core::AsyncEvent& e) override;
  void on_completion(uint32_t cqn) override;
  Status queue_mem(uint64_t ring_bytes, Queue* q, Created* c, MapKind ring_kind, MapKind second_kind);
  void free_queue(Queue* q);
  void route_add(uint8_t kind, uint32_t number, uint32_t tag);
  void route_del(uint8_t kind, uint32_t number);
  void push(uint8_t kind, uint32_t number, uint32_t event_type);

  mlx5::core::Hca& hca_;
  QueuePlatform& plat_;
  void* lock_ = nullptr;
  static constexpr uint32_t kRoutes = 2048;
  Route* routes_ = nullptr;  // kRoutes entries, HAL memory
  static constexpr uint32_t kPending = 1024;
  struct Pending {
    uint8_t kind;
    uint32_t number, event_type;
  };
  Pending* pending_ = nullptr;  // ring, HAL memory
  uint32_t pend_head_ = 0, pend_count_ = 0;
  uint64_t queue_bytes_ = 0, pinned_ = 0;
};

// Server status for a core error.
Status status_of(mlx5::core::Err e);

}  // namespace melon::uapi
