// How rdma_cm addresses IP endpoints over the IB CM (IBA Annex A11, "RDMA IP CM Service"): the
// service ID names the port space and destination port, and the first 36 bytes of a REQ's or
// SIDR_REQ's private data carry both IP addresses and the source port. Linux's rdma_cm and
// rdma-core's librdmacm use this layout; an IPv4 address sits in the last 4 of its 16 bytes.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

namespace melon::cm {

constexpr uint64_t kIpServicePrefix = 0x0000000001000000ull;  // Annex A11: 00..00 01 PP pppp
constexpr size_t kIpCmHeaderSize = 36;

// Service ID of (port space, port): RDMA_PS_TCP 0x0106 and port 7174 give 0x0000000001061c06.
inline uint64_t ip_service_id(uint16_t port_space, uint16_t port) { return uint64_t(port_space) << 16 | port; }
inline uint16_t service_port_space(uint64_t sid) { return uint16_t(sid >> 16); }
inline uint16_t service_port(uint64_t sid) { return uint16_t(sid); }
// A service ID in the IP range (as opposed to an RDMA_PS_IB one chosen by the application).
inline bool is_ip_service(uint64_t sid) { return (sid >> 24) == 1; }

struct IpCmHeader {
  uint8_t major = 0, minor = 0;  // version 0.0
  uint8_t ip_version = 4;  // 4 or 6
  uint16_t src_port = 0;
  uint8_t src[16] = {}, dst[16] = {};  // IPv4: bytes 12..15, the rest zero
};

inline void encode_ip_cm(const IpCmHeader& h, uint8_t out[kIpCmHeaderSize]) {
  out[0] = uint8_t(h.major << 4 | (h.minor & 0xf));
  out[1] = uint8_t(h.ip_version << 4);
  out[2] = uint8_t(h.src_port >> 8);
  out[3] = uint8_t(h.src_port);
  memcpy(out + 4, h.src, 16);
  memcpy(out + 20, h.dst, 16);
}

// False if the header is not version 0 with IP version 4 or 6 (the REQ then is not rdma_cm's).
inline bool decode_ip_cm(const uint8_t* in, size_t len, IpCmHeader* h) {
  if (len < kIpCmHeaderSize) return false;
  h->major = in[0] >> 4;
  h->minor = in[0] & 0xf;
  h->ip_version = in[1] >> 4;
  h->src_port = uint16_t(in[2] << 8 | in[3]);
  memcpy(h->src, in + 4, 16);
  memcpy(h->dst, in + 20, 16);
  return h->major == 0 && (h->ip_version == 4 || h->ip_version == 6);
}

}  // namespace melon::cm
