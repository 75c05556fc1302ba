// Oracle: Wireshark's RoCEv2 ("RRoCE") dissector reads back what our builder writes. For every
// opcode in the table (plus every AETH syndrome kind) we build one packet with distinctive field
// values, write them all to a pcap file, decode it with tshark and compare each field tshark shows
// with the value we meant. A header tshark shows that we did not mean to write (or one missing)
// fails too, so the opcode table's "which headers" column is checked against Wireshark's own.
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

#include "common/tshark_payloads.h"
#include "roce/aeth.h"
#include "roce/crc32.h"
#include "roce/icrc.h"
#include "roce/ip_udp.h"
#include "roce/opcode.h"
#include "roce/packet.h"

using namespace melon::roce;

namespace {

struct Case {
  std::string what;
  IpUdp ip;
  Packet pkt;
  std::vector<uint8_t> payload;
  std::vector<uint8_t> frame;  // from the IP header to the ICRC, as built by the code under test
};

// Distinctive values: high bits set, near the 24-bit wrap, different in every packet.
Case make_case(size_t i, uint8_t opcode, uint8_t syndrome) {
  Case c;
  const OpInfo& op = op_info(opcode);
  c.what = std::string(transport_name(op_transport(opcode))) + " " + op.name;
  c.ip.v6 = i % 5 == 3;
  if (c.ip.v6) {
    for (int k = 0; k < 16; ++k) c.ip.src[k] = uint8_t(k == 0 ? 0xfd : 0x10 + k);  // fd11:1213:...
    for (int k = 0; k < 16; ++k) c.ip.dst[k] = uint8_t(k == 0 ? 0xfd : 0xf0 - k + i);
    c.ip.flow_label = 0xabcde - uint32_t(i);
    c.ip.tclass = uint8_t(0x68 + i);
  } else {
    gid_from_ipv4(c.ip.src, 0x0a4d0003);
    gid_from_ipv4(c.ip.dst, 0xc0a80000 + uint32_t(i));
    c.ip.tclass = uint8_t(i << 2);  // DSCP varies, ECN 0
    c.ip.ip_id = uint16_t(0xf000 + i);
    c.ip.df = i % 4 != 1;
  }
  c.ip.ttl = uint8_t(200 - i);
  c.ip.sport = uint16_t(0xc000 + i * 97);

  Bth& b = c.pkt.bth;
  b.opcode = opcode;
  b.se = i % 2 == 1;
  b.mig = i % 3 == 0;
  b.pkey = uint16_t(0xf000 | i);
  b.dest_qp = 0xfedcba - uint32_t(i) * 0x10101;
  b.ack_req = i % 3 != 2;
  b.psn = 0xffffff - uint32_t(i) * 3;  // the first few are right at the 24-bit wrap
  c.pkt.deth = {0x80010000u + uint32_t(i), 0xabcdef - uint32_t(i)};
  c.pkt.reth = {0xfedcba9876543210ull + (uint64_t(i) << 12), 0x80000000u | uint32_t(i * 0x1234567),
                0x80001000u + uint32_t(i)};
  c.pkt.atomic = {0xff00ee00dd00cc00ull + uint64_t(i) * 8, 0xc0000000u + uint32_t(i), 0x8877665544332211ull + i,
                  0xf0e1d2c3b4a59687ull ^ i};
  c.pkt.aeth = {syndrome, 0xfffff0u - uint32_t(i)};
  c.pkt.atomic_orig = 0xdeadbeefcafef00dull + i;
  c.pkt.imm = 0xabcdef00u | uint32_t(i);
  c.pkt.ieth_rkey = 0x97531000u + uint32_t(i);
  if (op.is(kPayload)) {
    // Lengths 0..3 modulo 4 so every pad count occurs; one empty payload.
    size_t n = i == 4 ? 0 : 17 + (i * 37) % 190;
    for (size_t k = 0; k < n; ++k) c.payload.push_back(uint8_t(0xa5 ^ (k * 7 + i)));
  }
  c.pkt.payload = c.payload.data();
  c.pkt.payload_len = uint32_t(c.payload.size());
  b.pad = pad_for(c.pkt.payload_len);

  // Build with the code under test: IP/UDP, transport headers, payload, zero pad, ICRC.
  size_t roce_len = op.hdr_len + c.payload.size() + b.pad + kIcrcSize;
  c.frame.assign(kIpv6HeaderSize + kUdpHeaderSize + roce_len, 0);
  size_t n = write_ip_udp(c.ip, roce_len, c.frame.data());
  size_t h = write_transport_headers(c.pkt, c.frame.data() + n);
  EXPECT_EQ(h, op.hdr_len) << c.what;
  if (!c.payload.empty()) std::memcpy(c.frame.data() + n + h, c.payload.data(), c.payload.size());
  c.frame.resize(n + roce_len);
  store_icrc(c.frame.data() + c.frame.size() - kIcrcSize, icrc_of_frame(c.frame.data(), c.frame.size() - kIcrcSize));
  return c;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int opcode = 0; opcode < 256; ++opcode) {
    if (!op_valid(uint8_t(opcode))) continue;
    cases.push_back(make_case(cases.size(), uint8_t(opcode), syndrome_ack()));
  }
  // Every kind of AETH syndrome, on ACKNOWLEDGE, plus a NAK on a READ response and ATOMIC_ACK.
  const uint8_t syndromes[] = {syndrome_ack(0),
                               syndrome_ack(17),
                               syndrome_rnr(0),
                               syndrome_rnr(12),
                               syndrome_rnr(31),
                               syndrome_nak(NakCode::psn_seq_error),
                               syndrome_nak(NakCode::invalid_request),
                               syndrome_nak(NakCode::remote_access_error),
                               syndrome_nak(NakCode::remote_operational_error),
                               syndrome_nak(NakCode::invalid_rd_request)};
  for (uint8_t s : syndromes) cases.push_back(make_case(cases.size(), kAcknowledge, s));
  cases.push_back(make_case(cases.size(), kReadRespOnly, syndrome_ack(3)));
  cases.push_back(make_case(cases.size(), kAtomicAcknowledge, syndrome_nak(NakCode::remote_access_error)));
  return cases;
}

