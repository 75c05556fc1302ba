// Queue pairs: address path, QP context, CREATE/DESTROY/QUERY_QP and every state transition.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_ADS(F, S, A) \
  F(fl, 0, 1)                  \
  F(free_ar, 1, 1)             \
  F(pkey_index, 16, 16)        \
  F(grh, 40, 1)                \
  F(mlid, 41, 7)               \
  F(rlid, 48, 16)              \
  F(ack_timeout, 64, 5)        \
  F(src_addr_index, 72, 8)     \
  F(stat_rate, 84, 4)          \
  F(hop_limit, 88, 8)          \
  F(tclass, 100, 8)            \
  F(flow_label, 108, 20)       \
  F(rgid_rip, 128, 128)        \
  F(f_dscp, 260, 1)            \
  F(f_ecn, 261, 1)             \
  F(f_eth_prio, 263, 1)        \
  F(ecn, 264, 2)               \
  F(dscp, 266, 6)              \
  F(udp_sport, 272, 16)        \
  F(dei_cfi, 288, 1)           \
  F(eth_prio, 289, 3)          \
  F(sl, 292, 4)                \
  F(vhca_port_num, 296, 8)     \
  F(rmac_47_32, 304, 16)       \
  F(rmac_31_0, 320, 32)
MELON_PRM_STRUCT(ads, 352, MELON_PRM_ADS)

#define MELON_PRM_QPC(F, S, A)            \
  F(state, 0, 4)                          \
  F(lag_tx_port_affinity, 4, 4)           \
  F(st, 8, 8)                             \
  F(isolate_vl_tc, 18, 1)                 \
  F(pm_state, 19, 2)                      \
  F(req_e2e_credit_mode, 22, 2)           \
  F(offload_type, 24, 4)                  \
  F(end_padding_mode, 28, 2)              \
  F(wq_signature, 32, 1)                  \
  F(block_lb_mc, 33, 1)                   \
  F(atomic_like_write_en, 34, 1)          \
  F(latency_sensitive, 35, 1)             \
  F(drain_sigerr, 37, 1)                  \
  F(pd, 40, 24)                           \
  F(mtu, 64, 3)                           \
  F(log_msg_max, 67, 5)                   \
  F(log_rq_size, 73, 4)                   \
  F(log_rq_stride, 77, 3)                 \
  F(no_sq, 80, 1)                         \
  F(log_sq_size, 81, 4)                   \
  F(ts_format, 88, 2)                     \
  F(rlky, 91, 1)                          \
  F(ulp_stateless_offload_mode, 92, 4)    \
  F(counter_set_id, 96, 8)                \
  F(uar_page, 104, 24)                    \
  F(user_index, 136, 24)                  \
  F(log_page_size, 163, 5)                \
  F(remote_qpn, 168, 24)                  \
  S(primary_address_path, 192, ads)       \
  S(secondary_address_path, 544, ads)     \
  F(log_ack_req_freq, 896, 4)             \
  F(log_sra_max, 904, 3)                  \
  F(retry_count, 909, 3)                  \
  F(rnr_retry, 912, 3)                    \
  F(fre, 916, 1)                          \
  F(cur_rnr_retry, 917, 3)                \
  F(cur_retry_count, 920, 3)              \
  F(next_send_psn, 968, 24)               \
  F(log_num_dci_stream_channels, 995, 5)  \
  F(cqn_snd, 1000, 24)                    \
  F(log_num_dci_errored_streams, 1027, 5) \
  F(deth_sqpn, 1032, 24)                  \
  F(last_acked_psn, 1096, 24)             \
  F(ssn, 1128, 24)                        \
  F(log_rra_max, 1160, 3)                 \
  F(atomic_mode, 1164, 4)                 \
  F(rre, 1168, 1)                         \
  F(rwe, 1169, 1)                         \
  F(rae, 1170, 1)                         \
  F(page_offset, 1172, 6)                 \
  F(cd_slave_receive, 1181, 1)            \
  F(cd_slave_send, 1182, 1)               \
  F(cd_master, 1183, 1)                   \
  F(min_rnr_nak, 1187, 5)                 \
  F(next_rcv_psn, 1192, 24)               \
  F(xrcd, 1224, 24)                       \
  F(cqn_rcv, 1256, 24)                    \
  F(dbr_addr, 1280, 64)                   \
  F(q_key, 1344, 32)                      \
  F(rq_type, 1381, 3)                     \
  F(srqn_rmpn_xrqn, 1384, 24)             \
  F(rmsn, 1416, 24)                       \
  F(hw_sq_wqebb_counter, 1440, 16)        \
  F(sw_sq_wqebb_counter, 1456, 16)        \
  F(hw_rq_counter, 1472, 32)              \
  F(sw_rq_counter, 1504, 32)              \
  F(cgs, 1583, 1)                         \
  F(cs_req, 1584, 8)                      \
  F(cs_res, 1592, 8)                      \
  F(dc_access_key, 1600, 64)              \
  F(dbr_umem_valid, 1667, 1)
