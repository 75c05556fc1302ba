// QpInit::fixed_qpn, the provider's way to make the GSI (QP1, IBA 13.4) for the CM agent
// (src/rdmacm): that QPN exactly, once; ordinary QPs never get 0 or 1, nor a slot QP1 holds.
#include <gtest/gtest.h>

#include <set>

#include "common/host_kit.h"

namespace {

using namespace melon::rc;
namespace kit = melon::kit;

QpInit ud_init(kit::Pair::Side& s) {
  QpInit init;
  init.type = QpType::ud;
  init.pd = 1;
  init.send_cq = &s.scq;
  init.recv_cq = &s.rcq;
  return init;
}

// Random QPNs, as the soft provider draws them: slot collisions with QP1 are then likely.
uint32_t next_random(void* arg) {
  uint32_t& x = *static_cast<uint32_t*>(arg);
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return x;
}

TEST(FixedQpn, TheGsiGetsQpnOneOnceAndOthersNeverDo) {
  uint32_t seed = 0x12345678;
  EngineConfig cfg;
  cfg.random_qpn = next_random;
  cfg.random_qpn_arg = &seed;
  kit::Pair p(cfg, cfg);
  QpInit gsi = ud_init(p.a);
  gsi.fixed_qpn = 1;
  uint32_t qpn = 0;
  ASSERT_EQ(p.a.engine->create_qp(gsi, &qpn), 0);
  EXPECT_EQ(qpn, 1u);
  uint32_t again = 0;
  EXPECT_EQ(p.a.engine->create_qp(gsi, &again), EBUSY) << "one QP1 per engine";
  std::set<uint32_t> seen;
  for (int i = 0; i < 1000; ++i) {
    uint32_t n = 0;
    ASSERT_EQ(p.a.engine->create_qp(ud_init(p.a), &n), 0);
    EXPECT_GT(n, 1u);
    EXPECT_NE(n & 0xfff, 1u) << "QP1's slot is QP1's";
    seen.insert(n);
  }
  EXPECT_EQ(seen.size(), 1000u);
  ASSERT_EQ(p.a.engine->destroy_qp(1), 0);
  for (int i = 0; i < 1000; ++i) {  // with QP1 gone its slot is still not handed out
    uint32_t n = 0;
    ASSERT_EQ(p.a.engine->create_qp(ud_init(p.a), &n), 0);
    EXPECT_NE(n & 0xfff, 1u);
  }
  EXPECT_EQ(p.a.engine->create_qp(gsi, &again), 0) << "QP1 can be made again";
  EXPECT_EQ(again, 1u);
}

}  // namespace
