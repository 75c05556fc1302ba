// DEVX user memory (UMEM): a registered host buffer the device addresses by umem id and offset
// (PRM "UMEM"; mlx5_ifc.h umem, create_umem_in/out, destroy_umem_in/out). rdma-core's mlx5_vfio
// registers every DEVX CQ/QP buffer and doorbell record this way, and refuses a device whose
// cmd_hca_cap.umem_uid_0 is clear.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_UMEM(F, S, A) \
  F(ats, 128, 1)                \
  F(log_page_size, 155, 5)      \
  F(page_offset, 160, 32)       \
  F(num_of_mtt, 192, 64)        \
  A(mtt, 256, 64)
MELON_PRM_STRUCT(umem, 256, MELON_PRM_UMEM)

#define MELON_PRM_CREATE_UMEM_IN(F, S, A) \
  F(opcode, 0, 16)                        \
  F(uid, 16, 16)                          \
  F(op_mod, 48, 16)                       \
  S(umem, 128, umem)
MELON_PRM_STRUCT(create_umem_in, 384, MELON_PRM_CREATE_UMEM_IN)

#define MELON_PRM_CREATE_UMEM_OUT(F, S, A) \
  F(status, 0, 8)                          \
  F(syndrome, 32, 32)                      \
  F(umem_id, 72, 24)
MELON_PRM_STRUCT(create_umem_out, 128, MELON_PRM_CREATE_UMEM_OUT)

#define MELON_PRM_DESTROY_UMEM_IN(F, S, A) \
  F(opcode, 0, 16)                         \
  F(uid, 16, 16)                           \
  F(op_mod, 48, 16)                        \
  F(umem_id, 72, 24)
MELON_PRM_STRUCT(destroy_umem_in, 128, MELON_PRM_DESTROY_UMEM_IN)

#define MELON_PRM_DESTROY_UMEM_OUT(F, S, A) \
  F(status, 0, 8)                           \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(destroy_umem_out, 128, MELON_PRM_DESTROY_UMEM_OUT)

}  // namespace melon::mlx5::prm
