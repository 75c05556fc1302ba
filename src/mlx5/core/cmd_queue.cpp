#include "mlx5/core/cmd_queue.h"

#include <string.h>

#include "mlx5/core/bar.h"
#include "mlx5/core/log.h"
#include "mlx5/prm/barrier.h"
#include "mlx5/prm/cmd_if.h"
#include "mlx5/prm/init_seg.h"
#include "mlx5/prm/registry.h"

namespace melon::mlx5::core {

namespace {
namespace p = prm;
constexpr uint32_t kSupportedCmdifRev = 5;  // PRM: command interface revision 5
constexpr uint32_t kEntryOwnerByte = 63;  // ownership is the low bit of the entry's last byte
constexpr uint8_t kOwnerHw = 1;

constexpr uint32_t kKeepBlocks = 64;  // 64 KiB of 1 KiB mailboxes

uint32_t blocks_for(uint32_t len) {
  return len <= p::kInlineInputBytes ? 0
                                     : (len - p::kInlineInputBytes + p::kMailboxDataBytes - 1) / p::kMailboxDataBytes;
}
}  // namespace

Err CmdQueue::init(Hal* hal, DmaLedger* ledger, CmdWaitHooks* hooks) {
  hal_ = hal;
  ledger_ = ledger;
  hooks_ = hooks;
  fenced_ = false;
  event_mode_ = false;
  uint32_t rev = bar_field(*hal, p::initial_seg::cmd_interface_rev);
  if (rev != kSupportedCmdifRev) {
    MLX_ERR(*hal, cmd, "command interface revision %u, need %u", rev, kSupportedCmdifRev);
    return Err::unsupported;
  }
  uint32_t log_size = bar_field(*hal, p::initial_seg::log_cmdq_size);
  log_stride_ = bar_field(*hal, p::initial_seg::log_cmdq_stride);
  nslots_ = 1u << log_size;
  if (nslots_ > kMaxSlots || log_size + log_stride_ > 12 || (1u << log_stride_) < p::kCmdEntryBytes) {
    MLX_ERR(*hal, cmd, "unusable command queue geometry: log_size %u log_stride %u", log_size, log_stride_);
    return Err::unsupported;
  }
  if (!lock_ && !(lock_ = hal->lock_create())) return Err::no_memory;
  slots_ = static_cast<Slot*>(hal->mem_alloc(sizeof(Slot) * nslots_));
  if (!slots_) return Err::no_memory;
  for (uint32_t i = 0; i < nslots_; ++i) slots_[i].state = kSlotFree;
  if (Err e = pool_.init(hal, ledger, p::kMailboxBytes, kPoolBlocks); e != Err::ok) return e;
  if (Err e = ledger->alloc(4096, 4096, &queue_); e != Err::ok) return e;
  memset(queue_.va, 0, queue_.size);
  // The high half first: the low write (which also sets nic_interface to full driver) commits it.
  hal->write32(bar_offset(p::initial_seg::cmdq_phy_addr_63_32), uint32_t(queue_.iova >> 32));
  hal->write32(bar_offset(p::initial_seg::cmdq_phy_addr_31_12), uint32_t(queue_.iova) & 0xfffff000u);
  MLX_INFO(*hal, cmd, "command queue at iova 0x%llx: %u slots, stride %u", (unsigned long long)queue_.iova, nslots_,
           1u << log_stride_);
  return Err::ok;
}

void CmdQueue::shutdown() {
  if (slots_) {
    for (uint32_t i = 0; i < nslots_; ++i) {
      release_chain(slots_[i].in, slots_[i].state == kSlotQuarantined);
      release_chain(slots_[i].out, slots_[i].state == kSlotQuarantined);
    }
  }
  bool unsafe = quarantined_slots() > 0;
  pool_.destroy();
  if (queue_.va) ledger_->free(queue_, unsafe);
  queue_ = {};
  if (slots_) hal_->mem_free(slots_, sizeof(Slot) * nslots_);
  slots_ = nullptr;
  if (lock_) hal_->lock_destroy(lock_);
  lock_ = nullptr;
  nslots_ = 0;
}

uint32_t CmdQueue::quarantined_slots() const {
  uint32_t n = 0;
  for (uint32_t i = 0; slots_ && i < nslots_; ++i) n += slots_[i].state == kSlotQuarantined;
  return n;
}

void CmdQueue::release_quarantine() {
  HalLock l(*hal_, lock_);
  for (uint32_t i = 0; i < nslots_; ++i) {
    if (slots_[i].state != kSlotQuarantined) continue;
    slots_[i].in.count = slots_[i].out.count = 0;
    slots_[i].state = kSlotFree;
  }
  pool_.release_quarantine();
}

// The last slot is kept for firmware page commands, so a page request can always be answered
// even when every other slot waits on the firmware (which may be waiting for those pages).
int CmdQueue::take_slot(bool page_slot) {
  HalLock l(*hal_, lock_);
  uint32_t reserved = nslots_ > 1 ? nslots_ - 1 : 0;
  uint32_t lo = page_slot ? reserved : 0, hi = page_slot ? nslots_ : (nslots_ > 1 ? reserved : 1);
  for (uint32_t i = lo; i < hi; ++i) {
    if (slots_[i].state == kSlotFree) {
      slots_[i].state = kSlotBusy;
      slots_[i].done = 0;
      return int(i);
    }
  }
  return -1;
}

Err CmdQueue::build_chain(Chain& c, const uint8_t* data, uint32_t len, uint8_t token) {
  uint32_t n = blocks_for(len);
  if (n > kMaxMailboxes) return Err::invalid;
  c.count = 0;
  if (n > kInlineMailboxes) {
    c.heap = static_cast<DmaPool::Block*>(hal_->mem_alloc(sizeof(DmaPool::Block) * n));
    if (!c.heap) return Err::no_memory;
    c.heap_cap = n;
  }
  DmaPool::Block* b = c.blocks();
  for (uint32_t i = 0; i < n; ++i) {
    Err e;
    {
      HalLock l(*hal_, lock_);
      e = pool_.alloc(&b[i]);
    }
    if (e != Err::ok) {
      release_chain(c, false);
      return e;
    }
    c.count = i + 1;
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t* box = static_cast<uint8_t*>(b[i].va);
    p::cmd_if_box::view v(box);
    if (data) {
      uint32_t off = p::kInlineInputBytes + i * p::kMailboxDataBytes;
      uint32_t chunk = len - off < p::kMailboxDataBytes ? len - off : p::kMailboxDataBytes;
      memcpy(v.bytes(p::cmd_if_box::mailbox_data), data + off, chunk);
    }
    p::mailbox_set_next(box, i + 1 < n ? b[i + 1].iova : 0);
    v.set(p::cmd_if_box::block_number, i).set(p::cmd_if_box::token, token);
  }
  return Err::ok;
}

// A long chain's blocks go back, and so do the pool's free chunks beyond 64 KiB (a few short
// commands' worth; it grows again on demand), so a rare long command (a large CQ) does not keep
// its megabyte of DMA memory.
void CmdQueue::release_chain(Chain& c, bool quarantine) {
  HalLock l(*hal_, lock_);
  DmaPool::Block* b = c.blocks();
  for (uint32_t i = 0; i < c.count; ++i) quarantine ? pool_.quarantine(b[i]) : pool_.free(b[i]);
  c.count = 0;
  if (c.heap) {
    hal_->mem_free(c.heap, sizeof(DmaPool::Block) * c.heap_cap);
    c.heap = nullptr;
    c.heap_cap = 0;
    pool_.trim((kKeepBlocks + pool_.blocks_per_chunk() - 1) / pool_.blocks_per_chunk());
  }
}

void CmdQueue::complete(uint32_t slot_bits) {
  for (uint32_t i = 0; i < nslots_; ++i)
    if (slot_bits & (1u << i)) __atomic_store_n(&slots_[i].done, 1, __ATOMIC_RELEASE);
}

Err CmdQueue::wait(uint32_t slot, uint32_t timeout_ms) {
  const uint8_t* own = entry(slot) + kEntryOwnerByte;
  uint64_t start = hal_->now_ns();
  uint64_t limit = uint64_t(timeout_ms) * 1000000ull;
  for (uint32_t spin = 0;; ++spin) {
    bool hw_owned = (__atomic_load_n(own, __ATOMIC_ACQUIRE) & 1) == kOwnerHw;
    // In event mode the completion EQE says "look"; the ownership bit still decides, so a late EQE
    // of an earlier command on this slot cannot complete this one early.
    if (!hw_owned && (!event_mode() || __atomic_load_n(&slots_[slot].done, __ATOMIC_ACQUIRE))) {
      udma_from_device_barrier();  // the output the device wrote before it gave the entry back
      return Err::ok;
    }
    // An MMIO read costs about a microsecond on hardware: look for a dead device now and then.
    if (fenced() || (spin % 32 == 31 && hooks_->cmd_device_dead())) return Err::dead;
    if (hal_->now_ns() - start > limit) {
      if (event_mode() && !hw_owned) {
        MLX_WARN(*hal_, cmd, "slot %u done without its completion event", slot);
        udma_from_device_barrier();
        return Err::ok;
      }
      return Err::timeout;
    }
    hooks_->cmd_wait_idle();
    if (spin > 32) hal_->delay_us(spin > 1000 ? 200 : 5);
  }
}

Err CmdQueue::exec(const void* in, uint32_t in_len, void* out, uint32_t out_len, CmdFailure* fail, uint32_t timeout_ms,
                   bool page_slot) {
  uint16_t opcode = p::cmd_opcode(in);
  uint16_t op_mod = p::cmd_op_mod(in);
  CmdFailure f{opcode, 0, 0, 0};
  if (fail) *fail = f;
  if (!slots_) return Err::dead;
  if (fenced()) return Err::dead;
  if (in_len < 8 || out_len < 8) return Err::invalid;
  if (!timeout_ms) timeout_ms = default_timeout_ms_;

  int s;
  uint64_t start = hal_->now_ns();
  while ((s = take_slot(page_slot)) < 0) {
    if (fenced()) return Err::dead;
    if (hal_->now_ns() - start > uint64_t(timeout_ms) * 1000000ull) {
      MLX_ERR(*hal_, cmd, "%s(0x%x): no free command slot", p::opcode_name(opcode), opcode);
      return Err::busy;
    }
    hooks_->cmd_wait_idle();
    hal_->delay_us(10);
  }
  uint32_t slot = uint32_t(s);
  Slot& sl = slots_[slot];
  uint8_t token;
  {
    HalLock l(*hal_, lock_);
    token = ++token_ ? token_ : ++token_;  // never 0
  }
  if (Err e = build_chain(sl.in, static_cast<const uint8_t*>(in), in_len, token); e != Err::ok) {
    HalLock l(*hal_, lock_);
    sl.state = kSlotFree;
    return e;
  }
  if (Err e = build_chain(sl.out, nullptr, out_len, token); e != Err::ok) {
    release_chain(sl.in, false);
    HalLock l(*hal_, lock_);
    sl.state = kSlotFree;
    return e;
  }

  uint8_t* ent = entry(slot);
  memset(ent, 0, p::kCmdEntryBytes);
  p::cmd_queue_entry::view v(ent);
  v.set(p::cmd_queue_entry::type, p::kCmdQueueEntryTypePcie)
      .set(p::cmd_queue_entry::input_length, in_len)
      .set(p::cmd_queue_entry::output_length, out_len)
      .set(p::cmd_queue_entry::token, token);
  memcpy(v.bytes(p::cmd_queue_entry::command_input_inline_data), in,
         in_len < p::kInlineInputBytes ? in_len : p::kInlineInputBytes);
  if (sl.in.count) p::cmd_entry_set_in_mailbox(ent, sl.in.blocks()[0].iova);
  if (sl.out.count) p::cmd_entry_set_out_mailbox(ent, sl.out.blocks()[0].iova);
  // Hand the entry over last, after everything it points to is written (Linux mlx5 cmd.c: a write
  // barrier before the ownership byte and another before the doorbell).
  udma_to_device_barrier();
  __atomic_store_n(ent + kEntryOwnerByte, kOwnerHw, __ATOMIC_RELEASE);
  MLX_DBG(*hal_, cmd, "%s(0x%x) op_mod 0x%x slot %u in %u out %u", p::opcode_name(opcode), opcode, op_mod, slot, in_len,
          out_len);
  udma_to_device_barrier();
  hal_->write32(bar_offset(p::initial_seg::command_doorbell_vector), 1u << slot);
  __atomic_add_fetch(&commands_, 1, __ATOMIC_RELAXED);

  Err e = wait(slot, timeout_ms);
  if (e != Err::ok) {
    // The device may still own the entry and write the mailboxes: keep all of it out of reach.
    release_chain(sl.in, true);
    release_chain(sl.out, true);
    {
      HalLock l(*hal_, lock_);
      sl.state = kSlotQuarantined;
    }
    MLX_ERR(*hal_, cmd, "%s(0x%x) op_mod 0x%x %s after %llu ms; slot %u quarantined", p::opcode_name(opcode), opcode,
            op_mod, e == Err::timeout ? "timed out" : "abandoned (device dead)",
            (unsigned long long)((hal_->now_ns() - start) / 1000000ull), slot);
    if (fail) *fail = f;
    return e;
  }

  f.delivery = uint8_t(v.get(p::cmd_queue_entry::status));
  uint8_t* o = static_cast<uint8_t*>(out);
  memcpy(o, v.bytes(p::cmd_queue_entry::command_output_inline_data),
         out_len < p::kInlineOutputBytes ? out_len : p::kInlineOutputBytes);
  for (uint32_t i = 0; i < sl.out.count; ++i) {
    uint32_t off = p::kInlineOutputBytes + i * p::kMailboxDataBytes;
    uint32_t chunk = out_len - off < p::kMailboxDataBytes ? out_len - off : p::kMailboxDataBytes;
    memcpy(o + off, p::cmd_if_box::cview(sl.out.blocks()[i].va).bytes(p::cmd_if_box::mailbox_data), chunk);
  }
  release_chain(sl.in, false);
  release_chain(sl.out, false);
  {
    HalLock l(*hal_, lock_);
    sl.state = kSlotFree;
  }

  if (f.delivery != p::delivery_status::DELIVERED) {
    const char* dn = p::delivery_status::name_of(f.delivery);
    MLX_ERR(*hal_, cmd, "%s(0x%x) not delivered: %s(0x%x)", p::opcode_name(opcode), opcode, dn ? dn : "UNKNOWN",
            f.delivery);
    if (fail) *fail = f;
    return Err::delivery;
  }
  f.status = p::cmd_status_of(out);
  f.syndrome = p::cmd_syndrome_of(out);
  if (fail) *fail = f;
  if (f.status != p::cmd_status::OK) {
    const char* sn = p::cmd_status::name_of(f.status);
    MLX_ERR(*hal_, cmd, "%s(0x%x) op_mod 0x%x failed: status %s(0x%x) syndrome 0x%x", p::opcode_name(opcode), opcode,
            op_mod, sn ? sn : "UNKNOWN", f.status, f.syndrome);
    return Err::cmd_status;
  }
  return Err::ok;
}

}  // namespace melon::mlx5::core
