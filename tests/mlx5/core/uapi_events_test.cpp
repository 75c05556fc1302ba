// Async events end to end, from the device to a client of the user-client boundary: the emulated
// HCA writes the EQE, the core routes it to its owner (the uapi backend), the backend translates it
// through its one PRM -> ibv_event_type table and the server queues it for the client that owns the
// object, under that client's handle. Side A is driven through the core (two_hcas.h); side B's
// objects are made by a client through uapi::Server, as the mlx5 provider makes them.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <vector>

#include "mlx5/core/uapi_backend.h"
#include "two_hcas.h"
#include "uapi/server.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
namespace emu = melon::mlx5::emu;
namespace u = melon::uapi;
using core::Err;
using core::test::Rig;
using core::test::RigOptions;
using core::test::Side;

namespace {

// The one table's ibv side matches libibverbs (compared as ints: the two are different enum types).
constexpr bool same(u::IbvEvent a, ibv_event_type b) { return int(a) == int(b); }
static_assert(same(u::kIbvEventCqErr, IBV_EVENT_CQ_ERR) && same(u::kIbvEventQpFatal, IBV_EVENT_QP_FATAL) &&
              same(u::kIbvEventQpReqErr, IBV_EVENT_QP_REQ_ERR) &&
              same(u::kIbvEventQpAccessErr, IBV_EVENT_QP_ACCESS_ERR) && same(u::kIbvEventCommEst, IBV_EVENT_COMM_EST) &&
              same(u::kIbvEventSqDrained, IBV_EVENT_SQ_DRAINED) && same(u::kIbvEventPathMig, IBV_EVENT_PATH_MIG) &&
              same(u::kIbvEventPathMigErr, IBV_EVENT_PATH_MIG_ERR) &&
              same(u::kIbvEventDeviceFatal, IBV_EVENT_DEVICE_FATAL) &&
              same(u::kIbvEventPortActive, IBV_EVENT_PORT_ACTIVE) && same(u::kIbvEventPortErr, IBV_EVENT_PORT_ERR) &&
              same(u::kIbvEventSrqErr, IBV_EVENT_SRQ_ERR) &&
              same(u::kIbvEventSrqLimitReached, IBV_EVENT_SRQ_LIMIT_REACHED) &&
              same(u::kIbvEventQpLastWqeReached, IBV_EVENT_QP_LAST_WQE_REACHED));

// Queue memory and pinning over the emulator host's IOMMU, in this process (melon-emud does the same
// with memfds and another process's pages).
struct Platform final : core::QueuePlatform {
  explicit Platform(emu::TestHost& h) : host(h) {}
  int queue_alloc(uint64_t size, Mem* out) override {
    emu::TestHost::Buffer b = host.alloc(size);
    if (!b.va) return core::kHalNoMemory;
    out->memory = out->token = next++;
    out->iova = b.iova, out->size = size, out->va = b.va;
    mems[out->memory] = b;
    return core::kHalOk;
  }
  void queue_free(const Mem& m) override {
    host.free(mems[m.memory].iova);
    mems.erase(m.memory);
  }
  int uar_map(const core::Uar&, u::MapRegion* out) override {
    *out = u::MapRegion{uint8_t(u::MapKind::uar), u::kMapWriteCombine, 0, 0, 4096};
    return core::kHalOk;
  }
  int pin_client(void*, uint64_t addr, uint64_t len, bool, uint64_t* iova, uint64_t* token) override {
    *iova = *token = host.map(reinterpret_cast<void*>(addr), len);
    return *iova ? core::kHalOk : core::kHalFault;
  }
  void unpin_client(uint64_t token) override { host.unmap(token); }
  uint8_t* va(const u::MapRegion& r) { return static_cast<uint8_t*>(mems.at(r.memory).va) + r.offset; }

