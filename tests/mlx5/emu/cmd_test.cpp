// The command engine: queue entry and mailbox transport, generic validation, life-cycle gates,
// completion by polling and by EQE.
#include "harness.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace ds = prm::delivery_status;
namespace cs = prm::cmd_status;

TEST(EmuCmd, BringUpToInitHca) {
  Harness h;
  h.power_up();
  h.enable_to_init();
  EXPECT_EQ(h.dev.stats().fw_pages_held, h.dev.config().boot_pages + h.dev.config().init_pages);
}

TEST(EmuCmd, QueryIssiReportsSupportedAndCurrent) {
  Harness h;
  h.power_up();
  ASSERT_TRUE(h.simple(op::ENABLE_HCA).ok());
  Result r = h.simple(op::QUERY_ISSI);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(prm::get(r.out.data(), prm::query_issi_out::current_issi), 0u);
  EXPECT_EQ(prm::get(r.out.data(), prm::query_issi_out::supported_issi_dw0), 0x3u);
  auto in = cmd_in(op::SET_ISSI, Harness::in_size(op::SET_ISSI));
  prm::set(in.data(), prm::set_issi_in::current_issi, 7);
  r = h.exec(in, Harness::out_size(op::SET_ISSI));
  EXPECT_EQ(r.status, cs::BAD_PARAM_ERR);
  EXPECT_EQ(r.syndrome, synd::BAD_ISSI);
}

TEST(EmuCmd, CommandsBeforeEnableHcaAreRefused) {
  Harness h;
  h.power_up();
  Result r = h.simple(op::QUERY_ISSI);
  EXPECT_EQ(r.delivery, ds::DELIVERED);
  EXPECT_EQ(r.status, cs::BAD_SYS_STATE_ERR);
  EXPECT_EQ(r.syndrome, synd::HCA_NOT_ENABLED);
  r = h.simple(op::ALLOC_PD);
  EXPECT_EQ(r.status, cs::BAD_SYS_STATE_ERR);
  ASSERT_TRUE(h.simple(op::ENABLE_HCA).ok());
  r = h.simple(op::ENABLE_HCA);
  EXPECT_EQ(r.status, cs::BAD_SYS_STATE_ERR);
  EXPECT_EQ(r.syndrome, synd::HCA_ALREADY_ENABLED);
  r = h.simple(op::ALLOC_PD);
  EXPECT_EQ(r.syndrome, synd::HCA_NOT_INITIALIZED);
}

TEST(EmuCmd, UnknownOpcodeIsBadOp) {
  Harness h;
  h.power_up();
  Result r = h.exec(cmd_in(0x7ff, 16), 16);
  EXPECT_EQ(r.status, cs::BAD_OP_ERR);
  EXPECT_EQ(r.syndrome, synd::UNKNOWN_OPCODE);
  r = h.exec(cmd_in(op::MODIFY_RMP, 16), 16);  // an opcode the model has no layout for
  EXPECT_EQ(r.status, cs::BAD_OP_ERR);
}

TEST(EmuCmd, ShortInputOrOutputIsRefused) {
  Harness h;
  h.power_up();
  ASSERT_TRUE(h.simple(op::ENABLE_HCA).ok());
  Result r = h.exec(cmd_in(op::QUERY_ISSI, 8), Harness::out_size(op::QUERY_ISSI));
  EXPECT_EQ(r.status, cs::BAD_INP_LEN_ERR);
  r = h.exec(cmd_in(op::QUERY_ISSI, 16), 16);  // query_issi_out is 112 bytes
  EXPECT_EQ(r.status, cs::BAD_OUTP_LEN_ERR);
}

TEST(EmuCmd, WrongOpModAndReservedBitsAreBadParam) {
  Harness h;
  h.power_up();
  Result r = h.exec(cmd_in(op::ENABLE_HCA, 16, 3), 16);
  EXPECT_EQ(r.status, cs::BAD_PARAM_ERR);
  EXPECT_EQ(r.syndrome, synd::BAD_OP_MOD);
  auto in = cmd_in(op::ENABLE_HCA, 16);
  in[13] = 0x01;  // bits 96..127 of enable_hca_in are reserved
  r = h.exec(in, 16);
  EXPECT_EQ(r.status, cs::BAD_PARAM_ERR);
  EXPECT_EQ(r.syndrome, synd::RESERVED_NOT_ZERO);
}

