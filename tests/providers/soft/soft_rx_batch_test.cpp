// The soft provider's receive batch (providers/soft/rx_batch.h): datagrams from a socketpair, from a
// stand-in for recvmmsg that fills buffers as Linux's udp_recvmsg documents (a GRO buffer of equal
// segments with the last shorter and its UDP_GRO control message, the SO_RXQ_OVFL running drop
// count, MSG_TRUNC), and from a real UDP GSO send over loopback to a GRO socket; then the check that
// sends each packet to its lane's engine or drops it, counted. The packets' ICRCs are summed by zlib
// (the datagram oracle, tests/common), not by our CRC code.
#include "providers/soft/rx_batch.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <vector>

#include "providers/soft/steering.h"
#include "providers/soft/udp_socket.h"
#include "common/datagram_oracle.h"

namespace melon::soft {
namespace {

const uint8_t kPeer[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 3};
const uint8_t kOurs[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2};
constexpr uint16_t kPeerPort = 49152, kPort = 4791;

// One RoCEv2 packet (BTH, `payload` bytes, ICRC) from kPeer:kPeerPort to kOurs:kPort over IPv4
// with identification `id`, its ICRC summed by zlib (tests/common/datagram_oracle.h).
std::vector<uint8_t> roce_packet(uint32_t dest_qp, size_t payload, uint16_t id, uint8_t fill = 0x5a) {
  test::Datagram d;
  memcpy(d.src, kPeer, 16);
  memcpy(d.dst, kOurs, 16);
  d.sport = kPeerPort;
  d.dport = kPort;
  d.id = id;
  d.bytes.assign(12 + payload + 4, fill);
  const uint8_t bth[12] = {0x04, 0x40, 0xff, 0xff, 0, uint8_t(dest_qp >> 16), uint8_t(dest_qp >> 8), uint8_t(dest_qp),
                           0,    0,    0,    7};  // SEND ONLY, tver 0, pkey 0xffff, PSN 7
  memcpy(d.bytes.data(), bth, 12);
  const uint32_t crc = test::datagram_icrc(d);
  for (int i = 0; i < 4; ++i) d.bytes[d.bytes.size() - 4 + size_t(i)] = uint8_t(crc >> (8 * i));  // little-endian
  return d.bytes;
}

// What split() handed on.
struct Seen {
  size_t len;
  uint16_t nth;
  std::vector<uint8_t> bytes;
  uint16_t from_port;
};
std::vector<Seen> split_all(const RxBatch& rx, int n, uint32_t* drops) {
  std::vector<Seen> out;
  rx.split(n, drops, [&](const sockaddr_storage& from, const uint8_t* pkt, size_t len, uint16_t nth) {
    uint8_t gid[16];
    uint16_t port = 0;
    sockaddr_gid(from, gid, &port);
    out.push_back({len, nth, std::vector<uint8_t>(pkt, pkt + len), port});
  });
  return out;
}

// A datagram as the kernel's udp_recvmsg hands it over.
struct KernelDatagram {
  std::vector<uint8_t> bytes;
  int gso_size = 0;  // a GRO buffer: UDP_GRO control message with this segment size
  bool ovfl = false;  // SO_RXQ_OVFL control message with `drops`, the socket's running total
  uint32_t drops = 0;
};
std::deque<KernelDatagram> g_queue;
unsigned g_asked = 0;
// recvmmsg(MSG_DONTWAIT) on a socket holding g_queue: each datagram copied into its buffer (cut and
// MSG_TRUNC set if longer), its sender in msg_name, its control messages where they fit
// (msg_controllen set to what was written); -1 with EAGAIN when nothing is queued.
int fake_recv(int, mmsghdr* v, unsigned n) {
  g_asked = n;
  unsigned got = 0;
  for (; got < n && !g_queue.empty(); ++got) {
    KernelDatagram d = std::move(g_queue.front());
    g_queue.pop_front();
    msghdr& h = v[got].msg_hdr;
    const size_t room = h.msg_iov[0].iov_len;
    const size_t len = std::min(room, d.bytes.size());
    memcpy(h.msg_iov[0].iov_base, d.bytes.data(), len);
    v[got].msg_len = unsigned(len);
    h.msg_flags = d.bytes.size() > room ? MSG_TRUNC : 0;
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_port = htons(kPeerPort);
    from.sin_addr.s_addr = htonl(0x7f000003);
    memcpy(h.msg_name, &from, sizeof from);
    h.msg_namelen = sizeof from;
    size_t used = 0;
    auto put = [&](int level, int type, const void* data, size_t n) {
      if (used + CMSG_SPACE(n) > h.msg_controllen) {
        h.msg_flags |= MSG_CTRUNC;
        return;
      }
      cmsghdr* c = reinterpret_cast<cmsghdr*>(static_cast<char*>(h.msg_control) + used);
      c->cmsg_level = level;
      c->cmsg_type = type;
      c->cmsg_len = CMSG_LEN(n);
      memcpy(CMSG_DATA(c), data, n);
      used += CMSG_SPACE(n);
    };
    if (d.gso_size) put(SOL_UDP, UDP_GRO, &d.gso_size, sizeof d.gso_size);
    if (d.ovfl) put(SOL_SOCKET, SO_RXQ_OVFL, &d.drops, sizeof d.drops);
    h.msg_controllen = used;
  }
  if (!got) {
    errno = EAGAIN;
    return -1;
  }
  return int(got);
}

// n packets of `seg` bytes back to back, the i-th with identification i, the last `last` bytes
// long (0: seg), as one GRO buffer.
KernelDatagram gro_buffer(int n, size_t seg, size_t last = 0) {
  KernelDatagram d;
  for (int i = 0; i < n; ++i) {
    const size_t len = i == n - 1 && last ? last : seg;
    const std::vector<uint8_t> p = roce_packet(0x11, len - 16, uint16_t(i), uint8_t(i));
    d.bytes.insert(d.bytes.end(), p.begin(), p.end());
  }
  d.gso_size = int(seg);
  return d;
}

TEST(SoftRxBatch, SizedToTheWindowWithoutGroAnd32BuffersOf64KiBWithIt) {
  TransportStats st;
  RxBatch rx(st);
  rx.setup(false, 16);
  EXPECT_EQ(rx.capacity(), 64);
  EXPECT_FALSE(rx.gro());
  rx.setup(false, 300);
  EXPECT_EQ(rx.capacity(), 300);
  rx.setup(false, 4096);
  EXPECT_EQ(rx.capacity(), 512);
  rx.setup(true, 4096);
  EXPECT_EQ(rx.capacity(), 32);
  EXPECT_TRUE(rx.gro());
}

TEST(SoftRxBatch, SocketpairDatagramsAreOnePacketEachInOrderAndATruncatedOneIsDroppedAndCounted) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);
  TransportStats st;
  RxBatch rx(st);
  rx.setup(false, 64);
  EXPECT_EQ(rx.receive(sv[1], rx.capacity()), 0);  // nothing queued: no wait, nothing
  const std::vector<uint8_t> a = roce_packet(0x11, 100, 0), b = roce_packet(0x11, 4000, 0);
  const std::vector<uint8_t> big(RxBatch::kBuf + 100, 0x33);
  ASSERT_EQ(send(sv[0], a.data(), a.size(), 0), ssize_t(a.size()));
  ASSERT_EQ(send(sv[0], big.data(), big.size(), 0), ssize_t(big.size()));
  ASSERT_EQ(send(sv[0], b.data(), b.size(), 0), ssize_t(b.size()));
  ASSERT_EQ(send(sv[0], a.data(), a.size(), 0), ssize_t(a.size()));
  uint32_t drops = 0;
  int n = rx.receive(sv[1], 3);  // a vector of 3: the fourth stays queued
  ASSERT_EQ(n, 3);
  std::vector<Seen> got = split_all(rx, n, &drops);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].bytes, a);
  EXPECT_EQ(got[1].bytes, b);
  EXPECT_EQ(got[0].nth, 0);
  EXPECT_EQ(got[1].nth, 0);
  EXPECT_EQ(st.rx_malformed.load(), 1u);
  EXPECT_EQ(st.rx_gro_buffers.load(), 0u);
  n = rx.receive(sv[1], rx.capacity());
  ASSERT_EQ(n, 1);
  got = split_all(rx, n, &drops);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, a);
  EXPECT_EQ(rx.receive(sv[1], rx.capacity()), 0);
  close(sv[0]);
  close(sv[1]);
}

