// Commands, events and the command transport, encoded with realistic values and decoded back.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "mlx5/prm/prm.h"

namespace prm = melon::mlx5::prm;
using Bytes = std::vector<uint8_t>;

namespace {

// A value for a field that differs from field to field and fits its width.
uint64_t pattern(const prm::Layout& l, const prm::Field& f, uint32_t salt) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (const char* p = f.name; *p; ++p) h = (h ^ uint8_t(*p)) * 1099511628211ull;
  for (const char* p = l.name; *p; ++p) h = (h ^ uint8_t(*p)) * 1099511628211ull;
  h |= 1;  // never zero, so a field that reads back 0 was lost
  return f.bit_width >= 64 ? h : (h & ((uint64_t(1) << f.bit_width) - 1)) | 1;
}

// Writes every scalar field of `l` (recursing into embedded structures), then reads each back:
// any overlap between fields or accessor error shows up as a mismatch.
void fill(const prm::Layout& l, uint8_t* base, uint32_t salt) {
  for (uint32_t i = 0; i < l.count; ++i) {
    const prm::Field& f = l.fields[i];
    if (f.sub) {
      fill(*f.sub, base + f.byte_off(), salt);
    } else if (f.bit_width > 0 && f.bit_width <= 64) {
      prm::set(base, f, pattern(l, f, salt));
    } else if (f.bit_width > 64) {
      for (uint32_t b = 0; b < f.byte_len(); ++b) base[f.byte_off() + b] = uint8_t(pattern(l, f, salt) + b);
    }
  }
}
void check(const prm::Layout& l, const uint8_t* base, uint32_t salt, const std::string& path) {
  for (uint32_t i = 0; i < l.count; ++i) {
    const prm::Field& f = l.fields[i];
    const std::string where = path + "." + f.name;
    if (f.sub) {
      check(*f.sub, base + f.byte_off(), salt, where);
    } else if (f.bit_width > 0 && f.bit_width <= 64) {
      EXPECT_EQ(prm::get(base, f), pattern(l, f, salt)) << where;
    } else if (f.bit_width > 64) {
      for (uint32_t b = 0; b < f.byte_len(); ++b)
        ASSERT_EQ(base[f.byte_off() + b], uint8_t(pattern(l, f, salt) + b)) << where;
    }
  }
}

TEST(PrmCommands, EveryFieldOfEveryStructureRoundTripsWithoutDisturbingOthers) {
  auto list = prm::all_layouts();
  for (uint32_t i = 0; i < list.count; ++i) {
    const prm::Layout& l = *list.items[i];
    Bytes buf(l.size_bytes());
    fill(l, buf.data(), 7);
    check(l, buf.data(), 7, l.name);
  }
}

TEST(PrmCommands, EveryCommandEncodesItsHeaderAndDecodesItsResult) {
  auto cmds = prm::all_commands();
  ASSERT_GE(cmds.count, 55u);
  for (uint32_t i = 0; i < cmds.count; ++i) {
    const prm::Command& c = cmds.items[i];
    Bytes in(c.in->size_bytes()), out(c.out->size_bytes());
    prm::cmd_set_header(in.data(), c.opcode, 0x1);
    EXPECT_EQ(prm::cmd_opcode(in.data()), c.opcode) << c.name;
    EXPECT_EQ(prm::cmd_op_mod(in.data()), 0x1) << c.name;
    EXPECT_EQ(in[0], c.opcode >> 8) << c.name;  // big-endian on the wire
    EXPECT_EQ(in[1], c.opcode & 0xff) << c.name;
    prm::cmd_set_result(out.data(), prm::cmd_status::BAD_PARAM_ERR, 0x1234abcd);
    EXPECT_EQ(prm::cmd_status_of(out.data()), prm::cmd_status::BAD_PARAM_ERR) << c.name;
    EXPECT_EQ(prm::cmd_syndrome_of(out.data()), 0x1234abcdu) << c.name;
    // Inputs and outputs are whole dwords and at least the 16-byte inline area of a queue entry
    // when they carry anything beyond the header.
    EXPECT_EQ(c.in->size_bits % 32, 0u) << c.name;
    EXPECT_GE(c.out->size_bytes(), 8u) << c.name;
  }
}

