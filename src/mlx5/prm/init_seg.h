// Initialization segment at the start of BAR0 and the firmware health buffer inside it.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_HEALTH_BUFFER(F, S, A) \
  F(assert_existptr, 256, 32)            \
  F(assert_callra, 288, 32)              \
  F(time, 352, 32)                       \
  F(fw_version, 384, 32)                 \
  F(hw_id, 416, 32)                      \
  F(rfr, 448, 1)                         \
  F(valid, 452, 1)                       \
  F(severity, 453, 3)                    \
  F(irisc_index, 480, 8)                 \
  F(synd, 488, 8)                        \
  F(ext_synd, 496, 16)
MELON_PRM_STRUCT(health_buffer, 512, MELON_PRM_HEALTH_BUFFER)

#define MELON_PRM_INITIAL_SEG(F, S, A)                                                   \
  F(fw_rev_minor, 0, 16)                                                                 \
  F(fw_rev_major, 16, 16)                                                                \
  F(cmd_interface_rev, 32, 16)                                                           \
  F(fw_rev_subminor, 48, 16)                                                             \
  F(cmdq_phy_addr_63_32, 128, 32)                                                        \
  F(cmdq_phy_addr_31_12, 160, 20)                                                        \
  F(nic_interface, 182, 2)                                                               \
  F(log_cmdq_size, 184, 4)                                                               \
  F(log_cmdq_stride, 188, 4)                                                             \
  F(command_doorbell_vector, 192, 32)                                                    \
  F(initializing, 4064, 1)                                                               \
  F(nic_interface_supported, 4069, 3)                                                    \
  F(embedded_cpu, 4072, 1)                                                               \
  S(health_buffer, 4096, health_buffer)                                                  \
  F(no_dram_nic_offset, 4608, 32)                                                        \
  F(internal_timer_h, 32768, 32) /* free-running 64-bit clock, device.h mlx5_init_seg */ \
  F(internal_timer_l, 32800, 32)                                                         \
  F(clear_int, 32895, 1)                                                                 \
  F(health_syndrome, 32896, 8)                                                           \
  F(health_counter, 32904, 24)
MELON_PRM_STRUCT(initial_seg, 131168, MELON_PRM_INITIAL_SEG)

// Firmware health syndromes (health_buffer.synd), by name.
#define MELON_PRM_HEALTH_SYNDROMES(V) \
  V(FW_INTERNAL_ERR, 0x1)             \
  V(DEAD_IRISC, 0x7)                  \
  V(HW_FATAL_ERR, 0x8)                \
  V(FW_CRC_ERR, 0x9)                  \
  V(ICM_FETCH_PCI_ERR, 0xa)           \
  V(ICM_PAGE_ERR, 0xb)                \
  V(ASYNCHRONOUS_EQ_BUF_OVERRUN, 0xc) \
  V(EQ_IN_ERR, 0xd)                   \
  V(EQ_INV, 0xe)                      \
  V(FFSER_ERR, 0xf)                   \
  V(HIGH_TEMP_ERR, 0x10)
MELON_PRM_VALUES(health_syndrome, uint8_t, MELON_PRM_HEALTH_SYNDROMES)

// initial_seg.nic_interface: what the driver asks the NIC to be.
#define MELON_PRM_NIC_INTERFACE(V) \
  V(FULL_DRIVER, 0)                \
  V(DISABLED, 1)                   \
  V(NO_DRAM_NIC, 2)
MELON_PRM_VALUES(nic_interface, uint8_t, MELON_PRM_NIC_INTERFACE)

// BAR0 byte offsets the driver touches, derived from the table above (never written twice).
namespace init_seg_offset {
inline constexpr uint32_t fw_rev = initial_seg::fw_rev_minor.byte_off();  // 0x000
inline constexpr uint32_t cmdif_rev_fw_sub = initial_seg::cmd_interface_rev.byte_off();  // 0x004
inline constexpr uint32_t cmdq_addr_h = initial_seg::cmdq_phy_addr_63_32.byte_off();  // 0x010
inline constexpr uint32_t cmdq_addr_l_sz = initial_seg::cmdq_phy_addr_31_12.byte_off();  // 0x014
inline constexpr uint32_t cmd_dbell = initial_seg::command_doorbell_vector.byte_off();  // 0x018
inline constexpr uint32_t initializing = initial_seg::initializing.byte_off();  // 0x1fc
inline constexpr uint32_t health = initial_seg::health_buffer.byte_off();  // 0x200
inline constexpr uint32_t internal_timer_h = initial_seg::internal_timer_h.byte_off();  // 0x1000
inline constexpr uint32_t internal_timer_l = initial_seg::internal_timer_l.byte_off();  // 0x1004
inline constexpr uint32_t health_counter = initial_seg::health_syndrome.byte_off();  // 0x1010
}  // namespace init_seg_offset

}  // namespace melon::mlx5::prm