TEST(EmuCmd, BadEntryTypeTokenAndBlockNumberAreDeliveryErrors) {
  Harness h;
  h.power_up();
  ASSERT_TRUE(h.simple(op::ENABLE_HCA).ok());
  auto cap = cmd_in(op::QUERY_HCA_CAP, 16, 1);  // output needs 8 mailboxes
  Result r =
      h.exec_with(cap, Harness::out_size(op::QUERY_HCA_CAP), 0,
                  [](uint8_t* e, TestHost::Buffer&, TestHost::Buffer&) { prm::set(e, prm::cmd_queue_entry::type, 1); });
  EXPECT_EQ(r.delivery, ds::BAD_COMMAND_TYPE);
  r = h.exec_with(cap, Harness::out_size(op::QUERY_HCA_CAP), 1, [](uint8_t*, TestHost::Buffer&, TestHost::Buffer& out) {
    prm::set(static_cast<uint8_t*>(out.va) + 1024, prm::cmd_if_box::token, 0x11);
  });
  EXPECT_EQ(r.delivery, ds::TOKEN_ERR);
  r = h.exec_with(cap, Harness::out_size(op::QUERY_HCA_CAP), 2, [](uint8_t*, TestHost::Buffer&, TestHost::Buffer& out) {
    prm::set(static_cast<uint8_t*>(out.va) + 2048, prm::cmd_if_box::block_number, 7);
  });
  EXPECT_EQ(r.delivery, ds::BAD_BLOCK_NUMBER);
}

TEST(EmuCmd, UnmappedMailboxIsBadPointer) {
  Harness h;
  h.power_up();
  ASSERT_TRUE(h.simple(op::ENABLE_HCA).ok());
  auto in = cmd_in(op::MANAGE_PAGES, prm::manage_pages_in::size_bytes + 8 * 4, 1);
  Result r = h.exec_with(in, 16, 0, [](uint8_t* e, TestHost::Buffer&, TestHost::Buffer&) {
    prm::cmd_entry_set_in_mailbox(e, 0x1000);  // a VA-looking address the IOMMU does not map
  });
  EXPECT_EQ(r.delivery, ds::BAD_INPUT_POINTER);
  EXPECT_GE(h.host.dma_faults(), 1u);
}

TEST(EmuCmd, SignaturesAreCheckedWhenEnabled) {
  DeviceConfig cfg;
  cfg.cmd_signatures = true;
  Harness h(cfg);
  h.power_up();
  EXPECT_TRUE(h.simple(op::ENABLE_HCA).ok());
  Result r = h.exec_with(cmd_in(op::QUERY_ISSI, 16), Harness::out_size(op::QUERY_ISSI), 0,
                         [](uint8_t* e, TestHost::Buffer&, TestHost::Buffer&) { e[62] ^= 1; });
  EXPECT_EQ(r.delivery, ds::SIGNATURE_ERR);
}

TEST(EmuCmd, EntryOwnedBySoftwareIsNotExecuted) {
  Harness h;
  h.power_up();
  Result r = h.exec_with(cmd_in(op::ENABLE_HCA, 16), 16, 0, [](uint8_t* e, TestHost::Buffer&, TestHost::Buffer&) {
    prm::set(e, prm::cmd_queue_entry::ownership, 0);
  });
  EXPECT_EQ(h.dev.stats().commands, 0u);
  EXPECT_EQ(h.dev.stats().doorbells_ignored, 1u);
  (void)r;
}

TEST(EmuCmd, CompletionEqeAndInterruptWhenAnEqTakesCommandEvents) {
  Harness h;
  h.bring_up();
  TestHost::Buffer buf;
  uint32_t eqn = h.create_eq(prm::event_bit(prm::event_type::CMD), 4, &buf, 3);
  // Arm it: EQ doorbell "update CI and arm" through its UAR.
  h.uar_write32(h.uar, prm::kUarEqArm, eqn << 24 | 0);
  h.dev.service();
  uint64_t irqs = h.host.irq_count(3);
  ASSERT_TRUE(h.simple(op::NOP).ok());
  const uint8_t* e = static_cast<const uint8_t*>(buf.va);
  EXPECT_EQ(prm::get(e, prm::eqe::event_type), prm::event_type::CMD);
  EXPECT_EQ(prm::get(e, prm::eqe::owner), 0u);
  EXPECT_EQ(prm::get(e + 32, prm::cmd_inter_comp_event::command_completion_vector), 1u);
  EXPECT_EQ(h.host.irq_count(3), irqs + 1);
  // Not re-armed: the next completion writes an EQE but raises no interrupt.
  ASSERT_TRUE(h.exec(cmd_in(op::NOP, 16), 16, 5).ok());
  EXPECT_EQ(prm::get(e + 64 + 32, prm::cmd_inter_comp_event::command_completion_vector), 1u << 5);
  EXPECT_EQ(h.host.irq_count(3), irqs + 1);
}

