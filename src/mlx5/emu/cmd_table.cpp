// Every command of src/mlx5/prm, with what the firmware checks before it runs one: the opcode, the
// input and output lengths against the PRM layouts, the op_mod, reserved bits of the fixed part,
// and the life-cycle stage (PRM "Command Interface"; the stage order is Linux main.c's).
#include <string.h>

#include <map>
#include <vector>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {

enum class Gate : uint8_t {
  kReady,  // firmware up (ENABLE_HCA)
  kEnabled,  // after ENABLE_HCA
  kBootPages,  // after ENABLE_HCA with boot pages given
  kInitialized,  // after INIT_HCA
};

using Fn = CmdStatus (Hca::*)(Cmd&);
struct Entry {
  uint16_t opcode;
  Gate gate;
  uint32_t op_mods;  // bit n set: op_mod n is valid; 0: the handler checks op_mod itself
  Fn fn;
  // Shortest input taken, when a command's layout grew after the first firmware: older drivers send
  // the older, shorter input and firmware reads the fields they leave out as zero. 0: the layout.
  uint16_t min_in_bytes = 0;
};

constexpr uint32_t m(uint32_t v) { return 1u << v; }
namespace op = prm::opcode;

const Entry kTable[] = {
    {op::ENABLE_HCA, Gate::kReady, m(0), &Hca::enable_hca},
    {op::DISABLE_HCA, Gate::kEnabled, m(0), &Hca::disable_hca},
    {op::QUERY_ISSI, Gate::kEnabled, m(0), &Hca::query_issi},
    {op::SET_ISSI, Gate::kEnabled, m(0), &Hca::set_issi},
    {op::QUERY_PAGES, Gate::kEnabled, m(1) | m(2) | m(3), &Hca::query_pages},
    {op::MANAGE_PAGES, Gate::kEnabled, m(0) | m(1) | m(2), &Hca::manage_pages},
    {op::QUERY_HCA_CAP, Gate::kBootPages, 0, &Hca::query_hca_cap},
    {op::SET_HCA_CAP, Gate::kBootPages, 0, &Hca::set_hca_cap},
    // INIT_HCA gained sw_vhca_id and sw_owner_id (mlx5_ifc.h: 32 bytes); rdma-core v44's mlx5_vfio
    // and Linux before SW steering send the original 16 bytes.
    {op::INIT_HCA, Gate::kBootPages, m(0), &Hca::init_hca, 16},
    {op::TEARDOWN_HCA, Gate::kInitialized, m(0), &Hca::teardown_hca},
    {op::NOP, Gate::kEnabled, m(0), &Hca::nop},
    {op::QUERY_ADAPTER, Gate::kEnabled, m(0), &Hca::query_adapter},
    {op::ALLOC_UAR, Gate::kInitialized, m(0), &Hca::alloc_uar},
    {op::DEALLOC_UAR, Gate::kInitialized, m(0), &Hca::dealloc_uar},
    {op::ALLOC_PD, Gate::kInitialized, m(0), &Hca::alloc_pd},
    {op::DEALLOC_PD, Gate::kInitialized, m(0), &Hca::dealloc_pd},
    {op::ALLOC_TRANSPORT_DOMAIN, Gate::kInitialized, m(0), &Hca::alloc_td},
    {op::DEALLOC_TRANSPORT_DOMAIN, Gate::kInitialized, m(0), &Hca::dealloc_td},
    {op::ALLOC_Q_COUNTER, Gate::kInitialized, m(0), &Hca::alloc_q_counter},
    {op::DEALLOC_Q_COUNTER, Gate::kInitialized, m(0), &Hca::dealloc_q_counter},
    {op::QUERY_Q_COUNTER, Gate::kInitialized, m(0), &Hca::query_q_counter},
    {op::CREATE_UMEM, Gate::kInitialized, m(0), &Hca::create_umem},
    {op::DESTROY_UMEM, Gate::kInitialized, m(0), &Hca::destroy_umem},
    {op::CREATE_EQ, Gate::kInitialized, m(0), &Hca::create_eq},
    {op::DESTROY_EQ, Gate::kInitialized, m(0), &Hca::destroy_eq},
    {op::QUERY_EQ, Gate::kInitialized, m(0), &Hca::query_eq},
    {op::CREATE_CQ, Gate::kInitialized, m(0), &Hca::create_cq},
    {op::DESTROY_CQ, Gate::kInitialized, m(0), &Hca::destroy_cq},
    {op::QUERY_CQ, Gate::kInitialized, m(0), &Hca::query_cq},
    {op::MODIFY_CQ, Gate::kInitialized, m(0) | m(1), &Hca::modify_cq},
    {op::CREATE_MKEY, Gate::kInitialized, m(0), &Hca::create_mkey},
    {op::DESTROY_MKEY, Gate::kInitialized, m(0), &Hca::destroy_mkey},
    {op::QUERY_MKEY, Gate::kInitialized, m(0), &Hca::query_mkey},
    {op::CREATE_QP, Gate::kInitialized, m(0), &Hca::create_qp},
    {op::DESTROY_QP, Gate::kInitialized, m(0), &Hca::destroy_qp},
    {op::QUERY_QP, Gate::kInitialized, m(0), &Hca::query_qp},
    {op::RST2INIT_QP, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::INIT2INIT_QP, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::INIT2RTR_QP, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::RTR2RTS_QP, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::RTS2RTS_QP, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::SQERR2RTS_QP, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::SQD_RTS_QP, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::QP_2ERR, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::QP_2RST, Gate::kInitialized, m(0), &Hca::modify_qp},
    {op::CREATE_SRQ, Gate::kInitialized, m(0), &Hca::create_srq},
    {op::DESTROY_SRQ, Gate::kInitialized, m(0), &Hca::destroy_srq},
    {op::QUERY_SRQ, Gate::kInitialized, m(0), &Hca::query_srq},
    {op::ARM_RQ, Gate::kInitialized, m(prm::kArmRqOpModSrq), &Hca::arm_rq},
    {op::CREATE_RMP, Gate::kInitialized, m(0), &Hca::create_rmp},
    {op::DESTROY_RMP, Gate::kInitialized, m(0), &Hca::destroy_rmp},
    {op::QUERY_RMP, Gate::kInitialized, m(0), &Hca::query_rmp},
    {op::SET_ROCE_ADDRESS, Gate::kInitialized, m(0), &Hca::set_roce_address},
    {op::QUERY_ROCE_ADDRESS, Gate::kInitialized, m(0), &Hca::query_roce_address},
    {op::QUERY_VPORT_STATE, Gate::kEnabled, m(0), &Hca::query_vport_state},
    {op::QUERY_NIC_VPORT_CONTEXT, Gate::kEnabled, m(0), &Hca::query_nic_vport_context},
    {op::MODIFY_NIC_VPORT_CONTEXT, Gate::kEnabled, m(0), &Hca::modify_nic_vport_context},
    {op::ACCESS_REG, Gate::kEnabled, m(0) | m(1), &Hca::access_register},
};

