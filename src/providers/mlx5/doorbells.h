// The provider's only memory accesses that the device must see in order: the doorbell records,
// the UAR doorbells and the CQE ownership check. Each is the sequence rdma-core's mlx5 provider
// uses at the same point (qp.c post_send_db, mlx5_post_recv; srq.c; cq.c mlx5_get_next_cqe,
// update_cons_index, mlx5_arm_cq, __mlx5_cq_clean), with the barriers of mlx5/prm/barrier.h.
//
// Freestanding on purpose: tests/mlx5/barrier compiles these for aarch64 with no
// C library and checks the instructions between the stores.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mlx5/prm/barrier.h"
#include "mlx5/prm/cqe.h"
#include "providers/mlx5/byte_order.h"

namespace melon::mlx5prov {

// Send: the WQEs before the record's send counter, the record before the 64-bit UAR store of the
// last WQE's first 8 bytes, and that store out of the CPU before the caller releases the UAR's
// lock (another thread's doorbell must not overtake it). Returns the value stored.
inline uint64_t ring_send_doorbell(uint32_t cur_post, const uint8_t* last_ctrl, volatile uint32_t* dbrec_snd,
                                   volatile uint64_t* uar_reg) {
  mlx5::udma_to_device_barrier();
  *dbrec_snd = to_be32(cur_post & 0xffff);
  mlx5::mmio_wc_start();
  uint64_t v;
  __builtin_memcpy(&v, last_ctrl, 8);
  *uar_reg = v;
  mlx5::mmio_flush_writes();
  return v;
}

// Receive queue or SRQ: the WQEs before the record's counter (no UAR doorbell).
inline void ring_recv_doorbell(uint32_t counter, volatile uint32_t* dbrec) {
  mlx5::udma_to_device_barrier();
  *dbrec = to_be32(counter & 0xffff);
}

// The CQE at consumer index `ci` once software owns it, else nullptr. What the device wrote
// before the owner bit is read only after the check.
inline const uint8_t* take_cqe(const uint8_t* cqe, uint32_t ci, uint32_t log_cnt) {
  if (!mlx5::prm::cqe_sw_owned(cqe, ci, log_cnt)) return nullptr;
  mlx5::udma_from_device_barrier();
  return cqe;
}

// The consumer index after polling. rdma-core and Linux store it with no barrier: the CQEs were
// only read.
inline void set_cq_ci(volatile uint32_t* dbrec_ci, uint32_t ci) { *dbrec_ci = to_be32(ci & 0xffffff); }

// The consumer index after CQEs were rewritten in place (a QP's completions cleaned out): the
// moved CQEs before the index that lets the device reuse the freed entries.
inline void set_cq_ci_after_clean(volatile uint32_t* dbrec_ci, uint32_t ci) {
  mlx5::udma_to_device_barrier();
  set_cq_ci(dbrec_ci, ci);
}

// Arm: the record's arm word (one 32-bit store), then the 64-bit CQ doorbell, flushed before the
// caller releases the UAR's lock.
inline void ring_cq_arm(volatile uint32_t* dbrec_arm, uint32_t arm_word, volatile uint64_t* uar_reg, uint64_t db) {
  *dbrec_arm = arm_word;
  mlx5::mmio_wc_start();
  *uar_reg = db;
  mlx5::mmio_flush_writes();
}

}  // namespace melon::mlx5prov
