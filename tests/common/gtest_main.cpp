// The main() of every GoogleTest program built with melon_gtest (cmake/Melon.cmake). As gtest_main,
// except for skips: ctest counts a program as one test, and a GTEST_SKIP inside it would show as
// "Passed". A program in which some test was skipped and none failed exits 77, which ctest reports
// as "Skipped" (SKIP_RETURN_CODE); a failure still fails.
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  const testing::UnitTest* u = testing::UnitTest::GetInstance();
  if (u->skipped_test_count() > 0) {
    std::printf("%d test(s) skipped, %d passed: exit 77 so ctest reports a skip\n", u->skipped_test_count(),
                u->successful_test_count());
    return 77;
  }
  return 0;
}
