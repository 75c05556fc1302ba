// Queue pairs: RC, UC, UD and the GSI (QP1), every transition of the IBA state machine (10.3.1) through the PRM's
// modify commands, and the RoCEv2 address path.
#include <string.h>

#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/page_list.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

namespace {
constexpr uint32_t kQueuePageShift = 12;
// qpc.rq_type (mlx5_ifc.h: MLX5_NON_ZERO_RQ, MLX5_SRQ_RQ)
constexpr uint8_t kRqTypeRegular = 0, kRqTypeSrq = 1;

constexpr uint8_t bit(QpState s) { return uint8_t(1u << uint8_t(s)); }
constexpr uint8_t kAnyState = 0xff;

// One row per transition: the command, the states it leaves from, the state it enters.
struct Rule {
  QpTransition t;
  uint16_t opcode;
  uint8_t from;
  QpState to;
  bool has_qpc;
};
constexpr Rule kRules[] = {
    {QpTransition::rst2init, p::opcode::RST2INIT_QP, bit(QpState::rst), QpState::init, true},
    {QpTransition::init2init, p::opcode::INIT2INIT_QP, bit(QpState::init), QpState::init, true},
    {QpTransition::init2rtr, p::opcode::INIT2RTR_QP, bit(QpState::init), QpState::rtr, true},
    {QpTransition::rtr2rts, p::opcode::RTR2RTS_QP, bit(QpState::rtr), QpState::rts, true},
    {QpTransition::rts2rts, p::opcode::RTS2RTS_QP, bit(QpState::rts), QpState::rts, true},
    {QpTransition::sqerr2rts, p::opcode::SQERR2RTS_QP, bit(QpState::sqer), QpState::rts, true},
    // No command enters SQD on this device (prm/qp_modify.h); the row is here so a QP the firmware
    // reports in SQD could leave it.
    {QpTransition::sqd2rts, p::opcode::SQD_RTS_QP, bit(QpState::sqd), QpState::rts, true},
    {QpTransition::to_err, p::opcode::QP_2ERR, kAnyState, QpState::err, false},
    {QpTransition::to_rst, p::opcode::QP_2RST, kAnyState, QpState::rst, false},
};

uint32_t log2_ceil(uint32_t v) {
  uint32_t l = 0;
  while ((1u << l) < v) ++l;
  return l;
}

bool datagram(QpType t) { return t == QpType::ud || t == QpType::gsi; }

uint8_t st_of(QpType t) {
  switch (t) {
    case QpType::rc: return p::qpc_st::RC;
    case QpType::uc: return p::qpc_st::UC;
    case QpType::ud: return p::qpc_st::UD;
    case QpType::gsi: return p::qpc_st::QP1;
  }
  return p::qpc_st::RC;
}

// RoCE address path: GRH always (RoCEv2 is routed), the peer's MAC, the source GID index, the
// IP hop limit / traffic class / flow label, the UDP source port, the priority.
void set_path(p::View<p::ads::Self> a, const AddressPath& ap) {
  a.set(p::ads::grh, 1)
      .set(p::ads::src_addr_index, ap.sgid_index)
      .set(p::ads::hop_limit, ap.hop_limit)
      .set(p::ads::tclass, ap.tclass)
      .set(p::ads::flow_label, ap.flow_label)
      .set_bytes(p::ads::rgid_rip, ap.dgid)
      .set(p::ads::udp_sport, ap.udp_sport)
      .set(p::ads::eth_prio, ap.sl & 7)
      .set(p::ads::vhca_port_num, ap.port);
  p::set_mac(a.data(), p::ads::rmac_47_32, p::ads::rmac_31_0, ap.dmac);
}

void get_path(p::ConstView<p::ads::Self> a, AddressPath* ap) {
  ap->sgid_index = uint8_t(a.get(p::ads::src_addr_index));
  ap->hop_limit = uint8_t(a.get(p::ads::hop_limit));
  ap->tclass = uint8_t(a.get(p::ads::tclass));
  ap->flow_label = uint32_t(a.get(p::ads::flow_label));
  memcpy(ap->dgid, a.bytes(p::ads::rgid_rip), 16);
  ap->udp_sport = uint16_t(a.get(p::ads::udp_sport));
  ap->sl = uint8_t(a.get(p::ads::eth_prio));
  ap->port = uint8_t(a.get(p::ads::vhca_port_num));
  ap->ack_timeout = uint8_t(a.get(p::ads::ack_timeout));
  p::get_mac(a.data(), p::ads::rmac_47_32, p::ads::rmac_31_0, ap->dmac);
}

// Optional attributes: each requested bit either names a field the transition takes anyway (no bit
// needed) or must be one the transition accepts for this QP type; its value goes into the context
// and the bit into opt_param_mask (prm/qp_modify.h, the table the device checks against).
Err set_optional(const Qp* qp, uint16_t opcode, const QpAttr& a, uint8_t* qpc, uint32_t* mask) {
  namespace o = p::qp_optpar;
  const p::QpTransitionRule* rule = p::qp_transition(opcode);
  if (!rule) return a.optional ? Err::invalid : Err::ok;
  uint32_t allowed = rule->allowed_opt(st_of(qp->type));
  bool rc = qp->type == QpType::rc;
  p::qpc::view c(qpc);
  auto path = c.at(p::qpc::primary_address_path);
  for (const p::QpOptField& f : p::kQpOptFields) {
    if (!(a.optional & f.bit)) continue;
    bool taken = p::qp_transition_takes(*rule, f.field);
    if (!taken && !(allowed & f.bit)) return Err::invalid;
    switch (f.bit) {
      case o::RRE: c.set(p::qpc::rre, rc && (a.access & kAccessRemoteRead)); break;
      case o::RAE: c.set(p::qpc::rae, rc && (a.access & kAccessRemoteAtomic)); break;
      case o::RWE: c.set(p::qpc::rwe, !datagram(qp->type) && (a.access & kAccessRemoteWrite)); break;
      case o::PKEY_INDEX: path.set(p::ads::pkey_index, a.pkey_index); break;
      case o::Q_KEY: c.set(p::qpc::q_key, a.qkey); break;
      case o::RNR_TIMEOUT: c.set(p::qpc::min_rnr_nak, a.min_rnr_timer); break;
      case o::SRA_MAX: c.set(p::qpc::log_sra_max, log2_ceil(a.max_rd_atomic ? a.max_rd_atomic : 1)); break;
      case o::RRA_MAX: c.set(p::qpc::log_rra_max, log2_ceil(a.max_dest_rd_atomic ? a.max_dest_rd_atomic : 1)); break;
      case o::RETRY_COUNT: c.set(p::qpc::retry_count, a.retry_cnt); break;
      case o::RNR_RETRY: c.set(p::qpc::rnr_retry, a.rnr_retry); break;
      case o::ACK_TIMEOUT: path.set(p::ads::ack_timeout, a.path.ack_timeout); break;
      case o::PRI_PORT: path.set(p::ads::vhca_port_num, a.path.port); break;
      default: return Err::invalid;  // a bit with a field the core does not set (counter set)
    }
    if (!taken) *mask |= f.bit;
  }
  if (a.optional & ~p::qp_opt_bits_with_fields()) return Err::invalid;
  return Err::ok;
}
}  // namespace

