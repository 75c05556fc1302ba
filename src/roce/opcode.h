// The one RoCEv2 opcode table (IBA 9.2 Table 38; RoCEv2 annex A17 for CNP). Each opcode lists only
// which extended headers it carries and what it means; every length and offset is derived from that
// at compile time, so no layout fact is written twice.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace melon::roce {

// Extended transport headers, in the order they follow the BTH on the wire (IBA 9.2, Figure 31).
enum Header : uint8_t {
  kDeth = 1 << 0,  // datagram: Q_Key, source QP
  kReth = 1 << 1,  // RDMA: VA, R_Key, DMA length
  kAtomicEth = 1 << 2,  // atomic: VA, R_Key, swap/add, compare
  kAeth = 1 << 3,  // ACK: syndrome, MSN
  kAtomicAckEth = 1 << 4,  // atomic ACK: original remote data
  kImmDt = 1 << 5,  // immediate data
  kIeth = 1 << 6,  // invalidate R_Key
  kCnpPad = 1 << 7,  // CNP's 16 reserved bytes
};
constexpr size_t kBthSize = 12;
constexpr size_t kIcrcSize = 4;
constexpr uint8_t kHeaderOrder[] = {kDeth, kReth, kAtomicEth, kAeth, kAtomicAckEth, kImmDt, kIeth, kCnpPad};
constexpr size_t header_size(uint8_t h) {
  switch (h) {
    case kDeth: return 8;
    case kReth: return 16;
    case kAtomicEth: return 28;
    case kAeth: return 4;
    case kAtomicAckEth: return 8;
    case kImmDt: return 4;
    case kIeth: return 4;
    case kCnpPad: return 16;
  }
  return 0;
}

enum class Transport : uint8_t { rc = 0x00, uc = 0x20, rd = 0x40, ud = 0x60, cnp = 0x80 };

// What an opcode means to the engine.
enum OpFlag : uint16_t {
  kStart = 1 << 0,  // FIRST or ONLY: begins a message
  kEnd = 1 << 1,  // LAST or ONLY: ends a message
  kPayload = 1 << 2,  // may carry payload
  kRequest = 1 << 3,  // requester -> responder
  kSend = 1 << 4,
  kWrite = 1 << 5,
  kReadReq = 1 << 6,
  kReadResp = 1 << 7,
  kAck = 1 << 8,
  kAtomic = 1 << 9,
  kAtomicAck = 1 << 10,
  kImm = 1 << 11,
  kInv = 1 << 12,
  kCnp = 1 << 13,
};

// Operation codes within a transport (the low five bits).
enum BaseOp : uint8_t {
  kSendFirst = 0,
  kSendMiddle = 1,
  kSendLast = 2,
  kSendLastImm = 3,
  kSendOnly = 4,
  kSendOnlyImm = 5,
  kWriteFirst = 6,
  kWriteMiddle = 7,
  kWriteLast = 8,
  kWriteLastImm = 9,
  kWriteOnly = 10,
  kWriteOnlyImm = 11,
  kReadRequest = 12,
  kReadRespFirst = 13,
  kReadRespMiddle = 14,
  kReadRespLast = 15,
  kReadRespOnly = 16,
  kAcknowledge = 17,
  kAtomicAcknowledge = 18,
  kCompareSwap = 19,
  kFetchAdd = 20,
  kSendLastInv = 22,
  kSendOnlyInv = 23,
};

struct OpInfo {
  const char* name;  // nullptr: not a valid opcode
  uint8_t headers;  // Header bits
  uint16_t flags;  // OpFlag bits
  uint8_t hdr_len;  // BTH + extended headers, derived
  uint8_t offset[8];  // offset of each extended header from the BTH start, by bit index; derived
  constexpr bool has(uint8_t h) const { return headers & h; }
  constexpr bool is(uint16_t f) const { return flags & f; }
  constexpr size_t offset_of(uint8_t h) const { return offset[__builtin_ctz(h)]; }
};