void put32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put16(std::string& s, uint16_t v) { s.append(reinterpret_cast<const char*>(&v), 2); }

// Classic pcap, Ethernet link type, host byte order (the magic number tells readers which).
std::string pcap_file(const std::vector<Case>& cases) {
  std::string s;
  put32(s, 0xa1b2c3d4);
  put16(s, 2);
  put16(s, 4);
  put32(s, 0);
  put32(s, 0);
  put32(s, 65535);
  put32(s, 1);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& f = cases[i].frame;
    std::string eth = {0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
    eth += cases[i].ip.v6 ? std::string("\x86\xdd", 2) : std::string("\x08\x00", 2);
    put32(s, 1700000000 + uint32_t(i));
    put32(s, 0);
    put32(s, uint32_t(eth.size() + f.size()));
    put32(s, uint32_t(eth.size() + f.size()));
    s += eth;
    s.append(reinterpret_cast<const char*>(f.data()), f.size());
  }
  return s;
}

// The fields we ask tshark for, in column order.
const char* const kFields[] = {
    "frame.number",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.tver",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.syndrome.opcode",
    "infiniband.aeth.syndrome.credit_count",
    "infiniband.aeth.syndrome.timer",
    "infiniband.aeth.syndrome.error_code",
    "infiniband.aeth.msn",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.invariant.crc",
    "data.data",
    "ip.len",
    "ip.dsfield",
    "ip.ttl",
    "ip.id",
    "ip.flags.df",
    "ip.checksum.status",
    "ipv6.plen",
    "ipv6.tclass",
    "ipv6.flow",
    "ipv6.hlim",
    "udp.srcport",
    "udp.dstport",
    "udp.length",
    "infiniband.vendor",
    "_ws.malformed",
};