  emu::TestHost& host;
  std::map<uint64_t, emu::TestHost::Buffer> mems;
  uint64_t next = 1;
};

RigOptions b_options(emu::FramePort* port) {
  RigOptions o;
  o.wire = port;
  o.dev.mac[5] = 2;
  return o;
}

class UapiEvents : public ::testing::Test {
 protected:
  emu::MemoryLink link;
  Side a{link, 1};
  emu::FramePort* b_port = link.add_port();
  Rig b{b_options(b_port)};
  Platform plat{b.host};
  std::unique_ptr<core::UapiBackend> be;
  std::unique_ptr<u::Server> srv;
  u::Client client;
  uint8_t* buf = nullptr;  // the client's memory
  static constexpr size_t kBuf = 64 * 1024;
  uint32_t pd = 0, uar = 0, cq = 0, qp = 0, mr_lkey = 0, mr_rkey = 0;
  u::CreateQpResp qpr{};

  template <class Req, class Resp>
  u::Status call(u::Selector s, const Req& rq, Resp* rp) {
    return srv->handle(client, uint32_t(s), &rq, u::wire_size<Req>, rp, sizeof *rp).status;
  }

  void SetUp() override {
    link.attach(b_port, b.dev.get());
    a.build();
    ASSERT_EQ(b.hca.bring_up(), Err::ok);
    ASSERT_EQ(b.set_gid(0, 2), Err::ok);
    be = std::make_unique<core::UapiBackend>(b.hca, plat);
    u::Limits lim;
    be->fill_limits(&lim);
    srv = std::make_unique<u::Server>(*be, lim);
    ASSERT_EQ(srv->attach(&client, nullptr), u::Status::ok);
    u::OpenResp open{};
    ASSERT_EQ(call(u::Selector::open, u::OpenReq{u::kAbiVersion, 0, 0}, &open), u::Status::ok);
    u::HandleResp h{};
    ASSERT_EQ(call(u::Selector::alloc_pd, u::EmptyReq{}, &h), u::Status::ok);
    pd = h.handle;
    u::UarResp ur{};
    ASSERT_EQ(call(u::Selector::alloc_uar, u::EmptyReq{}, &ur), u::Status::ok);
    uar = ur.handle;
    buf = static_cast<uint8_t*>(aligned_alloc(4096, kBuf));
    memset(buf, 0, kBuf);
    u::RegMrResp mr{};
    ASSERT_EQ(call(u::Selector::reg_mr,
                   u::RegMrReq{pd, u::kAccessLocalWrite | u::kAccessRemoteWrite | u::kAccessRemoteRead,
                               uint64_t(uintptr_t(buf)), kBuf},
                   &mr),
              u::Status::ok);
    mr_lkey = mr.lkey, mr_rkey = mr.rkey;
  }
  void TearDown() override {
    EXPECT_EQ(srv->detach(client), 0u);
    srv.reset();
    be.reset();
    free(buf);
    EXPECT_EQ(a.r.hca.teardown(), Err::ok);
    EXPECT_EQ(b.hca.teardown(), Err::ok);
    EXPECT_EQ(a.r.host.dma_faults() + b.host.dma_faults(), 0u);
  }

