// QPs of the soft provider: verbs calls translated to the transport engine, under its lock (the
// device's lanes: hub.h).
#include "providers/soft/soft_qp.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "roce/ip_udp.h"

namespace melon::soft {

static_assert(sizeof(ibv_sge) == sizeof(rc::Sge) && offsetof(ibv_sge, lkey) == offsetof(rc::Sge, lkey),
              "ibv_sge and rc::Sge share a layout, so scatter/gather lists pass through uncopied");
static_assert(int(IBV_WR_SEND_WITH_INV) == int(rc::WrOpcode::send_with_inv) &&
                  int(IBV_WC_RECV_RDMA_WITH_IMM) == int(rc::WcOpcode::recv_rdma_with_imm) &&
                  int(IBV_WC_RNR_RETRY_EXC_ERR) == int(rc::WcStatus::rnr_retry_exc_err) &&
                  int(IBV_QP_DEST_QPN) == int(rc::kAttrDestQpn) &&
                  int(IBV_ACCESS_REMOTE_ATOMIC) == int(rc::kRemoteAtomic),
              "the engine uses verbs' numeric values");

using rc::kMaxQpWr;
using rc::kMaxRdAtomic;
using rc::kMaxSge;

// ---- context ------------------------------------------------------------------------------------

Hub* SoftContext::hub(int* err) {
  std::lock_guard<std::mutex> g(hub_mu_);
  if (!hub_) hub_.store(Hub::acquire(dev_, err), std::memory_order_release);
  return hub_;
}

void SoftContext::cq_uses_lane(SoftCq* cq, size_t lane) {
  cq->lanes.fetch_or(1u << lane, std::memory_order_relaxed);
  if (ibv_comp_channel* ch = cq->ibv.channel) {
    std::lock_guard<std::mutex> g(hub_mu_);
    channel_lanes_[ch->fd] |= 1u << lane;
  }
}

ibv_qp* SoftContext::create_qp(ibv_qp_init_attr_ex* attr) { return make_qp(attr, 0); }

ibv_qp* SoftContext::create_gsi_qp(ibv_qp_init_attr_ex* attr) {
  if (attr->qp_type != IBV_QPT_UD || attr->srq) {
    errno = EINVAL;
    return nullptr;
  }
  // Another process on this address that runs the CM already has QP1's datagrams.
  int err = 0;
  Hub* h = hub(&err);
  if (!h) {
    errno = err;
    return nullptr;
  }
  if (int e = h->claim_gsi()) {
    errno = e;
    return nullptr;
  }
  return make_qp(attr, 1);
}

ibv_qp* SoftContext::make_qp(ibv_qp_init_attr_ex* attr, uint32_t fixed_qpn) {
  auto fail = [](int e) -> ibv_qp* {
    errno = e;
    return nullptr;
  };
  // Creation flags and a TSO header size are accepted when they ask for nothing (rdma-core's
  // own tests set the mask with zero values); any flag or a TSO header is not supported (the
  // device reports tso_caps.max_tso 0), nor are XRC domains, RSS or indirection tables.
  const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                         IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
  if (attr->comp_mask & ~known) return fail(EOPNOTSUPP);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) return fail(EOPNOTSUPP);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) && attr->max_tso_header) return fail(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !owns(attr->pd)) return fail(EINVAL);
  rc::QpType type;
  const bool reliable_uc =
      attr->qp_type == IBV_QPT_UC && verbs::reliable_uc_wanted(device()->name(), device()->spec().uc_reliable);
  switch (attr->qp_type) {
    case IBV_QPT_RC: type = rc::QpType::rc; break;
    case IBV_QPT_UC: type = reliable_uc ? rc::QpType::rc : rc::QpType::uc; break;
    case IBV_QPT_UD: type = rc::QpType::ud; break;
    default: return fail(EOPNOTSUPP);  // RAW_PACKET, XRC, DRIVER
  }
  if (!owns(attr->send_cq) || !owns(attr->recv_cq)) return fail(EINVAL);
  if (attr->srq && attr->srq->context != &vctx.context) return fail(EINVAL);
  ibv_qp_cap& cap = attr->cap;
  if (cap.max_send_wr > kMaxQpWr || cap.max_send_sge > kMaxSge || cap.max_inline_data > rc::kMaxInlineData ||
      (!attr->srq && (cap.max_recv_wr > kMaxQpWr || cap.max_recv_sge > kMaxSge)))
    return fail(EINVAL);
  int err = 0;
  Hub* h = hub(&err);
  if (!h) return fail(err);

  // The SRQ's lane, or the least busy one; a fixed QPN lives where its datagrams are steered.
  const size_t lane = fixed_qpn   ? h->lane_index_of(fixed_qpn)
                      : attr->srq ? SoftSrq::from(attr->srq)->lane
                                  : h->choose_lane();
  auto* qp = new SoftQp();
  qp->ctx = this;
  qp->hub = h;
  qp->lane = &h->lane(lane);
  qp->lane_index = lane;
  qp->scq.cq = SoftCq::from(attr->send_cq);
  qp->rcq.cq = SoftCq::from(attr->recv_cq);
  rc::QpInit init;
  init.type = type;
  init.pd = attr->pd->handle;
  init.send_cq = &qp->scq;
  init.recv_cq = &qp->rcq;
  init.srq = attr->srq ? SoftSrq::from(attr->srq)->engine : nullptr;
  init.sq_sig_all = attr->sq_sig_all != 0;
  init.uc_verbs = reliable_uc;
  init.fixed_qpn = fixed_qpn;
  // Grant at least one of everything, and inline up to what was asked (rounded to 64 bytes).
  cap.max_send_wr = cap.max_send_wr ? cap.max_send_wr : 1;
  cap.max_send_sge = cap.max_send_sge ? cap.max_send_sge : 1;
  cap.max_inline_data = (cap.max_inline_data + 63) / 64 * 64;
  if (attr->srq) {
    cap.max_recv_wr = cap.max_recv_sge = 0;
  } else {
    cap.max_recv_wr = cap.max_recv_wr ? cap.max_recv_wr : 1;
    cap.max_recv_sge = cap.max_recv_sge ? cap.max_recv_sge : 1;
  }
  init.cap.max_send_wr = cap.max_send_wr;
  init.cap.max_recv_wr = cap.max_recv_wr;
  init.cap.max_send_sge = cap.max_send_sge;
  init.cap.max_recv_sge = cap.max_recv_sge;
  init.cap.max_inline_data = cap.max_inline_data;
  err = qp->lane->with_engine([&](rc::Engine& e) { return e.create_qp(init, &qp->qpn); });
  if (err) {
    delete qp;
    return fail(err);
  }
  verbs::init_qp_fields(qp, &vctx.context, attr);
  qp->reliable_uc = reliable_uc;
  ibv_qp& q = qp->ibv.qp_base;
  q.qp_num = qp->qpn;
  q.handle = qp->qpn;
  if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    if (int e = verbs::init_qp_ex_ops(qp, attr->send_ops_flags)) {
      qp->lane->with_engine([&](rc::Engine& en) { return en.destroy_qp(qp->qpn); });
      delete qp;
      return fail(e);
    }
  }
  verbs::record_qp_init(qp, attr, cap);
  h->add_qp(qp->qpn, &q);
  h->use(lane);
  // Polling these CQs receives on this lane (soft_device.cpp, poll_cq).
  cq_uses_lane(qp->scq.cq, lane);
  cq_uses_lane(qp->rcq.cq, lane);
  SoftPd::users(attr->pd)++;
  qp->scq.cq->users++;
  qp->rcq.cq->users++;
  return &q;
}

