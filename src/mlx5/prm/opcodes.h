// Command opcodes (the `opcode` field of every command's input), with names for logs.
// Values are PRM facts; tests/mlx5/prm checks each against mlx5_ifc.h's MLX5_CMD_OP_*.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_OPCODES(V)         \
  V(QUERY_HCA_CAP, 0x100)            \
  V(QUERY_ADAPTER, 0x101)            \
  V(INIT_HCA, 0x102)                 \
  V(TEARDOWN_HCA, 0x103)             \
  V(ENABLE_HCA, 0x104)               \
  V(DISABLE_HCA, 0x105)              \
  V(QUERY_PAGES, 0x107)              \
  V(MANAGE_PAGES, 0x108)             \
  V(SET_HCA_CAP, 0x109)              \
  V(QUERY_ISSI, 0x10a)               \
  V(SET_ISSI, 0x10b)                 \
  V(CREATE_MKEY, 0x200)              \
  V(QUERY_MKEY, 0x201)               \
  V(DESTROY_MKEY, 0x202)             \
  V(CREATE_EQ, 0x301)                \
  V(DESTROY_EQ, 0x302)               \
  V(QUERY_EQ, 0x303)                 \
  V(CREATE_CQ, 0x400)                \
  V(DESTROY_CQ, 0x401)               \
  V(QUERY_CQ, 0x402)                 \
  V(MODIFY_CQ, 0x403)                \
  V(CREATE_QP, 0x500)                \
  V(DESTROY_QP, 0x501)               \
  V(RST2INIT_QP, 0x502)              \
  V(INIT2RTR_QP, 0x503)              \
  V(RTR2RTS_QP, 0x504)               \
  V(RTS2RTS_QP, 0x505)               \
  V(SQERR2RTS_QP, 0x506)             \
  V(QP_2ERR, 0x507)                  \
  V(QP_2RST, 0x50a)                  \
  V(QUERY_QP, 0x50b)                 \
  V(SQD_RTS_QP, 0x50c)               \
  V(INIT2INIT_QP, 0x50e)             \
  V(CREATE_SRQ, 0x700)               \
  V(DESTROY_SRQ, 0x701)              \
  V(QUERY_SRQ, 0x702)                \
  V(ARM_RQ, 0x703)                   \
  V(QUERY_VPORT_STATE, 0x750)        \
  V(QUERY_NIC_VPORT_CONTEXT, 0x754)  \
  V(MODIFY_NIC_VPORT_CONTEXT, 0x755) \
  V(QUERY_ROCE_ADDRESS, 0x760)       \
  V(SET_ROCE_ADDRESS, 0x761)         \
  V(ALLOC_Q_COUNTER, 0x771)          \
  V(DEALLOC_Q_COUNTER, 0x772)        \
  V(QUERY_Q_COUNTER, 0x773)          \
  V(ALLOC_PD, 0x800)                 \
  V(DEALLOC_PD, 0x801)               \
  V(ALLOC_UAR, 0x802)                \
  V(DEALLOC_UAR, 0x803)              \
  V(ACCESS_REG, 0x805)               \
  V(NOP, 0x80d)                      \
  V(ALLOC_TRANSPORT_DOMAIN, 0x816)   \
  V(DEALLOC_TRANSPORT_DOMAIN, 0x817) \
  V(CREATE_RMP, 0x90c)               \
  V(MODIFY_RMP, 0x90d)               \
  V(DESTROY_RMP, 0x90e)              \
  V(QUERY_RMP, 0x90f)                \
  V(CREATE_UMEM, 0xa08)              \
  V(DESTROY_UMEM, 0xa0a)
MELON_PRM_VALUES(opcode, uint16_t, MELON_PRM_OPCODES)

}  // namespace melon::mlx5::prm
