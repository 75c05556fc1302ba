// mlx5 provider: QP and SRQ control (create, modify, query, destroy) through the uapi; the queues
// themselves are mapped here and written by post.cpp.
#include "providers/mlx5/byte_order.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "providers/mlx5/mlx5.h"
#include "providers/mlx5/tables.h"

namespace melon::mlx5prov {

namespace {

template <class T>
T* fail(int e) {
  errno = e;
  return nullptr;
}

uint8_t uapi_qp_type(ibv_qp_type t) {
  return t == IBV_QPT_UD ? uapi::kQpUd : t == IBV_QPT_UC ? uapi::kQpUc : uapi::kQpRc;
}

// The ibv_modify_qp mask bits the uapi takes have the same values (uapi/abi.h mirrors them).
constexpr bool same(uint32_t a, uint32_t b) { return a == b; }
static_assert(same(uapi::kQpState, IBV_QP_STATE) && same(uapi::kQpAv, IBV_QP_AV) &&
              same(uapi::kQpDestQpn, IBV_QP_DEST_QPN) && same(uapi::kQpMaxDestRdAtomic, IBV_QP_MAX_DEST_RD_ATOMIC) &&
              same(uapi::kQpSqPsn, IBV_QP_SQ_PSN) && same(uapi::kQpMinRnrTimer, IBV_QP_MIN_RNR_TIMER) &&
              same(uapi::kQpCurState, IBV_QP_CUR_STATE) && same(uapi::kQpMaxQpRdAtomic, IBV_QP_MAX_QP_RD_ATOMIC));

// rdma-core mlx5_modify_qp (to RESET) and mlx5_destroy_qp: both CQs of the QP, once each.
void clean_cqs(Mlx5Qp* qp) {
  ibv_qp& q = qp->ibv.qp_base;
  Mlx5Cq* rcq = Mlx5Cq::from(q.recv_cq);
  Mlx5Cq* scq = Mlx5Cq::from(q.send_cq);
  Mlx5Srq* srq = q.srq ? Mlx5Srq::from(q.srq) : nullptr;
  if (rcq == scq) {
    std::lock_guard<std::mutex> lock(rcq->mu);
    clean_cq(rcq, q.qp_num, srq);
    return;
  }
  std::scoped_lock lock(rcq->mu, scq->mu);
  clean_cq(rcq, q.qp_num, srq);
  clean_cq(scq, q.qp_num, nullptr);
}

}  // namespace

Mlx5Qp* Mlx5Context::qp_by_qpn(uint32_t qpn) {
  std::shared_lock<std::shared_mutex> lock(obj_mu_);
  auto it = qps_by_qpn_.find(qpn);
  return it == qps_by_qpn_.end() ? nullptr : it->second;
}

// ---- QP -----------------------------------------------------------------------------------------

ibv_qp* Mlx5Context::create_qp(ibv_qp_init_attr_ex* attr) { return make_qp(attr, false); }

// QP1 on port 1 for the CM (librdmacm's gsi_port.cpp): a UD QP to the verbs, numbered 1, which the
// device keeps for one process at a time (EADDRINUSE while another has it).
ibv_qp* Mlx5Context::create_gsi_qp(ibv_qp_init_attr_ex* attr) {
  if (attr->qp_type != IBV_QPT_UD || attr->srq) return fail<ibv_qp>(EINVAL);
  return make_qp(attr, true);
}

ibv_qp* Mlx5Context::make_qp(ibv_qp_init_attr_ex* attr, bool gsi) {
  const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                         IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
  if (attr->comp_mask & ~known) return fail<ibv_qp>(EOPNOTSUPP);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) return fail<ibv_qp>(EOPNOTSUPP);
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) && attr->max_tso_header) return fail<ibv_qp>(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !owns(attr->pd)) return fail<ibv_qp>(EINVAL);
  if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD)
    return fail<ibv_qp>(EOPNOTSUPP);  // RAW_PACKET, XRC, DRIVER
  if (!owns(attr->send_cq) || !owns(attr->recv_cq) || (attr->srq && attr->srq->context != &vctx.context))
    return fail<ibv_qp>(EINVAL);
  ibv_qp_cap& cap = attr->cap;
  if (cap.max_inline_data > attr_.max_inline_data || cap.max_send_sge > attr_.max_sge ||
      cap.max_send_wr > attr_.max_qp_wr ||
      (!attr->srq && (cap.max_recv_wr > attr_.max_qp_wr || cap.max_recv_sge > attr_.max_sge)))
    return fail<ibv_qp>(EINVAL);

  uapi::CreateQpReq rq{};
  rq.pd = reinterpret_cast<Mlx5Pd*>(attr->pd)->handle;
  rq.send_cq = Mlx5Cq::from(attr->send_cq)->handle;
  rq.recv_cq = Mlx5Cq::from(attr->recv_cq)->handle;
  rq.srq = attr->srq ? Mlx5Srq::from(attr->srq)->handle : 0;
  rq.uar = uar_.handle;
  const bool reliable_uc = attr->qp_type == IBV_QPT_UC && verbs::reliable_uc_wanted(dev_->name(), false);
  rq.qp_type = gsi ? uapi::kQpGsi : reliable_uc ? uapi::kQpRc : uapi_qp_type(attr->qp_type);
  rq.port = gsi ? 1 : 0;
  rq.max_send_wr = cap.max_send_wr ? cap.max_send_wr : 1;
  rq.max_send_sge = cap.max_send_sge ? cap.max_send_sge : 1;
  rq.max_inline_data = cap.max_inline_data;
  if (!attr->srq) {
    rq.max_recv_wr = cap.max_recv_wr ? cap.max_recv_wr : 1;
    rq.max_recv_sge = cap.max_recv_sge ? cap.max_recv_sge : 1;
    // Scatter to CQE, as rdma-core asks for it (on unless MLX5_SCATTER_TO_CQE=0): a SEND of up to
    // 32 bytes may then come in its CQE, which poll_cq copies into the receive's buffers (cq.cpp).
    const char* s2c = getenv("MLX5_SCATTER_TO_CQE");
    if ((rq.qp_type == uapi::kQpRc || rq.qp_type == uapi::kQpUc) && !(s2c && !strcmp(s2c, "0")))
      rq.flags = uapi::kCreateQpScatterToCqe;
  }
  uapi::CreateQpResp rp{};
  if (uapi::Status s = t_->call(uapi::Selector::create_qp, rq, &rp); s != uapi::Status::ok)
    return fail<ibv_qp>(errno_of(s));

  auto* qp = new Mlx5Qp();
  qp->ctx = this;
  qp->handle = rp.handle;
  uapi::Status st = uapi::Status::ok;
  qp->buf_map.addr = t_->map(uapi::MapKind::sq, rp.handle, &qp->buf_map.len, &st);
  if (qp->buf_map.addr) qp->dbr_map.addr = t_->map(uapi::MapKind::db_record, rp.handle, &qp->dbr_map.len, &st);
  uint64_t need = uint64_t(rp.sq_offset) + uint64_t(rp.sq_wqe_cnt) * 64;
  bool pow2 = rp.sq_wqe_cnt && !(rp.sq_wqe_cnt & (rp.sq_wqe_cnt - 1)) && !(rp.rq_wqe_cnt & (rp.rq_wqe_cnt - 1));
  if (!qp->dbr_map.addr || !pow2 || need > qp->buf_map.len || rp.dbr_offset + 8 > qp->dbr_map.len ||
      uint64_t(rp.rq_wqe_cnt) * rp.rq_stride > rp.sq_offset) {
    int err = qp->dbr_map.addr ? EPROTO : errno_of(st);
    free_map(qp->buf_map);
    free_map(qp->dbr_map);
    call_empty(uapi::Selector::destroy_qp, rp.handle);
    delete qp;
    return fail<ibv_qp>(err);
  }
  uint8_t* base = static_cast<uint8_t*>(qp->buf_map.addr);
  qp->dbrec = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(qp->dbr_map.addr) + rp.dbr_offset);
  qp->sq_wrid.resize(rp.sq_wqe_cnt);
  qp->sq_next_tail.resize(rp.sq_wqe_cnt);
  SendQueue& sq = qp->sq;
  sq.buf = base + rp.sq_offset;
  sq.wqe_cnt = rp.sq_wqe_cnt;
  sq.max_gs = rq.max_send_sge;
  sq.max_inline = rp.max_inline_data;
  sq.qpn = rp.qpn;
  sq.type = attr->qp_type;
  sq.sig_all = attr->sq_sig_all != 0;
  sq.wrid = qp->sq_wrid.data();
  sq.next_tail = qp->sq_next_tail.data();
  if (!attr->srq) {
    qp->rq_wrid.resize(rp.rq_wqe_cnt);
    RecvQueue& r = qp->rq;
    r.buf = base;
    r.wqe_cnt = rp.rq_wqe_cnt;
    r.stride = rp.rq_stride;
    r.max_gs = rp.rq_stride / 16;
    r.wrid = qp->rq_wrid.data();
  }

  verbs::init_qp_fields(qp, &vctx.context, attr);
  qp->reliable_uc = reliable_uc;
  ibv_qp& q = qp->ibv.qp_base;
  q.qp_num = rp.qpn;
  q.handle = rp.handle;
  if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    if (int e = verbs::init_qp_ex_ops(qp, attr->send_ops_flags)) {
      free_map(qp->buf_map);
      free_map(qp->dbr_map);
      call_empty(uapi::Selector::destroy_qp, rp.handle);
      verbs::destroy_sync_fields(&q.mutex, &q.cond);
      delete qp;
      return fail<ibv_qp>(e);
    }
  }
  // Report what was granted.
  cap.max_send_wr = rq.max_send_wr;
  cap.max_send_sge = sq.max_gs;
  cap.max_inline_data = sq.max_inline;
  cap.max_recv_wr = attr->srq ? 0 : rp.rq_wqe_cnt;
  cap.max_recv_sge = attr->srq ? 0 : qp->rq.max_gs;
  verbs::record_qp_init(qp, attr, cap);
  Mlx5Cq::from(attr->send_cq)->users++;
  Mlx5Cq::from(attr->recv_cq)->users++;
  if (attr->srq) Mlx5Srq::from(attr->srq)->users++;
  std::unique_lock<std::shared_mutex> lock(obj_mu_);
  qps_by_qpn_[rp.qpn] = qp;
  by_handle_[rp.handle] = qp;
  return &q;
}