int SoftContext::modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  if (ibqp->context != &vctx.context) return EINVAL;
  SoftQp* qp = SoftQp::from(ibqp);
  ibv_qp_attr filled;
  const ibv_qp_attr* a = attr;
  if (qp->reliable_uc) {
    filled = *attr;
    mask = verbs::reliable_uc_complete(ibqp->state, &filled, mask);
    a = &filled;
  }
  // No alternate paths (APM) or rate limits on a soft device.
  if (mask & (IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_RATE_LIMIT)) return EINVAL;
  if ((mask & IBV_QP_PORT) && a->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)))
    return EINVAL;
  rc::QpAttr r;
  r.qp_state = rc::QpState(a->qp_state);
  r.cur_qp_state = rc::QpState(a->cur_qp_state);
  r.path_mtu = uint8_t(a->path_mtu);
  r.qkey = a->qkey;
  r.rq_psn = a->rq_psn;
  r.sq_psn = a->sq_psn;
  r.dest_qp_num = a->dest_qp_num;
  r.qp_access_flags = a->qp_access_flags;
  r.pkey_index = a->pkey_index;
  r.max_rd_atomic = a->max_rd_atomic;
  r.max_dest_rd_atomic = a->max_dest_rd_atomic;
  r.min_rnr_timer = a->min_rnr_timer;
  r.timeout = a->timeout;
  r.retry_cnt = a->retry_cnt;
  r.rnr_retry = a->rnr_retry;
  r.en_sqd_async_notify = a->en_sqd_async_notify;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a->ah_attr;
    if (!ah.is_global) return EINVAL;  // RoCE needs the GRH
    int err = 0;
    const IpAddr* src = qp->ctx->device()->source_address(ah.grh.sgid_index, ah.grh.dgid.raw, &err);
    if (!src) return err;
    std::memcpy(r.av.dgid, ah.grh.dgid.raw, 16);
    src->to_gid(r.av.sgid);
    r.av.flow_label = verbs::flow_label_of(ah.grh);
    r.av.hop_limit = ah.grh.hop_limit ? ah.grh.hop_limit : 64;
    r.av.traffic_class = ah.grh.traffic_class;
  }
  uint32_t emask = uint32_t(mask) & ~uint32_t(IBV_QP_PORT);
  if (mask & IBV_QP_PORT) emask |= rc::kAttrPort;
  int err = qp->lane->with_engine([&](rc::Engine& e) { return e.modify_qp(qp->qpn, r, emask); });
  if (!err && (mask & IBV_QP_STATE)) ibqp->state = a->qp_state;
  return err;
}