TEST(PrmCommands, QueryHcaCapAnswerDecodesIntoTheGeneralCapabilityPage) {
  Bytes out(prm::query_hca_cap_out::size_bytes);
  prm::query_hca_cap_out::view o(out.data());
  prm::cmd_set_result(out.data(), prm::cmd_status::OK, 0);
  // The capability page is a union in the PRM: view the bytes as the page that was asked for.
  prm::cmd_hca_cap::view cap(o.bytes(prm::query_hca_cap_out::capability));
  cap.set(prm::cmd_hca_cap::log_max_qp, 17)
      .set(prm::cmd_hca_cap::log_max_cq, 24)
      .set(prm::cmd_hca_cap::port_type, prm::kPortTypeEth)
      .set(prm::cmd_hca_cap::roce, 1)
      .set(prm::cmd_hca_cap::num_ports, 1)
      .set(prm::cmd_hca_cap::log_bf_reg_size, 9)
      .set(prm::cmd_hca_cap::log_pg_sz, 12)
      .set(prm::cmd_hca_cap::cqe_version, 1)
      .set(prm::cmd_hca_cap::gid_table_size, 255);
  prm::cmd_hca_cap::cview r(out.data() + prm::query_hca_cap_out::capability.byte_off());
  EXPECT_EQ(r.get(prm::cmd_hca_cap::log_max_qp), 17u);
  EXPECT_EQ(r.get(prm::cmd_hca_cap::log_max_cq), 24u);
  EXPECT_EQ(r.get(prm::cmd_hca_cap::port_type), prm::kPortTypeEth);
  EXPECT_EQ(r.get(prm::cmd_hca_cap::roce), 1u);
  EXPECT_EQ(prm::bf_buffer_bytes(uint32_t(r.get(prm::cmd_hca_cap::log_bf_reg_size))), 256u);
  EXPECT_EQ(r.get(prm::cmd_hca_cap::gid_table_size), 255u);
  // The RoCE page answers in the same place.
  prm::roce_cap::view roce(o.bytes(prm::query_hca_cap_out::capability));
  roce.set(prm::roce_cap::roce_version, 0x3).set(prm::roce_cap::r_roce_dest_udp_port, 4791);
  EXPECT_EQ(prm::roce_cap::cview(roce).get(prm::roce_cap::r_roce_dest_udp_port), 4791u);
}

TEST(PrmCommands, SetHcaCapCarriesTheCapabilityPage) {
  Bytes in(prm::set_hca_cap_in::size_bytes);
  prm::cmd_set_header(in.data(), prm::opcode::SET_HCA_CAP, prm::cap_op_mod(prm::cap_type::GENERAL_DEVICE, 0));
  prm::set_hca_cap_in::view v(in.data());
  prm::cmd_hca_cap::view cap(v.bytes(prm::set_hca_cap_in::capability));
  cap.set(prm::cmd_hca_cap::pkey_table_size, 0)
      .set(prm::cmd_hca_cap::cmdif_checksum, 0)
      .set(prm::cmd_hca_cap::log_uar_page_sz, 0);
  cap.set(prm::cmd_hca_cap::uar_4k, 1);
  EXPECT_EQ(prm::cmd_op_mod(in.data()), 0u);
  EXPECT_EQ(prm::get(v.bytes(prm::set_hca_cap_in::capability), prm::cmd_hca_cap::uar_4k), 1u);
}

