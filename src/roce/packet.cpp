#include "roce/packet.h"

#include <string.h>

#include "roce/byte_order.h"

namespace melon::roce {

const char* parse_error_name(ParseError e) {
  switch (e) {
    case ParseError::ok: return "ok";
    case ParseError::too_short: return "too short";
    case ParseError::bad_opcode: return "bad opcode";
    case ParseError::bad_version: return "bad transport version";
    case ParseError::bad_pad: return "bad pad count";
    case ParseError::bad_ip: return "bad IP header";
    case ParseError::bad_udp: return "bad UDP header";
    case ParseError::bad_length: return "bad length";
    case ParseError::bad_icrc: return "bad ICRC";
  }
  return "?";
}

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::rc: return "RC";
    case Transport::uc: return "UC";
    case Transport::rd: return "RD";
    case Transport::ud: return "UD";
    case Transport::cnp: return "CNP";
  }
  return "?";
}

ParseError parse_transport(const uint8_t* p, size_t len, Packet& out) {
  if (len < kBthSize + kIcrcSize) return ParseError::too_short;
  Bth& b = out.bth;
  b.opcode = p[0];
  b.se = p[1] & 0x80;
  b.mig = p[1] & 0x40;
  b.pad = (p[1] >> 4) & 3;
  b.tver = p[1] & 0xf;
  b.pkey = load_be16(p + 2);
  b.fecn = p[4] & 0x80;
  b.becn = p[4] & 0x40;
  b.dest_qp = load_be24(p + 5);
  b.ack_req = p[8] & 0x80;
  b.psn = load_be24(p + 9);

  if (!op_valid(b.opcode)) return ParseError::bad_opcode;
  if (b.tver != 0) return ParseError::bad_version;
  const OpInfo& op = op_info(b.opcode);
  if (len < size_t(op.hdr_len) + kIcrcSize + b.pad) return ParseError::too_short;
  if (len & 3) return ParseError::bad_length;  // headers, payload + pad and ICRC are all 4-byte multiples
  if (b.pad && !op.is(kPayload)) return ParseError::bad_pad;

  if (op.has(kDeth)) {
    const uint8_t* h = p + op.offset_of(kDeth);
    out.deth.qkey = load_be32(h);
    out.deth.src_qp = load_be24(h + 5);
  }
  if (op.has(kReth)) {
    const uint8_t* h = p + op.offset_of(kReth);
    out.reth.va = load_be64(h);
    out.reth.rkey = load_be32(h + 8);
    out.reth.dma_len = load_be32(h + 12);
  }
  if (op.has(kAtomicEth)) {
    const uint8_t* h = p + op.offset_of(kAtomicEth);
    out.atomic.va = load_be64(h);
    out.atomic.rkey = load_be32(h + 8);
    out.atomic.swap_add = load_be64(h + 12);
    out.atomic.compare = load_be64(h + 20);
  }
  if (op.has(kAeth)) {
    const uint8_t* h = p + op.offset_of(kAeth);
    out.aeth.syndrome = h[0];
    out.aeth.msn = load_be24(h + 1);
  }
  if (op.has(kAtomicAckEth)) out.atomic_orig = load_be64(p + op.offset_of(kAtomicAckEth));
  if (op.has(kImmDt)) out.imm = load_be32(p + op.offset_of(kImmDt));
  if (op.has(kIeth)) out.ieth_rkey = load_be32(p + op.offset_of(kIeth));

  out.payload = p + op.hdr_len;
  out.payload_len = uint32_t(len - op.hdr_len - kIcrcSize - b.pad);
  if (out.payload_len && !op.is(kPayload)) return ParseError::bad_length;
  return ParseError::ok;
}

size_t write_transport_headers(const Packet& pkt, uint8_t* p) {
  const Bth& b = pkt.bth;
  if (!op_valid(b.opcode)) return 0;
  const OpInfo& op = op_info(b.opcode);
  p[0] = b.opcode;
  p[1] = uint8_t((b.se ? 0x80 : 0) | (b.mig ? 0x40 : 0) | pad_for(pkt.payload_len) << 4 | (b.tver & 0xf));
  store_be16(p + 2, b.pkey);
  p[4] = uint8_t((b.fecn ? 0x80 : 0) | (b.becn ? 0x40 : 0));
  store_be24(p + 5, b.dest_qp);
  p[8] = b.ack_req ? 0x80 : 0;
  store_be24(p + 9, b.psn);

  if (op.has(kDeth)) {
    uint8_t* h = p + op.offset_of(kDeth);
    store_be32(h, pkt.deth.qkey);
    h[4] = 0;
    store_be24(h + 5, pkt.deth.src_qp);
  }
  if (op.has(kReth)) {
    uint8_t* h = p + op.offset_of(kReth);
    store_be64(h, pkt.reth.va);
    store_be32(h + 8, pkt.reth.rkey);
    store_be32(h + 12, pkt.reth.dma_len);
  }
  if (op.has(kAtomicEth)) {
    uint8_t* h = p + op.offset_of(kAtomicEth);
    store_be64(h, pkt.atomic.va);
    store_be32(h + 8, pkt.atomic.rkey);
    store_be64(h + 12, pkt.atomic.swap_add);
    store_be64(h + 20, pkt.atomic.compare);
  }
  if (op.has(kAeth)) {
    uint8_t* h = p + op.offset_of(kAeth);
    h[0] = pkt.aeth.syndrome;
    store_be24(h + 1, pkt.aeth.msn);
  }
  if (op.has(kAtomicAckEth)) store_be64(p + op.offset_of(kAtomicAckEth), pkt.atomic_orig);
  if (op.has(kImmDt)) store_be32(p + op.offset_of(kImmDt), pkt.imm);
  if (op.has(kIeth)) store_be32(p + op.offset_of(kIeth), pkt.ieth_rkey);
  if (op.has(kCnpPad)) memset(p + op.offset_of(kCnpPad), 0, 16);
  return op.hdr_len;
}

}  // namespace melon::roce