TEST(SoftRxBatch, AGroBufferSplitsIntoItsSegmentsTheLastShorterEachWithItsIndex) {
  TransportStats st;
  RxBatch rx(st, fake_recv);
  rx.setup(true, 64);
  g_queue.clear();
  g_queue.push_back(gro_buffer(3, 1040, 300));
  g_queue.push_back(gro_buffer(1, 200));  // a GRO socket's lone packet: UDP_GRO says its own size
  uint32_t drops = 0;
  const int n = rx.receive(-1, rx.capacity());
  ASSERT_EQ(n, 2);
  EXPECT_EQ(g_asked, 32u);
  const std::vector<Seen> got = split_all(rx, n, &drops);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].len, 1040u);
  EXPECT_EQ(got[1].len, 1040u);
  EXPECT_EQ(got[2].len, 300u);
  EXPECT_EQ(got[3].len, 200u);
  EXPECT_EQ(got[0].nth, 0);
  EXPECT_EQ(got[1].nth, 1);
  EXPECT_EQ(got[2].nth, 2);
  EXPECT_EQ(got[3].nth, 0);
  EXPECT_EQ(got[1].bytes[12], 1);  // the second segment's payload (filled with its index)
  EXPECT_EQ(got[0].from_port, kPeerPort);
  EXPECT_EQ(st.rx_gro_buffers.load(), 1u);  // the lone packet is no GRO buffer
  EXPECT_EQ(st.rx_malformed.load(), 0u);
  // Each segment's ICRC holds for its index as identification: the check needs no solving.
  const RxLocal at{false, kOurs, kPort, nullptr, 0};
  for (const Seen& s : got) {
    roce::IpUdp ip;
    uint8_t lane = 9;
    EXPECT_EQ(check_datagram(at, kPeer, kPeerPort, s.bytes.data(), s.len, s.nth, st, &ip, &lane), RxTo::engine);
    EXPECT_EQ(ip.ip_id, s.nth);
    EXPECT_EQ(lane, 0);
  }
  EXPECT_EQ(st.rx_packets.load(), 4u);
}