TEST(EmuCmd, QueryHcaCapReportsTheDevice) {
  Harness h;
  h.power_up();
  h.enable_to_init();
  Result r = h.simple(op::QUERY_HCA_CAP, prm::cap_op_mod(prm::cap_type::GENERAL_DEVICE, prm::cap_mode::GET_MAX));
  ASSERT_TRUE(r.ok());
  const uint8_t* cap = prm::query_hca_cap_out::cview(r.out.data()).bytes(prm::query_hca_cap_out::capability);
  EXPECT_EQ(prm::get(cap, prm::cmd_hca_cap::port_type), prm::kPortTypeEth);
  EXPECT_EQ(prm::get(cap, prm::cmd_hca_cap::roce), 1u);
  EXPECT_EQ(prm::get(cap, prm::cmd_hca_cap::log_bf_reg_size), 9u);
  r = h.simple(op::QUERY_HCA_CAP, prm::cap_op_mod(prm::cap_type::ROCE, prm::cap_mode::GET_CUR));
  ASSERT_TRUE(r.ok());
  cap = prm::query_hca_cap_out::cview(r.out.data()).bytes(prm::query_hca_cap_out::capability);
  EXPECT_EQ(prm::get(cap, prm::roce_cap::r_roce_dest_udp_port), 4791u);
  r = h.simple(op::QUERY_HCA_CAP, prm::cap_op_mod(prm::cap_type::ODP, prm::cap_mode::GET_CUR));
  EXPECT_EQ(r.status, cs::BAD_PARAM_ERR);
  EXPECT_EQ(r.syndrome, synd::BAD_CAP_TYPE);
}

TEST(EmuCmd, SetHcaCapRefusesValuesAboveTheMaximum) {
  Harness h;
  h.power_up();
  ASSERT_TRUE(h.simple(op::ENABLE_HCA).ok());
  ASSERT_TRUE(h.give_pages(uint32_t(h.query_pages(prm::query_pages_op_mod::BOOT_PAGES))).ok());
  Result cur = h.simple(op::QUERY_HCA_CAP, prm::cap_op_mod(prm::cap_type::GENERAL_DEVICE, prm::cap_mode::GET_CUR));
  auto in =
      cmd_in(op::SET_HCA_CAP, Harness::in_size(op::SET_HCA_CAP), prm::cap_op_mod(prm::cap_type::GENERAL_DEVICE, 0));
  uint8_t* cap = prm::set_hca_cap_in::view(in.data()).bytes(prm::set_hca_cap_in::capability);
  memcpy(cap, prm::query_hca_cap_out::cview(cur.out.data()).bytes(prm::query_hca_cap_out::capability), 4096);
  prm::set(cap, prm::cmd_hca_cap::log_max_qp, 12);
  ASSERT_TRUE(h.exec(in, Harness::out_size(op::SET_HCA_CAP)).ok());
  cur = h.simple(op::QUERY_HCA_CAP, prm::cap_op_mod(prm::cap_type::GENERAL_DEVICE, prm::cap_mode::GET_CUR));
  EXPECT_EQ(prm::get(prm::query_hca_cap_out::cview(cur.out.data()).bytes(prm::query_hca_cap_out::capability),
                     prm::cmd_hca_cap::log_max_qp),
            12u);
  prm::set(cap, prm::cmd_hca_cap::log_max_qp, 31);
  Result r = h.exec(in, Harness::out_size(op::SET_HCA_CAP));
  EXPECT_EQ(r.status, cs::BAD_PARAM_ERR);
  EXPECT_EQ(r.syndrome, synd::CAP_ABOVE_MAX);
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
