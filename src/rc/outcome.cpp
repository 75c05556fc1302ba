#include "rc/outcome.h"

namespace melon::rc {

using roce::NakCode;

namespace {
constexpr WcStatus kOk = WcStatus::success;
constexpr AsyncEvent kNoEvent = AsyncEvent::cq_err;  // unused where responder_event is false
// mlx5 CQE error syndromes (PRM; rdma-core mlx5dv.h).
constexpr uint8_t kLocLen = 0x01, kLocProt = 0x04, kFlush = 0x05, kBadResp = 0x10, kRemInvReq = 0x12, kRemAccess = 0x13,
                  kRemOp = 0x14, kRetry = 0x15, kRnrRetry = 0x16;
}  // namespace

// clang-format off
const OutcomeRow kOutcomes[size_t(Outcome::count_)] = {
  // outcome, name, IBA rule,
  //   reply, NAK code, requester WC, responder WC, event?, event, responder to ERR, mlx5 req, mlx5 resp
  {Outcome::ok, "ok", "",
    Reply::ack, NakCode::psn_seq_error, kOk, kOk, false, kNoEvent, false, 0, 0},
  {Outcome::duplicate, "duplicate", "C9-105: duplicates are answered again, not executed",
    Reply::ack, NakCode::psn_seq_error, kOk, kOk, false, kNoEvent, false, 0, 0},
  {Outcome::psn_sequence_error, "PSN sequence error", "9.7.5.1.1, C9-100: NAK once, then silence",
    Reply::nak, NakCode::psn_seq_error, WcStatus::retry_exc_err, kOk, false, kNoEvent, false, kRetry, 0},
  {Outcome::opcode_sequence_error, "opcode sequence error", "9.7.5.1.3, C9-92",
    Reply::nak, NakCode::invalid_request, WcStatus::rem_inv_req_err, WcStatus::wr_flush_err, true,
    AsyncEvent::qp_req_err, true, kRemInvReq, kFlush},
  {Outcome::length_error, "length error", "9.7.5.1.4, C9-87: payload and RETH length",
    Reply::nak, NakCode::invalid_request, WcStatus::rem_inv_req_err, WcStatus::wr_flush_err, true,
    AsyncEvent::qp_req_err, true, kRemInvReq, kFlush},
  {Outcome::remote_access_error, "remote access error", "9.7.5.1.5, C9-88: R_Key, PD, range, access",
    Reply::nak, NakCode::remote_access_error, WcStatus::rem_access_err, kOk, true, AsyncEvent::qp_access_err, true,
    kRemAccess, 0},
  {Outcome::misaligned_atomic, "misaligned atomic", "9.4.5, C9-37: atomics are 8-byte aligned",
    Reply::nak, NakCode::invalid_request, WcStatus::rem_inv_req_err, kOk, true, AsyncEvent::qp_req_err, true,
    kRemInvReq, 0},
  {Outcome::no_rd_atomic_resources, "no READ/atomic resources", "9.7.5.1.6: max_dest_rd_atomic is 0",
    Reply::nak, NakCode::invalid_request, WcStatus::rem_inv_req_err, kOk, true, AsyncEvent::qp_req_err, true,
    kRemInvReq, 0},
  {Outcome::message_too_long, "message too long", "9.7.5.1.4, C9-87: a message is at most 2^31 bytes",
    Reply::nak, NakCode::invalid_request, WcStatus::rem_inv_req_err, kOk, true, AsyncEvent::qp_req_err, true,
    kRemInvReq, 0},
  {Outcome::too_many_rd_atomic, "too many READ/atomic", "9.7.5.1.6, C9-98, o9-22: more than max_dest_rd_atomic",
    Reply::nak, NakCode::invalid_request, WcStatus::rem_inv_req_err, kOk, true, AsyncEvent::qp_req_err, true,
    kRemInvReq, 0},
  {Outcome::rnr, "receiver not ready", "9.7.5.1.6, C9-108: no receive WQE",
    Reply::rnr_nak, NakCode::psn_seq_error, WcStatus::rnr_retry_exc_err, kOk, false, kNoEvent, false, kRnrRetry, 0},
  {Outcome::recv_length_error, "receive length error", "9.7.5.1.4: message longer than the receive WQE",
    Reply::nak, NakCode::invalid_request, WcStatus::rem_inv_req_err, WcStatus::loc_len_err, false, kNoEvent, true,
    kRemInvReq, kLocLen},
  {Outcome::recv_protection_error, "receive protection error", "10.6.3: receive buffer not writable",
    Reply::nak, NakCode::remote_operational_error, WcStatus::rem_op_err, WcStatus::loc_prot_err, false, kNoEvent,
    true, kRemOp, kLocProt},
  {Outcome::qkey_violation, "Q_Key violation", "10.2.5, C10-15: UD datagram dropped",
    Reply::none, NakCode::psn_seq_error, kOk, kOk, false, kNoEvent, false, 0, 0},
  {Outcome::retry_exceeded, "retry exceeded", "9.7.6.1.3: retry_cnt spent",
    Reply::none, NakCode::psn_seq_error, WcStatus::retry_exc_err, kOk, false, kNoEvent, false, kRetry, 0},
  {Outcome::rnr_retry_exceeded, "RNR retry exceeded", "9.7.5.2.8: rnr_retry spent",
    Reply::none, NakCode::psn_seq_error, WcStatus::rnr_retry_exc_err, kOk, false, kNoEvent, false, kRnrRetry, 0},
  {Outcome::bad_response, "bad response", "9.7.5.2: unexpected response opcode or length",
    Reply::none, NakCode::psn_seq_error, WcStatus::bad_resp_err, kOk, false, kNoEvent, false, kBadResp, 0},
  {Outcome::local_protection_error, "local protection error", "10.6.3: send buffer lkey",
    Reply::none, NakCode::psn_seq_error, WcStatus::loc_prot_err, kOk, false, kNoEvent, false, kLocProt, 0},
  {Outcome::flushed, "flushed", "10.3.1: WQEs of a QP in ERR or SQE",
    Reply::none, NakCode::psn_seq_error, WcStatus::wr_flush_err, WcStatus::wr_flush_err, false, kNoEvent, false,
    kFlush, kFlush},
  {Outcome::cq_overflow, "CQ overflow", "11.4.2.1: completion queue full",
    Reply::none, NakCode::psn_seq_error, kOk, kOk, true, AsyncEvent::cq_err, true, 0, 0},
};
// clang-format on

const OutcomeRow& outcome_for_nak(NakCode code) {
  for (const OutcomeRow& r : kOutcomes)
    if (r.reply == Reply::nak && r.nak == code) return r;
  return outcome_row(Outcome::bad_response);  // a NAK code no responder sends (invalid RD request, reserved)
}

uint8_t mlx5_cqe_syndrome(WcStatus s) {
  if (s == WcStatus::success) return 0;
  for (const OutcomeRow& r : kOutcomes) {
    if (r.requester_wc == s && r.mlx5_requester) return r.mlx5_requester;
    if (r.responder_wc == s && r.mlx5_responder) return r.mlx5_responder;
  }
  return 0;
}

}  // namespace melon::rc
