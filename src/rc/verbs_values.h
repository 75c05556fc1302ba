// Verbs enumerations the engine reports and accepts, with the exact numeric values of rdma-core's
// <infiniband/verbs.h> (ibv_wc_status, ibv_wc_opcode, ibv_wr_opcode, ...), so a provider passes them
// through unchanged. tests/verbs/verbs_values_oracle_test.cpp checks every one against the
// installed rdma-core verbs.h.
#pragma once
#include <stdint.h>

namespace melon::rc {

enum class WcStatus : uint8_t {
  success = 0,
  loc_len_err = 1,
  loc_qp_op_err = 2,
  loc_eec_op_err = 3,
  loc_prot_err = 4,
  wr_flush_err = 5,
  mw_bind_err = 6,
  bad_resp_err = 7,
  loc_access_err = 8,
  rem_inv_req_err = 9,
  rem_access_err = 10,
  rem_op_err = 11,
  retry_exc_err = 12,
  rnr_retry_exc_err = 13,
  loc_rdd_viol_err = 14,
  rem_inv_rd_req_err = 15,
  rem_abort_err = 16,
  inv_eecn_err = 17,
  inv_eec_state_err = 18,
  fatal_err = 19,
  resp_timeout_err = 20,
  general_err = 21,
};

enum class WcOpcode : uint8_t {
  send = 0,
  rdma_write = 1,
  rdma_read = 2,
  comp_swap = 3,
  fetch_add = 4,
  bind_mw = 5,
  local_inv = 6,
  recv = 128,
  recv_rdma_with_imm = 129,
};

enum class WrOpcode : uint8_t {
  rdma_write = 0,
  rdma_write_with_imm = 1,
  send = 2,
  send_with_imm = 3,
  rdma_read = 4,
  atomic_cmp_and_swp = 5,
  atomic_fetch_and_add = 6,
  local_inv = 7,
  bind_mw = 8,
  send_with_inv = 9,
};

enum SendFlag : uint32_t { kFence = 1, kSignaled = 2, kSolicited = 4, kInline = 8 };
enum WcFlag : uint32_t { kWcGrh = 1, kWcWithImm = 2, kWcWithInv = 8 };

enum Access : uint32_t {
  kLocalWrite = 1,
  kRemoteWrite = 2,
  kRemoteRead = 4,
  kRemoteAtomic = 8,
};

enum class QpType : uint8_t { rc = 2, uc = 3, ud = 4 };

enum class QpState : uint8_t { reset = 0, init = 1, rtr = 2, rts = 3, sqd = 4, sqe = 5, err = 6 };
const char* qp_state_name(QpState s);

// ibv_qp_attr_mask bits.
enum QpAttrMask : uint32_t {
  kAttrState = 1 << 0,
  kAttrCurState = 1 << 1,
  kAttrEnSqdAsyncNotify = 1 << 2,
  kAttrAccessFlags = 1 << 3,
  kAttrPkeyIndex = 1 << 4,
  kAttrPort = 1 << 5,
  kAttrQkey = 1 << 6,
  kAttrAv = 1 << 7,
  kAttrPathMtu = 1 << 8,
  kAttrTimeout = 1 << 9,
  kAttrRetryCnt = 1 << 10,
  kAttrRnrRetry = 1 << 11,
  kAttrRqPsn = 1 << 12,
  kAttrMaxQpRdAtomic = 1 << 13,
  kAttrAltPath = 1 << 14,
  kAttrMinRnrTimer = 1 << 15,
  kAttrSqPsn = 1 << 16,
  kAttrMaxDestRdAtomic = 1 << 17,
  kAttrPathMigState = 1 << 18,
  kAttrCap = 1 << 19,
  kAttrDestQpn = 1 << 20,
};

// ibv_event_type values the engine raises.
enum class AsyncEvent : uint8_t {
  cq_err = 0,
  qp_fatal = 1,
  qp_req_err = 2,
  qp_access_err = 3,
  comm_est = 4,
  sq_drained = 5,
  path_mig = 6,
  path_mig_err = 7,
  device_fatal = 8,
  port_active = 9,
  port_err = 10,
  lid_change = 11,
  pkey_change = 12,
  sm_change = 13,
  srq_err = 14,
  srq_limit_reached = 15,
  qp_last_wqe_reached = 16,
};

// ibv_mtu: 1 = 256 ... 5 = 4096.
constexpr uint32_t mtu_bytes(uint8_t ibv_mtu) { return ibv_mtu >= 1 && ibv_mtu <= 5 ? 128u << ibv_mtu : 0; }

}  // namespace melon::rc
