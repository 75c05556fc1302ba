// HCA life cycle commands: ENABLE/DISABLE_HCA, ISSI, firmware pages, capabilities, INIT/TEARDOWN_HCA, NOP, QUERY_ADAPTER.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_ENABLE_HCA_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(op_mod, 48, 16)                      \
  F(embedded_cpu_function, 64, 1)        \
  F(function_id, 80, 16)
MELON_PRM_STRUCT(enable_hca_in, 128, MELON_PRM_ENABLE_HCA_IN)

#define MELON_PRM_ENABLE_HCA_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(enable_hca_out, 96, MELON_PRM_ENABLE_HCA_OUT)

#define MELON_PRM_DISABLE_HCA_IN(F, S, A) \
  F(opcode, 0, 16)                        \
  F(op_mod, 48, 16)                       \
  F(embedded_cpu_function, 64, 1)         \
  F(function_id, 80, 16)
MELON_PRM_STRUCT(disable_hca_in, 128, MELON_PRM_DISABLE_HCA_IN)

#define MELON_PRM_DISABLE_HCA_OUT(F, S, A) \
  F(status, 0, 8)                          \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(disable_hca_out, 96, MELON_PRM_DISABLE_HCA_OUT)

#define MELON_PRM_QUERY_ISSI_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(op_mod, 48, 16)
MELON_PRM_STRUCT(query_issi_in, 128, MELON_PRM_QUERY_ISSI_IN)

#define MELON_PRM_QUERY_ISSI_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)                     \
  F(current_issi, 80, 16)                 \
  F(supported_issi_dw0, 864, 32)
MELON_PRM_STRUCT(query_issi_out, 896, MELON_PRM_QUERY_ISSI_OUT)

#define MELON_PRM_SET_ISSI_IN(F, S, A) \
  F(opcode, 0, 16)                     \
  F(op_mod, 48, 16)                    \
  F(current_issi, 80, 16)
MELON_PRM_STRUCT(set_issi_in, 128, MELON_PRM_SET_ISSI_IN)

#define MELON_PRM_SET_ISSI_OUT(F, S, A) \
  F(status, 0, 8)                       \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(set_issi_out, 128, MELON_PRM_SET_ISSI_OUT)

#define MELON_PRM_QUERY_PAGES_IN(F, S, A) \
  F(opcode, 0, 16)                        \
  F(op_mod, 48, 16)                       \
  F(embedded_cpu_function, 64, 1)         \
  F(function_id, 80, 16)
MELON_PRM_STRUCT(query_pages_in, 128, MELON_PRM_QUERY_PAGES_IN)

#define MELON_PRM_QUERY_PAGES_OUT(F, S, A) \
  F(status, 0, 8)                          \
  F(syndrome, 32, 32)                      \
  F(embedded_cpu_function, 64, 1)          \
  F(function_id, 80, 16)                   \
  F(num_pages, 96, 32)
MELON_PRM_STRUCT(query_pages_out, 128, MELON_PRM_QUERY_PAGES_OUT)

#define MELON_PRM_MANAGE_PAGES_IN(F, S, A) \
  F(opcode, 0, 16)                         \
  F(op_mod, 48, 16)                        \
  F(embedded_cpu_function, 64, 1)          \
  F(function_id, 80, 16)                   \
  F(input_num_entries, 96, 32)             \
  A(pas, 128, 64)
MELON_PRM_STRUCT(manage_pages_in, 128, MELON_PRM_MANAGE_PAGES_IN)

#define MELON_PRM_MANAGE_PAGES_OUT(F, S, A) \
  F(status, 0, 8)                           \
  F(syndrome, 32, 32)                       \
  F(output_num_entries, 64, 32)             \
  A(pas, 128, 64)
MELON_PRM_STRUCT(manage_pages_out, 128, MELON_PRM_MANAGE_PAGES_OUT)

