// The CM codec (src/cm) against two oracles: real Linux ib_cm MADs (shared/captures'
// rxe-rdmacm-rping.pcap: REQ, REP, RTU, DREQ, DREP between two rxe guests), decoded to the values
// tshark shows for them and re-encoded byte for byte; and Wireshark's CM dissector, which reads
// back MADs we encode, with no malformed packet or expert error.
#include <gtest/gtest.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cm/ip_cm.h"
#include "cm/messages.h"
#include "common/pcap.h"
#include "roce/frame.h"
#include "roce/ip_udp.h"
#include "roce/packet.h"

using namespace melon;

namespace {

constexpr uint8_t kUdSendOnly = 100;
constexpr size_t kBth = 12, kDeth = 8;

// The CM MADs of a capture: UD SEND_ONLY to QP1, in frame order.
std::vector<std::vector<uint8_t>> capture_mads(const std::string& file) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& p : test::read_pcap(test::capture_path(file))) {
    size_t ip_len = 0;
    const uint8_t* ip = test::roce_ip(p, &ip_len);
    if (!ip) continue;
    roce::IpUdp hdr;
    const uint8_t* roce = nullptr;
    size_t roce_len = 0;
    if (roce::read_frame(ip, ip_len, hdr, &roce, &roce_len) != roce::ParseError::ok) continue;
    const uint32_t dqp = uint32_t(roce[5]) << 16 | uint32_t(roce[6]) << 8 | roce[7];
    if (roce[0] != kUdSendOnly || dqp != 1 || roce_len < kBth + kDeth + cm::kMadSize) continue;
    out.emplace_back(roce + kBth + kDeth, roce + kBth + kDeth + cm::kMadSize);
  }
  return out;
}

std::vector<uint8_t> ipv4_gid(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d};
}

TEST(CmCapture, EveryLinuxMadDecodesAndReencodesByteForByte) {
  const auto mads = capture_mads("rxe-rdmacm-rping.pcap");
  ASSERT_EQ(mads.size(), 5u);
  const cm::Attr order[] = {cm::Attr::req, cm::Attr::rep, cm::Attr::rtu, cm::Attr::dreq, cm::Attr::drep};
  for (size_t i = 0; i < mads.size(); ++i) {
    cm::Message m;
    ASSERT_EQ(cm::decode(mads[i].data(), mads[i].size(), &m), cm::DecodeStatus::ok) << i;
    EXPECT_EQ(m.attr(), order[i]);
    EXPECT_EQ(m.hdr.method, cm::kMethodSend);
    EXPECT_EQ(m.hdr.tid, 0x00000002edaac67dull);  // one TID for the whole exchange, as ib_cm does
    uint8_t again[cm::kMadSize];
    ASSERT_TRUE(cm::encode(m, again));
    EXPECT_EQ(std::memcmp(again, mads[i].data(), cm::kMadSize), 0) << cm::attr_name(m.attr());
  }
}