TEST(PrmCommands, QueryPagesAnswerIsASignedPageCount) {
  Bytes out(prm::query_pages_out::size_bytes);
  prm::query_pages_out::view o(out.data());
  o.set(prm::query_pages_out::num_pages, uint32_t(-8));  // negative: the HCA returns pages
  EXPECT_EQ(int32_t(o.get(prm::query_pages_out::num_pages)), -8);
  o.set(prm::query_pages_out::num_pages, 4096);
  EXPECT_EQ(int32_t(o.get(prm::query_pages_out::num_pages)), 4096);
}

TEST(PrmCommands, AllocCommandsReturnTheirHandles) {
  Bytes uar(prm::alloc_uar_out::size_bytes), pd(prm::alloc_pd_out::size_bytes),
      td(prm::alloc_transport_domain_out::size_bytes), qc(prm::alloc_q_counter_out::size_bytes);
  prm::alloc_uar_out::view(uar.data()).set(prm::alloc_uar_out::uar, 0x21);
  prm::alloc_pd_out::view(pd.data()).set(prm::alloc_pd_out::pd, 0x1234);
  prm::alloc_transport_domain_out::view(td.data()).set(prm::alloc_transport_domain_out::transport_domain, 0x77);
  prm::alloc_q_counter_out::view(qc.data()).set(prm::alloc_q_counter_out::counter_set_id, 3);
  EXPECT_EQ(prm::get(uar.data(), prm::alloc_uar_out::uar), 0x21u);
  EXPECT_EQ(prm::get(pd.data(), prm::alloc_pd_out::pd), 0x1234u);
  EXPECT_EQ(prm::get(td.data(), prm::alloc_transport_domain_out::transport_domain), 0x77u);
  EXPECT_EQ(prm::get(qc.data(), prm::alloc_q_counter_out::counter_set_id), 3u);
  EXPECT_EQ(pd[9], 0x00);
  EXPECT_EQ(pd[10], 0x12);
  EXPECT_EQ(pd[11], 0x34);
}

TEST(PrmCommands, CreateSrqAndArmIt) {
  Bytes in(prm::create_srq_in::size_bytes + 8);
  prm::create_srq_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::CREATE_SRQ, 0);
  v.at(prm::create_srq_in::srq_context_entry)
      .set(prm::srqc::log_srq_size, 10)
      .set(prm::srqc::log_rq_stride, 2)
      .set(prm::srqc::pd, 0x1234)
      .set(prm::srqc::cqn, 0x402)
      .set(prm::srqc::dbr_addr, 0x1000d000ull);
  prm::pas_set(v.elem(prm::create_srq_in::pas, 0), 0x60000000ull);
  prm::srqc::cview s(in.data() + prm::create_srq_in::srq_context_entry.byte_off());
  EXPECT_EQ(s.get(prm::srqc::log_srq_size), 10u);
  EXPECT_EQ(s.get(prm::srqc::pd), 0x1234u);
  EXPECT_EQ(s.get(prm::srqc::dbr_addr), 0x1000d000ull);
  EXPECT_EQ(prm::pas_pa(v.elem(prm::create_srq_in::pas, 0)), 0x60000000ull);

  Bytes arm(prm::arm_rq_in::size_bytes);
  prm::cmd_set_header(arm.data(), prm::opcode::ARM_RQ, prm::kArmRqOpModSrq);
  prm::arm_rq_in::view(arm.data()).set(prm::arm_rq_in::srq_number, 0x55).set(prm::arm_rq_in::lwm, 16);
  EXPECT_EQ(prm::get(arm.data(), prm::arm_rq_in::lwm), 16u);
}

