// melon-emud's kernel-bypass data path, driven as an mlx5 provider drives hardware: the test holds
// only a uapi::SocketClient and the mappings. It writes raw WQEs (src/mlx5/prm layouts) into the mapped SQ,
// the doorbell record, then the doorbell into the mapped UAR page (with the wake-up handshake of
// uapi/doorbell.h), and polls the mapped CQ ring by the owner bit. Between two daemons the frames
// cross each one's UDP wire on its own loopback address; between two clients of one daemon they
// loop back through its wire.
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <new>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dext/emuhost/raw_client.h"

namespace melon::dext {
namespace {

using namespace rawclient;

// This test's loopback addresses (ctest runs tests in parallel; each test owns its addresses).
const char* const kWireA = "127.0.8.3";
const char* const kWireB = "127.0.8.4";

// ---- fixtures ----------------------------------------------------------------------------------

class EmudDataPath : public ::testing::Test {
 protected:
  Daemon da, db;
  void SetUp() override {
    ASSERT_TRUE(da.start(kWireA)) << da.log();
    ASSERT_TRUE(db.start(kWireB)) << db.log();
  }
  // Both daemons stop cleanly with nothing leaked, whatever the test did to them.
  void stop_daemons() {
    EXPECT_EQ(da.stop(), 0) << da.log();
    EXPECT_EQ(db.stop(), 0) << db.log();
  }
  // A connected RC pair: a on daemon A, b on daemon B (or on A when `same_daemon`).
  void pair(Endpoint& a, Endpoint& b, bool same_daemon = false) {
    a.build(da.sock);
    b.build(same_daemon ? da.sock : db.sock);
    a.connect(b);
    b.connect(a);
  }
};

// Doorbells posted with gaps around the watcher's polling window (100 us), so many land while it
// goes to sleep: each completes, and the daemon's count of doorbells it found only after a sleep
// no kick ended (the handshake failing) stays 0.
TEST_F(EmudDataPath, NoDoorbellIsLeftLyingAcrossTheSleepHandshake) {
  {
    Endpoint a, b;
    pair(a, b, /*same_daemon=*/true);
    ASSERT_FALSE(HasFatalFailure());
    uint32_t seed = 7;
    for (int i = 0; i < 300; i++) {
      seed = seed * 1103515245u + 12345u;
      usleep(seed % 400);
      a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 8, a.lkey, uint64_t(uintptr_t(b.buf)), b.rkey);
      const uint8_t* e = a.poll_cq();
      ASSERT_NE(e, nullptr) << "post " << i;
      ASSERT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ) << "post " << i;
    }
  }
  stop_daemons();
  std::string log = da.log();
  EXPECT_NE(log.find(" 0 found without a kick"), std::string::npos) << log;
  EXPECT_EQ(log.find(" 0 sleeps"), std::string::npos) << "the watcher never slept: " << log;
}

uapi::UsageResp usage(const std::string& sock) {
  uapi::SocketClient c;
  EXPECT_TRUE(c.connect(sock.c_str()));
  EXPECT_EQ(c.open(), Status::ok);
  uapi::UsageResp u{};
  EXPECT_EQ(c.call(Selector::query_usage, uapi::EmptyReq{}, &u), Status::ok);
  return u;
}

