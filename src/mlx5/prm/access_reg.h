// ACCESS_REGISTER and the port registers PAOS, PTYS, PMTU, PPCNT.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_ACCESS_REGISTER_IN(F, S, A) \
  F(opcode, 0, 16)                            \
  F(op_mod, 48, 16)                           \
  F(register_id, 80, 16)                      \
  F(argument, 96, 32)                         \
  A(register_data, 128, 32)
MELON_PRM_STRUCT(access_register_in, 128, MELON_PRM_ACCESS_REGISTER_IN)

#define MELON_PRM_ACCESS_REGISTER_OUT(F, S, A) \
  F(status, 0, 8)                              \
  F(syndrome, 32, 32)                          \
  A(register_data, 128, 32)
MELON_PRM_STRUCT(access_register_out, 128, MELON_PRM_ACCESS_REGISTER_OUT)

#define MELON_PRM_PAOS_REG(F, S, A) \
  F(swid, 0, 8)                     \
  F(local_port, 8, 8)               \
  F(admin_status, 20, 4)            \
  F(oper_status, 28, 4)             \
  F(ase, 32, 1)                     \
  F(ee, 33, 1)                      \
  F(e, 62, 2)
MELON_PRM_STRUCT(paos_reg, 128, MELON_PRM_PAOS_REG)

#define MELON_PRM_PTYS_REG(F, S, A)    \
  F(an_disable_admin, 1, 1)            \
  F(an_disable_cap, 2, 1)              \
  F(local_port, 8, 8)                  \
  F(proto_mask, 29, 3)                 \
  F(an_status, 32, 4)                  \
  F(data_rate_oper, 48, 16)            \
  F(ext_eth_proto_capability, 64, 32)  \
  F(eth_proto_capability, 96, 32)      \
  F(ib_link_width_capability, 128, 16) \
  F(ib_proto_capability, 144, 16)      \
  F(ext_eth_proto_admin, 160, 32)      \
  F(eth_proto_admin, 192, 32)          \
  F(ib_link_width_admin, 224, 16)      \
  F(ib_proto_admin, 240, 16)           \
  F(ext_eth_proto_oper, 256, 32)       \
  F(eth_proto_oper, 288, 32)           \
  F(ib_link_width_oper, 320, 16)       \
  F(ib_proto_oper, 336, 16)            \
  F(connector_type, 380, 4)            \
  F(eth_proto_lp_advertise, 384, 32)
MELON_PRM_STRUCT(ptys_reg, 512, MELON_PRM_PTYS_REG)

#define MELON_PRM_PMTU_REG(F, S, A) \
  F(local_port, 8, 8)               \
  F(max_mtu, 32, 16)                \
  F(admin_mtu, 64, 16)              \
  F(oper_mtu, 96, 16)
MELON_PRM_STRUCT(pmtu_reg, 128, MELON_PRM_PMTU_REG)

