// Completion queues: CQ context and CREATE/DESTROY/QUERY/MODIFY_CQ.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_CQC(F, S, A)                               \
  F(status, 0, 4)                                            \
  F(dbr_umem_valid, 6, 1)                                    \
  F(apu_cq, 7, 1)                                            \
  F(cqe_sz, 8, 3)                                            \
  F(cc, 11, 1)                                               \
  F(scqe_break_moderation_en, 13, 1)                         \
  F(oi, 14, 1)                                               \
  F(cq_period_mode, 15, 2)                                   \
  F(cqe_comp_en, 17, 1)                                      \
  F(mini_cqe_res_format, 18, 2)                              \
  F(st, 20, 4)                                               \
  F(cqe_compression_layout, 30, 2)                           \
  F(page_offset, 84, 6)                                      \
  F(log_cq_size, 99, 5)                                      \
  F(uar_page, 104, 24)                                       \
  F(cq_period, 132, 12)                                      \
  F(cq_max_count, 144, 16)                                   \
  F(c_eqn, 160, 32) /* c_eqn_or_apu_element in mlx5_ifc.h */ \
  F(log_page_size, 195, 5)                                   \
  F(last_notified_index, 264, 24)                            \
  F(last_solicit_index, 296, 24)                             \
  F(consumer_counter, 328, 24)                               \
  F(producer_counter, 360, 24)                               \
  F(dbr_addr, 448, 64)
MELON_PRM_STRUCT(cqc, 512, MELON_PRM_CQC)

#define MELON_PRM_CREATE_CQ_IN(F, S, A) \
  F(opcode, 0, 16)                      \
  F(uid, 16, 16)                        \
  F(op_mod, 48, 16)                     \
  S(cq_context, 128, cqc)               \
  F(cq_umem_valid, 736, 1)              \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(create_cq_in, 2176, MELON_PRM_CREATE_CQ_IN)

#define MELON_PRM_CREATE_CQ_OUT(F, S, A) \
  F(status, 0, 8)                        \
  F(syndrome, 32, 32)                    \
  F(cqn, 72, 24)
MELON_PRM_STRUCT(create_cq_out, 128, MELON_PRM_CREATE_CQ_OUT)

#define MELON_PRM_DESTROY_CQ_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(uid, 16, 16)                         \
  F(op_mod, 48, 16)                      \
  F(cqn, 72, 24)
MELON_PRM_STRUCT(destroy_cq_in, 128, MELON_PRM_DESTROY_CQ_IN)

#define MELON_PRM_DESTROY_CQ_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(destroy_cq_out, 128, MELON_PRM_DESTROY_CQ_OUT)

#define MELON_PRM_QUERY_CQ_IN(F, S, A) \
  F(opcode, 0, 16)                     \
  F(op_mod, 48, 16)                    \
  F(cqn, 72, 24)
MELON_PRM_STRUCT(query_cq_in, 128, MELON_PRM_QUERY_CQ_IN)

#define MELON_PRM_QUERY_CQ_OUT(F, S, A) \
  F(status, 0, 8)                       \
  F(syndrome, 32, 32)                   \
  S(cq_context, 128, cqc)               \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(query_cq_out, 2176, MELON_PRM_QUERY_CQ_OUT)

#define MELON_PRM_MODIFY_CQ_IN(F, S, A)                                               \
  F(opcode, 0, 16)                                                                    \
  F(uid, 16, 16)                                                                      \
  F(op_mod, 48, 16)                                                                   \
  F(cqn, 72, 24)                                                                      \
  F(field_select, 96, 32) /* modify: cq_modify bits; resize: cq_resize_select bits */ \
  S(cq_context, 128, cqc)                                                             \
  F(cq_umem_valid, 736, 1)                                                            \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(modify_cq_in, 2176, MELON_PRM_MODIFY_CQ_IN)

#define MELON_PRM_MODIFY_CQ_OUT(F, S, A) \
  F(status, 0, 8)                        \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(modify_cq_out, 128, MELON_PRM_MODIFY_CQ_OUT)

#define MELON_PRM_CQC_STATUS(V) \
  V(OK, 0x0)                    \
  V(CQ_OVERFLOW, 0x9)           \
  V(CQ_WRITE_FAIL, 0xa)
MELON_PRM_VALUES(cqc_status, uint8_t, MELON_PRM_CQC_STATUS)
#define MELON_PRM_CQC_CQE_SZ(V) \
  V(BYTES_64, 0)                \
  V(BYTES_128, 1)
MELON_PRM_VALUES(cqc_cqe_sz, uint8_t, MELON_PRM_CQC_CQE_SZ)
#define MELON_PRM_CQC_ST(V)                    \
  V(SOLICITED_NOTIFICATION_REQUEST_ARMED, 0x6) \
  V(NOTIFICATION_REQUEST_ARMED, 0x9)           \
  V(FIRED, 0xa)
MELON_PRM_VALUES(cqc_st, uint8_t, MELON_PRM_CQC_ST)
// modify_cq_in.field_select when op_mod is 0 (modify); op_mod 1 resizes.
#define MELON_PRM_CQ_MODIFY(V) \
  V(PERIOD, 1 << 0)            \
  V(COUNT, 1 << 1)             \
  V(OVERRUN, 1 << 2)
MELON_PRM_VALUES(cq_modify, uint32_t, MELON_PRM_CQ_MODIFY)
// modify_cq_in.op_mod.
#define MELON_PRM_MODIFY_CQ_OP_MOD(V) \
  V(MODIFY_CQ, 0x0)                   \
  V(RESIZE_CQ, 0x1)
MELON_PRM_VALUES(modify_cq_op_mod, uint16_t, MELON_PRM_MODIFY_CQ_OP_MOD)
// modify_cq_in.field_select when op_mod is RESIZE_CQ: which of the context's ring fields the new
// ring takes (the page list always comes with it).
#define MELON_PRM_CQ_RESIZE_SELECT(V) \
  V(LOG_CQ_SIZE, 0x1)                 \
  V(PAGE_OFFSET, 0x2)                 \
  V(LOG_PAGE_SIZE, 0x4)
MELON_PRM_VALUES(cq_resize_select, uint32_t, MELON_PRM_CQ_RESIZE_SELECT)
inline constexpr uint16_t kModifyCqOpModModify = modify_cq_op_mod::MODIFY_CQ,
                          kModifyCqOpModResize = modify_cq_op_mod::RESIZE_CQ;

}  // namespace melon::mlx5::prm