// A client process killed while its doorbells and WRITEs are in flight: the daemon releases its
// QPs, CQs, MRs, queue memory, UAR pages (the watcher lets go of them) and pins, and serves the next
// client's data path as before.
TEST_F(EmudDataPath, ClientKilledMidTrafficLeavesNothingBehind) {
  uapi::UsageResp before = usage(da.sock);
  auto* posted = static_cast<std::atomic<uint32_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(posted, MAP_FAILED);
  new (posted) std::atomic<uint32_t>(0);
  pid_t child = fork();
  if (child == 0) {
    Endpoint a, b;
    pair(a, b, /*same_daemon=*/true);
    if (HasFailure()) _exit(1);
    for (uint32_t i = 0;; i++) {
      a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 4096, a.lkey, uint64_t(uintptr_t(b.buf)),
                  b.rkey);
      if (!a.poll_cq()) _exit(2);
      posted->store(i + 1);
    }
  }
  for (auto until = std::chrono::steady_clock::now() + kPatience; posted->load() < 50;) {
    int st;
    ASSERT_NE(waitpid(child, &st, WNOHANG), child) << "the traffic child exited " << st;
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "no traffic from the child";
    usleep(1000);
  }
  uapi::UsageResp during = usage(da.sock);
  EXPECT_EQ(during.server_live[uint8_t(uapi::ObjType::uar)], 2u);
  EXPECT_GT(during.pinned_bytes, 0u);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  munmap(posted, 4096);
  uapi::UsageResp after{};
  for (int i = 0; i < 500; i++) {
    after = usage(da.sock);
    if (after.clients == 1) break;
    usleep(10000);
  }
  EXPECT_EQ(after.clients, 1u);  // the one asking
  for (uint32_t t = 0; t < uapi::kObjTypes; t++) EXPECT_EQ(after.server_live[t], 0u) << "type " << t;
  for (uint32_t k = 0; k < 8; k++) EXPECT_EQ(after.core_live[k], before.core_live[k]) << "core kind " << k;
  EXPECT_EQ(after.queue_bytes, before.queue_bytes);
  EXPECT_EQ(after.pinned_bytes, 0u);
  EXPECT_EQ(after.dma_buffers, before.dma_buffers);
  EXPECT_EQ(after.fw_pages, before.fw_pages);
  {
    Endpoint a, b;
    pair(a, b, /*same_daemon=*/true);
    ASSERT_FALSE(HasFatalFailure());
    fill(a.buf, 1000, 21);
    a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 1000, a.lkey, uint64_t(uintptr_t(b.buf)),
                b.rkey);
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(memcmp(b.buf, a.buf, 1000), 0);
  }
  stop_daemons();
}

// The wire on IPv6 (::1 in a network namespace of the daemon's own): GID 0 is the address itself,
// and a SEND and a WRITE between two clients cross it. Registered as its own ctest entry, which
// skips without root.
TEST(EmudDataPathIpv6, SendAndWriteOverAnIpv6Wire) {
  if (system("unshare --net true 2>/dev/null") != 0) GTEST_SKIP() << "no network namespaces here (needs root)";
  Daemon d;
  ASSERT_TRUE(d.start("::1", nullptr, /*netns=*/true)) << d.log();
  {
    Endpoint a, b;
    a.build(d.sock);
    b.build(d.sock);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    const uint8_t loop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    EXPECT_EQ(memcmp(a.gid, loop6, 16), 0);
    a.connect(b);
    b.connect(a);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    fill(a.buf, 2500, 4);
    b.post_recv(uint64_t(uintptr_t(b.buf)), 4096);
    a.post_send(p::wqe_opcode::SEND, uint64_t(uintptr_t(a.buf)), 2500, a.lkey);
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    e = b.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::RESP_SEND);
    EXPECT_EQ(cqe_field(e, p::cqe64::byte_cnt), 2500u);
    EXPECT_EQ(memcmp(b.buf, a.buf, 2500), 0);
    fill(b.buf + 8192, 6000, 8);
    b.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(b.buf + 8192)), 6000, b.lkey,
                uint64_t(uintptr_t(a.buf + 4096)), a.rkey);
    e = b.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(memcmp(a.buf + 4096, b.buf + 8192, 6000), 0);
  }
  EXPECT_EQ(d.stop(), 0) << d.log();
  EXPECT_NE(d.log().find(" 0 bad ICRC"), std::string::npos) << d.log();
}

