// Whole RoCEv2 frames (IP + UDP + transport + payload + ICRC) for hosts that carry IP themselves:
// the simulated link and the emulated ConnectX. The soft provider sends only the UDP payload but
// computes the same ICRC.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "rc/engine.h"

namespace melon::rc {

// Bytes frame_from_tx will write for this packet.
size_t frame_size(const TxPacket& tx, bool v6);

// Serialises `tx` (addresses from tx.av) into `out` (frame_size bytes). Returns the length.
size_t frame_from_tx(const TxPacket& tx, uint8_t* out);

// Checks IP/UDP and the ICRC of a received frame; on success sets `ip`, `roce` and `roce_len`
// (BTH .. ICRC) ready for Engine::receive.
roce::ParseError frame_to_rx(const uint8_t* frame, size_t len, roce::IpUdp& ip, const uint8_t** roce, size_t* roce_len);

}  // namespace melon::rc
