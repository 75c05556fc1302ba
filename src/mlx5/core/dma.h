// DMA memory bookkeeping: every coherent buffer the core holds goes through the ledger, so
// teardown can prove nothing is left, and a device that may still write a buffer never gets it
// freed under it (quarantine until a function reset).
#pragma once

#include "mlx5/core/error.h"
#include "mlx5/core/hal.h"

namespace melon::mlx5::core {

class DmaLedger {
 public:
  void init(Hal* hal) { hal_ = hal; }
  Err alloc(uint64_t size, uint64_t align, DmaBuffer* out);
  // Frees now, or quarantines when the device is fenced (it may still write) or `device_may_write`.
  void free(const DmaBuffer& buf, bool device_may_write = false);
  // After a fatal error: frees become quarantines until release_quarantine().
  void set_fenced(bool fenced) { fenced_ = fenced; }
  bool fenced() const { return fenced_; }
  // Only after a function reset (the device can no longer write anything it was given).
  void release_quarantine();

  uint64_t live_buffers() const { return live_; }
  uint64_t live_bytes() const { return live_bytes_; }
  uint64_t quarantined_buffers() const { return quarantined_; }
  uint64_t total_allocs() const { return total_allocs_; }

 private:
  struct Node {
    DmaBuffer buf;
    Node* next;
  };
  Hal* hal_ = nullptr;
  bool fenced_ = false;
  Node* quarantine_ = nullptr;
  uint64_t live_ = 0, live_bytes_ = 0, quarantined_ = 0, total_allocs_ = 0;
};

// Fixed-size DMA blocks (command mailboxes: 1 KiB aligned) carved from host-page chunks.
// A block is free, in use or quarantined; quarantined blocks are never handed out again, and
// their chunk is only returned to the ledger once nothing in it is in use (quarantined chunks go
// to the ledger's quarantine). The pool grows a chunk at a time up to `max_blocks`; trim() gives
// back the free chunks at its end, so one long command does not pin its mailboxes for good.
class DmaPool {
 public:
  struct Block {
    void* va;
    uint64_t iova;
    uint32_t chunk;
    uint32_t index;
  };

  Err init(Hal* hal, DmaLedger* ledger, uint32_t block_bytes, uint32_t max_blocks);
  Err alloc(Block* out);
  void free(const Block& b);
  void quarantine(const Block& b);
  // After a reset: quarantined blocks become free again.
  void release_quarantine();
  // Returns the wholly free chunks at the end, keeping at least `keep_chunks`.
  void trim(uint32_t keep_chunks);
  // Returns every chunk to the ledger (quarantined ones stay quarantined there).
  void destroy();

  uint32_t in_use() const { return in_use_; }
  uint32_t quarantined() const { return quarantined_; }
  uint32_t chunks() const { return nchunks_; }
  uint32_t blocks_per_chunk() const { return per_chunk_; }

 private:
  enum : uint8_t { kFree, kInUse, kQuarantined };
  struct Chunk {
    DmaBuffer buf;
    uint8_t* state;  // per block
  };
  Err grow();
  Hal* hal_ = nullptr;
  DmaLedger* ledger_ = nullptr;
  uint32_t block_bytes_ = 0, per_chunk_ = 0, nchunks_ = 0, max_chunks_ = 0;
  uint32_t in_use_ = 0, quarantined_ = 0;
  Chunk* chunks_ = nullptr;  // max_chunks_ of them (mem_alloc), the first nchunks_ backed
};

}  // namespace melon::mlx5::core