MELON_PRM_STRUCT(qpc, 1856, MELON_PRM_QPC)

#define MELON_PRM_CREATE_QP_IN(F, S, A) \
  F(opcode, 0, 16)                      \
  F(uid, 16, 16)                        \
  F(op_mod, 48, 16)                     \
  F(input_qpn, 72, 24)                  \
  F(opt_param_mask, 128, 32)            \
  F(ece, 160, 32)                       \
  S(qpc, 192, qpc)                      \
  F(wq_umem_valid, 2144, 1)             \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(create_qp_in, 2176, MELON_PRM_CREATE_QP_IN)

#define MELON_PRM_CREATE_QP_OUT(F, S, A) \
  F(status, 0, 8)                        \
  F(syndrome, 32, 32)                    \
  F(qpn, 72, 24)                         \
  F(ece, 96, 32)
MELON_PRM_STRUCT(create_qp_out, 128, MELON_PRM_CREATE_QP_OUT)

#define MELON_PRM_DESTROY_QP_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(uid, 16, 16)                         \
  F(op_mod, 48, 16)                      \
  F(qpn, 72, 24)
MELON_PRM_STRUCT(destroy_qp_in, 128, MELON_PRM_DESTROY_QP_IN)

#define MELON_PRM_DESTROY_QP_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(destroy_qp_out, 128, MELON_PRM_DESTROY_QP_OUT)

#define MELON_PRM_QUERY_QP_IN(F, S, A) \
  F(opcode, 0, 16)                     \
  F(op_mod, 48, 16)                    \
  F(qpn, 72, 24)
MELON_PRM_STRUCT(query_qp_in, 128, MELON_PRM_QUERY_QP_IN)

#define MELON_PRM_QUERY_QP_OUT(F, S, A) \
  F(status, 0, 8)                       \
  F(syndrome, 32, 32)                   \
  F(opt_param_mask, 128, 32)            \
  F(ece, 160, 32)                       \
  S(qpc, 192, qpc)                      \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(query_qp_out, 2176, MELON_PRM_QUERY_QP_OUT)

// RST2INIT, INIT2INIT, INIT2RTR, RTR2RTS and RTS2RTS share one layout (PRM: modify QP commands
// with a QP context); each command is still its own named structure.
#define MELON_PRM_QP_TRANSITION_IN(F, S, A) \
  F(opcode, 0, 16)                          \
  F(uid, 16, 16)                            \
  F(op_mod, 48, 16)                         \
  F(qpn, 72, 24)                            \
  F(opt_param_mask, 128, 32)                \
  F(ece, 160, 32)                           \
  S(qpc, 192, qpc)

#define MELON_PRM_QP_TRANSITION_OUT(F, S, A) \
  F(status, 0, 8)                            \
  F(syndrome, 32, 32)                        \
  F(ece, 96, 32)

MELON_PRM_STRUCT(rst2init_qp_in, 2176, MELON_PRM_QP_TRANSITION_IN)
MELON_PRM_STRUCT(rst2init_qp_out, 128, MELON_PRM_QP_TRANSITION_OUT)
MELON_PRM_STRUCT(init2init_qp_in, 2176, MELON_PRM_QP_TRANSITION_IN)
MELON_PRM_STRUCT(init2init_qp_out, 128, MELON_PRM_QP_TRANSITION_OUT)
MELON_PRM_STRUCT(init2rtr_qp_in, 2176, MELON_PRM_QP_TRANSITION_IN)
MELON_PRM_STRUCT(init2rtr_qp_out, 128, MELON_PRM_QP_TRANSITION_OUT)
MELON_PRM_STRUCT(rtr2rts_qp_in, 2176, MELON_PRM_QP_TRANSITION_IN)
MELON_PRM_STRUCT(rtr2rts_qp_out, 128, MELON_PRM_QP_TRANSITION_OUT)
MELON_PRM_STRUCT(rts2rts_qp_in, 2176, MELON_PRM_QP_TRANSITION_IN)
MELON_PRM_STRUCT(rts2rts_qp_out, 128, MELON_PRM_QP_TRANSITION_OUT)

#define MELON_PRM_SQERR2RTS_QP_IN(F, S, A) \
  F(opcode, 0, 16)                         \
  F(uid, 16, 16)                           \
  F(op_mod, 48, 16)                        \
  F(qpn, 72, 24)                           \
  F(opt_param_mask, 128, 32)               \
  S(qpc, 192, qpc)
