// The mlx5 provider's IOKit transport (src/providers/mlx5/transport_iokit.cpp) against the stand-in
// IOKit user side, which reaches MlxUserClient over the emulated card in this process: open with and
// without the entitlement, the wake-ups through its notification port, one RC QP pair taken to RTS
// through the transport's calls, mappings, and what the transport reports once the driver is gone.
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "dext/driverkit/dext_device.h"
#include "dext/driverkit/driver_parts.h"
#include "dk_rig.h"
#include "providers/mlx5/transport.h"

namespace melon::dktest {
namespace {

using uapi::Selector;
using uapi::Status;

class IokitTransport : public ::testing::Test {
 protected:
  void SetUp() override { dkfake::set_task_entitlements({MLX_DEXT_ID}); }
};

struct Qp {
  uint32_t pd, uar, cq, qp, qpn;
};

Qp make_qp(mlx5prov::Transport& t) {
  uapi::HandleResp pd{};
  EXPECT_EQ(t.call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::ok);
  uapi::UarResp uar{};
  EXPECT_EQ(t.call(Selector::alloc_uar, uapi::EmptyReq{}, &uar), Status::ok);
  uapi::CreateCqResp cq{};
  EXPECT_EQ(t.call(Selector::create_cq, uapi::CreateCqReq{63, 0, uar.handle, 0}, &cq), Status::ok);
  uapi::CreateQpReq rq{};
  rq.pd = pd.handle;
  rq.send_cq = rq.recv_cq = cq.handle;
  rq.uar = uar.handle;
  rq.qp_type = uapi::kQpRc;
  rq.max_send_wr = rq.max_recv_wr = 16;
  rq.max_send_sge = rq.max_recv_sge = 1;
  uapi::CreateQpResp qr{};
  EXPECT_EQ(t.call(Selector::create_qp, rq, &qr), Status::ok);
  return Qp{pd.handle, uar.handle, cq.handle, qr.handle, qr.qpn};
}

// RESET -> INIT -> RTR -> RTS towards `remote_qpn` at the port's own GID 0 (a loopback pair).
void connect(mlx5prov::Transport& t, const Qp& q, uint32_t remote_qpn, const uapi::GidResp& gid,
             const uapi::PortAttr& port) {
  uapi::EmptyResp e;
  uapi::ModifyQpReq m{};
  m.handle = q.qp;
  m.attr_mask = uapi::kQpState | uapi::kQpPkeyIndex | uapi::kQpPort | uapi::kQpAccessFlags;
  m.qp_state = uapi::kStateInit;
  m.port = 1;
  m.access = uapi::kAccessRemoteWrite | uapi::kAccessRemoteRead;
  ASSERT_EQ(t.call(Selector::modify_qp, m, &e), Status::ok);
  m = {};
  m.handle = q.qp;
  m.attr_mask = uapi::kQpState | uapi::kQpAv | uapi::kQpPathMtu | uapi::kQpDestQpn | uapi::kQpRqPsn |
                uapi::kQpMaxDestRdAtomic | uapi::kQpMinRnrTimer;
  m.qp_state = uapi::kStateRtr;
  m.path_mtu = 3;
  m.dest_qpn = remote_qpn;
  m.rq_psn = 0x100;
  m.max_dest_rd_atomic = 1;
  m.min_rnr_timer = 12;
  memcpy(m.av.dgid, gid.gid, 16);
  memcpy(m.av.dmac, port.mac, 6);
  m.av.hop_limit = 64;
  m.av.port = 1;
  ASSERT_EQ(t.call(Selector::modify_qp, m, &e), Status::ok);
  m = {};
  m.handle = q.qp;
  m.attr_mask = uapi::kQpState | uapi::kQpSqPsn | uapi::kQpTimeout | uapi::kQpRetryCnt | uapi::kQpRnrRetry |
                uapi::kQpMaxQpRdAtomic;
  m.qp_state = uapi::kStateRts;
  m.sq_psn = 0x100;
  m.timeout = 14;
  m.retry_cnt = 7;
  m.rnr_retry = 7;
  m.max_rd_atomic = 1;
  ASSERT_EQ(t.call(Selector::modify_qp, m, &e), Status::ok);
}

// The wake-up path (docs/macos.md "Events"): open makes the asynchronous wake call, whose first
// answer comes at once (events queued before it are read); draining to no_event arms the next; a
// waiter makes no call into the driver; the stop descriptor ends the wait.
TEST_F(IokitTransport, WakesThroughItsNotificationPortAndWaitsWithoutCalling) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    long sent = dkfake::async_messages_sent();
    int err = 0;
    auto t = mlx5prov::open_transport(nullptr, &err);
    ASSERT_NE(t, nullptr) << strerror(err);
    EXPECT_EQ(dkfake::async_messages_sent(), sent + 1);
    int stop[2];
    ASSERT_EQ(pipe(stop), 0);
    EXPECT_EQ(t->wait_event(stop[0]), mlx5prov::Transport::Wake::event);
    uapi::EventResp ev{};
    EXPECT_EQ(t->call(Selector::get_event, uapi::EmptyReq{}, &ev), Status::no_event);
    // Nothing queued: the waiter blocks in kevent, calling nothing, until the stop descriptor.
    long calls = dkfake::external_method_calls();
    std::atomic<bool> returned{false};
    mlx5prov::Transport::Wake got = mlx5prov::Transport::Wake::event;
    std::thread waiter([&] {
      got = t->wait_event(stop[0]);
      returned = true;
    });
    usleep(100 * 1000);
    EXPECT_FALSE(returned.load());
    EXPECT_EQ(dkfake::external_method_calls(), calls);
    ASSERT_EQ(write(stop[1], "x", 1), 1);
    waiter.join();
    EXPECT_EQ(got, mlx5prov::Transport::Wake::stop);
    EXPECT_EQ(dkfake::async_messages_sent(), sent + 1) << "a wake-up with no event queued";
    close(stop[0]);
    close(stop[1]);
  }
  expect_same(before, Ledger{});
}

