// The send and receive queues as the application writes them (PRM "Send Queue", "Receive Queue";
// the layouts are src/mlx5/prm/wqe.h). Pure functions over mapped memory: no locks, no calls
// into the driver, so the unit tests run them on plain buffers and read the result with
// rdma-core's <infiniband/mlx5dv.h> as the oracle.
//
// Facts from rdma-core providers/mlx5 (qp.c, srq.c), reimplemented:
//   - a send WQE is a control segment, then (UD) the 48-byte datagram segment, then (RDMA, atomic)
//     the remote address segment, then (atomic) the atomic segment, then data segments or one
//     inline segment; WQEs take whole 64-byte basic blocks (WQEBBs) and segments wrap to the
//     start of the ring;
//   - zero-length gather entries are skipped; an atomic's data segment carries 8 bytes;
//   - a receive WQE is its scatter list, closed by an entry with the invalid lkey 0x100 when
//     shorter than the queue's maximum; an SRQ WQE starts with a 16-byte next segment and the
//     free WQEs form a list through it;
//   - before RTS a send is refused with ENOMEM, in RESET a receive with EINVAL (rdma-core's
//     qp_state_max_gs); over-long lists: send ENOMEM, receive EINVAL; inline data beyond the
//     QP's maximum ENOMEM; a full queue ENOMEM; an opcode out of range EINVAL.
#pragma once

#include "providers/mlx5/byte_order.h"
#include "providers/mlx5/doorbells.h"
#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

namespace melon::mlx5prov {

inline constexpr uint32_t kInvalidLkey = 0x100;
inline constexpr uint32_t kDatagramSegBytes = 48;

struct SendQueue {
  uint8_t* buf = nullptr;  // WQEBB 0
  uint32_t wqe_cnt = 0;  // WQEBBs in the ring (a power of two)
  uint32_t cur_post = 0;  // producer counter in WQEBBs (the doorbell record's low 16 bits)
  uint32_t tail = 0;  // consumer counter: the first WQEBB not yet completed
  int32_t state_max_gs = -1;  // max_gs from RTS on, -1 before (posting refused)
  uint32_t max_gs = 0;  // gather entries per WQE
  uint32_t max_inline = 0;  // inline bytes per WQE
  uint32_t qpn = 0;
  ibv_qp_type type = IBV_QPT_RC;
  bool sig_all = false;
  uint64_t* wrid = nullptr;  // [wqe_cnt] by first WQEBB: the work request's id
  uint32_t* next_tail = nullptr;  // [wqe_cnt] by first WQEBB: tail once this WQE completed
  uint8_t* last_ctrl = nullptr;  // the last WQE written (its first 8 bytes are the doorbell)
  uint32_t last_bbs = 0;  // its size in WQEBBs (BlueFlame copies it whole)
};

// Writes one WQE at cur_post and advances cur_post. `av` is the 48-byte datagram segment of the
// address handle (UD only). Returns 0 or an errno value; nothing is written on error.
int write_send_wqe(SendQueue& sq, const ibv_send_wr& wr, const uint8_t* av);

// The WQE size, in 16-byte units, a work request needs (0 with *err set when it cannot be posted).
uint32_t send_wqe_ds(const SendQueue& sq, const ibv_send_wr& wr, int* err);

// The send doorbell of this queue (PRM "Send Doorbell"; the ordering is doorbells.h's).
inline uint64_t ring_send_doorbell(const SendQueue& sq, uint32_t* dbrec_snd, volatile uint64_t* uar_reg) {
  return ring_send_doorbell(sq.cur_post, sq.last_ctrl, dbrec_snd, uar_reg);
}

struct RecvQueue {
  uint8_t* buf = nullptr;
  uint32_t wqe_cnt = 0;  // a power of two
  uint32_t stride = 0;  // bytes per WQE
  uint32_t max_gs = 0;
  int32_t state_max_gs = -1;  // max_gs from INIT on, -1 in RESET
  uint32_t head = 0, tail = 0;  // producer / consumer counters
  uint64_t* wrid = nullptr;  // [wqe_cnt]
};

int write_recv_wqe(RecvQueue& rq, const ibv_recv_wr& wr);
// Scatter to CQE: the `len` bytes a CQE carried, copied into receive WQE `wqe`'s scatter list (its
// data segments, up to `max` or the invalid lkey) as the device would have placed them (rdma-core
// mlx5_copy_to_recv_wqe). False if they do not fit: the receive's length error.
bool copy_to_scatter(const uint8_t* wqe, uint32_t max, const uint8_t* src, uint32_t len);

struct SrqQueue {
  uint8_t* buf = nullptr;
  uint32_t wqe_cnt = 0;
  uint32_t stride = 0;
  uint32_t max_gs = 0;
  uint32_t head = 0, tail = 0;  // first free WQE, last free WQE (the list's ends)
  uint32_t counter = 0;  // WQEs posted (the doorbell record)
  uint64_t* wrid = nullptr;
};

// Links every WQE into the free list (i -> i+1); head 0, tail wqe_cnt-1 (one stays unused).
void srq_init(SrqQueue& q);
int write_srq_wqe(SrqQueue& q, const ibv_recv_wr& wr);
// A completed WQE returns to the free list's tail.
void srq_free(SrqQueue& q, uint32_t index);

}  // namespace melon::mlx5prov