// Two QPs and two CQs on one UAR page, as a provider shares one page per context: doorbells
// written to the same word while the watcher sleeps, one kick for all of them. Each QP is rung and
// each CQ armed, though the page's doorbell words kept only the last of each (the watcher follows
// the doorbell records).
TEST_F(EmudDataPath, QpsAndCqsSharingAUarPageLoseNoDoorbell) {
  {
    Endpoint a1, a2, b1, b2;
    a1.build(da.sock);
    a2.build_shared(a1);
    b1.build(db.sock);
    b2.build_shared(b1);
    ASSERT_FALSE(HasFatalFailure());
    a1.connect(b1), b1.connect(a1), a2.connect(b2), b2.connect(a2);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_NE(a1.q.qpn, a2.q.qpn);
    // Both of b's CQs armed for the first time (arm word 0: sn 0, next, ci 0), one kick.
    ASSERT_TRUE(b1.wait_watcher_asleep());
    b1.hold_kicks = b2.hold_kicks = true;
    b1.arm_cq();
    b2.arm_cq();
    b1.kick();
    b1.post_recv(uint64_t(uintptr_t(b1.buf)), 256);
    b2.post_recv(uint64_t(uintptr_t(b2.buf)), 256);
    // Both of a's QPs post, doorbells on the same BlueFlame word, one kick.
    ASSERT_TRUE(a1.wait_watcher_asleep());
    a1.hold_kicks = a2.hold_kicks = true;
    fill(a1.buf, 100, 1), fill(a2.buf, 100, 2);
    a1.bf_flip = a2.bf_flip = 0;
    a1.post_send(p::wqe_opcode::SEND, uint64_t(uintptr_t(a1.buf)), 100, a1.lkey);
    a2.post_send(p::wqe_opcode::SEND, uint64_t(uintptr_t(a2.buf)), 100, a2.lkey);
    a1.kick();
    for (Endpoint* e : {&a1, &a2}) {
      const uint8_t* c = e->poll_cq();
      ASSERT_NE(c, nullptr) << "QP " << e->q.qpn << ": its doorbell was lost";
      EXPECT_EQ(cqe_field(c, p::cqe64::opcode), p::cqe_opcode::REQ);
    }
    for (Endpoint* e : {&b1, &b2}) ASSERT_NE(e->poll_cq(), nullptr);
    EXPECT_EQ(memcmp(b1.buf, a1.buf, 100), 0);
    EXPECT_EQ(memcmp(b2.buf, a2.buf, 100), 0);
    // One event for each armed CQ, on the one client's eventfd.
    std::vector<uint32_t> got;
    pollfd pf{b1.c.event_fd(), POLLIN, 0};
    for (auto until = std::chrono::steady_clock::now() + kPatience; got.size() < 2;) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "events seen: " << got.size();
      if (poll(&pf, 1, 100) != 1) continue;
      uint64_t n;
      ASSERT_EQ(read(b1.c.event_fd(), &n, sizeof n), ssize_t(sizeof n));
      uapi::EventResp ev{};
      while (b1.c.call(Selector::get_event, uapi::EmptyReq{}, &ev) == Status::ok) {
        EXPECT_EQ(ev.kind, uapi::kEventCompletion);
        got.push_back(ev.handle);
      }
    }
    std::sort(got.begin(), got.end());
    std::vector<uint32_t> want{b1.cq, b2.cq};
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want);
    // No second event for either: each arm was made once, whichever way the watcher saw it.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    uapi::EventResp ev{};
    EXPECT_EQ(b1.c.call(Selector::get_event, uapi::EmptyReq{}, &ev), Status::no_event);
  }
  stop_daemons();
}

