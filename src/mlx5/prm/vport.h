// RoCE addresses (GID table entries) and the NIC vport: state, context, RoCE enable, MTU, MAC.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_ROCE_ADDR_LAYOUT(F, S, A) \
  F(source_l3_address, 0, 128)              \
  F(vlan_valid, 131, 1)                     \
  F(vlan_id, 132, 12)                       \
  F(source_mac_47_32, 144, 16)              \
  F(source_mac_31_0, 160, 32)               \
  F(roce_l3_type, 212, 4)                   \
  F(roce_version, 216, 8)
MELON_PRM_STRUCT(roce_addr_layout, 256, MELON_PRM_ROCE_ADDR_LAYOUT)

#define MELON_PRM_SET_ROCE_ADDRESS_IN(F, S, A) \
  F(opcode, 0, 16)                             \
  F(op_mod, 48, 16)                            \
  F(roce_address_index, 64, 16)                \
  F(vhca_port_num, 92, 4)                      \
  S(roce_address, 128, roce_addr_layout)
MELON_PRM_STRUCT(set_roce_address_in, 384, MELON_PRM_SET_ROCE_ADDRESS_IN)

#define MELON_PRM_SET_ROCE_ADDRESS_OUT(F, S, A) \
  F(status, 0, 8)                               \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(set_roce_address_out, 128, MELON_PRM_SET_ROCE_ADDRESS_OUT)

#define MELON_PRM_QUERY_ROCE_ADDRESS_IN(F, S, A) \
  F(opcode, 0, 16)                               \
  F(op_mod, 48, 16)                              \
  F(roce_address_index, 64, 16)                  \
  F(vhca_port_num, 92, 4)
MELON_PRM_STRUCT(query_roce_address_in, 128, MELON_PRM_QUERY_ROCE_ADDRESS_IN)

#define MELON_PRM_QUERY_ROCE_ADDRESS_OUT(F, S, A) \
  F(status, 0, 8)                                 \
  F(syndrome, 32, 32)                             \
  S(roce_address, 128, roce_addr_layout)
MELON_PRM_STRUCT(query_roce_address_out, 384, MELON_PRM_QUERY_ROCE_ADDRESS_OUT)

#define MELON_PRM_QUERY_VPORT_STATE_IN(F, S, A) \
  F(opcode, 0, 16)                              \
  F(op_mod, 48, 16)                             \
  F(other_vport, 64, 1)                         \
  F(vport_number, 80, 16)
MELON_PRM_STRUCT(query_vport_state_in, 128, MELON_PRM_QUERY_VPORT_STATE_IN)

#define MELON_PRM_QUERY_VPORT_STATE_OUT(F, S, A) \
  F(status, 0, 8)                                \
  F(syndrome, 32, 32)                            \
  F(admin_state, 120, 4)                         \
  F(state, 124, 4)
MELON_PRM_STRUCT(query_vport_state_out, 128, MELON_PRM_QUERY_VPORT_STATE_OUT)

#define MELON_PRM_NIC_VPORT_CONTEXT(F, S, A) \
  F(min_wqe_inline_mode, 5, 3)               \
  F(disable_mc_local_lb, 29, 1)              \
  F(disable_uc_local_lb, 30, 1)              \
  F(roce_en, 31, 1)                          \
  F(arm_change_event, 32, 1)                 \
  F(event_on_mtu, 59, 1)                     \
  F(event_on_promisc_change, 60, 1)          \
  F(event_on_vlan_change, 61, 1)             \
  F(event_on_mc_address_change, 62, 1)       \
  F(event_on_uc_address_change, 63, 1)       \
  F(mtu, 304, 16)                            \
  F(system_image_guid, 320, 64)              \
  F(port_guid, 384, 64)                      \
  F(node_guid, 448, 64)                      \
  F(qkey_violation_counter, 832, 16)         \
  F(promisc_uc, 1920, 1)                     \
  F(promisc_mc, 1921, 1)                     \
  F(promisc_all, 1922, 1)                    \
  F(allowed_list_type, 1925, 3)              \
  F(allowed_list_size, 1940, 12)             \
  F(permanent_address, 1952, 64)             \
  A(current_uc_mac_address, 2048, 64)
MELON_PRM_STRUCT(nic_vport_context, 2048, MELON_PRM_NIC_VPORT_CONTEXT)

#define MELON_PRM_MODIFY_NIC_VPORT_FIELD_SELECT(F, S, A) \
  F(affiliation, 18, 1)                                  \
  F(disable_uc_local_lb, 20, 1)                          \
  F(disable_mc_local_lb, 21, 1)                          \
  F(node_guid, 22, 1)                                    \
  F(port_guid, 23, 1)                                    \
  F(min_inline, 24, 1)                                   \
  F(mtu, 25, 1)                                          \
  F(change_event, 26, 1)                                 \
  F(promisc, 27, 1)                                      \
  F(permanent_address, 28, 1)                            \
  F(addresses_list, 29, 1)                               \
  F(roce_en, 30, 1)
MELON_PRM_STRUCT(modify_nic_vport_field_select, 32, MELON_PRM_MODIFY_NIC_VPORT_FIELD_SELECT)

#define MELON_PRM_QUERY_NIC_VPORT_CONTEXT_IN(F, S, A) \
  F(opcode, 0, 16)                                    \
  F(op_mod, 48, 16)                                   \
  F(other_vport, 64, 1)                               \
  F(vport_number, 80, 16)                             \
  F(allowed_list_type, 101, 3)
MELON_PRM_STRUCT(query_nic_vport_context_in, 128, MELON_PRM_QUERY_NIC_VPORT_CONTEXT_IN)

#define MELON_PRM_QUERY_NIC_VPORT_CONTEXT_OUT(F, S, A) \
  F(status, 0, 8)                                      \
  F(syndrome, 32, 32)                                  \
  S(nic_vport_context, 128, nic_vport_context)
MELON_PRM_STRUCT(query_nic_vport_context_out, 2176, MELON_PRM_QUERY_NIC_VPORT_CONTEXT_OUT)

#define MELON_PRM_MODIFY_NIC_VPORT_CONTEXT_IN(F, S, A) \
  F(opcode, 0, 16)                                     \
  F(op_mod, 48, 16)                                    \
  F(other_vport, 64, 1)                                \
  F(vport_number, 80, 16)                              \
  S(field_select, 96, modify_nic_vport_field_select)   \
  S(nic_vport_context, 2048, nic_vport_context)
MELON_PRM_STRUCT(modify_nic_vport_context_in, 4096, MELON_PRM_MODIFY_NIC_VPORT_CONTEXT_IN)

#define MELON_PRM_MODIFY_NIC_VPORT_CONTEXT_OUT(F, S, A) \
  F(status, 0, 8)                                       \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(modify_nic_vport_context_out, 128, MELON_PRM_MODIFY_NIC_VPORT_CONTEXT_OUT)

#define MELON_PRM_ROCE_L3_TYPE(V) \
  V(IPV4, 0)                      \
  V(IPV6, 1)
MELON_PRM_VALUES(roce_l3_type, uint8_t, MELON_PRM_ROCE_L3_TYPE)
#define MELON_PRM_ROCE_VERSION(V) \
  V(VERSION_1, 0)                 \
  V(VERSION_2, 2)
MELON_PRM_VALUES(roce_version, uint8_t, MELON_PRM_ROCE_VERSION)
#define MELON_PRM_VPORT_STATE(V) \
  V(DOWN, 0)                     \
  V(UP, 1)
MELON_PRM_VALUES(vport_state, uint8_t, MELON_PRM_VPORT_STATE)

}  // namespace melon::mlx5::prm
