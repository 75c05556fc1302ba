// Bring-up and teardown of the driver core on the emulated ConnectX-4 Lx, in interrupt and polling
// mode, and a failure at each stage reported by name with the firmware's answer.
#include <gtest/gtest.h>

#include "mlx5/core/log.h"
#include "mlx5/prm/prm.h"
#include "rig.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
using core::Err;
using core::HcaState;
using core::Stage;
using core::test::Rig;
using core::test::RigOptions;

namespace {

void expect_clean(Rig& r) {
  EXPECT_EQ(r.hca.state(), HcaState::down);
  EXPECT_EQ(r.hal->dma_buffers(), 0u) << "DMA buffers left";
  EXPECT_EQ(r.hca.dma().live_buffers(), 0u);
  EXPECT_EQ(r.hca.pages().given(), 0u);
  EXPECT_EQ(r.dev->stats().fw_pages_held, 0u);
  EXPECT_EQ(r.host.mapped_bytes(), 0u);
  EXPECT_EQ(r.host.dma_faults(), 0u) << "the device hit an unmapped IOVA";
  EXPECT_EQ(r.dev->stats().page_use_after_take, 0u);
}

TEST(CoreBringUp, ReachesUpWithInterruptsAndTearsDownToNothing) {
  Rig r;
  ASSERT_EQ(r.hca.bring_up(), Err::ok) << core::stage_name(r.hca.last_failure().stage);
  EXPECT_EQ(r.hca.state(), HcaState::up);
  // The firmware holds exactly the pages the core counts as given.
  EXPECT_GT(r.hca.pages().given(), 0u);
  EXPECT_EQ(r.hca.pages().given(), r.dev->stats().fw_pages_held);
  EXPECT_TRUE(r.hca.caps().has_roce);
  EXPECT_EQ(r.hca.caps().port_type, p::kPortTypeEth);
  EXPECT_TRUE(r.hca.port().roce_en);
  EXPECT_EQ(memcmp(r.hca.port().mac, r.dev->config().mac, 6), 0);
  EXPECT_GT(r.host.irq_count(0), 0u) << "command completions came as MSI-X on vector 0";
  EXPECT_TRUE(r.hca.cmdq().event_mode());
  EXPECT_EQ(r.hca.teardown(), Err::ok);
  expect_clean(r);
}

TEST(CoreBringUp, WorksPolledWithoutVectors) {
  RigOptions o;
  o.hal.interrupts = false;
  Rig r(o);
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  EXPECT_FALSE(r.hal->logged("without its completion event"));
  EXPECT_GT(r.hca.stats().events, 0u) << "completions were drained by polling the EQ";
  EXPECT_EQ(r.hca.teardown(), Err::ok);
  expect_clean(r);
}

TEST(CoreBringUp, EachStageIsLoggedWithItsComponent) {
  Rig r;
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  EXPECT_TRUE(r.hal->logged("MlxPCIDriver: bring-up"));
  EXPECT_TRUE(r.hal->logged("MlxCmd: command queue at iova"));
  EXPECT_TRUE(r.hal->logged("MlxPages: boot: firmware asks for"));
  EXPECT_TRUE(r.hal->logged("MlxPages: init: firmware asks for"));
  EXPECT_TRUE(r.hal->logged("MlxEQ: async EQ"));
  EXPECT_TRUE(r.hal->logged("MlxPort: vport"));
  EXPECT_TRUE(r.hal->logged("MlxPCIDriver: up in"));
  for (auto& line : r.hal->log_lines()) EXPECT_EQ(line.rfind("Mlx", 0), 0u) << line;
  r.hca.teardown();
  EXPECT_TRUE(r.hal->logged("MlxPCIDriver: down: every page back"));
}

TEST(CoreBringUp, SecondBringUpAfterTeardownWorks) {
  Rig r;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(r.hca.bring_up(), Err::ok) << i;
    ASSERT_EQ(r.hca.teardown(), Err::ok) << i;
  }
  expect_clean(r);
}

// A failure at each stage: the firmware refuses that stage's command; the core names the stage,
// the opcode, status and syndrome, and a teardown afterwards leaves nothing behind.
struct StageCase {
  uint16_t opcode;
  Stage stage;
};
class CoreBringUpFailure : public ::testing::TestWithParam<StageCase> {};

TEST_P(CoreBringUpFailure, StageIsNamedAndNothingLeaks) {
  Rig r;
  melon::mlx5::emu::Faults f;
  f.bad_status_opcode = GetParam().opcode;
  f.bad_status = p::cmd_status::BAD_PARAM_ERR;
  f.bad_status_syndrome = 0x1b2c3d;
  r.dev->set_faults(f);
  EXPECT_EQ(r.hca.bring_up(), Err::cmd_status);
  const core::Failure& fail = r.hca.last_failure();
  EXPECT_EQ(fail.stage, GetParam().stage) << core::stage_name(fail.stage);
  EXPECT_EQ(fail.cmd.opcode, GetParam().opcode);
  EXPECT_EQ(fail.cmd.status, p::cmd_status::BAD_PARAM_ERR);
  EXPECT_EQ(fail.cmd.syndrome, 0x1b2c3du);
  char want[128];
  core::format(want, sizeof want, "MlxPCIDriver: stage '%s' failed", core::stage_name(GetParam().stage));
  EXPECT_TRUE(r.hal->logged(want)) << want;
  EXPECT_EQ(r.hca.teardown(), Err::ok);
  expect_clean(r);
  // And the function comes up fine afterwards.
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  EXPECT_EQ(r.hca.teardown(), Err::ok);
}