std::vector<std::map<std::string, std::string>> run_tshark(const std::string& pcap, std::string* err) {
  std::string cmd = "tshark -n -r '" + pcap + "' -o ip.check_checksum:TRUE -T fields -E occurrence=a -E aggregator=,";
  cmd += melon::test::tshark_plain_payloads();  // our made-up payloads shown as plain data
  for (const char* f : kFields) cmd += std::string(" -e ") + f;
  cmd += " 2>&1";
  std::vector<std::map<std::string, std::string>> rows;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return rows;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("Running as user") != std::string::npos) continue;  // tshark's note when run as root
    std::map<std::string, std::string> row;
    std::istringstream cols(line);
    std::string col;
    size_t k = 0;
    while (k < std::size(kFields)) {
      if (!std::getline(cols, col, '\t')) col.clear();
      // A field that occurs more than once: the first, except for vendor data, where Wireshark 4.0
      // shows a short piece first and then everything after the BTH.
      size_t comma = std::string(kFields[k]) == "infiniband.vendor" ? col.rfind(',') : col.find(',');
      if (comma != std::string::npos)
        col = std::string(kFields[k]) == "infiniband.vendor" ? col.substr(comma + 1) : col.substr(0, comma);
      row[kFields[k++]] = col;
    }
    rows.push_back(row);
  }
  if (rc != 0) *err = "tshark exit status " + std::to_string(rc) + ": " + out;
  return rows;
}

