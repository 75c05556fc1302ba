// Every way a transport check can end, and the one table (kOutcomes) that says what each means: the
// RC responder's answer (ACK, RNR NAK, NAK code), the completion status of the requester's WQE and
// of a receive WQE the responder had taken, the responder's affiliated asynchronous event, whether
// the responder QP goes to ERR, and the mlx5 CQE error syndromes of those completions. The
// responder's checks return these, the completer maps a NAK it receives back through the same
// rows, and the emulated ConnectX reads its CQE syndromes from here.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "rc/verbs_values.h"
#include "roce/aeth.h"

namespace melon::rc {

enum class Outcome : uint8_t {
  ok = 0,
  // Responder checks, in the order the responder chains them (responder.cpp).
  duplicate,  // PSN before the expected one: answered again, nothing executed
  psn_sequence_error,  // PSN after the expected one: a packet was lost
  opcode_sequence_error,  // MIDDLE/LAST outside a message of its kind, or FIRST/ONLY inside one
  length_error,  // payload not one MTU in FIRST/MIDDLE, over one in LAST/ONLY, or not the RETH's length
  remote_access_error,  // QP access flags, R_Key, PD, range or region access rights
  misaligned_atomic,  // atomic address not 8-byte aligned
  no_rd_atomic_resources,  // READ/atomic to a QP with max_dest_rd_atomic 0
  message_too_long,  // a RETH DMA length above IBA's 2^31 bytes
  too_many_rd_atomic,  // a READ/atomic beyond max_dest_rd_atomic still being answered
  rnr,  // SEND with no receive WQE posted
  recv_length_error,  // SEND longer than the receive WQE
  recv_protection_error,  // the receive WQE's buffer is not (or no longer) writable
  qkey_violation,  // UD: Q_Key differs from the QP's
  // Requester and completer.
  retry_exceeded,  // retry_cnt timeouts or sequence NAKs without progress
  rnr_retry_exceeded,
  bad_response,  // a response whose opcode, PSN or length does not fit the request
  local_protection_error,  // a send WQE's lkey does not grant the access it needs
  flushed,  // completed because the QP is in ERR (or SQE)
  cq_overflow,
  count_
};

enum class Reply : uint8_t { none, ack, rnr_nak, nak };  // what an RC responder sends back

struct OutcomeRow {
  Outcome outcome;
  const char* name;
  const char* iba;  // the rule
  Reply reply;
  roce::NakCode nak;  // with Reply::nak
  WcStatus requester_wc;  // the requester's WQE completes with this (success: it does not fail)
  WcStatus responder_wc;  // a receive WQE the responder had taken completes with this (success: none)
  bool responder_event;  // the responder raises `event` on its QP
  AsyncEvent event;
  bool responder_to_error;  // the RC responder QP goes to ERR
  // mlx5 CQE error syndromes of requester_wc and responder_wc (PRM "CQE error syndrome"; rdma-core
  // mlx5dv.h MLX5_CQE_SYNDROME_*); 0: no error CQE. tests/rc/outcome_test checks them against it.
  uint8_t mlx5_requester;
  uint8_t mlx5_responder;
};

extern const OutcomeRow kOutcomes[size_t(Outcome::count_)];

inline const OutcomeRow& outcome_row(Outcome o) { return kOutcomes[size_t(o)]; }
// The first outcome whose responder answers with this NAK code: how the completer reads a NAK.
const OutcomeRow& outcome_for_nak(roce::NakCode code);
// The mlx5 CQE error syndrome of a completion status (0 for success or a status mlx5 has none for).
uint8_t mlx5_cqe_syndrome(WcStatus s);

}  // namespace melon::rc
