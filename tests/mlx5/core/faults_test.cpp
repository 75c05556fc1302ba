// Faults on the emulator: a command that never completes, a bad status, a fatal firmware syndrome,
// a stalled health counter, surprise removal. Each must leave the driver safe: no new work on a
// dead device, bus mastering off, nothing freed that the device may still write, recovery by
// function reset and a full bring-up, and a clean teardown (ASan watches every step).
#include <gtest/gtest.h>

#include "mlx5/prm/prm.h"
#include "rig.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
namespace emu = melon::mlx5::emu;
using core::Err;
using core::HcaState;
using core::test::Rig;
using core::test::RigOptions;

namespace {

struct Sink : core::EventSink {
  std::vector<core::AsyncEvent> events;
  void on_async_event(const core::AsyncEvent& e) override { events.push_back(e); }
};

struct Faults : ::testing::Test {
  Rig r{[] {
    RigOptions o;
    o.cfg.cmd_timeout_ms = 2000;
    return o;
  }()};
  core::Pd* pd = nullptr;
  core::Cq* cq = nullptr;
  Sink cq_sink, dev_sink;
  void SetUp() override {
    r.hca.set_device_sink(&dev_sink);
    ASSERT_EQ(r.hca.bring_up(), Err::ok);
    ASSERT_EQ(r.hca.alloc_pd(&pd), Err::ok);
    core::CqParams c;
    core::DmaSegment ring = r.buffer(4096), dbr = r.buffer(4096);
    c.buf = &ring, c.nbuf = 1, c.dbr_iova = dbr.iova, c.owner = &cq_sink;
    ASSERT_EQ(r.hca.create_cq(c, &cq), Err::ok);
  }
  void expect_clean_after_teardown() {
    EXPECT_EQ(r.hca.teardown(), Err::ok);
    EXPECT_EQ(r.hca.state(), HcaState::down);
    EXPECT_EQ(r.hal->dma_buffers(), 0u) << "DMA the core allocated is all back";
    EXPECT_EQ(r.hca.dma().live_buffers(), 0u);
    EXPECT_EQ(r.hca.dma().quarantined_buffers(), 0u);
    EXPECT_EQ(r.hca.pages().chunks(), 0u);
    EXPECT_EQ(r.hca.live(core::ObjKind::cq), 0u);
    EXPECT_EQ(r.dev->stats().page_use_after_take, 0u);
  }
  bool bus_master() { return r.dev->config_read(emu::kPciCommand, 2) & emu::kPciCommandBusMaster; }
};

TEST_F(Faults, CommandTimeoutQuarantinesTheSlotAndTeardownResetsFirst) {
  emu::Faults f;
  f.cmd_timeout = true;
  r.dev->set_faults(f);
  core::Pd* other = nullptr;
  EXPECT_EQ(r.hca.alloc_pd(&other), Err::timeout);
  EXPECT_EQ(r.hca.cmdq().quarantined_slots(), 1u);
  EXPECT_EQ(r.hca.state(), HcaState::up) << "a timeout costs the slot, not the device";
  EXPECT_TRUE(r.hal->logged("MlxCmd: ALLOC_PD(0x800) op_mod 0x0 timed out after 2"));
  EXPECT_FALSE(r.hca.health_check());
  // Teardown cannot get answers either: it resets the function, then frees.
  uint64_t resets = r.hal->resets();
  EXPECT_NE(r.hca.teardown(), Err::ok);
  EXPECT_GT(r.hal->resets(), resets);
  EXPECT_EQ(r.hca.dma().live_buffers(), 0u);
  EXPECT_EQ(r.hca.pages().chunks(), 0u);
  // The reset cleared the fault: the function comes up again.
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  expect_clean_after_teardown();
}

TEST_F(Faults, BadStatusOnAModifyLeavesTheQpWhereItWas) {
  core::QpParams q;
  q.pd = pd, q.send_cq = cq, q.recv_cq = cq;
  core::DmaSegment ring = r.buffer(8192), dbr = r.buffer(4096);
  q.buf = &ring, q.nbuf = 1, q.dbr_iova = dbr.iova;
  core::Qp* qp = nullptr;
  ASSERT_EQ(r.hca.create_qp(q, &qp), Err::ok);
  emu::Faults f;
  f.bad_status_opcode = p::opcode::RST2INIT_QP;
  f.bad_status = p::cmd_status::BAD_QP_STATE_ERR;
  f.bad_status_syndrome = 0xabc;
  r.dev->set_faults(f);
  core::QpAttr a;
  EXPECT_EQ(r.hca.modify_qp(qp, core::QpTransition::rst2init, a), Err::cmd_status);
  EXPECT_EQ(qp->state, core::QpState::rst);
  core::QpQuery qq;
  ASSERT_EQ(r.hca.query_qp(qp, &qq), Err::ok);
  EXPECT_EQ(qq.state, core::QpState::rst);
  EXPECT_TRUE(r.hal->logged("RST2INIT_QP(0x502) op_mod 0x0 failed: status BAD_QP_STATE_ERR(0x10) syndrome 0xabc"));
  EXPECT_EQ(r.hca.modify_qp(qp, core::QpTransition::rst2init, a), Err::ok);
  expect_clean_after_teardown();
}

TEST_F(Faults, FatalSyndromeStopsWorkFencesBusMasteringAndQuarantines) {
  uint32_t given = r.hca.pages().given();
  ASSERT_GT(given, 0u);
  r.dev->inject_fatal(p::health_syndrome::HW_FATAL_ERR);
  EXPECT_TRUE(r.hca.health_check());
  EXPECT_EQ(r.hca.state(), HcaState::fatal);
  EXPECT_EQ(r.hca.fatal_reason(), core::FatalReason::fw_syndrome);
  EXPECT_EQ(r.hca.fatal_syndrome(), p::health_syndrome::HW_FATAL_ERR);
  EXPECT_TRUE(r.hal->logged("MlxHealth: syndrome 0x8 HW_FATAL_ERR"));
  // New work is refused without touching the device.
  uint64_t cmds = r.hca.cmdq().commands_run();
  core::Pd* other = nullptr;
  EXPECT_EQ(r.hca.alloc_pd(&other), Err::dead);
  EXPECT_EQ(r.hca.cmdq().commands_run(), cmds);
  // Bus mastering is off and what the device held is quarantined, not freed.
  EXPECT_FALSE(bus_master());
  EXPECT_EQ(r.hca.pages().count(core::PageState::quarantined), given);
  EXPECT_TRUE(r.hca.dma().fenced());
  // Owners heard about it.
  ASSERT_FALSE(dev_sink.events.empty());
  EXPECT_EQ(dev_sink.events[0].type, p::event_type::INTERNAL_ERROR);
  ASSERT_FALSE(cq_sink.events.empty());
  EXPECT_EQ(cq_sink.events[0].type, p::event_type::INTERNAL_ERROR);
  // Recovery: reset and a full bring-up; the old objects are gone.
  ASSERT_EQ(r.hca.recover(), Err::ok);
  EXPECT_EQ(r.hca.state(), HcaState::up);
  EXPECT_TRUE(bus_master());
  EXPECT_EQ(r.hca.live(core::ObjKind::cq), 0u);
  EXPECT_EQ(r.hca.pages().count(core::PageState::quarantined), 0u);
  EXPECT_EQ(r.hca.pages().given(), r.dev->stats().fw_pages_held);
  EXPECT_EQ(r.hca.alloc_pd(&other), Err::ok);
  expect_clean_after_teardown();
}

TEST_F(Faults, RecoveryWhileUpTellsOwnersTheirObjectsAreGone) {
  ASSERT_EQ(r.hca.recover(), Err::ok);
  ASSERT_EQ(cq_sink.events.size(), 1u);
  EXPECT_EQ(cq_sink.events[0].type, p::event_type::INTERNAL_ERROR);
  EXPECT_EQ(r.hca.live(core::ObjKind::cq), 0u);
  EXPECT_EQ(r.hca.live(core::ObjKind::pd), 0u);
  expect_clean_after_teardown();
}

TEST_F(Faults, StalledHealthCounterIsFatalAfterMisses) {
  r.dev->inject_fatal(0);  // the firmware stops without a syndrome
  for (uint32_t i = 0; i < 3; ++i) {
    r.clock.advance(10'000'000);
    bool fatal = r.hca.health_check();
    EXPECT_EQ(fatal, i == 2) << "poll " << i;
  }
  EXPECT_EQ(r.hca.fatal_reason(), core::FatalReason::health_stalled);
  EXPECT_TRUE(r.hal->logged("MlxHealth: device fatal: health counter stopped"));
  ASSERT_EQ(r.hca.recover(), Err::ok);
  expect_clean_after_teardown();
}

TEST_F(Faults, HealthyDeviceStaysUpUnderPolling) {
  for (int i = 0; i < 10; ++i) {
    r.clock.advance(10'000'000);
    EXPECT_FALSE(r.hca.health_check());
  }
  EXPECT_EQ(r.hca.state(), HcaState::up);
  expect_clean_after_teardown();
}

TEST_F(Faults, SurpriseRemovalFailsFastAndTearsDownSafely) {
  r.dev->surprise_remove();
  uint64_t t0 = r.clock.now_ns();
  core::Pd* other = nullptr;
  EXPECT_EQ(r.hca.alloc_pd(&other), Err::dead);
  EXPECT_LT(r.clock.now_ns() - t0, 1'000'000'000ull) << "no waiting out the command timeout";
  EXPECT_TRUE(r.hca.health_check());
  EXPECT_EQ(r.hca.fatal_reason(), core::FatalReason::pci_gone);
  EXPECT_TRUE(r.hal->logged("PCI link lost"));
  // Teardown resets (nothing answers) and frees everything: the card cannot write any more.
  EXPECT_EQ(r.hca.teardown(), Err::ok);
  EXPECT_EQ(r.hca.dma().live_buffers(), 0u);
  EXPECT_EQ(r.hca.dma().quarantined_buffers(), 0u);
  EXPECT_EQ(r.hca.live(core::ObjKind::cq), 0u);
  EXPECT_EQ(r.hca.bring_up(), Err::dead) << "no device behind the BAR";
  EXPECT_EQ(r.hca.last_failure().stage, core::Stage::wait_fw);
}

TEST(CoreFaults, OutOfDmaMemoryAtEachAllocationFailsCleanly) {
  // Fail the n-th DMA allocation of a bring-up, for every n until one succeeds: each failure
  // names its stage, and the teardown after it leaves nothing.
  for (int n = 0;; ++n) {
    Rig r;
    r.hal->fail_after_allocs(n);  // n allocations go through, the next one fails
    Err e = r.hca.bring_up();
    if (e == Err::ok) {
      EXPECT_GT(n, 3) << "bring-up allocates more than a few buffers";
      EXPECT_EQ(r.hca.teardown(), Err::ok);
      break;
    }
    EXPECT_EQ(e, Err::no_memory) << "allocation " << n << ": " << core::err_name(e) << " at "
                                 << core::stage_name(r.hca.last_failure().stage);
    EXPECT_EQ(r.hca.teardown(), Err::ok) << n;
    EXPECT_EQ(r.hal->dma_buffers(), 0u) << n;
    EXPECT_EQ(r.dev->stats().fw_pages_held, 0u) << n;
    ASSERT_LT(n, 100);
  }
}

}  // namespace
