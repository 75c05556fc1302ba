// Small resource commands: UAR, PD, transport domain, queue counters.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_ALLOC_UAR_IN(F, S, A) \
  F(opcode, 0, 16)                      \
  F(uid, 16, 16)                        \
  F(op_mod, 48, 16)
MELON_PRM_STRUCT(alloc_uar_in, 128, MELON_PRM_ALLOC_UAR_IN)

#define MELON_PRM_ALLOC_UAR_OUT(F, S, A) \
  F(status, 0, 8)                        \
  F(syndrome, 32, 32)                    \
  F(uar, 72, 24)
MELON_PRM_STRUCT(alloc_uar_out, 128, MELON_PRM_ALLOC_UAR_OUT)

#define MELON_PRM_DEALLOC_UAR_IN(F, S, A) \
  F(opcode, 0, 16)                        \
  F(uid, 16, 16)                          \
  F(op_mod, 48, 16)                       \
  F(uar, 72, 24)
MELON_PRM_STRUCT(dealloc_uar_in, 128, MELON_PRM_DEALLOC_UAR_IN)

#define MELON_PRM_DEALLOC_UAR_OUT(F, S, A) \
  F(status, 0, 8)                          \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(dealloc_uar_out, 128, MELON_PRM_DEALLOC_UAR_OUT)

#define MELON_PRM_ALLOC_PD_IN(F, S, A) \
  F(opcode, 0, 16)                     \
  F(uid, 16, 16)                       \
  F(op_mod, 48, 16)
MELON_PRM_STRUCT(alloc_pd_in, 128, MELON_PRM_ALLOC_PD_IN)

#define MELON_PRM_ALLOC_PD_OUT(F, S, A) \
  F(status, 0, 8)                       \
  F(syndrome, 32, 32)                   \
  F(pd, 72, 24)
MELON_PRM_STRUCT(alloc_pd_out, 128, MELON_PRM_ALLOC_PD_OUT)

#define MELON_PRM_DEALLOC_PD_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(uid, 16, 16)                         \
  F(op_mod, 48, 16)                      \
  F(pd, 72, 24)
MELON_PRM_STRUCT(dealloc_pd_in, 128, MELON_PRM_DEALLOC_PD_IN)

#define MELON_PRM_DEALLOC_PD_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(dealloc_pd_out, 128, MELON_PRM_DEALLOC_PD_OUT)

#define MELON_PRM_ALLOC_TRANSPORT_DOMAIN_IN(F, S, A) \
  F(opcode, 0, 16)                                   \
  F(uid, 16, 16)                                     \
  F(op_mod, 48, 16)
MELON_PRM_STRUCT(alloc_transport_domain_in, 128, MELON_PRM_ALLOC_TRANSPORT_DOMAIN_IN)

#define MELON_PRM_ALLOC_TRANSPORT_DOMAIN_OUT(F, S, A) \
  F(status, 0, 8)                                     \
  F(syndrome, 32, 32)                                 \
  F(transport_domain, 72, 24)
MELON_PRM_STRUCT(alloc_transport_domain_out, 128, MELON_PRM_ALLOC_TRANSPORT_DOMAIN_OUT)

#define MELON_PRM_DEALLOC_TRANSPORT_DOMAIN_IN(F, S, A) \
  F(opcode, 0, 16)                                     \
  F(uid, 16, 16)                                       \
  F(op_mod, 48, 16)                                    \
  F(transport_domain, 72, 24)
MELON_PRM_STRUCT(dealloc_transport_domain_in, 128, MELON_PRM_DEALLOC_TRANSPORT_DOMAIN_IN)

#define MELON_PRM_DEALLOC_TRANSPORT_DOMAIN_OUT(F, S, A) \
  F(status, 0, 8)                                       \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(dealloc_transport_domain_out, 128, MELON_PRM_DEALLOC_TRANSPORT_DOMAIN_OUT)

