// A receive queue: the QP's own RQ or a shared SRQ. Fixed capacity, allocated at creation.
#pragma once
#include <stdint.h>

#include <vector>

#include "rc/engine.h"
#include "rc/scatter_gather.h"

namespace melon::rc {

// One receive WQE: its scatter list as keys and addresses.
struct RecvWqe {
  uint64_t wr_id = 0;
  Seg seg[kMaxSge];
  int nseg = 0;
  uint32_t length = 0;  // sum of seg lengths
  bool bad = false;  // taken, and an lkey did not grant local write (Outcome::recv_protection_error)
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

// Stores a receive WR; false (EINVAL) if it has too many SGEs. Its keys are checked when the
// responder takes it (recv_wqe_writable), so a region re-registered or gone meanwhile is seen as it
// is then.
bool fill_recv_wqe(RecvWqe& w, const RecvWr& wr, uint32_t max_sge);
bool recv_wqe_writable(const RecvWqe& w, HostMemory& mem, uint32_t pd);

class Srq {
 public:
  uint32_t srqn = 0;
  uint32_t pd = 0;
  uint32_t limit = 0;  // armed limit (0 = not armed)
  RecvQueue rq;
};

}  // namespace melon::rc