INSTANTIATE_TEST_SUITE_P(
    EveryStage, CoreBringUpFailure,
    ::testing::Values(
        StageCase{p::opcode::ENABLE_HCA, Stage::enable_hca}, StageCase{p::opcode::SET_ISSI, Stage::issi},
        StageCase{p::opcode::MANAGE_PAGES, Stage::boot_pages}, StageCase{p::opcode::ACCESS_REG, Stage::hca_ctrl},
        StageCase{p::opcode::SET_HCA_CAP, Stage::set_hca_cap}, StageCase{p::opcode::INIT_HCA, Stage::init_hca},
        StageCase{p::opcode::QUERY_HCA_CAP, Stage::set_hca_cap}, StageCase{p::opcode::ALLOC_UAR, Stage::uar},
        StageCase{p::opcode::CREATE_EQ, Stage::eqs}, StageCase{p::opcode::ALLOC_PD, Stage::pd_td},
        StageCase{p::opcode::ALLOC_TRANSPORT_DOMAIN, Stage::pd_td},
        StageCase{p::opcode::MODIFY_NIC_VPORT_CONTEXT, Stage::roce_en},
        StageCase{p::opcode::QUERY_VPORT_STATE, Stage::port_query}),
    [](const ::testing::TestParamInfo<StageCase>& i) { return std::string(p::opcode::name_of(i.param.opcode)); });

}  // namespace

namespace {

// The device on its own thread: interrupts arrive on another thread while the core waits, polls
// and destroys EQs (what the DEXT sees). Objects churn in between; ASan watches the EQ buffers.
TEST(CoreThreaded, BringUpObjectsReinitAndTeardownWithTheDeviceOnItsOwnThread) {
  RigOptions o;
  o.threaded = true;
  Rig r(o);
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  for (int round = 0; round < 3; ++round) {
    core::Pd* pd = nullptr;
    ASSERT_EQ(r.hca.alloc_pd(&pd), Err::ok);
    core::CqParams c;
    core::DmaSegment ring = r.buffer(4096), dbr = r.buffer(4096);
    c.buf = &ring, c.nbuf = 1, c.dbr_iova = dbr.iova;
    core::Cq* cq = nullptr;
    ASSERT_EQ(r.hca.create_cq(c, &cq), Err::ok);
    for (int i = 0; i < 50; ++i) {
      core::Pd* tmp = nullptr;
      ASSERT_EQ(r.hca.alloc_pd(&tmp), Err::ok);
      ASSERT_EQ(r.hca.free_pd(tmp), Err::ok);
    }
    bool used_reset = true;
    ASSERT_EQ(r.hca.reinit(&used_reset), Err::ok);
    EXPECT_FALSE(used_reset);
    r.free_buffers();
  }
  EXPECT_GT(r.host.irq_count(0), 0u);
  EXPECT_FALSE(r.hal->logged("without its completion event"));
  EXPECT_EQ(r.hca.pages().given(), r.dev->stats().fw_pages_held);
  EXPECT_EQ(r.hca.teardown(), Err::ok);
  EXPECT_EQ(r.hal->dma_buffers(), 0u);
  EXPECT_EQ(r.host.dma_faults(), 0u);
}

}  // namespace

namespace {

TEST(CoreBringUp, SeveralCompletionEqsEachOnItsOwnVector) {
  RigOptions o;
  o.cfg.comp_eqs = 4;
  Rig r(o);
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  ASSERT_EQ(r.hca.comp_eq_count(), 4u);
  EXPECT_TRUE(r.hal->logged("MlxEQ: async EQ"));
  for (uint32_t v = 1; v <= 4; ++v) {
    char want[64];
    core::format(want, sizeof want, "entries, vector %u", v);
    EXPECT_TRUE(r.hal->logged(want)) << want;
  }
  core::CqParams c;
  core::DmaSegment ring = r.buffer(4096), dbr = r.buffer(4096);
  c.buf = &ring, c.nbuf = 1, c.dbr_iova = dbr.iova, c.comp_vector = 3;
  core::Cq* cq = nullptr;
  ASSERT_EQ(r.hca.create_cq(c, &cq), Err::ok);
  core::CqQuery q;
  ASSERT_EQ(r.hca.query_cq(cq, &q), Err::ok);
  EXPECT_EQ(q.eqn, r.hca.comp_eqn(3));
  EXPECT_EQ(r.hca.teardown(), Err::ok);
  r.free_buffers();
  expect_clean(r);
}

}  // namespace
