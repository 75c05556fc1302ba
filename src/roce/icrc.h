// RoCEv2 invariant CRC (IBA annex A17.3.3). A CRC-32 over: eight 0xff bytes standing in for the LRH,
// the IP header with the fields routers may change set to all ones (IPv4 TOS, TTL, header checksum;
// IPv6 traffic class, flow label, hop limit), the UDP header with its checksum set to ones, the BTH
// with its reserved byte (the FECN/BECN bits' byte) set to ones, then everything up to the ICRC.
// On the wire the value is stored least significant byte first (as Linux rxe and ConnectX do).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace melon::roce {

class Icrc {
 public:
  // Starts with the IP + UDP headers (28 bytes for IPv4, 48 for IPv6).
  void begin(const uint8_t* ip_udp, size_t hdr_len);
  // The BTH, masked; then add() the extended headers and payload (including pad bytes).
  void add_bth(const uint8_t* bth);
  // begin() and add_bth() in one step (faster: one CRC call for all masked headers).
  void begin_with_bth(const uint8_t* ip_udp, size_t hdr_len, const uint8_t* bth);
  void add(const void* data, size_t len);
  uint32_t value() const { return crc_; }

 private:
  uint32_t crc_ = 0;
};

// ICRC of a whole packet starting at its IP header; `len` stops before the ICRC.
uint32_t icrc_of_frame(const uint8_t* ip, size_t len);
// True when the 4 bytes after `len` hold the right ICRC.
bool icrc_frame_ok(const uint8_t* ip, size_t len_with_icrc);

inline void store_icrc(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
  p[2] = uint8_t(v >> 16);
  p[3] = uint8_t(v >> 24);
}
inline uint32_t load_icrc(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

}  // namespace melon::roce
