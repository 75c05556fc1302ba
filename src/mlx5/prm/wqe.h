// Send and receive WQE segments, as software writes them into SQ/RQ rings. Not in mlx5_ifc.h;
// tests/mlx5/prm checks them against <infiniband/mlx5dv.h> (struct mlx5_wqe_*_seg, mlx5dv_set_*).
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

// Control segment: first 16 bytes of every send WQE.
#define MELON_PRM_WQE_CTRL_SEG(F, S, A)                                   \
  F(opmod, 0, 8)                                                          \
  F(wqe_index, 8, 16) /* producer counter of the first WQEBB, mod 2^16 */ \
  F(opcode, 24, 8)                                                        \
  F(qpn, 32, 24)                                                          \
  F(ds, 56, 8) /* WQE size in 16-byte units */                            \
  F(signature, 64, 8)                                                     \
  F(dci_stream_channel_id, 72, 16)                                        \
  F(fm, 88, 3) /* fence mode */                                           \
  F(ce, 92, 2) /* completion: 2 = always generate a CQE */                \
  F(se, 94, 1) /* solicited event */                                      \
  F(imm, 96, 32) /* immediate data or invalidated rkey */
MELON_PRM_STRUCT(wqe_ctrl_seg, 128, MELON_PRM_WQE_CTRL_SEG)

// Remote address segment (RDMA WRITE/READ, atomics).
#define MELON_PRM_WQE_RADDR_SEG(F, S, A) \
  F(raddr, 0, 64)                        \
  F(rkey, 64, 32)
MELON_PRM_STRUCT(wqe_raddr_seg, 128, MELON_PRM_WQE_RADDR_SEG)

// Atomic segment: compare-and-swap uses both; fetch-and-add only swap_add.
#define MELON_PRM_WQE_ATOMIC_SEG(F, S, A) \
  F(swap_add, 0, 64)                      \
  F(compare, 64, 64)
MELON_PRM_STRUCT(wqe_atomic_seg, 128, MELON_PRM_WQE_ATOMIC_SEG)

// Scatter/gather pointer (send gather list and receive scatter list).
#define MELON_PRM_WQE_DATA_SEG(F, S, A) \
  F(byte_count, 0, 32)                  \
  F(lkey, 32, 32)                       \
  F(addr, 64, 64)
MELON_PRM_STRUCT(wqe_data_seg, 128, MELON_PRM_WQE_DATA_SEG)

// Inline data header; the data follows it, the whole padded to 16 bytes.
#define MELON_PRM_WQE_INLINE_SEG(F, S, A) \
  F(inline_flag, 0, 1)                    \
  F(byte_count, 1, 31)
MELON_PRM_STRUCT(wqe_inline_seg, 32, MELON_PRM_WQE_INLINE_SEG)

// Address vector of a UD send (the datagram segment).
#define MELON_PRM_WQE_DATAGRAM_SEG(F, S, A)                  \
  F(qkey, 0, 32)                                             \
  F(ext, 64, 1) /* extended AV: GRH/RoCE fields are valid */ \
  F(dqpn, 72, 24)                                            \
  F(stat_rate, 96, 4)                                        \
  F(sl, 100, 4)                                              \
  F(fl, 104, 1)                                              \
  F(mlid, 105, 7)                                            \
  F(rlid, 112, 16) /* RoCE: UDP source port */               \
  F(rmac, 160, 48)                                           \
  F(tclass, 208, 8)                                          \
  F(hop_limit, 216, 8)                                       \
  F(grh, 225, 1)                                             \
  F(sgid_index, 228, 8)                                      \
  F(flow_label, 236, 20)                                     \
  F(rgid, 256, 128)
MELON_PRM_STRUCT(wqe_datagram_seg, 384, MELON_PRM_WQE_DATAGRAM_SEG)

inline constexpr uint32_t kSendWqeBB = 64;  // send WQE basic block
inline constexpr uint32_t kWqeSegUnit = 16;  // ds counts these
inline constexpr uint32_t kInlineSegFlag = 0x80000000u;

// wqe_ctrl_seg.opcode
#define MELON_PRM_WQE_OPCODE(V) \
  V(NOP, 0x00)                  \
  V(SEND_INVAL, 0x01)           \
  V(RDMA_WRITE, 0x08)           \
  V(RDMA_WRITE_IMM, 0x09)       \
  V(SEND, 0x0a)                 \
  V(SEND_IMM, 0x0b)             \
  V(TSO, 0x0e)                  \
  V(RDMA_READ, 0x10)            \
  V(ATOMIC_CS, 0x11)            \
  V(ATOMIC_FA, 0x12)            \
  V(ATOMIC_MASKED_CS, 0x14)     \
  V(ATOMIC_MASKED_FA, 0x15)     \
  V(FMR, 0x19)                  \
  V(LOCAL_INVAL, 0x1b)          \
  V(CONFIG_CMD, 0x1f)           \
  V(UMR, 0x25)
MELON_PRM_VALUES(wqe_opcode, uint8_t, MELON_PRM_WQE_OPCODE)

// wqe_ctrl_seg fm/ce/se, as the flag byte they make together.
#define MELON_PRM_WQE_CTRL_FLAG(V) \
  V(SOLICITED, 1 << 1)             \
  V(CQ_UPDATE, 2 << 2)             \
  V(INITIATOR_SMALL_FENCE, 1 << 5) \
  V(FENCE, 4 << 5)
MELON_PRM_VALUES(wqe_ctrl_flag, uint8_t, MELON_PRM_WQE_CTRL_FLAG)

}  // namespace melon::mlx5::prm
