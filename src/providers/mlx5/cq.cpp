// mlx5 provider: completion queues. Polling reads 64-byte CQEs from the mapped ring while their
// owner bit matches the pass (PRM "Completion Queue"; rdma-core providers/mlx5/cq.c), turns each into
// an ibv_wc (successful requester and responder CQEs, error CQEs by syndrome), then publishes the
// consumer index in the doorbell record. Arming writes the arm word to the doorbell record and the
// UAR's CQ doorbell.
#include "providers/mlx5/byte_order.h"
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "mlx5/prm/cqe.h"
#include "mlx5/prm/doorbell.h"
#include "mlx5/prm/wqe.h"
#include "providers/mlx5/doorbells.h"
#include "providers/mlx5/mlx5.h"
#include "providers/mlx5/tables.h"

namespace melon::mlx5prov {

namespace {
namespace p = mlx5::prm;
namespace q = p::cqe64;

// A CQE field that lies within one big-endian word (every one the poller reads).
inline uint32_t cqe_get(const uint8_t* cqe, const p::Field& f) {
  uint32_t w;
  memcpy(&w, cqe + f.bit_off / 32 * 4, 4);
  uint32_t shift = 32 - f.bit_off % 32 - f.bit_width;
  uint32_t mask = f.bit_width == 32 ? ~0u : (1u << f.bit_width) - 1;
  return (from_be32(w) >> shift) & mask;
}

inline uint8_t* cqe_at(Mlx5Cq* cq, uint32_t ci) { return cq->ring + size_t(ci & (cq->cqe_cnt - 1)) * p::kCqeBytes; }

// The send side of a completion: which WR, and the queue moves past it.
inline void complete_send(Mlx5Qp* qp, uint16_t wqe_counter, ibv_wc* wc) {
  uint32_t idx = wqe_counter & (qp->sq.wqe_cnt - 1);
  wc->wr_id = qp->sq.wrid[idx];
  qp->sq.tail = qp->sq.next_tail[idx];
}

// The receive side: the QP's RQ in order, or the SRQ WQE the CQE names (returned to its free list).
inline void complete_recv(Mlx5Qp* qp, uint16_t wqe_counter, ibv_wc* wc) {
  if (ibv_srq* s = qp->ibv.qp_base.srq) {
    Mlx5Srq* srq = Mlx5Srq::from(s);
    std::lock_guard<std::mutex> lock(srq->mu);
    uint32_t idx = wqe_counter & (srq->q.wqe_cnt - 1);
    wc->wr_id = srq->q.wrid[idx];
    srq_free(srq->q, idx);
    return;
  }
  wc->wr_id = qp->rq.wrid[qp->rq.tail & (qp->rq.wqe_cnt - 1)];
  qp->rq.tail++;
}

// One CQE -> one ibv_wc. 0: nothing to poll; 1: *wc filled; -1: a CQE for an unknown QP (skipped).
int poll_one(Mlx5Cq* cq, ibv_wc* wc) {
  const uint8_t* cqe = take_cqe(cqe_at(cq, cq->ci), cq->ci, cq->log_cnt);
  if (!cqe) return 0;
  uint8_t opcode = uint8_t(cqe_get(cqe, q::opcode));
  cq->ci++;
  uint32_t qpn = cqe_get(cqe, q::qpn);
  Mlx5Qp* qp = cq->ctx->qp_by_qpn(qpn);
  if (!qp) return -1;  // a QP destroyed with completions still in the ring
  memset(wc, 0, sizeof *wc);
  wc->qp_num = qpn;
  uint16_t counter = uint16_t(cqe_get(cqe, q::wqe_counter));
  switch (opcode) {
    case p::cqe_opcode::REQ: {
      complete_send(qp, counter, wc);
      bool imm = false;
      wc->opcode = wc_opcode_of_wqe(uint8_t(cqe_get(cqe, q::sop_drop)), &imm);
      if (imm) wc->wc_flags |= IBV_WC_WITH_IMM;
      if (wc->opcode == IBV_WC_RDMA_READ) wc->byte_len = cqe_get(cqe, q::byte_cnt);
      if (wc->opcode == IBV_WC_COMP_SWAP || wc->opcode == IBV_WC_FETCH_ADD) wc->byte_len = 8;
      wc->status = IBV_WC_SUCCESS;
      return 1;
    }
    case p::cqe_opcode::RESP_WR_IMM:
    case p::cqe_opcode::RESP_SEND:
    case p::cqe_opcode::RESP_SEND_IMM:
    case p::cqe_opcode::RESP_SEND_INV: {
      wc->byte_len = cqe_get(cqe, q::byte_cnt);
      const uint8_t format = uint8_t(cqe_get(cqe, q::format));
      if (format != p::cqe_format::PLAIN) {
        // Scatter to CQE (32 bytes, in the CQE's first half): the data goes where the device would
        // have put it, before the WQE is handed back. Our QPs with an SRQ never ask for it, and the
        // 64-byte and compressed formats need CQEs or settings we never create.
        const bool ok = format == p::cqe_format::INLINE_SCATTER_32 && !qp->ibv.qp_base.srq && wc->byte_len <= 32 &&
                        copy_to_scatter(qp->rq.buf + size_t(qp->rq.tail & (qp->rq.wqe_cnt - 1)) * qp->rq.stride,
                                        qp->rq.max_gs, cqe, wc->byte_len);
        complete_recv(qp, counter, wc);
        if (!ok) {
          wc->status = format == p::cqe_format::INLINE_SCATTER_32 ? IBV_WC_LOC_LEN_ERR : IBV_WC_GENERAL_ERR;
          wc->vendor_err = format;
          wc->opcode = IBV_WC_RECV;
          return 1;
        }
      } else {
        complete_recv(qp, counter, wc);
      }
      wc->opcode = opcode == p::cqe_opcode::RESP_WR_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
      uint32_t imm = cqe_get(cqe, q::imm_inval_pkey);
      if (opcode == p::cqe_opcode::RESP_WR_IMM || opcode == p::cqe_opcode::RESP_SEND_IMM) {
        wc->wc_flags |= IBV_WC_WITH_IMM;
        wc->imm_data = to_be32(imm);  // network order, as ibv_wc carries it
      } else if (opcode == p::cqe_opcode::RESP_SEND_INV) {
        wc->wc_flags |= IBV_WC_WITH_INV;
        wc->invalidated_rkey = imm;
      }
      if (qp->ibv.qp_base.qp_type == IBV_QPT_UD) {
        wc->src_qp = cqe_get(cqe, q::rqpn);
        uint32_t flags = cqe_get(cqe, q::flags);
        if (flags & 0x30) wc->wc_flags |= IBV_WC_GRH;  // g: the packet had a GRH (in the buffer's first 40 B)
        wc->sl = uint8_t(flags & 0xf);
      }
      if (format == p::cqe_format::PLAIN) wc->slid = uint16_t(cqe_get(cqe, q::slid));  // else data
      wc->status = IBV_WC_SUCCESS;
      return 1;
    }
    case p::cqe_opcode::REQ_ERR:
    case p::cqe_opcode::RESP_ERR: {
      if (opcode == p::cqe_opcode::REQ_ERR)
        complete_send(qp, counter, wc);
      else
        complete_recv(qp, counter, wc);
      wc->status = wc_status_of(uint8_t(cqe_get(cqe, p::err_cqe::syndrome)));
      wc->vendor_err = cqe_get(cqe, p::err_cqe::vendor_err_synd);
      // rdma-core leaves the opcode of an error completion undefined; report the WQE's for sends.
      bool imm = false;
      wc->opcode = opcode == p::cqe_opcode::REQ_ERR
                       ? wc_opcode_of_wqe(uint8_t(cqe_get(cqe, p::err_cqe::s_wqe_opcode)), &imm)
                       : IBV_WC_RECV;
      return 1;
    }
    default: return -1;  // RESIZE_CQ, NO_PACKET, signature errors: not produced for our QPs
  }
}

inline void update_ci(Mlx5Cq* cq) { set_cq_ci(&cq->dbrec[0], cq->ci); }

inline bool is_responder(uint8_t opcode) {
  switch (opcode) {
    case p::cqe_opcode::RESP_WR_IMM:
    case p::cqe_opcode::RESP_SEND:
    case p::cqe_opcode::RESP_SEND_IMM:
    case p::cqe_opcode::RESP_SEND_INV:
    case p::cqe_opcode::RESP_ERR: return true;
    default: return false;
  }
}

}  // namespace

// rdma-core __mlx5_cq_clean: find the producer end of what software owns, then walk back to the
// consumer index, dropping QP `qpn`'s CQEs (an SRQ gets their WQEs back) and moving the others up
// over the gaps, each keeping the owner bit of the slot it lands in.
void clean_cq(Mlx5Cq* cq, uint32_t qpn, Mlx5Srq* srq) {
  uint32_t pi = cq->ci;
  while (pi - cq->ci < cq->cqe_cnt - 1 && take_cqe(cqe_at(cq, pi), pi, cq->log_cnt)) ++pi;
  uint32_t freed = 0;
  while (pi != cq->ci) {
    --pi;
    uint8_t* cqe = cqe_at(cq, pi);
    if (cqe_get(cqe, q::qpn) == qpn) {
      if (srq && is_responder(uint8_t(cqe_get(cqe, q::opcode)))) {
        std::lock_guard<std::mutex> lock(srq->mu);
        srq_free(srq->q, cqe_get(cqe, q::wqe_counter) & (srq->q.wqe_cnt - 1));
      }
      ++freed;
    } else if (freed) {
      uint8_t* dest = cqe_at(cq, pi + freed);
      uint32_t owner = cqe_get(dest, q::owner);
      memcpy(dest, cqe, p::kCqeBytes);
      p::set(dest, q::owner, owner);
    }
  }
  if (freed) {
    cq->ci += freed;
    set_cq_ci_after_clean(&cq->dbrec[0], cq->ci);
  }
}

int mlx5_poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  if (n < 0 || (n > 0 && !wc)) return -EINVAL;
  Mlx5Cq* cq = Mlx5Cq::from(ibcq);
  std::lock_guard<std::mutex> lock(cq->mu);
  int got = 0;
  while (got < n) {
    int r = poll_one(cq, &wc[got]);
    if (r == 0) break;
    if (r > 0) got++;
  }
  if (got || cq->ci != from_be32(cq->dbrec[0])) update_ci(cq);
  if (!got && n > 0 && cq->ctx->yield_when_idle()) sched_yield();  // let melon-emud run (Transport)
  return got;
}

