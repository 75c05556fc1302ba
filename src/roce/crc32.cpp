#include "roce/crc32.h"

#if defined(MELON_HAVE_ISAL)
#include <isa-l/crc.h>
#elif defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#include <string.h>
#endif

namespace melon::roce {

namespace {
constexpr uint32_t kPolyReflected = 0xedb88320;

struct Table {
  uint32_t v[256];
};
constexpr Table make_table() {
  Table t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
    t.v[i] = c;
  }
  return t;
}
constexpr Table kTable = make_table();
}  // namespace

uint32_t crc32_table_update(uint32_t crc, const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < len; ++i) c = kTable.v[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

#if defined(MELON_HAVE_ISAL)
uint32_t crc32_update(uint32_t crc, const void* data, size_t len) {
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), len);
}
const char* crc32_backend() { return "isa-l"; }
#elif defined(__ARM_FEATURE_CRC32)
uint32_t crc32_update(uint32_t crc, const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; len >= 8; len -= 8, p += 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = __crc32d(c, w);
  }
  for (; len; --len) c = __crc32b(c, *p++);
  return ~c;
}
const char* crc32_backend() { return "armv8"; }
#else
uint32_t crc32_update(uint32_t crc, const void* data, size_t len) { return crc32_table_update(crc, data, len); }
const char* crc32_backend() { return "table"; }
#endif

}  // namespace melon::roce
