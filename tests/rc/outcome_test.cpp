// The outcome table (rc/outcome.h) against independent sources: rdma-core's mlx5dv.h for the CQE
// error syndromes, <infiniband/verbs.h> for the completion statuses and events, IBA Table 44 for the
// NAK codes.
#include <gtest/gtest.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include "rc/outcome.h"

namespace {

using namespace melon::rc;
using melon::roce::NakCode;

TEST(OutcomeTable, RowsAreIndexedByTheirOutcome) {
  for (size_t i = 0; i < size_t(Outcome::count_); ++i) {
    EXPECT_EQ(size_t(kOutcomes[i].outcome), i) << kOutcomes[i].name;
    EXPECT_NE(kOutcomes[i].name, nullptr);
  }
}

TEST(OutcomeTable, Mlx5SyndromesAreRdmaCoresForEachCompletionStatus) {
  struct Expect {
    ibv_wc_status wc;
    uint8_t mlx5;
  };
  // rdma-core providers/mlx5/cq.c pairs each CQE syndrome with one ibv_wc_status.
  const Expect pairs[] = {
      {IBV_WC_LOC_LEN_ERR, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR},
      {IBV_WC_LOC_PROT_ERR, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR},
      {IBV_WC_WR_FLUSH_ERR, MLX5_CQE_SYNDROME_WR_FLUSH_ERR},
      {IBV_WC_BAD_RESP_ERR, MLX5_CQE_SYNDROME_BAD_RESP_ERR},
      {IBV_WC_REM_INV_REQ_ERR, MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR},
      {IBV_WC_REM_ACCESS_ERR, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR},
      {IBV_WC_REM_OP_ERR, MLX5_CQE_SYNDROME_REMOTE_OP_ERR},
      {IBV_WC_RETRY_EXC_ERR, MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR},
      {IBV_WC_RNR_RETRY_EXC_ERR, MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR},
  };
  for (const Expect& e : pairs) EXPECT_EQ(mlx5_cqe_syndrome(WcStatus(e.wc)), e.mlx5) << "ibv_wc_status " << int(e.wc);
  for (const OutcomeRow& r : kOutcomes) {
    if (r.requester_wc != WcStatus::success)
      EXPECT_EQ(r.mlx5_requester, mlx5_cqe_syndrome(r.requester_wc)) << r.name;
    else
      EXPECT_EQ(r.mlx5_requester, 0) << r.name;
    if (r.responder_wc != WcStatus::success)
      EXPECT_EQ(r.mlx5_responder, mlx5_cqe_syndrome(r.responder_wc)) << r.name;
    else
      EXPECT_EQ(r.mlx5_responder, 0) << r.name;
  }
}

TEST(OutcomeTable, ResponderAnswersAreIbaNakCodes) {
  EXPECT_EQ(outcome_row(Outcome::psn_sequence_error).reply, Reply::nak);
  EXPECT_EQ(outcome_row(Outcome::psn_sequence_error).nak, NakCode::psn_seq_error);
  EXPECT_EQ(outcome_row(Outcome::opcode_sequence_error).nak, NakCode::invalid_request);
  EXPECT_EQ(outcome_row(Outcome::length_error).nak, NakCode::invalid_request);
  EXPECT_EQ(outcome_row(Outcome::misaligned_atomic).nak, NakCode::invalid_request);
  EXPECT_EQ(outcome_row(Outcome::remote_access_error).nak, NakCode::remote_access_error);
  EXPECT_EQ(outcome_row(Outcome::recv_protection_error).nak, NakCode::remote_operational_error);
  EXPECT_EQ(outcome_row(Outcome::rnr).reply, Reply::rnr_nak);
  EXPECT_EQ(outcome_row(Outcome::duplicate).reply, Reply::ack);
  EXPECT_EQ(outcome_row(Outcome::qkey_violation).reply, Reply::none);
}

TEST(OutcomeTable, TheCompleterReadsEachNakCodeAsTheVerbsStatus) {
  EXPECT_EQ(outcome_for_nak(NakCode::invalid_request).requester_wc, WcStatus(IBV_WC_REM_INV_REQ_ERR));
  EXPECT_EQ(outcome_for_nak(NakCode::remote_access_error).requester_wc, WcStatus(IBV_WC_REM_ACCESS_ERR));
  EXPECT_EQ(outcome_for_nak(NakCode::remote_operational_error).requester_wc, WcStatus(IBV_WC_REM_OP_ERR));
  EXPECT_EQ(outcome_for_nak(NakCode::invalid_rd_request).requester_wc, WcStatus(IBV_WC_BAD_RESP_ERR))
      << "an RD NAK on an RC QP is a bad response";
}

TEST(OutcomeTable, ResponderErrorsRaiseTheAffiliatedEventsOfIba11_6_3) {
  EXPECT_EQ(outcome_row(Outcome::opcode_sequence_error).event, AsyncEvent(IBV_EVENT_QP_REQ_ERR));
  EXPECT_EQ(outcome_row(Outcome::remote_access_error).event, AsyncEvent(IBV_EVENT_QP_ACCESS_ERR));
  EXPECT_TRUE(outcome_row(Outcome::remote_access_error).responder_to_error);
  EXPECT_FALSE(outcome_row(Outcome::rnr).responder_to_error) << "RNR is not an error";
  EXPECT_FALSE(outcome_row(Outcome::psn_sequence_error).responder_to_error) << "class B: recoverable";
}

}  // namespace