TEST(CmCapture, RequestFieldsAreWhatTsharkShows) {
  const auto mads = capture_mads("rxe-rdmacm-rping.pcap");
  ASSERT_GE(mads.size(), 1u);
  cm::Message m;
  ASSERT_EQ(cm::decode(mads[0].data(), cm::kMadSize, &m), cm::DecodeStatus::ok);
  const cm::Req& r = m.req;
  EXPECT_EQ(r.local_comm_id, 0x7dc6aaedu);
  EXPECT_EQ(r.service_id, 0x0000000001061c06ull);  // RDMA_PS_TCP, port 7174 (rping's)
  EXPECT_EQ(cm::service_port_space(r.service_id), 0x0106);
  EXPECT_EQ(cm::service_port(r.service_id), 7174);
  EXPECT_TRUE(cm::is_ip_service(r.service_id));
  EXPECT_EQ(r.local_ca_guid, 0x505400fffe770003ull);
  EXPECT_EQ(r.local_qkey, 0u);
  EXPECT_EQ(r.local_qpn, 0x18u);
  EXPECT_EQ(r.responder_resources, 1);
  EXPECT_EQ(r.initiator_depth, 1);
  EXPECT_EQ(r.remote_cm_response_timeout, 0x14);
  EXPECT_EQ(r.transport_service_type, 0);
  EXPECT_EQ(r.starting_psn, 0xc67dcau);
  EXPECT_EQ(r.local_cm_response_timeout, 0x14);
  EXPECT_EQ(r.retry_count, 7);
  EXPECT_EQ(r.pkey, 0xffff);
  EXPECT_EQ(r.path_mtu, 3);  // 1024
  EXPECT_EQ(r.rnr_retry_count, 7);
  EXPECT_EQ(r.max_cm_retries, 15);
  EXPECT_EQ(r.primary.local_lid, 0xffff);
  EXPECT_EQ(r.primary.remote_lid, 0xffff);
  EXPECT_EQ(std::vector<uint8_t>(r.primary.local_gid, r.primary.local_gid + 16), ipv4_gid(10, 77, 0, 3));
  EXPECT_EQ(std::vector<uint8_t>(r.primary.remote_gid, r.primary.remote_gid + 16), ipv4_gid(10, 77, 0, 2));
  // IBA Table 106 (and Linux's ibta_vol1_c12.h): bytes 88..91 are flow label (20 bits), 6 reserved
  // bits, packet rate (6). Here 2f 53 f0 00: flow label 0x2f53f, rate 0. tshark 4.0 shows 0x2f5
  // and 0x2f, its masks a nibble off; the fields on either side (traffic class, hop limit, ACK
  // timeout) agree with it.
  EXPECT_EQ(r.primary.flow_label, 0x2f53fu);
  EXPECT_EQ(r.primary.packet_rate, 0);
  EXPECT_EQ(r.primary.traffic_class, 0);
  EXPECT_EQ(r.primary.hop_limit, 0x40);
  EXPECT_EQ(r.primary.local_ack_timeout, 0x13);
  cm::IpCmHeader h;
  ASSERT_TRUE(cm::decode_ip_cm(r.private_data, sizeof r.private_data, &h));
  EXPECT_EQ(h.ip_version, 4);
  EXPECT_EQ(h.src_port, 0x9ba7);
  const uint8_t src[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 77, 0, 3};
  const uint8_t dst[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 77, 0, 2};
  EXPECT_EQ(std::memcmp(h.src, src, 16), 0);
  EXPECT_EQ(std::memcmp(h.dst, dst, 16), 0);
  uint8_t again[cm::kIpCmHeaderSize];
  cm::encode_ip_cm(h, again);
  EXPECT_EQ(std::memcmp(again, r.private_data, sizeof again), 0);
}

TEST(CmCapture, ReplyAndTeardownFieldsAreWhatTsharkShows) {
  const auto mads = capture_mads("rxe-rdmacm-rping.pcap");
  ASSERT_EQ(mads.size(), 5u);
  cm::Message rep, rtu, dreq, drep;
  ASSERT_EQ(cm::decode(mads[1].data(), cm::kMadSize, &rep), cm::DecodeStatus::ok);
  ASSERT_EQ(cm::decode(mads[2].data(), cm::kMadSize, &rtu), cm::DecodeStatus::ok);
  ASSERT_EQ(cm::decode(mads[3].data(), cm::kMadSize, &dreq), cm::DecodeStatus::ok);
  ASSERT_EQ(cm::decode(mads[4].data(), cm::kMadSize, &drep), cm::DecodeStatus::ok);
  EXPECT_EQ(rep.rep.local_comm_id, 0x55505a2fu);
  EXPECT_EQ(rep.rep.remote_comm_id, 0x7dc6aaedu);
  EXPECT_EQ(rep.rep.local_qpn, 0x18u);
  EXPECT_EQ(rep.rep.starting_psn, 0x2600e3u);
  EXPECT_EQ(rep.rep.responder_resources, 1);
  EXPECT_EQ(rep.rep.initiator_depth, 1);
  EXPECT_EQ(rep.rep.target_ack_delay, 15);
  EXPECT_EQ(rep.rep.rnr_retry_count, 7);
  EXPECT_EQ(rep.rep.local_ca_guid, 0x505400fffe770002ull);
  EXPECT_EQ(rtu.rtu.local_comm_id, 0x7dc6aaedu);
  EXPECT_EQ(rtu.rtu.remote_comm_id, 0x55505a2fu);
  EXPECT_EQ(dreq.dreq.local_comm_id, 0x7dc6aaedu);
  EXPECT_EQ(dreq.dreq.remote_qpn, 0x18u);
  EXPECT_EQ(drep.drep.local_comm_id, 0x55505a2fu);
  EXPECT_EQ(drep.drep.remote_comm_id, 0x7dc6aaedu);
}

