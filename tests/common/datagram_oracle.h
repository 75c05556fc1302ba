// An outside judge of what a RoCEv2 sender hands the kernel (issue 19): the datagrams the kernel
// forms from one send, and whether each is exactly one well-formed RoCE packet. Written from IBA
// 9.2-9.4, 9.7.7 and Annex A17 and the Linux UDP_SEGMENT rule, sharing no code with src/roce: the
// CRC is zlib's. Used by verbs_soft_datagram_test and, preloaded into stock tools,
// by wire_check_preload.cpp.
#pragma once
#include <stdint.h>
#include <sys/socket.h>

#include <string>
#include <vector>

namespace melon::test {

// A datagram as the kernel sends it: addresses, ports, IPv4 identification and the UDP payload.
struct Datagram {
  bool v6 = false;
  uint8_t src[16]{}, dst[16]{};
  uint16_t sport = 0, dport = 0, id = 0;
  uint32_t seg = 0;  // the send's UDP_SEGMENT (0: none)
  std::vector<uint8_t> bytes;
};

// The datagrams the kernel forms from message `h` sent on `fd` (an unconnected UDP socket): with a
// UDP_SEGMENT of s and more than s bytes, pieces of s bytes, the last shorter or equal, the i-th
// with IPv4 identification i (Linux inet_gso_segment; an unconnected DF socket starts at 0); else
// one datagram. Empty when `fd` or `h` is not UDP to an address.
std::vector<Datagram> kernel_datagrams(int fd, const msghdr& h);

// The ICRC `d` must end with (its last 4 bytes, little-endian on the wire) for the IP and UDP headers
// the kernel writes for it (DF set), summed by zlib over the fields IBA Annex A17 masks; 0 when
// it is shorter than a BTH and an ICRC.
uint32_t datagram_icrc(const Datagram& d);

// "" when `d` is one RoCE packet: its length agrees with its own headers and pad count, FIRST and
// MIDDLE carry exactly one path MTU (`mtu`; 0: any of 256..4096), LAST and ONLY at most one,
// requests for data and ACKs none, and its ICRC is right for the IP and UDP headers the kernel
// writes for it (DF set). Else what is wrong.
std::string check_datagram(const Datagram& d, uint32_t mtu);

// sendmmsg() through `real`, with each message's bytes first copied into a buffer of its own: the
// kernel sends that copy, so what the caller then judges (`judge(fd, copied msghdr)` for each sent
// message) is exactly what went out, even if the sender's memory changes meanwhile (a zero-copy
// payload the peer writes into, as perftest's latency tests do). Returns what `real` returned.
using SendmmsgFn = int (*)(int, struct mmsghdr*, unsigned, int);
int send_snapshot(SendmmsgFn real, int fd, struct mmsghdr* v, unsigned n, int flags,
                  void (*judge)(int fd, const msghdr& h));

// Ethernet frames of `ds` in a classic pcap file, for tshark.
void write_pcap(const std::string& path, const std::vector<Datagram>& ds);

}  // namespace melon::test
