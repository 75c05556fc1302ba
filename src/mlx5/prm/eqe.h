// Event queue entries and the per-event data that fills their middle.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_CMD_INTER_COMP_EVENT(F, S, A) F(command_completion_vector, 0, 32)
MELON_PRM_STRUCT(cmd_inter_comp_event, 224, MELON_PRM_CMD_INTER_COMP_EVENT)

#define MELON_PRM_PAGES_REQ_EVENT(F, S, A) \
  F(function_id, 16, 16)                   \
  F(num_pages, 32, 32)
MELON_PRM_STRUCT(pages_req_event, 224, MELON_PRM_PAGES_REQ_EVENT)

#define MELON_PRM_COMP_EVENT(F, S, A) F(cq_number, 200, 24)
MELON_PRM_STRUCT(comp_event, 224, MELON_PRM_COMP_EVENT)

#define MELON_PRM_QP_EVENTS(F, S, A) \
  F(type, 160, 8)                    \
  F(qpn_rqn_sqn, 200, 24)
MELON_PRM_STRUCT(qp_events, 224, MELON_PRM_QP_EVENTS)

#define MELON_PRM_CQ_ERROR(F, S, A) \
  F(cqn, 8, 24)                     \
  F(syndrome, 88, 8)
MELON_PRM_STRUCT(cq_error, 224, MELON_PRM_CQ_ERROR)

#define MELON_PRM_PORT_STATE_CHANGE_EVENT(F, S, A) F(port_num, 64, 4)
MELON_PRM_STRUCT(port_state_change_event, 224, MELON_PRM_PORT_STATE_CHANGE_EVENT)

#define MELON_PRM_EQE(F, S, A) \
  F(event_type, 8, 8)          \
  F(event_sub_type, 24, 8)     \
  F(event_data, 256, 224)      \
  F(signature, 496, 8)         \
  F(owner, 511, 1)
MELON_PRM_STRUCT(eqe, 512, MELON_PRM_EQE)

#define MELON_PRM_EVENT_TYPE(V) \
  V(COMP, 0x00)                 \
  V(PATH_MIG, 0x01)             \
  V(COMM_EST, 0x02)             \
  V(SQ_DRAINED, 0x03)           \
  V(CQ_ERROR, 0x04)             \
  V(WQ_CATAS_ERROR, 0x05)       \
  V(PATH_MIG_FAILED, 0x07)      \
  V(INTERNAL_ERROR, 0x08)       \
  V(PORT_CHANGE, 0x09)          \
  V(CMD, 0x0a)                  \
  V(PAGE_REQUEST, 0x0b)         \
  V(PAGE_FAULT, 0x0c)           \
  V(NIC_VPORT_CHANGE, 0x0d)     \
  V(WQ_INVAL_REQ_ERROR, 0x10)   \
  V(WQ_ACCESS_ERROR, 0x11)      \
  V(SRQ_CATAS_ERROR, 0x12)      \
  V(SRQ_LAST_WQE, 0x13)         \
  V(SRQ_RQ_LIMIT, 0x14)         \
  V(GPIO_EVENT, 0x15)           \
  V(PORT_MODULE_EVENT, 0x16)    \
  V(TEMP_WARN_EVENT, 0x17)      \
  V(GENERAL_EVENT, 0x22)
MELON_PRM_VALUES(event_type, uint8_t, MELON_PRM_EVENT_TYPE)

// eqe.event_sub_type of a PORT_CHANGE event.
#define MELON_PRM_PORT_CHANGE_SUBTYPE(V) \
  V(DOWN, 1)                             \
  V(ACTIVE, 4)                           \
  V(INITIALIZED, 5)                      \
  V(LID, 6)                              \
  V(PKEY, 7)                             \
  V(GUID, 8)                             \
  V(CLIENT_REREG, 9)
MELON_PRM_VALUES(port_change_subtype, uint8_t, MELON_PRM_PORT_CHANGE_SUBTYPE)

// cq_error.syndrome: why the CQ went to error.
#define MELON_PRM_CQ_ERROR_SYNDROME(V) \
  V(CQ_OVERRUN, 0x1)                   \
  V(CQ_ACCESS_VIOLATION_ERROR, 0x2)
MELON_PRM_VALUES(cq_error_syndrome, uint8_t, MELON_PRM_CQ_ERROR_SYNDROME)

// qp_events.type: which kind of object a QP/SRQ event is about.
inline constexpr uint8_t kEventObjQp = 0, kEventObjSrq = 1;
inline constexpr uint32_t kEqeBytes = eqe::Self::size_bits / 8;  // 64

}  // namespace melon::mlx5::prm
