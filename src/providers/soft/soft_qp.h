// The soft provider's QPs: verbs calls on the transport engine of the QP's lane (hub.h).
//
// Locks: the context's hub_mu_ (soft.h) guards creating the hub and the completion channels' lanes;
// posts and engine calls take the QP's lane's engine lock (hub.h, udp_transport.h), nothing else.
#pragma once

#include "providers/soft/hub.h"
#include "providers/soft/soft.h"

namespace melon::soft {

struct SoftQp : verbs::QpBase {
  SoftContext* ctx = nullptr;
  Hub* hub = nullptr;
  UdpTransport* lane = nullptr;  // hub->lane_of(qpn)
  size_t lane_index = 0;
  uint32_t qpn = 0;
  CqForward scq, rcq;
  static SoftQp* from(ibv_qp* qp) { return static_cast<SoftQp*>(verbs::QpBase::from(qp)); }
};

// ibv_context_ops.post_send / post_recv of a soft context.
int soft_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int soft_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);

}  // namespace melon::soft
