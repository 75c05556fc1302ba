// melon-emud's kernel-bypass data path, driven as an mlx5 provider drives hardware: the test holds
// only a UapiClient and the mappings. It writes raw WQEs (src/mlx5/prm layouts) into the mapped SQ,
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

#include <atomic>
#include <chrono>
#include <new>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dext/emuhost/uapi_client.h"
#include "mlx5/prm/cqe.h"
#include "mlx5/prm/doorbell.h"
#include "mlx5/prm/wqe.h"
#include "uapi/doorbell.h"

namespace melon::dext {
namespace {

namespace p = mlx5::prm;
using uapi::Selector;
using uapi::Status;

// This test's loopback addresses (ctest runs tests in parallel; each test owns its addresses).
const char* const kWireA = "127.0.8.3";
const char* const kWireB = "127.0.8.4";

constexpr auto kPatience = std::chrono::seconds(10);  // a liveness bound, not a performance one

// ---- the daemons -------------------------------------------------------------------------------

std::string slurp(const std::string& path) {
  FILE* f = fopen(path.c_str(), "r");
  if (!f) return "";
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  fclose(f);
  return s;
}

struct Daemon {
  std::string dir, sock, wire;
  pid_t pid = -1;

  bool start(const std::string& addr) {
    char t[] = "/tmp/melon-emud-dp-XXXXXX";
    dir = mkdtemp(t);
    sock = dir + "/mlx5_0.sock";
    wire = addr;
    pid = fork();
    if (pid == 0) {
      FILE* f = freopen((dir + "/emud.log").c_str(), "w", stderr);
      (void)f;
      execl(MELON_EMUD, MELON_EMUD, "--socket", sock.c_str(), "--wire", wire.c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
      UapiClient c;
      if (c.connect(sock)) return true;
      usleep(10000);
    }
    return false;
  }
  // SIGTERM; the exit status is 0 only if every client's objects were released and the device
  // tore down with nothing leaked (emud.cpp).
  int stop() {
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 2000; i++) {
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
    return -1;
  }
  std::string log() const { return slurp(dir + "/emud.log"); }
  ~Daemon() {
    if (pid > 0) stop();
    if (!dir.empty()) (void)!system(("rm -rf " + dir).c_str());
  }
};

// ---- one client with an RC QP, as a provider holds it ------------------------------------------

uint32_t log2u(uint32_t v) {
  uint32_t l = 0;
  while ((1u << l) < v) l++;
  return l;
}

struct Endpoint {
  UapiClient c;
  uapi::OpenResp open{};
  uint32_t pd = 0, uar = 0, cq = 0, qp = 0, mr = 0;
  // UAR page
  uint8_t* uar_page = nullptr;
  uint32_t db_offset = 0, bf_bytes = 0, bf_flip = 0, map_flags = 0;
  // CQ
  uint8_t* cq_ring = nullptr;
  uint8_t* cq_dbr_map = nullptr;
  uint8_t* cq_dbr = nullptr;
  uint32_t cqn = 0, log_cq = 0, cq_ci = 0, arm_sn = 0;
  uint64_t cq_ring_len = 0, cq_dbr_len = 0;
  // QP
  uint8_t* qp_buf = nullptr;
  uint8_t* qp_dbr_map = nullptr;
  uint8_t* qp_dbr = nullptr;
  uapi::CreateQpResp q{};
  uint64_t qp_buf_len = 0, qp_dbr_len = 0;
  uint32_t sq_pi = 0, rq_pi = 0;
  // memory region: the client's own (page-aligned) buffer
  uint8_t* buf = nullptr;
  size_t buf_len = 0;
  uint32_t lkey = 0, rkey = 0;
  uint8_t gid[16] = {};
  uint8_t mac[6] = {};

  ~Endpoint() {
    if (uar_page) munmap(uar_page, 4096);
    if (cq_ring) munmap(cq_ring, cq_ring_len);
    if (cq_dbr_map) munmap(cq_dbr_map, cq_dbr_len);
    if (qp_buf) munmap(qp_buf, qp_buf_len);
    if (qp_dbr_map) munmap(qp_dbr_map, qp_dbr_len);
    free(buf);
  }

  void* map(uapi::MapKind kind, uint32_t handle, uint64_t* len) {
    Status st;
    void* m = c.map(kind, handle, len, &st);
    EXPECT_EQ(st, Status::ok) << uapi::status_name(st);
    return m;
  }

