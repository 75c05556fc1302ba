// RoCEv2 transport packets: BTH and extended headers, decoded into one struct, parsed and built
// through the opcode table.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "roce/opcode.h"

namespace melon::roce {

struct Bth {
  uint8_t opcode = 0;
  bool se = false;  // solicited event
  bool mig = false;  // MigReq
  uint8_t pad = 0;  // pad count 0..3
  uint8_t tver = 0;  // transport header version; 0
  uint16_t pkey = 0xffff;
  bool fecn = false, becn = false;  // RoCEv2 reuses two of the reserved bits for ECN feedback
  uint32_t dest_qp = 0;  // 24 bits
  bool ack_req = false;
  uint32_t psn = 0;  // 24 bits
};

struct Reth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_len = 0;
};
struct Aeth {
  uint8_t syndrome = 0;
  uint32_t msn = 0;
};
struct AtomicEth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint64_t swap_add = 0;
  uint64_t compare = 0;
};
struct Deth {
  uint32_t qkey = 0;
  uint32_t src_qp = 0;
};

// One packet's transport part. Fields for headers the opcode does not carry are ignored.
struct Packet {
  Bth bth;
  Deth deth;
  Reth reth;
  AtomicEth atomic;
  Aeth aeth;
  uint64_t atomic_orig = 0;  // AtomicAckETH
  uint32_t imm = 0;  // ImmDt, host order (verbs hands it on in network order)
  uint32_t ieth_rkey = 0;  // IETH
  const uint8_t* payload = nullptr;
  uint32_t payload_len = 0;

  const OpInfo& info() const { return op_info(bth.opcode); }
};

enum class ParseError : uint8_t {
  ok = 0,
  too_short,  // shorter than BTH + headers + ICRC
  bad_opcode,  // reserved or unsupported opcode
  bad_version,  // BTH TVer != 0
  bad_pad,  // pad bytes on an opcode without payload
  bad_length,  // payload on an opcode without one, or a length not a multiple of 4
  bad_ip,  // IP header malformed, wrong version, or not UDP
  bad_udp,  // UDP length inconsistent or destination port not 4791
  bad_icrc,
};
const char* parse_error_name(ParseError e);

// Decodes a transport packet: `p` starts at the BTH, `len` counts up to and including the ICRC.
// Does not check the ICRC (that needs the IP header; see icrc.h). The payload points into `p`.
ParseError parse_transport(const uint8_t* p, size_t len, Packet& out);

// Bytes of BTH + extended headers for this opcode.
inline size_t transport_header_len(uint8_t opcode) { return op_info(opcode).hdr_len; }

// Pad count for a payload length: payload + pad is a multiple of 4 (IBA 9.2.3).
constexpr uint8_t pad_for(uint32_t payload_len) { return uint8_t((4 - (payload_len & 3)) & 3); }

// Writes BTH + extended headers for pkt.bth.opcode into `out` (which must hold
// transport_header_len(opcode) bytes). pkt.bth.pad is taken from pkt.payload_len.
// Returns the bytes written, or 0 for an invalid opcode.
size_t write_transport_headers(const Packet& pkt, uint8_t* out);

}  // namespace melon::roce