Err Hca::create_qp(const QpParams& qp_p, Qp** out) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  const QpParams& q = qp_p;
  if (!q.pd || q.pd->kind != ObjKind::pd || !q.send_cq || q.send_cq->kind != ObjKind::cq || !q.recv_cq ||
      q.recv_cq->kind != ObjKind::cq || (q.srq && q.srq->kind != ObjKind::srq) || !q.dbr_iova || (q.dbr_iova & 7) ||
      q.log_rq_stride < 4 || q.log_rq_stride > 11)
    return Err::invalid;
  uint32_t log_max_sz = uint32_t(p::get(caps_.general, p::cmd_hca_cap::log_max_qp_sz));
  if (!log_max_sz || log_max_sz > kMaxLogQueueSize) log_max_sz = log_max_sz ? kMaxLogQueueSize : 15;
  if (q.log_sq_size > log_max_sz || (!q.srq && q.log_rq_size > log_max_sz)) return Err::invalid;
  uint64_t rq_bytes = q.srq ? 0 : (uint64_t(1) << q.log_rq_size) << q.log_rq_stride;
  uint64_t sq_bytes = (uint64_t(1) << q.log_sq_size) * p::kSendWqeBB;
  if (!q.buf || !q.nbuf || (q.buf[0].iova & 0xfff) || segments_bytes(q.buf, q.nbuf) < rq_bytes + sq_bytes ||
      best_page_shift(q.buf, q.nbuf, q.buf[0].iova, kQueuePageShift) != kQueuePageShift)
    return Err::invalid;
  uint32_t npages = uint32_t(for_each_page(q.buf, q.nbuf, kQueuePageShift, [](uint64_t) {}));
  uint32_t in_len = p::create_qp_in::size_bytes + npages * 8;
  Scratch in(*hal_, in_len);
  uint8_t o[p::create_qp_out::size_bytes] = {};
  if (!in) return Err::no_memory;
  p::cmd_set_header(in.get(), p::opcode::CREATE_QP, 0);
  p::create_qp_in::view v(in.get());
  auto c = v.at(p::create_qp_in::qpc);
  c.set(p::qpc::st, st_of(q.type))
      .set(p::qpc::pm_state, p::qpc_pm_state::MIGRATED)
      .set(p::qpc::pd, q.pd->pdn)
      .set(p::qpc::uar_page, q.uar ? q.uar->index : eq_uar_->index)
      .set(p::qpc::log_sq_size, q.log_sq_size)
      .set(p::qpc::log_rq_stride, q.log_rq_stride - 4)
      .set(p::qpc::log_rq_size, q.srq ? 0 : q.log_rq_size)
      .set(p::qpc::rq_type, q.srq ? kRqTypeSrq : kRqTypeRegular)
      .set(p::qpc::srqn_rmpn_xrqn, q.srq ? q.srq->srqn : 0)
      .set(p::qpc::cqn_snd, q.send_cq->cqn)
      .set(p::qpc::cqn_rcv, q.recv_cq->cqn)
      .set(p::qpc::user_index, q.user_index)
      .set(p::qpc::log_page_size, kQueuePageShift - 12)
      .set(p::qpc::dbr_addr, q.dbr_iova);
  // Responder scatter to CQE, 32 bytes (64-byte CQEs): what Linux sets for MLX5_QP_FLAG_SCATTER_CQE.
  if (q.scatter_to_cqe && !q.srq && (q.type == QpType::rc || q.type == QpType::uc))
    c.set(p::qpc::cs_res, p::qpc_cs_res::SCAT_DATA32_CQE);
  uint32_t i = 0;
  for_each_page(q.buf, q.nbuf, kQueuePageShift,
                [&](uint64_t pa) { p::pas_set(v.elem(p::create_qp_in::pas, i++), pa); });
  CmdFailure f;
  if (Err e = cmd(in.get(), in_len, o, sizeof o, &f); e != Err::ok) {
    // The firmware keeps one QP1 per port and answers RES_BUSY for another.
    if (q.type == QpType::gsi && e == Err::cmd_status && f.status == p::cmd_status::RES_BUSY) return Err::taken;
    return e;
  }
  uint32_t qpn = uint32_t(p::create_qp_out::cview(o).get(p::create_qp_out::qpn));
  Qp* qp = new_obj<Qp>(ObjKind::qp);
  if (!qp) {
    uint8_t din[p::destroy_qp_in::size_bytes] = {}, dout[p::destroy_qp_out::size_bytes] = {};
    p::cmd_set_header(din, p::opcode::DESTROY_QP, 0);
    p::destroy_qp_in::view(din).set(p::destroy_qp_in::qpn, qpn);
    cmd(din, sizeof din, dout, sizeof dout);
    return Err::no_memory;
  }
  qp->qpn = qpn;
  qp->type = q.type;
  qp->state = QpState::rst;
  qp->pd = q.pd;
  qp->send_cq = q.send_cq;
  qp->recv_cq = q.recv_cq;
  qp->srq = q.srq;
  qp->uar = q.uar;
  qp->owner = q.owner;
  q.pd->refs++;
  q.send_cq->refs++;
  q.recv_cq->refs++;
  if (q.srq) q.srq->refs++;
  if (q.uar) q.uar->refs++;
  MLX_DBG(*hal_, qp, "%s QP 0x%x: sq %u rq %u%s", qp_type_name(q.type), qpn, 1u << q.log_sq_size,
          q.srq ? 0 : 1u << q.log_rq_size, q.srq ? " (SRQ)" : "");
  *out = qp;
  return Err::ok;
}