// tshark prints integers in decimal or 0x-hex depending on the field, booleans as 1/0 or True/False.
std::string num(const std::string& s) {
  if (s.empty()) return "";
  if (s == "True") return "1";
  if (s == "False") return "0";
  char* end;
  unsigned long long v = strtoull(s.c_str(), &end, 0);
  if (*end) return "unparsable '" + s + "'";
  return std::to_string(v);
}
std::string dec(uint64_t v) { return std::to_string(v); }
std::string hex_bytes(const uint8_t* p, size_t n) {
  static const char d[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}
std::string hex_be32(uint32_t v) {
  uint8_t b[4] = {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
  return hex_bytes(b, 4);
}
std::string bytes_field(std::string s) {
  std::string o;
  for (char ch : s)
    if (ch != ':') o += char(tolower(ch));
  return o;
}

// The ICRC computed independently of icrc.cpp: the plain table CRC over the masked bytes the
// annex lists (8 x 0xff, IP with variant fields set to ones, UDP checksum ones, BTH resv8a ones).
uint32_t independent_icrc(const Case& c) {
  std::vector<uint8_t> m(c.frame.begin(), c.frame.end() - kIcrcSize);
  size_t ip = c.ip.v6 ? kIpv6HeaderSize : kIpv4HeaderSize;
  if (c.ip.v6) {
    m[0] |= 0x0f;
    m[1] = m[2] = m[3] = 0xff;
    m[7] = 0xff;
  } else {
    m[1] = m[8] = m[10] = m[11] = 0xff;
  }
  m[ip + 6] = m[ip + 7] = 0xff;
  m[ip + kUdpHeaderSize + 4] = 0xff;
  uint8_t ff[8];
  std::memset(ff, 0xff, sizeof ff);
  return crc32_table_update(crc32_table_update(0, ff, 8), m.data(), m.size());
}

// What tshark should show for this packet, field by field ("" = absent).
std::map<std::string, std::string> expected(const Case& c, size_t frame_no) {
  const Packet& p = c.pkt;
  const OpInfo& op = p.info();
  std::map<std::string, std::string> e;
  for (const char* f : kFields) e[f] = "";
  e["frame.number"] = dec(frame_no);
  e["infiniband.bth.opcode"] = dec(p.bth.opcode);
  e["infiniband.bth.se"] = dec(p.bth.se);
  e["infiniband.bth.m"] = dec(p.bth.mig);
  e["infiniband.bth.padcnt"] = dec(pad_for(p.payload_len));
  e["infiniband.bth.tver"] = "0";
  e["infiniband.bth.p_key"] = dec(p.bth.pkey);
  e["infiniband.bth.destqp"] = dec(p.bth.dest_qp);
  e["infiniband.bth.a"] = dec(p.bth.ack_req);
  e["infiniband.bth.psn"] = dec(p.bth.psn);
  if (op.has(kDeth)) {
    e["infiniband.deth.q_key"] = dec(p.deth.qkey);
    e["infiniband.deth.srcqp"] = dec(p.deth.src_qp);
  }
  if (op.has(kReth)) {
    e["infiniband.reth.va"] = dec(p.reth.va);
    e["infiniband.reth.r_key"] = dec(p.reth.rkey);
    e["infiniband.reth.dmalen"] = dec(p.reth.dma_len);
  }
  if (op.has(kAtomicEth)) {  // Wireshark shows AtomicETH's VA and R_Key with RETH's field names
    e["infiniband.reth.va"] = dec(p.atomic.va);
    e["infiniband.reth.r_key"] = dec(p.atomic.rkey);
    e["infiniband.atomiceth.swapdt"] = dec(p.atomic.swap_add);
    e["infiniband.atomiceth.cmpdt"] = dec(p.atomic.compare);
  }
  if (op.has(kAeth)) {
    uint8_t s = p.aeth.syndrome;
    e["infiniband.aeth.syndrome"] = dec(s);
    e["infiniband.aeth.syndrome.opcode"] = dec(uint8_t(syndrome_type(s)));
    const char* sub = syndrome_type(s) == AckType::ack       ? "infiniband.aeth.syndrome.credit_count"
                      : syndrome_type(s) == AckType::rnr_nak ? "infiniband.aeth.syndrome.timer"
                                                             : "infiniband.aeth.syndrome.error_code";
    e[sub] = dec(syndrome_value(s));
    e["infiniband.aeth.msn"] = dec(p.aeth.msn);
  }
  if (op.has(kAtomicAckEth)) e["infiniband.atomicacketh.origremdt"] = dec(p.atomic_orig);
  if (op.has(kImmDt)) e["infiniband.immdt"] = hex_be32(p.imm);
  if (op.has(kIeth)) e["infiniband.ieth"] = hex_be32(p.ieth_rkey);
  // tshark reads the 4 ICRC bytes as a big-endian number; we (and Linux) store it LSB first.
  e["infiniband.invariant.crc"] = dec(__builtin_bswap32(independent_icrc(c)));
  if (!c.payload.empty()) {
    std::vector<uint8_t> d = c.payload;
    d.resize(d.size() + pad_for(p.payload_len), 0);
    e["data.data"] = hex_bytes(d.data(), d.size());
  }
  size_t roce_len = op.hdr_len + c.payload.size() + pad_for(p.payload_len) + kIcrcSize;
  if (c.ip.v6) {
    e["ipv6.plen"] = dec(kUdpHeaderSize + roce_len);
    e["ipv6.tclass"] = dec(c.ip.tclass);
    e["ipv6.flow"] = dec(c.ip.flow_label);
    e["ipv6.hlim"] = dec(c.ip.ttl);
  } else {
    e["ip.len"] = dec(kIpv4HeaderSize + kUdpHeaderSize + roce_len);
    e["ip.dsfield"] = dec(c.ip.tclass);
    e["ip.ttl"] = dec(c.ip.ttl);
    e["ip.id"] = dec(c.ip.ip_id);
    e["ip.flags.df"] = dec(c.ip.df);
    e["ip.checksum.status"] = "1";  // good
  }
  e["udp.srcport"] = dec(c.ip.sport);
  e["udp.dstport"] = dec(kRoceV2Port);
  e["udp.length"] = dec(kUdpHeaderSize + roce_len);
  return e;
}

bool have_tshark() { return system("command -v tshark >/dev/null 2>&1") == 0; }

std::string temp_pcap() {
  std::string path = testing::TempDir() + "melon_tshark_XXXXXX.pcap";
  int fd = mkstemps(path.data(), 5);
  if (fd >= 0) close(fd);
  return path;
}

}  // namespace

TEST(Tshark, EveryOpcodeAndSyndromeDecodesToTheFieldsWeMeant) {
  if (!have_tshark()) GTEST_SKIP() << "tshark is not installed (apt-get install tshark; ./melon deps)";
  std::vector<Case> cases = all_cases();
  size_t v6 = 0;
  for (const auto& c : cases) v6 += c.ip.v6;
  ASSERT_EQ(cases.size(), 23u + 12u + 2u + 1u + 12u);  // RC, UC, UD opcodes, CNP, then the AETH extras
  ASSERT_GE(v6, 5u);

  std::string path = temp_pcap();
  std::ofstream(path, std::ios::binary) << pcap_file(cases);
  std::string err;
  auto rows = run_tshark(path, &err);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_EQ(rows.size(), cases.size()) << "tshark decoded a different number of frames from " << path;

  size_t mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto want = expected(c, i + 1);
    if (c.pkt.info().is(kCnp) && !rows[i]["infiniband.vendor"].empty()) {
      // Wireshark 4.0 does not know CNP (opcode 0x81): it shows everything after the BTH as
      // vendor data. That must then be the 16 reserved zero bytes and the ICRC as we stored it.
      const uint8_t* rest = c.frame.data() + c.frame.size() - 16 - kIcrcSize;
      want["infiniband.vendor"] = std::string(32, '0') + hex_bytes(c.frame.data() + c.frame.size() - kIcrcSize, 4);
      want["infiniband.invariant.crc"] = "";
      EXPECT_EQ(load_icrc(rest + 16), independent_icrc(c));
    }
    for (const char* f : kFields) {
      std::string got = rows[i][f];
      std::string f_s = f;
      bool bytes =
          f_s == "infiniband.immdt" || f_s == "infiniband.ieth" || f_s == "data.data" || f_s == "infiniband.vendor";
      got = bytes ? bytes_field(got) : f_s == "_ws.malformed" ? got : num(got);
      if (got != want[f]) {
        ++mismatches;
        ADD_FAILURE() << "frame " << i + 1 << " (" << c.what << ", opcode 0x" << std::hex << int(c.pkt.bth.opcode)
                      << std::dec << (c.ip.v6 ? ", IPv6" : ", IPv4") << "): " << f << " is '" << got << "', we meant '"
                      << want[f] << "'";
      }
    }
  }
  if (mismatches == 0)
    unlink(path.c_str());
  else
    ADD_FAILURE() << "pcap kept for inspection: " << path;
}

