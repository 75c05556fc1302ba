// Firmware pages (PRM "ICM pages"): 4 KiB pages the driver lends the HCA for its own contexts.
//
// Every page has one explicit state:
//   allocated    in the driver's hands, never given (fresh from a DMA chunk)
//   given        the firmware owns it (MANAGE_PAGES give succeeded)
//   returned     the firmware gave it back (MANAGE_PAGES take); reusable
//   quarantined  given when the device went fatal, or in a give whose outcome is unknown: it
//                may still be written, so it is neither reused nor freed until a function reset
// Counts per state are exact and checked at teardown. A chunk of DMA memory goes back to the
// ledger only when none of its pages is given or quarantined.
//
// PAGE_REQUEST events only record the request (note_request()); the work runs later, outside
// the event callback, in run_pending().
#pragma once

#include "mlx5/core/cmd_queue.h"
#include "mlx5/core/dma.h"
#include "mlx5/core/error.h"

namespace melon::mlx5::core {

enum class PageState : uint8_t { allocated, given, returned, quarantined };
const char* page_state_name(PageState s);

class PageManager {
 public:
  static constexpr uint32_t kPageBytes = 4096;
  static constexpr uint32_t kMaxPerCommand = 4096;

  void init(Hal* hal, DmaLedger* ledger, CmdQueue* cmd);
  // The most pages the firmware may hold; a request beyond it is refused (ALLOCATION_FAIL).
  void set_limit(uint32_t max_pages) { limit_ = max_pages; }
  // Boot or init pages during bring-up: QUERY_PAGES then give what the firmware asks for.
  Err satisfy_startup(uint16_t query_op_mod, CmdFailure* fail);
  Err give(uint16_t function_id, uint32_t npages, CmdFailure* fail);
  Err reclaim(uint16_t function_id, uint32_t npages, uint32_t* got, CmdFailure* fail);
  // After TEARDOWN_HCA: take back every given page (the firmware returns them all).
  Err reclaim_all(CmdFailure* fail);

  // From the async EQ (any context): remember the request and return at once.
  void note_request(uint16_t function_id, int32_t npages);
  bool has_pending() const { return __atomic_load_n(&pending_flag_, __ATOMIC_ACQUIRE); }
  // From a context that may run commands.
  Err run_pending();

  // The device went fatal: given pages may still be written.
  void quarantine_given();
  // After a function reset the device holds nothing: every page is back in our hands.
  void reset_done();
  // Returns every chunk to the DMA ledger; pages still given or quarantined stay with the
  // ledger's quarantine. Returns the number of pages that were not back.
  uint32_t destroy();

  uint32_t count(PageState s) const { return counts_[uint8_t(s)]; }
  uint32_t given() const { return count(PageState::given); }
  uint64_t given_total() const { return given_total_; }
  uint64_t returned_total() const { return returned_total_; }
  uint32_t unknown_returns() const { return unknown_returns_; }
  uint32_t chunks() const { return nchunks_; }

 private:
  static constexpr uint32_t kPagesPerChunk = 16;  // 64 KiB chunks: a multiple of 4 and 16 KiB pages
  struct Chunk {
    DmaBuffer buf;
    PageState state[kPagesPerChunk];
  };
  void set_state(Chunk& c, uint32_t i, PageState s);
  Err take_free_page(uint32_t* chunk, uint32_t* index);
  Chunk* find(uint64_t iova, uint32_t* index);
  void free_idle_chunks();
  Err grow_table();

  Hal* hal_ = nullptr;
  DmaLedger* ledger_ = nullptr;
  CmdQueue* cmd_ = nullptr;
  Chunk** chunks_ = nullptr;
  uint32_t nchunks_ = 0, cap_ = 0;
  uint32_t counts_[4] = {};
  uint64_t given_total_ = 0, returned_total_ = 0;
  uint32_t unknown_returns_ = 0;
  uint16_t function_id_ = 0;
  uint32_t limit_ = 1u << 20;
  int32_t pending_ = 0;
  bool pending_flag_ = false;
  bool busy_ = false;  // run_pending() is running (it may be entered from a command wait)
};

}  // namespace melon::mlx5::core
