// Runs freestanding code with no C++ runtime linked: returns nonzero if any check fails.
#include <string.h>

#include "roce/crc32.h"
#include "roce/icrc.h"
#include "roce/ip_udp.h"
#include "roce/packet.h"
#include "roce/psn.h"

using namespace melon::roce;

int main() {
  int failures = 0;
  // Standard CRC-32 check value.
  const char* digits = "123456789";
  if (crc32_update(0, digits, 9) != 0xcbf43926u) ++failures;
  if (crc32_table_update(0, digits, 9) != 0xcbf43926u) ++failures;
  if (psn_add(0xffffff, 2) != 1) ++failures;

  // Build an RC SEND_ONLY and check it round-trips with a valid ICRC.
  uint8_t frame[128];
  IpUdp ip;
  gid_from_ipv4(ip.src, 0x7f000002);
  gid_from_ipv4(ip.dst, 0x7f000003);
  Packet p;
  p.bth.opcode = make_opcode(Transport::rc, kSendOnly);
  p.bth.dest_qp = 0x12;
  p.bth.psn = 0xfffffe;
  p.payload_len = 5;
  size_t roce_len = transport_header_len(p.bth.opcode) + 8 + kIcrcSize;
  size_t n = write_ip_udp(ip, roce_len, frame);
  n += write_transport_headers(p, frame + n);
  memcpy(frame + n, "hello\0\0\0", 8);
  n += 8;
  store_icrc(frame + n, icrc_of_frame(frame, n));
  if (!icrc_frame_ok(frame, n + kIcrcSize)) ++failures;
  Packet q;
  if (parse_transport(frame + 28, roce_len, q) != ParseError::ok || q.payload_len != 5 || q.bth.psn != 0xfffffe)
    ++failures;
  return failures;
}
