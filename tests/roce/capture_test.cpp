// Oracle: real packets from Linux rxe. Every RoCE packet parses, its ICRC equals ours, and our
// builder re-serialises it byte for byte.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "common/pcap.h"
#include "roce/crc32.h"
#include "roce/icrc.h"
#include "roce/ip_udp.h"
#include "roce/packet.h"

using namespace melon::roce;
using melon::test::capture_files;
using melon::test::capture_path;
using melon::test::read_pcap;

namespace {

struct Stats {
  size_t roce = 0;
  std::map<uint8_t, size_t> opcodes;
};

void check_capture_into(const std::string& file, Stats& st) {
  auto pkts = read_pcap(capture_path(file));
  EXPECT_FALSE(pkts.empty()) << file;
  for (const auto& pk : pkts) {
    size_t len;
    const uint8_t* ip = melon::test::roce_ip(pk, &len);
    if (!ip) continue;
    ++st.roce;
    SCOPED_TRACE(file + " frame " + std::to_string(pk.index));
    IpUdp iu;
    ASSERT_EQ(parse_ip_udp(ip, len, iu), ParseError::ok);
    size_t roce_len = iu.udp_len - kUdpHeaderSize;
    const uint8_t* bth = ip + iu.hdr_len;
    Packet p;
    ASSERT_EQ(parse_transport(bth, roce_len, p), ParseError::ok);
    st.opcodes[p.bth.opcode]++;

    // ICRC: ours equals the wire's, with the fast CRC and with the plain table.
    size_t frame = iu.hdr_len + roce_len;
    uint32_t wire = load_icrc(ip + frame - kIcrcSize);
    EXPECT_EQ(icrc_of_frame(ip, frame - kIcrcSize), wire);
    EXPECT_TRUE(icrc_frame_ok(ip, frame));
    uint8_t ff[8];
    std::memset(ff, 0xff, 8);
    std::vector<uint8_t> masked(ip, ip + frame - kIcrcSize);
    if (!iu.v6) {
      masked[1] = 0xff;
      masked[8] = 0xff;
      masked[10] = masked[11] = 0xff;
    }
    masked[iu.hdr_len - 2] = masked[iu.hdr_len - 1] = 0xff;
    masked[iu.hdr_len + 4] = 0xff;
    EXPECT_EQ(crc32_table_update(crc32_table_update(0, ff, 8), masked.data(), masked.size()), wire);

    // Re-serialise: headers, payload, pad bytes and ICRC give the same bytes.
    std::vector<uint8_t> out(frame);
    size_t n = write_ip_udp(iu, roce_len, out.data());
    ASSERT_EQ(n, iu.hdr_len);
    size_t h = write_transport_headers(p, out.data() + n);
    ASSERT_EQ(h, op_info(p.bth.opcode).hdr_len);
    std::memcpy(out.data() + n + h, p.payload, p.payload_len + p.bth.pad);
    store_icrc(out.data() + frame - kIcrcSize, icrc_of_frame(out.data(), frame - kIcrcSize));
    ASSERT_EQ(std::memcmp(out.data(), ip, frame), 0);
    if (testing::Test::HasFailure()) break;
  }
}

Stats check_capture(const std::string& file) {
  Stats st;
  check_capture_into(file, st);
  return st;
}

}  // namespace

TEST(Captures, EveryRocePacketParsesWithMatchingIcrcAndReserialisesByteIdentically) {
  size_t total = 0;
  for (const auto& f : capture_files()) total += check_capture(f).roce;
  EXPECT_EQ(total, 18365u);  // the README's count of RoCEv2 packets in all captures
}

TEST(Captures, OpcodeCountsMatchTheReadme) {
  auto send = check_capture("rxe-rc-send.pcap");
  EXPECT_EQ(send.opcodes[0], 41u);
  EXPECT_EQ(send.opcodes[1], 82u);
  EXPECT_EQ(send.opcodes[2], 41u);
  EXPECT_EQ(send.opcodes[17], 44u);
  auto uc = check_capture("rxe-uc-send.pcap");
  EXPECT_EQ(uc.opcodes[0x20], 40u);
  EXPECT_EQ(uc.opcodes[0x21], 80u);
  EXPECT_EQ(uc.opcodes[0x22], 40u);
  auto imm = check_capture("rxe-rc-write-imm.pcap");
  EXPECT_EQ(imm.opcodes[9], 10u);
  EXPECT_EQ(imm.opcodes[11], 11u);
  auto ud = check_capture("rxe-ud-send.pcap");
  EXPECT_EQ(ud.opcodes[0x64], 40u);
}

TEST(Captures, CorruptedPacketFailsIcrc) {
  auto pkts = read_pcap(capture_path("rxe-rc-write.pcap"));
  for (const auto& pk : pkts) {
    size_t len;
    const uint8_t* ip = melon::test::roce_ip(pk, &len);
    if (!ip) continue;
    std::vector<uint8_t> copy(ip, ip + len);
    ASSERT_TRUE(icrc_frame_ok(copy.data(), copy.size()));
    // Fields the ICRC masks may change in flight; anything else may not.
    copy[8] = 3;  // TTL
    copy[1] = 0x02;  // ECN
    EXPECT_TRUE(icrc_frame_ok(copy.data(), copy.size()));
    copy[copy.size() - 10] ^= 1;
    EXPECT_FALSE(icrc_frame_ok(copy.data(), copy.size()));
    return;
  }
  FAIL() << "no RoCE packet";
}