TEST(PrmCommands, QpTransitionsShareOneShape) {
  // Every transition carries qpn, opt_param_mask and a qpc (2ERR/2RST carry only qpn).
  const prm::Layout* with_qpc[] = {&prm::rst2init_qp_in::layout, &prm::init2init_qp_in::layout,
                                   &prm::init2rtr_qp_in::layout, &prm::rtr2rts_qp_in::layout,
                                   &prm::rts2rts_qp_in::layout,  &prm::sqerr2rts_qp_in::layout};
  for (const prm::Layout* l : with_qpc) {
    const prm::Field* qpn = prm::find_field(*l, "qpn");
    const prm::Field* qpc = prm::find_field(*l, "qpc");
    ASSERT_TRUE(qpn && qpc) << l->name;
    EXPECT_EQ(qpn->bit_off, 72u) << l->name;
    EXPECT_EQ(qpc->bit_off, 192u) << l->name;
    EXPECT_EQ(qpc->sub, &prm::qpc::layout) << l->name;
  }
  EXPECT_EQ(prm::qp_2err_in::qpn.bit_off, 72u);
  EXPECT_EQ(prm::qp_2rst_in::qpn.bit_off, 72u);

  Bytes in(prm::rst2init_qp_in::size_bytes);
  prm::cmd_set_header(in.data(), prm::opcode::RST2INIT_QP, 0);
  prm::rst2init_qp_in::view v(in.data());
  v.set(prm::rst2init_qp_in::qpn, 0x123);
  v.at(prm::rst2init_qp_in::qpc)
      .set(prm::qpc::rre, 1)
      .set(prm::qpc::rwe, 1)
      .set(prm::qpc::rae, 1)
      .at(prm::qpc::primary_address_path)
      .set(prm::ads::vhca_port_num, 1)
      .set(prm::ads::pkey_index, 0);
  prm::qpc::cview q(in.data() + prm::rst2init_qp_in::qpc.byte_off());
  EXPECT_EQ(q.get(prm::qpc::rre) + q.get(prm::qpc::rwe) + q.get(prm::qpc::rae), 3u);
  EXPECT_EQ(q.at(prm::qpc::primary_address_path).get(prm::ads::vhca_port_num), 1u);
}

TEST(PrmCommands, QueryQpAnswerReportsState) {
  Bytes out(prm::query_qp_out::size_bytes);
  prm::query_qp_out::view o(out.data());
  o.at(prm::query_qp_out::qpc).set(prm::qpc::state, prm::qpc_state::RTS).set(prm::qpc::next_send_psn, 0x777);
  prm::qpc::cview q(out.data() + prm::query_qp_out::qpc.byte_off());
  EXPECT_STREQ(prm::qpc_state::name_of(uint32_t(q.get(prm::qpc::state))), "RTS");
  EXPECT_EQ(q.get(prm::qpc::next_send_psn), 0x777u);
}

TEST(PrmCommands, PortRegistersRoundTrip) {
  Bytes paos(prm::paos_reg::size_bytes), ptys(prm::ptys_reg::size_bytes), ppcnt(prm::ppcnt_reg::size_bytes);
  prm::paos_reg::view(paos.data())
      .set(prm::paos_reg::local_port, 1)
      .set(prm::paos_reg::admin_status, prm::kPortUp)
      .set(prm::paos_reg::ase, 1);
  EXPECT_EQ(prm::get(paos.data(), prm::paos_reg::admin_status), prm::kPortUp);
  prm::ptys_reg::view(ptys.data()).set(prm::ptys_reg::local_port, 1).set(prm::ptys_reg::proto_mask, prm::kPtysEth);
  EXPECT_EQ(prm::get(ptys.data(), prm::ptys_reg::proto_mask), prm::kPtysEth);
  prm::ppcnt_reg::view pc(ppcnt.data());
  pc.set(prm::ppcnt_reg::local_port, 1).set(prm::ppcnt_reg::grp, prm::kPpcntIeee8023Group);
  prm::eth_802_3_cntrs_grp_data_layout::view c(pc.bytes(prm::ppcnt_reg::counter_set));
  c.set(prm::eth_802_3_cntrs_grp_data_layout::a_frames_transmitted_ok_high, 1)
      .set(prm::eth_802_3_cntrs_grp_data_layout::a_frames_transmitted_ok_low, 2);
  EXPECT_EQ(prm::get_bits(c.data(), prm::eth_802_3_cntrs_grp_data_layout::a_frames_transmitted_ok_high.bit_off, 64),
            (1ull << 32) | 2);
}

