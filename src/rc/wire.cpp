#include "rc/wire.h"

#include <string.h>

#include "roce/icrc.h"

namespace melon::rc {

using namespace roce;

size_t frame_size(const TxPacket& tx, bool v6) {
  return (v6 ? kIpv6HeaderSize : kIpv4HeaderSize) + kUdpHeaderSize + op_info(tx.pkt.bth.opcode).hdr_len +
         tx.payload_len + pad_for(tx.payload_len) + kIcrcSize;
}

size_t frame_from_tx(const TxPacket& tx, uint8_t* out) {
  IpUdp ip;
  const AddressVector& av = *tx.av;
  ip.v6 = !gid_is_v4_mapped(av.dgid);
  memcpy(ip.src, av.sgid, 16);
  memcpy(ip.dst, av.dgid, 16);
  ip.tclass = av.traffic_class;
  ip.ttl = av.hop_limit;
  ip.flow_label = av.flow_label;
  ip.sport = tx.udp_sport;
  const OpInfo& op = op_info(tx.pkt.bth.opcode);
  uint8_t pad = pad_for(tx.payload_len);
  size_t roce_len = op.hdr_len + tx.payload_len + pad + kIcrcSize;
  size_t n = write_ip_udp(ip, roce_len, out);
  size_t hdr_end = n;
  roce::Packet hdr = tx.pkt;
  hdr.payload_len = tx.payload_len;  // sets PadCnt
  n += write_transport_headers(hdr, out + n);
  for (int i = 0; i < tx.niov; ++i) {
    memcpy(out + n, tx.iov[i].ptr, tx.iov[i].len);
    n += tx.iov[i].len;
  }
  memset(out + n, 0, pad);
  n += pad;
  (void)hdr_end;
  store_icrc(out + n, icrc_of_frame(out, n));
  return n + kIcrcSize;
}

ParseError frame_to_rx(const uint8_t* frame, size_t len, IpUdp& ip, const uint8_t** roce, size_t* roce_len) {
  ParseError e = parse_ip_udp(frame, len, ip);
  if (e != ParseError::ok) return e;
  size_t rl = ip.udp_len - kUdpHeaderSize;
  if (rl < kBthSize + kIcrcSize) return ParseError::too_short;
  if (!icrc_frame_ok(frame, ip.hdr_len + rl)) return ParseError::bad_icrc;
  *roce = frame + ip.hdr_len;
  *roce_len = rl;
  return ParseError::ok;
}

}  // namespace melon::rc
