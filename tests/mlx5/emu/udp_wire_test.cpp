// The emulator's UDP wire as a peer that checks the ICRC over the header it received (Linux rxe,
// hardware) sees it: an IPv4 frame leaves with DF set and identification 0, and its ICRC is right for
// the IP and UDP headers actually on the wire. Runs in its own network namespace, read by a raw socket.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "common/datagram_oracle.h"
#include "mlx5/emu/wire.h"
#include "roce/icrc.h"
#include "roce/icrc_udp.h"
#include "roce/ip_udp.h"

namespace melon::mlx5::emu {
namespace {

bool loopback_up() {
  int s = socket(AF_INET, SOCK_DGRAM, 0);
  if (s < 0) return false;
  ifreq r{};
  strncpy(r.ifr_name, "lo", IFNAMSIZ - 1);
  bool ok = ioctl(s, SIOCGIFFLAGS, &r) == 0;
  r.ifr_flags |= IFF_UP;
  ok = ok && ioctl(s, SIOCSIFFLAGS, &r) == 0;
  close(s);
  return ok;
}

// The far end: a UDP socket on 127.0.0.2:4791, as a RoCE peer's; -1 if it cannot be had.
int bound_peer() {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(4791);
  a.sin_addr.s_addr = htonl(0x7f000002);
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// An IP/UDP header from 127.0.0.1 to 127.0.0.2 with source port `sport`.
roce::IpUdp loopback_header(uint16_t sport) {
  roce::IpUdp h;
  roce::gid_from_ipv4(h.src, 0x7f000001);
  roce::gid_from_ipv4(h.dst, 0x7f000002);
  h.sport = sport;
  return h;
}

// A whole frame: `h`, then the RoCE packet `pkt` (BTH to ICRC) as it is.
std::vector<uint8_t> frame_of(const roce::IpUdp& h, const uint8_t* pkt, size_t n) {
  std::vector<uint8_t> f(64 + n);
  size_t hl = roce::write_ip_udp(h, n, f.data());
  memcpy(f.data() + hl, pkt, n);
  f.resize(hl + n);
  return f;
}

TEST(EmuUdpWire, Ipv4FramesLeaveWithDfIdZeroAndAnIcrcOverTheHeaderOnTheWire) {
  if (unshare(CLONE_NEWNET) != 0) GTEST_SKIP() << "no network namespace: " << strerror(errno);
  ASSERT_TRUE(loopback_up());
  int raw = socket(AF_INET, SOCK_RAW, IPPROTO_UDP);
  if (raw < 0) GTEST_SKIP() << "no raw socket: " << strerror(errno);
  UdpWire wire(0x7f000001);
  ASSERT_EQ(wire.open(), 0);

  // A SEND-only RoCEv2 packet from 127.0.0.1 to 127.0.0.2 as the device builds it (BTH + ICRC).
  roce::IpUdp h;
  roce::gid_from_ipv4(h.src, 0x7f000001);
  roce::gid_from_ipv4(h.dst, 0x7f000002);
  uint8_t bth[16] = {0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x01};
  uint8_t frame[64];
  size_t hl = roce::write_ip_udp(h, sizeof bth, frame);
  memcpy(frame + hl, bth, sizeof bth);
  wire.transmit(frame, hl + sizeof bth);

  uint8_t pkt[256];
  ssize_t n = -1;
  roce::IpUdp got;
  for (int tries = 0; tries < 10; ++tries) {
    pollfd p{raw, POLLIN, 0};
    ASSERT_GT(poll(&p, 1, 1000), 0) << "nothing on the wire";
    n = recv(raw, pkt, sizeof pkt, 0);
    if (n > 0 && roce::parse_ip_udp(pkt, size_t(n), got) == roce::ParseError::ok &&
        roce::gid_to_ipv4(got.dst) == 0x7f000002)
      break;
    n = -1;
  }
  ASSERT_GT(n, 0);
  EXPECT_TRUE(pkt[6] & 0x40) << "DF";
  EXPECT_EQ(pkt[4] << 8 | pkt[5], 0) << "IPv4 identification";
  const uint8_t* payload = pkt + got.hdr_len;
  size_t len = got.udp_len - 8;
  ASSERT_EQ(len, sizeof bth);
  EXPECT_EQ(roce::load_icrc(payload + len - roce::kIcrcSize),
            roce::icrc_for_udp_payload(got, payload, len - roce::kIcrcSize))
      << "the ICRC a receiver computes over this IP/UDP header";
  close(raw);
}

// The wire on 127.0.0.1 and a peer's UDP socket on 127.0.0.2:4791, in a network namespace of the
// test's own.
class EmuUdpWirePeer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (unshare(CLONE_NEWNET) != 0) GTEST_SKIP() << "no network namespace: " << strerror(errno);
    ASSERT_TRUE(loopback_up());
    peer = bound_peer();
    ASSERT_GE(peer, 0);
    ASSERT_EQ(wire.open(), 0);
  }
  void TearDown() override {
    if (peer >= 0) close(peer);
  }
  UdpWire wire{0x7f000001};
  int peer = -1;
};

// A batch (transmit_many: one sendmmsg) leaves as the same datagrams, in order, as one transmit()
// each: a peer sees no difference, and each ICRC is right for its header on the wire.
TEST_F(EmuUdpWirePeer, ABatchLeavesAsOneDatagramPerFrameInOrder) {
  constexpr int kFrames = 100;  // more than one sendmmsg takes
  std::vector<std::vector<uint8_t>> frames;
  const roce::IpUdp h = loopback_header(0xc000);
  for (int i = 0; i < kFrames; i++) {
    // SEND-only, PSN i, i+1 payload bytes of value i, then the ICRC (rewritten by the wire).
    std::vector<uint8_t> pkt = {0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x00, 0x00, 0x00, uint8_t(i)};
    pkt.insert(pkt.end(), size_t(i + 1), uint8_t(i));
    pkt.insert(pkt.end(), roce::kIcrcSize, 0);
    frames.push_back(frame_of(h, pkt.data(), pkt.size()));
  }
  wire.transmit_many(frames.data(), frames.size());

  const roce::IpUdp seen = loopback_header(4791);  // what the peer's kernel had on the wire (id 0)
  for (int i = 0; i < kFrames; i++) {
    pollfd p{peer, POLLIN, 0};
    ASSERT_GT(poll(&p, 1, 1000), 0) << "datagram " << i << " missing";
    uint8_t buf[512];
    ssize_t n = recv(peer, buf, sizeof buf, 0);
    ASSERT_EQ(n, ssize_t(12 + i + 1 + roce::kIcrcSize)) << "datagram " << i;
    EXPECT_EQ(buf[11], uint8_t(i)) << "out of order";
    EXPECT_EQ(roce::load_icrc(buf + n - roce::kIcrcSize),
              roce::icrc_for_udp_payload(seen, buf, size_t(n) - roce::kIcrcSize))
        << "datagram " << i;
  }
}

// The device writes its frames with the wire's source port (FramePort::source_port), so their ICRC is
// already the one for the header on the wire and the wire leaves it as it is: what leaves is the same.
TEST_F(EmuUdpWirePeer, AFrameWrittenWithTheSocketsPortKeepsItsIcrc) {
  ASSERT_EQ(wire.source_port(), 4791);

  const roce::IpUdp h = loopback_header(wire.source_port());
  uint8_t pkt[12 + 8 + roce::kIcrcSize] = {0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x00, 0x00, 0x00, 0x07};
  memset(pkt + 12, 0x5a, 8);
  std::vector<uint8_t> f = frame_of(h, pkt, sizeof pkt);
  const size_t hl = f.size() - sizeof pkt;
  roce::store_icrc(f.data() + f.size() - roce::kIcrcSize, roce::icrc_of_frame(f.data(), f.size() - roce::kIcrcSize));
  std::vector<uint8_t> sent = f;
  wire.transmit_many(&f, 1);

  pollfd p{peer, POLLIN, 0};
  ASSERT_GT(poll(&p, 1, 1000), 0) << "nothing on the wire";
  uint8_t buf[128];
  ssize_t n = recv(peer, buf, sizeof buf, 0);
  ASSERT_EQ(n, ssize_t(sizeof pkt));
  EXPECT_EQ(memcmp(buf, sent.data() + hl, sizeof pkt), 0) << "the frame's own ICRC";
  EXPECT_EQ(roce::load_icrc(buf + n - roce::kIcrcSize),
            roce::icrc_for_udp_payload(h, buf, size_t(n) - roce::kIcrcSize));
}

// A window's frames to one peer of one size leave as UDP GSO sends (runs as the soft provider makes
// them: the first frame's size, then any as long, a shorter one ends the run), which the kernel cuts
// into one datagram per frame; segment i of a send carries IPv4 identification i (Linux
// inet_gso_segment), so its ICRC must be the one for i. Judged by the datagram oracle (zlib's CRC
// over the header the kernel writes), against the bytes the peer received. With GSO off, every
// datagram is a send of its own with identification 0.
TEST_F(EmuUdpWirePeer, RunsOfEqualFramesLeaveAsGsoSendsWithTheIcrcOfEachSegmentsIdentification) {
  ASSERT_TRUE(wire.gso()) << "this kernel has UDP_SEGMENT (Linux 4.18)";

  // Payload sizes: a FIRST with a RETH (longer), MIDDLEs, a shorter LAST, then a new run; the ids
  // the kernel gives each datagram with GSO on.
  const std::vector<size_t> sizes = {1040, 1024, 1024, 1024, 1024, 600, 1024, 1024};
  const std::vector<uint16_t> gso_ids = {0, 1, 0, 1, 2, 3, 0, 1};
  const roce::IpUdp h = loopback_header(0xc000);
  for (bool gso : {true, false}) {
    wire.set_gso(gso);
    const uint64_t sends = wire.gso_sends();
    std::vector<std::vector<uint8_t>> frames;
    for (size_t i = 0; i < sizes.size(); i++) {
      std::vector<uint8_t> pkt = {0x0a, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x00, 0x00, 0x00, uint8_t(i)};
      pkt.resize(sizes[i], uint8_t(0x30 + i));
      pkt.insert(pkt.end(), roce::kIcrcSize, 0);  // written by the wire (another source port)
      frames.push_back(frame_of(h, pkt.data(), pkt.size()));
    }
    wire.transmit_many(frames.data(), frames.size());
    EXPECT_EQ(wire.gso_sends() - sends, gso ? 3u : 0u);
    for (size_t i = 0; i < sizes.size(); i++) {
      pollfd p{peer, POLLIN, 0};
      ASSERT_GT(poll(&p, 1, 1000), 0) << "datagram " << i << " missing";
      uint8_t buf[2048];
      ssize_t n = recv(peer, buf, sizeof buf, 0);
      ASSERT_EQ(n, ssize_t(sizes[i] + roce::kIcrcSize)) << "datagram " << i << ": one frame each";
      EXPECT_EQ(buf[11], uint8_t(i)) << "out of order";
      test::Datagram d;
      roce::gid_from_ipv4(d.src, 0x7f000001);
      roce::gid_from_ipv4(d.dst, 0x7f000002);
      d.sport = d.dport = 4791;
      d.id = gso ? gso_ids[i] : 0;
      d.bytes.assign(buf, buf + n);
      EXPECT_EQ(roce::load_icrc(buf + n - roce::kIcrcSize), test::datagram_icrc(d))
          << "datagram " << i << " (GSO " << gso << "): the ICRC for identification " << d.id;
    }
  }
}

}  // namespace
}  // namespace melon::mlx5::emu