// A SEND into a posted receive and an RDMA WRITE, across two daemons' wires: CQEs on both sides
// with the PRM's fields, bytes where they belong.
TEST_F(EmudDataPath, SendAndWriteCrossTwoDaemonsWires) {
  {
    Endpoint a, b;
    pair(a, b);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_TRUE(a.map_flags & uapi::kMapWatched);
    EXPECT_TRUE(a.map_flags & uapi::kMapWriteCombine);

    // SEND of 3000 bytes (three 1 KiB packets) into b's receive at offset 1000.
    fill(a.buf, 3000, 1);
    uint16_t ridx = b.post_recv(uint64_t(uintptr_t(b.buf + 1000)), 4000);
    uint16_t sidx = a.post_send(p::wqe_opcode::SEND, uint64_t(uintptr_t(a.buf)), 3000, a.lkey);
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr) << "no send completion";
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(cqe_field(e, p::cqe64::sop_drop), p::wqe_opcode::SEND);
    EXPECT_EQ(cqe_field(e, p::cqe64::wqe_counter), sidx);
    EXPECT_EQ(cqe_field(e, p::cqe64::qpn), a.q.qpn);
    e = b.poll_cq();
    ASSERT_NE(e, nullptr) << "no receive completion";
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::RESP_SEND);
    EXPECT_EQ(cqe_field(e, p::cqe64::byte_cnt), 3000u);
    EXPECT_EQ(cqe_field(e, p::cqe64::wqe_counter), ridx);
    EXPECT_EQ(cqe_field(e, p::cqe64::qpn), b.q.qpn);
    EXPECT_EQ(memcmp(b.buf + 1000, a.buf, 3000), 0);

    // RDMA WRITE of 20000 bytes from b into a at offset 8192; no receive consumed.
    fill(b.buf + 32768, 20000, 9);
    sidx = b.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(b.buf + 32768)), 20000, b.lkey,
                       uint64_t(uintptr_t(a.buf + 8192)), a.rkey);
    e = b.poll_cq();
    ASSERT_NE(e, nullptr) << "no write completion";
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(cqe_field(e, p::cqe64::sop_drop), p::wqe_opcode::RDMA_WRITE);
    EXPECT_EQ(cqe_field(e, p::cqe64::wqe_counter), sidx);
    EXPECT_EQ(memcmp(a.buf + 8192, b.buf + 32768, 20000), 0);
    EXPECT_FALSE(a.cqe_ready());  // a WRITE without immediate completes nothing at the responder

    // Round trips enough to wrap the SQ and the CQ rings a few times.
    for (int i = 0; i < 150; i++) {
      b.post_recv(uint64_t(uintptr_t(b.buf)), 64);
      a.post_send(p::wqe_opcode::SEND, uint64_t(uintptr_t(a.buf + i)), 64, a.lkey);
      e = a.poll_cq();
      ASSERT_NE(e, nullptr) << "round " << i;
      ASSERT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ) << "round " << i;
      e = b.poll_cq();
      ASSERT_NE(e, nullptr) << "round " << i;
      ASSERT_EQ(cqe_field(e, p::cqe64::byte_cnt), 64u) << "round " << i;
      ASSERT_EQ(memcmp(b.buf, a.buf + i, 64), 0) << "round " << i;
    }
  }
  stop_daemons();
}

// RDMA READ and the two atomics across the daemons' wires: the responder daemon writes the
// requester's memory (READ response, atomic original value) and its own (the atomic's result).
TEST_F(EmudDataPath, ReadAndAtomicsCrossTwoDaemonsWires) {
  {
    Endpoint a, b;
    pair(a, b);
    ASSERT_FALSE(HasFatalFailure());
    fill(b.buf + 4096, 3000, 6);
    uint16_t idx = a.post_send(p::wqe_opcode::RDMA_READ, uint64_t(uintptr_t(a.buf)), 3000, a.lkey,
                               uint64_t(uintptr_t(b.buf + 4096)), b.rkey);
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(cqe_field(e, p::cqe64::sop_drop), p::wqe_opcode::RDMA_READ);
    EXPECT_EQ(cqe_field(e, p::cqe64::wqe_counter), idx);
    EXPECT_EQ(cqe_field(e, p::cqe64::byte_cnt), 3000u);
    EXPECT_EQ(memcmp(a.buf, b.buf + 4096, 3000), 0);

    // The atomic target in an MR of its own with local write and remote atomic only, as perftest's
    // ib_atomic_bw registers it (IBA o10-39: no Remote Write needed).
    uint64_t* target = static_cast<uint64_t*>(aligned_alloc(4096, 4096));
    *target = 40;
    uapi::RegMrResp tm{};
    ASSERT_EQ(b.c.call(Selector::reg_mr,
                       uapi::RegMrReq{b.pd, uapi::kAccessLocalWrite | uapi::kAccessRemoteAtomic,
                                      uint64_t(uintptr_t(target)), 4096},
                       &tm),
              Status::ok);
    for (uint8_t opcode : {p::wqe_opcode::ATOMIC_FA, p::wqe_opcode::ATOMIC_CS}) {
      SCOPED_TRACE(int(opcode));
      uint8_t w[64] = {};
      p::wqe_raddr_seg::view(w + 16)
          .set(p::wqe_raddr_seg::raddr, uint64_t(uintptr_t(target)))
          .set(p::wqe_raddr_seg::rkey, tm.rkey);
      // fetch-and-add 2 (40 -> 42), then compare-and-swap 42 -> 7
      bool cs = opcode == p::wqe_opcode::ATOMIC_CS;
      p::wqe_atomic_seg::view(w + 32)
          .set(p::wqe_atomic_seg::swap_add, cs ? 7 : 2)
          .set(p::wqe_atomic_seg::compare, cs ? 42 : 0);
      p::wqe_data_seg::view(w + 48)
          .set(p::wqe_data_seg::byte_count, 8)
          .set(p::wqe_data_seg::lkey, a.lkey)
          .set(p::wqe_data_seg::addr, uint64_t(uintptr_t(a.buf + 64)));
      p::wqe_ctrl_seg::view(w)
          .set(p::wqe_ctrl_seg::opcode, opcode)
          .set(p::wqe_ctrl_seg::wqe_index, a.sq_pi & 0xffff)
          .set(p::wqe_ctrl_seg::qpn, a.q.qpn)
          .set(p::wqe_ctrl_seg::ds, 4)
          .set(p::wqe_ctrl_seg::ce, 2);
      a.post_raw(w);
      e = a.poll_cq();
      ASSERT_NE(e, nullptr);
      ASSERT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ)
          << "syndrome " << cqe_field(e, p::err_cqe::syndrome);
      EXPECT_EQ(cqe_field(e, p::cqe64::byte_cnt), 8u);
    }
    EXPECT_EQ(*target, 7u);  // the responder's memory, in its own byte order
    uapi::EmptyResp er;
    EXPECT_EQ(b.c.call(Selector::dereg_mr, uapi::HandleReq{tm.handle, 0}, &er), Status::ok);
    free(target);
  }
  stop_daemons();
}

