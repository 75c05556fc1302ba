// The one host the tests give the transport engine (rc/host.h): the simulation, the replay of rxe
// captures, the fuzzer and bench_engine all build on it, and so can the emulator's tests.
//
//   Memory     registered regions by key, with the PD, bounds and access checks an HCA makes; can
//              answer in page-sized spans as the emulator's IOVAs do, or accept any address
//   Cq         a bounded FIFO of completions
//   ManualClock  time the test sets
//   FrameWire  turns every packet into a whole RoCEv2 frame (roce/frame.h, entropy source port)
//              and queues it or hands it to a callback
//   QpParams / bring_up   RESET -> INIT -> RTR -> RTS with the attributes each transition needs
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "rc/engine.h"
#include "rc/wire.h"
#include "roce/frame.h"

namespace melon::kit {

// One registered region. add() places it at its own buffer's address (as ibv_reg_mr does, so inline
// sends, which read the address as a pointer, work); add_at() at any address (a capture's VA).
struct Region {
  uint32_t pd = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  uint32_t access = 0;  // rc::Access bits
  bool rkey_valid = true;
  uint32_t invalidations = 0;
  uint64_t base = 0;  // its address
  std::vector<uint64_t> words;  // the bytes, 8-byte aligned for atomics
  size_t bytes = 0;

  uint64_t va(size_t offset = 0) const { return base + offset; }
  size_t size() const { return bytes; }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words.data()); }
  std::vector<uint8_t> contents() const { return std::vector<uint8_t>(data(), data() + bytes); }
};

class Memory final : public rc::HostMemory {
 public:
  explicit Memory(uint32_t key_base = 0x100) : next_key_(key_base) {}
  // Keys: lkey from key_base upwards in steps of 0x100, rkey = lkey ^ 0xa5a500 (never an lkey, so a
  // key used on the wrong side is caught).
  Region& add(uint32_t pd, size_t size, uint32_t access);
  Region& add_at(uint32_t pd, uint64_t va, size_t size, uint32_t lkey, uint32_t rkey, uint32_t access);
  // Answer map() in spans that end at every multiple of `bytes` of the address (0: whole ranges), as
  // a host whose memory is pages of IOVA space does.
  void split_spans_every(uint32_t bytes) { split_ = bytes; }
  // Accept any key and any address, which is then a process pointer (benchmarks).
  void accept_any(bool on) { any_ = on; }
  // The bytes at [va, va + len) of the region of `rkey` (nullptr if outside it): for assertions.
  uint8_t* at(uint32_t rkey, uint64_t va, size_t len);

  rc::MemStatus map(rc::KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len, uint32_t access,
                    rc::Span* first) override;
  bool invalidate(uint32_t pd, uint32_t rkey) override;

  uint64_t local_denied = 0, remote_denied = 0, remote_accesses = 0, maps = 0;

 private:
  std::deque<Region> regions_;  // deque: references stay valid
  std::unordered_map<uint32_t, Region*> by_lkey_, by_rkey_;
  uint32_t next_key_;
  uint32_t split_ = 0;
  bool any_ = false;
};

class Cq final : public rc::CompletionSink {
 public:
  explicit Cq(size_t capacity = 1 << 20) : capacity_(capacity) {}
  bool push(const rc::Wc& wc) override;
  bool poll(rc::Wc* wc);
  size_t size() const { return q_.size(); }
  uint64_t total() const { return total_; }
  uint64_t overflows() const { return overflows_; }
  uint64_t errors() const { return errors_; }  // completions with a status other than success
  uint64_t invalid() const { return invalid_; }  // completions with a status outside ibv_wc_status
  std::vector<rc::Wc> drain();

 private:
  std::deque<rc::Wc> q_;
  size_t capacity_;
  uint64_t total_ = 0, overflows_ = 0, errors_ = 0, invalid_ = 0;
};