TEST(SoftRxBatch, TheKernelsDropCountIsCountedAsItGrowsAcrossItsWrap) {
  TransportStats st;
  RxBatch rx(st, fake_recv);
  rx.setup(false, 64);
  g_queue.clear();
  for (uint32_t total : {5u, 5u, 8u, 0xfffffffeu, 1u}) {
    KernelDatagram d;
    d.bytes = roce_packet(0x11, 64, 0);
    d.ovfl = true;
    d.drops = total;
    g_queue.push_back(d);
  }
  uint32_t drops = 0;  // the socket's running total at its last report
  int n = rx.receive(-1, 2);
  EXPECT_EQ(split_all(rx, n, &drops).size(), 2u);
  EXPECT_EQ(st.rx_buffer_drops.load(), 5u);
  n = rx.receive(-1, rx.capacity());
  ASSERT_EQ(n, 3);
  EXPECT_EQ(split_all(rx, n, &drops).size(), 3u);
  EXPECT_EQ(st.rx_buffer_drops.load(), 5ull + 3ull + (0xfffffffeull - 8ull) + 3ull);
  EXPECT_EQ(drops, 1u);
}

TEST(SoftRxBatch, ATruncatedGroBufferIsDroppedWholeAndItsDropCountStillCounts) {
  TransportStats st;
  RxBatch rx(st, fake_recv);
  rx.setup(false, 64);  // 9 KiB buffers (a socket without GRO, yet the sender's GSO send arrived whole)
  g_queue.clear();
  KernelDatagram d = gro_buffer(12, 1040);
  d.ovfl = true;
  d.drops = 2;
  g_queue.push_back(d);
  uint32_t drops = 0;
  const int n = rx.receive(-1, rx.capacity());
  ASSERT_EQ(n, 1);
  EXPECT_TRUE(split_all(rx, n, &drops).empty());
  EXPECT_EQ(st.rx_malformed.load(), 1u);
  EXPECT_EQ(st.rx_buffer_drops.load(), 2u);
}