int mlx5_req_notify_cq(ibv_cq* ibcq, int solicited_only) {
  Mlx5Cq* cq = Mlx5Cq::from(ibcq);
  cq->ctx->arm_cq(cq, solicited_only != 0);
  return 0;
}

void Mlx5Context::arm_cq(Mlx5Cq* cq, bool solicited) {
  namespace d = p::cq_dbrec;
  namespace u = p::cq_uar_db;
  uint32_t ci;
  {
    std::lock_guard<std::mutex> lock(cq->mu);
    ci = cq->ci & 0xffffff;
  }
  uint8_t cmd = solicited ? p::kCqArmSolicited : p::kCqArmNext;
  uint32_t sn = cq->arm_sn.load(std::memory_order_relaxed) & 3;
  uint8_t rec[8] = {};
  p::set(rec, d::arm_sn, sn);
  p::set(rec, d::arm_cmd, cmd);
  p::set(rec, d::arm_ci, ci);
  uint8_t db[8] = {};
  p::set(db, u::sn, sn);
  p::set(db, u::cmd, cmd);
  p::set(db, u::ci, ci);
  p::set(db, u::cqn, cq->cqn);
  // The arm word is the record's second dword, written as one 32-bit store (the daemon of an
  // emulated card follows it: docs/uapi.md "Doorbells").
  uint32_t word;
  memcpy(&word, rec + 4, 4);
  uint64_t v;
  memcpy(&v, db, 8);
  std::lock_guard<std::mutex> lock(uar_mu_);
  auto* reg = reinterpret_cast<volatile uint64_t*>(static_cast<uint8_t*>(uar_map_.addr) + p::kUarCqDoorbell);
  ring_cq_arm(&cq->dbrec[1], word, reg, v);
  t_->kick(uar_.handle, p::kUarCqDoorbell, v);
}