  // PD, UAR, CQ, RC QP (own RQ), MR over a buffer of `len` bytes; all mapped.
  void build(const std::string& sock, size_t len = 64 * 1024) {
    ASSERT_TRUE(c.connect(sock)) << strerror(errno);
    ASSERT_EQ(c.open(&open), Status::ok);
    uapi::HandleResp h{};
    ASSERT_EQ(c.call(Selector::alloc_pd, uapi::EmptyReq{}, &h), Status::ok);
    pd = h.handle;
    uapi::UarResp u{};
    ASSERT_EQ(c.call(Selector::alloc_uar, uapi::EmptyReq{}, &u), Status::ok);
    uar = u.handle, db_offset = u.db_offset, bf_bytes = u.bf_bytes;
    uapi::MapResp mr_{};
    ASSERT_EQ(c.call(Selector::map, uapi::MapReq{uint32_t(uapi::MapKind::uar), uar}, &mr_), Status::ok);
    map_flags = mr_.flags;
    uint64_t l = 0;
    uar_page = static_cast<uint8_t*>(map(uapi::MapKind::uar, uar, &l));
    ASSERT_NE(uar_page, nullptr);
    ASSERT_EQ(l, 4096u);
    uapi::CreateCqResp cr{};
    ASSERT_EQ(c.call(Selector::create_cq, uapi::CreateCqReq{63, 0, uar, 0}, &cr), Status::ok);
    cq = cr.handle, cqn = cr.cqn, log_cq = log2u(cr.cqe);
    ASSERT_EQ(cr.cqe_bytes, p::kCqeBytes);
    cq_ring = static_cast<uint8_t*>(map(uapi::MapKind::cqe, cq, &cq_ring_len));
    cq_dbr_map = static_cast<uint8_t*>(map(uapi::MapKind::db_record, cq, &cq_dbr_len));
    ASSERT_TRUE(cq_ring && cq_dbr_map);
    ASSERT_GE(cq_ring_len, uint64_t(cr.cqe) * p::kCqeBytes);
    cq_dbr = cq_dbr_map + cr.dbr_offset;
    uapi::CreateQpReq qr{};
    qr.pd = pd, qr.send_cq = qr.recv_cq = cq, qr.uar = uar, qr.qp_type = uapi::kQpRc;
    qr.max_send_wr = qr.max_recv_wr = 16;
    qr.max_send_sge = qr.max_recv_sge = 1;
    ASSERT_EQ(c.call(Selector::create_qp, qr, &q), Status::ok);
    qp = q.handle;
    qp_buf = static_cast<uint8_t*>(map(uapi::MapKind::sq, qp, &qp_buf_len));
    qp_dbr_map = static_cast<uint8_t*>(map(uapi::MapKind::db_record, qp, &qp_dbr_len));
    ASSERT_TRUE(qp_buf && qp_dbr_map);
    qp_dbr = qp_dbr_map + q.dbr_offset;
    buf_len = len;
    buf = static_cast<uint8_t*>(aligned_alloc(4096, len));
    memset(buf, 0, len);
    uapi::RegMrResp m{};
    uint32_t access = uapi::kAccessLocalWrite | uapi::kAccessRemoteWrite | uapi::kAccessRemoteRead;
    ASSERT_EQ(c.call(Selector::reg_mr, uapi::RegMrReq{pd, access, uint64_t(uintptr_t(buf)), len}, &m), Status::ok);
    mr = m.handle, lkey = m.lkey, rkey = m.rkey;
    uapi::GidResp g{};
    ASSERT_EQ(c.call(Selector::query_gid, uapi::GidReq{1, 0}, &g), Status::ok);
    memcpy(gid, g.gid, 16);
    uapi::PortAttr pa{};
    ASSERT_EQ(c.call(Selector::query_port, uapi::PortReq{1, 0}, &pa), Status::ok);
    memcpy(mac, pa.mac, 6);
  }

  Status modify(uint32_t mask, uapi::ModifyQpReq m) {
    m.handle = qp;
    m.attr_mask = mask;
    uapi::EmptyResp e;
    return c.call(Selector::modify_qp, m, &e);
  }

  // RESET -> INIT -> RTR -> RTS towards `peer` (IBA 10.3.1's required attributes).
  void connect(const Endpoint& peer) {
    uapi::ModifyQpReq m{};
    m.qp_state = uapi::kStateInit, m.port = 1, m.pkey_index = 0;
    m.access = uapi::kAccessRemoteWrite | uapi::kAccessRemoteRead;
    ASSERT_EQ(modify(uapi::kQpState | uapi::kQpPkeyIndex | uapi::kQpPort | uapi::kQpAccessFlags, m), Status::ok);
    m = {};
    m.qp_state = uapi::kStateRtr, m.path_mtu = 3 /* IBV_MTU_1024 */, m.dest_qpn = peer.q.qpn, m.rq_psn = 0x100;
    m.max_dest_rd_atomic = 1, m.min_rnr_timer = 1;
    memcpy(m.av.dgid, peer.gid, 16);
    memcpy(m.av.dmac, peer.mac, 6);
    m.av.hop_limit = 64, m.av.port = 1;
    ASSERT_EQ(modify(uapi::kQpState | uapi::kQpAv | uapi::kQpPathMtu | uapi::kQpDestQpn | uapi::kQpRqPsn |
                         uapi::kQpMaxDestRdAtomic | uapi::kQpMinRnrTimer,
                     m),
              Status::ok);
    m = {};
    m.qp_state = uapi::kStateRts, m.sq_psn = 0x100, m.timeout = 14, m.retry_cnt = 7, m.rnr_retry = 7;
    m.max_rd_atomic = 1;
    ASSERT_EQ(modify(uapi::kQpState | uapi::kQpSqPsn | uapi::kQpTimeout | uapi::kQpRetryCnt | uapi::kQpRnrRetry |
                         uapi::kQpMaxQpRdAtomic,
                     m),
              Status::ok);
  }

