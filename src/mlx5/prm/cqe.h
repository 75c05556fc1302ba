// Completion queue entries (64-byte format) as the HCA writes them, including the error CQE and
// the owner bit. Not in mlx5_ifc.h; tests/mlx5/prm checks them against <infiniband/mlx5dv.h>
// (struct mlx5_cqe64, struct mlx5_err_cqe, mlx5dv_get_cqe_*).
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

// Fields common to every CQE format sit in its last 8 bytes; op_own is polled first.
#define MELON_PRM_CQE64(F, S, A)                                                      \
  F(wqe_id, 16, 16)                                                                   \
  F(slid, 176, 16)                                                                    \
  F(flags, 192, 8) /* bits 29:28 (g) say a GRH/L3 header came with the packet */      \
  F(rqpn, 200, 24) /* remote QPN of a UD receive */                                   \
  F(hds_ip_ext, 224, 8)                                                               \
  F(l4_hdr_type_etc, 232, 8)                                                          \
  F(vlan_info, 240, 16)                                                               \
  F(srqn_uidx, 256, 32)                                                               \
  F(imm_inval_pkey, 288, 32)                                                          \
  F(byte_cnt, 352, 32)                                                                \
  F(timestamp, 384, 64)                                                               \
  F(sop_drop, 448, 8)                                                                 \
  F(qpn, 456, 24)                                                                     \
  F(wqe_counter, 480, 16)                                                             \
  F(signature, 496, 8)                                                                \
  F(opcode, 504, 4)                                                                   \
  F(format, 508, 2) /* cqe_format: plain, data inline (scatter to CQE), compressed */ \
  F(se, 510, 1) /* solicited event */                                                 \
  F(owner, 511, 1) /* flips each pass around the ring */
MELON_PRM_STRUCT(cqe64, 512, MELON_PRM_CQE64)

// CQE with opcode REQ_ERR or RESP_ERR.
#define MELON_PRM_ERR_CQE(F, S, A) \
  F(srqn, 256, 32)                 \
  F(vendor_err_synd, 432, 8)       \
  F(syndrome, 440, 8)              \
  F(s_wqe_opcode, 448, 8)          \
  F(qpn, 456, 24)                  \
  F(wqe_counter, 480, 16)          \
  F(signature, 496, 8)             \
  F(opcode, 504, 4)                \
  F(format, 508, 2)                \
  F(se, 510, 1)                    \
  F(owner, 511, 1)
MELON_PRM_STRUCT(err_cqe, 512, MELON_PRM_ERR_CQE)

inline constexpr uint32_t kCqeBytes = cqe64::size_bytes;  // 64

// cqe64.opcode
#define MELON_PRM_CQE_OPCODE(V) \
  V(REQ, 0x0)                   \
  V(RESP_WR_IMM, 0x1)           \
  V(RESP_SEND, 0x2)             \
  V(RESP_SEND_IMM, 0x3)         \
  V(RESP_SEND_INV, 0x4)         \
  V(RESIZE_CQ, 0x5)             \
  V(NO_PACKET, 0x6)             \
  V(SIGNATURE_ERR, 0xc)         \
  V(REQ_ERR, 0xd)               \
  V(RESP_ERR, 0xe)              \
  V(INVALID, 0xf)
MELON_PRM_VALUES(cqe_opcode, uint8_t, MELON_PRM_CQE_OPCODE)

// cqe64.format (op_own bits 3:2; mlx5dv.h MLX5_INLINE_SCATTER_32/64 are these values shifted):
// a responder CQE of a QP with qpc.cs_res carries a SEND of up to 32 bytes in its first 32 bytes
// (64: in the 64 bytes before it, 128-byte CQEs), which the receive's buffers never see.
#define MELON_PRM_CQE_FORMAT(V) \
  V(PLAIN, 0)                   \
  V(INLINE_SCATTER_32, 1)       \
  V(INLINE_SCATTER_64, 2)       \
  V(COMPRESSED, 3)
MELON_PRM_VALUES(cqe_format, uint8_t, MELON_PRM_CQE_FORMAT)

// err_cqe.syndrome: why a work request failed (maps onto ibv_wc_status).
#define MELON_PRM_CQE_SYNDROME(V)  \
  V(LOCAL_LENGTH_ERR, 0x01)        \
  V(LOCAL_QP_OP_ERR, 0x02)         \
  V(LOCAL_PROT_ERR, 0x04)          \
  V(WR_FLUSH_ERR, 0x05)            \
  V(MW_BIND_ERR, 0x06)             \
  V(BAD_RESP_ERR, 0x10)            \
  V(LOCAL_ACCESS_ERR, 0x11)        \
  V(REMOTE_INVAL_REQ_ERR, 0x12)    \
  V(REMOTE_ACCESS_ERR, 0x13)       \
  V(REMOTE_OP_ERR, 0x14)           \
  V(TRANSPORT_RETRY_EXC_ERR, 0x15) \
  V(RNR_RETRY_EXC_ERR, 0x16)       \
  V(REMOTE_ABORTED_ERR, 0x22)
MELON_PRM_VALUES(cqe_syndrome, uint8_t, MELON_PRM_CQE_SYNDROME)

// A CQE at ring index `ci` of a ring of 2^log_size entries belongs to software when its owner
// bit equals the pass parity of ci, and its opcode is not INVALID.
inline bool cqe_sw_owned(const void* cqe, uint32_t ci, uint32_t log_size) {
  ConstView<cqe64::Self> c(cqe);
  return c.get(cqe64::opcode) != cqe_opcode::INVALID && c.get(cqe64::owner) == ((ci >> log_size) & 1);
}

}  // namespace melon::mlx5::prm
