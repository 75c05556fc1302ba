// The one RoCEv2 frame writer (and reader). A packet is its IP/UDP description, its transport
// headers and a payload gathered from pieces; from that this builds either
//   - the whole frame (IP + UDP + BTH.. + payload + pad + ICRC), for hosts that carry IP themselves
//     (the simulation, the emulated ConnectX), or
//   - the parts around a zero-copy payload (transport headers in front, pad + ICRC behind), for a
//     host whose kernel writes IP and UDP (the soft provider's UDP socket).
// Both compute the ICRC over the same IP/UDP headers, so `ip` must say what the wire will carry:
// addresses, UDP source port (the engine's entropy port, or the socket's), IPv4 identification.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "roce/ip_udp.h"
#include "roce/packet.h"

namespace melon::roce {

// `len` bytes at `ptr`. No member initialisers: a TxPacket holds 64 of these, and zeroing them for
// every packet cost more than building its headers.
struct Span {
  uint8_t* ptr;
  uint32_t len;
};

constexpr size_t kMaxTransportHeader = 64;  // BTH + the largest set of extended headers, rounded up

// Bytes of the whole frame.
size_t frame_length(bool v6, uint8_t opcode, uint32_t payload_len);

// Writes the whole frame into `out` (frame_length bytes); `hdr.payload_len` is ignored (the
// pieces' total is the payload). Returns the length written.
size_t write_frame(const IpUdp& ip, const Packet& hdr, const Span* payload, int npieces, uint8_t* out);

// The bytes around a payload the caller sends by reference: what follows the UDP header is
// transport[0..transport_len) + the payload + tail[0..tail_len).
struct PayloadFrame {
  uint8_t transport[kMaxTransportHeader];
  uint8_t tail[3 + kIcrcSize];  // pad + ICRC
  uint8_t transport_len = 0;
  uint8_t tail_len = 0;
};
void write_payload_frame(const IpUdp& ip, const Packet& hdr, const Span* payload, int npieces, PayloadFrame& out);

// Checks IP/UDP and the ICRC of a received frame; on success sets `ip`, `roce` and `roce_len`
// (BTH .. ICRC).
ParseError read_frame(const uint8_t* frame, size_t len, IpUdp& ip, const uint8_t** roce, size_t* roce_len);

}  // namespace melon::roce
