// libFuzzer target: arbitrary bytes into the RoCEv2 wire parsers (parse_ip_udp, parse_transport,
// icrc_frame_ok), with ASan/UBSan watching memory, and these invariants checked on every input:
//
//  1. A parsed packet's payload (plus pad and ICRC) lies exactly inside the bytes given, and an
//     opcode without payload has neither payload nor pad.
//  2. Re-serialising the parsed headers gives the input bytes back, except the bits the parser
//     deliberately ignores: BTH reserved bits (byte 4 below FECN/BECN, byte 8 below AckReq), the
//     DETH reserved byte, CNP's 16 reserved bytes, the IPv4 reserved flag bit and header checksum,
//     the UDP checksum. The pad count is compared only when payload + pad is 4-byte aligned,
//     because the builder derives the pad from the payload length.
//  3. parse -> build -> parse gives the same Packet and IpUdp, and the rebuilt frame (with the ICRC
//     our builder computes) passes icrc_frame_ok: we accept everything we send.
//  4. icrc_frame_ok agrees with an independent computation (the plain table CRC over the masked
//     bytes) for IPv4 without options and IPv6.
//
// Run: ./melon fuzz fuzz_roce_parse [seconds]
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <vector>

#include "roce/byte_order.h"
#include "roce/crc32.h"
#include "roce/icrc.h"
#include "roce/ip_udp.h"
#include "roce/packet.h"

using namespace melon::roce;