#define MELON_PRM_ALLOC_Q_COUNTER_IN(F, S, A) \
  F(opcode, 0, 16)                            \
  F(uid, 16, 16)                              \
  F(op_mod, 48, 16)
MELON_PRM_STRUCT(alloc_q_counter_in, 128, MELON_PRM_ALLOC_Q_COUNTER_IN)

#define MELON_PRM_ALLOC_Q_COUNTER_OUT(F, S, A) \
  F(status, 0, 8)                              \
  F(syndrome, 32, 32)                          \
  F(counter_set_id, 88, 8)
MELON_PRM_STRUCT(alloc_q_counter_out, 128, MELON_PRM_ALLOC_Q_COUNTER_OUT)

#define MELON_PRM_DEALLOC_Q_COUNTER_IN(F, S, A) \
  F(opcode, 0, 16)                              \
  F(op_mod, 48, 16)                             \
  F(counter_set_id, 88, 8)
MELON_PRM_STRUCT(dealloc_q_counter_in, 128, MELON_PRM_DEALLOC_Q_COUNTER_IN)

#define MELON_PRM_DEALLOC_Q_COUNTER_OUT(F, S, A) \
  F(status, 0, 8)                                \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(dealloc_q_counter_out, 128, MELON_PRM_DEALLOC_Q_COUNTER_OUT)

#define MELON_PRM_QUERY_Q_COUNTER_IN(F, S, A) \
  F(opcode, 0, 16)                            \
  F(op_mod, 48, 16)                           \
  F(clear, 192, 1)                            \
  F(counter_set_id, 248, 8)
MELON_PRM_STRUCT(query_q_counter_in, 256, MELON_PRM_QUERY_Q_COUNTER_IN)

#define MELON_PRM_QUERY_Q_COUNTER_OUT(F, S, A) \
  F(status, 0, 8)                              \
  F(syndrome, 32, 32)                          \
  F(rx_write_requests, 128, 32)                \
  F(rx_read_requests, 192, 32)                 \
  F(rx_atomic_requests, 256, 32)               \
  F(rx_dct_connect, 320, 32)                   \
  F(out_of_buffer, 384, 32)                    \
  F(out_of_sequence, 448, 32)                  \
  F(duplicate_request, 512, 32)                \
  F(rnr_nak_retry_err, 576, 32)                \
  F(packet_seq_err, 640, 32)                   \
  F(implied_nak_seq_err, 704, 32)              \
  F(local_ack_timeout_err, 768, 32)            \
  F(resp_local_length_error, 960, 32)          \
  F(req_local_length_error, 992, 32)           \
  F(resp_local_qp_error, 1024, 32)             \
  F(local_operation_error, 1056, 32)           \
  F(resp_local_protection, 1088, 32)           \
  F(req_local_protection, 1120, 32)            \
  F(resp_cqe_error, 1152, 32)                  \
  F(req_cqe_error, 1184, 32)                   \
  F(req_mw_binding, 1216, 32)                  \
  F(req_bad_response, 1248, 32)                \
  F(req_remote_invalid_request, 1280, 32)      \
  F(resp_remote_invalid_request, 1312, 32)     \
  F(req_remote_access_errors, 1344, 32)        \
  F(resp_remote_access_errors, 1376, 32)       \
  F(req_remote_operation_errors, 1408, 32)     \
  F(req_transport_retries_exceeded, 1440, 32)  \
  F(cq_overflow, 1472, 32)                     \
  F(resp_cqe_flush_error, 1504, 32)            \
  F(req_cqe_flush_error, 1536, 32)             \
  F(roce_adp_retrans, 1600, 32)                \
  F(roce_adp_retrans_to, 1632, 32)             \
  F(roce_slow_restart, 1664, 32)               \
  F(roce_slow_restart_cnps, 1696, 32)          \
  F(roce_slow_restart_trans, 1728, 32)
MELON_PRM_STRUCT(query_q_counter_out, 2048, MELON_PRM_QUERY_Q_COUNTER_OUT)

}  // namespace melon::mlx5::prm