  // A CQ of `cqe` entries and an RC QP on it (own RQ, or the SRQ `srq`).
  void make_qp(uint32_t cqe, uint32_t srq = 0) {
    u::CreateCqResp c{};
    ASSERT_EQ(call(u::Selector::create_cq, u::CreateCqReq{cqe, 0, uar, 0}, &c), u::Status::ok);
    cq = c.handle;
    u::CreateQpReq q{};
    q.pd = pd, q.send_cq = q.recv_cq = cq, q.uar = uar, q.srq = srq, q.qp_type = u::kQpRc;
    q.max_send_wr = 4, q.max_send_sge = 1;
    if (!srq) q.max_recv_wr = 4, q.max_recv_sge = 1;
    ASSERT_EQ(call(u::Selector::create_qp, q, &qpr), u::Status::ok);
    qp = qpr.handle;
  }
  // B's QP to RTS against A's, as ibv_modify_qp would take it there.
  void connect_b() {
    u::ModifyQpReq m{};
    m.handle = qp;
    m.attr_mask = u::kQpState | u::kQpPkeyIndex | u::kQpPort | u::kQpAccessFlags;
    m.qp_state = u::kStateInit, m.port = 1;
    m.access = u::kAccessRemoteWrite | u::kAccessRemoteRead;
    u::EmptyResp e;
    ASSERT_EQ(call(u::Selector::modify_qp, m, &e), u::Status::ok);
    m = {};
    m.handle = qp;
    m.attr_mask = u::kQpState | u::kQpAv | u::kQpPathMtu | u::kQpDestQpn | u::kQpRqPsn | u::kQpMaxDestRdAtomic |
                  u::kQpMinRnrTimer;
    m.qp_state = u::kStateRtr, m.path_mtu = 3, m.dest_qpn = a.qp->qpn, m.rq_psn = 100;
    m.max_dest_rd_atomic = 1, m.min_rnr_timer = 1;
    a.gid(m.av.dgid);
    memcpy(m.av.dmac, a.r.hca.port().mac, 6);
    m.av.hop_limit = 64, m.av.port = 1;
    ASSERT_EQ(call(u::Selector::modify_qp, m, &e), u::Status::ok);
    m = {};
    m.handle = qp;
    m.attr_mask = u::kQpState | u::kQpSqPsn | u::kQpTimeout | u::kQpRetryCnt | u::kQpRnrRetry | u::kQpMaxQpRdAtomic;
    m.qp_state = u::kStateRts, m.sq_psn = 100, m.timeout = 14, m.retry_cnt = 7, m.rnr_retry = 7;
    m.max_rd_atomic = 1;
    ASSERT_EQ(call(u::Selector::modify_qp, m, &e), u::Status::ok);
    uint8_t bgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
    a.connect_to(qpr.qpn, bgid, b.hca.port().mac);
  }
  // A receive WQE in B's RQ (one data segment), then the doorbell record's receive counter.
  void post_recv_b(uint32_t i, uint32_t offset, uint32_t len) {
    u::MapRegion rq{}, dbr{};
    ASSERT_EQ(srv->mapping(client, u::map_type(u::MapKind::rq, qp), &rq), u::Status::ok);
    ASSERT_EQ(srv->mapping(client, u::map_type(u::MapKind::db_record, qp), &dbr), u::Status::ok);
    uint8_t* w = plat.va(rq) + i % qpr.rq_wqe_cnt * qpr.rq_stride;
    p::wqe_data_seg::view(w)
        .set(p::wqe_data_seg::byte_count, len)
        .set(p::wqe_data_seg::lkey, mr_lkey)
        .set(p::wqe_data_seg::addr, uint64_t(uintptr_t(buf + offset)));
    p::set(plat.va(dbr) + qpr.dbr_offset, p::qp_dbrec::rcv_counter, (i + 1) & 0xffff);
  }
  void pump() {
    for (int i = 0; i < 100000; ++i)
      if (!(int(a.r.dev->service()) | int(b.dev->service()))) {
        a.r.hca.poll_events();
        b.hca.poll_events();
        be->drain_events(*srv);
        return;
      }
    FAIL() << "devices never went idle";
  }
  // The client's queued async events: (handle, ibv_event_type).
  std::vector<std::pair<uint32_t, uint32_t>> events() {
    std::vector<std::pair<uint32_t, uint32_t>> v;
    u::EventResp ev{};
    while (call(u::Selector::get_event, u::EmptyReq{}, &ev) == u::Status::ok) {
      EXPECT_EQ(ev.kind, uint32_t(u::kEventAsync));
      EXPECT_EQ(ev.dropped, 0u);
      v.push_back({ev.handle, ev.event_type});
    }
    return v;
  }
};

// Receive completions that overrun the client's CQ: the client hears IBV_EVENT_CQ_ERR on its CQ and
// IBV_EVENT_QP_FATAL on the QP whose completion was lost, and the QP reads back as ERR.
TEST_F(UapiEvents, CqOverrunReachesTheClientAsCqErrAndQpFatal) {
  make_qp(1);  // one entry asked: a ring of 2
  connect_b();
  for (uint32_t i = 0; i < 3; ++i) post_recv_b(i, 1024 * i, 1024);
  for (int i = 0; i < 3; ++i) {
    memset(a.bytes(), 'x' + i, 64);
    a.post_send(p::wqe_opcode::SEND, a.data.iova, 64);
    pump();
  }
  std::vector<std::pair<uint32_t, uint32_t>> want = {{cq, IBV_EVENT_CQ_ERR}, {qp, IBV_EVENT_QP_FATAL}};
  EXPECT_EQ(events(), want);
  EXPECT_EQ(buf[1024], 'y') << "the second SEND landed before the overrun";
  u::QpAttr at{};
  ASSERT_EQ(call(u::Selector::query_qp, u::HandleReq{qp, 0}, &at), u::Status::ok);
  EXPECT_EQ(at.state, u::kStateErr);
}

// A WRITE with a bad R_Key at the responder: IBV_EVENT_QP_ACCESS_ERR for the client's QP.
TEST_F(UapiEvents, ResponderAccessErrorReachesTheClientAsQpAccessErr) {
  make_qp(16);
  connect_b();
  a.post_send(p::wqe_opcode::RDMA_WRITE, a.data.iova, 64, uint64_t(uintptr_t(buf)), mr_rkey ^ 0x100);
  pump();
  std::vector<std::pair<uint32_t, uint32_t>> want = {{qp, IBV_EVENT_QP_ACCESS_ERR}};
  EXPECT_EQ(events(), want);
  const uint8_t* e = a.poll_cq();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(p::get(e, p::err_cqe::syndrome), p::cqe_syndrome::REMOTE_ACCESS_ERR);
}

// A QP on an SRQ moved to ERR: IBV_EVENT_QP_LAST_WQE_REACHED for the QP (not the SRQ).
TEST_F(UapiEvents, LastWqeReachedReachesTheClientForTheQpOnAnSrq) {
  u::CreateSrqResp s{};
  ASSERT_EQ(call(u::Selector::create_srq, u::CreateSrqReq{pd, 8, 1, 0}, &s), u::Status::ok);
  make_qp(16, s.handle);
  connect_b();
  u::ModifyQpReq m{};
  m.handle = qp, m.attr_mask = u::kQpState, m.qp_state = u::kStateErr;
  u::EmptyResp e;
  ASSERT_EQ(call(u::Selector::modify_qp, m, &e), u::Status::ok);
  pump();
  std::vector<std::pair<uint32_t, uint32_t>> want = {{qp, IBV_EVENT_QP_LAST_WQE_REACHED}};
  EXPECT_EQ(events(), want);
}

// Every CQ, QP and SRQ the device quotas admit has an event route: the default table holds all of
// them, and fill_limits() lowers the quotas of a host whose table is smaller.
TEST_F(UapiEvents, TheDeviceQuotasNeverOutrunTheEventRoutes) {
  u::Limits lim;
  be->fill_limits(&lim);
  EXPECT_LE(uint64_t(lim.device.cq) + lim.device.qp + lim.device.srq, core::UapiBackend::kRoutes);
  EXPECT_EQ(lim.device.cq, u::kDeviceQuotas.cq) << "the default quotas fit as they are";
  core::UapiBackend small(b.hca, plat, 3);
  u::Limits few;
  small.fill_limits(&few);
  EXPECT_LE(few.device.cq + few.device.qp + few.device.srq, 3u);
}

// A CQ whose event route cannot be added is not created: the client gets no_memory and the
// device, the queue memory and the server are as before (the object would never have had an event).
TEST_F(UapiEvents, ACreateWhoseEventRouteCannotBeAddedFails) {
  core::UapiBackend small(b.hca, plat, 2);
  u::Limits lim;  // the defaults: quotas above what `small` can route
  u::Server s2(small, lim);
  u::Client c2;
  ASSERT_EQ(s2.attach(&c2, nullptr), u::Status::ok);
  auto call2 = [&](u::Selector sel, const auto& rq, auto* rp) {
    return s2.handle(c2, uint32_t(sel), &rq, u::wire_size<std::decay_t<decltype(rq)>>, rp, sizeof *rp).status;
  };
  u::OpenResp open{};
  ASSERT_EQ(call2(u::Selector::open, u::OpenReq{u::kAbiVersion, 0, 0}, &open), u::Status::ok);
  u::UarResp ur{};
  ASSERT_EQ(call2(u::Selector::alloc_uar, u::EmptyReq{}, &ur), u::Status::ok);
  u::CreateCqResp r{};
  ASSERT_EQ(call2(u::Selector::create_cq, u::CreateCqReq{16, 0, ur.handle, 0}, &r), u::Status::ok);
  ASSERT_EQ(call2(u::Selector::create_cq, u::CreateCqReq{16, 0, ur.handle, 0}, &r), u::Status::ok);
  const uint32_t cqs = b.hca.live(core::ObjKind::cq);
  const size_t mems = plat.mems.size();
  const uint64_t bytes = small.queue_bytes();
  EXPECT_EQ(call2(u::Selector::create_cq, u::CreateCqReq{16, 0, ur.handle, 0}, &r), u::Status::no_memory);
  EXPECT_EQ(b.hca.live(core::ObjKind::cq), cqs);
  EXPECT_EQ(plat.mems.size(), mems);
  EXPECT_EQ(small.queue_bytes(), bytes);
  EXPECT_EQ(s2.live(u::ObjType::cq), 2u);
  EXPECT_EQ(s2.detach(c2), 0u);
}

// The device turns fatal while the client holds a CQ, an SRQ, a QP on it and an MR. Their destroy
// commands cannot reach the firmware, yet the client's destroys succeed (its handles go), and the
// backend keeps the queue memory and the MR's pin, which the device may still write, until the
// function reset; release_dead() after it frees them all.
TEST_F(UapiEvents, ObjectsDestroyedWhileFatalAreFreedOnlyAfterTheReset) {
  u::CreateSrqResp s{};
  ASSERT_EQ(call(u::Selector::create_srq, u::CreateSrqReq{pd, 8, 1, 0}, &s), u::Status::ok);
  make_qp(16, s.handle);
  const size_t mems = plat.mems.size();
  ASSERT_EQ(mems, 3u) << "CQ, SRQ and QP memory";
  const uint64_t queue_bytes = be->queue_bytes(), pinned = be->pinned();
  ASSERT_GT(pinned, 0u);
  b.dev->inject_fatal(p::health_syndrome::HW_FATAL_ERR);
  ASSERT_TRUE(b.hca.health_check());
  ASSERT_EQ(b.hca.state(), core::HcaState::fatal);
  // An explicit destroy: the handle goes (a second destroy names nothing), the memory stays.
  u::EmptyResp e;
  EXPECT_EQ(call(u::Selector::destroy_qp, u::HandleReq{qp, 0}, &e), u::Status::ok);
  EXPECT_EQ(call(u::Selector::destroy_qp, u::HandleReq{qp, 0}, &e), u::Status::bad_handle);
  // The rest goes with the client.
  EXPECT_EQ(srv->detach(client), 0u) << "a destroy failed for the client";
  EXPECT_EQ(be->dead_objects(), 4u);
  EXPECT_EQ(plat.mems.size(), mems) << "queue memory freed while the device may still write it";
  EXPECT_EQ(be->queue_bytes(), queue_bytes);
  EXPECT_EQ(be->pinned(), pinned) << "MR unpinned before the reset";
  EXPECT_EQ(be->release_dead(), 0u) << "released while the device is fatal";
  ASSERT_EQ(b.hca.recover(), Err::ok);  // function reset and bring-up
  EXPECT_EQ(be->release_dead(), 4u);
  EXPECT_EQ(be->dead_objects(), 0u);
  EXPECT_TRUE(plat.mems.empty());
  EXPECT_EQ(be->queue_bytes(), 0u);
  EXPECT_EQ(be->pinned(), 0u);
  EXPECT_EQ(be->release_dead(), 0u);
  ASSERT_EQ(srv->attach(&client, nullptr), u::Status::ok);  // for TearDown
}

}  // namespace
