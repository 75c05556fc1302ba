// Fault injection: what the device does under each switch.
#include "harness.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace cs = prm::cmd_status;
namespace off = prm::init_seg_offset;

TEST(EmuFaults, CommandTimeoutLeavesTheEntryWithTheDevice) {
  Harness h;
  h.bring_up();
  Faults f;
  f.cmd_timeout = true;
  h.dev.set_faults(f);
  Result r = h.simple(op::NOP);
  EXPECT_EQ(r.delivery, 0xff);  // ownership never returned
  EXPECT_EQ(h.reg(off::cmd_dbell), 1u);  // the device still holds entry 0
  uint8_t* ent = static_cast<uint8_t*>(h.cmdq.va);
  EXPECT_EQ(prm::get(ent, prm::cmd_queue_entry::ownership), 1u);
  // Switching the fault off does not complete the lost command; a new one on another slot works.
  h.dev.set_faults(Faults{});
  EXPECT_TRUE(h.exec(cmd_in(op::NOP, 16), 16, 1).ok());
  EXPECT_EQ(prm::get(ent, prm::cmd_queue_entry::ownership), 1u);
}

TEST(EmuFaults, BadStatusIsInjectedOnceForTheChosenOpcode) {
  Harness h;
  h.bring_up();
  Faults f;
  f.bad_status = cs::INT_ERR;
  f.bad_status_syndrome = 0x1234;
  f.bad_status_opcode = op::ALLOC_PD;
  h.dev.set_faults(f);
  EXPECT_TRUE(h.simple(op::NOP).ok());  // other opcodes are unaffected
  Result r = h.simple(op::ALLOC_PD);
  EXPECT_EQ(r.status, cs::INT_ERR);
  EXPECT_EQ(r.syndrome, 0x1234u);
  EXPECT_TRUE(h.simple(op::ALLOC_PD).ok());  // one-shot
}

TEST(EmuFaults, FatalHealthSyndromeStopsCountersAndCommands) {
  Harness h;
  h.bring_up();
  h.dev.inject_fatal(prm::health_syndrome::FW_INTERNAL_ERR);
  uint32_t c0 = h.reg(off::health_counter);
  EXPECT_EQ(c0 >> 24, prm::health_syndrome::FW_INTERNAL_ERR);
  constexpr uint32_t kSynd = prm::health_buffer::synd.bit_off;  // health buffer byte Linux reads with ioread8
  EXPECT_EQ((h.reg(off::health + kSynd / 32 * 4) >> (32 - kSynd % 32 - 8)) & 0xff,
            uint32_t(prm::health_syndrome::FW_INTERNAL_ERR));
  h.clock.advance(10 * h.dev.config().health_period_ns);
  EXPECT_EQ(h.reg(off::health_counter), c0);  // the counter no longer moves (Linux health.c: "miss counter")
  Result r = h.simple(op::NOP);
  EXPECT_EQ(r.delivery, 0xff);
  // Only FLR brings it back (and the host restoring the function's configuration).
  h.dev.flr();
  h.dev.enumerate();
  EXPECT_EQ(h.reg(off::initializing) >> 31, 1u);
  h.power_up();
  h.enable_to_init();
}

TEST(EmuFaults, FlrLosesEverythingAndDoorbellsAreDeadUntilReinit) {
  Harness h;
  h.bring_up();
  Harness::CqRing cq = h.create_cq();
  uint32_t held = h.dev.stats().fw_pages_held;
  EXPECT_GT(held, 0u);
  // FLR through the PCIe Device Control register.
  uint32_t devctl = h.dev.config_read(kPciExpDevCtl, 2);
  h.dev.config_write(kPciExpDevCtl, 2, devctl | kPciExpDevCtlFlr);
  EXPECT_EQ(h.dev.stats().fw_pages_held, 0u);  // every page is the driver's again
  EXPECT_EQ(h.dev.config_read(kPciCommand, 2) & kPciCommandBusMaster, 0u);  // config space reset
  // BAR0 is unassigned and memory space off until the host restores them: MMIO reads all ones.
  EXPECT_EQ(h.dev.config_read(kPciCommand, 2) & kPciCommandMemory, 0u);
  EXPECT_EQ(h.dev.config_read(0x10, 4) & ~0xfu, 0u);
  EXPECT_EQ(h.dev.config_read(0x14, 4), 0u);
  EXPECT_EQ(h.reg(off::cmdq_addr_h), 0xffffffffu);
  h.dev.enumerate();
  EXPECT_EQ(h.reg(off::cmdq_addr_h), 0u);
  EXPECT_EQ(h.reg(off::initializing) >> 31, 1u);
  uint64_t ignored = h.dev.stats().doorbells_ignored;
  h.arm_cq(cq, false);  // a doorbell on a CQ that no longer exists, before re-init
  h.set_reg(off::cmd_dbell, 1);  // and a command doorbell with no queue
  EXPECT_EQ(h.dev.stats().doorbells_ignored, ignored + 2);
  // Re-init from scratch: the old CQ number is unknown now.
  h.power_up();
  h.enable_to_init();
  h.uar = h.alloc(op::ALLOC_UAR, prm::alloc_uar_out::uar);
  auto q = cmd_in(op::QUERY_CQ, 16);
  prm::set(q.data(), prm::query_cq_in::cqn, cq.cqn);
  EXPECT_EQ(h.exec(q, Harness::out_size(op::QUERY_CQ)).status, cs::BAD_RES_ERR);
}

