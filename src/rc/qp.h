// Internal QP state: the send queue with its requester/completer progress, the responder's
// receive-side state, and the replay cache (IBA 9.7.5.1.2, "responder resources").
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
};

class Qp {
 public:
  uint32_t qpn = 0;
  QpInit init;
  QpAttr attr;
  QpState state = QpState::reset;
  QpCounters counters;
  uint32_t mtu = 1024;

  // ---- send queue (requester + completer)
  std::vector<SendWqe> sq;
  std::vector<uint8_t> inline_buf;  // cap.max_inline_data bytes per slot
  // Absolute WQE counters (wrap freely); the slot is sq_index(counter).
  uint32_t sq_head = 0;  // oldest not completed
  uint32_t sq_cur = 0;  // next WQE the requester works on
  uint32_t sq_count = 0;  // posted and not completed
  uint32_t next_psn = 0;  // PSN of the next packet to send
  uint32_t una_psn = 0;  // oldest unacknowledged PSN
  uint32_t pkts_since_ackreq = 0;
  uint32_t rd_atomic_outstanding = 0;
  uint8_t retry_left = 7;
  uint8_t rnr_left = 7;
  uint64_t retrans_deadline = 0;  // 0 = not armed
  uint64_t rnr_deadline = 0;  // requester paused until then (RNR back-off)
  bool read_gap_pending = false;  // a READ was re-issued from read_gap_psn for a response gap
  uint32_t read_gap_psn = 0;
  bool implied_nak_pending = false;  // rewound for an ACK that covered an unanswered READ/atomic
  uint32_t implied_nak_psn = 0;  // ... that WQE's first PSN
  bool seq_nak_pending = false;  // went back to seq_nak_psn for a PSN sequence NAK
  uint32_t seq_nak_psn = 0;

  // ---- receive side (responder)
  RecvQueue rq;
  uint32_t epsn = 0;  // expected PSN
  uint32_t msn = 0;
  bool nak_sent = false;  // PSN sequence NAK sent; silent until the expected PSN arrives
  // Message in progress.
  bool in_send = false;  // between SEND_FIRST and SEND_LAST
  bool in_write = false;
  bool have_wqe = false;  // recv WQE taken for the message in progress
  RecvWqe cur_wqe;
  uint32_t recv_offset = 0;
  uint64_t write_va = 0;  // RDMA WRITE destination, from the RETH
  uint32_t write_rkey = 0;
  uint32_t write_offset = 0;
  uint32_t write_total = 0;
  bool uc_drop = false;  // UC: dropping until the next FIRST/ONLY
  std::vector<Resource> resources;
  uint32_t res_next = 0;

  uint32_t sq_index(uint32_t i) const { return i % uint32_t(sq.size()); }
  Srq* srq() const { return init.srq; }
  RecvQueue& recv_queue() { return init.srq ? init.srq->rq : rq; }
};

}  // namespace melon::rc
