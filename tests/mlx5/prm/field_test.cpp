// The one accessor (get_bits/set_bits) and the tables built on it, as specifications.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>

#include "mlx5/prm/prm.h"

namespace prm = melon::mlx5::prm;

namespace {

TEST(PrmAccessor, FieldInOneDwordIsBigEndianFromTheTop) {
  uint8_t buf[8] = {};
  prm::set_bits(buf, 8, 8, 0xab);  // like qpc.st: dword 0, shift 16
  EXPECT_EQ(buf[1], 0xab);
  EXPECT_EQ(prm::get_bits(buf, 8, 8), 0xabu);
  prm::set_bits(buf, 19, 2, 3);  // like qpc.pm_state: 3 gives 0x1800 in dword 0
  EXPECT_EQ(buf[2], 0x18);
}

TEST(PrmAccessor, NeighbouringBitsAreUntouched) {
  uint8_t buf[8];
  memset(buf, 0xff, sizeof buf);
  prm::set_bits(buf, 3, 10, 0);
  EXPECT_EQ(buf[0], 0xe0);
  EXPECT_EQ(buf[1], 0x07);
  EXPECT_EQ(buf[2], 0xff);
  EXPECT_EQ(prm::get_bits(buf, 0, 3), 7u);
  EXPECT_EQ(prm::get_bits(buf, 13, 3), 7u);
}

TEST(PrmAccessor, ValueBitsAboveTheWidthAreDropped) {
  uint8_t buf[4] = {};
  prm::set_bits(buf, 8, 24, 0xff123456);
  EXPECT_EQ(buf[0], 0x00);
  EXPECT_EQ(prm::get_bits(buf, 8, 24), 0x123456u);
}

TEST(PrmAccessor, SixtyFourBitFieldsAtAnyOffsetRoundTrip) {
  for (uint32_t off = 0; off < 24; ++off) {
    uint8_t buf[16];
    memset(buf, 0x5a, sizeof buf);
    const uint64_t v = 0xfedcba9876543210ull;
    prm::set_bits(buf, off, 64, v);
    EXPECT_EQ(prm::get_bits(buf, off, 64), v) << off;
    if (off > 0) EXPECT_EQ(prm::get_bits(buf, 0, off), prm::get_bits("\x5a\x5a\x5a\x5a", 0, off)) << off;
  }
}

TEST(PrmAccessor, DwordAlignedSixtyFourBitsIsPlainBigEndian) {
  uint8_t buf[8];
  prm::set_bits(buf, 0, 64, 0x0102030405060708ull);
  const uint8_t want[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(memcmp(buf, want, 8), 0);
}

TEST(PrmAccessor, EveryWidthAndOffsetInADwordPairRoundTrips) {
  for (uint32_t w = 1; w <= 64; ++w) {
    for (uint32_t off = 0; off + w <= 96; off += 5) {
      uint8_t buf[12];
      memset(buf, 0, sizeof buf);
      const uint64_t v = 0x9e3779b97f4a7c15ull & (w == 64 ? ~0ull : ((1ull << w) - 1));
      prm::set_bits(buf, off, w, v);
      ASSERT_EQ(prm::get_bits(buf, off, w), v) << "w=" << w << " off=" << off;
      // Nothing outside the field was written.
      uint8_t back[12];
      memcpy(back, buf, sizeof buf);
      prm::set_bits(back, off, w, 0);
      for (uint8_t b : back) ASSERT_EQ(b, 0) << "w=" << w << " off=" << off;
    }
  }
}

TEST(PrmTables, EveryLayoutIsWellFormedAndNamedOnce) {
  auto list = prm::all_layouts();
  std::set<std::string> names;
  for (uint32_t i = 0; i < list.count; ++i) {
    const prm::Layout& l = *list.items[i];
    EXPECT_TRUE(names.insert(l.name).second) << l.name;
    EXPECT_TRUE(prm::layout_ok(l.fields, l.count, l.size_bits)) << l.name;
    std::set<std::string> fields;
    for (uint32_t f = 0; f < l.count; ++f) EXPECT_TRUE(fields.insert(l.fields[f].name).second) << l.name;
  }
  EXPECT_EQ(prm::find_layout("qpc"), &prm::qpc::layout);
  EXPECT_EQ(prm::find_field(prm::qpc::layout, "pd")->bit_off, 40u);
}

TEST(PrmTables, EveryCommandHasItsOpcodeAndHeader) {
  auto cmds = prm::all_commands();
  for (uint32_t i = 0; i < cmds.count; ++i) {
    const prm::Command& c = cmds.items[i];
    EXPECT_STREQ(prm::opcode_name(c.opcode), c.name);
    EXPECT_EQ(prm::find_command(c.opcode), &c);
    const prm::Field* op = prm::find_field(*c.in, "opcode");
    ASSERT_NE(op, nullptr) << c.name;
    EXPECT_EQ(op->bit_off, 0u);
    EXPECT_EQ(op->bit_width, 16u);
    const prm::Field* st = prm::find_field(*c.out, "status");
    ASSERT_NE(st, nullptr) << c.name;
    EXPECT_EQ(st->bit_width, 8u);
  }
  EXPECT_STREQ(prm::opcode_name(0x7fff), "UNKNOWN");
}

TEST(PrmTables, NamedValuesHaveNames) {
  EXPECT_STREQ(prm::cmd_status::name_of(0x3), "BAD_PARAM_ERR");
  EXPECT_STREQ(prm::health_syndrome::name_of(0x8), "HW_FATAL_ERR");
  EXPECT_STREQ(prm::delivery_status::name_of(0x2), "TOKEN_ERR");
  EXPECT_STREQ(prm::event_type::name_of(0xb), "PAGE_REQUEST");
  EXPECT_STREQ(prm::cqe_syndrome::name_of(0x5), "WR_FLUSH_ERR");
  EXPECT_EQ(prm::cmd_status::name_of(0x77), nullptr);
}

TEST(PrmInitSeg, DriverOffsetsComeFromTheTable) {
  EXPECT_EQ(prm::init_seg_offset::cmdq_addr_h, 0x10u);
  EXPECT_EQ(prm::init_seg_offset::cmdq_addr_l_sz, 0x14u);
  EXPECT_EQ(prm::init_seg_offset::cmd_dbell, 0x18u);
  EXPECT_EQ(prm::init_seg_offset::initializing, 0x1fcu);
  EXPECT_EQ(prm::init_seg_offset::health, 0x200u);
  EXPECT_EQ(prm::init_seg_offset::internal_timer_h, 0x1000u);
  EXPECT_EQ(prm::init_seg_offset::health_counter, 0x1010u);
}

}  // namespace