int Mlx5Context::modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  if (ibqp->context != &vctx.context) return EINVAL;
  Mlx5Qp* qp = Mlx5Qp::from(ibqp);
  ibv_qp_attr filled;
  const ibv_qp_attr* a = attr;
  if (qp->reliable_uc) {
    filled = *attr;
    mask = verbs::reliable_uc_complete(ibqp->state, &filled, mask);
    a = &filled;
  }
  // No alternate paths, migration, resizing or rate limits; SQD notification is not offered.
  if (mask & (IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_CAP | IBV_QP_RATE_LIMIT)) return EINVAL;
  uapi::ModifyQpReq rq{};
  rq.handle = qp->handle;
  rq.attr_mask = uint32_t(mask) & uapi::kQpMaskKnown;
  rq.qp_state = uint8_t(a->qp_state);
  rq.cur_qp_state = uint8_t(a->cur_qp_state);
  rq.path_mtu = uint8_t(a->path_mtu);
  rq.port = a->port_num;
  rq.qkey = a->qkey;
  rq.rq_psn = a->rq_psn;
  rq.sq_psn = a->sq_psn;
  rq.dest_qpn = a->dest_qp_num;
  rq.access = a->qp_access_flags;
  rq.pkey_index = a->pkey_index;
  rq.timeout = a->timeout;
  rq.retry_cnt = a->retry_cnt;
  rq.rnr_retry = a->rnr_retry;
  rq.min_rnr_timer = a->min_rnr_timer;
  rq.max_rd_atomic = a->max_rd_atomic;
  rq.max_dest_rd_atomic = a->max_dest_rd_atomic;
  if ((mask & IBV_QP_AV) && !to_address(a->ah_attr, &rq.av)) return EINVAL;
  uapi::EmptyResp none;
  if (getenv("MELON_MLX5_DEBUG"))
    fprintf(stderr, "melondma mlx5: modify_qp %#x mask %#x state %u access %#x rd %u dest_rd %u\n", ibqp->qp_num,
            unsigned(mask), unsigned(a->qp_state), a->qp_access_flags, a->max_rd_atomic, a->max_dest_rd_atomic);
  if (uapi::Status s = t_->call(uapi::Selector::modify_qp, rq, &none); s != uapi::Status::ok) {
    if (getenv("MELON_MLX5_DEBUG"))
      fprintf(stderr, "melondma mlx5: modify_qp %#x mask %#x -> state %u: uapi status %u\n", ibqp->qp_num,
              unsigned(mask), unsigned(a->qp_state), unsigned(s));
    return errno_of(s);
  }
  if (!(mask & IBV_QP_STATE)) return 0;
  // What may be posted in the new state (rdma-core's qp_state_max_gs).
  std::scoped_lock lock(qp->sq_mu, qp->rq_mu);
  switch (a->qp_state) {
    case IBV_QPS_RESET:
      clean_cqs(qp);  // the old completions name WQEs the reset counters will reuse
      qp->sq.state_max_gs = qp->rq.state_max_gs = -1;
      qp->sq.cur_post = qp->sq.tail = qp->rq.head = qp->rq.tail = 0;  // the device restarts its counters
      qp->dbrec[0] = qp->dbrec[1] = 0;
      break;
    case IBV_QPS_INIT: qp->rq.state_max_gs = int32_t(qp->rq.max_gs); break;
    case IBV_QPS_RTS: qp->sq.state_max_gs = int32_t(qp->sq.max_gs); break;
    default: break;
  }
  ibqp->state = a->qp_state;
  // Remember what query_qp cannot get back from the driver.
  const int keep = IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_MAX_DEST_RD_ATOMIC;
  if (mask & keep) {
    if (mask & IBV_QP_ACCESS_FLAGS) qp->attr.qp_access_flags = a->qp_access_flags;
    if (mask & IBV_QP_PKEY_INDEX) qp->attr.pkey_index = a->pkey_index;
    if (mask & IBV_QP_TIMEOUT) qp->attr.timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT) qp->attr.retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) qp->attr.rnr_retry = a->rnr_retry;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) qp->attr.max_rd_atomic = a->max_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER) qp->attr.min_rnr_timer = a->min_rnr_timer;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) qp->attr.max_dest_rd_atomic = a->max_dest_rd_atomic;
  }
  if (mask & IBV_QP_AV) qp->attr.ah_attr = a->ah_attr;
  return 0;
}

