// Queue pairs: creation, the PRM state machine (one command per transition), and QUERY_QP.
// Which context fields each transition takes, always or by opt_param_mask, is prm/qp_modify.h's
// table (shared with the driver core); the transport itself is src/rc.
#include <string.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
using S = prm::cmd_status::Value;
namespace q = prm::qpc;
namespace a = prm::ads;

namespace st = prm::qpc_state;
namespace op = prm::opcode;
using prm::QpcField;
namespace opt = prm::qp_optpar;

void copy_field(uint8_t* dst, const uint8_t* src, const QpcField& f) {
  uint32_t off = f.bit_off(), w = f.f->bit_width;
  if (w > 64)
    memcpy(dst + off / 8, src + off / 8, w / 8);
  else
    prm::set_bits(dst, off, w, prm::get_bits(src, off, w));
}

uint32_t ib_mtu_bytes(uint32_t mtu) { return mtu >= 1 && mtu <= 5 ? 128u << mtu : 0; }
}  // namespace

CmdStatus Hca::create_qp(Cmd& c) {
  prm::create_qp_in::cview in(c.in);
  auto ctx = in.at(prm::create_qp_in::qpc);
  Qp qp;
  qp.st = uint8_t(ctx.get(q::st));
  qp.pd = uint32_t(ctx.get(q::pd));
  qp.uar = uint32_t(ctx.get(q::uar_page));
  qp.cqn_snd = uint32_t(ctx.get(q::cqn_snd));
  qp.cqn_rcv = uint32_t(ctx.get(q::cqn_rcv));
  qp.srqn = uint32_t(ctx.get(q::srqn_rmpn_xrqn));
  qp.rq_type = uint8_t(ctx.get(q::rq_type));
  qp.no_sq = ctx.get(q::no_sq);
  qp.log_rq_size = uint8_t(ctx.get(q::log_rq_size));
  qp.log_rq_stride = uint8_t(ctx.get(q::log_rq_stride));
  qp.log_sq_size = uint8_t(ctx.get(q::log_sq_size));
  qp.log_page_size = uint8_t(ctx.get(q::log_page_size));
  qp.page_offset = uint8_t(ctx.get(q::page_offset));
  qp.dbr = ctx.get(q::dbr_addr);
  qp.counter_set = uint32_t(ctx.get(q::counter_set_id));
  if (qp.st != prm::qpc_st::RC && qp.st != prm::qpc_st::UC && qp.st != prm::qpc_st::UD && qp.st != prm::qpc_st::QP1)
    return fail(S::BAD_PARAM_ERR, synd::BAD_QP_TYPE);
  // One QP1 per port, and this device has one port: a second is refused until the first goes.
  if (qp.st == prm::qpc_st::QP1)
    for (const auto& [n, other] : qps_)
      if (other.st == prm::qpc_st::QP1) return fail(S::RES_BUSY, synd::GSI_TAKEN);
  if (in.get(prm::create_qp_in::input_qpn) || in.get(prm::create_qp_in::wq_umem_valid) || ctx.get(q::dbr_umem_valid))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  if (qp.rq_type != 0 && qp.rq_type != 1 && qp.rq_type != 3) return fail(S::BAD_PARAM_ERR, synd::BAD_RQ_TYPE);
  uint32_t max_log = uint32_t(prm::get(cur_caps_, prm::cmd_hca_cap::log_max_qp_sz));
  if (qp.log_sq_size > max_log || qp.log_rq_size > max_log) return fail(S::BAD_PARAM_ERR, synd::BAD_QUEUE_SIZE);
  if ((16u << qp.log_rq_stride) > prm::get(cur_caps_, prm::cmd_hca_cap::max_wqe_sz_rq))
    return fail(S::BAD_PARAM_ERR, synd::BAD_STRIDE);
  if (!pds_.count(qp.pd)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_PD);
  if (!uars_.count(qp.uar)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_UAR);
  if (!qp.no_sq && !cqs_.count(qp.cqn_snd)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_CQ);
  if (qp.rq_type != 3 && !cqs_.count(qp.cqn_rcv)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_CQ);
  if (qp.rq_type == 1 && !srqs_.count(qp.srqn)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_SRQ);
  if (qp.counter_set && !qcounters_.count(qp.counter_set)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_Q_COUNTER);
  if (qp.dbr % 8) return fail(S::BAD_PARAM_ERR, synd::BAD_DBR_ADDR);
  uint64_t bytes = rq_bytes(qp) + (qp.no_sq ? 0 : uint64_t(prm::kSendWqeBB) << qp.log_sq_size);
  uint64_t pg = 4096ull << qp.log_page_size;
  uint32_t n = (c.in_len - prm::create_qp_in::size_bytes) / 8;
  if (n < (bytes + qp.page_offset * 64u + pg - 1) / pg) return fail(S::BAD_PARAM_ERR, synd::PAS_TOO_SHORT);
  if (qps_.size() >= (1u << prm::get(cur_caps_, prm::cmd_hca_cap::log_max_qp)))
    return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  uint64_t icm = icm_alloc(prm::qpc::size_bytes);
  if (icm == kNoIcm) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  if (!icm_write(icm, ctx.data(), prm::qpc::size_bytes)) return fail(S::INT_ERR, synd::PAGE_DMA_FAULT);
  memcpy(qp.qpc, ctx.data(), sizeof qp.qpc);
  prm::set(qp.qpc, q::state, st::RST);
  qp.pas.resize(n);
  for (uint32_t i = 0; i < n; ++i) qp.pas[i] = prm::pas_pa(in.elem(prm::create_qp_in::pas, i));
  uint32_t qpn = 0;
  if (!tp_create_qp(qp, &qpn)) {
    icm_free(icm);
    return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  }
  qp.qpn = qpn;
  if (!qp.no_sq) ++cqs_[qp.cqn_snd].refs;
  if (qp.rq_type != 3) ++cqs_[qp.cqn_rcv].refs;
  if (qp.rq_type == 1) ++srqs_[qp.srqn].refs;
  icm_keep(IcmObj::qp, qpn, icm);
  qps_[qpn] = std::move(qp);
  prm::create_qp_out::view(c.out).set(prm::create_qp_out::qpn, qpn);
  return {};
}

