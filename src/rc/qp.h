// Internal QP state, one struct per role (IBA ch. 9): the requester's and the completer's progress
// over the send queue, and the responder's receive side with its replay cache.
#pragma once
#include <stdint.h>

#include <vector>

#include "rc/engine.h"
#include "rc/recv_queue.h"

namespace melon::rc {

struct SendWqe {
  SendWr wr;
  // Local memory, checked at post time; inline data is one segment pointing into `inline_buf`.
  Seg seg[kMaxSge];
  int nseg = 0;
  bool inline_data = false;
  uint32_t length = 0;
  bool bad_lkey = false;
  // Requester progress.
  bool started = false;  // PSNs assigned
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;  // first_psn + packets - 1 (READ: responses)
  uint32_t npkts = 0;
  bool done = false;  // acknowledged / response complete
  uint32_t read_next_psn = 0;  // READ: next response PSN expected
  // READ: asked for by requests of at most read_chunk response packets each (chunk k covers
  // responses k*read_chunk.. of the WQE), so that no more responses are in flight than the window.
  uint32_t read_chunk = 0;
  uint32_t read_issued = 0;  // responses covered by the requests issued so far (never decreases)
  uint64_t atomic_result = 0;

  bool is_read_or_atomic() const {
    return wr.opcode == WrOpcode::rdma_read || wr.opcode == WrOpcode::atomic_cmp_and_swp ||
           wr.opcode == WrOpcode::atomic_fetch_and_add;
  }
};

// A READ or atomic the responder served, kept to answer a duplicate (C9-105 and o9-38).
struct Resource {
  bool valid = false;
  bool atomic = false;
  uint32_t first_psn = 0, last_psn = 0;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t len = 0;
  uint64_t orig = 0;  // atomic: value before the operation
  // Its responses are sent in turns (EngineConfig::max_read_burst): packets [next, stop) of the
  // response sequence are still to go (a READ's all, or the rest of a re-issued one; an atomic's 1).
  uint32_t next = 0, stop = 0;
  bool answering() const { return valid && next < stop; }
};

// Requester (IBA 9.7.4): turns send WQEs into packets. Names follow the mlx5 QPC where it has one.
struct RequesterState {
  uint32_t next_send_psn = 0;  // QPC next_send_psn: PSN of the next packet to send
  uint32_t pkts_since_ackreq = 0;  // packets of the current message since the last AckReq
  uint64_t rnr_deadline = 0;  // paused by an RNR NAK until then (0: not paused)
};

// Completer (IBA 9.7.5.2, the requester's receive side): matches responses to WQEs, retries.
struct CompleterState {
  uint32_t una_psn = 0;  // oldest unacknowledged PSN (QPC last_acked_psn + 1)
  uint8_t cur_retry_count = 7;  // QPC cur_retry_count: retries left for timeouts and sequence NAKs
  uint8_t cur_rnr_retry = 7;  // QPC cur_rnr_retry: RNR retries left (rnr_retry 7: infinite)
  uint64_t retrans_deadline = 0;  // local ACK timer (0: not armed)
  bool read_gap_pending = false;  // a READ was re-issued from read_gap_psn for a response gap
  uint32_t read_gap_psn = 0;
  bool implied_nak_pending = false;  // rewound for an ACK that covered an unanswered READ/atomic
  uint32_t implied_nak_psn = 0;  // ... that WQE's first PSN
  bool seq_nak_pending = false;  // went back to seq_nak_psn for a PSN sequence NAK
  uint32_t seq_nak_psn = 0;
  // After a local ACK timeout: one AckReq'd packet in flight until an ACK shows progress. A timeout
  // without loss means a slow responder; resending the whole window would only lengthen its queue
  // (and so the next ACK's delay) by a window per timeout, until retry_cnt runs out.
  bool probing = false;
  uint32_t probe_psn = 0;  // ... the PSN it sends (una can lag the head WQE, so not measured from it)
};

// Responder (IBA 9.7.5.1): the receive side of RC and UC (UD keeps no message state).
struct ResponderState {
  uint32_t next_rcv_psn = 0;  // QPC next_rcv_psn: the expected PSN (IBA ePSN)
  uint32_t rmsn = 0;  // QPC rmsn: messages completed, sent back in the AETH MSN
  bool nak_sent = false;  // PSN sequence NAK sent; silent until the expected PSN arrives (C9-100)
  // The message in progress.
  bool in_send = false;  // between SEND_FIRST and SEND_LAST
  bool in_write = false;  // between RDMA_WRITE_FIRST and RDMA_WRITE_LAST
  bool have_wqe = false;  // a receive WQE is taken for it
  RecvWqe cur_wqe;
  uint32_t recv_offset = 0;  // bytes placed into cur_wqe
  bool data_inline = false;  // cur_wqe's SEND is in `inline_data`, not placed (QpInit::scatter_to_wc)
  uint8_t inline_data[kWcInlineMax];
  uint64_t write_va = 0;  // RDMA WRITE destination, from the RETH
  uint32_t write_rkey = 0;
  uint32_t write_offset = 0;
  uint32_t write_total = 0;  // the RETH DMA length
  bool uc_drop = false;  // UC: dropping until the next FIRST/ONLY
  // An ACK owed inside a receive batch (Engine::begin_batch): for the newest AckReq'd packet, with
  // the MSN as it was then; sent at end_batch or before any other response of this QP.
  bool ack_pending = false;
  uint32_t ack_psn = 0, ack_msn = 0;
  // READ/atomic replay cache (IBA 9.7.5.1.2, "responder resources"): max_dest_rd_atomic entries.
  std::vector<Resource> resources;
  uint32_t res_next = 0;  // the slot the next request takes: the oldest
  // Responses go in PSN order, so while a resource is answering an ACK or NAK for a later request
  // waits: ACKs in ack_pending, a NAK here (the newest; the requester repeats what it lost).
  bool nak_owed = false;
  uint8_t nak_syndrome = 0;
  uint32_t nak_psn = 0;
  uint64_t answer_at = 0;  // responses still to send: tick() sends the next turn then (0: none)
};

class Qp {
 public:
  uint32_t qpn = 0;
  bool sending = false;  // RC with packets in flight, counted in EngineImpl::sending_qps_
  uint32_t counted_inflight = 0;  // its packets in flight as last added to EngineImpl::inflight_total_
  QpInit init;
  QpAttr attr;
  QpState state = QpState::reset;
  QpCounters counters;
  uint32_t mtu = 1024;

