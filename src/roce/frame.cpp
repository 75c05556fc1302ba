#include "roce/frame.h"

#include <string.h>

#include "roce/icrc.h"

namespace melon::roce {

namespace {

uint32_t total_of(const Span* payload, int n) {
  uint32_t t = 0;
  for (int i = 0; i < n; ++i) t += payload[i].len;
  return t;
}

// IP/UDP headers for a RoCE packet whose BTH.. part is `roce_len` bytes; returns their length.
size_t write_headers(const IpUdp& ip, const Packet& hdr, uint32_t payload_len, uint8_t* ip_udp, uint8_t* transport,
                     size_t* transport_len) {
  Packet h = hdr;
  h.payload_len = payload_len;  // sets PadCnt
  *transport_len = write_transport_headers(h, transport);
  return write_ip_udp(ip, *transport_len + payload_len + pad_for(payload_len) + kIcrcSize, ip_udp);
}

}  // namespace

size_t frame_length(bool v6, uint8_t opcode, uint32_t payload_len) {
  return (v6 ? kIpv6HeaderSize : kIpv4HeaderSize) + kUdpHeaderSize + transport_header_len(opcode) + payload_len +
         pad_for(payload_len) + kIcrcSize;
}

size_t write_frame(const IpUdp& ip, const Packet& hdr, const Span* payload, int npieces, uint8_t* out) {
  uint32_t payload_len = total_of(payload, npieces);
  uint8_t transport[kMaxTransportHeader];
  size_t tlen = 0;
  size_t n = write_headers(ip, hdr, payload_len, out, transport, &tlen);
  memcpy(out + n, transport, tlen);
  n += tlen;
  for (int i = 0; i < npieces; ++i) {
    if (payload[i].len) memcpy(out + n, payload[i].ptr, payload[i].len);
    n += payload[i].len;
  }
  uint8_t pad = pad_for(payload_len);
  memset(out + n, 0, pad);
  n += pad;
  store_icrc(out + n, icrc_of_frame(out, n));
  return n + kIcrcSize;
}

void write_payload_frame(const IpUdp& ip, const Packet& hdr, const Span* payload, int npieces, PayloadFrame& out) {
  uint32_t payload_len = total_of(payload, npieces);
  uint8_t ip_udp[kIpv6HeaderSize + kUdpHeaderSize];
  size_t tlen = 0;
  size_t ipl = write_headers(ip, hdr, payload_len, ip_udp, out.transport, &tlen);
  out.transport_len = uint8_t(tlen);
  Icrc c;
  c.begin_with_bth(ip_udp, ipl, out.transport);
  c.add(out.transport + kBthSize, tlen - kBthSize);
  for (int i = 0; i < npieces; ++i) c.add(payload[i].ptr, payload[i].len);
  uint8_t pad = pad_for(payload_len);
  memset(out.tail, 0, pad);
  c.add(out.tail, pad);
  store_icrc(out.tail + pad, c.value());
  out.tail_len = uint8_t(pad + kIcrcSize);
}

ParseError read_frame(const uint8_t* frame, size_t len, IpUdp& ip, const uint8_t** roce, size_t* roce_len) {
  ParseError e = parse_ip_udp(frame, len, ip);
  if (e != ParseError::ok) return e;
  size_t rl = ip.udp_len - kUdpHeaderSize;
  if (rl < kBthSize + kIcrcSize) return ParseError::too_short;
  if (!icrc_frame_ok(frame, ip.hdr_len + rl)) return ParseError::bad_icrc;
  *roce = frame + ip.hdr_len;
  *roce_len = rl;
  return ParseError::ok;
}

}  // namespace melon::roce