uint64_t Hca::rq_bytes(const Qp& qp) const {
  return qp.rq_type == 0 ? uint64_t(16u << qp.log_rq_stride) << qp.log_rq_size : 0;
}

void Hca::release_qp(Qp& qp) {
  tp_destroy_qp(qp);
  if (!qp.no_sq && cqs_.count(qp.cqn_snd)) --cqs_[qp.cqn_snd].refs;
  if (qp.rq_type != 3 && cqs_.count(qp.cqn_rcv)) --cqs_[qp.cqn_rcv].refs;
  if (qp.rq_type == 1 && srqs_.count(qp.srqn)) --srqs_[qp.srqn].refs;
  icm_release(IcmObj::qp, qp.qpn);
}

CmdStatus Hca::destroy_qp(Cmd& c) {
  auto it = qps_.find(uint32_t(prm::destroy_qp_in::cview(c.in).get(prm::destroy_qp_in::qpn)));
  if (it == qps_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_QP);
  release_qp(it->second);
  qps_.erase(it);
  return {};
}

CmdStatus Hca::modify_qp(Cmd& c) {
  const prm::QpTransitionRule* t = prm::qp_transition(c.opcode);
  // 2ERR/2RST and the context-carrying transitions all keep the qpn at the same place.
  auto it = qps_.find(uint32_t(prm::get(c.in, prm::qp_2err_in::qpn)));
  if (it == qps_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_QP);
  Qp& qp = it->second;
  qp.state = tp_state(qp);  // the transport may have moved it to ERR or SQER on its own
  if (t->from != prm::kQpAnyState && qp.state != t->from) return fail(S::BAD_QP_STATE_ERR, synd::BAD_QP_STATE);
  if (t->to == st::ERR || t->to == st::RST) {
    tp_modify_qp(qp, t->to);
    qp.state = t->to;
    prm::set(qp.qpc, q::state, t->to);
    // Receive WQEs posted and not yet fetched complete now, flushed (IBA 10.3.1: ERR flushes the RQ).
    if (t->to == st::ERR) rq_replenish(qp);
    if (t->to == st::RST) qp.sq_pi = qp.rq_taken = qp.sq_wqe_cnt = 0;
    return {};
  }
  prm::rst2init_qp_in::cview in(c.in);
  uint32_t opt = uint32_t(in.get(prm::rst2init_qp_in::opt_param_mask));
  // Bits the transition does not accept, and accepted bits this model has no field for (alternate
  // path, path migration: no APM here), are refused.
  if (opt & ~(t->allowed_opt(qp.st) & prm::qp_opt_bits_with_fields()))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  const uint8_t* src = in.at(prm::rst2init_qp_in::qpc).data();
  // Build the next context, check it, then commit (a refused command changes nothing).
  uint8_t next[sizeof qp.qpc];
  memcpy(next, qp.qpc, sizeof next);
  for (uint32_t i = 0; i < t->nfields; ++i) copy_field(next, src, t->fields[i]);
  for (const prm::QpOptField& f : prm::kQpOptFields)
    if (opt & f.bit) copy_field(next, src, f.field);
  prm::qpc::cview nv(next);
  auto path = nv.at(q::primary_address_path);
  bool connected = !prm::qpc_st_datagram(qp.st);
  if (c.opcode == op::RST2INIT_QP || (opt & opt::PRI_PORT)) {
    if (path.get(a::vhca_port_num) != 1) return fail(S::BAD_PARAM_ERR, synd::BAD_PORT);
  }
  if (path.get(a::pkey_index) != 0) return fail(S::BAD_PARAM_ERR, synd::BAD_PKEY_INDEX);
  if (c.opcode == op::INIT2RTR_QP && connected) {
    uint32_t mtu = ib_mtu_bytes(uint32_t(nv.get(q::mtu)));
    if (!mtu || mtu > cfg_.port_mtu) return fail(S::BAD_PARAM_ERR, synd::BAD_MTU);
    uint32_t gid = uint32_t(path.get(a::src_addr_index));
    if (gid >= 256 || !gids_[gid].valid) return fail(S::BAD_PARAM_ERR, synd::BAD_GID_INDEX);
  }
  if (connected && nv.get(q::log_rra_max) > prm::get(cur_caps_, prm::cmd_hca_cap::log_max_ra_res_qp))
    return fail(S::BAD_PARAM_ERR, synd::BAD_RD_ATOMIC);
  if (connected && nv.get(q::log_sra_max) > prm::get(cur_caps_, prm::cmd_hca_cap::log_max_ra_req_qp))
    return fail(S::BAD_PARAM_ERR, synd::BAD_RD_ATOMIC);
  uint32_t cs = uint32_t(nv.get(q::counter_set_id));
  if (cs && !qcounters_.count(cs)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_Q_COUNTER);
  uint8_t old[sizeof qp.qpc];
  memcpy(old, qp.qpc, sizeof old);
  memcpy(qp.qpc, next, sizeof next);
  prm::set(qp.qpc, q::state, t->to);
  if (!tp_modify_qp(qp, t->to)) {
    memcpy(qp.qpc, old, sizeof old);
    return fail(S::BAD_PARAM_ERR, synd::BAD_QP_STATE);
  }
  qp.state = t->to;
  qp.counter_set = cs;
  return {};
}

CmdStatus Hca::query_qp(Cmd& c) {
  auto it = qps_.find(uint32_t(prm::query_qp_in::cview(c.in).get(prm::query_qp_in::qpn)));
  if (it == qps_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_QP);
  Qp& qp = it->second;
  auto ctx = prm::query_qp_out::view(c.out).at(prm::query_qp_out::qpc);
  memcpy(ctx.data(), qp.qpc, sizeof qp.qpc);
  tp_query_qp(qp, ctx.data());
  ctx.set(q::state, qp.state);
  ctx.set(q::hw_sq_wqebb_counter, qp.sq_pi & 0xffff);
  ctx.set(q::hw_rq_counter, qp.rq_taken);
  uint8_t rec[8];
  if (dma_read(qp.dbr, rec, sizeof rec)) {
    ctx.set(q::sw_sq_wqebb_counter, prm::get(rec, prm::qp_dbrec::snd_counter));
    ctx.set(q::sw_rq_counter, prm::get(rec, prm::qp_dbrec::rcv_counter));
  }
  return {};
}

}  // namespace melon::mlx5::emu
