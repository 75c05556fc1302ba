// The soft provider's send queue (providers/soft/send_queue.h): batches leave in the order they
// were queued, a sent batch comes back as the next spare, and a thread that finds another sending
// returns at once, its batch sent by that thread after the ones before it. Deterministic: the one
// second thread runs to its end inside the first thread's send.
#include "providers/soft/send_queue.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace melon::soft {
namespace {

// Stages a batch marked `mark` (its nslots; clear() resets it) and queues it.
void queue(SendQueue& q, std::unique_ptr<TxBatch>* stage, int mark) {
  (*stage)->nslots = mark;
  q.push(stage);
}

TEST(SoftSendQueue, BatchesLeaveInQueueOrderAndComeBackAsSpares) {
  SendQueue q(64);
  std::unique_ptr<TxBatch> stage(new TxBatch(64));
  std::vector<TxBatch*> pushed;
  for (int mark = 1; mark <= 3; ++mark) {
    pushed.push_back(stage.get());
    queue(q, &stage, mark);
  }
  EXPECT_EQ(q.queued(), 3u);
  std::vector<int> sent;
  std::vector<TxBatch*> sent_ptr;
  q.send(false, [&](TxBatch& b) {
    sent.push_back(b.nslots);
    sent_ptr.push_back(&b);
  });
  EXPECT_EQ(sent, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(sent_ptr, pushed);
  EXPECT_EQ(q.queued(), 0u);
  // The next push takes a spare, cleared: no allocation once the queue has cycled.
  TxBatch* before = stage.get();
  queue(q, &stage, 4);
  EXPECT_NE(stage.get(), before);
  EXPECT_TRUE(stage.get() == pushed[0] || stage.get() == pushed[1] || stage.get() == pushed[2]);
  EXPECT_EQ(stage->nslots, 0);
}

TEST(SoftSendQueue, NothingQueuedSendsNothing) {
  SendQueue q(64);
  int calls = 0;
  q.send(false, [&](TxBatch&) { ++calls; });
  q.send(true, [&](TxBatch&) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(SoftSendQueue, APosterThatFindsAnotherSendingLeavesItsBatchToThatSender) {
  SendQueue q(64);
  std::unique_ptr<TxBatch> stage(new TxBatch(64));
  queue(q, &stage, 1);
  std::vector<int> sent;
  bool other_returned = false;
  q.send(false, [&](TxBatch& b) {
    sent.push_back(b.nslots);
    if (b.nslots != 1) return;
    // Another thread posts while this one sends: it queues and returns without sending.
    std::thread other([&] {
      std::unique_ptr<TxBatch> its(new TxBatch(64));
      queue(q, &its, 2);
      q.send(false, [&](TxBatch&) { ADD_FAILURE() << "sent by the poster, not the sender"; });
      other_returned = true;
    });
    other.join();
  });
  EXPECT_TRUE(other_returned);
  EXPECT_EQ(sent, (std::vector<int>{1, 2}));  // the sender took it before letting go
  EXPECT_EQ(q.queued(), 0u);
}

}  // namespace
}  // namespace melon::soft
