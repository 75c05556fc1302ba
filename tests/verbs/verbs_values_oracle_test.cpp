// The engine's verbs enumerations (src/rc/verbs_values.h) against the INSTALLED rdma-core
// <infiniband/verbs.h> (this program is built without our include directory): the soft provider
// passes these values through to applications unchanged, so every one must be rdma-core's.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include "rc/verbs_values.h"

namespace {

using namespace melon::rc;

struct Pair {
  const char* name;
  long ours, stock;
};
#define P(ours, stock) \
  Pair { #stock, long(ours), long(stock) }

void expect_all(const std::vector<Pair>& pairs) {
  for (const Pair& p : pairs) EXPECT_EQ(p.ours, p.stock) << p.name;
}

TEST(VerbsValues, WorkCompletionStatusesAreRdmaCores) {
  expect_all({P(WcStatus::success, IBV_WC_SUCCESS),
              P(WcStatus::loc_len_err, IBV_WC_LOC_LEN_ERR),
              P(WcStatus::loc_qp_op_err, IBV_WC_LOC_QP_OP_ERR),
              P(WcStatus::loc_eec_op_err, IBV_WC_LOC_EEC_OP_ERR),
              P(WcStatus::loc_prot_err, IBV_WC_LOC_PROT_ERR),
              P(WcStatus::wr_flush_err, IBV_WC_WR_FLUSH_ERR),
              P(WcStatus::mw_bind_err, IBV_WC_MW_BIND_ERR),
              P(WcStatus::bad_resp_err, IBV_WC_BAD_RESP_ERR),
              P(WcStatus::loc_access_err, IBV_WC_LOC_ACCESS_ERR),
              P(WcStatus::rem_inv_req_err, IBV_WC_REM_INV_REQ_ERR),
              P(WcStatus::rem_access_err, IBV_WC_REM_ACCESS_ERR),
              P(WcStatus::rem_op_err, IBV_WC_REM_OP_ERR),
              P(WcStatus::retry_exc_err, IBV_WC_RETRY_EXC_ERR),
              P(WcStatus::rnr_retry_exc_err, IBV_WC_RNR_RETRY_EXC_ERR),
              P(WcStatus::loc_rdd_viol_err, IBV_WC_LOC_RDD_VIOL_ERR),
              P(WcStatus::rem_inv_rd_req_err, IBV_WC_REM_INV_RD_REQ_ERR),
              P(WcStatus::rem_abort_err, IBV_WC_REM_ABORT_ERR),
              P(WcStatus::inv_eecn_err, IBV_WC_INV_EECN_ERR),
              P(WcStatus::inv_eec_state_err, IBV_WC_INV_EEC_STATE_ERR),
              P(WcStatus::fatal_err, IBV_WC_FATAL_ERR),
              P(WcStatus::resp_timeout_err, IBV_WC_RESP_TIMEOUT_ERR),
              P(WcStatus::general_err, IBV_WC_GENERAL_ERR)});
}

TEST(VerbsValues, OpcodesAreRdmaCores) {
  expect_all({P(WcOpcode::send, IBV_WC_SEND), P(WcOpcode::rdma_write, IBV_WC_RDMA_WRITE),
              P(WcOpcode::rdma_read, IBV_WC_RDMA_READ), P(WcOpcode::comp_swap, IBV_WC_COMP_SWAP),
              P(WcOpcode::fetch_add, IBV_WC_FETCH_ADD), P(WcOpcode::bind_mw, IBV_WC_BIND_MW),
              P(WcOpcode::local_inv, IBV_WC_LOCAL_INV), P(WcOpcode::recv, IBV_WC_RECV),
              P(WcOpcode::recv_rdma_with_imm, IBV_WC_RECV_RDMA_WITH_IMM)});
  expect_all({P(WrOpcode::rdma_write, IBV_WR_RDMA_WRITE), P(WrOpcode::rdma_write_with_imm, IBV_WR_RDMA_WRITE_WITH_IMM),
              P(WrOpcode::send, IBV_WR_SEND), P(WrOpcode::send_with_imm, IBV_WR_SEND_WITH_IMM),
              P(WrOpcode::rdma_read, IBV_WR_RDMA_READ), P(WrOpcode::atomic_cmp_and_swp, IBV_WR_ATOMIC_CMP_AND_SWP),
              P(WrOpcode::atomic_fetch_and_add, IBV_WR_ATOMIC_FETCH_AND_ADD), P(WrOpcode::local_inv, IBV_WR_LOCAL_INV),
              P(WrOpcode::bind_mw, IBV_WR_BIND_MW), P(WrOpcode::send_with_inv, IBV_WR_SEND_WITH_INV)});
}

TEST(VerbsValues, FlagsAccessTypesAndStatesAreRdmaCores) {
  expect_all({P(kFence, IBV_SEND_FENCE),
              P(kSignaled, IBV_SEND_SIGNALED),
              P(kSolicited, IBV_SEND_SOLICITED),
              P(kInline, IBV_SEND_INLINE),
              P(kWcGrh, IBV_WC_GRH),
              P(kWcWithImm, IBV_WC_WITH_IMM),
              P(kWcWithInv, IBV_WC_WITH_INV),
              P(kLocalWrite, IBV_ACCESS_LOCAL_WRITE),
              P(kRemoteWrite, IBV_ACCESS_REMOTE_WRITE),
              P(kRemoteRead, IBV_ACCESS_REMOTE_READ),
              P(kRemoteAtomic, IBV_ACCESS_REMOTE_ATOMIC),
              P(QpType::rc, IBV_QPT_RC),
              P(QpType::uc, IBV_QPT_UC),
              P(QpType::ud, IBV_QPT_UD),
              P(QpState::reset, IBV_QPS_RESET),
              P(QpState::init, IBV_QPS_INIT),
              P(QpState::rtr, IBV_QPS_RTR),
              P(QpState::rts, IBV_QPS_RTS),
              P(QpState::sqd, IBV_QPS_SQD),
              P(QpState::sqe, IBV_QPS_SQE),
              P(QpState::err, IBV_QPS_ERR)});
}

TEST(VerbsValues, QpAttrMaskBitsAreRdmaCores) {
  expect_all({P(kAttrState, IBV_QP_STATE),
              P(kAttrCurState, IBV_QP_CUR_STATE),
              P(kAttrEnSqdAsyncNotify, IBV_QP_EN_SQD_ASYNC_NOTIFY),
              P(kAttrAccessFlags, IBV_QP_ACCESS_FLAGS),
              P(kAttrPkeyIndex, IBV_QP_PKEY_INDEX),
              P(kAttrPort, IBV_QP_PORT),
              P(kAttrQkey, IBV_QP_QKEY),
              P(kAttrAv, IBV_QP_AV),
              P(kAttrPathMtu, IBV_QP_PATH_MTU),
              P(kAttrTimeout, IBV_QP_TIMEOUT),
              P(kAttrRetryCnt, IBV_QP_RETRY_CNT),
              P(kAttrRnrRetry, IBV_QP_RNR_RETRY),
              P(kAttrRqPsn, IBV_QP_RQ_PSN),
              P(kAttrMaxQpRdAtomic, IBV_QP_MAX_QP_RD_ATOMIC),
              P(kAttrAltPath, IBV_QP_ALT_PATH),
              P(kAttrMinRnrTimer, IBV_QP_MIN_RNR_TIMER),
              P(kAttrSqPsn, IBV_QP_SQ_PSN),
              P(kAttrMaxDestRdAtomic, IBV_QP_MAX_DEST_RD_ATOMIC),
              P(kAttrPathMigState, IBV_QP_PATH_MIG_STATE),
              P(kAttrCap, IBV_QP_CAP),
              P(kAttrDestQpn, IBV_QP_DEST_QPN)});
}

TEST(VerbsValues, AsyncEventsAndMtusAreRdmaCores) {
  expect_all({P(AsyncEvent::cq_err, IBV_EVENT_CQ_ERR), P(AsyncEvent::qp_fatal, IBV_EVENT_QP_FATAL),
              P(AsyncEvent::qp_req_err, IBV_EVENT_QP_REQ_ERR), P(AsyncEvent::qp_access_err, IBV_EVENT_QP_ACCESS_ERR),
              P(AsyncEvent::comm_est, IBV_EVENT_COMM_EST), P(AsyncEvent::sq_drained, IBV_EVENT_SQ_DRAINED),
              P(AsyncEvent::path_mig, IBV_EVENT_PATH_MIG), P(AsyncEvent::path_mig_err, IBV_EVENT_PATH_MIG_ERR),
              P(AsyncEvent::device_fatal, IBV_EVENT_DEVICE_FATAL), P(AsyncEvent::port_active, IBV_EVENT_PORT_ACTIVE),
              P(AsyncEvent::port_err, IBV_EVENT_PORT_ERR), P(AsyncEvent::lid_change, IBV_EVENT_LID_CHANGE),
              P(AsyncEvent::pkey_change, IBV_EVENT_PKEY_CHANGE), P(AsyncEvent::sm_change, IBV_EVENT_SM_CHANGE),
              P(AsyncEvent::srq_err, IBV_EVENT_SRQ_ERR), P(AsyncEvent::srq_limit_reached, IBV_EVENT_SRQ_LIMIT_REACHED),
              P(AsyncEvent::qp_last_wqe_reached, IBV_EVENT_QP_LAST_WQE_REACHED)});
  EXPECT_EQ(mtu_bytes(IBV_MTU_256), 256u);
  EXPECT_EQ(mtu_bytes(IBV_MTU_4096), 4096u);
  EXPECT_EQ(mtu_bytes(0), 0u);
}

}  // namespace
