// Our <infiniband/verbs.h> against the stock rdma-core v44 header (libibverbs-dev): every struct
// size, every field offset and size, every enumerator value, row by row. The rows come from the
// same list (layout_fields.inc) compiled once against each header (layout_ours.c, layout_stock.c).
#include "layout_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

TEST(VerbsLayout, EveryFactMatchesTheStockHeader) {
  ASSERT_EQ(melon_layout_ours_count, melon_layout_stock_count);
  ASSERT_GT(melon_layout_ours_count, 1000u);  // the list covers the whole header
  int mismatches = 0;
  for (size_t i = 0; i < melon_layout_ours_count; i++) {
    const melon_layout_row& a = melon_layout_ours[i];
    const melon_layout_row& b = melon_layout_stock[i];
    ASSERT_STREQ(a.what, b.what);
    if (a.value != b.value || a.size != b.size) {
      ADD_FAILURE() << a.what << ": ours " << a.value << "/" << a.size << ", stock " << b.value << "/" << b.size;
      mismatches++;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(VerbsLayout, KeyOffsetsAreTheDocumentedOnes) {
  // A sanity check that the table is real: offsets of rdma-core v44's libibverbs/verbs.h on x86_64.
  auto find = [](const char* what) -> const melon_layout_row* {
    for (size_t i = 0; i < melon_layout_ours_count; i++)
      if (std::strcmp(melon_layout_ours[i].what, what) == 0) return &melon_layout_ours[i];
    return nullptr;
  };
  const melon_layout_row* r = find("struct ibv_port_attr");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->value, 52);
  r = find("struct ibv_device_attr_ex");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->value, 400);
  r = find("IB_UVERBS_ACCESS_OPTIONAL_RANGE");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->value, 0x3ff00000);
}