// A driver without the wake call (refused): the transport asks on a timer instead.
TEST_F(IokitTransport, ADriverThatCannotWakeIsAskedOnATimer) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  dkfake::refuse_async_calls(true);
  int err = 0;
  auto t = mlx5prov::open_transport(nullptr, &err);
  dkfake::refuse_async_calls(false);
  ASSERT_NE(t, nullptr) << strerror(err);
  int stop[2];
  ASSERT_EQ(pipe(stop), 0);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(t->wait_event(stop[0]), mlx5prov::Transport::Wake::event);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(4));  // the 5 ms timer
  ASSERT_EQ(write(stop[1], "x", 1), 1);
  EXPECT_EQ(t->wait_event(stop[0]), mlx5prov::Transport::Wake::stop);
  close(stop[0]);
  close(stop[1]);
}

TEST_F(IokitTransport, OpensAndTakesAQpPairToRts) {
  Ledger before;
  {
    Driver d;
    ASSERT_EQ(d.start_result, kIOReturnSuccess);
    int err = 0;
    auto t = mlx5prov::open_transport(nullptr, &err);
    ASSERT_NE(t, nullptr) << strerror(err);
    EXPECT_EQ(t->kick(0, 0x800, 0), 0);  // doorbells reach the card through the mapped BAR
    uapi::DeviceAttr attr{};
    ASSERT_EQ(t->call(Selector::query_device, uapi::EmptyReq{}, &attr), Status::ok);
    EXPECT_EQ(attr.vendor_part_id, 4117u);  // ConnectX-4 Lx
    uapi::PortAttr port{};
    ASSERT_EQ(t->call(Selector::query_port, uapi::PortReq{1, 0}, &port), Status::ok);
    uapi::GidResp gid{};
    ASSERT_EQ(t->call(Selector::query_gid, uapi::GidReq{1, 0}, &gid), Status::ok);
    // GID 0 is the port's link-local address from its MAC (DextDevice::start).
    EXPECT_EQ(gid.gid[0], 0xfe);
    EXPECT_EQ(gid.gid[1], 0x80);
    EXPECT_EQ(gid.gid[8], port.mac[0] ^ 2);
    EXPECT_EQ(gid.gid[15], port.mac[5]);
    EXPECT_EQ(gid.valid, 1u);

    Qp a = make_qp(*t), b = make_qp(*t);
    connect(*t, a, b.qpn, gid, port);
    connect(*t, b, a.qpn, gid, port);
    for (auto [q, remote] : {std::pair{a, b.qpn}, {b, a.qpn}}) {
      uapi::QpAttr qa{};
      ASSERT_EQ(t->call(Selector::query_qp, uapi::HandleReq{q.qp, 0}, &qa), Status::ok);
      EXPECT_EQ(qa.state, uapi::kStateRts);
      EXPECT_EQ(qa.qpn, q.qpn);
      EXPECT_EQ(qa.dest_qpn, remote);
    }
    // The SQ mapping is the queue memory the device reads (a write lands where the DEXT put it).
    uint64_t len = 0;
    Status st;
    void* sq = t->map(uapi::MapKind::sq, a.qp, &len, &st);
    ASSERT_NE(sq, nullptr) << uapi::status_name(st);
    EXPECT_GT(len, 0u);
    memset(sq, 0, 64);
    t->unmap(sq, len);
    EXPECT_EQ(t->map(uapi::MapKind::sq, 0x7777, &len, &st), nullptr);
    EXPECT_EQ(st, Status::bad_handle);
    // Torn down by the transport's owner closing it (objects go with the client).
    t.reset();
    auto* p = static_cast<melon::dext::DriverParts*>(static_cast<MlxPCIDriver*>(d.service)->CoreDevice());
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->dev->clients(), 0u);
    EXPECT_EQ(p->dev->hca().live(mlx5::core::ObjKind::qp), 0u);
  }
  expect_same(before, Ledger{});
}