#define MELON_PRM_ETH_802_3_CNTRS_GRP_DATA_LAYOUT(F, S, A) \
  F(a_frames_transmitted_ok_high, 0, 32)                   \
  F(a_frames_transmitted_ok_low, 32, 32)                   \
  F(a_frames_received_ok_high, 64, 32)                     \
  F(a_frames_received_ok_low, 96, 32)                      \
  F(a_frame_check_sequence_errors_high, 128, 32)           \
  F(a_frame_check_sequence_errors_low, 160, 32)            \
  F(a_alignment_errors_high, 192, 32)                      \
  F(a_alignment_errors_low, 224, 32)                       \
  F(a_octets_transmitted_ok_high, 256, 32)                 \
  F(a_octets_transmitted_ok_low, 288, 32)                  \
  F(a_octets_received_ok_high, 320, 32)                    \
  F(a_octets_received_ok_low, 352, 32)                     \
  F(a_multicast_frames_xmitted_ok_high, 384, 32)           \
  F(a_multicast_frames_xmitted_ok_low, 416, 32)            \
  F(a_broadcast_frames_xmitted_ok_high, 448, 32)           \
  F(a_broadcast_frames_xmitted_ok_low, 480, 32)            \
  F(a_multicast_frames_received_ok_high, 512, 32)          \
  F(a_multicast_frames_received_ok_low, 544, 32)           \
  F(a_broadcast_frames_received_ok_high, 576, 32)          \
  F(a_broadcast_frames_received_ok_low, 608, 32)           \
  F(a_in_range_length_errors_high, 640, 32)                \
  F(a_in_range_length_errors_low, 672, 32)                 \
  F(a_out_of_range_length_field_high, 704, 32)             \
  F(a_out_of_range_length_field_low, 736, 32)              \
  F(a_frame_too_long_errors_high, 768, 32)                 \
  F(a_frame_too_long_errors_low, 800, 32)                  \
  F(a_symbol_error_during_carrier_high, 832, 32)           \
  F(a_symbol_error_during_carrier_low, 864, 32)            \
  F(a_mac_control_frames_transmitted_high, 896, 32)        \
  F(a_mac_control_frames_transmitted_low, 928, 32)         \
  F(a_mac_control_frames_received_high, 960, 32)           \
  F(a_mac_control_frames_received_low, 992, 32)            \
  F(a_unsupported_opcodes_received_high, 1024, 32)         \
  F(a_unsupported_opcodes_received_low, 1056, 32)          \
  F(a_pause_mac_ctrl_frames_received_high, 1088, 32)       \
  F(a_pause_mac_ctrl_frames_received_low, 1120, 32)        \
  F(a_pause_mac_ctrl_frames_transmitted_high, 1152, 32)    \
  F(a_pause_mac_ctrl_frames_transmitted_low, 1184, 32)
MELON_PRM_STRUCT(eth_802_3_cntrs_grp_data_layout, 1984, MELON_PRM_ETH_802_3_CNTRS_GRP_DATA_LAYOUT)

#define MELON_PRM_PPCNT_REG(F, S, A) \
  F(swid, 0, 8)                      \
  F(local_port, 8, 8)                \
  F(pnat, 16, 2)                     \
  F(grp, 26, 6)                      \
  F(clr, 32, 1)                      \
  F(prio_tc, 61, 3)                  \
  F(counter_set, 64, 1984)
MELON_PRM_STRUCT(ppcnt_reg, 2048, MELON_PRM_PPCNT_REG)

// HOST_ENDIANNESS (driver.h MLX5_REG_HOST_ENDIANNESS): written once after the boot pages by Linux's
// set_hca_ctrl and rdma-core's mlx5_vfio_set_hca_ctrl; he = 0 for a little-endian host
// (device.h MLX5_SET_HOST_ENDIANNESS). mlx5_ifc.h: register_host_endianness.
#define MELON_PRM_REGISTER_HOST_ENDIANNESS(F, S, A) F(he, 0, 1)
MELON_PRM_STRUCT(register_host_endianness, 128, MELON_PRM_REGISTER_HOST_ENDIANNESS)

#define MELON_PRM_REG_ID(V) \
  V(PMTU, 0x5003)           \
  V(PTYS, 0x5004)           \
  V(PAOS, 0x5006)           \
  V(PPCNT, 0x5008)          \
  V(HOST_ENDIANNESS, 0x7004)
MELON_PRM_VALUES(reg_id, uint16_t, MELON_PRM_REG_ID)
#define MELON_PRM_ACCESS_REG_OP_MOD(V) \
  V(WRITE, 0)                          \
  V(READ, 1)
MELON_PRM_VALUES(access_reg_op_mod, uint16_t, MELON_PRM_ACCESS_REG_OP_MOD)
// paos_reg.admin_status / oper_status
inline constexpr uint8_t kPortUp = 1, kPortDown = 2;
// ptys_reg.proto_mask
inline constexpr uint8_t kPtysIb = 1 << 0, kPtysEth = 1 << 2;
// ppcnt_reg.grp
inline constexpr uint8_t kPpcntIeee8023Group = 0x0;

}  // namespace melon::mlx5::prm