namespace detail {
struct BaseOpDef {
  uint8_t op;
  const char* name;
  uint8_t headers;
  uint16_t flags;
  bool rc, uc, ud;
};
inline constexpr BaseOpDef kBaseOps[] = {
    {kSendFirst, "SEND_FIRST", 0, kRequest | kSend | kStart | kPayload, true, true, false},
    {kSendMiddle, "SEND_MIDDLE", 0, kRequest | kSend | kPayload, true, true, false},
    {kSendLast, "SEND_LAST", 0, kRequest | kSend | kEnd | kPayload, true, true, false},
    {kSendLastImm, "SEND_LAST_WITH_IMMEDIATE", kImmDt, kRequest | kSend | kEnd | kPayload | kImm, true, true, false},
    {kSendOnly, "SEND_ONLY", 0, kRequest | kSend | kStart | kEnd | kPayload, true, true, true},
    {kSendOnlyImm, "SEND_ONLY_WITH_IMMEDIATE", kImmDt, kRequest | kSend | kStart | kEnd | kPayload | kImm, true, true,
     true},
    {kWriteFirst, "RDMA_WRITE_FIRST", kReth, kRequest | kWrite | kStart | kPayload, true, true, false},
    {kWriteMiddle, "RDMA_WRITE_MIDDLE", 0, kRequest | kWrite | kPayload, true, true, false},
    {kWriteLast, "RDMA_WRITE_LAST", 0, kRequest | kWrite | kEnd | kPayload, true, true, false},
    {kWriteLastImm, "RDMA_WRITE_LAST_WITH_IMMEDIATE", kImmDt, kRequest | kWrite | kEnd | kPayload | kImm, true, true,
     false},
    {kWriteOnly, "RDMA_WRITE_ONLY", kReth, kRequest | kWrite | kStart | kEnd | kPayload, true, true, false},
    {kWriteOnlyImm, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", kReth | kImmDt,
     kRequest | kWrite | kStart | kEnd | kPayload | kImm, true, true, false},
    {kReadRequest, "RDMA_READ_REQUEST", kReth, kRequest | kReadReq | kStart | kEnd, true, false, false},
    {kReadRespFirst, "RDMA_READ_RESPONSE_FIRST", kAeth, kReadResp | kStart | kPayload, true, false, false},
    {kReadRespMiddle, "RDMA_READ_RESPONSE_MIDDLE", 0, kReadResp | kPayload, true, false, false},
    {kReadRespLast, "RDMA_READ_RESPONSE_LAST", kAeth, kReadResp | kEnd | kPayload, true, false, false},
    {kReadRespOnly, "RDMA_READ_RESPONSE_ONLY", kAeth, kReadResp | kStart | kEnd | kPayload, true, false, false},
    {kAcknowledge, "ACKNOWLEDGE", kAeth, kAck | kStart | kEnd, true, false, false},
    {kAtomicAcknowledge, "ATOMIC_ACKNOWLEDGE", kAeth | kAtomicAckEth, kAtomicAck | kStart | kEnd, true, false, false},
    {kCompareSwap, "COMPARE_SWAP", kAtomicEth, kRequest | kAtomic | kStart | kEnd, true, false, false},
    {kFetchAdd, "FETCH_ADD", kAtomicEth, kRequest | kAtomic | kStart | kEnd, true, false, false},
    {kSendLastInv, "SEND_LAST_WITH_INVALIDATE", kIeth, kRequest | kSend | kEnd | kPayload | kInv, true, false, false},
    {kSendOnlyInv, "SEND_ONLY_WITH_INVALIDATE", kIeth, kRequest | kSend | kStart | kEnd | kPayload | kInv, true, false,
     false},
};

constexpr OpInfo make_info(const char* name, uint8_t headers, uint16_t flags) {
  OpInfo info{name, headers, flags, 0, {}};
  size_t off = kBthSize;
  for (uint8_t h : kHeaderOrder) {
    if (headers & h) {
      info.offset[__builtin_ctz(h)] = uint8_t(off);
      off += header_size(h);
    }
  }
  info.hdr_len = uint8_t(off);
  return info;
}

struct OpTable {
  OpInfo op[256];
};

constexpr OpTable build_table() {
  OpTable t{};
  for (const BaseOpDef& d : kBaseOps) {
    if (d.rc) t.op[uint8_t(Transport::rc) | d.op] = make_info(d.name, d.headers, d.flags);
    if (d.uc) t.op[uint8_t(Transport::uc) | d.op] = make_info(d.name, d.headers, d.flags);
    if (d.ud) t.op[uint8_t(Transport::ud) | d.op] = make_info(d.name, uint8_t(d.headers | kDeth), d.flags);
  }
  t.op[0x81] = make_info("CNP", kCnpPad, kCnp | kStart | kEnd);  // RoCEv2 annex A17.9.2
  return t;
}
}  // namespace detail

inline constexpr detail::OpTable kOpTable = detail::build_table();

constexpr const OpInfo& op_info(uint8_t opcode) { return kOpTable.op[opcode]; }
constexpr bool op_valid(uint8_t opcode) { return kOpTable.op[opcode].name != nullptr; }
constexpr Transport op_transport(uint8_t opcode) { return Transport(opcode & 0xe0); }
constexpr uint8_t make_opcode(Transport t, BaseOp op) { return uint8_t(uint8_t(t) | op); }
const char* transport_name(Transport t);

// Spot checks of derived layout against IBA's figures.
static_assert(op_info(0x0b).hdr_len == 12 + 16 + 4);  // RC WRITE_ONLY_WITH_IMMEDIATE
static_assert(op_info(0x12).offset_of(kAtomicAckEth) == 16);  // ATOMIC_ACK: BTH AETH AtomicAckETH
static_assert(op_info(0x65).offset_of(kImmDt) == 20);  // UD SEND_ONLY_IMM: BTH DETH ImmDt
static_assert(!op_valid(0x2c) && !op_valid(0x15));  // UC READ, reserved 21

}  // namespace melon::roce
