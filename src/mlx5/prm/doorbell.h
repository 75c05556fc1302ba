// Doorbell records (host memory the HCA reads) and UAR page offsets (MMIO the driver writes).
// Checked against <infiniband/mlx5dv.h> (MLX5_RCV_DBR/MLX5_SND_DBR) and the kernel's doorbell.h,
// cq.h constants.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

// QP/SRQ doorbell record: the receive and send producer counters, one dword each.
#define MELON_PRM_QP_DBREC(F, S, A) \
  F(rcv_counter, 16, 16)            \
  F(snd_counter, 48, 16)
MELON_PRM_STRUCT(qp_dbrec, 64, MELON_PRM_QP_DBREC)
inline constexpr uint32_t kRcvDbrIndex = 0, kSndDbrIndex = 1;  // dword indices

// CQ doorbell record: consumer index, and the arm word (sequence number, command, index).
#define MELON_PRM_CQ_DBREC(F, S, A) \
  F(set_ci, 8, 24)                  \
  F(arm_sn, 34, 2)                  \
  F(arm_cmd, 36, 4)                 \
  F(arm_ci, 40, 24)
MELON_PRM_STRUCT(cq_dbrec, 64, MELON_PRM_CQ_DBREC)

// The 64-bit CQ arm doorbell written to UAR + kUarCqDoorbell: the arm word, then the CQN.
#define MELON_PRM_CQ_UAR_DB(F, S, A) \
  F(sn, 2, 2)                        \
  F(cmd, 4, 4)                       \
  F(ci, 8, 24)                       \
  F(cqn, 40, 24)
MELON_PRM_STRUCT(cq_uar_db, 64, MELON_PRM_CQ_UAR_DB)
inline constexpr uint8_t kCqArmNext = 0x0;  // any next completion
inline constexpr uint8_t kCqArmSolicited = 0x1;  // next solicited completion only

// The 32-bit EQ doorbell written to UAR + kUarEqArm (update and arm) or kUarEqUpdate (update).
#define MELON_PRM_EQ_UAR_DB(F, S, A) \
  F(eqn, 0, 8)                       \
  F(ci, 8, 24)
MELON_PRM_STRUCT(eq_uar_db, 32, MELON_PRM_EQ_UAR_DB)

// UAR page layout (4 KiB pages).
inline constexpr uint32_t kUarPageBytes = 4096;
inline constexpr uint32_t kUarCqDoorbell = 0x20;
inline constexpr uint32_t kUarEqArm = 0x40;
inline constexpr uint32_t kUarEqUpdate = 0x48;
// BlueFlame: send doorbells go to UAR + 0x800; a UAR has two BlueFlame buffers of
// 2^log_bf_reg_size / 2 bytes each (256 with the usual log_bf_reg_size 9), used alternately.
inline constexpr uint32_t kUarBlueFlame = 0x800;
inline constexpr uint32_t bf_buffer_bytes(uint32_t log_bf_reg_size) { return (1u << log_bf_reg_size) / 2; }

}  // namespace melon::mlx5::prm