TEST(EmuFaults, SurpriseRemovalReadsAllOnes) {
  Harness h;
  h.bring_up();
  h.dev.surprise_remove();
  EXPECT_EQ(h.dev.read32(off::fw_rev), 0xffffffffu);
  EXPECT_EQ(h.dev.read32(off::health_counter), 0xffffffffu);
  EXPECT_EQ(h.dev.config_read(0, 2), 0xffffu);
  EXPECT_EQ(h.dev.config_read(0, 4), 0xffffffffu);
  Result r = h.simple(op::NOP);
  EXPECT_EQ(r.delivery, 0xff);
  uint64_t before = h.host.irq_count(0);
  h.dev.service();
  EXPECT_EQ(h.host.irq_count(0), before);
}

TEST(EmuFaults, Fw1422RoceEnLostAfterTeardownInitWithoutFlr) {
  DeviceConfig cfg;
  cfg.fw_minor = 22;
  Harness h(cfg);
  Faults f;
  f.fw_14_22_roce_en_lost = true;
  h.dev.set_faults(f);
  h.power_up();
  h.enable_to_init();
  auto set_roce = [&] {
    auto mv = cmd_in(op::MODIFY_NIC_VPORT_CONTEXT, Harness::in_size(op::MODIFY_NIC_VPORT_CONTEXT));
    prm::modify_nic_vport_context_in::view m(mv.data());
    m.at(prm::modify_nic_vport_context_in::field_select).set(prm::modify_nic_vport_field_select::roce_en, 1);
    m.at(prm::modify_nic_vport_context_in::nic_vport_context).set(prm::nic_vport_context::roce_en, 1);
    return h.exec(mv, 16);
  };
  auto roce_en = [&] {
    Result x = h.simple(op::QUERY_NIC_VPORT_CONTEXT);
    return prm::query_nic_vport_context_out::cview(x.out.data())
        .at(prm::query_nic_vport_context_out::nic_vport_context)
        .get(prm::nic_vport_context::roce_en);
  };
  ASSERT_TRUE(set_roce().ok());
  EXPECT_EQ(roce_en(), 1u);
  // TEARDOWN and INIT again without FLR: roce_en reads 0, and setting it "succeeds" without effect.
  ASSERT_TRUE(h.simple(op::TEARDOWN_HCA).ok());
  ASSERT_TRUE(h.simple(op::INIT_HCA).ok());
  EXPECT_EQ(roce_en(), 0u);
  EXPECT_TRUE(set_roce().ok());
  EXPECT_EQ(roce_en(), 0u);
  // FLR and a full bring-up: it sticks again.
  h.dev.flr();
  h.dev.enumerate();
  h.power_up();
  h.enable_to_init();
  ASSERT_TRUE(set_roce().ok());
  EXPECT_EQ(roce_en(), 1u);
}

TEST(EmuFaults, WithoutTheQuirkRoceEnSurvivesTeardownInit) {
  Harness h;
  h.power_up();
  h.enable_to_init();
  auto mv = cmd_in(op::MODIFY_NIC_VPORT_CONTEXT, Harness::in_size(op::MODIFY_NIC_VPORT_CONTEXT));
  prm::modify_nic_vport_context_in::view m(mv.data());
  m.at(prm::modify_nic_vport_context_in::field_select).set(prm::modify_nic_vport_field_select::roce_en, 1);
  m.at(prm::modify_nic_vport_context_in::nic_vport_context).set(prm::nic_vport_context::roce_en, 1);
  ASSERT_TRUE(h.exec(mv, 16).ok());
  ASSERT_TRUE(h.simple(op::TEARDOWN_HCA).ok());
  ASSERT_TRUE(h.simple(op::INIT_HCA).ok());
  Result x = h.simple(op::QUERY_NIC_VPORT_CONTEXT);
  EXPECT_EQ(prm::query_nic_vport_context_out::cview(x.out.data())
                .at(prm::query_nic_vport_context_out::nic_vport_context)
                .get(prm::nic_vport_context::roce_en),
            1u);
}

TEST(EmuFaults, WorkerThreadCompletesCommandsOnItsOwn) {
  Harness h;
  h.power_up();
  h.dev.start_worker();
  // Post without calling service(): the worker notices the doorbell.
  uint8_t* ent = static_cast<uint8_t*>(h.cmdq.va);
  memset(ent, 0, 64);
  prm::set(ent, prm::cmd_queue_entry::type, prm::kCmdQueueEntryTypePcie);
  prm::set(ent, prm::cmd_queue_entry::input_length, 16);
  prm::set(ent, prm::cmd_queue_entry::output_length, 16);
  auto in = cmd_in(op::ENABLE_HCA, 16);
  memcpy(prm::addr(ent, prm::cmd_queue_entry::command_input_inline_data), in.data(), 16);
  prm::set(ent, prm::cmd_queue_entry::ownership, 1);
  h.set_reg(off::cmd_dbell, 1);
  volatile uint8_t* own = ent + 63;
  for (int i = 0; i < 2000 && (*own & 1); ++i) usleep(1000);
  EXPECT_EQ(*own & 1, 0);
  h.dev.stop_worker();
  EXPECT_EQ(prm::cmd_status_of(prm::addr(ent, prm::cmd_queue_entry::command_output_inline_data)), cs::OK);
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
