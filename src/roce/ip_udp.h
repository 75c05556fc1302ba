// The IP and UDP headers that carry RoCEv2 (IBA annex A17): IPv4 or IPv6, UDP destination port 4791.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "roce/packet.h"

namespace melon::roce {

constexpr uint16_t kRoceV2Port = 4791;
constexpr size_t kIpv4HeaderSize = 20;
constexpr size_t kIpv6HeaderSize = 40;
constexpr size_t kUdpHeaderSize = 8;
constexpr size_t kGrhSize = 40;
// One UDP GSO send (Linux UDP_SEGMENT), as the soft provider and the emulated port make them: at
// most this many datagrams (UDP_MAX_SEGMENTS of Linux 4.18..6.0; 128 since), and all of them
// together at most the largest IPv4 UDP payload.
constexpr int kMaxGsoSegments = 64;
constexpr size_t kMaxGsoBytes = 65507;

// Addresses are held as 16-byte GIDs; IPv4 uses the IPv4-mapped form ::ffff:a.b.c.d (RoCEv2 GID).
struct IpUdp {
  bool v6 = false;
  uint8_t src[16] = {};
  uint8_t dst[16] = {};
  uint8_t tclass = 0;  // IPv4 TOS (DSCP/ECN) or IPv6 traffic class
  uint8_t ttl = 64;  // TTL or hop limit
  uint16_t ip_id = 0;  // IPv4 identification
  bool df = true;  // IPv4 don't-fragment
  uint32_t flow_label = 0;  // IPv6 flow label (20 bits)
  uint16_t sport = 0xc000;
  uint16_t dport = kRoceV2Port;
  uint16_t udp_len = 0;  // UDP header + payload, from the wire
  uint8_t hdr_len = 0;  // IP + UDP header bytes, from the wire
};

bool gid_is_v4_mapped(const uint8_t gid[16]);
void gid_from_ipv4(uint8_t gid[16], uint32_t addr_host_order);
uint32_t gid_to_ipv4(const uint8_t gid[16]);  // host order

// Decodes IP + UDP at `p` (`len` bytes available); checks version, IHL, protocol, lengths and the
// destination port. Sets hdr_len; the RoCE packet follows at p + hdr_len, udp_len - 8 bytes long.
ParseError parse_ip_udp(const uint8_t* p, size_t len, IpUdp& out);

// Writes IP + UDP headers for a RoCE packet of `roce_len` bytes (BTH .. ICRC). IPv4 gets a correct
// header checksum; the UDP checksum is 0 as rxe and ConnectX send it. Returns bytes written (28/48).
size_t write_ip_udp(const IpUdp& h, size_t roce_len, uint8_t* out);

// The 40-byte GRH a UD receive buffer starts with (IBA 11.4.1.2; RoCEv2: for IPv4 the first 20
// bytes are zero and the IPv4 header follows, as Linux rxe and mlx5 deliver it).
void write_ud_grh(const IpUdp& h, size_t roce_len, uint8_t out[kGrhSize]);

// RoCEv2 UDP source port convention (kernel rdma_get_udp_sport, rdma-core ibv_flow_label_to_udp_sport).
constexpr uint16_t udp_sport_for_flow_label(uint32_t fl) {
  return uint16_t(0xc000 | ((fl & 0x3fff) ^ ((fl & 0xfc000) >> 14)));
}
// Flow label a QP pair gets when the address vector leaves it 0 (kernel rdma_calc_flow_label).
constexpr uint32_t flow_label_for_qps(uint32_t lqpn, uint32_t rqpn) {
  uint64_t v = uint64_t(lqpn) * rqpn;
  v ^= v >> 20;
  v ^= v >> 40;
  return uint32_t(v & 0xfffff);
}
static_assert(udp_sport_for_flow_label(flow_label_for_qps(0x12, 0x12)) == 49476);  // rxe capture

}  // namespace melon::roce