#define MELON_PRM_CMD_HCA_CAP(F, S, A)  \
  F(vhca_resource_manager, 31, 1)       \
  F(hca_cap_2, 32, 1)                   \
  F(vhca_id, 48, 16)                    \
  F(log_max_srq_sz, 128, 8)             \
  F(log_max_qp_sz, 136, 8)              \
  F(log_max_qp, 155, 5)                 \
  F(log_max_srq, 171, 5)                \
  F(log_max_cq_sz, 200, 8)              \
  F(log_max_cq, 219, 5)                 \
  F(log_max_eq_sz, 224, 8)              \
  F(relaxed_ordering_write, 232, 1)     \
  F(relaxed_ordering_read, 233, 1)      \
  F(log_max_mkey, 234, 6)               \
  F(fast_teardown, 251, 1)              \
  F(log_max_eq, 252, 4)                 \
  F(max_indirection, 256, 8)            \
  F(log_max_mrw_sz, 265, 7)             \
  F(force_teardown, 272, 1)             \
  F(null_mkey, 281, 1)                  \
  F(log_max_klm_list_size, 282, 6)      \
  F(log_max_ra_req_dc, 298, 6)          \
  F(log_max_ra_res_dc, 314, 6)          \
  F(release_all_pages, 325, 1)          \
  F(roce_accl, 329, 1)                  \
  F(log_max_ra_req_qp, 330, 6)          \
  F(log_max_ra_res_qp, 346, 6)          \
  F(end_pad, 352, 1)                    \
  F(start_pad, 355, 1)                  \
  F(cache_line_128byte, 356, 1)         \
  F(gid_table_size, 368, 16)            \
  F(out_of_seq_cnt, 384, 1)             \
  F(vport_counters, 385, 1)             \
  F(retransmission_q_counters, 386, 1)  \
  F(max_qp_cnt, 390, 10)                \
  F(pkey_table_size, 400, 16)           \
  F(vport_group_manager, 416, 1)        \
  F(ib_virt, 418, 1)                    \
  F(eth_virt, 419, 1)                   \
  F(ets, 421, 1)                        \
  F(nic_flow_table, 422, 1)             \
  F(eswitch_manager, 423, 1)            \
  F(local_ca_ack_delay, 427, 5)         \
  F(port_module_event, 432, 1)          \
  F(enhanced_error_q_counters, 433, 1)  \
  F(ports_check, 434, 1)                \
  F(port_type, 438, 2)                  \
  F(num_ports, 440, 8)                  \
  F(log_max_msg, 451, 5)                \
  F(max_tc, 460, 4)                     \
  F(temp_warn_event, 464, 1)            \
  F(general_notification_event, 466, 1) \
  F(stat_rate_support, 480, 16)         \
  F(cqe_version, 508, 4)                \
  F(compact_address_vector, 512, 1)     \
  F(striding_rq, 513, 1)                \
  F(cmdif_checksum, 528, 2)             \
  F(sigerr_cqe, 530, 1)                 \
  F(wq_signature, 532, 1)               \
  F(sctr_data_cqe, 533, 1)              \
  F(dct, 538, 1)                        \
  F(qos, 539, 1)                        \
  F(eth_net_offloads, 540, 1)           \
  F(roce, 541, 1)                       \
  F(atomic, 542, 1)                     \
  F(cq_oi, 544, 1)                      \
  F(cq_resize, 545, 1)                  \
  F(cq_moderation, 546, 1)              \
  F(cq_eq_remap, 550, 1)                \
  F(pg, 551, 1)                         \
  F(block_lb_mc, 552, 1)                \
  F(apm, 558, 1)                        \
  F(xrc, 572, 1)                        \
  F(ud, 573, 1)                         \
  F(uc, 574, 1)                         \
  F(rc, 575, 1)                         \
  F(uar_4k, 576, 1)                     \
  F(uar_sz, 586, 6)                     \
  F(umem_uid_0, 594, 1)                 \
  F(log_pg_sz, 600, 8)                  \
  F(bf, 608, 1)                         \
  F(driver_version, 609, 1)             \
  F(log_bf_reg_size, 619, 5)            \
  F(max_wqe_sz_sq, 656, 16)             \
  F(max_wqe_sz_rq, 688, 16)             \
  F(max_qp_mcg, 743, 25)                \
  F(log_max_mcg, 792, 8)                \
  F(log_max_transport_domain, 803, 5)   \
  F(log_max_pd, 811, 5)                 \
  F(log_max_xrcd, 827, 5)               \
  F(log_max_rq, 867, 5)                 \
  F(log_max_sq, 875, 5)                 \
  F(log_max_rmp, 899, 5)                \
  F(log_max_wq_sz, 987, 5)              \
  F(log_max_current_mc_list, 1011, 5)   \
  F(log_max_current_uc_list, 1019, 5)   \
  F(general_obj_types, 1024, 64)        \
  F(sq_ts_format, 1088, 2)              \
  F(rq_ts_format, 1090, 2)              \
  F(log_max_uctx, 1123, 5)              \
  F(log_max_umem, 1131, 5)              \
  F(max_num_eqs, 1136, 16)              \
  F(log_uar_page_sz, 1168, 16)          \
  F(device_frequency_mhz, 1216, 32)     \
  F(device_frequency_khz, 1248, 32)     \
  F(num_of_uars_per_page, 1312, 32)
