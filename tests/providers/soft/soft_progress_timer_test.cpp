// When the soft provider's progress thread wakes (providers/soft/progress_timer.h), on a clock and an
// alarm the test holds: a timer moved earlier arms the timer fd once, one moved later arms nothing,
// a fired timer is armed again, without a timer fd the wake pipe is written instead, a refused
// timerfd_settime falls back to a wake-up, and the thread's own wait ends at the earliest of the
// engine's timers, a lease's end, the registries' tick and the counters' catch-up, handed to its
// wait as the time left. No threads, no sleeps (the transport's behaviour with real threads is
// soft_progress_test.cpp's).
#include "providers/soft/progress_timer.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "providers/soft/progress_fds.h"

namespace melon::soft {
namespace {

constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;
constexpr uint64_t kT0 = 5000 * kMs;  // any clock reading far from 0
constexpr uint64_t kNever = ProgressTimer::kNever;

struct FakeClock final : rc::Clock {
  uint64_t t = kT0;
  uint64_t now() override { return t; }
};

// Records what the timer asked of the thread's descriptors.
struct FakeAlarm final : ProgressTimer::Alarm {
  bool timer = true;  // a timer fd exists (Linux)
  bool refuse = false;  // timerfd_settime fails
  std::vector<uint64_t> set;  // every expiry asked for, in order
  int wakes = 0;
  bool has_timer() const override { return timer; }
  bool set_timer(uint64_t at) override {
    set.push_back(at);
    return !refuse;
  }
  void wake() override { ++wakes; }
};

// The wait the timer hands its timeout to: records it instead of blocking.
struct Waits {
  static inline std::vector<int64_t> timeouts;  // ns, -1 for none
  static int wait(pollfd*, nfds_t, const timespec* ts) {
    timeouts.push_back(ts ? int64_t(ts->tv_sec) * 1000000000 + ts->tv_nsec : -1);
    return 0;
  }
};

struct Fixture {
  FakeClock clock;
  FakeAlarm alarm;
  std::mutex mu;
  ProgressTimer timer{clock, alarm, mu, Waits::wait};
  // A post at the current time moves an engine timer to `d`, then arms (as UdpTransport does).
  void post(uint64_t d) {
    {
      std::lock_guard<std::mutex> g(mu);
      timer.moved(d);
    }
    timer.arm();
  }
  ProgressTimer::Plan plan(uint64_t engine, uint64_t lease_end = 0, uint64_t share_tick = 0) {
    std::lock_guard<std::mutex> g(mu);
    return timer.plan(engine, lease_end, share_tick);
  }
};

TEST(SoftProgressTimer, ATimerEarlierThanTheThreadsWaitArmsTheTimerFdOnceWithoutAWakeUp) {
  Fixture f;
  f.plan(kNever);  // the thread sleeps with no deadline
  f.post(kT0 + 10 * kMs);
  EXPECT_EQ(f.alarm.set, std::vector<uint64_t>{kT0 + 10 * kMs});
  EXPECT_EQ(f.alarm.wakes, 0);
  EXPECT_EQ(f.timer.timer_at(), kT0 + 10 * kMs);
  // The same deadline again, or a later one, is covered: no syscall for the poster.
  f.post(kT0 + 10 * kMs);
  f.post(kT0 + 20 * kMs);
  EXPECT_EQ(f.alarm.set.size(), 1u);
  // An earlier one re-arms.
  f.post(kT0 + 5 * kMs);
  EXPECT_EQ(f.alarm.set, (std::vector<uint64_t>{kT0 + 10 * kMs, kT0 + 5 * kMs}));
  EXPECT_EQ(f.alarm.wakes, 0);
}

TEST(SoftProgressTimer, ATimerLaterThanTheThreadsOwnDeadlineArmsNothing) {
  Fixture f;
  f.plan(kT0 + 3 * kMs);  // published at once: the wait ends at the engine's 3 ms timer
  EXPECT_EQ(f.timer.armed(), kT0 + 3 * kMs);
  f.post(kT0 + 3 * kMs);
  f.post(kT0 + 4 * kMs);
  EXPECT_TRUE(f.alarm.set.empty());
  f.post(kT0 + 2 * kMs);  // earlier than the planned wait: armed
  EXPECT_EQ(f.alarm.set, std::vector<uint64_t>{kT0 + 2 * kMs});
}

TEST(SoftProgressTimer, ADeadlineThatHasPassedCoversNothingSoTheNextTimerIsArmed) {
  Fixture f;
  f.plan(kT0 + 1 * kMs);
  f.post(kT0 + 500 * kUs);
  ASSERT_EQ(f.alarm.set.size(), 1u);
  // Both the thread's deadline and the timer fd's expiry are past: the thread may be handling that
  // wake-up now, having read the state before this post; only a wake-up still to come is sure.
  f.clock.t = kT0 + 2 * kMs;
  f.post(kT0 + 10 * kMs);
  EXPECT_EQ(f.alarm.set, (std::vector<uint64_t>{kT0 + 500 * kUs, kT0 + 10 * kMs}));
}

TEST(SoftProgressTimer, PlanningForgetsAFiredTimerFdExpiry) {
  Fixture f;
  f.plan(kNever);
  f.post(kT0 + 1 * kMs);
  f.clock.t = kT0 + 1 * kMs;  // it fires; the thread plans its next wait
  f.plan(kNever);
  EXPECT_EQ(f.timer.timer_at(), kNever);
  f.post(kT0 + 50 * kMs);
  EXPECT_EQ(f.alarm.set.back(), kT0 + 50 * kMs);
}

TEST(SoftProgressTimer, WithoutATimerFdAnEarlierTimerWakesTheThreadOnceThroughThePipe) {
  Fixture f;
  f.alarm.timer = false;  // macOS, or timerfd_create failed
  f.plan(kNever);
  f.post(kT0 + 10 * kMs);
  EXPECT_TRUE(f.alarm.set.empty());
  EXPECT_EQ(f.alarm.wakes, 1);
  // The woken thread will plan again; until then the moved deadline stands for its wait, so a
  // later post writes nothing to the pipe.
  EXPECT_EQ(f.timer.armed(), kT0 + 10 * kMs);
  f.post(kT0 + 12 * kMs);
  EXPECT_EQ(f.alarm.wakes, 1);
  f.post(kT0 + 8 * kMs);
  EXPECT_EQ(f.alarm.wakes, 2);
}

TEST(SoftProgressTimer, ARefusedTimerSettimeWakesTheThreadAndTheNextTimerIsArmedAgain) {
  Fixture f;
  f.alarm.refuse = true;
  f.plan(kNever);
  f.post(kT0 + 10 * kMs);
  EXPECT_EQ(f.alarm.set.size(), 1u);
  EXPECT_EQ(f.alarm.wakes, 1);
  EXPECT_EQ(f.timer.timer_at(), kNever);  // not armed after all
  f.alarm.refuse = false;
  f.post(kT0 + 20 * kMs);  // not covered by a timer that never was
  EXPECT_EQ(f.alarm.set.back(), kT0 + 20 * kMs);
  EXPECT_EQ(f.alarm.wakes, 1);
}

TEST(SoftProgressTimer, MovesBeforeOneArmSetTheEarliestOnceAndAnArmWithNothingDueDoesNothing) {
  Fixture f;
  f.plan(kNever);
  {
    std::lock_guard<std::mutex> g(f.mu);
    f.timer.moved(kT0 + 30 * kMs);
    f.timer.moved(kT0 + 20 * kMs);
    f.timer.moved(kT0 + 25 * kMs);  // covered by the 20 ms expiry already asked for
  }
  f.timer.arm();
  f.timer.arm();
  EXPECT_EQ(f.alarm.set, std::vector<uint64_t>{kT0 + 20 * kMs});
  EXPECT_EQ(f.alarm.wakes, 0);
}

TEST(SoftProgressTimer, TheThreadsWaitEndsAtTheEarliestOfItsDeadlines) {
  Fixture f;
  ProgressTimer::Plan p = f.plan(kNever);
  EXPECT_TRUE(p.publish);  // the first look copies the counter totals out
  EXPECT_EQ(p.deadline, kNever);
  // All before the counters' catch-up (kTotalsEveryNs after that first look).
  EXPECT_EQ(f.plan(kT0 + 700 * kUs, 0, kT0 + 900 * kUs).deadline, kT0 + 700 * kUs);  // the engine's timer
  EXPECT_EQ(f.plan(kT0 + 700 * kUs, 0, kT0 + 600 * kUs).deadline, kT0 + 600 * kUs);  // the registries' tick
  EXPECT_EQ(f.plan(kT0 + 700 * kUs, kT0 + 500 * kUs, kT0 + 600 * kUs).deadline, kT0 + 500 * kUs);  // a lease's end
  EXPECT_EQ(f.timer.armed(), kT0 + 500 * kUs);
}

TEST(SoftProgressTimer, CounterTotalsAreCopiedOutEveryMillisecondAndAStaleCopyCapsTheWait) {
  Fixture f;
  EXPECT_TRUE(f.plan(kNever).publish);
  f.clock.t = kT0 + 300 * kUs;
  ProgressTimer::Plan p = f.plan(kNever);
  EXPECT_FALSE(p.publish);
  EXPECT_EQ(p.deadline, kT0 + ProgressTimer::kTotalsEveryNs);  // wakes to catch up
  EXPECT_EQ(f.plan(kT0 + 100 * kUs).deadline, kT0 + 100 * kUs);  // an earlier timer still wins
  f.clock.t = kT0 + ProgressTimer::kTotalsEveryNs;
  p = f.plan(kNever);
  EXPECT_TRUE(p.publish);
  EXPECT_EQ(p.deadline, kNever);  // fresh: no cap
}

TEST(SoftProgressTimer, TheWaitIsHandedTheTimeLeftNoneForNoDeadlineAndZeroForAPassedOne) {
  Fixture f;
  Waits::timeouts.clear();
  pollfd fd{};
  f.timer.wait(&fd, 1, kNever);
  f.timer.wait(&fd, 1, kT0 + 2 * 1000 * kMs + 1500 * kUs);
  f.timer.wait(&fd, 1, kT0);
  f.timer.wait(&fd, 1, kT0 - 1);
  EXPECT_EQ(Waits::timeouts, (std::vector<int64_t>{-1, int64_t(2 * 1000 * kMs + 1500 * kUs), 0, 0}));
  // Off Linux that time goes to poll() in whole milliseconds, rounded up (SoftPollTimeout).
  const timespec ts{2, 1500000};
  EXPECT_EQ(poll_timeout_ms(&ts), 2002);
}

// The real descriptors: a wake-up and a timer make the wait return and are drained, so the next
// wait blocks again.
TEST(SoftProgressFds, AWakeAndAnArmedTimerEachEndAWaitAndAreDrained) {
  ProgressFds fds;
  std::string why;
  ASSERT_EQ(fds.open(&why), 0) << why;
  std::vector<pollfd> p;
  fds.watch(&p);
  ASSERT_EQ(p.size(), fds.has_timer() ? 2u : 1u);
  EXPECT_EQ(poll(p.data(), nfds_t(p.size()), 0), 0);
  fds.wake();
  fds.wake();
  ASSERT_EQ(poll(p.data(), nfds_t(p.size()), 0), 1);
  EXPECT_TRUE(p[0].revents & POLLIN);
  fds.drain(p.data());
  EXPECT_EQ(poll(p.data(), nfds_t(p.size()), 0), 0);
  if (fds.has_timer()) {
    ASSERT_TRUE(fds.set_timer(monotonic_ns() + 1 * kMs));
    ASSERT_EQ(poll(p.data(), nfds_t(p.size()), 1000), 1);
    EXPECT_TRUE(p[1].revents & POLLIN);
    fds.drain(p.data());
    EXPECT_EQ(poll(p.data(), nfds_t(p.size()), 0), 0);
    ASSERT_TRUE(fds.set_timer(0));  // absolute 0 (long past) fires at once, not disarms
    EXPECT_EQ(poll(p.data(), nfds_t(p.size()), 1000), 1);
  }
  fds.close();
  EXPECT_FALSE(fds.has_timer());
}

}  // namespace
}  // namespace melon::soft
