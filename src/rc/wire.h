// A transmitted packet's IP/UDP side, for roce/frame.h: addresses and IP fields from its address
// vector, and the engine's entropy UDP source port (from the flow label, as Linux and ConnectX do).
#pragma once
#include "rc/host.h"
#include "roce/ip_udp.h"

namespace melon::rc {

roce::IpUdp tx_ip(const TxPacket& tx);

}  // namespace melon::rc