int Mlx5Context::query_qp(ibv_qp* ibqp, ibv_qp_attr* a, int, ibv_qp_init_attr* init) {
  if (ibqp->context != &vctx.context) return EINVAL;
  Mlx5Qp* qp = Mlx5Qp::from(ibqp);
  uapi::QpAttr r{};
  if (uapi::Status s = t_->call(uapi::Selector::query_qp, uapi::HandleReq{qp->handle, 0}, &r); s != uapi::Status::ok)
    return errno_of(s);
  *a = qp->attr;
  a->qp_state = ibv_qp_state(r.state);
  a->cur_qp_state = a->qp_state;
  a->path_mtu = ibv_mtu(r.path_mtu);
  a->path_mig_state = IBV_MIG_MIGRATED;
  a->qkey = r.qkey;
  a->rq_psn = r.rq_psn;
  a->sq_psn = r.sq_psn;
  a->dest_qp_num = r.dest_qpn;
  a->cap = qp->init.cap;
  a->port_num = 1;
  if (ibqp->qp_type != IBV_QPT_UD) {
    a->ah_attr.is_global = 1;
    a->ah_attr.port_num = 1;
    memcpy(a->ah_attr.grh.dgid.raw, r.av.dgid, 16);
    a->ah_attr.grh.flow_label = r.av.flow_label;
    a->ah_attr.grh.hop_limit = r.av.hop_limit;
    a->ah_attr.grh.traffic_class = r.av.traffic_class;
    a->ah_attr.grh.sgid_index = r.av.sgid_index;
  }
  if (qp->reliable_uc) verbs::reliable_uc_hide(a);
  *init = qp->init;
  return 0;
}