  // The send queue, shared by requester and completer. Absolute WQE counters (wrap freely); the slot
  // is sq_index(counter).
  std::vector<SendWqe> sq;
  std::vector<uint8_t> inline_buf;  // cap.max_inline_data bytes per slot
  uint32_t sq_head = 0;  // oldest not completed (the completer's)
  uint32_t sq_cur = 0;  // next WQE the requester works on
  uint32_t sq_count = 0;  // posted and not completed
  bool sqd_notify = false;  // entered SQD with en_sqd_async_notify: raise sq_drained once drained
  uint64_t timer_at = 0;  // when this QP's entry in the engine's timer heap is due (0: none)

  RequesterState req;
  CompleterState comp;
  ResponderState resp;
  RecvQueue rq;  // unless the QP uses an SRQ

  uint32_t sq_index(uint32_t i) const { return i % uint32_t(sq.size()); }
  // Nothing sent is still unacknowledged: completions are in order, so the oldest WQE has not started.
  bool sq_drained() const { return !sq_count || !sq[sq_index(sq_head)].started; }
  // The earliest armed timer (retransmit or RNR back-off), or 0.
  uint64_t deadline() const {
    uint64_t d = 0;
    for (uint64_t t : {comp.retrans_deadline, req.rnr_deadline, resp.answer_at})
      if (t && (!d || t < d)) d = t;
    return d;
  }
  Srq* srq() const { return init.srq; }
  RecvQueue& recv_queue() { return init.srq ? init.srq->rq : rq; }
};

}  // namespace melon::rc
