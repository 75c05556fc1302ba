// libFuzzer target: arbitrary bytes into the CM codec (src/cm: decode of a MAD, the rdma_cm IP
// header), the trust boundary of the CM agent (every datagram reaching QP1). Checked on every input:
//  1. decode never reads outside the bytes given (ASan) and refuses anything shorter than a MAD;
//  2. a MAD that decodes re-encodes to exactly its bytes (every bit belongs to one table row);
//  3. decode(encode(m)) == m for what decoded, compared as encoded bytes;
//  4. the IP header round-trips when it decodes.
// Run: ./melon fuzz fuzz_cm_codec [seconds]
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cm/ip_cm.h"
#include "cm/messages.h"

using namespace melon;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The input is the MAD itself (QP1 receives exactly this); a copy on the heap of exactly `size`
  // bytes makes ASan catch any read past the end.
  uint8_t* buf = static_cast<uint8_t*>(malloc(size ? size : 1));
  memcpy(buf, data, size);
  cm::Message m;
  const cm::DecodeStatus st = cm::decode(buf, size, &m);
  if (size < cm::kMadSize && st != cm::DecodeStatus::too_short) abort();
  if (st == cm::DecodeStatus::ok) {
    uint8_t out[cm::kMadSize];
    if (!cm::encode(m, out)) abort();
    if (memcmp(out, buf, cm::kMadSize) != 0) abort();
    cm::Message again;
    if (cm::decode(out, sizeof out, &again) != cm::DecodeStatus::ok) abort();
    uint8_t out2[cm::kMadSize];
    if (!cm::encode(again, out2) || memcmp(out, out2, sizeof out) != 0) abort();
  }
  cm::IpCmHeader h;
  if (cm::decode_ip_cm(buf, size, &h)) {
    uint8_t hdr[cm::kIpCmHeaderSize];
    cm::encode_ip_cm(h, hdr);
    // Only the 4 reserved bits of byte 1 may differ.
    if (memcmp(hdr, buf, 1) || (hdr[1] >> 4) != (buf[1] >> 4) || memcmp(hdr + 2, buf + 2, sizeof hdr - 2)) abort();
  }
  free(buf);
  return 0;
}