int SoftContext::query_qp(ibv_qp* ibqp, ibv_qp_attr* a, int mask, ibv_qp_init_attr* init) {
  if (ibqp->context != &vctx.context) return EINVAL;
  SoftQp* qp = SoftQp::from(ibqp);
  rc::QpAttr r;
  int err = qp->lane->with_engine([&](rc::Engine& e) { return e.query_qp(qp->qpn, &r, nullptr); });
  if (err) return err;
  (void)mask;  // everything is cheap to report
  std::memset(a, 0, sizeof *a);
  a->qp_state = ibv_qp_state(r.qp_state);
  a->cur_qp_state = ibv_qp_state(r.cur_qp_state);
  a->path_mtu = ibv_mtu(r.path_mtu);
  a->path_mig_state = IBV_MIG_MIGRATED;
  a->qkey = r.qkey;
  a->rq_psn = r.rq_psn;
  a->sq_psn = r.sq_psn;
  a->dest_qp_num = r.dest_qp_num;
  a->qp_access_flags = r.qp_access_flags;
  a->cap = qp->init.cap;
  a->ah_attr.is_global = 1;
  a->ah_attr.port_num = 1;
  std::memcpy(a->ah_attr.grh.dgid.raw, r.av.dgid, 16);
  a->ah_attr.grh.flow_label = r.av.flow_label;
  a->ah_attr.grh.hop_limit = r.av.hop_limit;
  a->ah_attr.grh.traffic_class = r.av.traffic_class;
  a->pkey_index = r.pkey_index;
  a->sq_draining = r.sq_draining;
  a->max_rd_atomic = r.max_rd_atomic;
  a->max_dest_rd_atomic = r.max_dest_rd_atomic;
  a->min_rnr_timer = r.min_rnr_timer;
  a->port_num = 1;
  a->timeout = r.timeout;
  a->retry_cnt = r.retry_cnt;
  a->rnr_retry = r.rnr_retry;
  if (qp->reliable_uc) verbs::reliable_uc_hide(a);
  *init = qp->init;
  return 0;
}

