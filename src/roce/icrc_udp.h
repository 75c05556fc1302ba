// ICRC checks for hosts that receive RoCEv2 through a UDP socket. The socket hides the IPv4
// header, and one covered field is unknowable from it: the 16-bit identification, which Linux rxe
// increments per packet. The CRC is affine in that field, so instead of guessing we solve for it:
// the 32-bit ICRC difference against id = 0 determines the id uniquely, and the remaining 16 bits
// of the CRC are still checked. (IPv6 has no such field; its ICRC is checked in full.)
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "roce/ip_udp.h"

namespace melon::roce {

// `hdr` describes the IP and UDP headers as received (addresses, ports; ip_id and tclass/ttl are
// ignored since they are either solved for or masked). `roce` is the UDP payload, BTH .. ICRC.
// Returns true when some identification value (IPv4, DF set or clear) makes the ICRC right, and
// stores it in *ip_id. `likely_id` is tried first (one CRC instead of solving): a receiver that
// knows what the sender probably used passes it, e.g. a packet's index in a UDP GRO buffer, which is
// its identification when the buffer is one GSO send of a Linux sender (inet_gso_segment numbers the
// segments 0, 1, 2, ...). Any other id is still found; a wrong guess other than 0 costs one CRC.
bool icrc_check_udp_payload(const IpUdp& hdr, const uint8_t* roce, size_t len, uint16_t* ip_id, uint16_t likely_id = 0);

// The ICRC a sender puts after `roce` (BTH .. end of payload and pad, `len` bytes) for the given
// headers, including the IPv4 identification the kernel will use (0 for an unconnected socket
// with DF set on Linux).
uint32_t icrc_for_udp_payload(const IpUdp& hdr, const uint8_t* roce, size_t len);

}  // namespace melon::roce
