#include "roce/icrc.h"

#include <string.h>

#include "roce/crc32.h"
#include "roce/ip_udp.h"
#include "roce/opcode.h"

namespace melon::roce {

namespace {
// CRC-32 state after the eight 0xff bytes that stand in for the LRH (rxe's 0xdebb20e3 seed is the
// same state before the final inversion).
constexpr uint32_t kAfterLrhStandIn = 0x2144df1c;

// Copies IP + UDP headers into `h` with the variant fields set to ones.
void mask_ip_udp(uint8_t* h, const uint8_t* ip_udp, size_t hdr_len) {
  memcpy(h, ip_udp, hdr_len);
  size_t udp;
  if ((h[0] >> 4) == 4) {
    h[1] = 0xff;  // TOS
    h[8] = 0xff;  // TTL
    h[10] = h[11] = 0xff;  // header checksum
    udp = size_t(h[0] & 0xf) * 4;
  } else {
    h[0] |= 0x0f;  // traffic class and flow label
    h[1] = h[2] = h[3] = 0xff;
    h[7] = 0xff;  // hop limit
    udp = kIpv6HeaderSize;
  }
  if (udp + kUdpHeaderSize <= hdr_len) h[udp + 6] = h[udp + 7] = 0xff;  // UDP checksum
}
}  // namespace

void Icrc::begin(const uint8_t* ip_udp, size_t hdr_len) {
  uint8_t h[kIpv6HeaderSize + kUdpHeaderSize];
  if (hdr_len > sizeof h) hdr_len = sizeof h;
  mask_ip_udp(h, ip_udp, hdr_len);
  crc_ = crc32_update(kAfterLrhStandIn, h, hdr_len);
}

void Icrc::add_bth(const uint8_t* bth) {
  uint8_t b[kBthSize];
  memcpy(b, bth, kBthSize);
  b[4] = 0xff;  // resv8a (holds FECN/BECN in RoCEv2)
  crc_ = crc32_update(crc_, b, kBthSize);
}

void Icrc::begin_with_bth(const uint8_t* ip_udp, size_t hdr_len, const uint8_t* bth) {
  // One CRC call for the masked headers: the per-packet cost dominates at small MTUs.
  uint8_t h[kIpv6HeaderSize + kUdpHeaderSize + kBthSize];
  if (hdr_len > kIpv6HeaderSize + kUdpHeaderSize) hdr_len = kIpv6HeaderSize + kUdpHeaderSize;
  mask_ip_udp(h, ip_udp, hdr_len);
  memcpy(h + hdr_len, bth, kBthSize);
  h[hdr_len + 4] = 0xff;
  crc_ = crc32_update(kAfterLrhStandIn, h, hdr_len + kBthSize);
}

void Icrc::add(const void* data, size_t len) { crc_ = crc32_update(crc_, data, len); }

uint32_t icrc_of_frame(const uint8_t* ip, size_t len) {
  size_t hdr = (ip[0] >> 4) == 4 ? size_t(ip[0] & 0xf) * 4 + kUdpHeaderSize : kIpv6HeaderSize + kUdpHeaderSize;
  Icrc c;
  c.begin_with_bth(ip, hdr, ip + hdr);
  c.add(ip + hdr + kBthSize, len - hdr - kBthSize);
  return c.value();
}

bool icrc_frame_ok(const uint8_t* ip, size_t len_with_icrc) {
  IpUdp h;
  if (parse_ip_udp(ip, len_with_icrc, h) != ParseError::ok) return false;
  size_t end = h.hdr_len + h.udp_len - kUdpHeaderSize;
  if (end < size_t(h.hdr_len) + kBthSize + kIcrcSize) return false;
  return icrc_of_frame(ip, end - kIcrcSize) == load_icrc(ip + end - kIcrcSize);
}

}  // namespace melon::roce