namespace {

[[noreturn]] void fail(const char* what) {
  fprintf(stderr, "fuzz_roce_parse: invariant broken: %s\n", what);
  abort();
}
#define CHECK(cond)           \
  do {                        \
    if (!(cond)) fail(#cond); \
  } while (0)

bool pad_aligned(const Packet& p) { return ((p.payload_len + p.bth.pad) & 3) == 0; }

// Every field the opcode's headers carry, plus the BTH.
bool same_packet(const Packet& a, const Packet& b, bool compare_pad) {
  const Bth &x = a.bth, &y = b.bth;
  if (x.opcode != y.opcode || x.se != y.se || x.mig != y.mig || x.tver != y.tver || x.pkey != y.pkey ||
      x.fecn != y.fecn || x.becn != y.becn || x.dest_qp != y.dest_qp || x.ack_req != y.ack_req || x.psn != y.psn)
    return false;
  if (compare_pad && x.pad != y.pad) return false;
  if (a.payload_len != b.payload_len) return false;
  if (a.payload_len && memcmp(a.payload, b.payload, a.payload_len) != 0) return false;
  const OpInfo& op = a.info();
  if (op.has(kDeth) && (a.deth.qkey != b.deth.qkey || a.deth.src_qp != b.deth.src_qp)) return false;
  if (op.has(kReth) && (a.reth.va != b.reth.va || a.reth.rkey != b.reth.rkey || a.reth.dma_len != b.reth.dma_len))
    return false;
  if (op.has(kAtomicEth) && (a.atomic.va != b.atomic.va || a.atomic.rkey != b.atomic.rkey ||
                             a.atomic.swap_add != b.atomic.swap_add || a.atomic.compare != b.atomic.compare))
    return false;
  if (op.has(kAeth) && (a.aeth.syndrome != b.aeth.syndrome || a.aeth.msn != b.aeth.msn)) return false;
  if (op.has(kAtomicAckEth) && a.atomic_orig != b.atomic_orig) return false;
  if (op.has(kImmDt) && a.imm != b.imm) return false;
  if (op.has(kIeth) && a.ieth_rkey != b.ieth_rkey) return false;
  return true;
}

bool same_ip_udp(const IpUdp& a, const IpUdp& b) {
  if (a.v6 != b.v6 || memcmp(a.src, b.src, 16) || memcmp(a.dst, b.dst, 16) || a.tclass != b.tclass || a.ttl != b.ttl ||
      a.sport != b.sport || a.dport != b.dport)
    return false;
  if (a.v6) return a.flow_label == b.flow_label;
  return a.ip_id == b.ip_id && a.df == b.df;
}

// Invariants 1 and 2 for a transport packet `p`, `len` bytes (BTH .. ICRC); returns the parse result.
ParseError check_transport(const uint8_t* p, size_t len, Packet& pkt) {
  ParseError e = parse_transport(p, len, pkt);
  if (e != ParseError::ok) return e;
  const OpInfo& op = pkt.info();
  CHECK(op_valid(pkt.bth.opcode));
  CHECK(pkt.payload == p + op.hdr_len);
  CHECK(size_t(op.hdr_len) + pkt.payload_len + pkt.bth.pad + kIcrcSize == len);
  if (!op.is(kPayload)) CHECK(pkt.payload_len == 0 && pkt.bth.pad == 0);

  uint8_t hdr[256];
  Packet q = pkt;
  CHECK(write_transport_headers(q, hdr) == op.hdr_len);
  uint8_t mask[256];
  memset(mask, 0xff, op.hdr_len);
  mask[4] = 0xc0;  // BTH resv6a: only FECN/BECN are read
  mask[8] = 0x80;  // BTH resv7: only AckReq is read
  if (!pad_aligned(pkt)) mask[1] = 0xcf;  // pad count: rebuilt from the length
  if (op.has(kDeth)) mask[op.offset_of(kDeth) + 4] = 0;  // DETH reserved byte
  if (op.has(kCnpPad)) memset(mask + op.offset_of(kCnpPad), 0, header_size(kCnpPad));
  for (size_t i = 0; i < op.hdr_len; ++i) CHECK(((hdr[i] ^ p[i]) & mask[i]) == 0);
  return e;
}

// The ICRC by the book, without icrc.cpp: table CRC over 8 x 0xff and the masked frame.
uint32_t independent_icrc(const uint8_t* ip, size_t ip_hdr, size_t len_without_icrc) {
  std::vector<uint8_t> m(ip, ip + len_without_icrc);
  if (ip_hdr == kIpv6HeaderSize) {
    m[0] |= 0x0f;
    m[1] = m[2] = m[3] = 0xff;
    m[7] = 0xff;
  } else {
    m[1] = m[8] = m[10] = m[11] = 0xff;
  }
  m[ip_hdr + 6] = m[ip_hdr + 7] = 0xff;
  m[ip_hdr + kUdpHeaderSize + 4] = 0xff;
  static const uint8_t ff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  return crc32_table_update(crc32_table_update(0, ff, 8), m.data(), m.size());
}

void check_frame(const uint8_t* data, size_t size) {
  IpUdp iu;
  ParseError e = parse_ip_udp(data, size, iu);
  bool icrc_ok = icrc_frame_ok(data, size);
  if (e != ParseError::ok) {
    CHECK(!icrc_ok);
    return;
  }
  size_t ip_hdr = iu.hdr_len - kUdpHeaderSize;
  CHECK(iu.hdr_len <= size && iu.udp_len >= kUdpHeaderSize);
  size_t roce_len = iu.udp_len - kUdpHeaderSize;
  CHECK(iu.hdr_len + roce_len <= size);
  const uint8_t* bth = data + iu.hdr_len;

  // Invariant 4.
  if (roce_len >= kBthSize + kIcrcSize && (iu.v6 || ip_hdr == kIpv4HeaderSize)) {
    size_t end = iu.hdr_len + roce_len;
    bool ok = independent_icrc(data, ip_hdr, end - kIcrcSize) == load_icrc(data + end - kIcrcSize);
    CHECK(ok == icrc_ok);
  }
  if (roce_len < kBthSize + kIcrcSize) CHECK(!icrc_ok);

  // Invariant 2 for IP/UDP: only IPv4 without options re-serialises to the same length.
  if (iu.v6 || ip_hdr == kIpv4HeaderSize) {
    uint8_t h[kIpv6HeaderSize + kUdpHeaderSize];
    CHECK(write_ip_udp(iu, roce_len, h) == iu.hdr_len);
    for (size_t i = 0; i < iu.hdr_len; ++i) {
      uint8_t m = 0xff;
      if (!iu.v6 && i == 6) m = 0x7f;  // IPv4 reserved flag bit
      if (!iu.v6 && (i == 10 || i == 11)) m = 0;  // IPv4 header checksum: not checked on receive
      if (i == ip_hdr + 6 || i == ip_hdr + 7) m = 0;  // UDP checksum: 0 on the wire, not checked
      CHECK(((h[i] ^ data[i]) & m) == 0);
    }
    if (!iu.v6) {  // and the IPv4 checksum we write is right
      uint32_t sum = 0;
      for (int i = 0; i < 20; i += 2) sum += load_be16(h + i);
      while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
      CHECK(sum == 0xffff);
    }
  }

  Packet pkt;
  if (check_transport(bth, roce_len, pkt) != ParseError::ok) return;

  // Invariant 3: build the whole frame again from what we parsed, then parse it back.
  const OpInfo& op = pkt.info();
  uint8_t pad = pad_for(pkt.payload_len);
  size_t new_roce = op.hdr_len + pkt.payload_len + pad + kIcrcSize;
  std::vector<uint8_t> out(kIpv6HeaderSize + kUdpHeaderSize + new_roce);
  size_t n = write_ip_udp(iu, new_roce, out.data());
  CHECK(n == (iu.v6 ? kIpv6HeaderSize : kIpv4HeaderSize) + kUdpHeaderSize);
  CHECK(write_transport_headers(pkt, out.data() + n) == op.hdr_len);
  memcpy(out.data() + n + op.hdr_len, pkt.payload, pkt.payload_len);
  memset(out.data() + n + op.hdr_len + pkt.payload_len, 0, pad);
  out.resize(n + new_roce);
  store_icrc(out.data() + out.size() - kIcrcSize, icrc_of_frame(out.data(), out.size() - kIcrcSize));

  IpUdp iu2;
  CHECK(parse_ip_udp(out.data(), out.size(), iu2) == ParseError::ok);
  CHECK(same_ip_udp(iu, iu2));
  CHECK(iu2.hdr_len == n && iu2.udp_len == kUdpHeaderSize + new_roce);
  CHECK(icrc_frame_ok(out.data(), out.size()));
  Packet pkt2;
  CHECK(parse_transport(out.data() + n, new_roce, pkt2) == ParseError::ok);
  CHECK(pkt2.bth.pad == pad);
  CHECK(same_packet(pkt, pkt2, pad_aligned(pkt)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into a heap block of exactly `size` bytes (a real, non-null block even when size is 0),
  // so ASan reports any read past the end.
  std::unique_ptr<uint8_t[]> buf(new uint8_t[size]);
  if (size) memcpy(buf.get(), data, size);
  const uint8_t* p = buf.get();
  check_frame(p, size);
  // The same bytes as a bare transport packet (BTH first), to reach the transport parser directly.
  Packet pkt;
  check_transport(p, size, pkt);
  return 0;
}
