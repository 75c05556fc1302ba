// A GoogleTest program with one passing and one skipped test: tests/CMakeLists.txt checks that the
// main every melon_gtest program gets turns the skip into exit code 77 (a ctest skip).
#include <gtest/gtest.h>

TEST(SkipProbe, Passes) { EXPECT_EQ(1 + 1, 2); }
TEST(SkipProbe, Skips) { GTEST_SKIP() << "on purpose"; }
