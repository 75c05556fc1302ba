#include "roce/ip_udp.h"

#include <string.h>

#include "roce/byte_order.h"

namespace melon::roce {

namespace {
constexpr uint8_t kV4Prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
constexpr uint8_t kProtoUdp = 17;

uint16_t ipv4_checksum(const uint8_t* h) {
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += load_be16(h + i);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return uint16_t(~sum);
}

size_t write_ip(const IpUdp& h, size_t ip_payload_len, uint8_t* o) {
  if (!h.v6) {
    o[0] = 0x45;
    o[1] = h.tclass;
    store_be16(o + 2, uint16_t(kIpv4HeaderSize + ip_payload_len));
    store_be16(o + 4, h.ip_id);
    store_be16(o + 6, h.df ? 0x4000 : 0);
    o[8] = h.ttl;
    o[9] = kProtoUdp;
    store_be16(o + 10, 0);
    memcpy(o + 12, h.src + 12, 4);
    memcpy(o + 16, h.dst + 12, 4);
    store_be16(o + 10, ipv4_checksum(o));
    return kIpv4HeaderSize;
  }
  store_be32(o, 6u << 28 | uint32_t(h.tclass) << 20 | (h.flow_label & 0xfffff));
  store_be16(o + 4, uint16_t(ip_payload_len));
  o[6] = kProtoUdp;
  o[7] = h.ttl;
  memcpy(o + 8, h.src, 16);
  memcpy(o + 24, h.dst, 16);
  return kIpv6HeaderSize;
}
}  // namespace

bool gid_is_v4_mapped(const uint8_t gid[16]) { return memcmp(gid, kV4Prefix, 12) == 0; }

void gid_from_ipv4(uint8_t gid[16], uint32_t addr) {
  memcpy(gid, kV4Prefix, 12);
  store_be32(gid + 12, addr);
}

uint32_t gid_to_ipv4(const uint8_t gid[16]) { return load_be32(gid + 12); }

ParseError parse_ip_udp(const uint8_t* p, size_t len, IpUdp& out) {
  if (len < 1) return ParseError::too_short;
  size_t ip_len, total;
  if ((p[0] >> 4) == 4) {
    if (len < kIpv4HeaderSize) return ParseError::too_short;
    ip_len = size_t(p[0] & 0xf) * 4;
    if (ip_len != kIpv4HeaderSize) return ParseError::bad_ip;  // RoCEv2 never carries IPv4 options
    if (len < ip_len + kUdpHeaderSize) return ParseError::bad_ip;
    if (p[9] != kProtoUdp) return ParseError::bad_ip;
    if (load_be16(p + 6) & 0x3fff) return ParseError::bad_ip;  // fragments never carry RoCE
    total = load_be16(p + 2);
    out.v6 = false;
    out.tclass = p[1];
    out.ip_id = load_be16(p + 4);
    out.df = load_be16(p + 6) & 0x4000;
    out.ttl = p[8];
    gid_from_ipv4(out.src, load_be32(p + 12));
    gid_from_ipv4(out.dst, load_be32(p + 16));
  } else if ((p[0] >> 4) == 6) {
    if (len < kIpv6HeaderSize + kUdpHeaderSize) return ParseError::too_short;
    if (p[6] != kProtoUdp) return ParseError::bad_ip;  // no extension headers on RoCEv2
    ip_len = kIpv6HeaderSize;
    total = kIpv6HeaderSize + load_be16(p + 4);
    uint32_t w = load_be32(p);
    out.v6 = true;
    out.tclass = uint8_t(w >> 20);
    out.flow_label = w & 0xfffff;
    out.ttl = p[7];
    memcpy(out.src, p + 8, 16);
    memcpy(out.dst, p + 24, 16);
  } else {
    return ParseError::bad_ip;
  }
  if (total > len || total < ip_len + kUdpHeaderSize) return ParseError::bad_ip;
  const uint8_t* u = p + ip_len;
  out.sport = load_be16(u);
  out.dport = load_be16(u + 2);
  out.udp_len = load_be16(u + 4);
  if (out.udp_len != total - ip_len) return ParseError::bad_udp;
  if (out.dport != kRoceV2Port) return ParseError::bad_udp;
  out.hdr_len = uint8_t(ip_len + kUdpHeaderSize);
  return ParseError::ok;
}

size_t write_ip_udp(const IpUdp& h, size_t roce_len, uint8_t* out) {
  size_t udp_len = kUdpHeaderSize + roce_len;
  size_t n = write_ip(h, udp_len, out);
  uint8_t* u = out + n;
  store_be16(u, h.sport);
  store_be16(u + 2, h.dport);
  store_be16(u + 4, uint16_t(udp_len));
  store_be16(u + 6, 0);
  return n + kUdpHeaderSize;
}

void write_ud_grh(const IpUdp& h, size_t roce_len, uint8_t out[kGrhSize]) {
  if (h.v6) {
    write_ip(h, kUdpHeaderSize + roce_len, out);
    return;
  }
  memset(out, 0, kGrhSize - kIpv4HeaderSize);
  write_ip(h, kUdpHeaderSize + roce_len, out + kGrhSize - kIpv4HeaderSize);
}

}  // namespace melon::roce
