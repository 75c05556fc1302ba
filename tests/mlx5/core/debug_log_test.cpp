// MLX_DBG compiles in only with MELON_MLX_DEBUG_LOG=1 (this file is built with it); the core
// library itself is built without, and core_cmd_test checks that its commands log no debug lines.
#include <gtest/gtest.h>

#include "mlx5/core/fake_hal.h"
#include "mlx5/core/log.h"

namespace core = melon::mlx5::core;

TEST(CoreDebugLog, DebugLinesAppearWhenCompiledIn) {
  static_assert(core::kDebugLog, "this test is built with MELON_MLX_DEBUG_LOG=1");
  core::test::FakeHal hal;
  MLX_DBG(hal, qp, "QP 0x%x %s", 0x11u, "RST2INIT");
  ASSERT_EQ(hal.lines.size(), 1u);
  EXPECT_EQ(hal.lines[0], "MlxQP: QP 0x11 RST2INIT");
}
