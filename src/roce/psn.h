// 24-bit packet sequence numbers (IBA 9.7.1): arithmetic and ordering modulo 2^24.
#pragma once
#include <stdint.h>

namespace melon::roce {

constexpr uint32_t kPsnMask = 0xffffff;

constexpr uint32_t psn_add(uint32_t psn, int32_t n) { return (psn + uint32_t(n)) & kPsnMask; }

// Signed distance a - b in (-2^23, 2^23]: the window IBA uses to tell "ahead" from "behind".
constexpr int32_t psn_diff(uint32_t a, uint32_t b) { return int32_t(((a - b) & kPsnMask) << 8) >> 8; }
constexpr bool psn_before(uint32_t a, uint32_t b) { return psn_diff(a, b) < 0; }
constexpr bool psn_after(uint32_t a, uint32_t b) { return psn_diff(a, b) > 0; }

static_assert(psn_add(0xffffff, 1) == 0);
static_assert(psn_diff(0, 0xffffff) == 1);
static_assert(psn_before(0xfffffe, 2));

}  // namespace melon::roce