TEST(SoftRxBatch, ABadIcrcOrAShortPacketIsDroppedAndCounted) {
  TransportStats st;
  const RxLocal at{false, kOurs, kPort, nullptr, 0};
  roce::IpUdp ip;
  uint8_t lane;
  std::vector<uint8_t> p = roce_packet(0x11, 256, 7);
  EXPECT_EQ(check_datagram(at, kPeer, kPeerPort, p.data(), p.size(), 0, st, &ip, &lane), RxTo::engine);
  EXPECT_EQ(ip.ip_id, 7);  // not the likely id: solved for (icrc_udp.h)
  EXPECT_EQ(ip.udp_len, 8 + p.size());
  EXPECT_EQ(ip.sport, kPeerPort);
  EXPECT_EQ(ip.dport, kPort);
  p[100] ^= 1;  // one payload bit
  EXPECT_EQ(check_datagram(at, kPeer, kPeerPort, p.data(), p.size(), 7, st, &ip, &lane), RxTo::bad_icrc);
  p[100] ^= 1;
  const uint8_t other[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 4};  // not the sender it names
  EXPECT_EQ(check_datagram(at, other, kPeerPort, p.data(), p.size(), 7, st, &ip, &lane), RxTo::bad_icrc);
  EXPECT_EQ(check_datagram(at, kPeer, kPeerPort + 1, p.data(), p.size(), 7, st, &ip, &lane), RxTo::bad_icrc);
  for (size_t len : {size_t(0), size_t(3), size_t(15)})  // no room for a BTH and an ICRC
    EXPECT_EQ(check_datagram(at, kPeer, kPeerPort, p.data(), len, 0, st, &ip, &lane), RxTo::bad_icrc) << len;
  EXPECT_EQ(st.rx_bad_icrc.load(), 6u);
  EXPECT_EQ(st.rx_packets.load(), 1u);
}

TEST(SoftRxBatch, PacketsGoToTheLaneOfTheirQpnsBucketAndAQpnOfNoLaneIsCounted) {
  TransportStats st;
  uint8_t lane_of_bucket[kQpnBuckets];
  memset(lane_of_bucket, kNotOurs, sizeof lane_of_bucket);
  lane_of_bucket[1] = 0;
  lane_of_bucket[2] = 1;
  const RxLocal at{false, kOurs, kPort, lane_of_bucket, 0};
  roce::IpUdp ip;
  uint8_t lane = 9;
  std::vector<uint8_t> p = roce_packet(0x010005, 32, 0);
  EXPECT_EQ(check_datagram(at, kPeer, kPeerPort, p.data(), p.size(), 0, st, &ip, &lane), RxTo::engine);
  EXPECT_EQ(lane, 0);
  p = roce_packet(0x020005, 32, 0);
  EXPECT_EQ(check_datagram(at, kPeer, kPeerPort, p.data(), p.size(), 0, st, &ip, &lane), RxTo::lane);
  EXPECT_EQ(lane, 1);
  p = roce_packet(0x030005, 32, 0);
  EXPECT_EQ(check_datagram(at, kPeer, kPeerPort, p.data(), p.size(), 0, st, &ip, &lane), RxTo::unknown_qpn);
  p = roce_packet(0x000001, 32, 0);  // QP1 with no lane for bucket 0
  EXPECT_EQ(check_datagram(at, kPeer, kPeerPort, p.data(), p.size(), 0, st, &ip, &lane), RxTo::unknown_qpn);
  EXPECT_EQ(st.rx_unknown_qpn.load(), 2u);
  EXPECT_EQ(st.rx_packets.load(), 4u);  // every one had a right ICRC
  // Seen from lane 1, its own bucket's packets are its engine's.
  const RxLocal at1{false, kOurs, kPort, lane_of_bucket, 1};
  p = roce_packet(0x020005, 32, 0);
  EXPECT_EQ(check_datagram(at1, kPeer, kPeerPort, p.data(), p.size(), 0, st, &ip, &lane), RxTo::engine);
  EXPECT_EQ(lane, 1);
}

