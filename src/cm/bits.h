// Big-endian bit fields of a management datagram, addressed as the IBA tables do: a byte offset,
// a bit offset counted from that byte's most significant bit, and a width. One reader and one
// writer serve every field of every message (src/cm/messages.cpp holds the tables).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace melon::cm {

// Reads `bits` (1..64) bits starting `bit` (0..7) bits into buf[byte].
inline uint64_t get_bits(const uint8_t* buf, size_t byte, unsigned bit, unsigned bits) {
  uint64_t v = 0;
  for (unsigned i = 0; i < bits; ++i) {
    const size_t b = byte + (bit + i) / 8;
    const unsigned shift = 7 - (bit + i) % 8;
    v = (v << 1) | ((buf[b] >> shift) & 1u);
  }
  return v;
}

// Writes the low `bits` bits of v there; bits outside the field are kept.
inline void put_bits(uint8_t* buf, size_t byte, unsigned bit, unsigned bits, uint64_t v) {
  for (unsigned i = 0; i < bits; ++i) {
    const size_t b = byte + (bit + i) / 8;
    const unsigned shift = 7 - (bit + i) % 8;
    const uint8_t m = uint8_t(1u << shift);
    const bool one = (v >> (bits - 1 - i)) & 1u;
    buf[b] = one ? uint8_t(buf[b] | m) : uint8_t(buf[b] & ~m);
  }
}

}  // namespace melon::cm