// Two clients of one daemon: the frames leave through its wire and come back to it.
TEST_F(EmudDataPath, WriteBetweenTwoClientsOfOneDaemon) {
  {
    Endpoint a, b;
    pair(a, b, /*same_daemon=*/true);
    ASSERT_FALSE(HasFatalFailure());
    fill(a.buf, 5000, 3);
    uint16_t sidx = a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 5000, a.lkey,
                                uint64_t(uintptr_t(b.buf + 100)), b.rkey);
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(cqe_field(e, p::cqe64::wqe_counter), sidx);
    EXPECT_EQ(memcmp(b.buf + 100, a.buf, 5000), 0);
  }
  stop_daemons();
}

// CQ arm doorbell -> completion EQE -> driver core -> the client's event queue -> its eventfd.
TEST_F(EmudDataPath, ArmedCqCompletionEventReachesTheEventFd) {
  {
    Endpoint a, b;
    pair(a, b);
    ASSERT_FALSE(HasFatalFailure());
    // Unarmed: the completion comes, no event does.
    b.post_recv(uint64_t(uintptr_t(b.buf)), 256);
    a.post_send(p::wqe_opcode::SEND, uint64_t(uintptr_t(a.buf)), 100, a.lkey);
    ASSERT_NE(a.poll_cq(), nullptr);
    ASSERT_NE(b.poll_cq(), nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    uapi::EventResp ev{};
    EXPECT_EQ(b.c.call(Selector::get_event, uapi::EmptyReq{}, &ev), Status::no_event);
    pollfd pf{b.c.event_fd(), POLLIN, 0};
    EXPECT_EQ(poll(&pf, 1, 0), 0);

    // Armed: one event for the next completion, naming the CQ by its handle.
    b.arm_cq();
    b.post_recv(uint64_t(uintptr_t(b.buf)), 256);
    a.post_send(p::wqe_opcode::SEND, uint64_t(uintptr_t(a.buf)), 100, a.lkey);
    ASSERT_EQ(poll(&pf, 1, 10000), 1) << "no event on the event fd";
    uint64_t n = 0;
    ASSERT_EQ(read(b.c.event_fd(), &n, sizeof n), ssize_t(sizeof n));
    EXPECT_GE(n, 1u);
    ASSERT_EQ(b.c.call(Selector::get_event, uapi::EmptyReq{}, &ev), Status::ok);
    EXPECT_EQ(ev.kind, uapi::kEventCompletion);
    EXPECT_EQ(ev.handle, b.cq);
    EXPECT_EQ(ev.dropped, 0u);
    EXPECT_EQ(b.c.call(Selector::get_event, uapi::EmptyReq{}, &ev), Status::no_event);  // one per arm
    const uint8_t* e = b.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::RESP_SEND);
    ASSERT_NE(a.poll_cq(), nullptr);

    // Armed with a completion already waiting (arm at the old consumer index): the event comes at
    // once (PRM). The sequence number moves on after each event, as rdma-core's cq.c does it.
    b.arm_sn++;
    b.post_recv(uint64_t(uintptr_t(b.buf)), 256);
    a.post_send(p::wqe_opcode::SEND, uint64_t(uintptr_t(a.buf)), 100, a.lkey);
    ASSERT_NE(a.poll_cq(), nullptr);
    for (auto until = std::chrono::steady_clock::now() + kPatience; !b.cqe_ready();) {
      ASSERT_LT(std::chrono::steady_clock::now(), until);
      usleep(100);
    }
    b.arm_cq();
    ASSERT_EQ(poll(&pf, 1, 10000), 1) << "arming over an unpolled CQE raised no event";
    ASSERT_EQ(read(b.c.event_fd(), &n, sizeof n), ssize_t(sizeof n));
    ASSERT_EQ(b.c.call(Selector::get_event, uapi::EmptyReq{}, &ev), Status::ok);
    EXPECT_EQ(ev.kind, uapi::kEventCompletion);
    EXPECT_EQ(ev.handle, b.cq);
    ASSERT_NE(b.poll_cq(), nullptr);
  }
  stop_daemons();
}

