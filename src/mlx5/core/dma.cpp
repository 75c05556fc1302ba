#include "mlx5/core/dma.h"

#include <string.h>

#include "mlx5/core/log.h"

namespace melon::mlx5::core {

Err DmaLedger::alloc(uint64_t size, uint64_t align, DmaBuffer* out) {
  uint64_t page = hal_->host_page_size();
  size = (size + page - 1) / page * page;
  if (hal_->dma_alloc(size, align < page ? page : align, out) != kHalOk) return Err::no_memory;
  ++live_;
  ++total_allocs_;
  live_bytes_ += out->size;
  return Err::ok;
}

void DmaLedger::free(const DmaBuffer& buf, bool device_may_write) {
  if (!buf.va) return;
  if (fenced_ || device_may_write) {
    Node* n = static_cast<Node*>(hal_->mem_alloc(sizeof(Node)));
    if (n) {
      n->buf = buf;
      n->next = quarantine_;
      quarantine_ = n;
      ++quarantined_;
      return;
    }
    // No memory for the note: leak the buffer rather than free what the device may write.
    MLX_ERR(*hal_, pci, "DMA buffer iova 0x%llx leaked to stay safe (no memory to quarantine it)",
            (unsigned long long)buf.iova);
    return;
  }
  --live_;
  live_bytes_ -= buf.size;
  hal_->dma_free(buf);
}

void DmaLedger::release_quarantine() {
  while (quarantine_) {
    Node* n = quarantine_;
    quarantine_ = n->next;
    --quarantined_;
    --live_;
    live_bytes_ -= n->buf.size;
    hal_->dma_free(n->buf);
    hal_->mem_free(n, sizeof(Node));
  }
}

Err DmaPool::init(Hal* hal, DmaLedger* ledger, uint32_t block_bytes, uint32_t max_blocks) {
  hal_ = hal;
  ledger_ = ledger;
  block_bytes_ = block_bytes;
  uint32_t chunk = hal->host_page_size();
  if (chunk < 4 * block_bytes) chunk = 4 * block_bytes;
  per_chunk_ = chunk / block_bytes;
  max_chunks_ = (max_blocks + per_chunk_ - 1) / per_chunk_;
  chunks_ = static_cast<Chunk*>(hal->mem_alloc(sizeof(Chunk) * max_chunks_));
  return chunks_ ? Err::ok : Err::no_memory;
}

Err DmaPool::grow() {
  if (nchunks_ == max_chunks_) return Err::no_memory;
  Chunk& c = chunks_[nchunks_];
  if (Err e = ledger_->alloc(uint64_t(per_chunk_) * block_bytes_, block_bytes_, &c.buf); e != Err::ok) return e;
  c.state = static_cast<uint8_t*>(hal_->mem_alloc(per_chunk_));
  if (!c.state) {
    ledger_->free(c.buf);
    c.buf = {};
    return Err::no_memory;
  }
  ++nchunks_;
  return Err::ok;
}

Err DmaPool::alloc(Block* out) {
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t c = 0; c < nchunks_; ++c) {
      for (uint32_t i = 0; i < per_chunk_; ++i) {
        if (chunks_[c].state[i] != kFree) continue;
        chunks_[c].state[i] = kInUse;
        ++in_use_;
        uint8_t* va = static_cast<uint8_t*>(chunks_[c].buf.va) + uint64_t(i) * block_bytes_;
        memset(va, 0, block_bytes_);
        *out = {va, chunks_[c].buf.iova + uint64_t(i) * block_bytes_, c, i};
        return Err::ok;
      }
    }
    if (pass == 0)
      if (Err e = grow(); e != Err::ok) return e;
  }
  return Err::no_memory;
}

void DmaPool::free(const Block& b) {
  if (chunks_[b.chunk].state[b.index] != kInUse) return;
  chunks_[b.chunk].state[b.index] = kFree;
  --in_use_;
}

void DmaPool::quarantine(const Block& b) {
  if (chunks_[b.chunk].state[b.index] != kInUse) return;
  chunks_[b.chunk].state[b.index] = kQuarantined;
  --in_use_;
  ++quarantined_;
}

void DmaPool::release_quarantine() {
  for (uint32_t c = 0; c < nchunks_; ++c)
    for (uint32_t i = 0; i < per_chunk_; ++i)
      if (chunks_[c].state[i] == kQuarantined) chunks_[c].state[i] = kFree;
  quarantined_ = 0;
}

void DmaPool::trim(uint32_t keep_chunks) {
  while (nchunks_ > keep_chunks) {
    Chunk& c = chunks_[nchunks_ - 1];
    for (uint32_t i = 0; i < per_chunk_; ++i)
      if (c.state[i] != kFree) return;
    ledger_->free(c.buf);
    hal_->mem_free(c.state, per_chunk_);
    c = {};
    --nchunks_;
  }
}

void DmaPool::destroy() {
  for (uint32_t c = 0; c < nchunks_; ++c) {
    bool unsafe = false;
    for (uint32_t i = 0; i < per_chunk_; ++i) unsafe |= chunks_[c].state[i] != kFree;
    ledger_->free(chunks_[c].buf, unsafe);
    hal_->mem_free(chunks_[c].state, per_chunk_);
    chunks_[c] = {};
  }
  if (chunks_) hal_->mem_free(chunks_, sizeof(Chunk) * max_chunks_);
  chunks_ = nullptr;
  nchunks_ = in_use_ = quarantined_ = max_chunks_ = 0;
}

}  // namespace melon::mlx5::core
