// AETH syndrome (IBA 9.7.5.1, Table 44): ACK with credit count, RNR NAK with timer, NAK codes.
#pragma once
#include <stdint.h>

namespace melon::roce {

enum class AckType : uint8_t { ack = 0, rnr_nak = 1, reserved = 2, nak = 3 };

enum class NakCode : uint8_t {
  psn_seq_error = 0,
  invalid_request = 1,
  remote_access_error = 2,
  remote_operational_error = 3,
  invalid_rd_request = 4,
};

constexpr uint8_t kCreditInvalid = 0x1f;  // "no credits advertised": what rxe and ConnectX send

constexpr AckType syndrome_type(uint8_t s) { return AckType((s >> 5) & 3); }
constexpr uint8_t syndrome_value(uint8_t s) { return s & 0x1f; }
constexpr uint8_t syndrome_ack(uint8_t credits = kCreditInvalid) { return credits & 0x1f; }
constexpr uint8_t syndrome_rnr(uint8_t timer_code) { return uint8_t(1 << 5 | (timer_code & 0x1f)); }
constexpr uint8_t syndrome_nak(NakCode c) { return uint8_t(3 << 5 | uint8_t(c)); }

static_assert(syndrome_nak(NakCode::psn_seq_error) == 0x60);
static_assert(syndrome_rnr(12) == 0x2c);

// Minimum RNR NAK timer by 5-bit code (IBA 9.7.5.2.8, Table 45), in nanoseconds. Code 0 is the longest.
inline constexpr uint64_t kRnrTimerNs[32] = {
    655360000, 10000,    20000,    30000,    40000,    60000,     80000,     120000,    160000,    240000,   320000,
    480000,    640000,   960000,   1280000,  1920000,  2560000,   3840000,   5120000,   7680000,   10240000, 15360000,
    20480000,  30720000, 40960000, 61440000, 81920000, 122880000, 163840000, 245760000, 327680000, 491520000};

constexpr uint64_t rnr_timer_ns(uint8_t code) { return kRnrTimerNs[code & 0x1f]; }

// Local ACK timeout (IBA 9.7.6.1.3): 4.096 us * 2^timeout; 0 means "infinite" (no timer).
constexpr uint64_t ack_timeout_ns(uint8_t timeout) {
  return timeout == 0 ? 0 : uint64_t(4096) << (timeout > 31 ? 31 : timeout);
}

}  // namespace melon::roce