MELON_PRM_STRUCT(sqerr2rts_qp_in, 2176, MELON_PRM_SQERR2RTS_QP_IN)

#define MELON_PRM_SQERR2RTS_QP_OUT(F, S, A) \
  F(status, 0, 8)                           \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(sqerr2rts_qp_out, 128, MELON_PRM_SQERR2RTS_QP_OUT)
// SQD_RTS_QP has the SQERR2RTS shape. mlx5_ifc.h has no RTS->SQD command (see qp_modify.h).
MELON_PRM_STRUCT(sqd2rts_qp_in, 2176, MELON_PRM_SQERR2RTS_QP_IN)
MELON_PRM_STRUCT(sqd2rts_qp_out, 128, MELON_PRM_SQERR2RTS_QP_OUT)

#define MELON_PRM_QP_2ERR_IN(F, S, A) \
  F(opcode, 0, 16)                    \
  F(uid, 16, 16)                      \
  F(op_mod, 48, 16)                   \
  F(qpn, 72, 24)
MELON_PRM_STRUCT(qp_2err_in, 128, MELON_PRM_QP_2ERR_IN)

#define MELON_PRM_QP_2ERR_OUT(F, S, A) \
  F(status, 0, 8)                      \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(qp_2err_out, 128, MELON_PRM_QP_2ERR_OUT)

MELON_PRM_STRUCT(qp_2rst_in, 128, MELON_PRM_QP_2ERR_IN)

MELON_PRM_STRUCT(qp_2rst_out, 128, MELON_PRM_QP_2ERR_OUT)

#define MELON_PRM_QP_STATE(V) \
  V(RST, 0)                   \
  V(INIT, 1)                  \
  V(RTR, 2)                   \
  V(RTS, 3)                   \
  V(SQER, 4)                  \
  V(ERR, 6)                   \
  V(SQD, 7)                   \
  V(SUSPENDED, 9)
MELON_PRM_VALUES(qpc_state, uint8_t, MELON_PRM_QP_STATE)

#define MELON_PRM_QP_ST(V) \
  V(RC, 0x0)               \
  V(UC, 0x1)               \
  V(UD, 0x2)               \
  V(XRC, 0x3)              \
  V(DCI, 0x5)              \
  V(QP0, 0x7)              \
  V(QP1, 0x8)              \
  V(RAW_DATAGRAM, 0x9)     \
  V(REG_UMR, 0xc)
MELON_PRM_VALUES(qpc_st, uint8_t, MELON_PRM_QP_ST)
// QP1 (the GSI) is a UD QP to everything but its number and its Q_Key (IBA 13.4.6).
inline constexpr bool qpc_st_datagram(uint8_t st) { return st == qpc_st::UD || st == qpc_st::QP1; }
inline constexpr uint32_t kGsiQkey = 0x80010000;  // the GSI's well-known Q_Key (IBA 13.4.6.1)

#define MELON_PRM_QP_PM_STATE(V) \
  V(ARMED, 0)                    \
  V(REARM, 1)                    \
  V(MIGRATED, 3)
MELON_PRM_VALUES(qpc_pm_state, uint8_t, MELON_PRM_QP_PM_STATE)

// qpc.mtu: IB MTU enumeration (also what verbs calls enum ibv_mtu).
#define MELON_PRM_QP_MTU(V) \
  V(MTU_256_BYTES, 1)       \
  V(MTU_512_BYTES, 2)       \
  V(MTU_1K_BYTES, 3)        \
  V(MTU_2K_BYTES, 4)        \
  V(MTU_4K_BYTES, 5)
MELON_PRM_VALUES(qpc_mtu, uint8_t, MELON_PRM_QP_MTU)

#define MELON_PRM_QP_ATOMIC_MODE(V) \
  V(IB_SPEC, 1)                     \
  V(ONLY_8B, 2)                     \
  V(UP_TO_8B, 3)                    \
  V(UP_TO_16B, 4)
MELON_PRM_VALUES(qpc_atomic_mode, uint8_t, MELON_PRM_QP_ATOMIC_MODE)

// qpc.cs_res: responder scatter to CQE, how much of a small SEND the CQE carries (Linux
// include/linux/mlx5/qp.h MLX5_RES_SCAT_DATA*_CQE; 64 bytes needs 128-byte CQEs).
#define MELON_PRM_QP_CS_RES(V) \
  V(DISABLED, 0)               \
  V(SCAT_DATA32_CQE, 1)        \
  V(SCAT_DATA64_CQE, 2)
MELON_PRM_VALUES(qpc_cs_res, uint8_t, MELON_PRM_QP_CS_RES)

}  // namespace melon::mlx5::prm