// Records every asynchronous event.
class Events final : public rc::EventSink {
 public:
  struct Event {
    bool srq = false;
    uint32_t num = 0;
    rc::AsyncEvent ev = rc::AsyncEvent::cq_err;
  };
  void qp_event(uint32_t qpn, rc::AsyncEvent ev) override { log.push_back({false, qpn, ev}); }
  void srq_event(uint32_t srqn, rc::AsyncEvent ev) override { log.push_back({true, srqn, ev}); }
  size_t count(rc::AsyncEvent ev) const;
  std::vector<Event> log;
};

class ManualClock final : public rc::Clock {
 public:
  uint64_t now() override { return t; }
  uint64_t t = 0;
};

// A wire of whole frames. Each packet becomes a frame (roce::write_frame over rc::tx_ip), which is
// checked to parse back (`malformed` counts those that do not: always an engine or writer bug) and
// then given to `on_frame`, or queued in `frames` when no callback is set.
class FrameWire final : public rc::FrameLink {
 public:
  void transmit(const rc::TxPacket& p) override;
  std::function<void(std::vector<uint8_t>&& frame, const rc::TxPacket& p)> on_frame;
  std::deque<std::vector<uint8_t>> frames;
  // A frame's buffer back for reuse (no allocation per packet once warm).
  void recycle(std::vector<uint8_t>&& f) { pool_.push_back(std::move(f)); }
  uint64_t packets = 0, payload_bytes = 0, malformed = 0;
  bool check = true;  // parse every frame back

 private:
  std::vector<std::vector<uint8_t>> pool_;
};

// Engine::receive for a whole frame; false (nothing delivered) if it does not parse or its ICRC is bad.
bool deliver(rc::Engine& e, const std::vector<uint8_t>& frame);

// The attributes a QP is brought up with.
struct QpParams {
  rc::QpType type = rc::QpType::rc;
  uint8_t path_mtu = 3;  // ibv_mtu
  uint32_t sq_psn = 0;  // this side's first PSN
  uint32_t rq_psn = 0;  // the peer's first PSN
  uint32_t dest_qpn = 0;
  rc::AddressVector av;
  uint8_t timeout = 12;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;
  uint8_t max_rd_atomic = 4;
  uint8_t max_dest_rd_atomic = 4;
  uint32_t access = rc::kLocalWrite | rc::kRemoteWrite | rc::kRemoteRead | rc::kRemoteAtomic;
  uint32_t qkey = 0x11111111;  // UD
};

// RESET -> INIT, INIT -> RTR, RTR -> RTS with exactly the attributes IBA Table 91 asks for per
// transport. Stops at `until`. Returns 0 or the engine's errno.
int bring_up(rc::Engine& e, uint32_t qpn, const QpParams& p, rc::QpState until = rc::QpState::rts);

// An IPv4 address vector from 10.0.0.<from> to 10.0.0.<to>.
rc::AddressVector av_v4(uint8_t from, uint8_t to);

// Two engines on one wire, each with its own memory, CQs and events, sharing a clock: frames move
// only when the test pumps them, so a test decides what is in flight.
struct Pair {
  explicit Pair(const rc::EngineConfig& ca = {}, const rc::EngineConfig& cb = {});
  struct Side {
    Memory mem;
    FrameWire wire;
    Events events;
    Cq scq, rcq;
    std::unique_ptr<rc::Engine> engine;
    uint32_t qpn = 0;
  };
  ManualClock clock;
  Side a, b;
  // Creates one QP on each side (caps from `init`, CQs the sides' own) and connects them (addresses
  // 10.0.0.1 <-> 10.0.0.2); `pa` / `pb` give the attributes (dest_qpn, av and PSNs are filled in).
  int connect(const rc::QpInit& init, QpParams pa, QpParams pb);
  // Delivers what `from` has sent to the other side; returns the number of frames moved.
  size_t pump(Side& from);
  // Pumps both ways until nothing moves.
  void settle();
  // Drops what `from` has sent and not yet delivered.
  size_t drop(Side& from);
};

}  // namespace melon::kit
