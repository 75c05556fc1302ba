// What one side of a host-kit Pair has put on its wire, decoded: the rc tests assert on packets
// (opcode, PSN, headers) without a second engine reading them for them.
#pragma once
#include <stdint.h>

#include <vector>

#include <gtest/gtest.h>

#include "common/host_kit.h"
#include "roce/opcode.h"
#include "roce/packet.h"

namespace melon::kit {

struct SeenPacket {
  roce::Packet pkt;
  uint8_t base_op = 0;  // the opcode's low five bits (roce::BaseOp)
  std::vector<uint8_t> payload;
};

// The frames `side` has queued and not yet delivered, in order. A frame that does not decode fails
// the calling test (the FrameWire already counts those as malformed; this says which).
inline std::vector<SeenPacket> seen(const Pair::Side& side) {
  std::vector<SeenPacket> out;
  for (const auto& f : side.wire.frames) {
    roce::IpUdp ip;
    const uint8_t* r = nullptr;
    size_t len = 0;
    SeenPacket s;
    if (roce::read_frame(f.data(), f.size(), ip, &r, &len) != roce::ParseError::ok ||
        roce::parse_transport(r, len, s.pkt) != roce::ParseError::ok) {
      ADD_FAILURE() << "a queued frame does not decode";
      continue;
    }
    s.base_op = s.pkt.bth.opcode & 0x1f;
    s.payload.assign(s.pkt.payload, s.pkt.payload + s.pkt.payload_len);
    s.pkt.payload = nullptr;  // points into the frame; the copy above is what stays valid
    out.push_back(std::move(s));
  }
  return out;
}

inline std::vector<uint8_t> base_ops(const std::vector<SeenPacket>& v) {
  std::vector<uint8_t> ops;
  for (const auto& s : v) ops.push_back(s.base_op);
  return ops;
}

}  // namespace melon::kit
