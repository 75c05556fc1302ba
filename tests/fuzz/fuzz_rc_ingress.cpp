// Fuzzes the transport engine's ingress: arbitrary packets into RC, UC and UD QPs that are live and
// have requests outstanding, so ACK/NAK/READ-response/atomic-ACK matching, the responder's PSN and
// duplicate paths, and the state machine all see hostile input. ASan/UBSan catch memory errors;
// the checks below catch broken invariants.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cstdlib>
#include <vector>

#include "common/host_kit.h"
#include "rc/engine.h"

using namespace melon::rc;

namespace {

constexpr uint64_t kVa = 0x100000;
constexpr uint32_t kRegion = 16384;
constexpr uint32_t kRkey = 0x1234;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The host kit: a local buffer and a remote region (at kVa, rkey kRkey) in PD 0; every packet the
  // engine emits becomes a frame that must parse back (wire.malformed).
  melon::kit::Memory mem;
  melon::kit::Region& local = mem.add(0, kRegion, kLocalWrite);
  mem.add_at(0, kVa, kRegion, 0x77, kRkey, kRemoteWrite | kRemoteRead | kRemoteAtomic);
  melon::kit::FrameWire wire;
  wire.on_frame = [&](std::vector<uint8_t>&& f, const TxPacket& p) {
    if (p.payload_len > 4096) abort();
    wire.recycle(std::move(f));
  };
  melon::kit::ManualClock clock;
  clock.t = 1;
  uint64_t& now = clock.t;
  Engine e(Host{mem, wire, clock});
  melon::kit::Cq scq(4096), rcq(4096);
  uint32_t qpn[3];
  const QpType types[3] = {QpType::rc, QpType::uc, QpType::ud};
  for (int i = 0; i < 3; ++i) {
    QpInit init;
    init.type = types[i];
    init.send_cq = &scq;
    init.recv_cq = &rcq;
    if (e.create_qp(init, &qpn[i])) abort();
    QpAttr a;
    a.qp_state = QpState::init;
    a.qp_access_flags = kRemoteWrite | kRemoteRead | kRemoteAtomic;
    a.qkey = 0x11111111;
    uint32_t m = kAttrState | kAttrPkeyIndex | kAttrPort | (types[i] == QpType::ud ? kAttrQkey : kAttrAccessFlags);
    if (e.modify_qp(qpn[i], a, m)) abort();
    a.qp_state = QpState::rtr;
    a.path_mtu = 1 + (size ? data[0] % 5 : 2);
    a.dest_qp_num = 0x42;
    a.rq_psn = 0xfffff0;
    a.max_dest_rd_atomic = 4;
    a.av.sgid[10] = a.av.sgid[11] = a.av.dgid[10] = a.av.dgid[11] = 0xff;
    m = types[i] == QpType::ud ? kAttrState
                               : kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn |
                                     (types[i] == QpType::rc ? kAttrMaxDestRdAtomic | kAttrMinRnrTimer : 0);
    if (e.modify_qp(qpn[i], a, m)) abort();
    a.qp_state = QpState::rts;
    a.sq_psn = 0xfffff8;
    a.max_rd_atomic = 4;
    a.timeout = 1;
    a.retry_cnt = 2;
    a.rnr_retry = 2;
    m = types[i] == QpType::rc
            ? kAttrState | kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic
            : kAttrState | kAttrSqPsn;
    if (e.modify_qp(qpn[i], a, m)) abort();
    for (int r = 0; r < 4; ++r) {
      Sge s{local.va() + uint64_t(r) * 2048, 2048, local.lkey};
      RecvWr rw;
      rw.wr_id = uint64_t(r);
      rw.sg_list = &s;
      rw.num_sge = 1;
      e.post_recv(qpn[i], rw);
    }
  }
  // Outstanding requests on the RC QP so responses have something to match.
  const WrOpcode ops[] = {WrOpcode::send, WrOpcode::rdma_write, WrOpcode::rdma_read, WrOpcode::atomic_fetch_and_add,
                          WrOpcode::atomic_cmp_and_swp};
  for (int i = 0; i < 5; ++i) {
    Sge s{local.va() + 8192 + uint64_t(i) * 1024, i >= 3 ? 8u : 3000u, local.lkey};
    SendWr w;
    w.wr_id = uint64_t(100 + i);
    w.opcode = ops[i];
    w.send_flags = kSignaled;
    w.sg_list = &s;
    w.num_sge = 1;
    w.remote_addr = kVa;
    w.rkey = kRkey;
    e.post_send(qpn[0], w);
  }

  // Records: [selector][len][bytes...]. Selector picks the QP (its QPN is written into the BTH),
  // whether the clock jumps (firing timers), and whether to keep the fuzzer's own destination QP.
  melon::roce::IpUdp ip;
  ip.src[10] = ip.src[11] = ip.dst[10] = ip.dst[11] = 0xff;
  size_t off = 1;
  std::vector<uint8_t> pkt;
  while (off + 2 <= size) {
    uint8_t sel = data[off];
    size_t len = data[off + 1] * 8u + (sel >> 5);
    off += 2;
    if (len > size - off) len = size - off;
    pkt.assign(data + off, data + off + len);
    off += len;
    if (pkt.size() >= 8 && !(sel & 0x10)) {
      uint32_t q = qpn[(sel & 3) % 3];
      pkt[5] = uint8_t(q >> 16);
      pkt[6] = uint8_t(q >> 8);
      pkt[7] = uint8_t(q);
    }
    if (sel & 4) {
      now += uint64_t(1) << (sel & 0x1f);
      e.tick();
    }
    e.receive(ip, pkt.data(), pkt.size());
  }
  // Drain timers to the end: retries exhaust, everything must end up completed.
  for (int i = 0; i < 64 && e.next_deadline() != UINT64_MAX; ++i) {
    now = e.next_deadline();
    e.tick();
  }
  if (wire.malformed || scq.invalid() || rcq.invalid()) abort();
  return 0;
}
