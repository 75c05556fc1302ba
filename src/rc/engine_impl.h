// The engine's internals, split by role as in IBA ch. 9: requester (requester.cpp), completer
// (completer.cpp), responder (responder.cpp), QP state machine (qp_state.cpp).
#pragma once
#include <stdint.h>

#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <vector>

#include "rc/engine.h"
#include "rc/outcome.h"
#include "rc/qp.h"

namespace melon::rc {

class EngineImpl {
 public:
  EngineImpl(const Host& host, const EngineConfig& config)
      : host_(host),
        link_(host.link),
        mem_(host.memory),
        events_(host.events),
        cfg_(config),
        next_qpn_(config.first_qpn) {}

  Host host_;
  FrameLink& link_;
  HostMemory& mem_;
  EventSink* events_;
  EngineConfig cfg_;
  // QPs by slot: a QPN's low kQpnSlotBits bits are its slot, so lookup is one index and a compare
  // (the high bits are a tag, random or sequential: see choose_qpn).
  static constexpr uint32_t kQpnSlotBits = 12;
  static constexpr uint32_t kQpnSlotMask = (1u << kQpnSlotBits) - 1;
  static_assert(kMaxQp <= kQpnSlotMask + 1);
  std::vector<std::unique_ptr<Qp>> slots_;
  std::vector<uint32_t> free_slots_;
  size_t nqps_ = 0;
  // Timer deadlines in a min-heap, one live entry per QP (Qp::timer_at); entries the QP no longer
  // matches are dropped when they reach the top.
  struct Timer {
    uint64_t at;
    uint32_t qpn;
    bool operator>(const Timer& o) const { return at > o.at; }
  };
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::map<uint32_t, std::unique_ptr<Srq>> srqs_;
  uint32_t next_qpn_;
  uint32_t choose_qpn(uint32_t* slot);  // engine.cpp: a free QPN and its slot (EngineConfig says how)
  void schedule(Qp& qp);  // engine.cpp: keep qp's earliest deadline in the heap
  uint64_t earliest_deadline();  // engine.cpp: the heap's top, exact
  uint32_t next_srqn_ = 1;
  uint64_t dropped_ = 0;
  QpCounters retired_;  // counters of destroyed QPs (Engine::totals)
  bool in_batch_ = false;  // between begin_batch and end_batch
  std::vector<uint32_t> ack_owed_;  // QPNs with resp.ack_pending set in this batch

  uint64_t now() { return host_.clock.now(); }

  Qp* find(uint32_t qpn) const {
    uint32_t slot = qpn & kQpnSlotMask;
    Qp* qp = slot < slots_.size() ? slots_[slot].get() : nullptr;
    return qp && qp->qpn == qpn ? qp : nullptr;
  }

  // qp_state.cpp
  int modify(Qp& qp, const QpAttr& a, uint32_t mask, uint64_t now);
  void to_error(Qp& qp);  // move to ERR and flush everything outstanding
  void to_sq_error(Qp& qp);  // UC/UD: a send-side error moves to SQE and flushes the send queue
  void check_sq_drained(Qp& qp);  // SQD: raise sq_drained once, when asked for and drained
  void flush_sq(Qp& qp);
  void flush_rq(Qp& qp, bool entering_err = false);  // entering_err: the QP's move to ERR (SRQ's last-WQE event)
  void reset(Qp& qp);

