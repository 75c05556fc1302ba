// BAR0: the initialization segment (PRM "Initialization Segment"; Linux device.h mlx5_init_seg) and
// the UAR pages with their doorbells (PRM "UAR Page"; offsets in prm/doorbell.h).
#include <string.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
namespace is = prm::initial_seg;
constexpr uint32_t kCmdIfRev = 5;  // command interface revision the Linux driver requires (CMD_IF_REV)
constexpr uint32_t kLogCmdqSize = 5, kLogCmdqStride = 6;  // 32 entries of 64 bytes
constexpr uint64_t kTimerKhz = 156250;  // internal timer rate: cmd_hca_cap.device_frequency_khz
}  // namespace

uint64_t Hca::uar_page_bytes() const {
  return uint64_t(prm::kUarPageBytes) << prm::get(cur_caps_, prm::cmd_hca_cap::log_uar_page_sz);
}

void Hca::iseg_refresh() {
  update_fw_state();
  uint8_t* s = iseg_;
  prm::set(s, is::fw_rev_major, cfg_.fw_major);
  prm::set(s, is::fw_rev_minor, cfg_.fw_minor);
  prm::set(s, is::fw_rev_subminor, cfg_.fw_subminor);
  prm::set(s, is::cmd_interface_rev, kCmdIfRev);
  prm::set(s, is::cmdq_phy_addr_63_32, cmdq_addr_h_);
  prm::set(s, is::cmdq_phy_addr_31_12, cmdq_addr_l_ >> 12);
  prm::set(s, is::nic_interface, (cmdq_addr_l_ >> 8) & 3);
  prm::set(s, is::log_cmdq_size, kLogCmdqSize);
  prm::set(s, is::log_cmdq_stride, kLogCmdqStride);
  prm::set(s, is::command_doorbell_vector, busy_cmd_bits_);
  prm::set(s, is::initializing, state_ == FwState::kBooting);
  prm::set(s, is::nic_interface_supported, 0x7);  // full driver, disabled, no-DRAM NIC
  uint64_t t = now();
  uint64_t ticks = t / 1000 * kTimerKhz / 1000;
  prm::set(s, is::internal_timer_h, ticks >> 32);
  prm::set(s, is::internal_timer_l, ticks & 0xffffffffu);
  uint32_t counter = state_ == FwState::kFatal || faults_.health_stall
                         ? health_counter_frozen_
                         : uint32_t((t - health_epoch_ns_) / cfg_.health_period_ns);
  prm::set(s, is::health_counter, counter);
  prm::set(s, is::health_syndrome, health_synd_);
  prm::health_buffer::view hb(s + is::health_buffer.byte_off());
  hb.set(prm::health_buffer::synd, health_synd_);
  hb.set(prm::health_buffer::fw_version,
         (uint32_t(cfg_.fw_major) << 24) | (uint32_t(cfg_.fw_minor) << 16) | cfg_.fw_subminor);
  hb.set(prm::health_buffer::time, uint32_t(t / 1'000'000'000ull));
  hb.set(prm::health_buffer::valid, health_synd_ != 0);
  hb.set(prm::health_buffer::severity, health_synd_ ? 2 : 0);  // 2: critical (Linux health.c severities)
}

uint32_t Hca::mmio_read32(uint64_t off) {
  if (state_ == FwState::kRemoved || off % 4 || off + 4 > kBar0Bytes) return 0xffffffffu;
  if (!mmio_decoded()) {
    ++stats_.mmio_unclaimed;  // nothing claims the address: the root port completes with all ones
    return 0xffffffffu;
  }
  if (off >= kMsixTableOffset && off < kMsixTableOffset + 16ull * cfg_.msix_vectors) return msix_read(off);
  if (off >= kMsixPbaOffset && off < kMsixPbaOffset + 8ull * ((cfg_.msix_vectors + 63) / 64)) return msix_read(off);
  if (off + 4 <= sizeof iseg_) {
    iseg_refresh();
    return uint32_t(iseg_[off]) | uint32_t(iseg_[off + 1]) << 8 | uint32_t(iseg_[off + 2]) << 16 |
           uint32_t(iseg_[off + 3]) << 24;
  }
  return 0;  // UAR pages and the unused rest of the BAR read as zero
}

namespace {
uint32_t be32(const uint8_t* b) { return uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | b[3]; }
}  // namespace

void Hca::mmio_write(uint64_t off, const uint8_t* b, size_t len) {
  if (state_ == FwState::kRemoved || len == 0 || off + len > kBar0Bytes) return;
  if ((len == 4 || len == 8) && off % len) return;
  if (!mmio_decoded()) {
    ++stats_.mmio_unclaimed;
    return;
  }
  if (off >= kMsixTableOffset && off < kMsixPbaOffset + 0x1000) {
    uint32_t le = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
    if (len == 4 && off < kMsixTableOffset + 16ull * cfg_.msix_vectors) msix_write(off, le);
    return;
  }
  if (off < sizeof iseg_) {
    if (len != 4) return;
    if (off == prm::init_seg_offset::cmdq_addr_h) {
      cmdq_addr_h_ = be32(b);
    } else if (off == prm::init_seg_offset::cmdq_addr_l_sz) {
      cmdq_addr_l_ = be32(b) & 0xfffff300u;  // address 31:12 and nic_interface; sizes are read-only
      cmdq_valid_ = true;
    } else if (off == prm::init_seg_offset::cmd_dbell) {
      uint32_t bits = be32(b);  // 32 entries: every bit names one
      update_fw_state();
      if (!alive() || state_ == FwState::kBooting || !cmdq_valid_) {
        ++stats_.doorbells_ignored;
        return;
      }
      pending_cmd_bits_ |= bits;
      kick_ = true;
    }
    return;
  }
  uint64_t uar_page = uar_page_bytes();
  if (off < kFirstUarIndex * uar_page) return;
  uint32_t uar = uint32_t(off / uar_page);
  uint32_t in_page = uint32_t(off % prm::kUarPageBytes);  // uar_4k: the doorbells repeat every 4 KiB
  Doorbell db{};
  db.uar = uar;
  db.len = uint32_t(len > sizeof db.bytes ? sizeof db.bytes : len);
  memcpy(db.bytes, b, db.len);
  if (in_page == prm::kUarCqDoorbell && len == 8) {
    db.kind = DbKind::kCqArm;
  } else if (in_page == prm::kUarEqArm && len == 4) {
    db.kind = DbKind::kEqArm;
  } else if (in_page == prm::kUarEqUpdate && len == 4) {
    db.kind = DbKind::kEqUpdate;
  } else if (in_page >= prm::kUarBlueFlame && in_page < prm::kUarBlueFlame + 2 * prm::bf_buffer_bytes(9) &&
             (in_page - prm::kUarBlueFlame) % prm::bf_buffer_bytes(9) == 0 && len >= 8) {
    db.kind = DbKind::kSend;  // 8 bytes: a send doorbell; 64+ bytes: BlueFlame (a WQE copy)
  } else {
    ++stats_.doorbells_ignored;
    return;
  }
  if (!alive() || state_ != FwState::kInitialized) {
    ++stats_.doorbells_ignored;  // doorbells are dead until the HCA is initialised (again)
    return;
  }
  doorbells_.push_back(db);
  // A host that services its own client doorbells (send, CQ arm) still leaves the driver's EQ
  // doorbells to the worker.
  if (!host_services_ || db.kind == DbKind::kEqArm || db.kind == DbKind::kEqUpdate) kick_ = true;
}

}  // namespace melon::mlx5::emu