// The oracle itself must be able to disagree: a packet whose RETH we damage after building is
// decoded with the damaged value, so the comparison above would catch a builder that wrote it so.
TEST(Tshark, DetectsAFieldWrittenWrong) {
  if (!have_tshark()) GTEST_SKIP() << "tshark is not installed (apt-get install tshark; ./melon deps)";
  std::vector<Case> cases = {make_case(0, make_opcode(Transport::rc, kWriteOnly), syndrome_ack())};
  Case& c = cases[0];
  size_t reth = kIpv4HeaderSize + kUdpHeaderSize + c.pkt.info().offset_of(kReth);
  c.frame[reth + 8] ^= 0x01;  // R_Key's top byte
  std::string path = temp_pcap();
  std::ofstream(path, std::ios::binary) << pcap_file(cases);
  std::string err;
  auto rows = run_tshark(path, &err);
  unlink(path.c_str());
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_EQ(rows.size(), 1u);
  auto want = expected(c, 1);
  EXPECT_NE(num(rows[0]["infiniband.reth.r_key"]), want["infiniband.reth.r_key"]);
  EXPECT_EQ(num(rows[0]["infiniband.reth.r_key"]), dec(c.pkt.reth.rkey ^ 0x01000000u));
  EXPECT_EQ(num(rows[0]["infiniband.reth.va"]), want["infiniband.reth.va"]);
}