TEST(SoftRxBatch, TheSendersAddressIsAGidForIpv4AndIpv6AndNothingElse) {
  sockaddr_storage ss{};
  auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
  s4->sin_family = AF_INET;
  s4->sin_port = htons(1234);
  s4->sin_addr.s_addr = htonl(0x7f000003);
  uint8_t gid[16];
  uint16_t port = 0;
  ASSERT_TRUE(sockaddr_gid(ss, gid, &port));
  EXPECT_EQ(memcmp(gid, kPeer, 16), 0);
  EXPECT_EQ(port, 1234);
  ss = {};
  auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
  s6->sin6_family = AF_INET6;
  s6->sin6_port = htons(4791);
  s6->sin6_addr.s6_addr[15] = 1;  // ::1
  ASSERT_TRUE(sockaddr_gid(ss, gid, &port));
  EXPECT_EQ(gid[15], 1);
  EXPECT_EQ(gid[10], 0);
  EXPECT_EQ(port, 4791);
  ss = {};
  ss.ss_family = AF_UNIX;
  EXPECT_FALSE(sockaddr_gid(ss, gid, &port));
}

// The kernel as the judge of GRO: one UDP GSO send of 3 segments over loopback to a socket with
// UDP_GRO on (enable_offloads) arrives as one buffer with its segment size, which splits back into
// the 3 packets sent. Skipped where the kernel has no UDP GSO or GRO.
TEST(SoftRxBatch, ARealGsoSendOverLoopbackArrivesAsOneGroBufferAndSplitsBack) {
  const int rx_fd = socket(AF_INET, SOCK_DGRAM, 0), tx_fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(rx_fd, 0);
  ASSERT_GE(tx_fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(rx_fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t alen = sizeof a;
  ASSERT_EQ(getsockname(rx_fd, reinterpret_cast<sockaddr*>(&a), &alen), 0);
  const SocketOffloads off = enable_offloads(rx_fd);
  const int seg = 1040;
  if (!off.gro || setsockopt(tx_fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) != 0) {
    close(rx_fd);
    close(tx_fd);
    GTEST_SKIP() << "no UDP GRO/GSO in this kernel";
  }
  const KernelDatagram sent = gro_buffer(3, size_t(seg), 500);
  ASSERT_EQ(sendto(tx_fd, sent.bytes.data(), sent.bytes.size(), 0, reinterpret_cast<sockaddr*>(&a), sizeof a),
            ssize_t(sent.bytes.size()));
  TransportStats st;
  RxBatch rx(st);
  rx.setup(true, 64);
  int n = 0;
  for (int i = 0; i < 1000 && !n; ++i) {  // loopback delivers at once; a few tries cover a softirq's delay
    n = rx.receive(rx_fd, rx.capacity());
    if (!n) usleep(1000);
  }
  // Linux hands a GSO send to a socket with UDP_GRO on whole (udp_unexpected_gso), with UDP_GRO
  // giving its segment size (udp_cmsg_recv).
  ASSERT_EQ(n, 1);
  uint32_t drops = 0;
  const std::vector<Seen> got = split_all(rx, n, &drops);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].len, size_t(seg));
  EXPECT_EQ(got[2].len, 500u);
  EXPECT_EQ(st.rx_gro_buffers.load(), 1u);
  size_t off_in_sent = 0;
  for (const Seen& s : got) {
    EXPECT_EQ(s.bytes, std::vector<uint8_t>(sent.bytes.begin() + long(off_in_sent),
                                            sent.bytes.begin() + long(off_in_sent + s.len)));
    off_in_sent += s.len;
  }
  close(rx_fd);
  close(tx_fd);
}

}  // namespace
}  // namespace melon::soft
