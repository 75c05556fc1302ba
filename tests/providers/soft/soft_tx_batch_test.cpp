// The soft provider's transmit batch (providers/soft/tx_batch.h): which packets share a UDP GSO
// send, whether each datagram the kernel will cut from a send carries the right ICRC, and how a
// batch is handed to a stand-in for sendmmsg (one call per socket's run, partial and refused sends). The
// judge of the ICRC is not our CRC code: each datagram is rebuilt as it will be on the wire (IPv4
// header with identification i for the i-th segment of a send, as Linux's inet_gso_segment numbers
// them) and summed with zlib's crc32 over the masked fields of IBA Annex A17.
#include "providers/soft/tx_batch.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/udp.h>

#include <cstring>
#include <utility>
#include <vector>

#include "common/datagram_oracle.h"
#include "roce/opcode.h"

namespace melon::soft {
namespace {

constexpr uint8_t kSendOnly = 0x04, kWriteFirst = 0x06, kWriteMiddle = 0x07, kWriteLast = 0x08, kAck = 0x11;
constexpr uint8_t kUcSendOnly = 0x24;

uint8_t kOurs[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2};
uint8_t kPeer[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 3};
uint8_t kOther[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 4};

struct Fixture {
  explicit Fixture(bool gso_on = true) {
    gso[0] = gso[1] = gso_on;
    peer.av.hop_limit = 64;
    memcpy(peer.av.sgid, kOurs, 16);
    memcpy(peer.av.dgid, kPeer, 16);
    other.av = peer.av;
    memcpy(other.av.dgid, kOther, 16);
  }
  struct Dest {
    rc::AddressVector av;
  } peer, other;
  std::atomic<bool> gso[2];  // per socket
  size_t sock = 0;  // the socket the next packets leave from
  TxBatch batch{256};
  std::vector<std::vector<uint8_t>> payloads;
  uint32_t psn = 100;