// An idle watcher announces that it sleeps; a doorbell with the kick wakes it.
TEST_F(EmudDataPath, IdleWatcherSleepsAndTheKickWakesIt) {
  {
    Endpoint a, b;
    pair(a, b);
    ASSERT_FALSE(HasFatalFailure());
    uapi::UarWatch* w = uapi::uar_watch(a.uar_page);
    // A sleep also ends by itself every 200 ms (uar_watcher.cpp), and a test thread descheduled
    // between seeing `sleeping` and its post may post while the watcher polls: no kick is due then.
    // So up to five posts, each after the watcher was seen asleep; at least one must kick.
    bool kicked = false;
    for (int round = 0; round < 5 && !kicked; round++) {
      ASSERT_TRUE(a.wait_watcher_asleep()) << "the watcher never slept";
      uint32_t kicks = __atomic_load_n(&w->kick, __ATOMIC_ACQUIRE);
      fill(a.buf, 512, uint8_t(5 + round));
      a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 512, a.lkey, uint64_t(uintptr_t(b.buf)),
                  b.rkey);
      kicked = __atomic_load_n(&w->kick, __ATOMIC_ACQUIRE) == kicks + 1;  // found the watcher asleep, kicked it
      const uint8_t* e = a.poll_cq();
      ASSERT_NE(e, nullptr) << "round " << round;
      EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
      EXPECT_EQ(memcmp(b.buf, a.buf, 512), 0);
    }
    EXPECT_TRUE(kicked) << "five doorbells after the watcher was seen asleep, none kicked it";
  }
  stop_daemons();
  // Each kicked doorbell woke the watcher; none waited for the sleep to end by itself.
  EXPECT_NE(da.log().find(" 0 found without a kick"), std::string::npos) << da.log();
}

