// A client of melon-emud that drives the data path as an mlx5 provider drives hardware, with
// nothing but a uapi::SocketClient and the mappings: raw WQEs (src/mlx5/prm layouts) into the mapped SQ, the
// doorbell record, the doorbell into the mapped UAR page with the wake-up handshake of
// uapi/doorbell.h, CQEs polled from the mapped ring by the owner bit. Shared by
// uapi_emud_datapath_test and bench_emud; plus a daemon started as a child process.
#pragma once

#include <gtest/gtest.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "uapi/socket/client.h"
#include "mlx5/prm/cqe.h"
#include "mlx5/prm/doorbell.h"
#include "mlx5/prm/wqe.h"
#include "uapi/doorbell.h"

namespace melon::dext::rawclient {

namespace p = mlx5::prm;
using uapi::Selector;
using uapi::Status;

inline constexpr auto kPatience = std::chrono::seconds(10);  // a liveness bound, not a performance one

// ---- the daemons -------------------------------------------------------------------------------

inline std::string slurp(const std::string& path) {
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

  // `netns`: the daemon runs in a network namespace of its own (unshare --net, loopback up), so it
  // can take ::1 or 127.0.0.1 without meeting anyone else's port 4791; needs root.
  bool start(const std::string& addr, const char* spin_us = nullptr, bool netns = false) {
    char t[] = "/tmp/melon-emud-dp-XXXXXX";
    dir = mkdtemp(t);
    sock = dir + "/mlx5_0.sock";
    wire = addr;
    pid = fork();
    if (pid == 0) {
      FILE* f = freopen((dir + "/emud.log").c_str(), "w", stderr);
      (void)f;
      if (netns)
        execl("/usr/bin/unshare", "unshare", "--net", "sh", "-c",
              "ip link set lo up && exec \"$0\" --socket \"$1\" --wire \"$2\"", MELON_EMUD, sock.c_str(), wire.c_str(),
              nullptr);
      else if (spin_us)
        execl(MELON_EMUD, MELON_EMUD, "--socket", sock.c_str(), "--wire", wire.c_str(), "--spin-us", spin_us, nullptr);
      else
        execl(MELON_EMUD, MELON_EMUD, "--socket", sock.c_str(), "--wire", wire.c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
      uapi::SocketClient c;
      if (c.connect(sock.c_str())) return true;
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

inline uint32_t log2u(uint32_t v) {
  uint32_t l = 0;
  while ((1u << l) < v) l++;
  return l;
}

struct Endpoint {
  uapi::SocketClient c;
  uapi::SocketClient* cl = &c;  // the connection its calls go through: its own, or the one it shares
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
  uint8_t path_mtu = 3;  // ibv_mtu: IBV_MTU_1024

  bool owns_uar = true;

  ~Endpoint() {
    if (uar_page && owns_uar) munmap(uar_page, 4096);
    if (cq_ring) munmap(cq_ring, cq_ring_len);
    if (cq_dbr_map) munmap(cq_dbr_map, cq_dbr_len);
    if (qp_buf) munmap(qp_buf, qp_buf_len);
    if (qp_dbr_map) munmap(qp_dbr_map, qp_dbr_len);
    free(buf);
  }

  void* map(uapi::MapKind kind, uint32_t handle, uint64_t* len) {
    Status st;
    void* m = cl->map(kind, handle, len, &st);
    EXPECT_EQ(st, Status::ok) << uapi::status_name(st);
    return m;
  }

  // A client of its own: PD, UAR, then the queues and MR (build_queues); all mapped.
  void build(const std::string& sock, size_t len = 64 * 1024) {
    ASSERT_TRUE(cl->connect(sock.c_str())) << strerror(errno);
    ASSERT_EQ(cl->open(&open), Status::ok);
    uapi::HandleResp h{};
    ASSERT_EQ(cl->call(Selector::alloc_pd, uapi::EmptyReq{}, &h), Status::ok);
    pd = h.handle;
    uapi::UarResp u{};
    ASSERT_EQ(cl->call(Selector::alloc_uar, uapi::EmptyReq{}, &u), Status::ok);
    uar = u.handle, db_offset = u.db_offset, bf_bytes = u.bf_bytes;
    uapi::MapResp mr_{};
    ASSERT_EQ(cl->call(Selector::map, uapi::MapReq{uint32_t(uapi::MapKind::uar), uar}, &mr_), Status::ok);
    map_flags = mr_.flags;
    uint64_t l = 0;
    uar_page = static_cast<uint8_t*>(map(uapi::MapKind::uar, uar, &l));
    ASSERT_NE(uar_page, nullptr);
    ASSERT_EQ(l, 4096u);
    build_queues(len);
  }

  // Another CQ and QP of `owner`'s client, on its PD and its UAR page (as a provider's QPs share
  // one UAR page per context).
  void build_shared(Endpoint& owner, size_t len = 64 * 1024) {
    cl = owner.cl;
    pd = owner.pd, uar = owner.uar, uar_page = owner.uar_page, owns_uar = false;
    db_offset = owner.db_offset, bf_bytes = owner.bf_bytes, map_flags = owner.map_flags;
    build_queues(len);
  }

  // CQ, RC QP (own RQ), MR over a buffer of `len` bytes; all mapped.
  void build_queues(size_t len) {
    uapi::CreateCqResp cr{};
    ASSERT_EQ(cl->call(Selector::create_cq, uapi::CreateCqReq{63, 0, uar, 0}, &cr), Status::ok);
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
    ASSERT_EQ(cl->call(Selector::create_qp, qr, &q), Status::ok);
    qp = q.handle;
    qp_buf = static_cast<uint8_t*>(map(uapi::MapKind::sq, qp, &qp_buf_len));
    qp_dbr_map = static_cast<uint8_t*>(map(uapi::MapKind::db_record, qp, &qp_dbr_len));
    ASSERT_TRUE(qp_buf && qp_dbr_map);
    qp_dbr = qp_dbr_map + q.dbr_offset;
    buf_len = len;
    buf = static_cast<uint8_t*>(aligned_alloc(4096, len));
    memset(buf, 0, len);
    uapi::RegMrResp m{};
    uint32_t access =
        uapi::kAccessLocalWrite | uapi::kAccessRemoteWrite | uapi::kAccessRemoteRead | uapi::kAccessRemoteAtomic;
    ASSERT_EQ(cl->call(Selector::reg_mr, uapi::RegMrReq{pd, access, uint64_t(uintptr_t(buf)), len}, &m), Status::ok);
    mr = m.handle, lkey = m.lkey, rkey = m.rkey;
    uapi::GidResp g{};
    ASSERT_EQ(cl->call(Selector::query_gid, uapi::GidReq{1, 0}, &g), Status::ok);
    memcpy(gid, g.gid, 16);
    uapi::PortAttr pa{};
    ASSERT_EQ(cl->call(Selector::query_port, uapi::PortReq{1, 0}, &pa), Status::ok);
    memcpy(mac, pa.mac, 6);
  }

  Status modify(uint32_t mask, uapi::ModifyQpReq m) {
    m.handle = qp;
    m.attr_mask = mask;
    uapi::EmptyResp e;
    return cl->call(Selector::modify_qp, m, &e);
  }

  // RESET -> INIT -> RTR -> RTS towards `peer` (IBA 10.3.1's required attributes).
  void connect(const Endpoint& peer) {
    uapi::ModifyQpReq m{};
    m.qp_state = uapi::kStateInit, m.port = 1, m.pkey_index = 0;
    m.access = uapi::kAccessRemoteWrite | uapi::kAccessRemoteRead | uapi::kAccessRemoteAtomic;
    ASSERT_EQ(modify(uapi::kQpState | uapi::kQpPkeyIndex | uapi::kQpPort | uapi::kQpAccessFlags, m), Status::ok);
    m = {};
    m.qp_state = uapi::kStateRtr, m.path_mtu = path_mtu, m.dest_qpn = peer.q.qpn, m.rq_psn = 0x100;
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

  // The MMIO store: 8 bytes in memory order, one aligned 64-bit store, then (unless a test holds
  // it back) the wake-up handshake. On the endpoint's UAR page, or on `page` (another the client mapped).
  bool hold_kicks = false;
  void doorbell(uint32_t off, const uint8_t bytes[8], uint8_t* page = nullptr) {
    if (!page) page = uar_page;
    uint64_t v;
    memcpy(&v, bytes, 8);
    __atomic_store_n(reinterpret_cast<uint64_t*>(page + off), v, __ATOMIC_RELEASE);
    uapi::UarWatch* w = uapi::uar_watch(page);
    if (!hold_kicks && uapi::uar_watch_sleeping(w)) kick(page);
  }
  void kick(uint8_t* page = nullptr) {
    uapi::UarWatch* w = uapi::uar_watch(page ? page : uar_page);
    uapi::uar_watch_kick(w);
    syscall(SYS_futex, &w->kick, FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }
  // Waits until the page's watcher says it sleeps.
  bool wait_watcher_asleep() {
    uapi::UarWatch* w = uapi::uar_watch(uar_page);
    for (auto until = std::chrono::steady_clock::now() + kPatience; !__atomic_load_n(&w->sleeping, __ATOMIC_ACQUIRE);) {
      if (std::chrono::steady_clock::now() > until) return false;
      usleep(1000);
    }
    return true;
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
  // The record's arm word is stored whole (it replaces uapi::kCqArmNone), as rdma-core does.
  void arm_cq() {
    uint8_t db[8] = {};
    p::set(db, p::cq_uar_db::sn, arm_sn & 3);
    p::set(db, p::cq_uar_db::cmd, p::kCqArmNext);
    p::set(db, p::cq_uar_db::ci, cq_ci & 0xffffff);
    p::set(db, p::cq_uar_db::cqn, cqn);
    uint32_t arm;
    memcpy(&arm, db, 4);
    __atomic_store_n(reinterpret_cast<uint32_t*>(cq_dbr + 4), arm, __ATOMIC_RELEASE);
    doorbell(p::kUarCqDoorbell, db);
  }

  uint8_t qp_state() {
    uapi::QpAttr a{};
    EXPECT_EQ(cl->call(Selector::query_qp, uapi::HandleReq{qp, 0}, &a), Status::ok);
    return a.state;
  }
};

inline uint32_t cqe_field(const uint8_t* e, const p::Field& f) { return uint32_t(p::get(e, f)); }

inline void fill(uint8_t* b, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++) b[i] = uint8_t(seed + i * 7);
}

}  // namespace melon::dext::rawclient