int SoftContext::destroy_qp(ibv_qp* ibqp) {
  if (ibqp->context != &vctx.context) return EINVAL;
  SoftQp* qp = SoftQp::from(ibqp);
  // Packets that reached the device before the destroy are this QP's last work (the ACK of its
  // last SEND, a peer's last message): processed now, as Linux's rxe has on arrival, so their
  // completions are in the CQ when this returns, not lost with the QP. Every lane: GRO may have
  // put one in another lane's socket.
  qp->hub->receive_arrived();
  qp->hub->remove_qp(qp->qpn);
  qp->hub->unuse(qp->lane_index);
  // Queued packets may carry this QP's inline data, which lives in its send queue: send them first.
  qp->lane->drain();
  qp->lane->with_engine([&](rc::Engine& e) { return e.destroy_qp(qp->qpn); });
  SoftPd::users(ibqp->pd)--;
  qp->scq.cq->users--;
  qp->rcq.cq->users--;
  verbs::release_qp_ex_ops(qp);
  verbs::destroy_sync_fields(&ibqp->mutex, &ibqp->cond);
  delete qp;
  return 0;
}

// ---- data path ----------------------------------------------------------------------------------

int soft_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  SoftQp* qp = SoftQp::from(ibqp);
  return qp->lane->post_send_engine(qp->qpn, [&](rc::Engine& e) {
    for (; wr; wr = wr->next) {
      rc::SendWr w;
      w.wr_id = wr->wr_id;
      w.opcode = rc::WrOpcode(wr->opcode);
      w.send_flags = wr->send_flags;
      w.sg_list = reinterpret_cast<const rc::Sge*>(wr->sg_list);
      w.num_sge = wr->num_sge;
      int err = 0;
      switch (wr->opcode) {
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_RDMA_WRITE_WITH_IMM: w.imm = ntohl(wr->imm_data); break;
        case IBV_WR_SEND_WITH_INV: w.invalidate_rkey = wr->invalidate_rkey; break;
        default: break;
      }
      switch (wr->opcode) {
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
        case IBV_WR_RDMA_READ:
          w.remote_addr = wr->wr.rdma.remote_addr;
          w.rkey = wr->wr.rdma.rkey;
          break;
        case IBV_WR_ATOMIC_CMP_AND_SWP:
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
          w.remote_addr = wr->wr.atomic.remote_addr;
          w.rkey = wr->wr.atomic.rkey;
          w.compare_add = wr->wr.atomic.compare_add;
          w.swap = wr->wr.atomic.swap;
          break;
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_SEND_WITH_INV: break;
        default: err = EINVAL;  // LOCAL_INV, BIND_MW, TSO, DRIVER1: not on a soft device
      }
      if (ibqp->qp_type == IBV_QPT_UD) {
        if (!wr->wr.ud.ah || wr->wr.ud.ah->context != ibqp->context)
          err = EINVAL;
        else {
          w.ah = &reinterpret_cast<SoftAh*>(wr->wr.ud.ah)->av;
          w.remote_qpn = wr->wr.ud.remote_qpn;
          w.remote_qkey = wr->wr.ud.remote_qkey;
        }
      }
      if (!err) err = e.post_send(qp->qpn, w);
      if (err) {
        if (bad) *bad = wr;
        return err;
      }
    }
    return 0;
  });
}

int soft_post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  SoftQp* qp = SoftQp::from(ibqp);
  return qp->lane->post_engine([&](rc::Engine& e) {
    for (; wr; wr = wr->next) {
      rc::RecvWr r;
      r.wr_id = wr->wr_id;
      r.sg_list = reinterpret_cast<const rc::Sge*>(wr->sg_list);
      r.num_sge = wr->num_sge;
      int err = e.post_recv(qp->qpn, r);
      if (err) {
        if (bad) *bad = wr;
        return err;
      }
    }
    return 0;
  });
}

}  // namespace melon::soft
