// Big-endian conversions for the PRM's structures, the same on Linux and macOS (which has no
// <endian.h>). Every platform we build for is little-endian; the assert keeps it that way.
#pragma once

#include <stdint.h>

namespace melon::mlx5prov {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the mlx5 provider assumes a little-endian host");

inline constexpr uint16_t to_be16(uint16_t v) { return __builtin_bswap16(v); }
inline constexpr uint32_t to_be32(uint32_t v) { return __builtin_bswap32(v); }
inline constexpr uint64_t to_be64(uint64_t v) { return __builtin_bswap64(v); }
inline constexpr uint16_t from_be16(uint16_t v) { return __builtin_bswap16(v); }
inline constexpr uint32_t from_be32(uint32_t v) { return __builtin_bswap32(v); }
inline constexpr uint64_t from_be64(uint64_t v) { return __builtin_bswap64(v); }

}  // namespace melon::mlx5prov