const Entry* find(uint16_t opcode) {
  for (const Entry& e : kTable)
    if (e.opcode == opcode) return &e;
  return nullptr;
}

// Bits of a layout's fixed part that no top-level field covers: firmware requires them zero.
// Embedded structures count as covered (their own reserved bits are not checked).
const std::vector<uint8_t>& reserved_mask(const prm::Layout& l) {
  static std::map<const prm::Layout*, std::vector<uint8_t>> cache;
  auto it = cache.find(&l);
  if (it != cache.end()) return it->second;
  std::vector<uint8_t> mask(l.size_bytes(), 0xff);
  for (uint32_t i = 0; i < l.count; ++i) {
    const prm::Field& f = l.fields[i];
    uint32_t end = f.flexible() ? l.size_bits : f.bit_off + f.bit_width;
    for (uint32_t b = f.bit_off; b < end && b < l.size_bits; ++b) mask[b / 8] &= uint8_t(~(0x80u >> (b % 8)));
  }
  return cache.emplace(&l, std::move(mask)).first->second;
}

bool reserved_clear(const prm::Layout& l, const uint8_t* in) {
  const std::vector<uint8_t>& mask = reserved_mask(l);
  for (size_t i = 0; i < mask.size(); ++i)
    if (in[i] & mask[i]) return false;
  return true;
}

}  // namespace

CmdStatus Hca::dispatch(Cmd& c) {
  using S = prm::cmd_status::Value;
  const prm::Command* cmd = prm::find_command(c.opcode);
  const Entry* e = find(c.opcode);
  if (!cmd || !e) return fail(S::BAD_OP_ERR, synd::UNKNOWN_OPCODE);
  if (faults_.bad_status && (faults_.bad_status_opcode == 0 || faults_.bad_status_opcode == c.opcode)) {
    CmdStatus injected{faults_.bad_status, faults_.bad_status_syndrome};
    faults_.bad_status = 0;  // one-shot
    return injected;
  }
  thread_local std::vector<uint8_t> padded;
  if (c.in_len < cmd->in->size_bytes()) {
    if (!e->min_in_bytes || c.in_len < e->min_in_bytes) return fail(S::BAD_INP_LEN_ERR, synd::INPUT_TOO_SHORT);
    padded.assign(cmd->in->size_bytes(), 0);  // the fields an older driver leaves out read as zero
    memcpy(padded.data(), c.in, c.in_len);
    c.in = padded.data();
    c.in_len = uint32_t(padded.size());
  }
  if (c.out_len < cmd->out->size_bytes()) return fail(S::BAD_OUTP_LEN_ERR, synd::OUTPUT_TOO_SHORT);
  if (e->op_mods && (c.op_mod >= 32 || !(e->op_mods & m(c.op_mod)))) return fail(S::BAD_PARAM_ERR, synd::BAD_OP_MOD);
  if (!reserved_clear(*cmd->in, c.in)) return fail(S::BAD_PARAM_ERR, synd::RESERVED_NOT_ZERO);
  if (const prm::Field* uid = prm::find_field(*cmd->in, "uid"); uid && prm::get(c.in, *uid) != 0)
    return fail(S::BAD_PARAM_ERR, synd::UID_NOT_SUPPORTED);  // no DEVX user contexts on this model
  switch (e->gate) {
    case Gate::kReady: break;
    case Gate::kEnabled:
      if (state_ < FwState::kEnabled) return fail(S::BAD_SYS_STATE_ERR, synd::HCA_NOT_ENABLED);
      break;
    case Gate::kBootPages:
      if (state_ < FwState::kEnabled) return fail(S::BAD_SYS_STATE_ERR, synd::HCA_NOT_ENABLED);
      if (!boot_pages_done_) return fail(S::BAD_SYS_STATE_ERR, synd::BOOT_PAGES_MISSING);
      break;
    case Gate::kInitialized:
      if (state_ != FwState::kInitialized) return fail(S::BAD_SYS_STATE_ERR, synd::HCA_NOT_INITIALIZED);
      break;
  }
  return (this->*(e->fn))(c);
}

}  // namespace melon::mlx5::emu