TEST(CmCodec, RefusesWhatIsNotACmMad) {
  uint8_t mad[cm::kMadSize] = {};
  cm::Message m;
  EXPECT_EQ(cm::decode(mad, cm::kMadSize - 1, &m), cm::DecodeStatus::too_short);
  EXPECT_EQ(cm::decode(nullptr, cm::kMadSize, &m), cm::DecodeStatus::too_short);
  EXPECT_EQ(cm::decode(mad, cm::kMadSize, &m), cm::DecodeStatus::bad_base_version);
  mad[0] = 1;
  mad[1] = 0x03;  // subnet administration, not CM
  mad[2] = 2;
  EXPECT_EQ(cm::decode(mad, cm::kMadSize, &m), cm::DecodeStatus::not_cm_class);
  mad[1] = cm::kMgmtClassCm;
  mad[2] = 1;  // class version 1
  EXPECT_EQ(cm::decode(mad, cm::kMadSize, &m), cm::DecodeStatus::not_cm_class);
  mad[2] = 2;
  mad[17] = 0x19;  // LAP: no table
  EXPECT_EQ(cm::decode(mad, cm::kMadSize, &m), cm::DecodeStatus::unknown_attribute);
  m.hdr.attr_id = 0x19;
  uint8_t out[cm::kMadSize];
  EXPECT_FALSE(cm::encode(m, out));
}

TEST(CmCodec, EveryTableCoversItsMessageOnceInOrder) {
  const cm::Attr attrs[] = {cm::Attr::req,  cm::Attr::mra,  cm::Attr::rej,      cm::Attr::rep,     cm::Attr::rtu,
                            cm::Attr::dreq, cm::Attr::drep, cm::Attr::sidr_req, cm::Attr::sidr_rep};
  for (cm::Attr a : attrs) {
    const cm::FieldInfo *hdr, *rows;
    size_t nh = 0;
    const size_t n = cm::message_fields(a, &hdr, &nh, &rows);
    ASSERT_GT(n, 0u) << cm::attr_name(a);
    size_t bit = cm::kMadHeaderSize * 8;  // each row starts where the one before ended
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(size_t(rows[i].byte) * 8 + rows[i].bit, bit) << cm::attr_name(a) << "." << rows[i].name;
      bit += rows[i].bits;
    }
    EXPECT_EQ(bit, cm::kMadSize * 8) << cm::attr_name(a);
  }
}

// ---- Wireshark reads what we write ----------------------------------------------------------------

struct Built {
  cm::Message m;
  std::vector<uint8_t> frame;  // IP .. ICRC
};

Built build(const cm::Message& m, size_t i) {
  Built b;
  b.m = m;
  uint8_t mad[cm::kMadSize];
  EXPECT_TRUE(cm::encode(m, mad));
  roce::IpUdp ip;
  roce::gid_from_ipv4(ip.src, 0x0ae70101);
  roce::gid_from_ipv4(ip.dst, 0x0ae70102);
  ip.sport = uint16_t(0xc100 + i);
  roce::Packet p;
  p.bth.opcode = kUdSendOnly;
  p.bth.pkey = 0xffff;
  p.bth.dest_qp = 1;
  p.bth.psn = uint32_t(i);
  p.deth = {cm::kGsiQkey, 1};
  roce::Span s{mad, uint32_t(sizeof mad)};
  b.frame.resize(roce::frame_length(false, kUdSendOnly, sizeof mad));
  b.frame.resize(roce::write_frame(ip, p, &s, 1, b.frame.data()));
  return b;
}

