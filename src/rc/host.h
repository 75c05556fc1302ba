// The transport engine's one seam to whatever hosts it: the soft provider (process memory, UDP
// sockets, CLOCK_MONOTONIC), the emulated ConnectX (mkeys over IOVAs, its wire, its clock) and the
// test kit (tests/common/host_kit.h). The engine owns no memory of the application's, no socket and no
// clock; it reaches them only through the four interfaces below, gathered in Host.
//
//   HostMemory      registered memory by key: checks a range and returns it as contiguous spans
//   FrameLink       packets leave here (headers + a gather list of spans)
//   CompletionSink  one per CQ: work completions
//   Clock           monotonic nanoseconds
//   EventSink       asynchronous events (optional)
//
// All are called with the host's engine lock held, from inside Engine calls; none may call back
// into the Engine.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "rc/limits.h"
#include "rc/verbs_values.h"
#include "roce/frame.h"
#include "roce/packet.h"

namespace melon::rc {

// ---- memory ------------------------------------------------------------------------------------

// Host bytes of registered memory, contiguous for `len` bytes.
using Span = roce::Span;

// Which key namespace a key is looked up in (an lkey from a local SGE, an rkey from a RETH/AtomicETH).
enum class KeyKind : uint8_t { local, remote };

// Why a key did not grant an access. The engine turns these into completion statuses and NAKs
// (rc/outcome.h); hosts report the most specific reason they know.
enum class MemStatus : uint8_t {
  ok = 0,
  bad_key,  // no valid region (or window) with this key
  wrong_pd,  // the region belongs to another protection domain
  out_of_range,  // [addr, addr + len) is not inside the region
  no_access,  // the region does not grant the access asked for
};

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  // Checks that `key` (of `kind`, in protection domain `pd`) grants `access` (Access bits; 0 =
  // local read) on all of [addr, addr + len), and returns in *first the host bytes starting at
  // `addr`: 1 <= first->len <= len. A host whose memory is not one flat range (the emulator's
  // IOVAs) may return less than `len`, ending only at a 4 KiB-aligned address; the engine then
  // asks again from addr + first->len for the rest. len == 0 checks the key only and returns an
  // empty span. A span mapped for a write (kLocalWrite or kRemoteWrite without kRemoteAtomic) is
  // written whole by the engine before it is read, so a host that stages it need not fetch it.
  virtual MemStatus map(KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len, uint32_t access,
                        Span* first) = 0;
  // The checks of map() on all of [addr, addr + len), for bytes the engine will not touch now (a
  // receive WQE when it is taken, a READ's local buffer when posted, a WRITE's target at its first
  // packet). A host that copies what map() returns and writes it back must not copy here: the old
  // bytes would go over whatever the application wrote there meanwhile.
  virtual MemStatus check(KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len, uint32_t access) {
    Span s;
    return map(kind, pd, key, addr, len, access, &s);
  }
  // Said before the map() of a packet's payload that a send gathers (a SEND's or WRITE's segment,
  // a READ response's range): [addr, addr + rest) of `key` is what that work request still sends
  // from this range, and later packets of the same Engine call may map more of it. A host that
  // copies memory in, one system call per copy (the emulator's DMA), may fetch more than the packet
  // at once and serve those map()s from the copy until the call ends; they are still checked each.
  // The bytes belong to a posted work request or an accepted READ, which the application may not
  // change before it completes. Default: nothing.
  virtual void will_gather(uint32_t key, uint64_t addr, uint64_t rest) {}
  // SEND with invalidate: false if `rkey` can't be invalidated in `pd` (no memory windows yet).
  virtual bool invalidate(uint32_t pd, uint32_t rkey) { return false; }
};

// ---- frames ------------------------------------------------------------------------------------

// Where a QP's (or a UD WR's) packets go. The host fills it from ibv_ah_attr (GID -> IP address).
struct AddressVector {
  uint8_t dgid[16] = {};
  uint8_t sgid[16] = {};
  uint32_t flow_label = 0;  // 0: derived from the QP numbers (RoCEv2 convention)
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
};

// One packet leaving the engine. Headers are in `pkt` (payload fields unused); the payload is
// gathered from `iov` (spans of registered memory or engine-held bytes), zero-copy until the host
// sends. roce/frame.h turns it into a frame or a UDP payload; rc/wire.h gives its IP/UDP side.
using Iov = Span;
struct TxPacket {
  static constexpr int kMaxIov = 2 * kMaxSge;  // every SGE piece of one MTU split at most once (HostMemory::map)
  roce::Packet pkt;
  Iov iov[kMaxIov];
  int niov = 0;
  uint32_t payload_len = 0;
  const AddressVector* av = nullptr;
  uint32_t src_qpn = 0;
  uint16_t udp_sport = 0xc000;  // entropy source port (from the flow label)
  // The payload is the WQE's inline copy, which lives in the engine and goes with the QP: a host that
  // sends after releasing its engine lock must copy it (registered memory stays the application's).
  bool inline_payload = false;
};

class FrameLink {
 public:
  virtual ~FrameLink() = default;
  // The spans in `p` are valid only during the call (or until the host releases its engine lock).
  virtual void transmit(const TxPacket& p) = 0;
};

// ---- completions and events --------------------------------------------------------------------

constexpr uint8_t kRoceV2Ipv6 = 0x9, kRoceV2Ipv4 = 0xa;  // Wc::sl of a UD receive

struct Wc {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::success;
  WcOpcode opcode = WcOpcode::send;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm = 0;  // host order; valid with kWcWithImm. With kWcWithInv: the invalidated rkey.
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
  uint16_t pkey_index = 0;
  // UD receives: the packet type where ConnectX puts it, in the CQE's SL nibble (RoCE has no SL):
  // bit 3 = a UDP header came (RoCEv2), bits 2:0 = the L3 header (1 IPv6, 2 IPv4). UCX's UD
  // transports read it from ibv_wc.sl to find the destination address in the GRH area.
  uint8_t sl = 0;
  bool solicited = false;  // the message carried the Solicited Event bit (for solicited-only CQ arming)
  // A receive's data handed here instead of placed (QpInit::scatter_to_wc): byte_len bytes.
  bool data_inline = false;
  uint8_t inline_data[32];
};
constexpr uint32_t kWcInlineMax = sizeof(Wc::inline_data);

class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // False when the CQ is full: the engine reports a CQ error event and moves the QP to ERR.
  virtual bool push(const Wc& wc) = 0;
};

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void qp_event(uint32_t qpn, AsyncEvent ev) {}
  virtual void srq_event(uint32_t srqn, AsyncEvent ev) {}
};

// ---- time --------------------------------------------------------------------------------------

class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now() = 0;  // monotonic nanoseconds
};

// What an Engine is built on. The objects outlive the engine.
struct Host {
  HostMemory& memory;
  FrameLink& link;
  Clock& clock;
  EventSink* events = nullptr;
};

}  // namespace melon::rc
