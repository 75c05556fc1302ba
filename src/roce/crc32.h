// CRC-32 (IEEE 802.3, reflected, polynomial 0x04C11DB7) as zlib defines it: crc32_update(0, buf) is the
// standard CRC of buf, and updates chain: crc32_update(crc32_update(0, a), b) == CRC of a||b.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace melon::roce {

// The fast one: ISA-L's crc32_gzip_refl where available, the ARMv8 CRC32 instructions on arm64,
// otherwise the table implementation.
uint32_t crc32_update(uint32_t crc, const void* data, size_t len);

// A plain byte-at-a-time table implementation: the independent check of the fast one.
uint32_t crc32_table_update(uint32_t crc, const void* data, size_t len);

// Which implementation crc32_update uses ("isa-l", "armv8", "table").
const char* crc32_backend();

}  // namespace melon::roce
