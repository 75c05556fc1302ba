// The command interface (PRM "Command Interface"): a queue of up to 32 entries in host memory,
// each with input/output mailbox chains from a DMA pool, rung through the BAR0 doorbell.
//
// Completion is found by polling the entry's ownership bit during bring-up, and through the
// async EQ's command-completion events once EQs exist (event mode). Every command has a timeout.
// A slot that timed out, and the mailboxes it held, are quarantined: never reused and never
// freed, because the device may still write them; only a function reset releases them.
#pragma once

#include "mlx5/core/dma.h"
#include "mlx5/core/error.h"
#include "mlx5/core/hal.h"

namespace melon::mlx5::core {

// What the queue asks of its owner while it waits.
class CmdWaitHooks {
 public:
  // Called between checks: poll event queues when there are no interrupts, run deferred work.
  virtual void cmd_wait_idle() {}
  // True when the device is fatal or gone: stop waiting at once.
  virtual bool cmd_device_dead() { return false; }

 protected:
  ~CmdWaitHooks() = default;
};

class CmdQueue {
 public:
  static constexpr uint32_t kMaxSlots = 32;
  // The longest chain either way: 1 MiB of command data. A CQ of 2^22 CQEs (log_max_cq_sz) in 4 KiB
  // pages is 512 KiB of page addresses; Linux sizes each command's chain to the command, unbounded.
  static constexpr uint32_t kMaxMailboxes = 2048;
  // Mailboxes a slot holds without allocating: commands up to ~4 KiB, nearly all of them.
  static constexpr uint32_t kInlineMailboxes = 8;
  // The pool's DMA blocks: both chains of one longest command, and room for the others beside it.
  static constexpr uint32_t kPoolBlocks = 2 * kMaxMailboxes + kMaxSlots * 2 * kInlineMailboxes;
  static constexpr uint32_t kDefaultTimeoutMs = 60000;

  // Reads the queue geometry from the initialization segment, allocates the queue page and
  // writes its address (cmdq_phy_addr, nic_interface = full driver).
  Err init(Hal* hal, DmaLedger* ledger, CmdWaitHooks* hooks);
  // Frees the queue and the mailbox pool (quarantined pieces stay quarantined in the ledger).
  void shutdown();

  // Runs one command. `in`/`out` are the PRM input/output structures. Returns ok only when the
  // command was delivered and its status is OK; `fail` (optional) gets what the firmware said.
  // `page_slot` uses the slot reserved for firmware page commands.
  Err exec(const void* in, uint32_t in_len, void* out, uint32_t out_len, CmdFailure* fail = nullptr,
           uint32_t timeout_ms = 0, bool page_slot = false);

  // Event mode: completion comes from CMD EQEs (complete()).
  void set_event_mode(bool on) { __atomic_store_n(&event_mode_, on, __ATOMIC_RELEASE); }
  bool event_mode() const { return __atomic_load_n(&event_mode_, __ATOMIC_ACQUIRE); }
  // A command-completion EQE: bit n set = slot n completed.
  void complete(uint32_t slot_bits);
  // Device fatal: no new commands, waiters give up.
  void fence() { __atomic_store_n(&fenced_, true, __ATOMIC_RELEASE); }
  bool fenced() const { return __atomic_load_n(&fenced_, __ATOMIC_ACQUIRE); }
  // After a function reset: quarantined slots and mailboxes become usable again.
  void release_quarantine();

  void set_default_timeout_ms(uint32_t ms) { default_timeout_ms_ = ms; }
  uint32_t slots() const { return nslots_; }
  uint32_t quarantined_slots() const;
  uint32_t mailboxes_in_use() const { return pool_.in_use(); }
  uint32_t mailboxes_quarantined() const { return pool_.quarantined(); }
  uint64_t commands_run() const { return commands_; }
  uint32_t log_stride() const { return log_stride_; }

 private:
  enum SlotState : uint8_t { kSlotFree, kSlotBusy, kSlotQuarantined };
  // Zeroed by mem_alloc, never constructed: a chain longer than kInlineMailboxes lists its
  // blocks in `heap` (mem_alloc'd for the command, freed with the chain).
  struct Chain {
    DmaPool::Block inline_blocks[kInlineMailboxes];
    DmaPool::Block* heap;
    uint32_t count, heap_cap;
    DmaPool::Block* blocks() { return heap ? heap : inline_blocks; }
  };
  struct Slot {
    SlotState state = kSlotFree;
    uint8_t done = 0;  // set by complete() in event mode
    Chain in, out;
  };
  uint8_t* entry(uint32_t slot) { return static_cast<uint8_t*>(queue_.va) + (slot << log_stride_); }
  int take_slot(bool page_slot);
  Err build_chain(Chain& c, const uint8_t* data, uint32_t len, uint8_t token);
  void release_chain(Chain& c, bool quarantine);
  Err wait(uint32_t slot, uint32_t timeout_ms);

  Hal* hal_ = nullptr;
  DmaLedger* ledger_ = nullptr;
  CmdWaitHooks* hooks_ = nullptr;
  void* lock_ = nullptr;
  DmaBuffer queue_;
  DmaPool pool_;
  uint32_t nslots_ = 0, log_stride_ = 0;
  uint32_t default_timeout_ms_ = kDefaultTimeoutMs;
  uint8_t token_ = 0;
  bool event_mode_ = false, fenced_ = false;
  uint64_t commands_ = 0;
  Slot* slots_ = nullptr;  // nslots_ of them, from mem_alloc
};

}  // namespace melon::mlx5::core
