// Queue pairs: creation, the PRM state machine (one command per transition), and QUERY_QP.
// Which attributes each transition takes follows IBA 11.2.5 (QP attribute table), the optional
// parameter bits are the PRM's (Linux qp.h MLX5_QP_OPTPAR_*); the transport itself is src/rc.
#include <string.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
using S = prm::cmd_status::Value;
namespace q = prm::qpc;
namespace a = prm::ads;

// qpc opt_param_mask bits (PRM; Linux qp.h).
enum OptPar : uint32_t {
  kOptAltPath = 1 << 0,
  kOptRre = 1 << 1,
  kOptRae = 1 << 2,
  kOptRwe = 1 << 3,
  kOptPkeyIndex = 1 << 4,
  kOptQkey = 1 << 5,
  kOptRnrTimeout = 1 << 6,
  kOptPrimaryPath = 1 << 7,
  kOptSraMax = 1 << 8,
  kOptRraMax = 1 << 9,
  kOptPmState = 1 << 10,
  kOptRetryCount = 1 << 12,
  kOptRnrRetry = 1 << 13,
  kOptAckTimeout = 1 << 14,
  kOptPriPort = 1 << 16,
  kOptCounterSetId = 1 << 25,
};

// One field of the QP context, possibly inside the primary address path.
struct QpcField {
  const prm::Field* f;
  bool in_path;
  uint32_t opt;  // 0: taken whenever the transition runs; else taken when this opt bit is set
  uint32_t off() const { return in_path ? q::primary_address_path.bit_off + f->bit_off : f->bit_off; }
};

struct Transition {
  uint16_t opcode;
  uint8_t from;  // 0xff: any state
  uint8_t to;
  uint32_t allowed_opt;
  const QpcField* fields;
  uint32_t nfields;
};

constexpr QpcField kRst2Init[] = {
    {&q::rre, false, 0},
    {&q::rwe, false, 0},
    {&q::rae, false, 0},
    {&a::pkey_index, true, 0},
    {&a::vhca_port_num, true, 0},
    {&q::q_key, false, 0},
    {&q::counter_set_id, false, 0},
};
// Optional attributes: usable on the transitions whose allowed mask names them.
constexpr QpcField kOptional[] = {
    {&q::rre, false, kOptRre},
    {&q::rwe, false, kOptRwe},
    {&q::rae, false, kOptRae},
    {&a::pkey_index, true, kOptPkeyIndex},
    {&q::q_key, false, kOptQkey},
    {&q::min_rnr_nak, false, kOptRnrTimeout},
    {&q::log_sra_max, false, kOptSraMax},
    {&q::log_rra_max, false, kOptRraMax},
    {&q::retry_count, false, kOptRetryCount},
    {&q::rnr_retry, false, kOptRnrRetry},
    {&a::ack_timeout, true, kOptAckTimeout},
    {&a::vhca_port_num, true, kOptPriPort},
    {&q::counter_set_id, false, kOptCounterSetId},
};
constexpr QpcField kInit2Rtr[] = {
    {&q::mtu, false, 0},         {&q::log_msg_max, false, 0}, {&q::remote_qpn, false, 0}, {&q::next_rcv_psn, false, 0},
    {&q::log_rra_max, false, 0}, {&q::min_rnr_nak, false, 0}, {&a::grh, true, 0},         {&a::src_addr_index, true, 0},
    {&a::hop_limit, true, 0},    {&a::tclass, true, 0},       {&a::flow_label, true, 0},  {&a::rgid_rip, true, 0},
    {&a::udp_sport, true, 0},    {&a::dscp, true, 0},         {&a::eth_prio, true, 0},    {&a::rmac_47_32, true, 0},
    {&a::rmac_31_0, true, 0},    {&a::sl, true, 0},           {&a::stat_rate, true, 0},
};
constexpr QpcField kRtr2Rts[] = {
    {&q::next_send_psn, false, 0}, {&q::retry_count, false, 0}, {&q::rnr_retry, false, 0},
    {&q::log_sra_max, false, 0},   {&a::ack_timeout, true, 0},
};