Err Hca::modify_qp(Qp* qp, QpTransition t, const QpAttr& a) {
  if (!qp || qp->kind != ObjKind::qp) return Err::invalid;
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  const Rule* r = nullptr;
  for (const Rule& x : kRules)
    if (x.t == t) r = &x;
  if (!r) return Err::invalid;
  if (!(r->from & bit(qp->state))) {
    MLX_ERR(*hal_, qp, "QP 0x%x: %s not allowed from %s", qp->qpn, qp_transition_name(t), qp_state_name(qp->state));
    return Err::bad_state;
  }
  if (t == QpTransition::init2rtr) {
    if (a.path.sgid_index >= (caps_.gid_table_size ? caps_.gid_table_size : 256)) return Err::invalid;
    if (a.mtu < p::qpc_mtu::MTU_256_BYTES || a.mtu > p::qpc_mtu::MTU_4K_BYTES) return Err::invalid;
  }
  uint8_t small[p::qp_2err_in::size_bytes] = {};
  uint8_t big[p::rst2init_qp_in::size_bytes] = {};
  uint8_t out[p::rst2init_qp_out::size_bytes] = {};
  uint8_t* in = r->has_qpc ? big : small;
  uint32_t opt_mask = 0;
  uint32_t in_len = r->has_qpc ? sizeof big : sizeof small;
  p::cmd_set_header(in, r->opcode, 0);
  // Every transition layout keeps qpn at the same place (checked against mlx5_ifc.h).
  p::set(in, p::rst2init_qp_in::qpn, qp->qpn);
  if (r->has_qpc) {
    auto c = p::rst2init_qp_in::view(in).at(p::rst2init_qp_in::qpc);
    auto path = c.at(p::qpc::primary_address_path);
    bool rc = qp->type == QpType::rc, ud = datagram(qp->type);
    switch (t) {
      case QpTransition::rst2init:
      case QpTransition::init2init:
        path.set(p::ads::pkey_index, a.pkey_index).set(p::ads::vhca_port_num, a.path.port);
        if (ud) c.set(p::qpc::q_key, a.qkey);
        c.set(p::qpc::rwe, !ud && (a.access & kAccessRemoteWrite))
            .set(p::qpc::rre, rc && (a.access & kAccessRemoteRead))
            .set(p::qpc::rae, rc && (a.access & kAccessRemoteAtomic));
        if (rc && (a.access & kAccessRemoteAtomic)) c.set(p::qpc::atomic_mode, p::qpc_atomic_mode::UP_TO_8B);
        break;
      case QpTransition::init2rtr:
        c.set(p::qpc::mtu, a.mtu).set(p::qpc::log_msg_max, p::get(caps_.general, p::cmd_hca_cap::log_max_msg));
        if (!ud) {
          c.set(p::qpc::remote_qpn, a.dest_qpn).set(p::qpc::next_rcv_psn, a.rq_psn & 0xffffff);
          set_path(path, a.path);
          path.set(p::ads::pkey_index, a.pkey_index);
        }
        if (rc)
          c.set(p::qpc::log_rra_max, log2_ceil(a.max_dest_rd_atomic ? a.max_dest_rd_atomic : 1))
              .set(p::qpc::min_rnr_nak, a.min_rnr_timer);
        break;
      case QpTransition::rtr2rts:
        c.set(p::qpc::next_send_psn, a.sq_psn & 0xffffff);
        if (rc) {
          c.set(p::qpc::retry_count, a.retry_cnt)
              .set(p::qpc::rnr_retry, a.rnr_retry)
              .set(p::qpc::log_sra_max, log2_ceil(a.max_rd_atomic ? a.max_rd_atomic : 1));
          path.set(p::ads::ack_timeout, a.path.ack_timeout);
        }
        break;
      default: break;
    }
    if (Err e = set_optional(qp, r->opcode, a, c.data(), &opt_mask); e != Err::ok) return e;
    p::set(in, p::rst2init_qp_in::opt_param_mask, opt_mask);
  }
  if (Err e = cmd(in, in_len, out, sizeof out); e != Err::ok) return e;
  MLX_DBG(*hal_, qp, "QP 0x%x %s: %s -> %s", qp->qpn, qp_transition_name(t), qp_state_name(qp->state),
          qp_state_name(r->to));
  qp->state = r->to;
  return Err::ok;
}

