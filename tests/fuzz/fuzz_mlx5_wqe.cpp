// Fuzzes the emulated ConnectX-4 Lx's send path with WQEs as a client writes them: with the kernel
// bypass (melon-emud), SQ contents and doorbells come straight from an application, so the WQE
// parser is a trust boundary. Two emulated HCAs on the in-memory link, an RC QP each, reset and
// reconnected before every input; the input's bytes become WQE basic blocks in A's SQ, then the
// doorbell record and the doorbell. Every CQE on either side must carry a known opcode, and an error
// CQE a known syndrome; nothing may crash, and the devices must go idle.
//
// Input: byte 0 flags (bit 0: fix each ctrl segment's QPN, bit 1: fix its WQE index, bit 2: bring
// ds into the blocks given), byte 1 the number of WQE basic blocks (1..16), then their bytes (short
// inputs are zero-padded). To reach the deep paths, a big-endian 32-bit word 0xAAAA0001 becomes A's
// memory key and 0xAAAA0002 B's, and a big-endian 64-bit word whose top 16 bits are 0xAAAA (0xBBBB)
// becomes an address inside A's (B's) registered buffer.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlx5/emu/harness.h"
#include "mlx5/emu/wire.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace co = prm::cqe_opcode;

constexpr uint64_t kMem = 64 * 1024;

struct Side {
  Side(MemoryLink& link, uint8_t last) : port(link.add_port()), h(config(last), port) {
    link.attach(port, &h.dev);
    ip[3] = last;
  }
  static DeviceConfig config(uint8_t o) {
    DeviceConfig c;
    c.mac[5] = o;
    return c;
  }
  FramePort* port;
  Harness h;
  uint8_t ip[4] = {10, 0, 0, 0};
  Harness::CqRing cq;
  Harness::QpRing qp;
  TestHost::Buffer mem;
  uint32_t key = 0;
  uint64_t va() const { return reinterpret_cast<uint64_t>(mem.va); }
};

[[noreturn]] void fail(const char* what, unsigned v = 0) {
  fprintf(stderr, "fuzz_mlx5_wqe: %s (0x%x)\n", what, v);
  abort();
}

struct Rig {
  MemoryLink link;
  Side a{link, 1}, b{link, 2};

  Rig() {
    for (Side* s : {&a, &b}) {
      s->h.bring_up();
      if (!s->h.set_gid(0, s->ip).ok() || !s->h.enable_roce().ok()) fail("bring-up");
      s->cq = s->h.create_cq(9);
      if (!s->h.create_qp_raw(s->qp, prm::qpc_st::RC, s->cq, s->cq).ok()) fail("CREATE_QP");
      s->mem = s->h.host.alloc(kMem);
      s->key = s->h.create_mkey(s->mem, kMem);
    }
  }

  void connect(Side& s, const Side& peer) {
    Harness& h = s.h;
    if (!h.transition(op::QP_2RST, s.qp.qpn).ok()) fail("2RST");
    s.qp.sq_pi = s.qp.rq_pi = 0;
    memset(s.qp.dbr.va, 0, 8);
    if (!h.transition(op::RST2INIT_QP, s.qp.qpn, [](prm::qpc::view q) {
            q.at(prm::qpc::primary_address_path).set(prm::ads::vhca_port_num, 1);
            q.set(prm::qpc::rwe, 1).set(prm::qpc::rre, 1).set(prm::qpc::rae, 1);
          }).ok())
      fail("RST2INIT");
    uint8_t dgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, peer.ip[0], peer.ip[1], peer.ip[2], peer.ip[3]};
    uint32_t remote = peer.qp.qpn;
    if (!h.transition(op::INIT2RTR_QP, s.qp.qpn, [&](prm::qpc::view q) {
            q.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES).set(prm::qpc::remote_qpn, remote);
            q.set(prm::qpc::next_rcv_psn, 100).set(prm::qpc::log_rra_max, 3).set(prm::qpc::min_rnr_nak, 1);
            auto p = q.at(prm::qpc::primary_address_path);
            p.set(prm::ads::src_addr_index, 0).set(prm::ads::hop_limit, 64).set_bytes(prm::ads::rgid_rip, dgid);
          }).ok())
      fail("INIT2RTR");
    // Retries bounded so a lost cause ends in a few timer firings, which pump() drives.
    if (!h.transition(op::RTR2RTS_QP, s.qp.qpn, [&](prm::qpc::view q) {
            q.set(prm::qpc::next_send_psn, 100).set(prm::qpc::retry_count, 1).set(prm::qpc::rnr_retry, 1);
            q.set(prm::qpc::log_sra_max, 3).at(prm::qpc::primary_address_path).set(prm::ads::ack_timeout, 1);
          }).ok())
      fail("RTR2RTS");
  }

  // Service both devices until idle, stepping the manual clocks so retransmit and RNR timers fire.
  void pump() {
    for (int round = 0; round < 8; ++round) {
      int i = 0;
      while (i < 10000 && (int(a.h.dev.service()) | int(b.h.dev.service()))) ++i;
      if (i == 10000) fail("the devices never went idle");
      a.h.clock.advance(100'000'000);
      b.h.clock.advance(100'000'000);
    }
  }

  void drain(Side& s) {
    while (const uint8_t* e = s.h.poll_cq(s.cq)) {
      uint8_t opcode = uint8_t(prm::get(e, prm::cqe64::opcode));
      if (!prm::cqe_opcode::name_of(opcode)) fail("unknown CQE opcode", opcode);
      if (opcode == co::REQ_ERR || opcode == co::RESP_ERR) {
        uint8_t synd = uint8_t(prm::get(e, prm::err_cqe::syndrome));
        if (!prm::cqe_syndrome::name_of(synd)) fail("unknown CQE syndrome", synd);
      } else if (opcode != co::REQ && opcode != co::RESP_SEND && opcode != co::RESP_SEND_IMM &&
                 opcode != co::RESP_SEND_INV && opcode != co::RESP_WR_IMM) {
        fail("CQE opcode the send path never writes", opcode);
      }
    }
  }
};