TEST_F(IokitTransport, OpenWithoutTheEntitlementIsEperm) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  dkfake::set_task_entitlements({});
  int err = 0;
  EXPECT_EQ(mlx5prov::open_transport(nullptr, &err), nullptr);
  EXPECT_EQ(err, EPERM);
  err = 0;
  EXPECT_EQ(mlx5prov::open_transport("NoSuchDriver", &err), nullptr);
  EXPECT_EQ(err, ENODEV);
}

TEST_F(IokitTransport, CallsAfterTheDriverStopsAreDeviceDead) {
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  int err = 0;
  auto t = mlx5prov::open_transport(nullptr, &err);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(d.stop(), kIOReturnSuccess);
  uapi::HandleResp pd{};
  EXPECT_EQ(t->call(Selector::alloc_pd, uapi::EmptyReq{}, &pd), Status::device_dead);
}

// Discovery as the provider's device list runs it: the location is the driver's service name
// ($MELON_IOKIT_SERVICE overrides), present only while a started driver has registered it, and
// looking costs no connection (no entitlement needed).
TEST_F(IokitTransport, DiscoveryFindsTheServiceOnlyWhileADriverServesIt) {
  unsetenv("MELON_IOKIT_SERVICE");
  const std::string where = mlx5prov::device_location();
  EXPECT_EQ(where, uapi::iokit::kServiceName);
  EXPECT_FALSE(mlx5prov::device_present(where)) << "no driver started yet";
  {
    dkfake::Card card;
    card.device().surprise_remove();  // Start fails: the service is never registered
    kern_return_t r = kIOReturnSuccess;
    IOService* drv = dkfake::start_driver(card, &r);
    ASSERT_NE(drv, nullptr);
    EXPECT_NE(r, kIOReturnSuccess);
    EXPECT_FALSE(mlx5prov::device_present(where)) << "an orphaned card is not a device";
    drv->release();
  }
  Driver d;
  ASSERT_EQ(d.start_result, kIOReturnSuccess);
  EXPECT_TRUE(mlx5prov::device_present(where));
  dkfake::set_task_entitlements({});
  EXPECT_TRUE(mlx5prov::device_present(where)) << "discovery must not open a connection";
  EXPECT_FALSE(mlx5prov::device_present("NoSuchDriver"));
  EXPECT_FALSE(mlx5prov::device_present(""));
  setenv("MELON_IOKIT_SERVICE", "NoSuchDriver", 1);
  EXPECT_EQ(mlx5prov::device_location(), "NoSuchDriver");
  EXPECT_FALSE(mlx5prov::device_present(mlx5prov::device_location()));
  unsetenv("MELON_IOKIT_SERVICE");
  ASSERT_EQ(d.stop(), kIOReturnSuccess);
  EXPECT_FALSE(mlx5prov::device_present(where)) << "still found after Stop";
}

}  // namespace
}  // namespace melon::dktest