Err Hca::query_qp(Qp* qp, QpQuery* q) {
  if (!qp || qp->kind != ObjKind::qp) return Err::invalid;
  uint8_t in[p::query_qp_in::size_bytes] = {};
  Scratch out(*hal_, p::query_qp_out::size_bytes);
  if (!out) return Err::no_memory;
  p::cmd_set_header(in, p::opcode::QUERY_QP, 0);
  p::query_qp_in::view(in).set(p::query_qp_in::qpn, qp->qpn);
  if (Err e = cmd(in, sizeof in, out.get(), p::query_qp_out::size_bytes); e != Err::ok) return e;
  auto c = p::query_qp_out::cview(out.get()).at(p::query_qp_out::qpc);
  q->state = QpState(c.get(p::qpc::state));
  q->st = uint32_t(c.get(p::qpc::st));
  q->pd = uint32_t(c.get(p::qpc::pd));
  q->remote_qpn = uint32_t(c.get(p::qpc::remote_qpn));
  q->next_send_psn = uint32_t(c.get(p::qpc::next_send_psn));
  q->next_rcv_psn = uint32_t(c.get(p::qpc::next_rcv_psn));
  q->qkey = uint32_t(c.get(p::qpc::q_key));
  q->mtu = uint32_t(c.get(p::qpc::mtu));
  q->cqn_snd = uint32_t(c.get(p::qpc::cqn_snd));
  q->cqn_rcv = uint32_t(c.get(p::qpc::cqn_rcv));
  get_path(c.at(p::qpc::primary_address_path), &q->path);
  // The firmware's view wins: an async error may have moved the QP (e.g. to ERR or SQER).
  qp->state = q->state;
  return Err::ok;
}

Err Hca::destroy_qp(Qp* qp) {
  if (!qp || qp->kind != ObjKind::qp) return Err::invalid;
  uint8_t in[p::destroy_qp_in::size_bytes] = {}, out[p::destroy_qp_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::DESTROY_QP, 0);
  p::destroy_qp_in::view(in).set(p::destroy_qp_in::qpn, qp->qpn);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  qp->pd->refs--;
  qp->send_cq->refs--;
  qp->recv_cq->refs--;
  if (qp->srq) qp->srq->refs--;
  if (qp->uar) qp->uar->refs--;
  delete_obj(qp, sizeof(Qp));
  return Err::ok;
}

}  // namespace melon::mlx5::core