// A WQE naming a memory key the client does not own (a forged one, and another client's real one
// in another PD): the PRM's local protection error CQE, the QP to ERR; the daemon goes on serving.
TEST_F(EmudDataPath, ForgedLkeyGetsLocalProtectionErrorCqe) {
  {
    Endpoint a, b, c, d;
    pair(a, b, /*same_daemon=*/true);
    ASSERT_FALSE(HasFatalFailure());
    c.build(da.sock);
    d.build(da.sock);
    ASSERT_FALSE(HasFatalFailure());
    c.connect(d);
    d.connect(c);
    ASSERT_FALSE(HasFatalFailure());
    uint32_t forged[] = {a.lkey ^ 0x5500, c.lkey};  // a key that names nothing; c's key (c's PD)
    for (uint32_t key : forged) {
      SCOPED_TRACE(key);
      uint16_t idx = a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 64, key,
                                 uint64_t(uintptr_t(b.buf)), b.rkey);
      const uint8_t* e = a.poll_cq();
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(cqe_field(e, p::err_cqe::opcode), p::cqe_opcode::REQ_ERR);
      EXPECT_EQ(cqe_field(e, p::err_cqe::syndrome), p::cqe_syndrome::LOCAL_PROT_ERR);
      EXPECT_EQ(cqe_field(e, p::err_cqe::s_wqe_opcode), p::wqe_opcode::RDMA_WRITE);
      EXPECT_EQ(cqe_field(e, p::err_cqe::wqe_counter), idx);
      EXPECT_EQ(a.qp_state(), uapi::kStateErr);
      // Back to work: ERR -> RESET -> ... RTS again for the second key.
      uapi::ModifyQpReq m{};
      m.qp_state = uapi::kStateReset;
      ASSERT_EQ(a.modify(uapi::kQpState, m), Status::ok);
      a.sq_pi = 0, a.bf_flip = 0;
      p::set(a.qp_dbr, p::qp_dbrec::snd_counter, 0);  // RESET starts the rings over (rdma-core qp.c)
      a.connect(b);
      ASSERT_FALSE(HasFatalFailure());
    }
    // c's data, and c itself, are untouched; c and d keep working on the same daemon.
    fill(c.buf, 1024, 7);
    c.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(c.buf)), 1024, c.lkey, uint64_t(uintptr_t(d.buf)),
                d.rkey);
    const uint8_t* e = c.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(memcmp(d.buf, c.buf, 1024), 0);
    EXPECT_EQ(memcmp(b.buf, std::vector<uint8_t>(64, 0).data(), 64), 0);  // nothing reached b
  }
  stop_daemons();
}

// A WQE the device cannot parse (its index is not the producer counter): LOCAL_QP_OP_ERR.
TEST_F(EmudDataPath, MalformedWqeGetsLocalQpOpErrorCqe) {
  {
    Endpoint a, b;
    pair(a, b);
    ASSERT_FALSE(HasFatalFailure());
    uint8_t w[64] = {};
    p::wqe_ctrl_seg::view(w)
        .set(p::wqe_ctrl_seg::opcode, p::wqe_opcode::SEND)
        .set(p::wqe_ctrl_seg::wqe_index, 0x1234)
        .set(p::wqe_ctrl_seg::qpn, a.q.qpn)
        .set(p::wqe_ctrl_seg::ds, 2)
        .set(p::wqe_ctrl_seg::ce, 2);
    a.post_raw(w);
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::err_cqe::opcode), p::cqe_opcode::REQ_ERR);
    EXPECT_EQ(cqe_field(e, p::err_cqe::syndrome), p::cqe_syndrome::LOCAL_QP_OP_ERR);
    EXPECT_EQ(cqe_field(e, p::err_cqe::wqe_counter), 0u);
    EXPECT_EQ(a.qp_state(), uapi::kStateErr);
  }
  stop_daemons();
}