void substitute(uint8_t* w, size_t len, const Rig& r) {
  for (size_t i = 0; i + 4 <= len; i += 4) {
    uint32_t v = uint32_t(prm::get_bits(w + i, 0, 32));
    if (v == 0xAAAA0001u) prm::set_bits(w + i, 0, 32, r.a.key);
    if (v == 0xAAAA0002u) prm::set_bits(w + i, 0, 32, r.b.key);
  }
  for (size_t i = 0; i + 8 <= len; i += 8) {
    uint64_t v = prm::get_bits(w + i, 0, 64);
    if (v >> 48 == 0xAAAA) prm::set_bits(w + i, 0, 64, r.a.va() + (v & 0xffff) % kMem);
    if (v >> 48 == 0xBBBB) prm::set_bits(w + i, 0, 64, r.b.va() + (v & 0xffff) % kMem);
  }
}

}  // namespace
}  // namespace melon::mlx5::emu::testing

using namespace melon::mlx5::emu::testing;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Rig* rig = new Rig;
  Rig& r = *rig;
  if (size < 2) return 0;
  uint8_t flags = data[0];
  uint32_t nbb = 1 + data[1] % 16;
  data += 2, size -= 2;
  std::vector<uint8_t> w(64 * nbb, 0);
  memcpy(w.data(), data, size < w.size() ? size : w.size());
  substitute(w.data(), w.size(), r);

  r.connect(r.a, r.b);
  r.connect(r.b, r.a);
  for (int i = 0; i < 4; ++i) r.b.h.post_recv(r.b.qp, {{r.b.va() + 4096u * i, 4096, r.b.key}});
  Harness::QpRing& q = r.a.qp;
  // The blocks as the client wrote them; the ctrl segments are where the device will look for them
  // if the fixes are on (each WQE's size comes from its own ds).
  for (uint32_t bb = 0; bb < nbb;) {
    uint8_t* c = w.data() + 64 * bb;
    if (flags & 1) prm::set(c, prm::wqe_ctrl_seg::qpn, q.qpn);
    if (flags & 2) prm::set(c, prm::wqe_ctrl_seg::wqe_index, bb);
    uint32_t ds = uint32_t(prm::get(c, prm::wqe_ctrl_seg::ds));
    uint32_t room = (nbb - bb) * 4;  // 16-byte units left in the blocks given
    if ((flags & 4) && (ds == 0 || ds > room)) {
      ds = 1 + ds % room;
      prm::set(c, prm::wqe_ctrl_seg::ds, ds);
    }
    bb += ds ? (ds * 16 + 63) / 64 : 1;
  }
  for (uint32_t bb = 0; bb < nbb; ++bb) memcpy(q.sq(bb), w.data() + 64 * bb, 64);
  q.sq_pi = nbb;
  prm::set(q.dbr.va, prm::qp_dbrec::snd_counter, nbb);
  r.a.h.uar_write64(r.a.h.uar, prm::kUarBlueFlame, w.data());
  r.pump();
  r.drain(r.a);
  r.drain(r.b);
  return 0;
}