  TxSource src() { return TxSource{sock, kOurs, false, 4791, gso}; }
  // One packet of `opcode` with `len` payload bytes (a byte pattern of its PSN) to `d`.
  void add(uint8_t opcode, uint32_t len, const Dest& d) {
    payloads.emplace_back(len);
    for (uint32_t i = 0; i < len; ++i) payloads.back()[i] = uint8_t(psn + i);
    rc::TxPacket p;
    p.pkt.bth.opcode = opcode;
    p.pkt.bth.dest_qp = 0x11;
    p.pkt.bth.psn = psn++;
    p.pkt.bth.pad = roce::pad_for(len);
    if (opcode == kWriteFirst) p.pkt.reth = {0x1000, 0x77, 4 * len};
    if (len) {
      p.iov[0] = {payloads.back().data(), len};
      p.niov = 1;
    }
    p.payload_len = len;
    p.av = &d.av;
    p.src_qpn = 0x22;
    ASSERT_FALSE(batch.full(p.niov + 2));
    batch.add(p, src());
  }
};

// The bytes of message `m` as one buffer (what the kernel gathers from its iovecs).
std::vector<uint8_t> gather(const TxBatch& b, const TxMsg& m) {
  std::vector<uint8_t> out;
  for (int i = m.first_iov; i < m.first_iov + m.niov; ++i) {
    const uint8_t* p = static_cast<const uint8_t*>(b.iov[i].iov_base);
    out.insert(out.end(), p, p + b.iov[i].iov_len);
  }
  return out;
}

// Whether one RoCEv2 datagram (BTH onwards, ICRC last, little-endian on the wire) sent from our
// address to `dst` over IPv4 with identification `id` ends with the ICRC zlib sums for it over the
// masked fields (tests/common/datagram_oracle.h).
bool icrc_ok(const uint8_t* roce, size_t len, const uint8_t dst[16], uint16_t id) {
  if (len < 16) return false;
  test::Datagram d;
  memcpy(d.src, kOurs, 16);
  memcpy(d.dst, dst, 16);
  d.sport = d.dport = 4791;
  d.id = id;
  d.bytes.assign(roce, roce + len);
  const uint8_t* t = roce + len - 4;
  return test::datagram_icrc(d) == (uint32_t(t[0]) | uint32_t(t[1]) << 8 | uint32_t(t[2]) << 16 | uint32_t(t[3]) << 24);
}

// Cuts message `m` as the kernel's GSO does (datagrams of m.seg bytes, the last shorter) and
// checks every datagram's ICRC for its identification; returns the datagrams' opcodes.
std::vector<uint8_t> wire(const TxBatch& b, const TxMsg& m) {
  const std::vector<uint8_t> all = gather(b, m);
  std::vector<uint8_t> ops;
  const size_t seg = m.npkts > 1 ? m.seg : all.size();
  uint16_t id = 0;
  for (size_t off = 0; off < all.size(); off += seg, ++id) {
    const size_t n = std::min(seg, all.size() - off);
    EXPECT_TRUE(icrc_ok(all.data() + off, n, m.dgid, id)) << "datagram " << id << " of " << m.npkts;
    ops.push_back(all[off]);
  }
  EXPECT_EQ(int(ops.size()), m.npkts);
  return ops;
}

TEST(SoftTxBatch, EqualSizePacketsOfOneFlowShareOneGsoSendAndEachSegmentsIcrcHoldsForItsId) {
  Fixture f;
  f.add(kWriteFirst, 1024, f.peer);
  f.add(kWriteMiddle, 1024, f.peer);  // no RETH: 16 bytes shorter than FIRST
  ASSERT_EQ(f.batch.nmsgs, 1);
  // FIRST (BTH+RETH+1024) is the segment size; MIDDLE (BTH+1024) is shorter, so it ends the send.
  EXPECT_FALSE(f.batch.msgs[0].open);
  f.add(kWriteLast, 512, f.peer);
  ASSERT_EQ(f.batch.nmsgs, 2);
  EXPECT_EQ(wire(f.batch, f.batch.msgs[0]), (std::vector<uint8_t>{kWriteFirst, kWriteMiddle}));
  EXPECT_EQ(wire(f.batch, f.batch.msgs[1]), (std::vector<uint8_t>{kWriteLast}));
}

TEST(SoftTxBatch, AShorterPacketIsTheLastSegmentAndLaterOnesStartAnotherSend) {
  Fixture f;
  for (int i = 0; i < 5; ++i) f.add(kWriteMiddle, 1024, f.peer);
  f.add(kWriteLast, 100, f.peer);
  f.add(kWriteMiddle, 1024, f.peer);
  ASSERT_EQ(f.batch.nmsgs, 2);
  EXPECT_EQ(f.batch.msgs[0].npkts, 6);
  EXPECT_EQ(f.batch.msgs[0].seg, 12u + 1024 + 4);
  EXPECT_EQ(wire(f.batch, f.batch.msgs[0]).back(), kWriteLast);
  EXPECT_EQ(f.batch.msgs[1].npkts, 1);
  wire(f.batch, f.batch.msgs[1]);
}

TEST(SoftTxBatch, WithoutGsoEveryPacketIsADatagramOfItsOwnWithIdentificationZero) {
  Fixture f(/*gso_on=*/false);
  for (int i = 0; i < 4; ++i) f.add(kWriteMiddle, 1024, f.peer);
  ASSERT_EQ(f.batch.nmsgs, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(wire(f.batch, f.batch.msgs[i]).size(), 1u);
}

TEST(SoftTxBatch, PacketsToAnotherPeerStartAnotherSend) {
  Fixture f;
  f.add(kWriteMiddle, 1024, f.peer);
  f.add(kWriteMiddle, 1024, f.other);
  f.add(kWriteMiddle, 1024, f.other);
  ASSERT_EQ(f.batch.nmsgs, 2);
  EXPECT_EQ(memcmp(f.batch.msgs[1].dgid, kOther, 16), 0);
  EXPECT_EQ(wire(f.batch, f.batch.msgs[1]).size(), 2u);
  const sockaddr_in* to = reinterpret_cast<const sockaddr_in*>(&f.batch.msgs[1].to);
  EXPECT_EQ(f.batch.msgs[1].to_len, sizeof(sockaddr_in));
  EXPECT_EQ(to->sin_family, AF_INET);
  EXPECT_EQ(ntohs(to->sin_port), 4791);
  EXPECT_EQ(ntohl(to->sin_addr.s_addr), 0x7f000004u);
}

TEST(SoftTxBatch, ASendHoldsAtMost64SegmentsAndAtMost65507Bytes) {
  Fixture f;
  for (int i = 0; i < 65; ++i) f.add(kWriteMiddle, 256, f.peer);
  ASSERT_EQ(f.batch.nmsgs, 2);
  EXPECT_EQ(f.batch.msgs[0].npkts, kMaxGsoSegments);
  EXPECT_EQ(f.batch.msgs[1].npkts, 1);
  Fixture g;
  for (int i = 0; i < 70; ++i) g.add(kWriteMiddle, 1024, g.peer);
  const size_t per = 12 + 1024 + 4;
  ASSERT_GE(g.batch.nmsgs, 2);
  EXPECT_EQ(size_t(g.batch.msgs[0].npkts), kMaxGsoBytes / per);
  for (int i = 0; i < g.batch.nmsgs; ++i) {
    EXPECT_LE(gather(g.batch, g.batch.msgs[i]).size(), kMaxGsoBytes);
    wire(g.batch, g.batch.msgs[i]);
  }
}

// An application may rewrite a buffer while its packets are still on the way out (ucx_perftest's
// put_bw stamps each iteration into the buffer it writes from): what leaves must be what the ICRC
// was summed over, for RC as for UC.
TEST(SoftTxBatch, EveryPayloadIsCopiedSoItsIcrcHoldsWhateverTheBufferBecomes) {
  Fixture f(false);
  f.add(kUcSendOnly, 64, f.peer);  // UC: complete once handed over
  f.add(kSendOnly, 64, f.peer);  // RC: completes at the ACK, after the send
  f.add(kWriteFirst, 1024, f.peer);
  ASSERT_EQ(f.batch.nmsgs, 3);
  std::vector<std::vector<uint8_t>> before;
  for (int i = 0; i < 3; ++i) before.push_back(gather(f.batch, f.batch.msgs[i]));
  for (auto& b : f.payloads) memset(b.data(), 0xee, b.size());
  for (int i = 0; i < 3; ++i) {
    const std::vector<uint8_t> sent = gather(f.batch, f.batch.msgs[i]);
    EXPECT_EQ(sent, before[i]) << "message " << i << " changed with its buffer";
    EXPECT_TRUE(icrc_ok(sent.data(), sent.size(), kPeer, 0)) << "message " << i;
  }
}

// A busy-polling ping-pong: the ACK a receive held, then the SEND the application posted.
TEST(SoftTxBatch, AHeldAckJoinsTheNextSendAsItsLastSegmentWithItsIcrcForThatId) {
  Fixture f;
  f.add(kAck, 0, f.peer);
  f.add(kSendOnly, 64, f.peer);
  ASSERT_EQ(f.batch.nmsgs, 2);
  JoinDelta delta;
  ASSERT_TRUE(f.batch.join_held_reply(f.gso, &delta));
  ASSERT_EQ(f.batch.nmsgs, 1);
  EXPECT_EQ(wire(f.batch, f.batch.msgs[0]), (std::vector<uint8_t>{kSendOnly, kAck}));
  // The next round reuses the kept delta (same length and ids) and is right too.
  f.batch.clear();
  f.add(kAck, 0, f.peer);
  f.add(kSendOnly, 64, f.peer);
  const JoinDelta kept = delta;
  ASSERT_TRUE(f.batch.join_held_reply(f.gso, &delta));
  EXPECT_EQ(delta.delta, kept.delta);
  EXPECT_EQ(wire(f.batch, f.batch.msgs[0]), (std::vector<uint8_t>{kSendOnly, kAck}));
}

TEST(SoftTxBatch, AHeldAckStaysApartWithoutGsoOrForAnotherPeerOrAfterTwoMessages) {
  JoinDelta delta;
  {
    Fixture f(false);
    f.add(kAck, 0, f.peer);
    f.add(kSendOnly, 64, f.peer);
    EXPECT_FALSE(f.batch.join_held_reply(f.gso, &delta));
    EXPECT_EQ(f.batch.nmsgs, 2);
  }
  {
    Fixture f;
    f.add(kAck, 0, f.peer);
    f.add(kSendOnly, 64, f.other);
    EXPECT_FALSE(f.batch.join_held_reply(f.gso, &delta));
  }
  {
    Fixture f;
    f.add(kAck, 0, f.peer);
    f.add(kSendOnly, 64, f.peer);
    f.add(kSendOnly, 64, f.other);
    EXPECT_FALSE(f.batch.join_held_reply(f.gso, &delta));
    EXPECT_EQ(f.batch.nmsgs, 3);
    for (int i = 0; i < 3; ++i) wire(f.batch, f.batch.msgs[i]);
  }
}

TEST(SoftTxBatch, PrepareSendAsksTheKernelToCutOnlyTheGsoMessages) {
  Fixture f;
  for (int i = 0; i < 3; ++i) f.add(kWriteMiddle, 1024, f.peer);
  f.add(kWriteMiddle, 1024, f.other);
  f.batch.prepare_send();
  const msghdr& h0 = f.batch.mmsg[0].msg_hdr;
  EXPECT_EQ(int(h0.msg_iovlen), f.batch.msgs[0].niov);
  EXPECT_EQ(h0.msg_name, &f.batch.msgs[0].to);
#if defined(__linux__)
  const cmsghdr* c = CMSG_FIRSTHDR(&h0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->cmsg_level, SOL_UDP);
  EXPECT_EQ(c->cmsg_type, UDP_SEGMENT);
  uint16_t seg;
  memcpy(&seg, CMSG_DATA(c), sizeof seg);
  EXPECT_EQ(seg, 12 + 1024 + 4);
#endif
  EXPECT_EQ(f.batch.mmsg[1].msg_hdr.msg_controllen, 0u);  // one datagram: nothing to cut
}

// send_batch's calls, and what the stand-in for sendmmsg answers each (by default: all sent).
using Calls = std::vector<std::pair<int, unsigned>>;  // (fd, messages) of each call
Calls g_calls;
std::vector<std::pair<int, int>> g_answers;  // (result, errno), in call order
int fake_send(int fd, mmsghdr* v, unsigned n) {
  (void)v;
  const size_t i = g_calls.size();
  g_calls.push_back({fd, n});
  if (i >= g_answers.size() || g_answers[i].first == int(n)) return int(n);
  errno = g_answers[i].second;
  return g_answers[i].first;
}
int fd_of(size_t sock) { return 10 + int(sock); }

// Four messages: a GSO send of 3 packets and a single packet from socket 0, one from socket 1, one
// more from socket 0.
void four_messages(Fixture& f) {
  for (int i = 0; i < 3; ++i) f.add(kSendOnly, 1024, f.peer);
  f.add(kSendOnly, 1024, f.other);
  f.sock = 1;
  f.add(kSendOnly, 64, f.peer);
  f.sock = 0;
  f.add(kSendOnly, 64, f.peer);
  ASSERT_EQ(f.batch.nmsgs, 4);
  ASSERT_EQ(f.batch.msgs[0].npkts, 3);
}

// Four messages sent through fake_send, answering `answers`.
struct Sent {
  Fixture f;
  TransportStats st;
  explicit Sent(std::vector<std::pair<int, int>> answers) {
    four_messages(f);
    g_calls.clear();
    g_answers = std::move(answers);
    send_batch(f.batch, fd_of, f.gso, st, fake_send);
  }
};

TEST(SoftTxBatch, EachSocketsConsecutiveMessagesLeaveInOneCallAndAreCounted) {
  Sent s({});
  EXPECT_EQ(g_calls, (Calls{{10, 2}, {11, 1}, {10, 1}}));
  EXPECT_EQ(s.st.tx_calls.load(), 3u);
  EXPECT_EQ(s.st.tx_packets.load(), 6u);
  EXPECT_EQ(s.st.tx_gso_sends.load(), 1u);
  EXPECT_EQ(s.st.tx_errors.load(), 0u);
}

TEST(SoftTxBatch, AnInterruptedOrPartialSendGoesOnWhereTheKernelStopped) {
  Sent s({{-1, EINTR}, {1, 0}});  // interrupted, then the first of two taken
  // The same two again, then the one left of them.
  EXPECT_EQ(g_calls, (Calls{{10, 2}, {10, 2}, {10, 1}, {11, 1}, {10, 1}}));
  EXPECT_EQ(s.st.tx_packets.load(), 6u);
  EXPECT_EQ(s.st.tx_errors.load(), 0u);
}

TEST(SoftTxBatch, AGsoSendTheKernelRefusesWithEioTurnsGsoOffForItsSocketAndLosesItsPacketsOnly) {
  Sent s({{-1, EIO}});
  EXPECT_EQ(g_calls, (Calls{{10, 2}, {10, 1}, {11, 1}, {10, 1}}));  // on with the next message of that run
  EXPECT_FALSE(s.f.gso[0].load());
  EXPECT_TRUE(s.f.gso[1].load());
  EXPECT_EQ(s.st.offload_fallbacks.load(), 1u);
  EXPECT_EQ(s.st.tx_errors.load(), 3u);  // the 3 packets of that send (the transport retries them)
  EXPECT_EQ(s.st.tx_packets.load(), 3u);
  EXPECT_EQ(s.st.tx_gso_sends.load(), 0u);
}

TEST(SoftTxBatch, OtherRefusalsLoseThePacketsAndKeepGso) {
  for (int e : {ENOBUFS, EAGAIN, ENETUNREACH}) {
    Sent s({{-1, e}});
    EXPECT_TRUE(s.f.gso[0].load()) << e;
    EXPECT_EQ(s.st.offload_fallbacks.load(), 0u) << e;
    EXPECT_EQ(s.st.tx_errors.load(), 3u) << e;
    EXPECT_EQ(s.st.tx_packets.load(), 3u) << e;
  }
  // EIO on a single datagram is no GSO refusal.
  Fixture f;
  f.add(kSendOnly, 64, f.peer);
  g_calls.clear();
  g_answers = {{-1, EIO}};
  TransportStats st;
  send_batch(f.batch, fd_of, f.gso, st, fake_send);
  EXPECT_TRUE(f.gso[0].load());
  EXPECT_EQ(st.offload_fallbacks.load(), 0u);
  EXPECT_EQ(st.tx_errors.load(), 1u);
}

}  // namespace
}  // namespace melon::soft