std::string write_pcap(const std::vector<Built>& v) {
  char path[] = "/tmp/melon_cm_tshark_XXXXXX";
  int fd = mkstemp(path);
  std::string out;
  auto u32 = [&](uint32_t x) { out.append(reinterpret_cast<const char*>(&x), 4); };
  auto u16 = [&](uint16_t x) { out.append(reinterpret_cast<const char*>(&x), 2); };
  u32(0xa1b2c3d4);
  u16(2);
  u16(4);
  u32(0);
  u32(0);
  u32(65535);
  u32(1);  // Ethernet
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t eth[14] = {2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00};
    u32(uint32_t(i));
    u32(0);
    u32(uint32_t(v[i].frame.size() + 14));
    u32(uint32_t(v[i].frame.size() + 14));
    out.append(reinterpret_cast<const char*>(eth), 14);
    out.append(reinterpret_cast<const char*>(v[i].frame.data()), v[i].frame.size());
  }
  EXPECT_EQ(write(fd, out.data(), out.size()), ssize_t(out.size()));
  close(fd);
  return path;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

TEST(CmTshark, WiresharkReadsEveryMessageWeEncode) {
  if (system("command -v tshark > /dev/null 2>&1") != 0) GTEST_SKIP() << "tshark not installed";
  std::vector<Built> v;
  cm::Message m;
  m.hdr.tid = 0x1122334455667788ull;
  m.hdr.attr_id = uint16_t(cm::Attr::req);
  m.req = cm::Req{};
  m.req.local_comm_id = 0xa1b2c3d4;
  m.req.service_id = cm::ip_service_id(0x0106, 18515);
  m.req.local_ca_guid = 0x0123456789abcdefull;
  m.req.local_qpn = 0xabcdef;
  m.req.responder_resources = 4;
  m.req.initiator_depth = 3;
  m.req.remote_cm_response_timeout = 20;
  m.req.starting_psn = 0x123456;
  m.req.local_cm_response_timeout = 18;
  m.req.retry_count = 6;
  m.req.pkey = 0xffff;
  m.req.path_mtu = 5;
  m.req.rnr_retry_count = 5;
  m.req.max_cm_retries = 15;
  m.req.primary.local_lid = m.req.primary.remote_lid = 0xffff;
  roce::gid_from_ipv4(m.req.primary.local_gid, 0x0ae70101);
  roce::gid_from_ipv4(m.req.primary.remote_gid, 0x0ae70102);
  m.req.primary.flow_label = 0xabcde;
  m.req.primary.hop_limit = 64;
  m.req.primary.local_ack_timeout = 19;
  cm::IpCmHeader h;
  h.src_port = 40000;
  h.src[12] = 10, h.src[13] = 231, h.src[14] = 1, h.src[15] = 1;
  h.dst[12] = 10, h.dst[13] = 231, h.dst[14] = 1, h.dst[15] = 2;
  cm::encode_ip_cm(h, m.req.private_data);
  v.push_back(build(m, v.size()));

  m.hdr.attr_id = uint16_t(cm::Attr::rep);
  m.rep = cm::Rep{};
  m.rep.local_comm_id = 0x0f0e0d0c;
  m.rep.remote_comm_id = 0xa1b2c3d4;
  m.rep.local_qpn = 0x654321;
  m.rep.starting_psn = 0xfedcba;
  m.rep.responder_resources = 3;
  m.rep.initiator_depth = 4;
  m.rep.target_ack_delay = 15;
  m.rep.rnr_retry_count = 7;
  m.rep.local_ca_guid = 0xfedcba9876543210ull;
  v.push_back(build(m, v.size()));

  m.hdr.attr_id = uint16_t(cm::Attr::rtu);
  m.rtu = cm::Rtu{};
  m.rtu.local_comm_id = 0xa1b2c3d4;
  m.rtu.remote_comm_id = 0x0f0e0d0c;
  v.push_back(build(m, v.size()));

  m.hdr.attr_id = uint16_t(cm::Attr::rej);
  m.rej = cm::Rej{};
  m.rej.local_comm_id = 0x0f0e0d0c;
  m.rej.remote_comm_id = 0xa1b2c3d4;
  m.rej.message_rejected = cm::kRefReq;
  m.rej.reason = cm::kRejConsumer;
  v.push_back(build(m, v.size()));

  m.hdr.attr_id = uint16_t(cm::Attr::dreq);
  m.dreq = cm::Dreq{};
  m.dreq.local_comm_id = 0xa1b2c3d4;
  m.dreq.remote_comm_id = 0x0f0e0d0c;
  m.dreq.remote_qpn = 0x654321;
  v.push_back(build(m, v.size()));

  m.hdr.attr_id = uint16_t(cm::Attr::drep);
  m.drep = cm::Drep{};
  m.drep.local_comm_id = 0x0f0e0d0c;
  m.drep.remote_comm_id = 0xa1b2c3d4;
  v.push_back(build(m, v.size()));

  m.hdr.attr_id = uint16_t(cm::Attr::mra);
  m.mra = cm::Mra{};
  m.mra.local_comm_id = 0x0f0e0d0c;
  m.mra.remote_comm_id = 0xa1b2c3d4;
  m.mra.service_timeout = 20;
  v.push_back(build(m, v.size()));

  m.hdr.attr_id = uint16_t(cm::Attr::sidr_req);
  m.sidr_req = cm::SidrReq{};
  m.sidr_req.request_id = 0x5a5a5a5a;
  m.sidr_req.pkey = 0xffff;
  m.sidr_req.service_id = cm::ip_service_id(0x0111, 7174);
  cm::encode_ip_cm(h, m.sidr_req.private_data);
  v.push_back(build(m, v.size()));

  m.hdr.attr_id = uint16_t(cm::Attr::sidr_rep);
  m.sidr_rep = cm::SidrRep{};
  m.sidr_rep.request_id = 0x5a5a5a5a;
  m.sidr_rep.qpn = 0x112233;
  m.sidr_rep.qkey = 0x01234567;
  m.sidr_rep.service_id = cm::ip_service_id(0x0111, 7174);
  v.push_back(build(m, v.size()));

  const std::string pcap = write_pcap(v);
  // No malformed packet, no expert error or warning from any dissector.
  const std::string expert = run("tshark -n -r " + pcap + " -q -z expert,warn 2>&1");
  EXPECT_EQ(expert.find("Malformed"), std::string::npos) << expert;
  EXPECT_EQ(expert.find("Error"), std::string::npos) << expert;
  EXPECT_EQ(expert.find("Warning"), std::string::npos) << expert;
  // Each frame is a CM MAD of the attribute we meant, with our values where tshark 4.0 has fields.
  const std::string f =
      run("tshark -n -r " + pcap +
          " -T fields -E separator=, -e infiniband.mad.attributeid -e infiniband.mad.transactionid"
          " -e infiniband.cm.req.localqpn -e infiniband.cm.req.startpsn -e infiniband.cm.req.serviceid.dport"
          " -e infiniband.cm.req.ip_cm.sport -e infiniband.cm.req.ip_cm.dip4 -e infiniband.cm.rep.localqpn"
          " -e infiniband.cm.rep.startpsn -e infiniband.cm.rej.reason -e infiniband.cm.dreq.remotecommid 2>/dev/null");
  std::vector<std::string> lines;
  std::istringstream in(f);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), v.size()) << f;
  // 18515 = 0x4853, 40000 = 0x9c40, REJ reason 28 = 0x001c ("consumer").
  EXPECT_EQ(lines[0], "0x0010,0x1122334455667788,0xabcdef,0x123456,0x4853,0x9c40,10.231.1.2,,,,");
  EXPECT_EQ(lines[1], "0x0013,0x1122334455667788,,,,,,0x654321,0xfedcba,,");
  EXPECT_EQ(lines[2].substr(0, 6), "0x0014");
  EXPECT_EQ(lines[3], "0x0012,0x1122334455667788,,,,,,,,0x001c,");
  EXPECT_EQ(lines[4], "0x0015,0x1122334455667788,,,,,,,,,0x0f0e0d0c");
  EXPECT_EQ(lines[5].substr(0, 6), "0x0016");
  EXPECT_EQ(lines[6].substr(0, 6), "0x0011");
  EXPECT_EQ(lines[7].substr(0, 6), "0x0017");
  EXPECT_EQ(lines[8].substr(0, 6), "0x0018");
  unlink(pcap.c_str());
}

}  // namespace
