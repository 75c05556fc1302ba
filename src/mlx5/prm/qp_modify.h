// What each QP modify command takes: the QP context fields it always reads, and the optional ones
// named by opt_param_mask. One table for both sides: the emulator validates and applies commands by
// it, the driver core builds opt_param_mask from it.
//
// Sources: the opt_param_mask bits are the PRM's (Linux qp.h MLX5_QP_OPTPAR_*, checked against it
// by tests/mlx5/prm); which optional bits a transition accepts for each service type follows Linux
// mlx5_ib qp.c (opt_mask); the fields a transition always takes follow IBA 11.2.5 (the QP attribute
// table: required attributes per transition).
//
// SQD: the PRM has SQD_RTS_QP (0x50c, the sqd2rts_qp layout) but no command that takes a QP from
// RTS to SQD. Neither mlx5_ifc.h nor Linux mlx5 has one; mlx5_ib's modify table has no RTS->SQD
// entry. On this hardware SQD is unreachable, so SQD_RTS_QP always meets a QP in another state.
#pragma once

#include "mlx5/prm/opcodes.h"
#include "mlx5/prm/qp.h"

namespace melon::mlx5::prm {

// Bits of opt_param_mask (Linux qp.h MLX5_QP_OPTPAR_<name>).
#define MELON_PRM_QP_OPTPAR(V)  \
  V(ALT_ADDR_PATH, 1u << 0)     \
  V(RRE, 1u << 1)               \
  V(RAE, 1u << 2)               \
  V(RWE, 1u << 3)               \
  V(PKEY_INDEX, 1u << 4)        \
  V(Q_KEY, 1u << 5)             \
  V(RNR_TIMEOUT, 1u << 6)       \
  V(PRIMARY_ADDR_PATH, 1u << 7) \
  V(SRA_MAX, 1u << 8)           \
  V(RRA_MAX, 1u << 9)           \
  V(PM_STATE, 1u << 10)         \
  V(RETRY_COUNT, 1u << 12)      \
  V(RNR_RETRY, 1u << 13)        \
  V(ACK_TIMEOUT, 1u << 14)      \
  V(PRI_PORT, 1u << 16)         \
  V(SRQN, 1u << 18)             \
  V(CQN_RCV, 1u << 19)          \
  V(COUNTER_SET_ID, 1u << 25)
MELON_PRM_VALUES(qp_optpar, uint32_t, MELON_PRM_QP_OPTPAR)

// One field of the QP context, possibly inside the primary address path.
struct QpcField {
  const Field* f;
  bool in_path;
  constexpr uint32_t bit_off() const { return in_path ? qpc::primary_address_path.bit_off + f->bit_off : f->bit_off; }
};

// The context field each optional bit makes the firmware take (bits of one meaning share a row per
// field). Bits with no row here (alternate path, path migration, SRQN, CQN_RCV) are not modelled.
struct QpOptField {
  uint32_t bit;  // qp_optpar
  QpcField field;
};
inline constexpr QpOptField kQpOptFields[] = {
    {qp_optpar::RRE, {&qpc::rre, false}},
    {qp_optpar::RAE, {&qpc::rae, false}},
    {qp_optpar::RWE, {&qpc::rwe, false}},
    {qp_optpar::PKEY_INDEX, {&ads::pkey_index, true}},
    {qp_optpar::Q_KEY, {&qpc::q_key, false}},
    {qp_optpar::RNR_TIMEOUT, {&qpc::min_rnr_nak, false}},
    {qp_optpar::SRA_MAX, {&qpc::log_sra_max, false}},
    {qp_optpar::RRA_MAX, {&qpc::log_rra_max, false}},
    {qp_optpar::RETRY_COUNT, {&qpc::retry_count, false}},
    {qp_optpar::RNR_RETRY, {&qpc::rnr_retry, false}},
    {qp_optpar::ACK_TIMEOUT, {&ads::ack_timeout, true}},
    {qp_optpar::PRI_PORT, {&ads::vhca_port_num, true}},
    {qp_optpar::COUNTER_SET_ID, {&qpc::counter_set_id, false}},
};

// The optional bits that have a field above.
inline constexpr uint32_t qp_opt_bits_with_fields() {
  uint32_t m = 0;
  for (const QpOptField& f : kQpOptFields) m |= f.bit;
  return m;
}

// Fields a transition always takes (IBA 11.2.5 required attributes).
inline constexpr QpcField kRst2InitFields[] = {
    {&qpc::rre, false},
    {&qpc::rwe, false},
    {&qpc::rae, false},
    {&ads::pkey_index, true},
    {&ads::vhca_port_num, true},
    {&qpc::q_key, false},
    {&qpc::counter_set_id, false},
};
inline constexpr QpcField kInit2RtrFields[] = {
    {&qpc::mtu, false},         {&qpc::log_msg_max, false}, {&qpc::remote_qpn, false}, {&qpc::next_rcv_psn, false},
    {&qpc::log_rra_max, false}, {&qpc::min_rnr_nak, false}, {&ads::grh, true},         {&ads::src_addr_index, true},
    {&ads::hop_limit, true},    {&ads::tclass, true},       {&ads::flow_label, true},  {&ads::rgid_rip, true},
    {&ads::udp_sport, true},    {&ads::dscp, true},         {&ads::eth_prio, true},    {&ads::rmac_47_32, true},
    {&ads::rmac_31_0, true},    {&ads::sl, true},           {&ads::stat_rate, true},
};
inline constexpr QpcField kRtr2RtsFields[] = {
    {&qpc::next_send_psn, false}, {&qpc::retry_count, false}, {&qpc::rnr_retry, false},
    {&qpc::log_sra_max, false},   {&ads::ack_timeout, true},
};

// Optional bits a transition accepts, by service type (Linux mlx5_ib opt_mask). COUNTER_SET_ID is
// accepted on every transition with a context: a Q counter may be bound at any of them.
struct QpTransitionRule {
  uint16_t opcode;
  uint8_t from;  // qpc_state; 0xff: any state
  uint8_t to;
  uint32_t opt_rc, opt_uc, opt_ud;
  const QpcField* fields;
  uint32_t nfields;
  uint32_t allowed_opt(uint8_t st) const {
    return st == qpc_st::RC ? opt_rc : st == qpc_st::UC ? opt_uc : qpc_st_datagram(st) ? opt_ud : 0;
  }
};
inline constexpr uint8_t kQpAnyState = 0xff;
namespace qp_modify_detail {
using o = qp_optpar::Value;
inline constexpr uint32_t kCnt = o::COUNTER_SET_ID;
inline constexpr uint32_t kRcAccess = o::RRE | o::RAE | o::RWE;
inline constexpr uint32_t kSqToRtsRc = o::RNR_TIMEOUT | kRcAccess | kCnt;  // SQER->RTS and SQD->RTS
}  // namespace qp_modify_detail
inline constexpr QpTransitionRule kQpTransitions[] = {
#define MELON_QP_FIELDS(a) a, uint32_t(sizeof(a) / sizeof(a[0]))
    {opcode::RST2INIT_QP, qpc_state::RST, qpc_state::INIT, qp_modify_detail::kCnt, qp_modify_detail::kCnt,
     qp_modify_detail::kCnt, MELON_QP_FIELDS(kRst2InitFields)},
    {opcode::INIT2INIT_QP, qpc_state::INIT, qpc_state::INIT,
     qp_modify_detail::kRcAccess | qp_optpar::PKEY_INDEX | qp_optpar::PRI_PORT | qp_modify_detail::kCnt,
     qp_optpar::RWE | qp_optpar::PKEY_INDEX | qp_optpar::PRI_PORT | qp_modify_detail::kCnt,
     qp_optpar::PKEY_INDEX | qp_optpar::Q_KEY | qp_optpar::PRI_PORT | qp_modify_detail::kCnt, nullptr, 0},
    {opcode::INIT2RTR_QP, qpc_state::INIT, qpc_state::RTR,
     qp_optpar::ALT_ADDR_PATH | qp_modify_detail::kRcAccess | qp_optpar::PKEY_INDEX | qp_modify_detail::kCnt,
     qp_optpar::ALT_ADDR_PATH | qp_optpar::RWE | qp_optpar::PKEY_INDEX | qp_modify_detail::kCnt,
     qp_optpar::PKEY_INDEX | qp_optpar::Q_KEY | qp_modify_detail::kCnt, MELON_QP_FIELDS(kInit2RtrFields)},
    {opcode::RTR2RTS_QP, qpc_state::RTR, qpc_state::RTS,
     qp_optpar::ALT_ADDR_PATH | qp_modify_detail::kRcAccess | qp_optpar::PM_STATE | qp_optpar::RNR_TIMEOUT |
         qp_modify_detail::kCnt,
     qp_optpar::ALT_ADDR_PATH | qp_optpar::RWE | qp_optpar::PM_STATE | qp_modify_detail::kCnt,
     qp_optpar::Q_KEY | qp_modify_detail::kCnt, MELON_QP_FIELDS(kRtr2RtsFields)},
    {opcode::RTS2RTS_QP, qpc_state::RTS, qpc_state::RTS,
     qp_modify_detail::kRcAccess | qp_optpar::RNR_TIMEOUT | qp_optpar::PM_STATE | qp_optpar::ALT_ADDR_PATH |
         qp_modify_detail::kCnt,
     qp_optpar::RWE | qp_optpar::PM_STATE | qp_optpar::ALT_ADDR_PATH | qp_modify_detail::kCnt,
     qp_optpar::Q_KEY | qp_optpar::SRQN | qp_optpar::CQN_RCV | qp_modify_detail::kCnt, nullptr, 0},
    {opcode::SQERR2RTS_QP, qpc_state::SQER, qpc_state::RTS, qp_modify_detail::kSqToRtsRc,
     qp_optpar::RWE | qp_modify_detail::kCnt, qp_optpar::Q_KEY | qp_modify_detail::kCnt, nullptr, 0},
    {opcode::SQD_RTS_QP, qpc_state::SQD, qpc_state::RTS, qp_modify_detail::kSqToRtsRc,
     qp_optpar::RWE | qp_modify_detail::kCnt, qp_optpar::Q_KEY | qp_modify_detail::kCnt, nullptr, 0},
    {opcode::QP_2ERR, kQpAnyState, qpc_state::ERR, 0, 0, 0, nullptr, 0},
    {opcode::QP_2RST, kQpAnyState, qpc_state::RST, 0, 0, 0, nullptr, 0},
#undef MELON_QP_FIELDS
};

inline const QpTransitionRule* qp_transition(uint16_t op) {
  for (const QpTransitionRule& r : kQpTransitions)
    if (r.opcode == op) return &r;
  return nullptr;
}

// Whether the transition always takes the context field `f` (so no optional bit is needed for it).
inline bool qp_transition_takes(const QpTransitionRule& r, const QpcField& f) {
  for (uint32_t i = 0; i < r.nfields; ++i)
    if (r.fields[i].f == f.f && r.fields[i].in_path == f.in_path) return true;
  return false;
}

}  // namespace melon::mlx5::prm
