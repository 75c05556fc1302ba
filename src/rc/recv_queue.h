// A receive queue: the QP's own RQ or a shared SRQ. Fixed capacity, allocated at creation.
#pragma once
#include <stdint.h>

#include <vector>

#include "rc/engine.h"
#include "rc/scatter_gather.h"

namespace melon::rc {

// One receive WQE: its scatter list, checked against the host's memory at post time.
struct RecvWqe {
  uint64_t wr_id = 0;
  Seg seg[kMaxSge];
  int nseg = 0;
  uint32_t length = 0;  // sum of seg lengths
  bool bad = false;  // an lkey did not grant local write: completes with IBV_WC_LOC_PROT_ERR when used
};

class RecvQueue {
 public:
  void init(uint32_t capacity, uint32_t max_sge) {
    ring_.assign(capacity ? capacity : 1, RecvWqe{});
    max_sge_ = max_sge;
    head_ = count_ = 0;
  }
  bool full() const { return count_ == ring_.size(); }
  bool empty() const { return count_ == 0; }
  uint32_t size() const { return count_; }
  uint32_t capacity() const { return uint32_t(ring_.size()); }
  uint32_t max_sge() const { return max_sge_; }
  RecvWqe& push_slot() { return ring_[(head_ + count_++) % ring_.size()]; }
  RecvWqe& front() { return ring_[head_]; }
  void pop() {
    head_ = (head_ + 1) % uint32_t(ring_.size());
    --count_;
  }
  void clear() { head_ = count_ = 0; }

 private:
  std::vector<RecvWqe> ring_;
  uint32_t head_ = 0, count_ = 0, max_sge_ = 0;
};

// Checks and stores a receive WR; false (EINVAL) if it has too many SGEs.
bool fill_recv_wqe(RecvWqe& w, const RecvWr& wr, uint32_t max_sge, HostMemory& mem, uint32_t pd);

class Srq {
 public:
  uint32_t srqn = 0;
  uint32_t pd = 0;
  uint32_t limit = 0;  // armed limit (0 = not armed)
  RecvQueue rq;
};

}  // namespace melon::rc