int Mlx5Context::destroy_qp(ibv_qp* ibqp) {
  if (ibqp->context != &vctx.context) return EINVAL;
  Mlx5Qp* qp = Mlx5Qp::from(ibqp);
  if (int e = call_empty(uapi::Selector::destroy_qp, qp->handle)) return e;
  clean_cqs(qp);  // an SRQ gets back the WQEs of completions nobody will poll
  {
    std::unique_lock<std::shared_mutex> lock(obj_mu_);
    qps_by_qpn_.erase(ibqp->qp_num);
    by_handle_.erase(qp->handle);
  }
  Mlx5Cq::from(ibqp->send_cq)->users--;
  Mlx5Cq::from(ibqp->recv_cq)->users--;
  if (ibqp->srq) Mlx5Srq::from(ibqp->srq)->users--;
  free_map(qp->buf_map);
  free_map(qp->dbr_map);
  verbs::release_qp_ex_ops(qp);
  verbs::destroy_sync_fields(&ibqp->mutex, &ibqp->cond);
  delete qp;
  return 0;
}

// ---- SRQ ----------------------------------------------------------------------------------------

ibv_srq* Mlx5Context::create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  ibv_srq_attr& a = attr->attr;
  if (!owns(pd) || a.max_wr < 1 || a.max_wr > attr_.max_srq_wr || a.max_sge > attr_.max_srq_sge ||
      a.srq_limit > a.max_wr)
    return fail<ibv_srq>(EINVAL);
  uapi::CreateSrqReq rq{reinterpret_cast<Mlx5Pd*>(pd)->handle, a.max_wr, a.max_sge ? a.max_sge : 1, a.srq_limit};
  uapi::CreateSrqResp rp{};
  if (uapi::Status s = t_->call(uapi::Selector::create_srq, rq, &rp); s != uapi::Status::ok)
    return fail<ibv_srq>(errno_of(s));
  auto* srq = new Mlx5Srq();
  srq->ctx = this;
  srq->handle = rp.handle;
  uapi::Status st = uapi::Status::ok;
  srq->buf_map.addr = t_->map(uapi::MapKind::rq, rp.handle, &srq->buf_map.len, &st);
  if (srq->buf_map.addr) srq->dbr_map.addr = t_->map(uapi::MapKind::db_record, rp.handle, &srq->dbr_map.len, &st);
  if (!srq->dbr_map.addr || rp.wqe_cnt < 2 || (rp.wqe_cnt & (rp.wqe_cnt - 1)) || rp.stride < 32 ||
      uint64_t(rp.wqe_cnt) * rp.stride > srq->buf_map.len || rp.dbr_offset + 4 > srq->dbr_map.len) {
    int err = srq->dbr_map.addr ? EPROTO : errno_of(st);
    free_map(srq->buf_map);
    free_map(srq->dbr_map);
    call_empty(uapi::Selector::destroy_srq, rp.handle);
    delete srq;
    return fail<ibv_srq>(err);
  }
  srq->dbrec = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(srq->dbr_map.addr) + rp.dbr_offset);
  srq->wrid.resize(rp.wqe_cnt);
  srq->q.buf = static_cast<uint8_t*>(srq->buf_map.addr);
  srq->q.wqe_cnt = rp.wqe_cnt;
  srq->q.stride = rp.stride;
  srq->q.max_gs = rp.stride / 16 - 1;  // after the next segment
  srq->q.wrid = srq->wrid.data();
  srq_init(srq->q);
  srq->max_wr = rp.wqe_cnt - 1;
  srq->limit = a.srq_limit;
  verbs::init_srq_fields(srq, &vctx.context, pd, attr->srq_context);
  srq->ibv.handle = rp.handle;
  a.max_wr = srq->max_wr;
  a.max_sge = srq->q.max_gs;
  std::unique_lock<std::shared_mutex> lock(obj_mu_);
  by_handle_[rp.handle] = srq;
  return &srq->ibv;
}