  uint8_t* sq_slot(uint32_t i) { return qp_buf + q.sq_offset + 64 * (i % q.sq_wqe_cnt); }
  uint8_t* rq_slot(uint32_t i) { return qp_buf + q.rq_stride * (i % q.rq_wqe_cnt); }

  // The MMIO store: 8 bytes in memory order, one aligned 64-bit store, then the wake-up handshake.
  void doorbell(uint32_t off, const uint8_t bytes[8]) {
    uint64_t v;
    memcpy(&v, bytes, 8);
    __atomic_store_n(reinterpret_cast<uint64_t*>(uar_page + off), v, __ATOMIC_RELEASE);
    uapi::UarWatch* w = uapi::uar_watch(uar_page);
    if (uapi::uar_watch_sleeping(w)) {
      uapi::uar_watch_kick(w);
      syscall(SYS_futex, &w->kick, FUTEX_WAKE, 1, nullptr, nullptr, 0);
    }
  }

  // Writes one WQE (ctrl + optional raddr + one data segment) at the SQ's producer index, the
  // doorbell record, then rings (BlueFlame buffers used alternately, as rdma-core's qp.c does).
  // Returns the WQE's index.
  uint16_t post_send(uint8_t opcode, uint64_t laddr, uint32_t len, uint32_t key, uint64_t raddr = 0,
                     uint32_t rem_key = 0) {
    uint8_t w[64] = {};
    uint32_t ds = 1;
    if (opcode == p::wqe_opcode::RDMA_WRITE || opcode == p::wqe_opcode::RDMA_READ)
      p::wqe_raddr_seg::view(w + 16 * ds++).set(p::wqe_raddr_seg::raddr, raddr).set(p::wqe_raddr_seg::rkey, rem_key);
    p::wqe_data_seg::view(w + 16 * ds++)
        .set(p::wqe_data_seg::byte_count, len)
        .set(p::wqe_data_seg::lkey, key)
        .set(p::wqe_data_seg::addr, laddr);
    p::wqe_ctrl_seg::view(w)
        .set(p::wqe_ctrl_seg::opcode, opcode)
        .set(p::wqe_ctrl_seg::wqe_index, sq_pi & 0xffff)
        .set(p::wqe_ctrl_seg::qpn, q.qpn)
        .set(p::wqe_ctrl_seg::ds, ds)
        .set(p::wqe_ctrl_seg::ce, 2);
    return post_raw(w);
  }
  uint16_t post_raw(const uint8_t w[64]) {
    uint16_t idx = uint16_t(sq_pi);
    memcpy(sq_slot(sq_pi), w, 64);
    sq_pi++;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    p::set(qp_dbr, p::qp_dbrec::snd_counter, sq_pi & 0xffff);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    doorbell(db_offset + bf_flip, w);
    bf_flip ^= bf_bytes;
    return idx;
  }

  uint16_t post_recv(uint64_t laddr, uint32_t len) {
    uint8_t* w = rq_slot(rq_pi);
    memset(w, 0, q.rq_stride);
    p::wqe_data_seg::view(w)
        .set(p::wqe_data_seg::byte_count, len)
        .set(p::wqe_data_seg::lkey, lkey)
        .set(p::wqe_data_seg::addr, laddr);
    if (q.rq_stride >= 32) p::wqe_data_seg::view(w + 16).set(p::wqe_data_seg::lkey, 0x100);  // MLX5_INVALID_LKEY
    uint16_t idx = uint16_t(rq_pi++);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    p::set(qp_dbr, p::qp_dbrec::rcv_counter, rq_pi & 0xffff);
    return idx;
  }