TEST(PrmCommands, QueryVportStateAndNicVportContext) {
  Bytes out(prm::query_vport_state_out::size_bytes);
  prm::query_vport_state_out::view(out.data()).set(prm::query_vport_state_out::state, prm::vport_state::UP);
  EXPECT_STREQ(prm::vport_state::name_of(uint32_t(prm::get(out.data(), prm::query_vport_state_out::state))), "UP");

  Bytes q(prm::query_nic_vport_context_out::size_bytes);
  prm::query_nic_vport_context_out::view o(q.data());
  prm::nic_vport_context::view ctx = o.at(prm::query_nic_vport_context_out::nic_vport_context);
  ctx.set(prm::nic_vport_context::roce_en, 1).set(prm::nic_vport_context::mtu, 9000);
  const uint8_t mac[8] = {0, 0, 0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee};  // MAC in the low 6 bytes
  ctx.set_bytes(prm::nic_vport_context::permanent_address, mac);
  prm::nic_vport_context::cview r(ctx);
  EXPECT_EQ(r.get(prm::nic_vport_context::roce_en), 1u);
  EXPECT_EQ(r.get(prm::nic_vport_context::mtu), 9000u);
  EXPECT_EQ(memcmp(r.bytes(prm::nic_vport_context::permanent_address) + 2, mac + 2, 6), 0);
}

TEST(PrmCommands, CommandQueueEntryCarriesInlineDataAndMailboxes) {
  Bytes entry(prm::kCmdEntryBytes);
  prm::cmd_queue_entry::view e(entry.data());
  e.set(prm::cmd_queue_entry::type, prm::kCmdQueueEntryTypePcie)
      .set(prm::cmd_queue_entry::input_length, 0x110)
      .set(prm::cmd_queue_entry::output_length, 0x10)
      .set(prm::cmd_queue_entry::token, 0x5a)
      .set(prm::cmd_queue_entry::ownership, 1);
  prm::cmd_entry_set_in_mailbox(entry.data(), 0x0000001234567c00ull);
  prm::cmd_entry_set_out_mailbox(entry.data(), 0x0000001234568000ull);
  prm::cmd_set_header(e.bytes(prm::cmd_queue_entry::command_input_inline_data), prm::opcode::CREATE_QP, 0);
  EXPECT_EQ(prm::cmd_entry_in_mailbox(entry.data()), 0x0000001234567c00ull);
  EXPECT_EQ(prm::cmd_entry_out_mailbox(entry.data()), 0x0000001234568000ull);
  EXPECT_EQ(entry[16], 0x05);  // opcode 0x500 starts the inline input
  EXPECT_EQ(entry[17], 0x00);
  EXPECT_EQ(entry[63] & 1, 1);  // ownership: hardware's turn
  // Delivery status is 7 bits above the ownership bit.
  e.set(prm::cmd_queue_entry::status, prm::delivery_status::TOKEN_ERR).set(prm::cmd_queue_entry::ownership, 0);
  EXPECT_EQ(entry[63], prm::delivery_status::TOKEN_ERR << 1);
  EXPECT_STREQ(prm::delivery_status::name_of(uint32_t(e.get(prm::cmd_queue_entry::status))), "TOKEN_ERR");
}