MELON_PRM_STRUCT(cmd_hca_cap, 2048, MELON_PRM_CMD_HCA_CAP)

#define MELON_PRM_ROCE_CAP(F, S, A)    \
  F(roce_apm, 0, 1)                    \
  F(sw_r_roce_src_udp_port, 4, 1)      \
  F(fl_rc_qp_when_roce_disabled, 5, 1) \
  F(fl_rc_qp_when_roce_enabled, 6, 1)  \
  F(qp_ts_format, 30, 2)               \
  F(l3_type, 140, 4)                   \
  F(roce_version, 152, 8)              \
  F(r_roce_dest_udp_port, 176, 16)     \
  F(r_roce_max_src_udp_port, 192, 16)  \
  F(r_roce_min_src_udp_port, 208, 16)  \
  F(roce_address_table_size, 240, 16)
MELON_PRM_STRUCT(roce_cap, 2048, MELON_PRM_ROCE_CAP)

#define MELON_PRM_QUERY_HCA_CAP_IN(F, S, A) \
  F(opcode, 0, 16)                          \
  F(op_mod, 48, 16)                         \
  F(other_function, 64, 1)                  \
  F(function_id, 80, 16)
MELON_PRM_STRUCT(query_hca_cap_in, 128, MELON_PRM_QUERY_HCA_CAP_IN)

#define MELON_PRM_QUERY_HCA_CAP_OUT(F, S, A) \
  F(status, 0, 8)                            \
  F(syndrome, 32, 32)                        \
  F(capability, 128, 32768)
MELON_PRM_STRUCT(query_hca_cap_out, 32896, MELON_PRM_QUERY_HCA_CAP_OUT)

#define MELON_PRM_SET_HCA_CAP_IN(F, S, A) \
  F(opcode, 0, 16)                        \
  F(op_mod, 48, 16)                       \
  F(other_function, 64, 1)                \
  F(function_id, 80, 16)                  \
  F(capability, 128, 32768)
MELON_PRM_STRUCT(set_hca_cap_in, 32896, MELON_PRM_SET_HCA_CAP_IN)

#define MELON_PRM_SET_HCA_CAP_OUT(F, S, A) \
  F(status, 0, 8)                          \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(set_hca_cap_out, 128, MELON_PRM_SET_HCA_CAP_OUT)

#define MELON_PRM_INIT_HCA_IN(F, S, A) \
  F(opcode, 0, 16)                     \
  F(op_mod, 48, 16)                    \
  F(sw_vhca_id, 98, 14)                \
  F(sw_owner_id, 128, 128)
MELON_PRM_STRUCT(init_hca_in, 256, MELON_PRM_INIT_HCA_IN)

#define MELON_PRM_INIT_HCA_OUT(F, S, A) \
  F(status, 0, 8)                       \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(init_hca_out, 128, MELON_PRM_INIT_HCA_OUT)

#define MELON_PRM_TEARDOWN_HCA_IN(F, S, A) \
  F(opcode, 0, 16)                         \
  F(op_mod, 48, 16)                        \
  F(profile, 80, 16)