int Mlx5Context::modify_srq(ibv_srq* ibsrq, ibv_srq_attr* attr, int mask) {
  if (ibsrq->context != &vctx.context) return EINVAL;
  Mlx5Srq* srq = Mlx5Srq::from(ibsrq);
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  if ((mask & IBV_SRQ_MAX_WR) && attr->max_wr != srq->max_wr) return EOPNOTSUPP;  // no SRQ resize
  if (!(mask & IBV_SRQ_LIMIT)) return 0;
  if (attr->srq_limit > srq->max_wr) return EINVAL;
  uapi::EmptyResp none;
  if (uapi::Status s = t_->call(uapi::Selector::modify_srq, uapi::ModifySrqReq{srq->handle, attr->srq_limit}, &none);
      s != uapi::Status::ok)
    return errno_of(s);
  srq->limit = attr->srq_limit;
  return 0;
}

int Mlx5Context::query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) {
  if (ibsrq->context != &vctx.context) return EINVAL;
  Mlx5Srq* srq = Mlx5Srq::from(ibsrq);
  attr->max_wr = srq->max_wr;
  attr->max_sge = srq->q.max_gs;
  attr->srq_limit = srq->limit;
  return 0;
}

int Mlx5Context::destroy_srq(ibv_srq* ibsrq) {
  if (ibsrq->context != &vctx.context) return EINVAL;
  Mlx5Srq* srq = Mlx5Srq::from(ibsrq);
  if (srq->users.load()) return EBUSY;
  if (int e = call_empty(uapi::Selector::destroy_srq, srq->handle)) return e;
  {
    std::unique_lock<std::shared_mutex> lock(obj_mu_);
    by_handle_.erase(srq->handle);
  }
  free_map(srq->buf_map);
  free_map(srq->dbr_map);
  verbs::destroy_sync_fields(&ibsrq->mutex, &ibsrq->cond);
  delete srq;
  return 0;
}

}  // namespace melon::mlx5prov
