// Shared receive queues: SRQ context, RMP (an SRQ over a work queue), ARM_RQ.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_SRQC(F, S, A) \
  F(state, 0, 4)                \
  F(log_srq_size, 4, 4)         \
  F(wq_signature, 32, 1)        \
  F(cont_srq, 33, 1)            \
  F(rlky, 35, 1)                \
  F(log_rq_stride, 37, 3)       \
  F(xrcd, 40, 24)               \
  F(page_offset, 64, 6)         \
  F(cqn, 72, 24)                \
  F(log_page_size, 130, 6)      \
  F(pd, 200, 24)                \
  F(lwm, 224, 16)               \
  F(wqe_cnt, 240, 16)           \
  F(dbr_addr, 320, 64)
MELON_PRM_STRUCT(srqc, 512, MELON_PRM_SRQC)

#define MELON_PRM_WQ(F, S, A) \
  F(wq_type, 0, 4)            \
  F(wq_signature, 4, 1)       \
  F(end_padding_mode, 5, 2)   \
  F(cd_slave, 7, 1)           \
  F(page_offset, 43, 5)       \
  F(pd, 72, 24)               \
  F(uar_page, 104, 24)        \
  F(dbr_addr, 128, 64)        \
  F(hw_counter, 192, 32)      \
  F(sw_counter, 224, 32)      \
  F(log_wq_stride, 268, 4)    \
  F(log_wq_pg_sz, 275, 5)     \
  F(log_wq_sz, 283, 5)        \
  F(dbr_umem_valid, 288, 1)   \
  F(wq_umem_valid, 289, 1)    \
  A(pas, 1536, 64)
MELON_PRM_STRUCT(wq, 1536, MELON_PRM_WQ)

#define MELON_PRM_RMPC(F, S, A)  \
  F(state, 8, 4)                 \
  F(basic_cyclic_rcv_wqe, 32, 1) \
  S(wq, 384, wq)
MELON_PRM_STRUCT(rmpc, 1920, MELON_PRM_RMPC)

#define MELON_PRM_CREATE_SRQ_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(uid, 16, 16)                         \
  F(op_mod, 48, 16)                      \
  S(srq_context_entry, 128, srqc)        \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(create_srq_in, 2176, MELON_PRM_CREATE_SRQ_IN)

#define MELON_PRM_CREATE_SRQ_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)                     \
  F(srqn, 72, 24)
MELON_PRM_STRUCT(create_srq_out, 128, MELON_PRM_CREATE_SRQ_OUT)

#define MELON_PRM_DESTROY_SRQ_IN(F, S, A) \
  F(opcode, 0, 16)                        \
  F(uid, 16, 16)                          \
  F(op_mod, 48, 16)                       \
  F(srqn, 72, 24)
MELON_PRM_STRUCT(destroy_srq_in, 128, MELON_PRM_DESTROY_SRQ_IN)

#define MELON_PRM_DESTROY_SRQ_OUT(F, S, A) \
  F(status, 0, 8)                          \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(destroy_srq_out, 128, MELON_PRM_DESTROY_SRQ_OUT)

#define MELON_PRM_QUERY_SRQ_IN(F, S, A) \
  F(opcode, 0, 16)                      \
  F(op_mod, 48, 16)                     \
  F(srqn, 72, 24)
MELON_PRM_STRUCT(query_srq_in, 128, MELON_PRM_QUERY_SRQ_IN)

#define MELON_PRM_QUERY_SRQ_OUT(F, S, A) \
  F(status, 0, 8)                        \
  F(syndrome, 32, 32)                    \
  S(srq_context_entry, 128, srqc)        \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(query_srq_out, 2176, MELON_PRM_QUERY_SRQ_OUT)

#define MELON_PRM_ARM_RQ_IN(F, S, A) \
  F(opcode, 0, 16)                   \
  F(uid, 16, 16)                     \
  F(op_mod, 48, 16)                  \
  F(srq_number, 72, 24)              \
  F(lwm, 112, 16)
MELON_PRM_STRUCT(arm_rq_in, 128, MELON_PRM_ARM_RQ_IN)

#define MELON_PRM_ARM_RQ_OUT(F, S, A) \
  F(status, 0, 8)                     \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(arm_rq_out, 128, MELON_PRM_ARM_RQ_OUT)

#define MELON_PRM_CREATE_RMP_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(uid, 16, 16)                         \
  F(op_mod, 48, 16)                      \
  S(ctx, 256, rmpc)
MELON_PRM_STRUCT(create_rmp_in, 2176, MELON_PRM_CREATE_RMP_IN)

#define MELON_PRM_CREATE_RMP_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)                     \
  F(rmpn, 72, 24)
MELON_PRM_STRUCT(create_rmp_out, 128, MELON_PRM_CREATE_RMP_OUT)

#define MELON_PRM_DESTROY_RMP_IN(F, S, A) \
  F(opcode, 0, 16)                        \
  F(uid, 16, 16)                          \
  F(op_mod, 48, 16)                       \
  F(rmpn, 72, 24)
MELON_PRM_STRUCT(destroy_rmp_in, 128, MELON_PRM_DESTROY_RMP_IN)

#define MELON_PRM_DESTROY_RMP_OUT(F, S, A) \
  F(status, 0, 8)                          \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(destroy_rmp_out, 128, MELON_PRM_DESTROY_RMP_OUT)

#define MELON_PRM_QUERY_RMP_IN(F, S, A) \
  F(opcode, 0, 16)                      \
  F(op_mod, 48, 16)                     \
  F(rmpn, 72, 24)
MELON_PRM_STRUCT(query_rmp_in, 128, MELON_PRM_QUERY_RMP_IN)

#define MELON_PRM_QUERY_RMP_OUT(F, S, A) \
  F(status, 0, 8)                        \
  F(syndrome, 32, 32)                    \
  S(rmp_context, 256, rmpc)
MELON_PRM_STRUCT(query_rmp_out, 2176, MELON_PRM_QUERY_RMP_OUT)

#define MELON_PRM_SRQC_STATE(V) \
  V(GOOD, 0)                    \
  V(ERROR, 1)
MELON_PRM_VALUES(srqc_state, uint8_t, MELON_PRM_SRQC_STATE)
#define MELON_PRM_RMPC_STATE(V) \
  V(RDY, 1)                     \
  V(ERR, 3)
MELON_PRM_VALUES(rmpc_state, uint8_t, MELON_PRM_RMPC_STATE)
#define MELON_PRM_WQ_TYPE(V)    \
  V(LINKED_LIST, 0)             \
  V(CYCLIC, 1)                  \
  V(LINKED_LIST_STRIDING_RQ, 2) \
  V(CYCLIC_STRIDING_RQ, 3)
MELON_PRM_VALUES(wq_type, uint8_t, MELON_PRM_WQ_TYPE)
inline constexpr uint16_t kArmRqOpModSrq = 1;  // arm_rq_in.op_mod: the object is an SRQ

}  // namespace melon::mlx5::prm