  // The next CQE by the owner bit, waiting for it; nullptr if none came.
  const uint8_t* poll_cq() {
    auto until = std::chrono::steady_clock::now() + kPatience;
    const uint8_t* e = cq_ring + p::kCqeBytes * (cq_ci & ((1u << log_cq) - 1));
    while (!p::cqe_sw_owned(e, cq_ci, log_cq)) {
      if (std::chrono::steady_clock::now() > until) return nullptr;
      usleep(20);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    cq_ci++;
    p::set(cq_dbr, p::cq_dbrec::set_ci, cq_ci & 0xffffff);
    return e;
  }
  bool cqe_ready() const {
    return p::cqe_sw_owned(cq_ring + p::kCqeBytes * (cq_ci & ((1u << log_cq) - 1)), cq_ci, log_cq);
  }

  // Request an event for the next completion: arm word in the record, then the UAR CQ doorbell.
  void arm_cq() {
    p::set(cq_dbr, p::cq_dbrec::arm_sn, arm_sn & 3);
    p::set(cq_dbr, p::cq_dbrec::arm_cmd, p::kCqArmNext);
    p::set(cq_dbr, p::cq_dbrec::arm_ci, cq_ci & 0xffffff);
    uint8_t db[8] = {};
    p::set(db, p::cq_uar_db::sn, arm_sn & 3);
    p::set(db, p::cq_uar_db::cmd, p::kCqArmNext);
    p::set(db, p::cq_uar_db::ci, cq_ci & 0xffffff);
    p::set(db, p::cq_uar_db::cqn, cqn);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    doorbell(p::kUarCqDoorbell, db);
  }

  uint8_t qp_state() {
    uapi::QpAttr a{};
    EXPECT_EQ(c.call(Selector::query_qp, uapi::HandleReq{qp, 0}, &a), Status::ok);
    return a.state;
  }
};

uint32_t cqe_field(const uint8_t* e, const p::Field& f) { return uint32_t(p::get(e, f)); }

void fill(uint8_t* b, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++) b[i] = uint8_t(seed + i * 7);
}

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
  UapiClient c;
  EXPECT_TRUE(c.connect(sock));
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
    for (auto until = std::chrono::steady_clock::now() + kPatience; !__atomic_load_n(&w->sleeping, __ATOMIC_ACQUIRE);) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "the watcher never slept";
      usleep(1000);
    }
    uint32_t kicks = w->kick;
    fill(a.buf, 512, 5);
    a.post_send(p::wqe_opcode::RDMA_WRITE, uint64_t(uintptr_t(a.buf)), 512, a.lkey, uint64_t(uintptr_t(b.buf)), b.rkey);
    EXPECT_EQ(w->kick, kicks + 1);  // the doorbell found the watcher asleep and kicked it
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(memcmp(b.buf, a.buf, 512), 0);
  }
  stop_daemons();
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

// A doorbell naming another client's QP, written to the caller's own UAR page, rings nothing: the
// device takes doorbells only through the UAR the QP was created with.
TEST_F(EmudDataPath, DoorbellThroughAnotherClientsUarRingsNothing) {
  {
    Endpoint a, b, x;
    pair(a, b, /*same_daemon=*/true);
    x.build(da.sock);
    ASSERT_FALSE(HasFatalFailure());
    // a's WQE and doorbell record, but no doorbell on a's UAR.
    fill(a.buf, 256, 11);
    uint8_t w[64] = {};
    p::wqe_raddr_seg::view(w + 16)
        .set(p::wqe_raddr_seg::raddr, uint64_t(uintptr_t(b.buf)))
        .set(p::wqe_raddr_seg::rkey, b.rkey);
    p::wqe_data_seg::view(w + 32)
        .set(p::wqe_data_seg::byte_count, 256)
        .set(p::wqe_data_seg::lkey, a.lkey)
        .set(p::wqe_data_seg::addr, uint64_t(uintptr_t(a.buf)));
    p::wqe_ctrl_seg::view(w)
        .set(p::wqe_ctrl_seg::opcode, p::wqe_opcode::RDMA_WRITE)
        .set(p::wqe_ctrl_seg::wqe_index, 0)
        .set(p::wqe_ctrl_seg::qpn, a.q.qpn)
        .set(p::wqe_ctrl_seg::ds, 3)
        .set(p::wqe_ctrl_seg::ce, 2);
    memcpy(a.sq_slot(0), w, 64);
    a.sq_pi = 1;
    p::set(a.qp_dbr, p::qp_dbrec::snd_counter, 1);
    // x rings a's QPN on x's page, both BlueFlame buffers, a few times.
    for (int i = 0; i < 4; i++) x.doorbell(x.db_offset + (i & 1) * x.bf_bytes, w);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(a.cqe_ready());
    EXPECT_NE(b.buf[0], a.buf[0]);
    // a's own doorbell runs it.
    a.doorbell(a.db_offset, w);
    const uint8_t* e = a.poll_cq();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(cqe_field(e, p::cqe64::opcode), p::cqe_opcode::REQ);
    EXPECT_EQ(memcmp(b.buf, a.buf, 256), 0);
  }
  stop_daemons();
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
