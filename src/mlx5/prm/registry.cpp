// The lists behind registry.h. Adding a structure, value set or command to this folder means
// adding one line here; the oracle test then checks it against mlx5_ifc.h / mlx5dv.h.
#include "mlx5/prm/registry.h"

#include "mlx5/prm/prm.h"

namespace melon::mlx5::prm {
namespace {

const Layout* const kLayouts[] = {
    &access_register_in::layout,
    &access_register_out::layout,
    &paos_reg::layout,
    &ptys_reg::layout,
    &pmtu_reg::layout,
    &eth_802_3_cntrs_grp_data_layout::layout,
    &ppcnt_reg::layout,
    &register_host_endianness::layout,
    &umem::layout,
    &create_umem_in::layout,
    &create_umem_out::layout,
    &destroy_umem_in::layout,
    &destroy_umem_out::layout,
    &cmd_queue_entry::layout,
    &cmd_if_box::layout,
    &cmd_in::layout,
    &cmd_out::layout,
    &cqc::layout,
    &create_cq_in::layout,
    &create_cq_out::layout,
    &destroy_cq_in::layout,
    &destroy_cq_out::layout,
    &query_cq_in::layout,
    &query_cq_out::layout,
    &modify_cq_in::layout,
    &modify_cq_out::layout,
    &cqe64::layout,
    &err_cqe::layout,
    &qp_dbrec::layout,
    &cq_dbrec::layout,
    &cq_uar_db::layout,
    &eq_uar_db::layout,
    &eqc::layout,
    &create_eq_in::layout,
    &create_eq_out::layout,
    &destroy_eq_in::layout,
    &destroy_eq_out::layout,
    &query_eq_in::layout,
    &query_eq_out::layout,
    &cmd_inter_comp_event::layout,
    &pages_req_event::layout,
    &comp_event::layout,
    &qp_events::layout,
    &cq_error::layout,
    &port_state_change_event::layout,
    &eqe::layout,
    &enable_hca_in::layout,
    &enable_hca_out::layout,
    &disable_hca_in::layout,
    &disable_hca_out::layout,
    &query_issi_in::layout,
    &query_issi_out::layout,
    &set_issi_in::layout,
    &set_issi_out::layout,
    &query_pages_in::layout,
    &query_pages_out::layout,
    &manage_pages_in::layout,
    &manage_pages_out::layout,
    &cmd_hca_cap::layout,
    &roce_cap::layout,
    &query_hca_cap_in::layout,
    &query_hca_cap_out::layout,
    &set_hca_cap_in::layout,
    &set_hca_cap_out::layout,
    &init_hca_in::layout,
    &init_hca_out::layout,
    &teardown_hca_in::layout,
    &teardown_hca_out::layout,
    &nop_in::layout,
    &nop_out::layout,
    &query_adapter_param_block::layout,
    &query_adapter_in::layout,
    &query_adapter_out::layout,
    &health_buffer::layout,
    &initial_seg::layout,
    &cmd_pas::layout,
    &mtt::layout,
    &mkc::layout,
    &create_mkey_in::layout,
    &create_mkey_out::layout,
    &destroy_mkey_in::layout,
    &destroy_mkey_out::layout,
    &query_mkey_in::layout,
    &query_mkey_out::layout,
    &klm::layout,
    &ads::layout,
    &qpc::layout,
    &create_qp_in::layout,
    &create_qp_out::layout,
    &destroy_qp_in::layout,
    &destroy_qp_out::layout,
    &query_qp_in::layout,
    &query_qp_out::layout,
    &rst2init_qp_in::layout,
    &rst2init_qp_out::layout,
    &init2init_qp_in::layout,
    &init2init_qp_out::layout,
    &init2rtr_qp_in::layout,
    &init2rtr_qp_out::layout,
    &rtr2rts_qp_in::layout,
    &rtr2rts_qp_out::layout,
    &rts2rts_qp_in::layout,
    &rts2rts_qp_out::layout,
    &sqerr2rts_qp_in::layout,
    &sqerr2rts_qp_out::layout,
    &sqd2rts_qp_in::layout,
    &sqd2rts_qp_out::layout,
    &qp_2err_in::layout,
    &qp_2err_out::layout,
    &qp_2rst_in::layout,
    &qp_2rst_out::layout,
    &alloc_uar_in::layout,
    &alloc_uar_out::layout,
    &dealloc_uar_in::layout,
    &dealloc_uar_out::layout,
    &alloc_pd_in::layout,
    &alloc_pd_out::layout,
    &dealloc_pd_in::layout,
    &dealloc_pd_out::layout,
    &alloc_transport_domain_in::layout,
    &alloc_transport_domain_out::layout,
    &dealloc_transport_domain_in::layout,
    &dealloc_transport_domain_out::layout,
    &alloc_q_counter_in::layout,
    &alloc_q_counter_out::layout,
    &dealloc_q_counter_in::layout,
    &dealloc_q_counter_out::layout,
    &query_q_counter_in::layout,
    &query_q_counter_out::layout,
    &srqc::layout,
    &wq::layout,
    &rmpc::layout,
    &create_srq_in::layout,
    &create_srq_out::layout,
    &destroy_srq_in::layout,
    &destroy_srq_out::layout,
    &query_srq_in::layout,
    &query_srq_out::layout,
    &arm_rq_in::layout,
    &arm_rq_out::layout,
    &create_rmp_in::layout,
    &create_rmp_out::layout,
    &destroy_rmp_in::layout,
    &destroy_rmp_out::layout,
    &query_rmp_in::layout,
    &query_rmp_out::layout,
    &roce_addr_layout::layout,
    &set_roce_address_in::layout,
    &set_roce_address_out::layout,
    &query_roce_address_in::layout,
    &query_roce_address_out::layout,
    &query_vport_state_in::layout,
    &query_vport_state_out::layout,
    &nic_vport_context::layout,
    &modify_nic_vport_field_select::layout,
    &query_nic_vport_context_in::layout,
    &query_nic_vport_context_out::layout,
    &modify_nic_vport_context_in::layout,
    &modify_nic_vport_context_out::layout,
    &wqe_ctrl_seg::layout,
    &wqe_raddr_seg::layout,
    &wqe_atomic_seg::layout,
    &wqe_data_seg::layout,
    &wqe_inline_seg::layout,
    &wqe_datagram_seg::layout,
};

const ConstantSet* const kConstantSets[] = {
    &reg_id::set,
    &access_reg_op_mod::set,
    &delivery_status::set,
    &cmd_status::set,
    &cqc_status::set,
    &cqc_cqe_sz::set,
    &cqc_st::set,
    &cq_modify::set,
    &modify_cq_op_mod::set,
    &cq_resize_select::set,
    &cqe_opcode::set,
    &cqe_syndrome::set,
    &eqc_status::set,
    &eqc_st::set,
    &event_type::set,
    &port_change_subtype::set,
    &cq_error_syndrome::set,
    &qp_optpar::set,
    &cap_type::set,
    &cap_mode::set,
    &query_pages_op_mod::set,
    &manage_pages_op_mod::set,
    &teardown_profile::set,
    &health_syndrome::set,
    &nic_interface::set,
    &mkc_access_mode::set,
    &opcode::set,
    &qpc_state::set,
    &qpc_st::set,
    &qpc_pm_state::set,
    &qpc_mtu::set,
    &qpc_atomic_mode::set,
    &srqc_state::set,
    &rmpc_state::set,
    &wq_type::set,
    &roce_l3_type::set,
    &roce_version::set,
    &vport_state::set,
    &wqe_opcode::set,
    &wqe_ctrl_flag::set,
};

#define MELON_PRM_COMMAND_LIST(C)                       \
  C(ENABLE_HCA, enable_hca)                             \
  C(DISABLE_HCA, disable_hca)                           \
  C(QUERY_ISSI, query_issi)                             \
  C(SET_ISSI, set_issi)                                 \
  C(QUERY_PAGES, query_pages)                           \
  C(MANAGE_PAGES, manage_pages)                         \
  C(QUERY_HCA_CAP, query_hca_cap)                       \
  C(SET_HCA_CAP, set_hca_cap)                           \
  C(INIT_HCA, init_hca)                                 \
  C(TEARDOWN_HCA, teardown_hca)                         \
  C(NOP, nop)                                           \
  C(QUERY_ADAPTER, query_adapter)                       \
  C(ALLOC_UAR, alloc_uar)                               \
  C(DEALLOC_UAR, dealloc_uar)                           \
  C(ALLOC_PD, alloc_pd)                                 \
  C(DEALLOC_PD, dealloc_pd)                             \
  C(ALLOC_TRANSPORT_DOMAIN, alloc_transport_domain)     \
  C(DEALLOC_TRANSPORT_DOMAIN, dealloc_transport_domain) \
  C(CREATE_EQ, create_eq)                               \
  C(DESTROY_EQ, destroy_eq)                             \
  C(QUERY_EQ, query_eq)                                 \
  C(CREATE_CQ, create_cq)                               \
  C(DESTROY_CQ, destroy_cq)                             \
  C(QUERY_CQ, query_cq)                                 \
  C(MODIFY_CQ, modify_cq)                               \
  C(CREATE_MKEY, create_mkey)                           \
  C(DESTROY_MKEY, destroy_mkey)                         \
  C(QUERY_MKEY, query_mkey)                             \
  C(CREATE_QP, create_qp)                               \
  C(DESTROY_QP, destroy_qp)                             \
  C(QUERY_QP, query_qp)                                 \
  C(RST2INIT_QP, rst2init_qp)                           \
  C(INIT2INIT_QP, init2init_qp)                         \
  C(INIT2RTR_QP, init2rtr_qp)                           \
  C(RTR2RTS_QP, rtr2rts_qp)                             \
  C(RTS2RTS_QP, rts2rts_qp)                             \
  C(SQERR2RTS_QP, sqerr2rts_qp)                         \
  C(SQD_RTS_QP, sqd2rts_qp)                             \
  C(QP_2ERR, qp_2err)                                   \
  C(QP_2RST, qp_2rst)                                   \
  C(CREATE_SRQ, create_srq)                             \
  C(DESTROY_SRQ, destroy_srq)                           \
  C(QUERY_SRQ, query_srq)                               \
  C(ARM_RQ, arm_rq)                                     \
  C(CREATE_RMP, create_rmp)                             \
  C(DESTROY_RMP, destroy_rmp)                           \
  C(QUERY_RMP, query_rmp)                               \
  C(SET_ROCE_ADDRESS, set_roce_address)                 \
  C(QUERY_ROCE_ADDRESS, query_roce_address)             \
  C(QUERY_VPORT_STATE, query_vport_state)               \
  C(QUERY_NIC_VPORT_CONTEXT, query_nic_vport_context)   \
  C(MODIFY_NIC_VPORT_CONTEXT, modify_nic_vport_context) \
  C(ACCESS_REG, access_register)                        \
  C(ALLOC_Q_COUNTER, alloc_q_counter)                   \
  C(DEALLOC_Q_COUNTER, dealloc_q_counter)               \
  C(QUERY_Q_COUNTER, query_q_counter)                   \
  C(CREATE_UMEM, create_umem)                           \
  C(DESTROY_UMEM, destroy_umem)

#define MELON_PRM_COMMAND_ROW(op, s) {opcode::op, #op, &s##_in::layout, &s##_out::layout},
const Command kCommands[] = {MELON_PRM_COMMAND_LIST(MELON_PRM_COMMAND_ROW)};
#undef MELON_PRM_COMMAND_ROW

}  // namespace

LayoutList all_layouts() { return {kLayouts, uint32_t(sizeof(kLayouts) / sizeof(kLayouts[0]))}; }
ConstantSetList all_constant_sets() {
  return {kConstantSets, uint32_t(sizeof(kConstantSets) / sizeof(kConstantSets[0]))};
}
CommandList all_commands() { return {kCommands, uint32_t(sizeof(kCommands) / sizeof(kCommands[0]))}; }

const Layout* find_layout(const char* name) {
  for (const Layout* l : kLayouts)
    if (strcmp(l->name, name) == 0) return l;
  return nullptr;
}

const Field* find_field(const Layout& layout, const char* name) {
  for (uint32_t i = 0; i < layout.count; ++i)
    if (strcmp(layout.fields[i].name, name) == 0) return &layout.fields[i];
  return nullptr;
}

const Command* find_command(uint16_t op) {
  for (const Command& c : kCommands)
    if (c.opcode == op) return &c;
  return nullptr;
}

const char* opcode_name(uint16_t op) {
  const char* n = opcode::name_of(op);
  return n ? n : "UNKNOWN";
}

}  // namespace melon::mlx5::prm
