// The busy-poll lease's decisions (providers/soft/busy_poll_lease.h) on a clock the test holds:
// when a spin takes the lease, what ends it, the back-off after a stream, a waiter's lease, and the
// progress thread's view. No threads or sockets, so nothing here depends on the scheduler (the
// transport's behaviour with real threads is soft_progress_test.cpp's).
#include "providers/soft/busy_poll_lease.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace melon::soft {
namespace {

using Lease = BusyPollLease;
constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;
constexpr uint64_t kT0 = 1000 * kMs;  // any clock reading far from 0

// Polls every `step` from `*now` until `until`; returns the time of the poll that took the lease
// (0 if none did) and leaves *now at the last poll.
uint64_t spin(Lease& l, uint64_t* now, uint64_t until, uint64_t step = 5 * kUs) {
  uint64_t took = 0;
  for (; *now <= until; *now += step)
    if (l.on_poll(*now).taken) {
      EXPECT_EQ(took, 0u) << "taken twice in one spin";
      took = *now;
    }
  *now -= step;
  return took;
}

TEST(BusyPollLease, ASpinOf50usTakesItOnceAndEveryLaterPollHoldsIt) {
  Lease l;
  uint64_t now = kT0;
  EXPECT_FALSE(l.on_poll(now).leased);  // the first poll after a pause starts a spin
  const uint64_t took = spin(l, &now, kT0 + 200 * kUs);
  EXPECT_EQ(took, kT0 + Lease::kSpinMinNs);
  EXPECT_TRUE(l.held());
  const Lease::Poll p = l.on_poll(now + 5 * kUs);
  EXPECT_TRUE(p.leased);
  EXPECT_FALSE(p.taken);
}

TEST(BusyPollLease, PollsFurtherApartThanTheGapNeverTakeIt) {
  Lease l;
  uint64_t now = kT0;
  EXPECT_EQ(spin(l, &now, kT0 + 10 * kMs, Lease::kSpinGapNs + 1), 0u);
  EXPECT_FALSE(l.held());
  // Polls exactly one gap apart are one spin still: the fourth, 60 us in, takes it.
  now += Lease::kSpinGapNs + 1;
  const uint64_t start = now;
  EXPECT_EQ(spin(l, &now, start + 100 * kUs, Lease::kSpinGapNs), start + 60 * kUs);
}

TEST(BusyPollLease, ZeroBusyTimeTurnsItOff) {
  Lease l(0);
  EXPECT_FALSE(l.enabled());
  uint64_t now = kT0;
  EXPECT_EQ(spin(l, &now, kT0 + 10 * kMs), 0u);
  EXPECT_FALSE(l.held());
  l.on_wait_left(now, true);  // a waiter leaves none either
  EXPECT_FALSE(l.held());
  EXPECT_EQ(l.running_until(now), 0u);
}

TEST(BusyPollLease, ArmingEndsASpinsLeaseAndTheNextSpinStartsAfresh) {
  Lease l;
  uint64_t now = kT0;
  ASSERT_NE(spin(l, &now, kT0 + 100 * kUs), 0u);
  EXPECT_EQ(l.on_arm(now), Lease::Arm::ended);
  EXPECT_FALSE(l.held());
  EXPECT_EQ(l.on_arm(now), Lease::Arm::none);
  // The poll right after arming (the race with a completion) is a new spin's first.
  const uint64_t start = now + 2 * kUs;
  now = start;
  EXPECT_EQ(spin(l, &now, start + 100 * kUs), start + Lease::kSpinMinNs);
}

TEST(BusyPollLease, ItRunsUntilNoPollCameForTheBusyTime) {
  Lease l(1 * kMs);
  uint64_t now = kT0;
  ASSERT_NE(spin(l, &now, kT0 + 100 * kUs), 0u);
  const uint64_t last = now;
  EXPECT_EQ(l.running_until(last + 10 * kUs), last + 1 * kMs);
  EXPECT_EQ(l.running_until(last + 1 * kMs - 1), last + 1 * kMs);
  EXPECT_TRUE(l.held());
  EXPECT_EQ(l.running_until(last + 1 * kMs), 0u);  // ran out: ended here
  EXPECT_FALSE(l.held());
  EXPECT_EQ(l.on_arm(last + 2 * kMs), Lease::Arm::none);  // nothing left to end
}

TEST(BusyPollLease, AStreamEndsItAndTheBackOffDoublesUntilArmingResetsIt) {
  Lease l;
  uint64_t now = kT0;
  EXPECT_FALSE(l.end_if_stream(now));  // no stream seen: nothing happens
  ASSERT_NE(spin(l, &now, now + 100 * kUs), 0u);
  l.note_stream();
  EXPECT_TRUE(l.end_if_stream(now));  // it was held: the progress thread is to take the sockets
  EXPECT_FALSE(l.held());
  EXPECT_FALSE(l.end_if_stream(now));  // seen once
  const uint64_t first = now;
  // No lease for 10 ms, however long the spin.
  now += 5 * kUs;
  EXPECT_EQ(spin(l, &now, first + Lease::kNoLeaseAfterStreamNs - 1), 0u);
  now += 5 * kUs;
  EXPECT_NE(spin(l, &now, now + 10 * kUs), 0u);
  // The next stream in a row keeps it off twice as long.
  l.note_stream();
  EXPECT_TRUE(l.end_if_stream(now));
  const uint64_t second = now;
  now += 5 * kUs;
  EXPECT_EQ(spin(l, &now, second + 2 * Lease::kNoLeaseAfterStreamNs - 1), 0u);
  now += 5 * kUs;
  EXPECT_NE(spin(l, &now, now + 10 * kUs), 0u);
  // Arming resets the back-off: the next stream costs 10 ms again.
  EXPECT_EQ(l.on_arm(now), Lease::Arm::ended);
  now += 5 * kUs;
  ASSERT_NE(spin(l, &now, now + 100 * kUs), 0u);
  l.note_stream();
  EXPECT_TRUE(l.end_if_stream(now));
  const uint64_t third = now;
  now += 5 * kUs;
  EXPECT_EQ(spin(l, &now, third + Lease::kNoLeaseAfterStreamNs - 1), 0u);
  now += 5 * kUs;
  EXPECT_NE(spin(l, &now, now + 10 * kUs), 0u);
}

TEST(BusyPollLease, TheBackOffStopsDoublingAt128Times) {
  Lease l;
  uint64_t now = kT0;
  uint64_t off = 0;
  for (int i = 0; i < 10; ++i) {
    l.note_stream();
    l.end_if_stream(now);
    // Find how long it stays off: spin until a lease is taken, from just after the stream.
    const uint64_t from = now;
    now += 5 * kUs;
    const uint64_t took = spin(l, &now, from + 2000 * kMs, 10 * kUs);
    ASSERT_NE(took, 0u) << "stream " << i;
    off = took - from;
  }
  EXPECT_GE(off, 128 * Lease::kNoLeaseAfterStreamNs);
  EXPECT_LE(off, 128 * Lease::kNoLeaseAfterStreamNs + 100 * kUs);
}

TEST(BusyPollLease, AWaiterThatReceivedItsOwnEventLeavesALeaseThatTheNextArmingKeeps) {
  Lease l;
  const uint64_t now = kT0;
  l.on_wait_left(now, /*own_event=*/true);
  EXPECT_TRUE(l.held());
  EXPECT_EQ(l.running_until(now + 1), now + l.busy_ns());
  // The application arms to wait again: the lease stays, once.
  EXPECT_EQ(l.on_arm(now + 10 * kUs), Lease::Arm::kept);
  EXPECT_TRUE(l.held());
  EXPECT_EQ(l.on_arm(now + 20 * kUs), Lease::Arm::ended);
  EXPECT_FALSE(l.held());
}

TEST(BusyPollLease, AWaiterWokenByAnotherThreadLeavesALeaseThatArmingEnds) {
  Lease l;
  l.on_wait_left(kT0, /*own_event=*/false);
  EXPECT_TRUE(l.held());
  EXPECT_EQ(l.on_arm(kT0 + 10 * kUs), Lease::Arm::ended);
  EXPECT_FALSE(l.held());
}

TEST(BusyPollLease, ASpinsLeaseIsNotAWaitersOne) {
  Lease l;
  l.on_wait_left(kT0, true);  // a waiter's lease, ended by the progress thread's timer
  EXPECT_EQ(l.running_until(kT0 + l.busy_ns()), 0u);
  // A later spin takes a lease of its own, which the next arming ends, not keeps.
  uint64_t now = kT0 + 10 * kMs;
  ASSERT_NE(spin(l, &now, now + 100 * kUs), 0u);
  EXPECT_EQ(l.on_arm(now), Lease::Arm::ended);
}

TEST(BusyPollLease, OfManyThreadsPollingAtOnceOneTakesIt) {
  for (int round = 0; round < 50; ++round) {
    Lease l;
    uint64_t now = kT0;
    spin(l, &now, kT0 + Lease::kSpinMinNs - 5 * kUs);  // one poll short of the lease
    ASSERT_FALSE(l.held());
    std::atomic<int> taken{0}, leased{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    for (int i = 0; i < 6; ++i)
      ts.emplace_back([&] {
        while (!go.load()) {}
        const Lease::Poll p = l.on_poll(kT0 + Lease::kSpinMinNs + 1);
        taken += p.taken;
        leased += p.leased;
      });
    go = true;
    for (std::thread& t : ts) t.join();
    EXPECT_EQ(taken.load(), 1) << "round " << round;
    EXPECT_EQ(leased.load(), 6) << "round " << round;
  }
}

}  // namespace
}  // namespace melon::soft
