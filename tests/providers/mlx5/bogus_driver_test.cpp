// The mlx5 provider against a driver whose answers do not add up (a fake Transport): each is
// refused with EPROTO or the status's errno, the object the driver did create is destroyed again,
// and nothing is mapped past what the driver handed out.
#include <gtest/gtest.h>

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "providers/mlx5/mlx5.h"

namespace mp = melon::mlx5prov;
namespace u = melon::uapi;

namespace {

class FakeTransport : public mp::Transport {
 public:
  FakeTransport() { EXPECT_EQ(pipe(ev_), 0); }
  ~FakeTransport() override {
    close(ev_[0]);
    close(ev_[1]);
  }

  u::Status call(u::Selector sel, const void* in, uint32_t, void* out, uint32_t) override {
    std::lock_guard<std::mutex> l(mu);  // the provider's event thread calls get_event too
    calls.push_back(sel);
    if (auto it = refuse.find(sel); it != refuse.end()) return it->second;
    switch (sel) {
      case u::Selector::query_device: {
        u::DeviceAttr a{};
        a.vendor_id = 0x02c9;
        a.vendor_part_id = 4117;
        a.max_qp_wr = a.max_srq_wr = 1024;
        a.max_sge = a.max_srq_sge = 16;
        a.max_cqe = 4096;
        a.max_inline_data = 256;
        a.phys_port_cnt = 1;
        memcpy(out, &a, sizeof a);
        return u::Status::ok;
      }
      case u::Selector::alloc_uar: {
        u::UarResp r{next++, 4096, uar_db_offset, 0};
        memcpy(out, &r, sizeof r);
        return u::Status::ok;
      }
      case u::Selector::alloc_pd: {
        u::HandleResp r{next++, 0};
        memcpy(out, &r, sizeof r);
        return u::Status::ok;
      }
      case u::Selector::create_cq: {
        u::CreateCqResp r{next++, 7, 64, cqe_bytes, 0, 0};
        memcpy(out, &r, sizeof r);
        return u::Status::ok;
      }
      case u::Selector::create_qp: {
        u::CreateQpResp r{next++, 0x42, sq_wqe_cnt, 16, 64, 0, 0, 16 * 64};
        memcpy(out, &r, sizeof r);
        return u::Status::ok;
      }
      case u::Selector::destroy_qp:
      case u::Selector::destroy_cq:
      case u::Selector::dealloc_pd:
      case u::Selector::free_uar: {
        u::HandleReq h;
        memcpy(&h, in, sizeof h);
        destroyed.push_back(h.handle);
        return u::Status::ok;
      }
      case u::Selector::get_event: {
        if (events.empty()) return u::Status::no_event;
        memcpy(out, &events.front(), sizeof(u::EventResp));
        events.pop_front();
        return u::Status::ok;
      }
      default: return u::Status::unsupported;
    }
  }
  void* map(u::MapKind, uint32_t, uint64_t* len, u::Status* st) override {
    *len = map_bytes;
    *st = u::Status::ok;
    void* p = nullptr;
    EXPECT_EQ(posix_memalign(&p, 4096, map_bytes), 0);
    memset(p, 0, map_bytes);
    maps++;
    return p;
  }
  void unmap(void* addr, uint64_t) override {
    free(addr);
    maps--;
  }
  // Never woken (nothing writes the pipe); with no_wake, as a driver that cannot wake the
  // provider, the provider asks on a 5 ms timer.
  Wake wait_event(int stop_fd) override { return mp::wait_readable(stop_fd, no_wake ? -1 : ev_[0], no_wake ? 5 : -1); }
  int kick(uint32_t, uint32_t, uint64_t) override { return 0; }

  // What the fake answers (changed by the tests).
  uint32_t uar_db_offset = 0x800, cqe_bytes = 64, sq_wqe_cnt = 64;
  uint64_t map_bytes = 16 * 4096;
  bool no_wake = false;  // events only by asking
  std::deque<u::EventResp> events;  // get_event's answers
  std::mutex mu;
  std::map<u::Selector, u::Status> refuse;
  // What it saw.
  std::vector<u::Selector> calls;
  std::vector<uint32_t> destroyed;
  int maps = 0;

