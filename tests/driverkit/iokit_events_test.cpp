// The mlx5 provider's event thread over the IOKit transport (docs/macos.md "Events"): a context
// opened through the stand-in IOKit on the DEXT glue and the emulated card. Idle, it makes no call
// into the driver (the old 5 ms poll made 200 a second); an event the driver queues wakes it through
// the notification port and reaches ibv_get_async_event with only the calls that read it.
#include <gtest/gtest.h>
#include <poll.h>
#include <stdio.h>
#include <unistd.h>

#include <chrono>

#include "dk_rig.h"
#include "providers/mlx5/mlx5.h"

namespace melon::dktest {
namespace {

namespace mp = mlx5prov;
using Clock = std::chrono::steady_clock;

class IokitEvents : public ::testing::Test {
 protected:
  void SetUp() override { dkfake::set_task_entitlements({MLX_DEXT_ID}); }
  ibv_context* open() {
    int err = 0;
    auto t = mp::open_iokit_transport(nullptr, &err);
    EXPECT_NE(t, nullptr) << strerror(err);
    if (!t) return nullptr;
    verbs::ContextBase* c = mp::open_context(&dev, std::move(t));
    return c ? c->ibv() : nullptr;
  }
  // Until the context's start-up calls are over (the first wake-up, answered at once, read): no
  // call for 100 ms, within 5 s. A fixed wait was too short on a loaded machine; a context that
  // polls on a timer never gets there.
  static bool settled() {
    auto end = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < end)
      if (idle_calls(100) == 0) return true;
    return false;
  }
  // The driver calls a context makes in `ms` milliseconds of doing nothing.
  static long idle_calls(int ms) {
    long before = dkfake::external_method_calls();
    usleep(ms * 1000);
    return dkfake::external_method_calls() - before;
  }
  mp::Mlx5Device dev{"mlx5_0"};
};

TEST_F(IokitEvents, AnIdleContextMakesNoCallsIntoTheDriver) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  ibv_context* ctx = open();
  ASSERT_NE(ctx, nullptr);
  ASSERT_TRUE(settled()) << "the idle context kept calling the driver";
  EXPECT_EQ(idle_calls(300), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

// The contrast, and the fallback: a driver that refuses the wake call is asked every 5 ms.
TEST_F(IokitEvents, WithoutTheWakeCallAnIdleContextAsksOnATimer) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  dkfake::refuse_async_calls(true);
  ibv_context* ctx = open();
  dkfake::refuse_async_calls(false);
  ASSERT_NE(ctx, nullptr);
  EXPECT_GE(idle_calls(300), 10);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

// The firmware's fatal error becomes IBV_EVENT_DEVICE_FATAL for every open client (uapi_backend's
// event table). The core notices it on its health poll; from the moment the driver queues it, one
// mach message wakes the event thread, which reads it with two get_event calls.
TEST_F(IokitEvents, AnEventWakesTheContextThroughItsNotificationPort) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  ibv_context* ctx = open();
  ASSERT_NE(ctx, nullptr);
  ASSERT_TRUE(settled()) << "the idle context kept calling the driver";
  long calls = dkfake::external_method_calls();
  long sent = dkfake::async_messages_sent();
  d.card.device().inject_fatal(0x7);
  pollfd p{ctx->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 15000), 1) << "the event never arrived";
  auto woken = Clock::now() - dkfake::last_async_message_time();
  printf("the event reached async_fd %lld us after the driver's message (a 5 ms poll: 2500 us on average)\n",
         (long long)std::chrono::duration_cast<std::chrono::microseconds>(woken).count());
  ibv_async_event a{};
  ASSERT_EQ(ibv_get_async_event(ctx, &a), 0);
  EXPECT_EQ(a.event_type, IBV_EVENT_DEVICE_FATAL);
  ibv_ack_async_event(&a);
  EXPECT_EQ(dkfake::async_messages_sent(), sent + 1);
  EXPECT_LE(dkfake::external_method_calls() - calls, 2) << "get_event, then get_event answering no_event";
  EXPECT_EQ(ibv_close_device(ctx), 0);
  EXPECT_EQ(d.stop(), kIOReturnSuccess);
}

}  // namespace
}  // namespace melon::dktest
