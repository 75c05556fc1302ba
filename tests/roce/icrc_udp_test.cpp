// ICRC through a UDP socket: the IPv4 identification is hidden from the receiver; we recover it
// from the ICRC. Oracle: the real ids in rxe's packets.
#include <gtest/gtest.h>

#include <vector>

#include "common/pcap.h"
#include "roce/icrc.h"
#include "roce/icrc_udp.h"

using namespace melon::roce;

namespace {
struct Captured {
  IpUdp h;
  std::vector<uint8_t> roce;  // BTH .. ICRC
};

// Every RoCE packet of every capture, read once per process.
const std::vector<Captured>& captured() {
  static const std::vector<Captured> all = [] {
    std::vector<Captured> v;
    for (const auto& file : melon::test::capture_files())
      for (const auto& pk : melon::test::read_pcap(melon::test::capture_path(file))) {
        size_t len;
        const uint8_t* ip = melon::test::roce_ip(pk, &len);
        if (!ip) continue;
        Captured c;
        if (parse_ip_udp(ip, len, c.h) != ParseError::ok) continue;
        c.roce.assign(ip + c.h.hdr_len, ip + c.h.hdr_len + (c.h.udp_len - kUdpHeaderSize));
        v.push_back(std::move(c));
      }
    return v;
  }();
  return all;
}

template <typename F>
size_t for_each_roce_packet(F f) {
  for (const auto& c : captured()) f(c.h, c.roce.data(), c.roce.size());
  return captured().size();
}
}  // namespace

TEST(IcrcUdp, RecoversTheHiddenIpv4IdentificationOfEveryRxePacket) {
  size_t wrong = 0;
  size_t n = for_each_roce_packet([&](const IpUdp& h, const uint8_t* roce, size_t len) {
    IpUdp seen = h;
    seen.ip_id = 0xdead;  // what a socket receiver doesn't know
    seen.df = false;
    uint16_t id = 0;
    if (!icrc_check_udp_payload(seen, roce, len, &id) || id != h.ip_id) ++wrong;
  });
  EXPECT_EQ(n, 18365u);
  EXPECT_EQ(wrong, 0u);
}

TEST(IcrcUdp, AGuessedIdentificationChangesNoAnswer) {
  // The guess is only tried first: right, wrong or 0, the id found is the packet's, and a packet
  // whose ICRC no id makes right fails whatever is guessed.
  size_t wrong = 0, n = 0;
  for_each_roce_packet([&](const IpUdp& h, const uint8_t* roce, size_t len) {
    if (n++ % 5) return;  // a sample keeps the test fast
    IpUdp seen = h;
    seen.ip_id = 0xdead;
    seen.df = false;
    for (uint16_t guess : {h.ip_id, uint16_t(h.ip_id + 1), uint16_t(0), uint16_t(1)}) {
      uint16_t id = 0;
      if (!icrc_check_udp_payload(seen, roce, len, &id, guess) || id != h.ip_id) ++wrong;
    }
    std::vector<uint8_t> c(roce, roce + len);
    c[len - 1] ^= 0x10;  // the ICRC itself
    if (icrc_check_udp_payload(seen, c.data(), len, nullptr, h.ip_id)) ++wrong;
  });
  EXPECT_EQ(wrong, 0u);
}

TEST(IcrcUdp, AnyCorruptedByteIsStillDetected) {
  size_t missed = 0, n = 0;
  for_each_roce_packet([&](const IpUdp& h, const uint8_t* roce, size_t len) {
    if (n++ % 7) return;  // a sample keeps the test fast
    std::vector<uint8_t> c(roce, roce + len);
    size_t at = (n * 131) % len;
    c[at] ^= uint8_t(1u << (n % 8));
    if (at == 4) return;  // the BTH byte the ICRC masks (FECN/BECN)
    if (icrc_check_udp_payload(h, c.data(), len, nullptr)) ++missed;
  });
  EXPECT_EQ(missed, 0u);
}

TEST(IcrcUdp, WrongSourceAddressFails) {
  bool checked = false;
  for_each_roce_packet([&](const IpUdp& h, const uint8_t* roce, size_t len) {
    if (checked) return;
    IpUdp other = h;
    other.src[15] ^= 1;
    EXPECT_TRUE(icrc_check_udp_payload(h, roce, len, nullptr));
    EXPECT_FALSE(icrc_check_udp_payload(other, roce, len, nullptr));
    checked = true;
  });
  EXPECT_TRUE(checked);
}

TEST(IcrcUdp, SenderValueMatchesFrameIcrcForIdZero) {
  // What our sender computes for a UDP payload equals the whole-frame ICRC with id 0 and DF.
  for_each_roce_packet([&](const IpUdp& h, const uint8_t* roce, size_t len) {
    static int budget = 50;
    if (budget-- <= 0) return;
    IpUdp s = h;
    s.ip_id = 0;
    s.df = true;
    uint32_t v = icrc_for_udp_payload(s, roce, len - kIcrcSize);
    std::vector<uint8_t> frame(s.hdr_len + len);
    write_ip_udp(s, len, frame.data());
    std::copy(roce, roce + len, frame.begin() + s.hdr_len);
    EXPECT_EQ(v, icrc_of_frame(frame.data(), frame.size() - kIcrcSize));
  });
}
