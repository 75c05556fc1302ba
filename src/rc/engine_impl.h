// The engine's internals, split by role as in IBA ch. 9: requester (requester.cpp), completer
// (completer.cpp), responder (responder.cpp), QP state machine (qp_state.cpp).
#pragma once
#include <stdint.h>

#include <map>
#include <memory>

#include "rc/engine.h"
#include "rc/qp.h"

namespace melon::rc {

class EngineImpl {
 public:
  EngineImpl(Link& link, Memory& memory, EventSink* events, const EngineConfig& config)
      : link_(link), mem_(memory), events_(events), cfg_(config), next_qpn_(config.first_qpn) {}

  Link& link_;
  Memory& mem_;
  EventSink* events_;
  EngineConfig cfg_;
  std::map<uint32_t, std::unique_ptr<Qp>> qps_;
  std::map<uint32_t, std::unique_ptr<Srq>> srqs_;
  uint32_t next_qpn_;
  uint32_t next_srqn_ = 1;
  uint64_t dropped_ = 0;

  uint32_t choose_qpn();  // engine.cpp: the next QPN (EngineConfig says how)

  Qp* find(uint32_t qpn) const {
    auto it = qps_.find(qpn);
    return it == qps_.end() ? nullptr : it->second.get();
  }

  // qp_state.cpp
  int modify(Qp& qp, const QpAttr& a, uint32_t mask, uint64_t now);
  void to_error(Qp& qp);  // move to ERR and flush everything outstanding
  void flush_sq(Qp& qp);
  void flush_rq(Qp& qp);
  void reset(Qp& qp);

  // requester.cpp
  int post_send(Qp& qp, const SendWr& wr, uint64_t now);
  void requester_progress(Qp& qp, uint64_t now);
  void rewind(Qp& qp, uint32_t psn);  // go-back-N to `psn`

  // completer.cpp
  void on_response(Qp& qp, const roce::Packet& p, uint64_t now);
  void on_timer(Qp& qp, uint64_t now);
  bool complete_send(Qp& qp, SendWqe& w, WcStatus st);  // false: CQ overflow, QP went to ERR
  void arm_retrans(Qp& qp, uint64_t now);

  // responder.cpp
  void on_request(Qp& qp, const roce::IpUdp& ip, const roce::Packet& p, uint64_t now);
  void send_ack(Qp& qp, uint8_t syndrome, uint32_t psn);

  // shared
  void fill_tx_common(const Qp& qp, TxPacket& tx, uint8_t opcode, uint32_t psn) const;
  bool push_recv_wc(Qp& qp, const Wc& wc);
  uint32_t recv_pd(const Qp& qp) const;  // the PD receive WQEs resolve in (the SRQ's, if any)
  Wc recv_error(const Qp& qp, uint64_t wr_id, WcStatus status) const;
  void raise(Qp& qp, AsyncEvent ev) {
    if (events_) events_->qp_event(qp.qpn, ev);
  }
};

}  // namespace melon::rc