namespace st = prm::qpc_state;
namespace op = prm::opcode;
constexpr uint32_t kCommonOpt = kOptQkey | kOptCounterSetId;
const Transition kTransitions[] = {
    {op::RST2INIT_QP, st::RST, st::INIT, 0, kRst2Init, sizeof kRst2Init / sizeof kRst2Init[0]},
    {op::INIT2INIT_QP, st::INIT, st::INIT, kOptRre | kOptRae | kOptRwe | kOptPkeyIndex | kOptPriPort | kCommonOpt,
     nullptr, 0},
    {op::INIT2RTR_QP, st::INIT, st::RTR, kOptRre | kOptRae | kOptRwe | kOptPkeyIndex | kCommonOpt, kInit2Rtr,
     sizeof kInit2Rtr / sizeof kInit2Rtr[0]},
    {op::RTR2RTS_QP, st::RTR, st::RTS, kOptRre | kOptRae | kOptRwe | kOptRnrTimeout | kOptPmState | kCommonOpt,
     kRtr2Rts, sizeof kRtr2Rts / sizeof kRtr2Rts[0]},
    {op::RTS2RTS_QP, st::RTS, st::RTS,
     kOptRre | kOptRae | kOptRwe | kOptRnrTimeout | kOptPmState | kOptAckTimeout | kCommonOpt, nullptr, 0},
    {op::SQERR2RTS_QP, st::SQER, st::RTS, kOptRnrTimeout | kCommonOpt, nullptr, 0},
    {op::QP_2ERR, 0xff, st::ERR, 0, nullptr, 0},
    {op::QP_2RST, 0xff, st::RST, 0, nullptr, 0},
};

void copy_field(uint8_t* dst, const uint8_t* src, const QpcField& f) {
  uint32_t off = f.off(), w = f.f->bit_width;
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
  if (qp.st != prm::qpc_st::RC && qp.st != prm::qpc_st::UC && qp.st != prm::qpc_st::UD)
    return fail(S::BAD_PARAM_ERR, synd::BAD_QP_TYPE);
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
  if (!icm) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
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
  const Transition* t = nullptr;
  for (const Transition& x : kTransitions)
    if (x.opcode == c.opcode) t = &x;
  // 2ERR/2RST and the context-carrying transitions all keep the qpn at the same place.
  auto it = qps_.find(uint32_t(prm::get(c.in, prm::qp_2err_in::qpn)));
  if (it == qps_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_QP);
  Qp& qp = it->second;
  qp.state = tp_state(qp);  // the transport may have moved it to ERR or SQER on its own
  if (t->from != 0xff && qp.state != t->from) return fail(S::BAD_QP_STATE_ERR, synd::BAD_QP_STATE);
  if (t->to == st::ERR || t->to == st::RST) {
    tp_modify_qp(qp, t->to);
    qp.state = t->to;
    prm::set(qp.qpc, q::state, t->to);
    if (t->to == st::RST) qp.sq_pi = qp.rq_taken = qp.sq_wqe_cnt = 0;
    return {};
  }
  prm::rst2init_qp_in::cview in(c.in);
  uint32_t opt = uint32_t(in.get(prm::rst2init_qp_in::opt_param_mask));
  if (opt & ~t->allowed_opt) return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  const uint8_t* src = in.at(prm::rst2init_qp_in::qpc).data();
  // Build the next context, check it, then commit (a refused command changes nothing).
  uint8_t next[sizeof qp.qpc];
  memcpy(next, qp.qpc, sizeof next);
  for (uint32_t i = 0; i < t->nfields; ++i) copy_field(next, src, t->fields[i]);
  for (const QpcField& f : kOptional)
    if (opt & f.opt) copy_field(next, src, f);
  prm::qpc::cview nv(next);
  auto path = nv.at(q::primary_address_path);
  bool connected = qp.st != prm::qpc_st::UD;
  if (c.opcode == op::RST2INIT_QP || (opt & kOptPriPort)) {
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
