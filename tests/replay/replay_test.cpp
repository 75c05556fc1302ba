// Independent oracle (issue 2, item 4): real Linux rxe traffic replayed into OUR engine.
//
// Responder replay: the requester's request packets of a capture, in capture order and byte for byte
// (ICRC already valid), go into an Engine set up as the capture's responder (same QPN, same PSNs,
// same MTU). Every packet our engine transmits is recorded and compared with what rxe transmitted in
// the capture: opcode, PSN, AETH syndrome, MSN, payload length, and (where the capture fixes it) the
// AtomicAckETH value. Requester replay: our engine posts the capture's WRs and is fed the responses
// the capture's requester received; its re-issues must be rxe's. UC and UD captures go into UC/UD
// QPs: every message must land, with the UD GRH equal to the captured IPv4 header.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/pcap.h"
#include "common/host_kit.h"
#include "rc/engine.h"
#include "roce/aeth.h"
#include "roce/icrc.h"
#include "roce/ip_udp.h"
#include "roce/opcode.h"
#include "roce/packet.h"
#include "roce/psn.h"

using namespace melon::rc;
using namespace melon::roce;
namespace kit = melon::kit;
using melon::test::capture_path;
using melon::test::read_pcap;

namespace {

constexpr uint32_t kServer = 0x0a4d0002;  // 10.77.0.2
constexpr uint32_t kClient = 0x0a4d0003;  // 10.77.0.3

// ---------------------------------------------------------------------------------------------
// Capture loading

struct Frame {
  size_t index = 0;  // tshark frame number
  uint64_t ts_ns = 0;  // pcap timestamp
  IpUdp ip;
  uint32_t src = 0, dst = 0;  // IPv4, host order
  std::vector<uint8_t> ipbytes;  // IP header .. ICRC
  std::vector<uint8_t> roce;  // BTH .. ICRC
  Packet p;  // parsed from `roce` (payload points into it)
  const OpInfo& op() const { return p.info(); }
};

std::vector<Frame> load(const std::string& name) {
  std::vector<Frame> out;
  for (const auto& pk : read_pcap(capture_path(name))) {
    size_t len;
    const uint8_t* ip = melon::test::roce_ip(pk, &len);
    if (!ip) continue;
    Frame f;
    f.index = pk.index;
    f.ts_ns = pk.ts_us * 1000;
    if (parse_ip_udp(ip, len, f.ip) != ParseError::ok) continue;
    size_t roce_len = f.ip.udp_len - kUdpHeaderSize;
    f.ipbytes.assign(ip, ip + f.ip.hdr_len + roce_len);
    f.roce.assign(ip + f.ip.hdr_len, ip + f.ip.hdr_len + roce_len);
    f.src = gid_to_ipv4(f.ip.src);
    f.dst = gid_to_ipv4(f.ip.dst);
    out.push_back(std::move(f));
  }
  for (auto& f : out) EXPECT_EQ(parse_transport(f.roce.data(), f.roce.size(), f.p), ParseError::ok) << f.index;
  EXPECT_FALSE(out.empty()) << name;
  return out;
}

bool is_rc_request(const Frame& f) { return op_transport(f.p.bth.opcode) == Transport::rc && f.op().is(kRequest); }
bool is_rc_response(const Frame& f) {
  return op_transport(f.p.bth.opcode) == Transport::rc && f.op().is(kAck | kReadResp | kAtomicAck);
}

// ---------------------------------------------------------------------------------------------
// Host side for the engine: memory, link, CQ

// The host kit's memory, with a capture's regions at their VAs under their keys (lkey == rkey,
// PD 0, every access).
constexpr uint32_t kAllAccess = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
kit::Region& add_region(kit::Memory& mem, uint32_t key, uint64_t va, uint64_t size) {
  return mem.add_at(0, va, size, key, key, kAllAccess);
}

// What the engine transmitted, reduced to the fields the comparison looks at.
struct Out {
  uint8_t opcode = 0;
  uint32_t psn = 0;
  uint8_t syndrome = 0;
  uint32_t msn = 0;
  uint32_t len = 0;
  uint64_t orig = 0;
  uint32_t dest_qp = 0;
  Reth reth;
  size_t after = 0;  // ours: capture frame number of the packet fed last; rxe: its own frame number
  uint64_t at_ns = 0;  // when it was sent (ours: the `now` of the call that sent it)
  std::vector<uint8_t> hdr;  // BTH + extended headers as they go on the wire
};

Out out_of(const Packet& p, uint32_t payload_len) {
  Out o;
  o.opcode = p.bth.opcode;
  o.psn = p.bth.psn;
  o.dest_qp = p.bth.dest_qp;
  const OpInfo& op = p.info();
  if (op.has(kAeth)) {
    o.syndrome = p.aeth.syndrome;
    o.msn = p.aeth.msn;
  }
  if (op.has(kAtomicAckEth)) o.orig = p.atomic_orig;
  if (op.has(kReth)) o.reth = p.reth;
  o.len = payload_len;
  return o;
}

// The host: the kit's frame wire and a clock the replay sets. Every packet our engine sends is
// recorded from its frame as the one frame writer built it.
class RecLink {
 public:
  RecLink() {
    wire.on_frame = [this](std::vector<uint8_t>&& f, const TxPacket& t) {
      Out o = out_of(t.pkt, t.payload_len);
      o.after = cur_frame;
      o.at_ns = clock.t;
      IpUdp ip;
      const uint8_t* roce;
      size_t len;
      if (read_frame(f.data(), f.size(), ip, &roce, &len) == ParseError::ok)
        o.hdr.assign(roce, roce + transport_header_len(t.pkt.bth.opcode));
      out.push_back(std::move(o));
      wire.recycle(std::move(f));
    };
  }
  Host host(kit::Memory& mem) { return Host{mem, wire, clock}; }
  kit::FrameWire wire;
  kit::ManualClock clock;
  std::vector<Out> out;
  size_t cur_frame = 0;
};

std::string describe(const Out& o) {
  std::ostringstream s;
  s << op_info(o.opcode).name << " psn=" << o.psn << " syn=0x" << std::hex << unsigned(o.syndrome) << std::dec
    << " msn=" << o.msn << " len=" << o.len;
  if (o.opcode == make_opcode(Transport::rc, kAtomicAcknowledge)) s << " orig=0x" << std::hex << o.orig << std::dec;
  if (op_info(o.opcode).has(kReth)) s << " va=0x" << std::hex << o.reth.va << std::dec << " dmalen=" << o.reth.dma_len;
  s << " (frame " << o.after << ")";
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// Responder replay

struct ResponderSetup {
  uint8_t path_mtu = 3;  // ibv_mtu: 3 = 1024, 5 = 4096
  uint8_t max_dest_rd_atomic = 16;
};

struct ResponderRun {
  std::vector<Out> ours;  // what our engine sent
  std::vector<Out> rxe;  // what rxe sent (the capture's responses in this direction)
  std::vector<Wc> recv_wcs;
  std::vector<const Frame*> requests;
  QpCounters counters;
  uint32_t qpn = 0;
  uint64_t dropped = 0;
  size_t atomic_targets = 0;  // distinct atomic VAs (each seeded once from rxe)
  // Per atomic VA: the seeded value and the value after the replay.
  struct AtomicTarget {
    uint64_t va, before, after;
  };
  std::vector<AtomicTarget> atomics;
};

ResponderRun run_responder(const std::vector<Frame>& frames, uint32_t requester_ip, const ResponderSetup& cfg = {}) {
  ResponderRun run;
  std::vector<const Frame*> rsp;
  for (const auto& f : frames) {
    if (f.src == requester_ip && is_rc_request(f)) run.requests.push_back(&f);
    if (f.dst == requester_ip && is_rc_response(f)) rsp.push_back(&f);
  }
  EXPECT_FALSE(run.requests.empty());
  EXPECT_FALSE(rsp.empty());
  if (run.requests.empty() || rsp.empty()) return run;
  const uint32_t my_qpn = run.requests[0]->p.bth.dest_qp;
  const uint32_t peer_qpn = rsp[0]->p.bth.dest_qp;  // RC packets carry no source QP: the other direction's BTH
  for (const Frame* f : rsp)
    run.rxe.push_back(out_of(f->p, f->p.payload_len)),
        run.rxe.back().after = f->index, run.rxe.back().hdr.assign(f->roce.begin(), f->roce.begin() + f->op().hdr_len);

  // Memory: the rkey(s) the requests use, covering every VA they touch; atomics seeded from rxe.
  kit::Memory mem;
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> span;  // rkey -> [lo, hi)
  for (const Frame* f : run.requests) {
    uint64_t va = 0, len = 0;
    uint32_t key = 0;
    if (f->op().has(kReth))
      va = f->p.reth.va, len = f->p.reth.dma_len, key = f->p.reth.rkey;
    else if (f->op().has(kAtomicEth))
      va = f->p.atomic.va, len = 8, key = f->p.atomic.rkey;
    else
      continue;
    auto it = span.find(key);
    if (it == span.end())
      span[key] = {va, va + len};
    else
      it->second = {std::min(it->second.first, va), std::max(it->second.second, va + len)};
  }
  for (auto& [key, r] : span) {
    uint64_t lo = r.first & ~uint64_t(4095);
    add_region(mem, key, lo, r.second - lo + 8);
  }
  // rxe's buffers hold random bytes (perftest fills them), so each atomic target starts at the value
  // rxe's ATOMIC_ACK for the first atomic on that VA reported; every later original value at that VA
  // (AtomicAckETH) then follows from the operations themselves and must be rxe's.
  std::map<uint64_t, bool> seeded;
  for (const Frame* f : run.requests) {
    if (!f->op().has(kAtomicEth) || seeded[f->p.atomic.va]) continue;
    seeded[f->p.atomic.va] = true;
    for (const Frame* r : rsp)
      if (r->op().is(kAtomicAck) && r->p.bth.psn == f->p.bth.psn) {
        uint64_t v = r->p.atomic_orig;
        std::memcpy(mem.at(f->p.atomic.rkey, f->p.atomic.va, 8), &v, 8);
        break;
      }
  }
  run.atomic_targets = seeded.size();
  // Receive buffers: one WQE per message that needs one (SEND, WRITE with immediate), plus spare.
  size_t wqes = 2;
  for (const Frame* f : run.requests)
    if ((f->op().is(kSend) && f->op().is(kStart)) || (f->op().is(kWrite) && f->op().is(kImm) && f->op().is(kEnd)))
      ++wqes;
  constexpr uint32_t kLkey = 0x1000, kBufSize = 32768;
  constexpr uint64_t kBufBase = 0x7f0000000000;
  add_region(mem, kLkey, kBufBase, uint64_t(kBufSize) * wqes);

  RecLink link;
  kit::Cq scq, rcq;
  EngineConfig ec;
  ec.first_qpn = my_qpn;
  Engine eng(link.host(mem), ec);
  QpInit init;
  init.type = QpType::rc;
  init.send_cq = &scq;
  init.recv_cq = &rcq;
  init.cap.max_recv_wr = uint32_t(std::max<size_t>(wqes, 1));
  uint32_t qpn = 0;
  EXPECT_EQ(eng.create_qp(init, &qpn), 0);
  EXPECT_EQ(qpn, my_qpn);
  run.qpn = qpn;

  QpAttr a;
  a.qp_state = QpState::init;
  a.qp_access_flags = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
  EXPECT_EQ(eng.modify_qp(qpn, a, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrAccessFlags), 0);
  a.qp_state = QpState::rtr;
  gid_from_ipv4(a.av.dgid, requester_ip);
  gid_from_ipv4(a.av.sgid, run.requests[0]->dst);
  a.path_mtu = cfg.path_mtu;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = run.requests[0]->p.bth.psn;
  a.max_dest_rd_atomic = cfg.max_dest_rd_atomic;
  a.min_rnr_timer = 12;
  EXPECT_EQ(eng.modify_qp(qpn, a,
                          kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic |
                              kAttrMinRnrTimer),
            0);
  a.qp_state = QpState::rts;
  a.sq_psn = 0;
  a.max_rd_atomic = 16;
  EXPECT_EQ(eng.modify_qp(qpn, a,
                          kAttrState | kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic),
            0);
  std::vector<Sge> sges(wqes);
  for (size_t i = 0; i < wqes; ++i) {
    sges[i] = Sge{kBufBase + i * kBufSize, kBufSize, kLkey};
    RecvWr wr;
    wr.wr_id = i;
    wr.sg_list = &sges[i];
    wr.num_sge = 1;
    EXPECT_EQ(eng.post_recv(qpn, wr), 0);
  }

  for (const Frame* f : run.requests) {
    link.cur_frame = f->index;
    link.clock.t = f->ts_ns;
    eng.receive(f->ip, f->roce.data(), f->roce.size());
  }
  for (auto& [va, unused] : seeded) {
    (void)unused;
    for (const Frame* f : run.requests)
      if (f->op().has(kAtomicEth) && f->p.atomic.va == va) {
        uint64_t v;
        std::memcpy(&v, mem.at(f->p.atomic.rkey, va, 8), 8);
        run.atomics.push_back({va, 0, v});
        break;
      }
  }
  run.ours = std::move(link.out);
  run.recv_wcs = rcq.drain();
  run.counters = *eng.counters(qpn);
  run.dropped = eng.dropped_packets();
  EXPECT_EQ(scq.size(), 0u);
  return run;
}

// Field-by-field comparison of two response sequences; the message names the first difference.
bool same(const Out& a, const Out& b, bool msn) {
  return a.opcode == b.opcode && a.psn == b.psn && a.syndrome == b.syndrome && (!msn || a.msn == b.msn) &&
         a.len == b.len && a.orig == b.orig && a.dest_qp == b.dest_qp;
}

testing::AssertionResult sequences_match(const std::vector<Out>& rxe, const std::vector<Out>& ours, bool msn = true) {
  size_t n = std::min(rxe.size(), ours.size());
  for (size_t i = 0; i < n; ++i)
    if (!same(rxe[i], ours[i], msn))
      return testing::AssertionFailure() << "response #" << i << ": rxe " << describe(rxe[i]) << " vs ours "
                                         << describe(ours[i]);
  if (rxe.size() != ours.size())
    return testing::AssertionFailure() << "rxe sent " << rxe.size() << " responses, ours " << ours.size()
                                       << (rxe.size() > n ? "; next rxe: " + describe(rxe[n]) : "")
                                       << (ours.size() > n ? "; next ours: " + describe(ours[n]) : "");
  return testing::AssertionSuccess();
}

// Ours answers at once; rxe's answer to the same request can only appear later in the capture.
testing::AssertionResult causal(const std::vector<Out>& rxe, const std::vector<Out>& ours) {
  for (size_t i = 0; i < std::min(rxe.size(), ours.size()); ++i)
    if (ours[i].after >= rxe[i].after)
      return testing::AssertionFailure() << "response #" << i << " ours after frame " << ours[i].after
                                         << ", rxe's is frame " << rxe[i].after;
  return testing::AssertionSuccess();
}

// The transport headers we would put on the wire equal rxe's byte for byte (BTH incl. P_Key, flags,
// AckReq and reserved bits; AETH; AtomicAckETH) for every response.
testing::AssertionResult headers_match(const std::vector<Out>& rxe, const std::vector<Out>& ours) {
  for (size_t i = 0; i < std::min(rxe.size(), ours.size()); ++i)
    if (rxe[i].hdr != ours[i].hdr) {
      std::ostringstream s;
      for (size_t k = 0; k < rxe[i].hdr.size() || k < ours[i].hdr.size(); ++k) {
        int x = k < rxe[i].hdr.size() ? rxe[i].hdr[k] : -1, y = k < ours[i].hdr.size() ? ours[i].hdr[k] : -1;
        if (x != y) {
          s << "byte " << k << ": rxe " << x << " ours " << y;
          break;
        }
      }
      return testing::AssertionFailure() << "response #" << i << " " << describe(rxe[i]) << " header differs, "
                                         << s.str();
    }
  return testing::AssertionSuccess();
}

size_t count(const std::vector<Out>& v, uint8_t opcode, int syndrome = -1) {
  return size_t(std::count_if(v.begin(), v.end(), [&](const Out& o) {
    return o.opcode == opcode && (syndrome < 0 || o.syndrome == syndrome);
  }));
}

constexpr uint8_t kAckOp = 17;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Responder replay tests

namespace {

// Runs one direction and checks the response sequence against rxe's.
ResponderRun check_responder(const std::string& file, uint32_t requester_ip, const ResponderSetup& cfg = {}) {
  auto frames = load(file);
  // `frames` dies here; the run keeps only values (requests pointers are cleared below).
  ResponderRun run = run_responder(frames, requester_ip, cfg);
  EXPECT_TRUE(sequences_match(run.rxe, run.ours)) << file;
  EXPECT_TRUE(headers_match(run.rxe, run.ours)) << file;
  EXPECT_TRUE(causal(run.rxe, run.ours)) << file;
  run.requests.clear();
  return run;
}

void expect_recv(const ResponderRun& run, size_t n, uint32_t byte_len, WcOpcode opc = WcOpcode::recv) {
  ASSERT_EQ(run.recv_wcs.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(run.recv_wcs[i].status, WcStatus::success) << i;
    EXPECT_EQ(run.recv_wcs[i].opcode, opc) << i;
    if (byte_len) EXPECT_EQ(run.recv_wcs[i].byte_len, byte_len) << i;
    EXPECT_EQ(run.recv_wcs[i].wr_id, i) << i;
  }
}

}  // namespace

// ibv_rc_pingpong: each side is requester for one direction, so one responder engine per direction.
// The client's first 4-packet message appears twice (sent before the server's QP was ready, then
// resent); rxe ACKs the accepted copy and then every packet of the duplicate (C9-105) with
// PSN = ePSN-1 and the same MSN: 5 ACKs for frames 10-18.
TEST(ResponderReplay, RcSendPingpongBothDirections) {
  auto c2s = check_responder("rxe-rc-send.pcap", kClient);
  EXPECT_EQ(c2s.rxe.size(), 24u);
  expect_recv(c2s, 20, 4096);
  EXPECT_EQ(c2s.counters.duplicates, 4u);
  auto s2c = check_responder("rxe-rc-send.pcap", kServer);
  EXPECT_EQ(s2c.rxe.size(), 20u);
  expect_recv(s2c, 20, 4096);
}

TEST(ResponderReplay, RcSendOnlyPingpongBothDirections) {
  auto c2s = check_responder("rxe-rc-send-only.pcap", kClient);
  expect_recv(c2s, 20, 61);
  auto s2c = check_responder("rxe-rc-send-only.pcap", kServer);
  expect_recv(s2c, 20, 61);
  EXPECT_EQ(c2s.rxe.size() + s2c.rxe.size(), 40u);
}

TEST(ResponderReplay, RcSendMtu4096PingpongBothDirections) {
  ResponderSetup mtu4k;
  mtu4k.path_mtu = 5;
  auto c2s = check_responder("rxe-rc-send-mtu4096.pcap", kClient, mtu4k);
  expect_recv(c2s, 20, 16384);
  auto s2c = check_responder("rxe-rc-send-mtu4096.pcap", kServer, mtu4k);
  expect_recv(s2c, 20, 16384);
}

TEST(ResponderReplay, RcWrite) {
  auto run = check_responder("rxe-rc-write.pcap", kClient);
  EXPECT_EQ(run.rxe.size(), 20u);
  EXPECT_EQ(count(run.ours, kAckOp, 0x1f), 20u);
  EXPECT_TRUE(run.recv_wcs.empty());
}

TEST(ResponderReplay, RcWriteMtu4096) {
  ResponderSetup mtu4k;
  mtu4k.path_mtu = 5;
  auto run = check_responder("rxe-rc-write-mtu4096.pcap", kClient, mtu4k);
  EXPECT_EQ(run.rxe.size(), 20u);
}

// READ responses: opcode, PSN, AETH (on FIRST/LAST), MSN and payload length per packet. The data
// itself is whatever the server's buffer held, which the capture does not let us reproduce.
TEST(ResponderReplay, RcRead) {
  auto run = check_responder("rxe-rc-read.pcap", kClient);
  EXPECT_EQ(run.rxe.size(), 60u);
  EXPECT_EQ(count(run.ours, make_opcode(Transport::rc, kReadRespLast)), 20u);
}

// Atomics: ib_atomic_bw walks its buffer in 64-byte steps, so each of the 20 atomics hits a fresh
// VA whose (random) content only rxe's ATOMIC_ACK reveals. Each target is seeded with that value; the
// check is then that our AtomicAckETH carries it back (byte order included: headers_match), and that
// the operation was applied: FETCH_ADD leaves orig + 1, CMP_SWAP (compare 0, swap 0) leaves orig.
TEST(ResponderReplay, RcAtomicFetchAdd) {
  auto run = check_responder("rxe-rc-atomic.pcap", kClient);
  ASSERT_EQ(run.rxe.size(), 20u);
  EXPECT_EQ(run.atomic_targets, 20u);
  ASSERT_EQ(run.atomics.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    // VAs ascend with PSN, so the map order is the request order.
    EXPECT_EQ(run.atomics[i].after, run.rxe[i].orig + 1);
  }
}

TEST(ResponderReplay, RcAtomicCmpSwap) {
  auto run = check_responder("rxe-rc-atomic-cmpswap.pcap", kClient);
  ASSERT_EQ(run.rxe.size(), 20u);
  ASSERT_EQ(run.atomics.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    ASSERT_NE(run.rxe[i].orig, 0u);  // random content, so the compare (0) fails and nothing is swapped
    EXPECT_EQ(run.atomics[i].after, run.rxe[i].orig);
  }
}

// WRITE with immediate: each message consumes a receive WQE and completes RECV_RDMA_WITH_IMM with
// imm 0xabcd0000+i. Frames 56/58 carry PSN 0x4a5da0 twice: the duplicate is ACKed again with the
// same MSN (16) and makes no second completion.
TEST(ResponderReplay, RcWriteImm) {
  auto run = check_responder("rxe-rc-write-imm.pcap", kClient);
  EXPECT_EQ(run.rxe.size(), 21u);
  EXPECT_EQ(run.counters.duplicates, 1u);
  ASSERT_EQ(run.recv_wcs.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(run.recv_wcs[i].status, WcStatus::success);
    EXPECT_EQ(run.recv_wcs[i].opcode, WcOpcode::recv_rdma_with_imm);
    EXPECT_EQ(run.recv_wcs[i].wc_flags & kWcWithImm, uint32_t(kWcWithImm));
    EXPECT_EQ(run.recv_wcs[i].imm, 0xabcd0000u + uint32_t(i)) << i;
    EXPECT_EQ(run.recv_wcs[i].byte_len, i % 2 == 0 ? 3001u : 61u) << i;
  }
}

TEST(ResponderReplay, RcSendImm) {
  auto run = check_responder("rxe-rc-send-imm.pcap", kClient);
  EXPECT_EQ(run.rxe.size(), 20u);
  ASSERT_EQ(run.recv_wcs.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(run.recv_wcs[i].status, WcStatus::success);
    EXPECT_EQ(run.recv_wcs[i].opcode, WcOpcode::recv);
    EXPECT_EQ(run.recv_wcs[i].imm, 0xabcd0000u + uint32_t(i)) << i;
    EXPECT_EQ(run.recv_wcs[i].byte_len, i % 2 == 0 ? 3001u : 61u) << i;
  }
}

// The server's view of a lossy, reordering link: rxe NAKs (PSN sequence error, BTH PSN = expected
// PSN) once per gap and stays silent until the expected PSN arrives; ACKs one per message. Ours must
// send the same 261 responses in the same order, each no later (in capture order) than rxe's.
TEST(ResponderReplay, RcWriteLossNakOncePerGap) {
  auto run = check_responder("rxe-rc-write-loss.pcap", kClient);
  EXPECT_EQ(count(run.rxe, kAckOp, 0x60), 61u);
  EXPECT_EQ(count(run.rxe, kAckOp, 0x1f), 200u);
  EXPECT_EQ(count(run.ours, kAckOp, 0x60), 61u);
  EXPECT_EQ(count(run.ours, kAckOp, 0x1f), 200u);
  EXPECT_EQ(run.counters.seq_naks_sent, 61u);
}

// The comparison has teeth: the same WRITE capture replayed with the wrong path MTU (4096) must be
// answered differently (our responder accepts the 1024-byte FIRST/MIDDLE only at MTU 1024, C9-87).
TEST(ResponderReplay, WrongMtuIsDetected) {
  auto frames = load("rxe-rc-write.pcap");
  ResponderSetup wrong;
  wrong.path_mtu = 5;
  ResponderRun run = run_responder(frames, kClient, wrong);
  EXPECT_FALSE(sequences_match(run.rxe, run.ours));
  ASSERT_FALSE(run.ours.empty());
  EXPECT_EQ(run.ours[0].syndrome, syndrome_nak(NakCode::invalid_request));
}

// ---------------------------------------------------------------------------------------------
// Requester replay: our engine posts the capture's WRs and gets the responses the capture's
// requester got, at the capture's times. Timers fire at the engine's own deadlines in between.

namespace {

struct Sent {
  Out o;
  bool from_timer = false;  // sent from tick() (retransmit or RNR timer), not from receive()
};

struct RequesterRun {
  std::vector<Sent> sent;
  std::vector<Wc> wcs;
  QpCounters counters;
  std::vector<const Frame*> responses;
};

RequesterRun run_requester(const std::vector<Frame>& frames, uint32_t requester_ip, uint8_t max_rd_atomic,
                           const std::vector<SendWr>& wrs, kit::Memory& mem) {
  RequesterRun run;
  std::vector<const Frame*> reqs;
  for (const auto& f : frames) {
    if (f.src == requester_ip && is_rc_request(f)) reqs.push_back(&f);
    if (f.dst == requester_ip && is_rc_response(f)) run.responses.push_back(&f);
  }
  EXPECT_FALSE(reqs.empty());
  EXPECT_FALSE(run.responses.empty());
  if (reqs.empty() || run.responses.empty()) return run;

  RecLink link;
  kit::Cq scq, rcq;
  EngineConfig ec;
  ec.first_qpn = run.responses[0]->p.bth.dest_qp;
  Engine eng(link.host(mem), ec);
  QpInit init;
  init.type = QpType::rc;
  init.send_cq = &scq;
  init.recv_cq = &rcq;
  init.cap.max_send_wr = uint32_t(wrs.size());
  init.sq_sig_all = true;
  uint32_t qpn = 0;
  EXPECT_EQ(eng.create_qp(init, &qpn), 0);
  EXPECT_EQ(qpn, ec.first_qpn);
  QpAttr a;
  a.qp_state = QpState::init;
  a.qp_access_flags = kLocalWrite;
  EXPECT_EQ(eng.modify_qp(qpn, a, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrAccessFlags), 0);
  a.qp_state = QpState::rtr;
  gid_from_ipv4(a.av.dgid, reqs[0]->dst);
  gid_from_ipv4(a.av.sgid, requester_ip);
  a.path_mtu = 3;
  a.dest_qp_num = reqs[0]->p.bth.dest_qp;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  EXPECT_EQ(eng.modify_qp(qpn, a,
                          kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic |
                              kAttrMinRnrTimer),
            0);
  a.qp_state = QpState::rts;
  a.sq_psn = reqs[0]->p.bth.psn;
  a.timeout = 14;  // perftest's default, the ~67 ms timer of the captures
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = max_rd_atomic;
  EXPECT_EQ(eng.modify_qp(qpn, a,
                          kAttrState | kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic),
            0);

  const uint64_t t0 = reqs[0]->ts_ns;
  link.clock.t = t0;
  link.cur_frame = reqs[0]->index;
  for (const auto& wr : wrs) EXPECT_EQ(eng.post_send(qpn, wr), 0);
  auto collect = [&](bool timer) {
    for (auto& o : link.out) run.sent.push_back(Sent{std::move(o), timer});
    link.out.clear();
  };
  collect(false);
  auto advance = [&](uint64_t until) {
    for (uint64_t d; (d = eng.next_deadline()) <= until;) {
      link.clock.t = d;
      eng.tick();
      collect(true);
    }
  };
  for (const Frame* f : run.responses) {
    advance(f->ts_ns);
    link.clock.t = f->ts_ns;
    link.cur_frame = f->index;
    eng.receive(f->ip, f->roce.data(), f->roce.size());
    collect(false);
  }
  run.wcs = scq.drain();
  run.counters = *eng.counters(qpn);
  return run;
}

}  // namespace

// ib_send_bw -r 1: the server has one receive WQE, so rxe answers RNR NAK (timer code 12, 0.64 ms),
// and then a PSN-sequence-error NAK for the same PSN for the next pipelined SEND. Our requester fed
// exactly those responses must stop, and resend starting at the RNR-NAKed PSN no earlier than 0.64 ms
// after the RNR NAK (the seq NAK that follows must not make it resend early), and complete all 20.
TEST(RequesterReplay, RcRnrResendsFromNakedPsnAfterRnrTimer) {
  auto frames = load("rxe-rc-rnr.pcap");
  kit::Memory mem;
  add_region(mem, 1, 0x10000, 64 * 20);
  std::vector<Sge> sges(20);
  std::vector<SendWr> wrs(20);
  for (size_t i = 0; i < 20; ++i) {
    sges[i] = Sge{0x10000 + 64 * i, 64, 1};
    wrs[i].wr_id = i;
    wrs[i].opcode = WrOpcode::send;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
  }
  auto run = run_requester(frames, kClient, 1, wrs, mem);
  const uint64_t rnr_ns = rnr_timer_ns(12);
  ASSERT_EQ(rnr_ns, 640000u);
  size_t rnr_naks = 0, seq_naks = 0;
  for (const Frame* f : run.responses) {
    uint8_t syn = f->p.aeth.syndrome;
    if (syndrome_type(syn) == AckType::nak) ++seq_naks;
    if (syndrome_type(syn) != AckType::rnr_nak) continue;
    ++rnr_naks;
    SCOPED_TRACE("RNR NAK frame " + std::to_string(f->index));
    // The first thing we send after this RNR NAK: the NAKed PSN, after the RNR timer, from the timer.
    auto it = std::find_if(run.sent.begin(), run.sent.end(),
                           [&](const Sent& s) { return s.o.at_ns >= f->ts_ns && s.o.after >= f->index; });
    ASSERT_NE(it, run.sent.end());
    EXPECT_EQ(it->o.psn, f->p.bth.psn);
    EXPECT_GE(it->o.at_ns, f->ts_ns + rnr_ns);
    EXPECT_TRUE(it->from_timer);
    EXPECT_EQ(it->o.opcode, make_opcode(Transport::rc, kSendOnly));
    // Go-back-N: that timer tick resends consecutive PSNs from the NAKed one.
    uint32_t want = f->p.bth.psn;
    for (auto k = it; k != run.sent.end() && k->from_timer && k->o.at_ns == it->o.at_ns; ++k) {
      EXPECT_EQ(k->o.psn, want);
      want = psn_add(want, 1);
    }
    EXPECT_GT(psn_diff(want, f->p.bth.psn), 1) << "only one packet resent";
  }
  EXPECT_EQ(rnr_naks, 10u);
  EXPECT_EQ(seq_naks, 10u);
  EXPECT_EQ(run.counters.rnr_naks_received, 10u);
  EXPECT_EQ(run.counters.seq_naks_received, 10u);
  ASSERT_EQ(run.wcs.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(run.wcs[i].status, WcStatus::success) << i;
    EXPECT_EQ(run.wcs[i].wr_id, i);
  }
  // No transport-timer (67 ms) retransmission was needed: the capture has no 67 ms silence.
  EXPECT_EQ(run.counters.timeouts, 0u);
}

namespace {

struct ReadIssue {
  uint32_t psn;
  uint64_t va;
  uint32_t len;
  size_t frame;  // capture frame (rxe) / frame being processed (ours)
  bool timer;
  bool operator<(const ReadIssue& o) const { return std::tie(psn, va, len) < std::tie(o.psn, o.va, o.len); }
};

std::string str(const ReadIssue& r, uint32_t p0, uint64_t va0) {
  std::ostringstream s;
  s << "PSN+" << psn_diff(r.psn, p0) << " VA+0x" << std::hex << (r.va - va0) << std::dec << " len " << r.len
    << " (frame " << r.frame << (r.timer ? ", timer" : "") << ")";
  return s.str();
}

}  // namespace

// ib_read_bw -n 200 -s 8192 with READ responses lost/reordered on the way to the client. There is
// no NAK: the requester infers one from a gap in the response PSNs and re-issues the READ at the
// first missing PSN with the RETH VA advanced and the DMA length shortened (e.g. VA +0x1400,
// length 3072), then every later outstanding READ again. Our engine is fed the responses the client
// received, at the capture's times, and its re-issues are compared with rxe's.
//
// Excluded: re-issues that followed a >= 60 ms silence from the responder in the capture (rxe's
// transport timer, timeout 14 = 67 ms: 4 batches, 2 of them starting with a partial re-issue). Their
// timing depends on when the timer was last restarted, which packet order alone does not fix; our
// timer-driven re-issues (sent from tick()) are likewise left out.
//
// "Partial" re-issue = a READ_REQUEST whose VA is not the buffer start (it resumes inside a READ);
// the full-length go-back-N re-issues of the later outstanding READs follow from it.
namespace {

struct ReadLoss {
  uint32_t p0 = 0;
  uint64_t va0 = 0;
  size_t fresh = 0, timer_batches = 0, outstanding_max = 0;
  std::vector<ReadIssue> rxe, ours;  // partial re-issues, timer-driven ones excluded
  RequesterRun run;
  std::vector<std::string> bad_reth;  // READ_REQUESTs of ours whose RETH doesn't fit their PSN
};

const ReadLoss& read_loss() {
  static ReadLoss* cached = nullptr;
  if (cached) return *cached;
  cached = new ReadLoss;
  ReadLoss& r = *cached;
  auto frames = load("rxe-rc-read-loss.pcap");
  const Frame* first = nullptr;
  std::map<uint32_t, bool> issued;
  uint64_t last_srv_ns = 0;
  bool in_timer_batch = false;
  std::map<int32_t, bool> completed;  // READ index -> its LAST response arrived
  for (const auto& f : frames) {
    if (f.src == kServer) {
      last_srv_ns = f.ts_ns;
      in_timer_batch = false;
      if (first && f.p.bth.opcode == make_opcode(Transport::rc, kReadRespLast))
        completed[psn_diff(f.p.bth.psn, first->p.bth.psn) / 8] = true;
      continue;
    }
    if (f.p.bth.opcode != make_opcode(Transport::rc, kReadRequest)) continue;
    if (!first) first = &f;
    const size_t done = completed.size();
    if (f.p.reth.va == first->p.reth.va && f.p.reth.dma_len == 8192 && !issued[f.p.bth.psn]) {
      issued[f.p.bth.psn] = true;
      // max_rd_atomic: the most READs the capture's requester had outstanding at once (17).
      r.outstanding_max = std::max(r.outstanding_max, issued.size() - done);
      continue;
    }
    bool timer = f.ts_ns - last_srv_ns >= 60000000;
    if (timer && !in_timer_batch) ++r.timer_batches;
    in_timer_batch = timer;
    if (f.p.reth.va != first->p.reth.va && !timer)
      r.rxe.push_back({f.p.bth.psn, f.p.reth.va, f.p.reth.dma_len, f.index, timer});
  }
  r.fresh = issued.size();
  if (!first) return r;
  r.p0 = first->p.bth.psn;
  r.va0 = first->p.reth.va;

  static kit::Memory mem;
  add_region(mem, 1, 0x20000, 8192);
  static Sge sge{0x20000, 8192, 1};
  std::vector<SendWr> wrs(200);
  for (size_t i = 0; i < 200; ++i) {
    wrs[i].wr_id = i;
    wrs[i].opcode = WrOpcode::rdma_read;
    wrs[i].sg_list = &sge;
    wrs[i].num_sge = 1;
    wrs[i].remote_addr = r.va0;
    wrs[i].rkey = first->p.reth.rkey;
  }
  r.run = run_requester(frames, kClient, uint8_t(r.outstanding_max), wrs, mem);
  r.run.responses.clear();  // they point into `frames`
  for (const auto& s : r.run.sent) {
    uint32_t k = uint32_t(psn_diff(s.o.psn, r.p0));
    if (s.o.opcode != make_opcode(Transport::rc, kReadRequest) || s.o.reth.va - r.va0 != uint64_t(k % 8) * 1024 ||
        s.o.reth.dma_len != 8192 - (k % 8) * 1024)
      r.bad_reth.push_back(describe(s.o));
    if (s.o.reth.va != r.va0 && !s.from_timer)
      r.ours.push_back({s.o.psn, s.o.reth.va, s.o.reth.dma_len, s.o.after, s.from_timer});
  }
  return r;
}

bool same_issue(const ReadIssue& a, const ReadIssue& b) { return a.psn == b.psn && a.va == b.va && a.len == b.len; }

// Consecutive repeats of the same re-issue collapsed.
std::vector<ReadIssue> collapse(const std::vector<ReadIssue>& v) {
  std::vector<ReadIssue> out;
  for (const auto& x : v)
    if (out.empty() || !same_issue(out.back(), x)) out.push_back(x);
  return out;
}

}  // namespace

// What holds today: the capture's shape, all 200 READs complete in order, every READ_REQUEST we send
// resumes exactly at a response PSN (VA + 1024*k, length 8192 - 1024*k), and every partial re-issue
// we make from a response gap is one rxe made too, in the same order.
TEST(RequesterReplay, RcReadLossReissuesAreRxes) {
  const ReadLoss& r = read_loss();
  EXPECT_EQ(r.fresh, 200u);
  EXPECT_EQ(r.timer_batches, 4u);
  EXPECT_EQ(r.outstanding_max, 17u);
  EXPECT_EQ(r.rxe.size(), 40u);
  EXPECT_TRUE(r.bad_reth.empty()) << r.bad_reth.front();
  ASSERT_EQ(r.run.wcs.size(), 200u);
  for (size_t i = 0; i < 200; ++i) {
    EXPECT_EQ(r.run.wcs[i].status, WcStatus::success) << i;
    EXPECT_EQ(r.run.wcs[i].wr_id, i);
    EXPECT_EQ(r.run.wcs[i].opcode, WcOpcode::rdma_read);
    EXPECT_EQ(r.run.wcs[i].byte_len, 8192u);
  }
  // Ours (repeats collapsed, see the engine-bug test below) is a subsequence of rxe's.
  auto ours = collapse(r.ours);
  ASSERT_FALSE(ours.empty());
  size_t j = 0;
  for (const auto& x : ours) {
    while (j < r.rxe.size() && !same_issue(r.rxe[j], x)) ++j;
    ASSERT_LT(j, r.rxe.size()) << "re-issue rxe never made (or out of order): " << str(x, r.p0, r.va0);
    ++j;
  }
}

// Regression (was an engine bug in completer.cpp, fixed): on a READ response gap rxe starts ONE retry per gap: check_psn() ignores a
// response beyond comp.psn inside the outstanding READ (COMPST_DONE), and once a retry has started
// (comp.started_retry) further out-of-sequence responses start no other until an in-sequence response
// resets it (reset_retry_counters). Our completer used to call rewind()+requester_progress() for EVERY
// response packet whose PSN is past read_next_psn, so one lost packet followed by N later packets of
// the same READ re-issues the READ (and go-back-N's every later outstanding READ) N times.
TEST(RequesterReplay, RcReadLossOneReissuePerGap) {
  const ReadLoss& r = read_loss();
  auto ours = collapse(r.ours);
  EXPECT_EQ(r.ours.size(), ours.size()) << "one re-issue per gap; rxe: " << r.rxe.size();
  for (size_t i = 1; i < r.ours.size(); ++i)
    EXPECT_FALSE(same_issue(r.ours[i - 1], r.ours[i])) << "repeated: " << str(r.ours[i], r.p0, r.va0);
}

// Regression (was an engine bug in completer.cpp, fixed; on_response: `if (psn_diff(psn, w.last_psn) > 0) break;` for READ
// responses): when the LAST response of the oldest outstanding READ is lost, the gap shows only as a
// response for the NEXT READ. rxe's check_psn() returns COMPST_ERROR_RETRY for a response past the
// oldest pending READ's last_psn (IBA 9.7.5.1.6 implied NAK / C9-?: out-of-sequence READ response)
// and re-issues at comp.psn: VA +0x1c00, length 1024 (7 times in this capture). Ours used to ignore such
// responses and only recovers when rxe's own re-issue happens to bring the LAST again (or after the
// 67 ms transport timer in a real run).
TEST(RequesterReplay, RcReadLossLostLastResponseIsAGap) {
  const ReadLoss& r = read_loss();
  auto ours = collapse(r.ours);
  std::vector<std::string> missing;
  for (const auto& x : r.rxe)
    if (std::none_of(ours.begin(), ours.end(), [&](const ReadIssue& y) { return same_issue(x, y); }))
      missing.push_back(str(x, r.p0, r.va0));
  EXPECT_TRUE(missing.empty()) << missing.size() << " missing, first: " << missing.front();
  // With both bugs fixed, the partial re-issues are rxe's, in order, one per gap.
  ASSERT_EQ(r.ours.size(), r.rxe.size());
  for (size_t i = 0; i < r.rxe.size(); ++i)
    EXPECT_TRUE(same_issue(r.rxe[i], r.ours[i]))
        << i << ": rxe " << str(r.rxe[i], r.p0, r.va0) << ", ours " << str(r.ours[i], r.p0, r.va0);
}

// ---------------------------------------------------------------------------------------------
// UC and UD: no responses exist, so the oracle is what lands in the receive buffers.

namespace {

struct UnreliableRun {
  std::vector<Out> tx;
  std::vector<Wc> wcs;
  std::vector<const Frame*> msgs;  // the frame that ends each message (UD: each datagram)
  std::vector<std::vector<uint8_t>> bufs;  // receive buffer contents, by wr_id
  QpCounters counters;
  uint64_t dropped = 0;
};

UnreliableRun run_unreliable(const std::vector<Frame>& frames, uint32_t sender_ip, QpType type) {
  UnreliableRun run;
  const Transport tr = type == QpType::uc ? Transport::uc : Transport::ud;
  std::vector<const Frame*> in;
  uint32_t peer_qpn = 0;
  for (const auto& f : frames) {
    if (op_transport(f.p.bth.opcode) != tr) continue;
    if (f.src == sender_ip) {
      in.push_back(&f);
      if (f.op().is(kEnd)) run.msgs.push_back(&f);
    } else if (!peer_qpn) {
      peer_qpn = f.p.bth.dest_qp;
    }
  }
  EXPECT_FALSE(in.empty());
  if (in.empty()) return run;
  const uint32_t my_qpn = in[0]->p.bth.dest_qp;
  const size_t wqes = run.msgs.size() + 2;
  constexpr uint32_t kLkey = 7, kBuf = 8192;
  constexpr uint64_t kBase = 0x500000;
  kit::Memory mem;
  auto& region = add_region(mem, kLkey, kBase, uint64_t(kBuf) * wqes);
  std::memset(region.data(), 0xa5, region.size());  // so the zero half of the GRH is really written

  RecLink link;
  kit::Cq scq, rcq;
  EngineConfig ec;
  ec.first_qpn = my_qpn;
  Engine eng(link.host(mem), ec);
  QpInit init;
  init.type = type;
  init.send_cq = &scq;
  init.recv_cq = &rcq;
  init.cap.max_recv_wr = uint32_t(wqes);
  uint32_t qpn = 0;
  EXPECT_EQ(eng.create_qp(init, &qpn), 0);
  EXPECT_EQ(qpn, my_qpn);
  QpAttr a;
  a.qp_state = QpState::init;
  a.qp_access_flags = kLocalWrite | kRemoteWrite;
  a.qkey = 0x11111111;
  EXPECT_EQ(eng.modify_qp(
                qpn, a, kAttrState | kAttrPkeyIndex | kAttrPort | (type == QpType::ud ? kAttrQkey : kAttrAccessFlags)),
            0);
  a.qp_state = QpState::rtr;
  gid_from_ipv4(a.av.dgid, sender_ip);
  gid_from_ipv4(a.av.sgid, in[0]->dst);
  a.path_mtu = 3;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = in[0]->p.bth.psn;
  uint32_t rtr_mask = type == QpType::ud ? kAttrState : kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn;
  EXPECT_EQ(eng.modify_qp(qpn, a, rtr_mask), 0);
  a.qp_state = QpState::rts;
  a.sq_psn = 0;
  EXPECT_EQ(eng.modify_qp(qpn, a, kAttrState | kAttrSqPsn), 0);
  std::vector<Sge> sges(wqes);
  for (size_t i = 0; i < wqes; ++i) {
    sges[i] = Sge{kBase + i * kBuf, kBuf, kLkey};
    RecvWr wr;
    wr.wr_id = i;
    wr.sg_list = &sges[i];
    wr.num_sge = 1;
    EXPECT_EQ(eng.post_recv(qpn, wr), 0);
  }
  for (const Frame* f : in) {
    link.clock.t = f->ts_ns;
    eng.receive(f->ip, f->roce.data(), f->roce.size());
  }
  run.tx = std::move(link.out);
  run.wcs = rcq.drain();
  for (size_t i = 0; i < wqes; ++i) {
    const uint8_t* b = mem.at(kLkey, kBase + i * kBuf, kBuf);
    run.bufs.emplace_back(b, b + kBuf);
  }
  run.counters = *eng.counters(qpn);
  run.dropped = eng.dropped_packets();
  return run;
}

}  // namespace

// ibv_uc_pingpong, 20 x 4096-byte SENDs each way: each direction into its own UC responder. Every
// message lands whole (payload equal to the capture's FIRST+MIDDLE+LAST payloads), nothing is
// transmitted (UC has no ACKs), nothing dropped.
TEST(UnreliableReplay, UcSendPingpongBothDirections) {
  auto frames = load("rxe-uc-send.pcap");
  for (uint32_t sender : {kClient, kServer}) {
    SCOPED_TRACE(sender == kClient ? "client -> server" : "server -> client");
    auto run = run_unreliable(frames, sender, QpType::uc);
    EXPECT_TRUE(run.tx.empty()) << describe(run.tx.front());
    EXPECT_EQ(run.counters.dropped, 0u);
    EXPECT_EQ(run.dropped, 0u);
    ASSERT_EQ(run.msgs.size(), 20u);
    ASSERT_EQ(run.wcs.size(), 20u);
    // Rebuild each message's bytes from the capture and compare with the receive buffer.
    std::vector<std::vector<uint8_t>> want(1);
    for (const auto& f : frames) {
      if (f.src != sender || op_transport(f.p.bth.opcode) != Transport::uc) continue;
      want.back().insert(want.back().end(), f.p.payload, f.p.payload + f.p.payload_len);
      if (f.op().is(kEnd)) want.emplace_back();
    }
    want.pop_back();
    ASSERT_EQ(want.size(), 20u);
    for (size_t i = 0; i < 20; ++i) {
      const Wc& wc = run.wcs[i];
      EXPECT_EQ(wc.status, WcStatus::success) << i;
      EXPECT_EQ(wc.opcode, WcOpcode::recv);
      EXPECT_EQ(wc.wr_id, i);
      EXPECT_EQ(wc.byte_len, 4096u);
      ASSERT_EQ(want[i].size(), 4096u);
      EXPECT_EQ(std::memcmp(run.bufs[i].data(), want[i].data(), 4096), 0) << i;
    }
  }
}

// ibv_ud_pingpong -s 1024, Q_Key 0x11111111: every datagram lands behind a 40-byte GRH whose first
// 20 bytes are zero and whose last 20 are the IPv4 header as it arrived (what rxe delivers, rebuilt
// by write_ud_grh from the parsed IpUdp): compared byte for byte with the capture, including the
// IP ID, DF, TTL, total length and header checksum. src_qp comes from the DETH.
TEST(UnreliableReplay, UdSendGrhIsTheCapturedIpv4Header) {
  auto frames = load("rxe-ud-send.pcap");
  for (uint32_t sender : {kClient, kServer}) {
    SCOPED_TRACE(sender == kClient ? "client -> server" : "server -> client");
    auto run = run_unreliable(frames, sender, QpType::ud);
    EXPECT_TRUE(run.tx.empty());
    ASSERT_EQ(run.msgs.size(), 20u);
    ASSERT_EQ(run.wcs.size(), 20u);
    for (size_t i = 0; i < 20; ++i) {
      SCOPED_TRACE("datagram " + std::to_string(i) + ", frame " + std::to_string(run.msgs[i]->index));
      const Frame& f = *run.msgs[i];
      const Wc& wc = run.wcs[i];
      EXPECT_EQ(wc.status, WcStatus::success);
      EXPECT_EQ(wc.wr_id, i);
      EXPECT_EQ(wc.byte_len, 40u + f.p.payload_len);
      EXPECT_EQ(wc.src_qp, f.p.deth.src_qp);
      EXPECT_TRUE(wc.wc_flags & kWcGrh);
      const auto& b = run.bufs[i];
      for (size_t k = 0; k < 20; ++k) EXPECT_EQ(b[k], 0) << "GRH byte " << k;
      for (size_t k = 0; k < 20; ++k)
        EXPECT_EQ(b[20 + k], f.ipbytes[k]) << "GRH byte " << 20 + k << " (IPv4 header byte " << k << ")";
      EXPECT_EQ(std::memcmp(b.data() + 40, f.p.payload, f.p.payload_len), 0);
    }
  }
}

// The read-loss requests (client -> server was not impaired, so the capture is what the server
// received) into our responder. The capture's responses are what the client received (lossy), so
// only answers that can be matched one to one are compared: for each READ_REQUEST that re-issues a
// READ from its middle (VA advanced), the first response rxe sent for it (the first server packet
// with that PSN after the request) against ours. rxe (resp.c duplicate_request/read_reply) replays
// such a request as a continuation of the original READ: RDMA_READ_RESPONSE_MIDDLE.../LAST, never
// FIRST/ONLY, e.g. PSN+175, 1024 bytes -> READ_RESPONSE_LAST (frames 924/943). Our own completer
// expects exactly that (it rejects FIRST/ONLY at a PSN other than the READ's first with
// bad_resp_err), so our responder must answer the same way or our engine cannot recover a partial
// READ from itself.
TEST(ResponderReplay, RcReadLossPartialReissueIsAContinuation) {
  auto frames = load("rxe-rc-read-loss.pcap");
  ResponderSetup cfg;
  cfg.max_dest_rd_atomic = 64;  // the capture has up to 17 READs outstanding: keep them all
  ResponderRun run = run_responder(frames, kClient, cfg);
  const Frame* first = run.requests.empty() ? nullptr : run.requests[0];
  ASSERT_NE(first, nullptr);
  size_t compared = 0;
  std::vector<std::string> diffs;
  for (size_t i = 0; i < frames.size(); ++i) {
    const Frame& q = frames[i];
    if (q.src != kClient || q.p.bth.opcode != make_opcode(Transport::rc, kReadRequest) ||
        q.p.reth.va == first->p.reth.va)
      continue;
    const Frame* theirs = nullptr;
    for (size_t k = i + 1; k < frames.size() && !theirs; ++k)
      if (frames[k].src == kServer && frames[k].p.bth.psn == q.p.bth.psn) theirs = &frames[k];
    auto ours = std::find_if(run.ours.begin(), run.ours.end(), [&](const Out& o) { return o.after == q.index; });
    if (!theirs) continue;
    ++compared;
    if (ours == run.ours.end()) {
      diffs.push_back("frame " + std::to_string(q.index) + ": ours no answer");
      continue;
    }
    if (ours->opcode != theirs->p.bth.opcode || ours->psn != theirs->p.bth.psn || ours->len != theirs->p.payload_len)
      diffs.push_back("frame " + std::to_string(q.index) + " (" + std::to_string(q.p.reth.dma_len) + " B): rxe " +
                      op_info(theirs->p.bth.opcode).name + ", ours " + describe(*ours));
  }
  EXPECT_GE(compared, 30u);
  EXPECT_TRUE(diffs.empty()) << diffs.size() << " of " << compared << ", first: " << diffs.front();
}