 private:
  int ev_[2];
  uint32_t next = 0x100;
};

class BogusDriver : public ::testing::Test {
 protected:
  ibv_context* open(FakeTransport* f) {
    fake = f;
    melon::verbs::ContextBase* c = mp::open_context(&dev, std::unique_ptr<mp::Transport>(f));
    return c ? c->ibv() : nullptr;
  }
  mp::Mlx5Device dev{"fake"};
  FakeTransport* fake = nullptr;
};

TEST_F(BogusDriver, UarTooSmallForItsDoorbellFailsTheOpen) {
  auto* f = new FakeTransport;
  f->uar_db_offset = 4096;  // the doorbell would sit past the mapped page
  f->map_bytes = 4096;
  errno = 0;
  EXPECT_EQ(open(f), nullptr);
  EXPECT_EQ(errno, EPROTO);
}

TEST_F(BogusDriver, CqeSizeOtherThan64IsRefusedAndTheCqDestroyed) {
  auto* f = new FakeTransport;
  ibv_context* ctx = open(f);
  ASSERT_NE(ctx, nullptr);
  int before = f->maps;
  f->cqe_bytes = 32;
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx, 16, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EPROTO);
  ASSERT_FALSE(f->destroyed.empty());
  EXPECT_EQ(f->calls.back(), u::Selector::destroy_cq);
  EXPECT_EQ(f->maps, before);  // the ring and record it mapped are unmapped again
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

TEST_F(BogusDriver, SendQueueNotAPowerOfTwoIsRefusedAndTheQpDestroyed) {
  auto* f = new FakeTransport;
  ibv_context* ctx = open(f);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  int before = f->maps;
  f->sq_wqe_cnt = 48;
  ibv_qp_init_attr at{};
  at.send_cq = at.recv_cq = cq;
  at.qp_type = IBV_QPT_RC;
  at.cap.max_send_wr = at.cap.max_recv_wr = 4;
  at.cap.max_send_sge = at.cap.max_recv_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd, &at), nullptr);
  EXPECT_EQ(errno, EPROTO);
  EXPECT_EQ(f->calls.back(), u::Selector::destroy_qp);
  EXPECT_EQ(f->maps, before);
  f->sq_wqe_cnt = 64;
  f->map_bytes = 4096;  // a buffer shorter than RQ + SQ
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd, &at), nullptr);
  EXPECT_EQ(errno, EPROTO);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

TEST_F(BogusDriver, RefusalsBecomeTheirErrno) {
  auto* f = new FakeTransport;
  ibv_context* ctx = open(f);
  ASSERT_NE(ctx, nullptr);
  f->refuse[u::Selector::alloc_pd] = u::Status::quota_client;
  errno = 0;
  EXPECT_EQ(ibv_alloc_pd(ctx), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  f->refuse.clear();
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  f->refuse[u::Selector::dealloc_pd] = u::Status::busy;
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  f->refuse[u::Selector::dealloc_pd] = u::Status::device_dead;
  EXPECT_EQ(ibv_dealloc_pd(pd), EIO);
  f->refuse.clear();
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

// A transport that cannot be woken (the IOKit one with a driver that refuses its wake call): the
// provider asks get_event on a timer, so a queued device event still reaches ibv_get_async_event.
TEST_F(BogusDriver, WithoutWakeUpsEventsAreAskedFor) {
  auto* f = new FakeTransport;
  f->no_wake = true;
  u::EventResp ev{};
  ev.kind = u::kEventAsync;
  ev.handle = 0;  // the device's
  ev.event_type = IBV_EVENT_PORT_ERR;
  f->events.push_back(ev);
  ibv_context* ctx = open(f);
  ASSERT_NE(ctx, nullptr);
  pollfd p{ctx->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "the event never arrived";
  ibv_async_event a{};
  ASSERT_EQ(ibv_get_async_event(ctx, &a), 0);
  EXPECT_EQ(a.event_type, IBV_EVENT_PORT_ERR);
  EXPECT_EQ(a.element.port_num, 1);
  ibv_ack_async_event(&a);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

}  // namespace
