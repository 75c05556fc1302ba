// What the user-client server asks of the driver below it: the firmware-facing half of each
// selector, called only after the server has validated every field, handle, state and quota.
//
// core_backend.h implements it over src/mlx5/core (the DEXT and melon-emud); the unit tests
// implement it with a recorder, which is how they prove that a refused request reached no
// firmware command. Objects are the backend's own pointers, opaque to the server.
//
// Freestanding: virtual calls with safe defaults (no pure virtuals: see mlx5/core/hal.h).
#pragma once

#include <stdint.h>

#include "uapi/abi.h"

namespace melon::uapi {

// One mapping an object offers its client: a range of a platform memory object.
struct MapRegion {
  uint8_t kind = 0;  // MapKind; 0 = none
  uint32_t flags = 0;  // kMapWriteCombine
  uint64_t memory = 0, offset = 0, length = 0;
};
inline constexpr uint32_t kMaxMaps = 3;  // QP: SQ, RQ, doorbell record

// What an object's creation hands back besides its backend pointer.
struct Created {
  void* obj = nullptr;
  MapRegion maps[kMaxMaps];
};

// Validated creation parameters (sizes already rounded to what the device takes).
struct CqSpec {
  uint32_t log_size;
  uint32_t comp_vector;
  void* uar;  // the client's UAR object
  uint64_t event_tag;  // passed back to Server::deliver_* for this CQ's events (Server::tag_of)
};
struct SrqSpec {
  void* pd;
  uint32_t log_size, log_stride;  // WQEs, bytes per WQE
  uint64_t event_tag;
};
struct QpSpec {
  uint8_t type;  // kQpRc / kQpUd / kQpUc / kQpGsi (the server has checked the port: the device has one)
  void *pd, *send_cq, *recv_cq, *srq, *uar;
  uint32_t log_sq_size;  // 64-byte basic blocks
  uint32_t log_rq_size, log_rq_stride;  // 0 / unused with an SRQ
  uint64_t event_tag;
  bool scatter_to_cqe;  // CreateQpReq's kCreateQpScatterToCqe, for an RC or UC QP with its own RQ
};

// Ring bytes of each queue, one formula for the server (which charges them to quotas before the
// backend is called) and the backend (which allocates them).
inline constexpr uint64_t ring_bytes(const CqSpec& s) { return 64ull << s.log_size; }  // 64-byte CQEs
inline constexpr uint64_t ring_bytes(const SrqSpec& s) { return (1ull << s.log_size) << s.log_stride; }
inline constexpr uint64_t ring_bytes(const QpSpec& s) {  // PRM: one buffer, the RQ, then the SQ
  return (s.srq ? 0 : (1ull << s.log_rq_size) << s.log_rq_stride) + (64ull << s.log_sq_size);
}

// The firmware transition a validated ModifyQp maps to.
// sqd2rts exists for the backend's sake; the server never asks for it, because no transition
// into SQD exists on mlx5 (docs/uapi.md).
enum class Transition : uint8_t { rst2init, init2init, init2rtr, rtr2rts, rts2rts, sqerr2rts, sqd2rts, to_err, to_rst };

class Backend {
 public:
  virtual Status query_device(DeviceAttr*) { return Status::unsupported; }
  virtual Status query_port(uint32_t, PortAttr*) { return Status::unsupported; }
  virtual Status query_gid(uint32_t, uint32_t, GidResp*) { return Status::unsupported; }
  virtual Status alloc_pd(void**) { return Status::unsupported; }
  virtual Status dealloc_pd(void*) { return Status::unsupported; }
  virtual Status alloc_uar(Created*, UarResp*) { return Status::unsupported; }
  virtual Status free_uar(void*) { return Status::unsupported; }
  // `host_client` is the platform's handle of the client's address space (Client::host).
  virtual Status reg_mr(void*, void*, const RegMrReq&, void**, RegMrResp*) { return Status::unsupported; }
  virtual Status dereg_mr(void*) { return Status::unsupported; }
  virtual Status create_cq(const CqSpec&, Created*, CreateCqResp*) { return Status::unsupported; }
  virtual Status destroy_cq(void*) { return Status::unsupported; }
  // A new ring of 1 << log_size CQEs; `ring` gets its Cqe mapping (the doorbell record stays).
  virtual Status resize_cq(void*, uint32_t, MapRegion*, ResizeCqResp*) { return Status::unsupported; }
  virtual Status create_srq(const SrqSpec&, Created*, CreateSrqResp*) { return Status::unsupported; }
  virtual Status modify_srq(void*, uint32_t) { return Status::unsupported; }
  virtual Status destroy_srq(void*) { return Status::unsupported; }
  virtual Status create_qp(const QpSpec&, Created*, CreateQpResp*) { return Status::unsupported; }
  virtual Status modify_qp(void*, Transition, const ModifyQpReq&) { return Status::unsupported; }
  virtual Status query_qp(void*, QpAttr*) { return Status::unsupported; }
  virtual Status destroy_qp(void*) { return Status::unsupported; }
  // What the host spends on a queue with this many ring bytes (page rounding, doorbell record), and
  // on pinning [addr, addr+len): the server charges these to the byte quotas before creating.
  virtual uint64_t queue_cost(uint64_t ring) { return ring; }
  virtual uint64_t pin_cost(uint64_t addr, uint64_t len) {
    return ((addr + len + 4095) & ~4095ull) - (addr & ~4095ull);
  }
  // The driver's own counts for UsageResp (core_live, queue/pinned bytes, ...).
  virtual void usage(UsageResp*) {}
  // UD address vectors are built in software (no firmware command).
  virtual Status make_av(const AddressReq&, uint8_t*) { return Status::unsupported; }
  // The stable-driver gate's no-FLR re-init (CycleReq); called only with no object alive.
  virtual Status stable_cycle(const CycleReq&, CycleResp*) { return Status::unsupported; }

 protected:
  ~Backend() = default;
};

}  // namespace melon::uapi
