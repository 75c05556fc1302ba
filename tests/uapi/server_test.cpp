// src/uapi: the user-client server's rules, against a backend that records every firmware call.
// Each refusal asserts its exact status AND that no backend call happened.
#include <gtest/gtest.h>
#include <string.h>

#include <memory>
#include <vector>

#include "uapi/recording_backend.h"
#include "uapi/server.h"

namespace melon::uapi {
namespace {

using test::RecordingBackend;

class Uapi : public ::testing::Test {
 protected:
  RecordingBackend be;
  Limits lim;
  std::unique_ptr<Server> srv;
  std::vector<std::unique_ptr<Client>> clients;

  void SetUp() override { srv = std::make_unique<Server>(be, lim); }
  void restart() { srv = std::make_unique<Server>(be, lim); }

  Client& attach(uint32_t uid = 0) {
    clients.push_back(std::make_unique<Client>());
    EXPECT_EQ(srv->attach(clients.back().get(), this, uid), Status::ok);
    return *clients.back();
  }
  Client& open_client(uint32_t uid = 0) {
    Client& c = attach(uid);
    OpenReq rq{kAbiVersion, 0, ~0ull};
    OpenResp rp{};
    EXPECT_EQ(call(c, Selector::open, rq, &rp), Status::ok);
    return c;
  }
  template <class Req, class Resp>
  Status call(Client& c, Selector s, const Req& rq, Resp* rp) {
    Reply r = srv->handle(c, uint32_t(s), &rq, wire_size<Req>, rp, wire_size<Resp>);
    return r.status;
  }
  template <class Req>
  Status call0(Client& c, Selector s, const Req& rq) {
    EmptyResp e;
    return call(c, s, rq, &e);
  }
  Status call0(Client& c, Selector s) {
    EmptyReq e;
    return call0(c, s, e);
  }
  uint32_t pd(Client& c) {
    HandleResp r{};
    EXPECT_EQ(call(c, Selector::alloc_pd, EmptyReq{}, &r), Status::ok);
    return r.handle;
  }
  uint32_t uar(Client& c) {
    UarResp r{};
    EXPECT_EQ(call(c, Selector::alloc_uar, EmptyReq{}, &r), Status::ok);
    return r.handle;
  }
  uint32_t cq(Client& c, uint32_t u, CreateCqResp* out = nullptr) {
    CreateCqResp r{};
    EXPECT_EQ(call(c, Selector::create_cq, CreateCqReq{16, 0, u, 0}, &r), Status::ok);
    if (out) *out = r;
    return r.handle;
  }
  uint32_t mr(Client& c, uint32_t p) {
    RegMrResp r{};
    EXPECT_EQ(call(c, Selector::reg_mr, RegMrReq{p, kAccessLocalWrite, 0x10000, 4096}, &r), Status::ok);
    return r.handle;
  }
  CreateQpReq qp_req(uint32_t p, uint32_t scq, uint32_t rcq, uint32_t u, uint8_t type = kQpRc) {
    CreateQpReq q{};
    q.pd = p;
    q.send_cq = scq;
    q.recv_cq = rcq;
    q.uar = u;
    q.qp_type = type;
    q.max_send_wr = 16;
    q.max_recv_wr = 16;
    q.max_send_sge = 1;
    q.max_recv_sge = 1;
    return q;
  }
  uint32_t qp(Client& c, uint8_t type = kQpRc) {
    uint32_t p = pd(c), u = uar(c), q = cq(c, u);
    CreateQpResp r{};
    EXPECT_EQ(call(c, Selector::create_qp, qp_req(p, q, q, u, type), &r), Status::ok);
    return r.handle;
  }
  // Asserts the request is refused with `want` and that no backend call was made.
  template <class Req, class Resp>
  void refused(Client& c, Selector s, const Req& rq, Resp* rp, Status want) {
    size_t before = be.calls.size();
    EXPECT_EQ(call(c, s, rq, rp), want) << status_name(want);
    EXPECT_EQ(be.calls.size(), before) << "refused request reached the backend: " << be.calls.back();
  }
  template <class Req>
  void refused0(Client& c, Selector s, const Req& rq, Status want) {
    EmptyResp e;
    refused(c, s, rq, &e, want);
  }
};

// ---- Open, versions, sizes -----------------------------------------------------------------------

TEST_F(Uapi, EverySelectorButOpenIsRefusedBeforeOpen) {
  Client& c = attach();
  HandleResp r{};
  refused(c, Selector::alloc_pd, EmptyReq{}, &r, Status::not_open);
  DeviceAttr a{};
  refused(c, Selector::query_device, EmptyReq{}, &a, Status::not_open);
}

TEST_F(Uapi, OpenChecksVersionAndMasksFeatures) {
  Client& c = attach();
  OpenResp rp{};
  refused(c, Selector::open, OpenReq{kAbiVersion + 1, 0, 0}, &rp, Status::bad_version);
  refused(c, Selector::open, OpenReq{kAbiVersion, 1, 0}, &rp, Status::invalid);
  ASSERT_EQ(call(c, Selector::open, OpenReq{kAbiVersion, 0, kFeatRc | (1ull << 63)}, &rp), Status::ok);
  EXPECT_EQ(rp.abi_version, kAbiVersion);
  EXPECT_EQ(rp.features, kFeatRc);  // an unknown bit is not granted
  EXPECT_EQ(rp.max_qp, 64u);
  EXPECT_EQ(rp.max_mr, 128u);
  EXPECT_EQ(rp.max_ah, 8u);
  EXPECT_EQ(rp.client_id, c.id);
  refused(c, Selector::open, OpenReq{kAbiVersion, 0, 0}, &rp, Status::already_open);
}

TEST_F(Uapi, UnknownSelector) {
  Client& c = open_client();
  EXPECT_EQ(srv->handle(c, 0x1fff, nullptr, 0, nullptr, 0).status, Status::unknown_selector);
  EXPECT_EQ(srv->handle(c, 0, nullptr, 0, nullptr, 0).status, Status::unknown_selector);
}

TEST_F(Uapi, TruncatedRequestIsRefused) {
  Client& c = open_client();
  RegMrReq rq{pd(c), kAccessLocalWrite, 0x1000, 4096};
  RegMrResp rp{};
  size_t before = be.calls.size();
  for (uint32_t n = 0; n < sizeof(rq); n++)
    EXPECT_EQ(srv->handle(c, uint32_t(Selector::reg_mr), &rq, n, &rp, sizeof(rp)).status, Status::truncated) << n;
  EXPECT_EQ(srv->handle(c, uint32_t(Selector::reg_mr), nullptr, sizeof(rq), &rp, sizeof(rp)).status, Status::truncated);
  EXPECT_EQ(be.calls.size(), before);
}

TEST_F(Uapi, LongerRequestNeedsZeroTail) {
  Client& c = open_client();
  struct {
    RegMrReq rq;
    uint8_t tail[8];
  } big{};
  big.rq = RegMrReq{pd(c), kAccessLocalWrite, 0x1000, 4096};
  RegMrResp rp{};
  big.tail[5] = 1;
  size_t before = be.calls.size();
  EXPECT_EQ(srv->handle(c, uint32_t(Selector::reg_mr), &big, sizeof(big), &rp, sizeof(rp)).status,
            Status::trailing_nonzero);
  EXPECT_EQ(be.calls.size(), before);
  big.tail[5] = 0;  // a newer client that asks for nothing new
  EXPECT_EQ(srv->handle(c, uint32_t(Selector::reg_mr), &big, sizeof(big), &rp, sizeof(rp)).status, Status::ok);
}

TEST_F(Uapi, ShortResponseBufferIsRefusedBeforeAnythingIsCreated) {
  Client& c = open_client();
  HandleResp rp{};
  size_t before = be.calls.size();
  Reply r = srv->handle(c, uint32_t(Selector::alloc_pd), nullptr, 0, &rp, sizeof(rp) - 1);
  EXPECT_EQ(r.status, Status::out_too_small);
  EXPECT_EQ(be.calls.size(), before);
  EXPECT_EQ(srv->live(ObjType::pd), 0u);
  // A longer buffer gets the struct's size.
  uint8_t big[64];
  r = srv->handle(c, uint32_t(Selector::alloc_pd), nullptr, 0, big, sizeof(big));
  EXPECT_EQ(r.status, Status::ok);
  EXPECT_EQ(r.out_len, sizeof(HandleResp));
}

TEST_F(Uapi, QueriesReachTheBackendWithCheckedArguments) {
  Client& c = open_client();
  DeviceAttr a{};
  ASSERT_EQ(call(c, Selector::query_device, EmptyReq{}, &a), Status::ok);
  EXPECT_EQ(a.vendor_part_id, 4117u);
  PortAttr p{};
  refused(c, Selector::query_port, PortReq{2, 0}, &p, Status::invalid);
  refused(c, Selector::query_port, PortReq{0, 0}, &p, Status::invalid);
  EXPECT_EQ(call(c, Selector::query_port, PortReq{1, 0}, &p), Status::ok);
  GidResp g{};
  refused(c, Selector::query_gid, GidReq{1, lim.gid_tbl_len}, &g, Status::invalid);
  EXPECT_EQ(call(c, Selector::query_gid, GidReq{1, 3}, &g), Status::ok);
  EXPECT_EQ(g.gid[15], 3);
}

// ---- Handles ----------------------------------------------------------------------------------

TEST_F(Uapi, TokensCarryTypeGenerationSlot) {
  Client& c = open_client();
  uint32_t h = pd(c);
  EXPECT_EQ(token_type(h), ObjType::pd);
  EXPECT_EQ(token_gen(h), 1u);
  EXPECT_EQ(token_slot(h), 0u);
  EXPECT_LE(h, 0xffffffu);
}

TEST_F(Uapi, ForgedHandlesAreRefused) {
  Client& c = open_client();
  uint32_t p = pd(c);
  RegMrResp rp{};
  auto reg = [&](uint32_t h) { return RegMrReq{h, kAccessLocalWrite, 0x1000, 4096}; };
  refused(c, Selector::reg_mr, reg(0), &rp, Status::bad_handle);
  refused(c, Selector::reg_mr, reg(make_token(ObjType::cq, 1, 0)), &rp, Status::bad_handle);  // wrong type
  refused(c, Selector::reg_mr, reg(make_token(ObjType::pd, 2, 0)), &rp, Status::bad_handle);  // wrong gen
  refused(c, Selector::reg_mr, reg(make_token(ObjType::pd, 1, 1)), &rp, Status::bad_handle);  // free slot
  refused(c, Selector::reg_mr, reg(make_token(ObjType::pd, 1, 500)), &rp, Status::bad_handle);  // past table
  refused(c, Selector::reg_mr, reg(p | 0x1000000), &rp, Status::bad_handle);  // bits above 24
  EXPECT_EQ(call(c, Selector::reg_mr, reg(p), &rp), Status::ok);
}

TEST_F(Uapi, StaleHandleIsRefusedAfterItsSlotIsReused) {
  Client& c = open_client();
  uint32_t old = pd(c);
  ASSERT_EQ(call0(c, Selector::dealloc_pd, HandleReq{old, 0}), Status::ok);
  uint32_t now = pd(c);
  EXPECT_EQ(token_slot(now), token_slot(old));
  EXPECT_NE(now, old);
  refused0(c, Selector::dealloc_pd, HandleReq{old, 0}, Status::bad_handle);
  EXPECT_EQ(call0(c, Selector::dealloc_pd, HandleReq{now, 0}), Status::ok);
  refused0(c, Selector::dealloc_pd, HandleReq{now, 0}, Status::bad_handle);  // double free
}

TEST_F(Uapi, AnotherClientsHandleNamesNothingOfIts) {
  Client& a = open_client();
  Client& b = open_client();
  uint32_t pa = pd(a);
  uint32_t ma = mr(a, pa);
  refused0(b, Selector::dereg_mr, HandleReq{ma, 0}, Status::bad_handle);
  refused0(b, Selector::dealloc_pd, HandleReq{pa, 0}, Status::bad_handle);
  EXPECT_EQ(be.live("mr"), 1);
}

TEST_F(Uapi, DestroyWithDependentsIsBusy) {
  Client& c = open_client();
  uint32_t p = pd(c);
  uint32_t m = mr(c, p);
  refused0(c, Selector::dealloc_pd, HandleReq{p, 0}, Status::busy);
  uint32_t u = uar(c);
  uint32_t q = cq(c, u);
  refused0(c, Selector::free_uar, HandleReq{u, 0}, Status::busy);
  CreateQpResp qr{};
  ASSERT_EQ(call(c, Selector::create_qp, qp_req(p, q, q, u), &qr), Status::ok);
  refused0(c, Selector::destroy_cq, HandleReq{q, 0}, Status::busy);
  ASSERT_EQ(call0(c, Selector::destroy_qp, HandleReq{qr.handle, 0}), Status::ok);
  ASSERT_EQ(call0(c, Selector::destroy_cq, HandleReq{q, 0}), Status::ok);
  ASSERT_EQ(call0(c, Selector::dereg_mr, HandleReq{m, 0}), Status::ok);
  ASSERT_EQ(call0(c, Selector::dealloc_pd, HandleReq{p, 0}), Status::ok);
  ASSERT_EQ(call0(c, Selector::free_uar, HandleReq{u, 0}), Status::ok);
  EXPECT_EQ(be.live_total(), 0);
  EXPECT_TRUE(be.violations.empty()) << be.violations[0];
}

TEST_F(Uapi, ReservedFieldsMustBeZero) {
  Client& c = open_client();
  uint32_t p = pd(c);
  refused0(c, Selector::dealloc_pd, HandleReq{p, 1}, Status::invalid);
  CreateCqResp cr{};
  refused(c, Selector::create_cq, CreateCqReq{16, 0, uar(c), 1}, &cr, Status::invalid);
}

// ---- Quotas ----------------------------------------------------------------------------------

// Bytes, not objects: a CQ of 16 entries rings 32 x 64 B = 2 KiB (the recording backend's cost is
// the ring itself), charged to its client, its user and the device, each refusal naming its limit.
TEST_F(Uapi, QueueMemoryIsLimitedPerClientPerUserAndPerDevice) {
  lim.queue_bytes = {4096, 6144, 8192};
  restart();
  Client& a = open_client(1);
  Client& b = open_client(1);
  Client& c = open_client(2);
  uint32_t ua = uar(a), ub = uar(b), uc = uar(c);
  CreateCqResp r{};
  uint32_t first = cq(a, ua);
  uint32_t second = cq(a, ua);
  refused(a, Selector::create_cq, CreateCqReq{16, 0, ua, 0}, &r, Status::quota_queue_client);
  cq(b, ub);  // the user's 6 KiB
  refused(b, Selector::create_cq, CreateCqReq{16, 0, ub, 0}, &r, Status::quota_queue_user);
  cq(c, uc);  // another user, the device's 8 KiB
  refused(c, Selector::create_cq, CreateCqReq{16, 0, uc, 0}, &r, Status::quota_queue_device);
  // One big ring is refused whole, before the backend allocates any of it.
  refused(c, Selector::create_cq, CreateCqReq{1u << 20, 0, uc, 0}, &r, Status::quota_queue_client);
  // A freed queue gives its bytes back to all three.
  ASSERT_EQ(call0(a, Selector::destroy_cq, HandleReq{first, 0}), Status::ok);
  EXPECT_EQ(call(c, Selector::create_cq, CreateCqReq{16, 0, uc, 0}, &r), Status::ok);
  // QPs and SRQs are charged the same way (the device's 8 KiB are in use again).
  uint32_t p = pd(a);
  CreateQpResp qr{};
  refused(a, Selector::create_qp, qp_req(p, second, second, ua), &qr, Status::quota_queue_device);
  CreateSrqResp sr{};
  refused(a, Selector::create_srq, CreateSrqReq{p, 16, 1, 0}, &sr, Status::quota_queue_device);
}

// Resize: the ring's bytes move from the old size to the new one (a bigger ring must fit the
// quota before the backend is asked), and the CQ's Cqe mapping names the new ring.
TEST_F(Uapi, ResizeCqMovesItsQueueBytesAndItsMapping) {
  lim.queue_bytes = {8192, 8192, 8192};
  restart();
  Client& c = open_client();
  uint32_t u = uar(c);
  uint32_t q = cq(c, u);  // 32 entries, 2 KiB
  ResizeCqResp rr{};
  ASSERT_EQ(call(c, Selector::resize_cq, ResizeCqReq{q, 100}, &rr), Status::ok);  // 128 entries, 8 KiB
  EXPECT_EQ(rr.cqe, 128u);
  EXPECT_EQ(rr.cqe_bytes, 64u);
  EXPECT_EQ(be.last_resize_log, 7u);
  MapResp m{};
  ASSERT_EQ(call(c, Selector::map, MapReq{uint32_t(MapKind::cqe), q}, &m), Status::ok);
  EXPECT_EQ(m.length, 64u * 128);
  MapRegion reg;
  ASSERT_EQ(srv->mapping(c, map_type(MapKind::cqe, q), &reg), Status::ok);
  EXPECT_EQ(reg.memory, 12u);  // the backend's new ring
  ASSERT_EQ(srv->mapping(c, map_type(MapKind::db_record, q), &reg), Status::ok);
  EXPECT_EQ(reg.memory, 9u);  // the record stays
  // All 8 KiB are the CQ's now: nothing else fits, and a bigger ring neither.
  CreateCqResp cr{};
  refused(c, Selector::create_cq, CreateCqReq{1, 0, u, 0}, &cr, Status::quota_queue_client);
  refused(c, Selector::resize_cq, ResizeCqReq{q, 200}, &rr, Status::quota_queue_client);
  // Smaller gives the difference back; the same size again asks nothing of the backend.
  ASSERT_EQ(call(c, Selector::resize_cq, ResizeCqReq{q, 15}, &rr), Status::ok);
  EXPECT_EQ(rr.cqe, 16u);
  refused(c, Selector::resize_cq, ResizeCqReq{q, 12}, &rr, Status::ok);
  EXPECT_EQ(rr.cqe, 16u);
  EXPECT_EQ(call(c, Selector::create_cq, CreateCqReq{16, 0, u, 0}, &cr), Status::ok);
  // A backend refusal (the device's: too small for what is unpolled) changes nothing.
  be.fail_next = Status::invalid;
  EXPECT_EQ(call(c, Selector::resize_cq, ResizeCqReq{q, 31}, &rr), Status::invalid);
  ASSERT_EQ(call(c, Selector::map, MapReq{uint32_t(MapKind::cqe), q}, &m), Status::ok);
  EXPECT_EQ(m.length, 64u * 16);
  ASSERT_EQ(call(c, Selector::resize_cq, ResizeCqReq{q, 31}, &rr), Status::ok);  // its bytes were not lost
}

TEST_F(Uapi, ResizeCqFieldsAreChecked) {
  Client& c = open_client();
  uint32_t u = uar(c);
  uint32_t q = cq(c, u);
  ResizeCqResp rr{};
  refused(c, Selector::resize_cq, ResizeCqReq{q, 0}, &rr, Status::invalid);
  refused(c, Selector::resize_cq, ResizeCqReq{q, lim.max_cqe + 1}, &rr, Status::invalid);
  refused(c, Selector::resize_cq, ResizeCqReq{u, 16}, &rr, Status::bad_handle);  // a UAR
  refused(c, Selector::resize_cq, ResizeCqReq{q ^ 0x200, 16}, &rr, Status::bad_handle);  // stale generation
  ASSERT_EQ(call0(c, Selector::destroy_cq, HandleReq{q, 0}), Status::ok);
  refused(c, Selector::resize_cq, ResizeCqReq{q, 16}, &rr, Status::bad_handle);
}

// Pinned bytes are whole pages (an MR from 0x10800 of 4 KiB pins two), as RLIMIT_MEMLOCK counts them.
TEST_F(Uapi, PinnedMemoryIsLimitedPerClientPerUserAndPerDevice) {
  lim.pinned_bytes = {16384, 24576, 32768};
  restart();
  Client& a = open_client(7);
  Client& b = open_client(7);
  Client& c = open_client(8);
  uint32_t pa = pd(a), pb = pd(b), pc = pd(c);
  RegMrResp r{};
  auto reg = [&](Client& cl, uint32_t p, uint64_t addr, uint64_t len) {
    return call(cl, Selector::reg_mr, RegMrReq{p, kAccessLocalWrite, addr, len}, &r);
  };
  ASSERT_EQ(reg(a, pa, 0x10800, 4096), Status::ok);  // 2 pages
  uint32_t first = r.handle;
  ASSERT_EQ(reg(a, pa, 0x20000, 8192), Status::ok);  // 4 pages: the client's 16 KiB
  refused(a, Selector::reg_mr, RegMrReq{pa, kAccessLocalWrite, 0x30000, 1}, &r, Status::quota_pinned_client);
  ASSERT_EQ(reg(b, pb, 0x30000, 8192), Status::ok);  // the user's 24 KiB
  refused(b, Selector::reg_mr, RegMrReq{pb, kAccessLocalWrite, 0x40000, 1}, &r, Status::quota_pinned_user);
  ASSERT_EQ(reg(c, pc, 0x40000, 8192), Status::ok);  // the device's 32 KiB
  refused(c, Selector::reg_mr, RegMrReq{pc, kAccessLocalWrite, 0x50000, 1}, &r, Status::quota_pinned_device);
  refused(c, Selector::reg_mr, RegMrReq{pc, kAccessLocalWrite, 0x50000, 1ull << 40}, &r, Status::quota_pinned_client);
  ASSERT_EQ(call0(a, Selector::dereg_mr, HandleReq{first, 0}), Status::ok);
  EXPECT_EQ(reg(c, pc, 0x50000, 8192), Status::ok);  // the freed 8 KiB; the device is full again
  refused(a, Selector::reg_mr, RegMrReq{pa, kAccessLocalWrite, 0x60000, 4096}, &r, Status::quota_pinned_device);
  // A client that goes gives back everything it held.
  srv->detach(b);
  EXPECT_EQ(reg(a, pa, 0x60000, 4096), Status::ok);
}

// One user cannot take every client connection of the device.
TEST_F(Uapi, ClientConnectionsAreLimitedPerUser) {
  lim.clients_per_user = 2;
  restart();
  attach(5);
  Client& second = attach(5);
  Client extra;
  EXPECT_EQ(srv->attach(&extra, nullptr, 5), Status::quota_user_clients);
  attach(6);  // another user is not affected
  srv->detach(second);
  EXPECT_EQ(srv->attach(&extra, nullptr, 5), Status::ok);
}

TEST_F(Uapi, ClientQuotaIsEnforcedBeforeTheFirmware) {
  Client& c = open_client();
  for (int i = 0; i < 16; i++) pd(c);
  HandleResp r{};
  refused(c, Selector::alloc_pd, EmptyReq{}, &r, Status::quota_client);
  for (int i = 0; i < 4; i++) uar(c);
  UarResp u{};
  refused(c, Selector::alloc_uar, EmptyReq{}, &u, Status::quota_client);
  // A freed object gives its quota back.
  ASSERT_EQ(call0(c, Selector::dealloc_pd, HandleReq{make_token(ObjType::pd, 1, 3), 0}), Status::ok);
  EXPECT_EQ(call(c, Selector::alloc_pd, EmptyReq{}, &r), Status::ok);
}

TEST_F(Uapi, MrQuotaIs128PerClient) {
  Client& c = open_client();
  uint32_t p = pd(c);
  for (int i = 0; i < 128; i++) mr(c, p);
  RegMrResp r{};
  refused(c, Selector::reg_mr, RegMrReq{p, 0, 0x1000, 4096}, &r, Status::quota_client);
}

TEST_F(Uapi, DeviceQuotaSpansClients) {
  lim.device.qp = 3;
  restart();
  Client& a = open_client();
  Client& b = open_client();
  qp(a);
  qp(a);
  qp(b);
  uint32_t p = pd(b), u = uar(b), q = cq(b, u);
  CreateQpResp r{};
  refused(b, Selector::create_qp, qp_req(p, q, q, u), &r, Status::quota_device);
}

TEST_F(Uapi, SixteenClientsPerDevice) {
  for (uint32_t i = 0; i < kMaxClients; i++) open_client(100 + i);
  Client extra;
  EXPECT_EQ(srv->attach(&extra, nullptr), Status::quota_device);
  srv->detach(*clients[3]);
  EXPECT_EQ(srv->attach(&extra, nullptr), Status::ok);
  EXPECT_EQ(extra.id, 4u);
}

TEST_F(Uapi, FirmwareRefusalConsumesNoQuotaOrHandle) {
  Client& c = open_client();
  be.fail_next = Status::firmware;
  HandleResp r{};
  EXPECT_EQ(call(c, Selector::alloc_pd, EmptyReq{}, &r), Status::firmware);
  EXPECT_EQ(srv->live(ObjType::pd), 0u);
  EXPECT_EQ(c.count[uint8_t(ObjType::pd)], 0u);
  EXPECT_EQ(token_gen(pd(c)), 1u);
}

// ---- Field validation ----------------------------------------------------------------------------

TEST_F(Uapi, RegMrFieldsAreChecked) {
  Client& c = open_client();
  uint32_t p = pd(c);
  RegMrResp r{};
  refused(c, Selector::reg_mr, RegMrReq{p, 1u << 5, 0x1000, 4096}, &r, Status::invalid);  // unknown access
  refused(c, Selector::reg_mr, RegMrReq{p, kAccessRemoteWrite, 0x1000, 4096}, &r, Status::invalid);
  refused(c, Selector::reg_mr, RegMrReq{p, kAccessRemoteAtomic, 0x1000, 4096}, &r, Status::invalid);
  refused(c, Selector::reg_mr, RegMrReq{p, 0, 0x1000, 0}, &r, Status::invalid);
  refused(c, Selector::reg_mr, RegMrReq{p, 0, ~0ull - 10, 4096}, &r, Status::invalid);  // wraps
  refused(c, Selector::reg_mr, RegMrReq{p, 0, 0, lim.max_mr_size + 1}, &r, Status::invalid);
  EXPECT_EQ(call(c, Selector::reg_mr, RegMrReq{p, kAccessLocalWrite | kAccessRemoteWrite, 0x1000, 4096}, &r),
            Status::ok);
  EXPECT_EQ(be.last_host, this);  // the client's address space reaches the backend
}

TEST_F(Uapi, CreateCqFieldsAreChecked) {
  Client& c = open_client();
  uint32_t u = uar(c);
  CreateCqResp r{};
  refused(c, Selector::create_cq, CreateCqReq{0, 0, u, 0}, &r, Status::invalid);
  refused(c, Selector::create_cq, CreateCqReq{lim.max_cqe + 1, 0, u, 0}, &r, Status::invalid);
  refused(c, Selector::create_cq, CreateCqReq{16, 1, u, 0}, &r, Status::invalid);  // one vector
  refused(c, Selector::create_cq, CreateCqReq{16, 0, pd(c), 0}, &r, Status::bad_handle);
  ASSERT_EQ(call(c, Selector::create_cq, CreateCqReq{16, 0, u, 0}, &r), Status::ok);
  EXPECT_EQ(be.last_cq.log_size, 5u);  // 16 + 1 rounded up to 32
  EXPECT_EQ(r.cqe, 32u);
  EXPECT_EQ(be.last_cq.event_tag, Server::tag_of(c, r.handle));
}

TEST_F(Uapi, CreateQpFieldsAreChecked) {
  Client& c = open_client();
  uint32_t p = pd(c), u = uar(c), q = cq(c, u);
  CreateQpResp r{};
  auto bad = [&](auto edit, Status want) {
    CreateQpReq rq = qp_req(p, q, q, u);
    edit(rq);
    refused(c, Selector::create_qp, rq, &r, want);
  };
  bad([](CreateQpReq& rq) { rq.qp_type = 3; }, Status::invalid);
  bad([](CreateQpReq& rq) { rq.reserved0 = 1; }, Status::invalid);
  bad([](CreateQpReq& rq) { rq.flags = 2; }, Status::invalid);  // a flag this server does not know
  bad([](CreateQpReq& rq) { rq.max_send_wr = 0; }, Status::invalid);
  bad([&](CreateQpReq& rq) { rq.max_send_wr = lim.max_qp_wr + 1; }, Status::invalid);
  bad([&](CreateQpReq& rq) { rq.max_send_sge = lim.max_sge + 1; }, Status::invalid);
  bad([&](CreateQpReq& rq) { rq.max_inline_data = lim.max_inline + 1; }, Status::invalid);
  bad([](CreateQpReq& rq) { rq.max_recv_sge = 0; }, Status::invalid);
  bad([&](CreateQpReq& rq) { rq.send_cq = p; }, Status::bad_handle);
  bad([&](CreateQpReq& rq) { rq.uar = q; }, Status::bad_handle);
  bad([&](CreateQpReq& rq) { rq.srq = make_token(ObjType::srq, 1, 0); }, Status::bad_handle);
  ASSERT_EQ(call(c, Selector::create_qp, qp_req(p, q, q, u), &r), Status::ok);
  EXPECT_EQ(be.last_qp.log_sq_size, 4u);  // 16 WQEs of one basic block
  EXPECT_EQ(be.last_qp.log_rq_size, 4u);
}

TEST_F(Uapi, QpOnSrqHasNoReceiveQueue) {
  Client& c = open_client();
  uint32_t p = pd(c), u = uar(c), q = cq(c, u);
  CreateSrqResp sr{};
  CreateSrqResp dummy{};
  refused(c, Selector::create_srq, CreateSrqReq{p, 0, 1, 0}, &dummy, Status::invalid);
  refused(c, Selector::create_srq, CreateSrqReq{p, 16, 0, 0}, &dummy, Status::invalid);
  refused(c, Selector::create_srq, CreateSrqReq{p, 16, 1, 17}, &dummy, Status::invalid);
  ASSERT_EQ(call(c, Selector::create_srq, CreateSrqReq{p, 16, 1, 0}, &sr), Status::ok);
  EXPECT_EQ(sr.stride, 32u);
  CreateQpReq rq = qp_req(p, q, q, u);
  rq.srq = sr.handle;
  CreateQpResp r{};
  refused(c, Selector::create_qp, rq, &r, Status::invalid);  // recv sizes with an SRQ
  rq.max_recv_wr = rq.max_recv_sge = 0;
  ASSERT_EQ(call(c, Selector::create_qp, rq, &r), Status::ok);
  EXPECT_EQ(be.last_qp.srq != nullptr, true);
  refused0(c, Selector::destroy_srq, HandleReq{sr.handle, 0}, Status::busy);
  EXPECT_EQ(call0(c, Selector::modify_srq, ModifySrqReq{sr.handle, 4}), Status::ok);
}

// ---- QP state machine ------------------------------------------------------------------------------

ModifyQpReq to_init() {
  ModifyQpReq m{};
  m.attr_mask = kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags;
  m.qp_state = kStateInit;
  m.port = 1;
  m.access = kAccessRemoteWrite | kAccessRemoteRead;
  return m;
}
ModifyQpReq to_rtr() {
  ModifyQpReq m{};
  m.attr_mask = kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
  m.qp_state = kStateRtr;
  m.path_mtu = 3;
  m.dest_qpn = 0x12;
  m.rq_psn = 0x1234;
  m.max_dest_rd_atomic = 1;
  m.min_rnr_timer = 12;
  m.av.port = 1;
  m.av.hop_limit = 64;
  return m;
}
ModifyQpReq to_rts() {
  ModifyQpReq m{};
  m.attr_mask = kQpState | kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
  m.qp_state = kStateRts;
  m.timeout = 14;
  m.retry_cnt = 7;
  m.rnr_retry = 7;
  m.max_rd_atomic = 1;
  return m;
}

TEST_F(Uapi, RcQpWalksResetInitRtrRts) {
  Client& c = open_client();
  uint32_t h = qp(c);
  for (ModifyQpReq m : {to_init(), to_rtr(), to_rts()}) {
    m.handle = h;
    ASSERT_EQ(call0(c, Selector::modify_qp, m), Status::ok);
  }
  EXPECT_EQ(be.transitions, (std::vector<Transition>{Transition::rst2init, Transition::init2rtr, Transition::rtr2rts}));
  ModifyQpReq e{};
  e.handle = h;
  e.attr_mask = kQpState;
  e.qp_state = kStateErr;
  ASSERT_EQ(call0(c, Selector::modify_qp, e), Status::ok);
  e.qp_state = kStateReset;
  ASSERT_EQ(call0(c, Selector::modify_qp, e), Status::ok);
  EXPECT_EQ(be.transitions.back(), Transition::to_rst);
}

TEST_F(Uapi, WrongStateTransitionsNeverReachTheFirmware) {
  Client& c = open_client();
  uint32_t h = qp(c);
  ModifyQpReq m = to_rtr();
  m.handle = h;
  refused0(c, Selector::modify_qp, m, Status::wrong_state);  // RESET -> RTR
  m = to_rts();
  m.handle = h;
  refused0(c, Selector::modify_qp, m, Status::wrong_state);  // RESET -> RTS
  m = to_init();
  m.handle = h;
  m.attr_mask |= kQpCurState;
  m.cur_qp_state = kStateRts;
  refused0(c, Selector::modify_qp, m, Status::wrong_state);  // cur_qp_state disagrees
  ModifyQpReq sqe{};
  sqe.handle = h;
  sqe.attr_mask = kQpState;
  sqe.qp_state = kStateSqe;
  refused0(c, Selector::modify_qp, sqe, Status::wrong_state);  // nobody moves a QP to SQE
  ModifyQpReq rst{};
  rst.handle = h;
  rst.attr_mask = kQpState;
  rst.qp_state = kStateReset;
  refused0(c, Selector::modify_qp, rst, Status::ok);  // RESET -> RESET needs no command
}

TEST_F(Uapi, TransitionAttributesAreRequiredAndLimited) {
  Client& c = open_client();
  uint32_t h = qp(c);
  ModifyQpReq m = to_init();
  m.handle = h;
  m.attr_mask &= ~kQpPort;
  refused0(c, Selector::modify_qp, m, Status::invalid);  // missing a required attribute
  m = to_init();
  m.handle = h;
  m.attr_mask |= kQpSqPsn;
  refused0(c, Selector::modify_qp, m, Status::invalid);  // an attribute RST2INIT does not take
  m = to_init();
  m.handle = h;
  m.attr_mask |= 1u << 30;
  refused0(c, Selector::modify_qp, m, Status::invalid);  // an unknown mask bit
  m = to_init();
  m.handle = h;
  ASSERT_EQ(call0(c, Selector::modify_qp, m), Status::ok);

  auto bad_rtr = [&](auto edit) {
    ModifyQpReq r = to_rtr();
    r.handle = h;
    edit(r);
    refused0(c, Selector::modify_qp, r, Status::invalid);
  };
  bad_rtr([](ModifyQpReq& r) { r.path_mtu = 0; });
  bad_rtr([](ModifyQpReq& r) { r.path_mtu = 6; });
  bad_rtr([](ModifyQpReq& r) { r.rq_psn = 1u << 24; });
  bad_rtr([](ModifyQpReq& r) { r.dest_qpn = 1u << 24; });
  bad_rtr([](ModifyQpReq& r) { r.min_rnr_timer = 32; });
  bad_rtr([&](ModifyQpReq& r) { r.max_dest_rd_atomic = uint8_t(lim.max_rd_atomic + 1); });
  bad_rtr([&](ModifyQpReq& r) { r.av.sgid_index = uint8_t(lim.gid_tbl_len); });
  bad_rtr([](ModifyQpReq& r) { r.av.port = 2; });
  bad_rtr([](ModifyQpReq& r) { r.av.sl = 16; });
  bad_rtr([](ModifyQpReq& r) { r.av.flow_label = 1u << 20; });
  bad_rtr([](ModifyQpReq& r) { r.av.reserved[0] = 1; });
  bad_rtr([](ModifyQpReq& r) { r.attr_mask &= ~kQpAv; });
  ModifyQpReq r = to_rtr();
  r.handle = h;
  ASSERT_EQ(call0(c, Selector::modify_qp, r), Status::ok);
  auto bad_rts = [&](auto edit) {
    ModifyQpReq s = to_rts();
    s.handle = h;
    edit(s);
    refused0(c, Selector::modify_qp, s, Status::invalid);
  };
  bad_rts([](ModifyQpReq& s) { s.timeout = 32; });
  bad_rts([](ModifyQpReq& s) { s.retry_cnt = 8; });
  bad_rts([](ModifyQpReq& s) { s.rnr_retry = 8; });
  bad_rts([](ModifyQpReq& s) { s.sq_psn = 1u << 24; });
}

TEST_F(Uapi, UdQpNeedsQkeyNotPath) {
  Client& c = open_client();
  uint32_t h = qp(c, kQpUd);
  ModifyQpReq m = to_init();
  m.handle = h;
  refused0(c, Selector::modify_qp, m, Status::invalid);  // UD takes a Q_Key, not access flags
  m.attr_mask = kQpState | kQpPkeyIndex | kQpPort | kQpQkey;
  m.qkey = 0x11111111;
  ASSERT_EQ(call0(c, Selector::modify_qp, m), Status::ok);
  ModifyQpReq r{};
  r.handle = h;
  r.attr_mask = kQpState;
  r.qp_state = kStateRtr;
  ASSERT_EQ(call0(c, Selector::modify_qp, r), Status::ok);
  ModifyQpReq s{};
  s.handle = h;
  s.attr_mask = kQpState | kQpSqPsn;
  s.qp_state = kStateRts;
  ASSERT_EQ(call0(c, Selector::modify_qp, s), Status::ok);
}

TEST_F(Uapi, GsiQpHasOneOwnerPerPortUntilItGoes) {
  Client& a = open_client();
  Client& b = open_client();
  uint32_t pa = pd(a), ua = uar(a), qa = cq(a, ua);
  uint32_t pb = pd(b), ub = uar(b), qb = cq(b, ub);
  CreateQpReq g = qp_req(pa, qa, qa, ua, kQpGsi);
  CreateQpResp rp{};
  refused(a, Selector::create_qp, g, &rp, Status::invalid);  // QP1 names its port
  g.port = 2;
  refused(a, Selector::create_qp, g, &rp, Status::invalid);  // the device has one
  CreateQpReq ud = qp_req(pa, qa, qa, ua, kQpUd);
  ud.port = 1;
  refused(a, Selector::create_qp, ud, &rp, Status::invalid);  // only QP1 takes a port
  g.port = 1;
  ASSERT_EQ(call(a, Selector::create_qp, g, &rp), Status::ok);
  uint32_t mine = rp.handle;
  CreateQpReq other = qp_req(pb, qb, qb, ub, kQpGsi);
  other.port = 1;
  refused(b, Selector::create_qp, other, &rp, Status::taken);
  refused(a, Selector::create_qp, g, &rp, Status::taken);  // its owner has it already, too
  // QP1 takes UD's attributes: a Q_Key, no path.
  ModifyQpReq m{};
  m.handle = mine;
  m.attr_mask = kQpState | kQpPkeyIndex | kQpPort | kQpQkey;
  m.qp_state = kStateInit;
  m.port = 1;
  m.qkey = 0x80010000;
  EXPECT_EQ(call0(a, Selector::modify_qp, m), Status::ok);
  // Its owner destroys it: the next client may have it.
  EXPECT_EQ(call0(a, Selector::destroy_qp, HandleReq{mine, 0}), Status::ok);
  ASSERT_EQ(call(b, Selector::create_qp, other, &rp), Status::ok);
  refused(a, Selector::create_qp, g, &rp, Status::taken);
  // Its owner goes: free again.
  srv->detach(b);
  EXPECT_EQ(call(a, Selector::create_qp, g, &rp), Status::ok);
}

TEST_F(Uapi, QueryFollowsTheDevicesState) {
  Client& c = open_client();
  uint32_t h = qp(c);
  QpAttr a{};
  be.query_state = kStateErr;  // the device moved it (a completion error)
  ASSERT_EQ(call(c, Selector::query_qp, HandleReq{h, 0}, &a), Status::ok);
  ModifyQpReq m = to_init();
  m.handle = h;
  refused0(c, Selector::modify_qp, m, Status::wrong_state);
}

// ---- Address handles, mappings, events --------------------------------------------------------

TEST_F(Uapi, AddressHandlesAreCheckedAndCounted) {
  Client& c = open_client();
  uint32_t p = pd(c);
  CreateAhReq rq{};
  rq.pd = p;
  rq.av.port = 1;
  rq.av.dgid[15] = 9;
  CreateAhResp r{};
  for (int i = 0; i < 8; i++) ASSERT_EQ(call(c, Selector::create_ah, rq, &r), Status::ok);
  EXPECT_EQ(r.av[0], 9);
  refused(c, Selector::create_ah, rq, &r, Status::quota_client);
  ASSERT_EQ(call0(c, Selector::destroy_ah, HandleReq{r.handle, 0}), Status::ok);
  rq.av.port = 0;
  refused(c, Selector::create_ah, rq, &r, Status::invalid);
  refused0(c, Selector::dealloc_pd, HandleReq{p, 0}, Status::busy);
}

TEST_F(Uapi, MappingsAreByKindAndHandle) {
  Client& c = open_client();
  uint32_t u = uar(c);
  CreateCqResp cr{};
  uint32_t q = cq(c, u, &cr);
  MapResp m{};
  ASSERT_EQ(call(c, Selector::map, MapReq{uint32_t(MapKind::cqe), q}, &m), Status::ok);
  EXPECT_EQ(m.length, 64u * cr.cqe);
  ASSERT_EQ(call(c, Selector::map, MapReq{uint32_t(MapKind::uar), u}, &m), Status::ok);
  EXPECT_EQ(m.flags, kMapWriteCombine);
  refused(c, Selector::map, MapReq{uint32_t(MapKind::sq), q}, &m, Status::invalid);  // a CQ has no SQ
  refused(c, Selector::map, MapReq{6, q}, &m, Status::invalid);
  refused(c, Selector::map, MapReq{0, q}, &m, Status::invalid);
  refused(c, Selector::map, MapReq{uint32_t(MapKind::cqe), pd(c)}, &m, Status::bad_handle);
  MapRegion reg;
  EXPECT_EQ(srv->mapping(c, map_type(MapKind::db_record, q), &reg), Status::ok);
  ASSERT_EQ(call0(c, Selector::destroy_cq, HandleReq{q, 0}), Status::ok);
  EXPECT_EQ(srv->mapping(c, map_type(MapKind::cqe, q), &reg), Status::bad_handle);
}

// A map answer names no host object: the platform's memory handle (a DEXT record pointer, the
// daemon's fd number) stays with the host, which finds it with mapping().
TEST_F(Uapi, MapShowsTheClientNoHostAddress) {
  Client& c = open_client();
  uint32_t u = uar(c);
  uint32_t q = cq(c, u);
  for (auto [kind, h] : {std::pair{MapKind::uar, u}, {MapKind::cqe, q}, {MapKind::db_record, q}}) {
    MapResp m{};
    ASSERT_EQ(call(c, Selector::map, MapReq{uint32_t(kind), h}, &m), Status::ok);
    MapRegion reg;
    ASSERT_EQ(srv->mapping(c, map_type(kind, h), &reg), Status::ok);
    ASSERT_NE(reg.memory, 0u) << "the recording backend names its memory";
    EXPECT_EQ(m.memory, 0u) << "kind " << int(kind);
    EXPECT_EQ(m.offset, reg.offset);
    EXPECT_EQ(m.length, reg.length);
  }
}

TEST_F(Uapi, EventsGoToTheOwnerOnly) {
  Client& a = open_client();
  Client& b = open_client();
  uint32_t u = uar(a);
  CreateCqResp cr{};
  uint32_t q = cq(a, u, &cr);
  EventResp e{};
  refused(a, Selector::get_event, EmptyReq{}, &e, Status::no_event);
  srv->deliver_completion(be.last_cq.event_tag);
  refused(b, Selector::get_event, EmptyReq{}, &e, Status::no_event);
  ASSERT_EQ(call(a, Selector::get_event, EmptyReq{}, &e), Status::ok);
  EXPECT_EQ(e.kind, kEventCompletion);
  EXPECT_EQ(e.handle, q);
  // A late event for a destroyed CQ is dropped, not delivered to whoever reuses the slot.
  uint64_t tag = be.last_cq.event_tag;
  ASSERT_EQ(call0(a, Selector::destroy_cq, HandleReq{q, 0}), Status::ok);
  cq(a, u);
  srv->deliver_completion(tag);
  refused(a, Selector::get_event, EmptyReq{}, &e, Status::no_event);
}

// The host is told once per drain: a burst of events wakes the client once, a get_event that finds
// the queue empty arms the next wake-up, and an event after that wakes it again.
TEST_F(Uapi, AWakeUpIsOutstandingOncePerDrain) {
  struct Count final : EventNotify {
    std::vector<uint32_t> woken;  // client ids
    void event_queued(Client& c) override { woken.push_back(c.id); }
  } n;
  srv->set_notify(&n);
  Client& a = open_client();
  Client& b = open_client();
  uint32_t qa = cq(a, uar(a));
  uint64_t ta = be.last_cq.event_tag;
  cq(b, uar(b));
  uint64_t tb = be.last_cq.event_tag;
  for (int i = 0; i < 3; i++) srv->deliver_completion(ta);
  srv->deliver_completion(tb);
  EXPECT_EQ(n.woken, (std::vector<uint32_t>{a.id, b.id}));
  EventResp e{};
  ASSERT_EQ(call(a, Selector::get_event, EmptyReq{}, &e), Status::ok);
  EXPECT_EQ(e.handle, qa);
  srv->deliver_completion(ta);  // not drained yet: the first wake-up still stands
  EXPECT_EQ(n.woken.size(), 2u);
  for (int i = 0; i < 3; i++) ASSERT_EQ(call(a, Selector::get_event, EmptyReq{}, &e), Status::ok);
  refused(a, Selector::get_event, EmptyReq{}, &e, Status::no_event);  // drained: armed again
  srv->deliver_completion(ta);
  srv->deliver_device(1 /* IBV_EVENT_QP_FATAL */);
  EXPECT_EQ(n.woken, (std::vector<uint32_t>{a.id, b.id, a.id}));  // b has not drained
  srv->set_notify(nullptr);
}

// An event posted for a client that has left is not delivered to the next client in its slot,
// whose first CQ has the same slot and generation the old one had.
TEST_F(Uapi, AnEventOfALeftClientDoesNotReachTheNextClientInItsSlot) {
  Client& a = open_client();
  uint32_t u = uar(a);
  uint32_t q = cq(a, u);
  uint64_t tag = be.last_cq.event_tag;
  uint32_t id = a.id;
  srv->detach(a);
  Client& b = open_client();
  ASSERT_EQ(b.id, id);
  uint32_t ub = uar(b);
  ASSERT_EQ(cq(b, ub), q);  // the same token
  srv->deliver_completion(tag);
  srv->deliver_async(tag, 0 /* IBV_EVENT_CQ_ERR */);
  EventResp e{};
  refused(b, Selector::get_event, EmptyReq{}, &e, Status::no_event);
  // Its own CQ's events do reach it.
  srv->deliver_completion(be.last_cq.event_tag);
  EXPECT_EQ(call(b, Selector::get_event, EmptyReq{}, &e), Status::ok);
}

// An SRQ's limit is checked against that SRQ (16 WRs given 32 WQEs), not the device's largest.
TEST_F(Uapi, AnSrqLimitIsBoundedByTheSrqsOwnSize) {
  Client& c = open_client();
  uint32_t p = pd(c);
  CreateSrqResp sr{};
  ASSERT_EQ(call(c, Selector::create_srq, CreateSrqReq{p, 16, 1, 0}, &sr), Status::ok);
  ASSERT_EQ(sr.wqe_cnt, 32u);
  EXPECT_EQ(call0(c, Selector::modify_srq, ModifySrqReq{sr.handle, 31}), Status::ok);
  refused0(c, Selector::modify_srq, ModifySrqReq{sr.handle, 32}, Status::invalid);
  refused0(c, Selector::modify_srq, ModifySrqReq{sr.handle, 1000}, Status::invalid);
}

// A create_srq whose limit the device refuses to arm fails whole: no SRQ, no quota, the status.
TEST_F(Uapi, ACreateSrqWhoseLimitCannotBeArmedFails) {
  Client& c = open_client();
  uint32_t p = pd(c);
  be.fail_modify_srq = Status::firmware;
  CreateSrqResp sr{};
  EXPECT_EQ(call(c, Selector::create_srq, CreateSrqReq{p, 16, 1, 4}, &sr), Status::firmware);
  EXPECT_EQ(be.live("srq"), 0);
  EXPECT_EQ(srv->live(ObjType::srq), 0u);
  be.fail_modify_srq = Status::ok;
  EXPECT_EQ(call(c, Selector::create_srq, CreateSrqReq{p, 16, 1, 4}, &sr), Status::ok);
}

TEST_F(Uapi, EventOverflowIsCounted) {
  Client& c = open_client();
  uint32_t h = qp(c);
  uint64_t tag = Server::tag_of(c, h);
  for (uint32_t i = 0; i < Client::kEvents + 5; i++) srv->deliver_async(tag, 1 /* IBV_EVENT_QP_FATAL */);
  EventResp e{};
  ASSERT_EQ(call(c, Selector::get_event, EmptyReq{}, &e), Status::ok);
  EXPECT_EQ(e.kind, kEventAsync);
  EXPECT_EQ(e.handle, h);
  EXPECT_EQ(e.event_type, 1u);
  EXPECT_EQ(e.dropped, 5u);
  EXPECT_EQ(srv->stats().events_dropped, 5u);
}

TEST_F(Uapi, DeviceEventsReachEveryOpenClient) {
  Client& a = open_client();
  Client& b = open_client();
  Client& closed = attach();
  srv->deliver_device(10 /* IBV_EVENT_PORT_ERR */);
  for (Client* c : {&a, &b}) {
    EventResp e{};
    ASSERT_EQ(call(*c, Selector::get_event, EmptyReq{}, &e), Status::ok);
    EXPECT_EQ(e.kind, kEventAsync);
    EXPECT_EQ(e.handle, 0u);
    EXPECT_EQ(e.event_type, 10u);
  }
  EXPECT_EQ(closed.ev_count, 0u);  // not open: nothing queued
}

// ---- Cleanup -------------------------------------------------------------------------------------

TEST_F(Uapi, DetachReleasesEverythingDependentsFirst) {
  Client& a = open_client();
  Client& b = open_client();
  for (int i = 0; i < 3; i++) qp(a);
  uint32_t p = pd(a);
  for (int i = 0; i < 5; i++) mr(a, p);
  CreateSrqResp sr{};
  ASSERT_EQ(call(a, Selector::create_srq, CreateSrqReq{p, 8, 1, 0}, &sr), Status::ok);
  CreateAhReq ah{};
  ah.pd = p;
  ah.av.port = 1;
  CreateAhResp ar{};
  ASSERT_EQ(call(a, Selector::create_ah, ah, &ar), Status::ok);
  uint32_t bq = qp(b);
  int b_objects = be.live_total() - (3 * 4 + 1 + 5 + 1);

  EXPECT_EQ(srv->detach(a), 0u);
  EXPECT_TRUE(be.violations.empty()) << be.violations[0];
  EXPECT_EQ(be.live_total(), b_objects);
  EXPECT_EQ(srv->live(ObjType::mr), 0u);
  EXPECT_EQ(srv->live(ObjType::qp), 1u);
  EXPECT_EQ(srv->live(ObjType::ah), 0u);
  EXPECT_EQ(srv->clients(), 1u);
  // b goes on.
  QpAttr qa{};
  EXPECT_EQ(call(b, Selector::query_qp, HandleReq{bq, 0}, &qa), Status::ok);
}

TEST_F(Uapi, CloseReleasesAndOnlyOpenIsAcceptedAfter) {
  Client& c = open_client();
  qp(c);
  ASSERT_EQ(call0(c, Selector::close), Status::ok);
  EXPECT_EQ(be.live_total(), 0);
  HandleResp r{};
  refused(c, Selector::alloc_pd, EmptyReq{}, &r, Status::not_open);
  OpenResp o{};
  EXPECT_EQ(call(c, Selector::open, OpenReq{kAbiVersion, 0, 0}, &o), Status::ok);
  EXPECT_EQ(srv->clients(), 1u);
}

TEST_F(Uapi, CleanupCountsBackendFailuresAndStillFreesTheSlots) {
  Client& c = open_client();
  pd(c);
  // Destroy the PD behind the server's back: the backend then refuses the cleanup's dealloc.
  void* obj = c.entries[slot_base(uint8_t(ObjType::pd))].obj;
  ASSERT_EQ(be.dealloc_pd(obj), Status::ok);
  EXPECT_EQ(srv->detach(c), 1u);
  EXPECT_EQ(srv->stats().cleanup_failures, 1u);
  EXPECT_EQ(srv->live(ObjType::pd), 0u);
  EXPECT_EQ(srv->clients(), 0u);
}

// The stable-driver gate's re-init (docs/gates.md): only where the host allows diagnostics, only
// with no object alive anywhere (it destroys every firmware object), flags checked.
TEST_F(Uapi, StableCycleIsDiagnosticAndNeedsADeviceWithoutObjects) {
  Client& a = open_client();
  CycleResp rp{};
  refused(a, Selector::stable_cycle, CycleReq{0, 0}, &rp, Status::not_permitted);
  srv->detach(a);
  lim.diagnostics = true;
  restart();
  Client& c = open_client();
  Client& other = open_client(7);
  uint32_t p = pd(other);
  refused(c, Selector::stable_cycle, CycleReq{0, 0}, &rp, Status::busy);  // another client's PD
  refused(c, Selector::stable_cycle, CycleReq{0x80, 0}, &rp, Status::invalid);
  refused(c, Selector::stable_cycle, CycleReq{0, 1}, &rp, Status::invalid);
  EXPECT_EQ(call0(other, Selector::dealloc_pd, HandleReq{p, 0}), Status::ok);
  // Now it reaches the backend (this one has no re-init).
  EXPECT_EQ(call(c, Selector::stable_cycle, CycleReq{kCycleInjectRoceEnQuirk, 0}, &rp), Status::unsupported);
}

TEST_F(Uapi, RequestsFromADetachedClientAreRefused) {
  Client& c = open_client();
  srv->detach(c);
  HandleResp r{};
  refused(c, Selector::alloc_pd, EmptyReq{}, &r, Status::not_open);
}

}  // namespace
}  // namespace melon::uapi