TEST(PrmCommands, MailboxBlocksChain) {
  Bytes box(prm::cmd_if_box::size_bytes);
  prm::cmd_if_box::view b(box.data());
  prm::mailbox_set_next(box.data(), 0x00000abcdef01400ull);
  b.set(prm::cmd_if_box::block_number, 3).set(prm::cmd_if_box::token, 0x5a);
  b.bytes(prm::cmd_if_box::mailbox_data)[0] = 0xee;
  EXPECT_EQ(prm::mailbox_next(box.data()), 0x00000abcdef01400ull);
  EXPECT_EQ(prm::get(box.data(), prm::cmd_if_box::block_number), 3u);
  EXPECT_EQ(box[0], 0xee);
  EXPECT_EQ(prm::kMailboxDataBytes, 512u);
  EXPECT_EQ(prm::cmd_if_box::size_bytes, 576u);
  // Signatures: once filled in, the XOR of the covered bytes is 0xff.
  box[prm::cmd_if_box::signature.byte_off()] = 0;
  box[prm::cmd_if_box::signature.byte_off()] = uint8_t(~prm::xor8(box.data(), prm::cmd_if_box::size_bytes));
  EXPECT_EQ(prm::xor8(box.data(), prm::cmd_if_box::size_bytes), 0xff);
}

TEST(PrmCommands, InitSegmentAndHealthBufferDecode) {
  Bytes seg(prm::initial_seg::size_bytes);
  prm::initial_seg::view s(seg.data());
  s.set(prm::initial_seg::fw_rev_major, 14)
      .set(prm::initial_seg::fw_rev_minor, 32)
      .set(prm::initial_seg::fw_rev_subminor, 1010)
      .set(prm::initial_seg::cmd_interface_rev, 5)
      .set(prm::initial_seg::cmdq_phy_addr_63_32, 0x1)
      .set(prm::initial_seg::cmdq_phy_addr_31_12, 0x23456)
      .set(prm::initial_seg::nic_interface, prm::nic_interface::FULL_DRIVER)
      .set(prm::initial_seg::log_cmdq_size, 5)
      .set(prm::initial_seg::log_cmdq_stride, 6)
      .set(prm::initial_seg::initializing, 1)
      .set(prm::initial_seg::internal_timer_h, 0x1)
      .set(prm::initial_seg::internal_timer_l, 0x2)
      .set(prm::initial_seg::health_counter, 77);
  s.at(prm::initial_seg::health_buffer)
      .set(prm::health_buffer::synd, prm::health_syndrome::FW_CRC_ERR)
      .set(prm::health_buffer::severity, 2);
  // The driver reads these as big-endian dwords at fixed BAR0 offsets.
  auto dw = [&](uint32_t off) { return prm::get_bits(seg.data(), off * 8, 32); };
  EXPECT_EQ(dw(prm::init_seg_offset::fw_rev), (32u << 16) | 14u);
  EXPECT_EQ(dw(prm::init_seg_offset::cmdif_rev_fw_sub), (5u << 16) | 1010u);
  EXPECT_EQ(dw(prm::init_seg_offset::cmdq_addr_l_sz), 0x23456000u | (5u << 4) | 6u);
  EXPECT_EQ(dw(prm::init_seg_offset::initializing) >> 31, 1u);
  EXPECT_EQ(dw(prm::init_seg_offset::internal_timer_h), 1u);
  EXPECT_EQ(dw(prm::init_seg_offset::health_counter) & 0xffffff, 77u);
  prm::health_buffer::cview h(seg.data() + prm::init_seg_offset::health);
  EXPECT_STREQ(prm::health_syndrome::name_of(uint32_t(h.get(prm::health_buffer::synd))), "FW_CRC_ERR");
}

TEST(PrmEvents, PageRequestEqeDecodes) {
  Bytes eqe(prm::kEqeBytes);
  prm::eqe::view e(eqe.data());
  e.set(prm::eqe::event_type, prm::event_type::PAGE_REQUEST).set(prm::eqe::owner, 1);
  prm::pages_req_event::view(e.bytes(prm::eqe::event_data))
      .set(prm::pages_req_event::function_id, 0)
      .set(prm::pages_req_event::num_pages, uint32_t(-16));
  EXPECT_STREQ(prm::event_type::name_of(eqe[1]), "PAGE_REQUEST");
  prm::pages_req_event::cview p(eqe.data() + prm::eqe::event_data.byte_off());
  EXPECT_EQ(int32_t(p.get(prm::pages_req_event::num_pages)), -16);
  EXPECT_EQ(eqe[63] & 1, 1);
}

