// The stable-driver cycle: 100 no-FLR re-inits (TEARDOWN_HCA, pages taken, DISABLE/ENABLE_HCA ...
// INIT_HCA ... roce_en) with objects made and destroyed in every cycle, firmware pages counted
// exactly against what the device holds, and nothing leaking: DMA buffers, IOVA mappings, kernel
// memory. Then the firmware 14.22 roce_en quirk: re-init detects it and falls back to a reset.
#include <gtest/gtest.h>

#include "mlx5/prm/prm.h"
#include "rig.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
namespace emu = melon::mlx5::emu;
using core::Err;
using core::test::Rig;

namespace {

constexpr int kCycles = 100;

// Objects a client would have: they must all go away in the re-init's unload.
void make_objects(Rig& r) {
  core::Pd* pd = nullptr;
  ASSERT_EQ(r.hca.alloc_pd(&pd), Err::ok);
  core::CqParams c;
  core::DmaSegment ring = r.buffer(4096), dbr = r.buffer(4096);
  c.buf = &ring, c.nbuf = 1, c.dbr_iova = dbr.iova;
  core::Cq* cq = nullptr;
  ASSERT_EQ(r.hca.create_cq(c, &cq), Err::ok);
  core::QpParams q;
  q.pd = pd, q.send_cq = cq, q.recv_cq = cq;
  core::DmaSegment qring = r.buffer(8192), qdbr = r.buffer(4096);
  q.buf = &qring, q.nbuf = 1, q.dbr_iova = qdbr.iova;
  core::Qp* qp = nullptr;
  ASSERT_EQ(r.hca.create_qp(q, &qp), Err::ok);
  core::Mr* mr = nullptr;
  ASSERT_EQ(r.hca.create_mr(pd, ring.iova, 4096, core::kAccessLocalWrite, &ring, 1, &mr), Err::ok);
}

TEST(CoreCycle, HundredNoFlrReinitsWithExactPagesAndNoLeak) {
  Rig r;
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  const uint64_t dma0 = r.hal->dma_buffers();
  const int64_t mem0 = r.hal->mem_bytes();
  const uint64_t resets0 = r.hal->resets();
  uint64_t gave = r.hca.pages().given_total();
  for (int i = 0; i < kCycles; ++i) {
    make_objects(r);
    bool used_reset = true;
    ASSERT_EQ(r.hca.reinit(&used_reset), Err::ok)
        << "cycle " << i << ": " << core::stage_name(r.hca.last_failure().stage);
    ASSERT_FALSE(used_reset) << "cycle " << i;
    ASSERT_EQ(r.hca.state(), core::HcaState::up);
    ASSERT_TRUE(r.hca.port().roce_en) << "cycle " << i;
    // Exact page accounting: the core's count is the device's count, and every page given in
    // the cycle before came back.
    ASSERT_EQ(r.hca.pages().given(), r.dev->stats().fw_pages_held) << "cycle " << i;
    ASSERT_EQ(r.hca.pages().given_total() - r.hca.pages().returned_total(), r.hca.pages().given());
    ASSERT_EQ(r.hca.pages().unknown_returns(), 0u);
    for (int k = 0; k < int(core::ObjKind::count); ++k) ASSERT_EQ(r.hca.live(core::ObjKind(k)), 0u);
    ASSERT_EQ(r.hal->dma_buffers(), dma0) << "cycle " << i << ": DMA buffers grew";
    ASSERT_EQ(r.hal->mem_bytes(), mem0) << "cycle " << i << ": kernel memory grew";
    r.free_buffers();
  }
  EXPECT_EQ(r.hal->resets(), resets0) << "no function reset was needed";
  EXPECT_EQ(r.hca.stats().reinits, uint64_t(kCycles));
  EXPECT_EQ(r.hca.stats().reinit_fallbacks, 0u);
  EXPECT_GT(r.hca.pages().given_total(), gave);
  EXPECT_EQ(r.dev->stats().page_use_after_take, 0u);
  EXPECT_EQ(r.host.dma_faults(), 0u);
  ASSERT_EQ(r.hca.teardown(), Err::ok);
  EXPECT_EQ(r.hca.pages().given_total(), r.hca.pages().returned_total()) << "every page given came back";
  EXPECT_EQ(r.hal->dma_buffers(), 0u);
  EXPECT_EQ(r.host.mapped_bytes(), 0u);
  EXPECT_EQ(r.dev->stats().fw_pages_held, 0u);
  printf("[ cycles   ] %d no-FLR re-inits, %llu firmware pages given and taken back, %llu commands\n", kCycles,
         (unsigned long long)r.hca.pages().given_total(), (unsigned long long)r.hca.cmdq().commands_run());
}

TEST(CoreCycle, RoceEnQuirkIsDetectedAndFallsBackToFlr) {
  Rig r;
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  emu::Faults f;
  f.fw_14_22_roce_en_lost = true;
  r.dev->set_faults(f);
  uint64_t resets = r.hal->resets();
  bool used_reset = false;
  ASSERT_EQ(r.hca.reinit(&used_reset), Err::ok);
  EXPECT_TRUE(used_reset);
  const core::Failure& why = r.hca.last_reinit_fallback();
  EXPECT_EQ(why.stage, core::Stage::roce_en);
  EXPECT_EQ(why.err, Err::bad_state);
  EXPECT_EQ(why.cmd.opcode, p::opcode::MODIFY_NIC_VPORT_CONTEXT);
  EXPECT_EQ(why.cmd.status, 0u) << "the quirk completes OK and does nothing";
  EXPECT_TRUE(r.hal->logged("MlxPort: roce_en reads back 0 after setting it to 1"));
  EXPECT_TRUE(
      r.hal->logged("re-init failed at stage 'vport roce_en' (opcode MODIFY_NIC_VPORT_CONTEXT(0x755) status "
                    "OK(0x0) syndrome 0x0): falling back to function reset"));
  EXPECT_EQ(r.hal->resets(), resets + 1);
  EXPECT_EQ(r.hca.state(), core::HcaState::up);
  EXPECT_TRUE(r.hca.port().roce_en) << "after the FLR RoCE is on";
  EXPECT_EQ(r.hca.stats().reinit_fallbacks, 1u);
  EXPECT_EQ(r.hca.pages().given(), r.dev->stats().fw_pages_held);
  ASSERT_EQ(r.hca.teardown(), Err::ok);
  EXPECT_EQ(r.hal->dma_buffers(), 0u);
  EXPECT_EQ(r.dev->stats().fw_pages_held, 0u);
}

TEST(CoreCycle, ReinitFailureAtAnotherStageIsReportedAndRecovered) {
  Rig r;
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  emu::Faults f;
  f.bad_status_opcode = p::opcode::INIT_HCA;
  f.bad_status = p::cmd_status::BAD_SYS_STATE_ERR;
  f.bad_status_syndrome = 0x5150;
  r.dev->set_faults(f);
  bool used_reset = false;
  ASSERT_EQ(r.hca.reinit(&used_reset), Err::ok);
  EXPECT_TRUE(used_reset);
  EXPECT_EQ(r.hca.last_reinit_fallback().stage, core::Stage::init_hca);
  EXPECT_EQ(r.hca.last_reinit_fallback().cmd.status, p::cmd_status::BAD_SYS_STATE_ERR);
  EXPECT_EQ(r.hca.last_reinit_fallback().cmd.syndrome, 0x5150u);
  ASSERT_EQ(r.hca.teardown(), Err::ok);
  EXPECT_EQ(r.hal->dma_buffers(), 0u);
}

}  // namespace