MELON_PRM_STRUCT(teardown_hca_in, 128, MELON_PRM_TEARDOWN_HCA_IN)

#define MELON_PRM_TEARDOWN_HCA_OUT(F, S, A) \
  F(status, 0, 8)                           \
  F(syndrome, 32, 32)                       \
  F(state, 127, 1)
MELON_PRM_STRUCT(teardown_hca_out, 128, MELON_PRM_TEARDOWN_HCA_OUT)

#define MELON_PRM_NOP_IN(F, S, A) \
  F(opcode, 0, 16)                \
  F(op_mod, 48, 16)
MELON_PRM_STRUCT(nop_in, 128, MELON_PRM_NOP_IN)

#define MELON_PRM_NOP_OUT(F, S, A) \
  F(status, 0, 8)                  \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(nop_out, 128, MELON_PRM_NOP_OUT)

#define MELON_PRM_QUERY_ADAPTER_PARAM_BLOCK(F, S, A) \
  F(ieee_vendor_id, 200, 24)                         \
  F(vsd_vendor_id, 240, 16)                          \
  F(vsd, 256, 1664)                                  \
  F(vsd_contd_psid, 1920, 128)
MELON_PRM_STRUCT(query_adapter_param_block, 2048, MELON_PRM_QUERY_ADAPTER_PARAM_BLOCK)

#define MELON_PRM_QUERY_ADAPTER_IN(F, S, A) \
  F(opcode, 0, 16)                          \
  F(op_mod, 48, 16)
MELON_PRM_STRUCT(query_adapter_in, 128, MELON_PRM_QUERY_ADAPTER_IN)

#define MELON_PRM_QUERY_ADAPTER_OUT(F, S, A) \
  F(status, 0, 8)                            \
  F(syndrome, 32, 32)                        \
  S(query_adapter_struct, 128, query_adapter_param_block)
MELON_PRM_STRUCT(query_adapter_out, 2176, MELON_PRM_QUERY_ADAPTER_OUT)

// QUERY_HCA_CAP / SET_HCA_CAP op_mod = (capability type << 1) | current.
#define MELON_PRM_CAP_TYPE(V) \
  V(GENERAL_DEVICE, 0x0)      \
  V(ODP, 0x2)                 \
  V(ATOMIC, 0x3)              \
  V(ROCE, 0x4)
MELON_PRM_VALUES(cap_type, uint8_t, MELON_PRM_CAP_TYPE)
#define MELON_PRM_CAP_MODE(V) \
  V(GET_MAX, 0)               \
  V(GET_CUR, 1)
MELON_PRM_VALUES(cap_mode, uint8_t, MELON_PRM_CAP_MODE)
inline constexpr uint16_t cap_op_mod(uint8_t type, uint8_t mode) { return uint16_t((type << 1) | (mode & 1)); }

#define MELON_PRM_QUERY_PAGES_OP_MOD(V) \
  V(BOOT_PAGES, 1)                      \
  V(INIT_PAGES, 2)                      \
  V(REGULAR_PAGES, 3)
MELON_PRM_VALUES(query_pages_op_mod, uint16_t, MELON_PRM_QUERY_PAGES_OP_MOD)

#define MELON_PRM_MANAGE_PAGES_OP_MOD(V) \
  V(ALLOCATION_FAIL, 0)                  \
  V(ALLOCATION_SUCCESS, 1)               \
  V(HCA_RETURN_PAGES, 2)
MELON_PRM_VALUES(manage_pages_op_mod, uint16_t, MELON_PRM_MANAGE_PAGES_OP_MOD)

#define MELON_PRM_TEARDOWN_PROFILE(V) \
  V(GRACEFUL_CLOSE, 0)                \
  V(FORCE_CLOSE, 1)                   \
  V(PREPARE_FAST_TEARDOWN, 2)
MELON_PRM_VALUES(teardown_profile, uint16_t, MELON_PRM_TEARDOWN_PROFILE)

// cmd_hca_cap.port_type
inline constexpr uint8_t kPortTypeIb = 0, kPortTypeEth = 1;

}  // namespace melon::mlx5::prm
