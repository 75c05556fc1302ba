// Device limits: what the transport engine accepts, and so what every provider built on it
// advertises (ibv_query_device) and checks. The one place these numbers live.
#pragma once
#include <stdint.h>

namespace melon::rc {

constexpr uint32_t kMaxQpWr = 16384;  // send or receive WRs per QP
constexpr uint32_t kMaxSrqWr = 16384;  // WRs per SRQ
constexpr uint32_t kMaxSge = 32;  // scatter/gather entries per WR (send, receive, SRQ, READ)
constexpr uint32_t kMaxInlineData = 1024;  // bytes of inline data per send WR
constexpr uint8_t kMaxRdAtomic = 128;  // outstanding READ/atomic per QP, either side
constexpr uint32_t kMaxQp = 4096;
constexpr uint32_t kMaxSrq = 16384;
constexpr uint32_t kMaxCq = 16384;
// 2^20 - 1: libfabric's ofi_rxm sizes its MSG CQ at (128 rx + 128 tx) x 1024 peers = 2^18 entries
// by default (a ConnectX takes up to 2^22 - 1); the ring is allocated up front, 48 bytes an entry.
constexpr uint32_t kMaxCqe = 1048575;
constexpr uint32_t kMaxMessage = 0x80000000u;  // IBA: 2^31 bytes per message (the responder NAKs more)
constexpr uint32_t kMaxMtu = 4096;

}  // namespace melon::rc
