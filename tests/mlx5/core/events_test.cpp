// Async events routed to their owners: a port change to the device sink (and the port re-read
// outside the event callback), events for unknown objects counted, page requests deferred.
#include <gtest/gtest.h>

#include "mlx5/prm/prm.h"
#include "rig.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
using core::Err;
using core::test::Rig;

namespace {

struct Sink : core::EventSink {
  std::vector<core::AsyncEvent> events;
  void on_async_event(const core::AsyncEvent& e) override { events.push_back(e); }
};

TEST(CoreEvents, PortChangeReachesTheDeviceSinkAndThePortIsReread) {
  Rig r;
  Sink dev;
  r.hca.set_device_sink(&dev);
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  ASSERT_EQ(r.hca.set_port_admin(false), Err::ok);
  bool up = true;
  ASSERT_EQ(r.hca.query_port_oper(&up), Err::ok);
  EXPECT_FALSE(up);
  ASSERT_EQ(r.hca.set_port_admin(true), Err::ok);
  ASSERT_EQ(r.hca.query_port_oper(&up), Err::ok);
  EXPECT_TRUE(up);
  auto vport_lines = [&] {
    int n = 0;
    for (auto& l : r.hal->log_lines()) n += l.rfind("MlxPort: vport", 0) == 0;
    return n;
  };
  int before = vport_lines();
  r.service();
  EXPECT_EQ(vport_lines(), before + 1) << "service() re-read the port once after the change";
  ASSERT_GE(dev.events.size(), 1u);
  const core::AsyncEvent& e = dev.events.back();
  EXPECT_EQ(e.type, p::event_type::PORT_CHANGE);
  EXPECT_EQ(e.subtype, p::port_change_subtype::ACTIVE);
  EXPECT_EQ(e.number, 1u);
  EXPECT_STREQ(e.name, "PORT_CHANGE");
  EXPECT_TRUE(r.hal->logged("MlxPort: port 1 change: ACTIVE"));
  EXPECT_EQ(r.hca.teardown(), Err::ok);
}

TEST(CoreEvents, PageRequestIsServedOutsideTheEventCallback) {
  Rig r;
  ASSERT_EQ(r.hca.bring_up(), Err::ok);
  // Bring-up already met one: the firmware asked for regular pages once EQs existed.
  EXPECT_GE(r.hca.stats().page_requests, 1u);
  EXPECT_TRUE(r.hal->logged("MlxPages: page request: give"));
  EXPECT_EQ(r.hca.pages().given(), r.dev->stats().fw_pages_held);
  EXPECT_EQ(r.hca.teardown(), Err::ok);
}

}  // namespace
