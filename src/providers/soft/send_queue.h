// The send queue between the engine and the kernel: batches the engine filled (tx_batch.h), in the
// order they were filled, and the rule that one thread at a time sends them, so packets leave in
// queue order and no thread that posts waits for another thread's sendmmsg.
//
// Locks: q_mu_ guards the queue and the spare batches and is held for pointer moves only. tx_mu_
// is held by the one thread sending; it lets go of it inside q_mu_ at the moment it finds the queue
// empty, so a batch queued before that moment is the sender's to send, and one queued after it
// finds tx_mu_ free for the thread that queued it (every thread that pushes calls send() next).
// Order: tx_mu_ -> q_mu_.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "providers/soft/tx_batch.h"

namespace melon::soft {

class SendQueue {
 public:
  explicit SendQueue(uint32_t window) : window_(window) {}

  // `*stage` joins the queue; a spare (or a new batch) takes its place.
  void push(std::unique_ptr<TxBatch>* stage) {
    std::lock_guard<std::mutex> g(q_mu_);
    queue_.push_back(std::move(*stage));
    queued_.fetch_add(1, std::memory_order_relaxed);
    if (spare_.empty()) {
      stage->reset(new TxBatch(window_));
    } else {
      *stage = std::move(spare_.back());
      spare_.pop_back();
    }
  }

  // Sends every queued batch with `send_batch(TxBatch&)`. `wait`: until this thread has sent or
  // seen sent everything queued so far (the control path); otherwise a thread that finds another
  // sending leaves its batches to it. Nothing queued: no lock (a thread sees its own pushes here).
  template <typename F>
  void send(bool wait, F&& send_batch) {
    if (!wait && !queued_.load(std::memory_order_relaxed)) return;
    if (wait)
      tx_mu_.lock();
    else if (!tx_mu_.try_lock())
      return;
    std::unique_ptr<TxBatch> b = pop(nullptr);
    while (b) {
      send_batch(*b);
      b->clear();
      b = pop(std::move(b));  // the sent batch back to the spares and the next one, in one lock
    }
  }

  size_t queued() const { return queued_.load(std::memory_order_relaxed); }

 private:
  // With tx_mu_ held: `sent` (if any) back among the spares, and the oldest queued batch taken; if
  // there is none, tx_mu_ is released (under q_mu_) and nullptr returned.
  std::unique_ptr<TxBatch> pop(std::unique_ptr<TxBatch> sent) {
    std::lock_guard<std::mutex> g(q_mu_);
    if (sent) spare_.push_back(std::move(sent));
    if (queue_.empty()) {
      tx_mu_.unlock();
      return nullptr;
    }
    std::unique_ptr<TxBatch> b = std::move(queue_.front());
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    return b;
  }

  uint32_t window_;
  std::mutex q_mu_, tx_mu_;
  std::deque<std::unique_ptr<TxBatch>> queue_;  // guarded by q_mu_
  std::vector<std::unique_ptr<TxBatch>> spare_;  // guarded by q_mu_
  std::atomic<size_t> queued_{0};  // queue_.size(), changed under q_mu_, read without it by send()
};

}  // namespace melon::soft