TEST(PrmEvents, CommandCompletionEqeCarriesTheVector) {
  Bytes eqe(prm::kEqeBytes);
  prm::eqe::view e(eqe.data());
  e.set(prm::eqe::event_type, prm::event_type::CMD);
  prm::cmd_inter_comp_event::view(e.bytes(prm::eqe::event_data))
      .set(prm::cmd_inter_comp_event::command_completion_vector, 0x5);
  EXPECT_EQ(
      prm::get(eqe.data() + prm::eqe::event_data.byte_off(), prm::cmd_inter_comp_event::command_completion_vector), 5u);
}

TEST(PrmEvents, CompletionAndErrorEqesName) {
  Bytes eqe(prm::kEqeBytes);
  prm::eqe::view e(eqe.data());
  uint8_t* data = e.bytes(prm::eqe::event_data);
  e.set(prm::eqe::event_type, prm::event_type::COMP);
  prm::set(data, prm::comp_event::cq_number, 0x402);
  EXPECT_EQ(prm::get(data, prm::comp_event::cq_number), 0x402u);

  memset(eqe.data(), 0, eqe.size());
  e.set(prm::eqe::event_type, prm::event_type::WQ_CATAS_ERROR);
  prm::qp_events::view(data).set(prm::qp_events::type, prm::kEventObjQp).set(prm::qp_events::qpn_rqn_sqn, 0x123);
  EXPECT_EQ(prm::get(data, prm::qp_events::qpn_rqn_sqn), 0x123u);

  memset(eqe.data(), 0, eqe.size());
  e.set(prm::eqe::event_type, prm::event_type::CQ_ERROR);
  prm::cq_error::view(data).set(prm::cq_error::cqn, 0x402).set(prm::cq_error::syndrome, 1);
  EXPECT_EQ(prm::get(data, prm::cq_error::cqn), 0x402u);

  memset(eqe.data(), 0, eqe.size());
  e.set(prm::eqe::event_type, prm::event_type::PORT_CHANGE)
      .set(prm::eqe::event_sub_type, prm::port_change_subtype::ACTIVE);
  prm::port_state_change_event::view(data).set(prm::port_state_change_event::port_num, 1);
  EXPECT_STREQ(prm::port_change_subtype::name_of(uint32_t(e.get(prm::eqe::event_sub_type))), "ACTIVE");
  EXPECT_EQ(prm::get(data, prm::port_state_change_event::port_num), 1u);
}

TEST(PrmDoorbells, RecordsAndUarWordsPackAsTheHcaReadsThem) {
  Bytes rec(8);
  prm::qp_dbrec::view(rec.data()).set(prm::qp_dbrec::rcv_counter, 0x1234).set(prm::qp_dbrec::snd_counter, 0xabcd);
  EXPECT_EQ(prm::get_bits(rec.data(), 32 * prm::kRcvDbrIndex, 32), 0x1234u);
  EXPECT_EQ(prm::get_bits(rec.data(), 32 * prm::kSndDbrIndex, 32), 0xabcdu);

  Bytes db(8);
  prm::cq_uar_db::view(db.data())
      .set(prm::cq_uar_db::sn, 1)
      .set(prm::cq_uar_db::cmd, prm::kCqArmSolicited)
      .set(prm::cq_uar_db::ci, 0x10)
      .set(prm::cq_uar_db::cqn, 0x402);
  EXPECT_EQ(prm::get_bits(db.data(), 0, 32), (1u << 28) | (1u << 24) | 0x10u);
  EXPECT_EQ(prm::get_bits(db.data(), 32, 32), 0x402u);

  Bytes eq(4);
  prm::eq_uar_db::view(eq.data()).set(prm::eq_uar_db::eqn, 3).set(prm::eq_uar_db::ci, 0x100);
  EXPECT_EQ(prm::get_bits(eq.data(), 0, 32), (3u << 24) | 0x100u);
  EXPECT_EQ(prm::kUarEqUpdate - prm::kUarEqArm, 8u);
}