// Doorbells naming another client's QP and CQ, written to the caller's own UAR pages: the device
// takes doorbells only through the UAR the object was created with, so it ignores (and counts)
// every one, and the other client's QP and CQ go on as if nothing happened.
TEST_F(EmudDataPath, DoorbellsNamingAnotherClientsObjectsAreIgnored) {
  {
    Endpoint a, b, x;
    pair(a, b, /*same_daemon=*/true);
    x.build(da.sock);
    ASSERT_FALSE(HasFatalFailure());
    // Each doorbell in a word of its own (two BlueFlame buffers on each of two pages): a word the
    // watcher polls keeps only the last value written (uapi/doorbell.h), and these name no object
    // of the page, so no record stands in for one overwritten before a scan. (Two on one word, 5 ms
    // apart, made 3 or 4 out of 5 on a loaded machine.)
    uapi::UarResp u2{};
    ASSERT_EQ(x.cl->call(Selector::alloc_uar, uapi::EmptyReq{}, &u2), Status::ok);
    uint64_t page2_len = 0;
    auto* page2 = static_cast<uint8_t*>(x.map(uapi::MapKind::uar, u2.handle, &page2_len));
    ASSERT_NE(page2, nullptr);
    for (uint32_t i = 0; i < 4; i++) {  // four different send doorbells naming a's QP
      uint8_t w[8] = {};
      p::wqe_ctrl_seg::view(w)
          .set(p::wqe_ctrl_seg::opcode, p::wqe_opcode::RDMA_WRITE)
          .set(p::wqe_ctrl_seg::wqe_index, i)
          .set(p::wqe_ctrl_seg::qpn, a.q.qpn)
          .set(p::wqe_ctrl_seg::ds, 3);
      x.doorbell(x.db_offset + (i & 1) * x.bf_bytes, w, i < 2 ? x.uar_page : page2);
    }
    uint8_t arm[8] = {};  // and an arm of a's CQ
    p::set(arm, p::cq_uar_db::cqn, a.cqn);
    x.doorbell(p::kUarCqDoorbell, arm);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // a's CQ was not armed: its next completion raises no event; its QP starts at WQE 0. The scan
    // that finds a's doorbell goes on to x's pages (added after a's), so all five reach the device
    // before a's completion can.
    fill(a.buf, 256, 11);
    uint16_t idx = a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 256, a.lkey,
                               uint64_t(uintptr_t(b.buf)), b.rkey);
    EXPECT_EQ(idx, 0);
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(cqe_field(e, p::cqe64::wqe_counter), 0u);
    EXPECT_EQ(memcmp(b.buf, a.buf, 256), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    uapi::EventResp ev{};
    EXPECT_EQ(a.c.call(Selector::get_event, uapi::EmptyReq{}, &ev), Status::no_event);
    munmap(page2, page2_len);
  }
  stop_daemons();
  // The device's own count, printed by the daemon at stop: the five doorbells, no more.
  std::string log = da.log();
  EXPECT_NE(log.find("; 5 doorbells ignored"), std::string::npos) << log;
}

// Garbage over a client's whole UAR page (doorbells, BlueFlame buffers, the watch block): the
// daemon keeps serving, and another client's traffic on the same daemon is unaffected.
TEST_F(EmudDataPath, GarbageInTheUarPageHurtsNoOtherClient) {
  {
    Endpoint a, b, x;
    pair(a, b, /*same_daemon=*/true);
    x.build(da.sock);
    ASSERT_FALSE(HasFatalFailure());
    uint32_t seed = 12345;
    auto rnd = [&] { return seed = seed * 1103515245u + 12345u; };
    for (int round = 0; round < 200; round++) {
      for (uint32_t off = 0; off < 4096; off += 8) {
        uint64_t v = uint64_t(rnd()) << 32 | rnd();
        __atomic_store_n(reinterpret_cast<uint64_t*>(x.uar_page + off), v, __ATOMIC_RELAXED);
      }
      syscall(SYS_futex, &uapi::uar_watch(x.uar_page)->kick, FUTEX_WAKE, 1, nullptr, nullptr, 0);
      if (round % 20 == 0) {
        fill(a.buf, 2048, uint8_t(round));
        a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 2048, a.lkey, uint64_t(uintptr_t(b.buf)),
                    b.rkey);
        const uint8_t* e = a.poll_cq();
        ASSERT_NE(e, nullptr) << "round " << round;
        ASSERT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ) << "round " << round;
        ASSERT_EQ(memcmp(b.buf, a.buf, 2048), 0) << "round " << round;
      }
    }
    // x's control path still answers, and its CQ has nothing it did not ask for.
    uapi::DeviceAttr attr{};
    EXPECT_EQ(x.c.call(Selector::query_device, uapi::EmptyReq{}, &attr), Status::ok);
    EXPECT_FALSE(x.cqe_ready());
  }
  stop_daemons();
}

}  // namespace
}  // namespace melon::dext