// ---- extended polling ---------------------------------------------------------------------------

namespace {
Mlx5Cq* cqx(ibv_cq_ex* c) { return Mlx5Cq::from(ibv_cq_ex_to_cq(c)); }

int advance(ibv_cq_ex* c) {
  Mlx5Cq* cq = cqx(c);
  std::lock_guard<std::mutex> lock(cq->mu);
  int r;
  ibv_wc wc;
  while ((r = poll_one(cq, &wc)) < 0) {}
  update_ci(cq);
  if (r == 0) {
    if (cq->ctx->yield_when_idle()) sched_yield();  // as mlx5_poll_cq
    return ENOENT;
  }
  cq->position_on(wc);
  return 0;
}
int start_poll(ibv_cq_ex* c, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  return advance(c);
}
int next_poll(ibv_cq_ex* c) { return advance(c); }
void end_poll(ibv_cq_ex*) {}
}  // namespace

void init_cq_ex_ops(Mlx5Cq* cq) {
  ibv_cq_ex& x = cq->ibv;
  x.start_poll = start_poll;
  x.next_poll = next_poll;
  x.end_poll = end_poll;
  verbs::init_cq_ex_readers(cq);
}

// ---- CQ verbs -----------------------------------------------------------------------------------

ibv_cq_ex* Mlx5Context::create_cq(const ibv_cq_init_attr_ex* attr) {
  const uint32_t known_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  int err = 0;
  if (attr->cqe < 1 || attr->cqe > attr_.max_cqe || (attr->comp_mask & ~known_mask) ||
      ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
       (attr->flags & ~uint32_t(IBV_CREATE_CQ_ATTR_SINGLE_THREADED))))
    err = EINVAL;
  else if (attr->wc_flags & ~uint64_t(IBV_WC_STANDARD_FLAGS))
    err = EOPNOTSUPP;  // no timestamps, VLAN, flow tags (docs/mlx5-provider.md)
  if (err) {
    errno = err;
    return nullptr;
  }
  uapi::CreateCqResp rp{};
  uapi::CreateCqReq rq{attr->cqe, attr->comp_vector, uar_.handle, 0};
  if (uapi::Status s = t_->call(uapi::Selector::create_cq, rq, &rp); s != uapi::Status::ok) {
    errno = errno_of(s);
    return nullptr;
  }
  auto* cq = new Mlx5Cq();
  cq->ctx = this;
  cq->handle = rp.handle;
  cq->cqn = rp.cqn;
  cq->cqe_cnt = rp.cqe;
  while ((1u << cq->log_cnt) < rp.cqe) cq->log_cnt++;
  uapi::Status st;
  cq->ring_map.addr = t_->map(uapi::MapKind::cqe, rp.handle, &cq->ring_map.len, &st);
  if (cq->ring_map.addr) cq->dbr_map.addr = t_->map(uapi::MapKind::db_record, rp.handle, &cq->dbr_map.len, &st);
  if (!cq->dbr_map.addr || rp.cqe_bytes != p::kCqeBytes || uint64_t(rp.cqe) * p::kCqeBytes > cq->ring_map.len ||
      rp.dbr_offset + 8 > cq->dbr_map.len) {
    err = cq->dbr_map.addr ? EPROTO : errno_of(st);
    free_map(cq->ring_map);
    free_map(cq->dbr_map);
    call_empty(uapi::Selector::destroy_cq, rp.handle);
    delete cq;
    errno = err;
    return nullptr;
  }
  cq->ring = static_cast<uint8_t*>(cq->ring_map.addr);
  cq->dbrec = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(cq->dbr_map.addr) + rp.dbr_offset);
  verbs::init_cq_fields(cq, &vctx.context, attr->channel, attr->cq_context, int(rp.cqe - 1));
  init_cq_ex_ops(cq);
  std::unique_lock<std::shared_mutex> lock(obj_mu_);
  by_handle_[cq->handle] = cq;
  return &cq->ibv;
}

