// A receive queue: the QP's own RQ or a shared SRQ. Fixed capacity, allocated at creation.
#pragma once
#include <stdint.h>

#include <vector>

#include "rc/engine.h"

namespace melon::rc {

// A receive WR as posted: its scatter list stays keys and addresses until the responder takes it,
// so a memory region re-registered or deregistered meanwhile is checked as it is then (IBA 10.6.3:
// the access rights in force are those of the MR at the time the data is placed).
struct PostedRecv {
  static constexpr int kMaxSge = 32;
  uint64_t wr_id = 0;
  Sge sge[kMaxSge];
  int nsge = 0;
};

// A receive WQE the responder took, its scatter list resolved to host memory.
struct RecvWqe {
  static constexpr int kMaxSge = PostedRecv::kMaxSge;
  uint64_t wr_id = 0;
  struct Seg {
    uint8_t* ptr;
    uint32_t len;
  } seg[kMaxSge];
  int nseg = 0;
  uint32_t length = 0;  // sum of seg lengths
  bool bad = false;  // an lkey failed to resolve: completes with IBV_WC_LOC_PROT_ERR
};

class RecvQueue {
 public:
  void init(uint32_t capacity, uint32_t max_sge) {
    ring_.assign(capacity ? capacity : 1, PostedRecv{});
    max_sge_ = max_sge;
    head_ = count_ = 0;
  }
  bool full() const { return count_ == ring_.size(); }
  bool empty() const { return count_ == 0; }
  uint32_t size() const { return count_; }
  uint32_t capacity() const { return uint32_t(ring_.size()); }
  uint32_t max_sge() const { return max_sge_; }
  PostedRecv& push_slot() { return ring_[(head_ + count_++) % ring_.size()]; }
  PostedRecv& front() { return ring_[head_]; }
  void pop() {
    head_ = (head_ + 1) % uint32_t(ring_.size());
    --count_;
  }
  void clear() { head_ = count_ = 0; }

 private:
  std::vector<PostedRecv> ring_;
  uint32_t head_ = 0, count_ = 0, max_sge_ = 0;
};

// Stores a receive WR; false (EINVAL) if it has too many SGEs.
bool fill_recv_wqe(PostedRecv& w, const RecvWr& wr, uint32_t max_sge);

// Resolves a posted receive against the memory regions as they are now (local write access, in
// protection domain `pd`: the QP's, or the SRQ's for a WR posted to an SRQ).
void resolve_recv(RecvWqe& out, const PostedRecv& in, Memory& mem, uint32_t pd);

// Copies `len` bytes to byte offset `off` of a list of segments (the caller checked the total).
void copy_to_segments(const RecvWqe::Seg* seg, int nseg, uint32_t off, const uint8_t* src, uint32_t len);

// Copies `len` bytes to byte offset `off` of the WQE's scatter list; false if it doesn't fit.
bool scatter(const RecvWqe& w, uint32_t off, const uint8_t* src, uint32_t len);

class Srq {
 public:
  uint32_t srqn = 0;
  uint32_t pd = 0;
  uint32_t limit = 0;  // armed limit (0 = not armed)
  RecvQueue rq;
};

}  // namespace melon::rc