  // requester.cpp
  int post_send(Qp& qp, const SendWr& wr, uint64_t now);
  void requester_progress(Qp& qp, uint64_t now);  // note_sending around send_more
  void send_more(Qp& qp, uint64_t now);
  struct ReadSpan {  // the READ response packets [off, end) one request asks for
    uint32_t off = 0, end = 0;
  };
  bool may_send(const Qp& qp, const SendWqe& w, uint32_t win, uint32_t own, ReadSpan* rs) const;
  void start_wqe(const Qp& qp, SendWqe& w) const;
  void build_read_request(Qp& qp, SendWqe& w, const ReadSpan& rs, TxPacket& tx);
  void build_atomic(Qp& qp, SendWqe& w, TxPacket& tx);
  bool build_segment(Qp& qp, SendWqe& w, uint32_t win, uint32_t own, TxPacket& tx);
  // The shared window (EngineConfig::max_inflight_total): the RC QPs with packets in flight and
  // their packets together. note_sending keeps both; it runs around every requester pass, at ERR,
  // RESET and destroy, so a QP's acknowledged packets leave the total by its next pass at the latest.
  // A QP below kMinSharedWindow in flight may always send, so that each has ACKs coming to clock it
  // (nothing else wakes a QP when another's ACK frees room): the total stays within the budget plus
  // kMinSharedWindow per QP.
  static constexpr uint32_t kMinSharedWindow = 4;
  uint32_t sending_qps_ = 0;
  uint32_t inflight_total_ = 0;
  void note_sending(Qp& qp);
  uint32_t window(const Qp& qp) const;  // this QP's share: at most max_inflight_packets
  bool budget_full(const Qp& qp, uint32_t own) const;  // the total would pass the budget
  void rewind(Qp& qp, uint32_t psn);  // go-back-N to `psn`
  uint32_t read_chunk(const Qp& qp, uint32_t npkts) const;  // response packets per READ request
  uint32_t rd_atomic_requests(const Qp& qp) const;  // READ/atomic requests outstanding (max_rd_atomic)

  // completer.cpp: on_response walks the send queue from the oldest WQE and matches the response
  // against each with one of the match_* functions, until one says stop.
  enum class Step : uint8_t { next, stop, leave };  // next WQE / stop walking / return at once
  void on_response(Qp& qp, const roce::Packet& p, uint64_t now);
  Step match_nak(Qp& qp, SendWqe& w, const roce::Packet& p, bool& progressed, uint64_t now);
  Step match_read_response(Qp& qp, SendWqe& w, const roce::Packet& p, bool& progressed, uint64_t now);
  Step match_atomic_ack(Qp& qp, SendWqe& w, const roce::Packet& p, bool& progressed, uint64_t now);
  Step match_ack(Qp& qp, SendWqe& w, const roce::Packet& p, bool& progressed, uint64_t now);
  void on_timer(Qp& qp, uint64_t now);
  bool complete_send(Qp& qp, SendWqe& w, WcStatus st);  // false: CQ overflow, QP went to ERR
  // The one error path of a send WQE: it completes with `st` and the QP leaves RTS, RC to ERR
  // (IBA 9.9.3.1.2), UC/UD to SQE (a send-side error: the receive side goes on).
  void fail_wqe(Qp& qp, SendWqe& w, WcStatus st);
  void arm_retrans(Qp& qp, uint64_t now);

  // responder.cpp
  void on_request(Qp& qp, const roce::IpUdp& ip, const roce::Packet& p);
  void receive_datagram(Qp& qp, const roce::IpUdp& ip, const roce::Packet& p);
  void answer_duplicate(Qp& qp, const roce::Packet& p);
  Outcome execute(Qp& qp, const roce::Packet& p);
  void acknowledge(Qp& qp, const roce::Packet& p);
  void respond(Qp& qp, const roce::Packet& p, Outcome o);  // acts on the outcome table's row
  void take_recv_wqe(Qp& qp);
  uint32_t recv_pd(const Qp& qp) const;  // the PD receive WQEs are checked in (the SRQ's, if any)
  void send_ack(Qp& qp, uint8_t syndrome, uint32_t psn);  // sends an owed coalesced ACK first
  void flush_ack(Qp& qp);  // the ACK owed from a receive batch, if any (not while answering)
  // Sends the next turn of READ responses and atomic ACKs, oldest resource first, then what waited
  // behind them; leaves answer_at set while some remain.
  void answer(Qp& qp, uint64_t now);
  bool answering(const Qp& qp) const;
  void write_ack(Qp& qp, uint8_t syndrome, uint32_t psn, uint32_t msn);

  // shared
  void fill_tx_common(const Qp& qp, TxPacket& tx, uint8_t opcode, uint32_t psn) const;
  bool push_recv_wc(Qp& qp, const Wc& wc);
  void raise(Qp& qp, AsyncEvent ev) {
    if (events_) events_->qp_event(qp.qpn, ev);
  }
};

}  // namespace melon::rc