// rdma-core mlx5_resize_cq / mlx5_cq_resize_copy_cqes, with the driver allocating the ring: the
// device moves to the new ring and leaves a RESIZE_CQ CQE in the old one where its next CQE would
// have gone; the CQEs before it are copied to one index further on in the new ring (the boundary
// took an index), each with the owner bit of its new slot, and the consumer index steps over the
// boundary. Everything happens under the CQ's lock, so no poller sees the half-moved ring.
int Mlx5Context::resize_cq(ibv_cq* ibcq, int cqe) {
  if (ibcq->context != &vctx.context) return EINVAL;
  if (cqe < 1 || uint32_t(cqe) > attr_.max_cqe) return EINVAL;
  Mlx5Cq* cq = Mlx5Cq::from(ibcq);
  std::lock_guard<std::mutex> lock(cq->mu);
  uint32_t outstanding = 0;
  while (outstanding < cq->cqe_cnt && take_cqe(cqe_at(cq, cq->ci + outstanding), cq->ci + outstanding, cq->log_cnt))
    outstanding++;
  if (uint32_t(cqe) < outstanding) return EINVAL;  // the unpolled completions would not fit
  update_ci(cq);  // the device counts what is outstanding from the record
  uapi::ResizeCqResp rp{};
  if (uapi::Status s = t_->call(uapi::Selector::resize_cq, uapi::ResizeCqReq{cq->handle, uint32_t(cqe)}, &rp);
      s != uapi::Status::ok)
    return errno_of(s);
  if (rp.cqe == cq->cqe_cnt) return 0;  // the ring it has already holds that many
  Mapping next;
  uapi::Status st;
  next.addr = t_->map(uapi::MapKind::cqe, cq->handle, &next.len, &st);
  // Past this point the device writes the new ring: a failure leaves the CQ unusable, as a failed
  // copy does in rdma-core.
  if (!next.addr) return errno_of(st);
  if (rp.cqe_bytes != p::kCqeBytes || (rp.cqe & (rp.cqe - 1)) || uint64_t(rp.cqe) * p::kCqeBytes > next.len) {
    free_map(next);
    return EPROTO;
  }
  uint8_t* ring = static_cast<uint8_t*>(next.addr);
  uint32_t log_cnt = 0;
  while ((1u << log_cnt) < rp.cqe) log_cnt++;
  uint32_t i = cq->ci;
  for (;; ++i) {
    const uint8_t* src = i - cq->ci < cq->cqe_cnt ? take_cqe(cqe_at(cq, i), i, cq->log_cnt) : nullptr;
    if (!src) {  // no boundary where the device must have left it
      free_map(next);
      return EPROTO;
    }
    if (cqe_get(src, q::opcode) == p::cqe_opcode::RESIZE_CQ) break;
    uint8_t* dst = ring + size_t((i + 1) & (rp.cqe - 1)) * p::kCqeBytes;
    memcpy(dst, src, p::kCqeBytes - 1);
    // The owner byte last, as the device writes it: a CQE is whole once its owner says so.
    // (op_own: the opcode in the high nibble, the owner in bit 0.)
    dst[p::kCqeBytes - 1] = uint8_t((src[p::kCqeBytes - 1] & ~1u) | (((i + 1) >> log_cnt) & 1));
  }
  free_map(cq->ring_map);
  cq->ring_map = next;
  cq->ring = ring;
  cq->cqe_cnt = rp.cqe;
  cq->log_cnt = log_cnt;
  cq->ci++;  // the boundary
  update_ci(cq);
  ibcq->cqe = int(rp.cqe - 1);
  return 0;
}

int Mlx5Context::destroy_cq(ibv_cq* ibcq) {
  if (ibcq->context != &vctx.context) return EINVAL;
  Mlx5Cq* cq = Mlx5Cq::from(ibcq);
  if (cq->users.load()) return EBUSY;
  if (int e = call_empty(uapi::Selector::destroy_cq, cq->handle)) return e;
  {
    std::unique_lock<std::shared_mutex> lock(obj_mu_);
    by_handle_.erase(cq->handle);
  }
  free_map(cq->ring_map);
  free_map(cq->dbr_map);
  verbs::destroy_sync_fields(&ibcq->mutex, &ibcq->cond);
  delete cq;
  return 0;
}

}  // namespace melon::mlx5prov