// The optional-parameter table against the bits' meanings (Linux qp.h names each bit for the context
// field it unlocks): every row pairs a bit with the field of that name, and every bit a transition
// accepts either has a field or is one of the unmodelled path-migration/SRQ/CQ bits.
TEST(PrmQpModify, OptionalBitsUnlockTheFieldsTheyAreNamedFor) {
  const std::map<std::string, std::string> meaning = {{"RRE", "rre"},
                                                      {"RAE", "rae"},
                                                      {"RWE", "rwe"},
                                                      {"PKEY_INDEX", "pkey_index"},
                                                      {"Q_KEY", "q_key"},
                                                      {"RNR_TIMEOUT", "min_rnr_nak"},
                                                      {"SRA_MAX", "log_sra_max"},
                                                      {"RRA_MAX", "log_rra_max"},
                                                      {"RETRY_COUNT", "retry_count"},
                                                      {"RNR_RETRY", "rnr_retry"},
                                                      {"ACK_TIMEOUT", "ack_timeout"},
                                                      {"PRI_PORT", "vhca_port_num"},
                                                      {"COUNTER_SET_ID", "counter_set_id"}};
  uint32_t seen = 0;
  for (const prm::QpOptField& f : prm::kQpOptFields) {
    const char* name = prm::qp_optpar::name_of(f.bit);
    ASSERT_NE(name, nullptr);
    EXPECT_EQ(meaning.at(name), f.field.f->name) << name;
    const prm::Layout& owner = f.field.in_path ? prm::ads::layout : prm::qpc::layout;
    const prm::Field* in_layout = prm::find_field(owner, f.field.f->name);
    ASSERT_NE(in_layout, nullptr) << name;
    EXPECT_EQ(in_layout->bit_off, f.field.f->bit_off) << name;
    EXPECT_EQ(in_layout->bit_width, f.field.f->bit_width) << name;
    EXPECT_FALSE(seen & f.bit) << name << " twice";
    seen |= f.bit;
  }
  EXPECT_EQ(seen, prm::qp_opt_bits_with_fields());
  const uint32_t unmodelled =
      prm::qp_optpar::ALT_ADDR_PATH | prm::qp_optpar::PM_STATE | prm::qp_optpar::SRQN | prm::qp_optpar::CQN_RCV;
  for (const prm::QpTransitionRule& r : prm::kQpTransitions)
    for (uint8_t st : {prm::qpc_st::RC, prm::qpc_st::UC, prm::qpc_st::UD})
      EXPECT_EQ(r.allowed_opt(st) & ~(seen | unmodelled), 0u) << prm::opcode_name(r.opcode);
  // The IBA's required attributes are never optional on the same transition.
  for (const prm::QpTransitionRule& r : prm::kQpTransitions)
    for (const prm::QpOptField& f : prm::kQpOptFields)
      if (prm::qp_transition_takes(r, f.field) && f.bit != prm::qp_optpar::COUNTER_SET_ID)
        EXPECT_FALSE(r.allowed_opt(prm::qpc_st::RC) & f.bit) << prm::opcode_name(r.opcode) << " " << f.field.f->name;
  // SQD: a command leaves it, none enters it.
  for (const prm::QpTransitionRule& r : prm::kQpTransitions) EXPECT_NE(r.to, prm::qpc_state::SQD);
  ASSERT_NE(prm::qp_transition(prm::opcode::SQD_RTS_QP), nullptr);
  EXPECT_EQ(prm::qp_transition(prm::opcode::SQD_RTS_QP)->from, prm::qpc_state::SQD);
}

}  // namespace
