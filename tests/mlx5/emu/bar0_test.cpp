// BAR0 and PCI configuration space of the emulated ConnectX-4 Lx.
#include "harness.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace off = prm::init_seg_offset;

TEST(EmuBar0, InitSegmentReportsFirmwareRevisionAndCommandInterface) {
  DeviceConfig cfg;
  cfg.fw_major = 14, cfg.fw_minor = 22, cfg.fw_subminor = 1002;
  Harness h(cfg);
  EXPECT_EQ(h.reg(off::fw_rev) & 0xffff, 14u);  // Linux fw_rev_maj
  EXPECT_EQ(h.reg(off::fw_rev) >> 16, 22u);  // fw_rev_min
  EXPECT_EQ(h.reg(off::cmdif_rev_fw_sub) & 0xffff, 1002u);  // fw_rev_sub
  EXPECT_EQ(h.reg(off::cmdif_rev_fw_sub) >> 16, 5u);  // command interface revision 5 (Linux CMD_IF_REV)
  uint32_t l = h.reg(off::cmdq_addr_l_sz) & 0xff;
  EXPECT_EQ(l >> 4, 5u);  // 32 entries
  EXPECT_EQ(l & 0xf, 6u);  // of 64 bytes
}

TEST(EmuBar0, InitializingClearsAfterTheBootDelay) {
  Harness h;
  EXPECT_EQ(h.reg(off::initializing) >> 31, 1u);
  h.clock.advance(h.dev.config().init_delay_ns - 1);
  EXPECT_EQ(h.reg(off::initializing) >> 31, 1u);
  h.clock.advance(2);
  EXPECT_EQ(h.reg(off::initializing) >> 31, 0u);
}

TEST(EmuBar0, HealthCounterAndInternalTimerAdvance) {
  Harness h;
  uint32_t c0 = h.reg(off::health_counter) & 0xffffff;
  uint64_t t0 = uint64_t(h.reg(off::internal_timer_h)) << 32 | h.reg(off::internal_timer_l);
  h.clock.advance(5 * h.dev.config().health_period_ns);
  uint32_t c1 = h.reg(off::health_counter) & 0xffffff;
  uint64_t t1 = uint64_t(h.reg(off::internal_timer_h)) << 32 | h.reg(off::internal_timer_l);
  EXPECT_EQ(c1 - c0, 5u);
  // 156.25 MHz: 5 ms are 781250 ticks.
  EXPECT_NEAR(double(t1 - t0), 781250.0, 2.0);
  EXPECT_EQ(h.reg(off::health_counter) >> 24, 0u);  // no health syndrome
}

TEST(EmuBar0, CommandQueueAddressReadsBack) {
  Harness h;
  h.power_up();
  EXPECT_EQ(h.reg(off::cmdq_addr_h), uint32_t(h.cmdq.iova >> 32));
  EXPECT_EQ(h.reg(off::cmdq_addr_l_sz) & 0xfffff000u, uint32_t(h.cmdq.iova) & 0xfffff000u);
}

TEST(EmuBar0, UnalignedAndOutOfRangeReadsReturnAllOnes) {
  Harness h;
  EXPECT_EQ(h.dev.read32(2), 0xffffffffu);
  EXPECT_EQ(h.dev.read32(kBar0Bytes), 0xffffffffu);
}

TEST(EmuBar0, DoorbellsBeforeInitHcaAreIgnored) {
  Harness h;
  h.power_up();
  uint8_t db[8] = {};
  h.uar_write64(kFirstUarIndex, prm::kUarCqDoorbell, db);
  EXPECT_EQ(h.dev.stats().doorbells_ignored, 1u);
}

TEST(EmuConfigSpace, IdentifiesAsConnectX4Lx) {
  Harness h;
  EXPECT_EQ(h.dev.config_read(0, 2), kPciVendorMellanox);
  EXPECT_EQ(h.dev.config_read(2, 2), kPciDeviceConnectX4Lx);
  EXPECT_EQ(h.dev.config_read(0x0b, 1), 0x02u);  // network controller
  // Capability list: PCIe (FLR capable), then MSI-X with the configured table size.
  uint32_t cap = h.dev.config_read(0x34, 1);
  EXPECT_EQ(h.dev.config_read(cap, 1), 0x10u);
  EXPECT_TRUE(h.dev.config_read(cap + 4, 4) & (1u << 28));
  uint32_t msix = h.dev.config_read(cap + 1, 1);
  EXPECT_EQ(h.dev.config_read(msix, 1), 0x11u);
  EXPECT_EQ((h.dev.config_read(msix + 2, 2) & 0x7ff) + 1, h.dev.config().msix_vectors);
}

TEST(EmuConfigSpace, Bar0SizesAs32MiB) {
  Harness h;
  h.dev.config_write(0x10, 4, 0xffffffffu);
  EXPECT_EQ(h.dev.config_read(0x10, 4) & ~0xfu, uint32_t(~(kBar0Bytes - 1)));
}

TEST(EmuConfigSpace, NoDmaWithoutBusMaster) {
  Harness h;
  h.clock.advance(h.dev.config().init_delay_ns + 1);
  h.cmdq = h.host.alloc(4096);
  h.set_reg(off::cmdq_addr_h, uint32_t(h.cmdq.iova >> 32));
  h.set_reg(off::cmdq_addr_l_sz, uint32_t(h.cmdq.iova));
  Result r = h.simple(prm::opcode::ENABLE_HCA);
  EXPECT_EQ(r.delivery, 0xff);  // the device could not even read the entry
  EXPECT_EQ(h.dev.stats().dma_faults, 1u);
  EXPECT_EQ(h.host.dma_faults(), 0u);  // refused before it reached the IOMMU
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
