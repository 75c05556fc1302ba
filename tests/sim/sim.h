// Deterministic discrete-event simulation of RoCEv2 hosts around the transport engine (src/rc).
//
// A virtual clock in nanoseconds, one event queue, any number of Engine instances (nodes), each with
// its own registered memory and CQs. Packets leave an engine through SimLink::transmit, become whole
// IP+UDP+RoCE frames (the host kit's FrameWire: roce::write_frame, with ICRC), and reach the peer after a seeded delay; the link can
// lose, duplicate, delay out of order, or corrupt them. Delivery runs read_frame (which must reject a
// corrupted frame with bad_icrc, so the engine never sees it) and then Engine::receive. Engines' timers
// fire when next_deadline() is due. Every random choice comes from one std::mt19937_64, so a seed
// replays a run exactly.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/host_kit.h"
#include "rc/engine.h"
#include "roce/ip_udp.h"
#include "roce/packet.h"

namespace melon::sim {

using kit::Region;

// Link behaviour. Rates are per frame; delays in ns. Without reordering the link is FIFO.
struct Faults {
  double loss = 0, dup = 0, reorder = 0, corrupt = 0;
  uint64_t base_delay_ns = 2000;  // one-way latency
  uint64_t jitter_ns = 500;  // FIFO jitter (never overtakes)
  uint64_t reorder_ns = 30000;  // extra delay range of a reordered (or duplicated) frame
};

struct SimStats {
  uint64_t frames = 0;  // frames the engines transmitted
  uint64_t delivered = 0;  // frames handed to Engine::receive
  uint64_t lost = 0, duplicated = 0, reordered = 0, corrupted = 0;
  uint64_t corrupt_rejected = 0;  // corrupted frames read_frame refused with bad_icrc
  uint64_t hook_dropped = 0, unroutable = 0, injected = 0;
  uint64_t ticks = 0, events = 0;
};

// What a test sees of a frame on the wire.
struct WireFrame {
  int from = -1, to = -1;
  uint64_t time = 0;
  roce::IpUdp ip;
  roce::Packet pkt;  // payload points into `frame`
  const std::vector<uint8_t>* frame = nullptr;
};

class Sim;

struct Node {
  std::string name;
  uint8_t gid[16] = {};
  bool v6 = false;
  std::unique_ptr<kit::Memory> mem;
  std::unique_ptr<kit::FrameWire> wire;
  std::unique_ptr<rc::Engine> engine;
};

class Sim {
 public:
  explicit Sim(uint64_t seed, const Faults& faults = {});
  ~Sim();

  // Adds a host at 10.0.0.<n+1> (or fd00::<n+1> with v6). Returns its index.
  int add_node(const std::string& name, bool v6 = false, const rc::EngineConfig& config = {});
  Node& node(int i) { return *nodes_[i]; }
  rc::Engine& engine(int i) { return *nodes_[i]->engine; }
  kit::Memory& mem(int i) { return *nodes_[i]->mem; }
  rc::AddressVector av_to(int from, int to) const;

  uint64_t now() const { return clock_.t; }
  std::mt19937_64& rng() { return rng_; }
  Faults& faults() { return faults_; }
  const SimStats& stats() const { return stats_; }
  // Problems the simulator itself detected (corrupted frame accepted, engine spinning, ...).
  const std::vector<std::string>& errors() const { return errors_; }

  // Receive batches, as a host that reads its socket in batches does: with a non-zero value, frames
  // reaching one node within rx_batch_ns of the first (and before any timer is due) are passed to
  // its engine between Engine::begin_batch and end_batch. 0: one frame at a time.
  uint64_t rx_batch_ns = 0;

  // Called for every transmitted frame before faults apply; return false to drop it.
  std::function<bool(const WireFrame&)> on_transmit;
  // Called for every frame that passed read_frame, just before Engine::receive.
  std::function<void(const WireFrame&)> on_deliver;

  // Runs `fn` at virtual time `t` (>= now).
  void at(uint64_t t, std::function<void()> fn);
  // Delivers a copy of a frame to node `to` at time `t`, bypassing faults.
  void inject(int to, const std::vector<uint8_t>& frame, uint64_t t);

  // Processes events and timers in time order until `done()` holds (checked after every step), time
  // would pass `deadline`, or nothing is left to do. Returns done().
  bool run_until(const std::function<bool()>& done, uint64_t deadline);
  // Processes everything due up to now + ns, then sets the clock to now + ns.
  void run_for(uint64_t ns);

  void transmit(int from, std::vector<uint8_t>&& frame, const rc::TxPacket& p);

 private:
  struct Event {
    int to = -1;
    int from = -1;
    bool corrupted = false;
    bool injected = false;
    std::vector<uint8_t> frame;
    std::function<void()> fn;
  };
  bool step(uint64_t limit);
  void schedule(uint64_t t, Event ev);
  void deliver(Event& ev);
  uint64_t uniform(uint64_t lo, uint64_t hi);  // inclusive
  void trace(const char* what, int from, int to, const std::vector<uint8_t>& frame);
  bool trace_ = false;  // MELON_SIM_TRACE=1: every frame on stderr
  bool chance(double p);

  std::mt19937_64 rng_;
  Faults faults_;
  SimStats stats_;
  std::vector<std::string> errors_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<std::pair<uint64_t, uint64_t>, Event> events_;  // (time, sequence) -> event
  std::map<std::pair<int, int>, uint64_t> fifo_tail_;  // (from, to) -> latest in-order arrival
  uint64_t seq_ = 0;
  kit::ManualClock clock_;  // every node's clock
  uint64_t& now_ = clock_.t;
  uint64_t spins_ = 0;
};

// ---- QP setup helpers --------------------------------------------------------------------------

struct QpOptions {
  rc::QpType type = rc::QpType::rc;
  uint32_t pd = 1;
  uint8_t path_mtu = 3;  // ibv_mtu
  uint32_t sq_psn = 0;  // this side's first PSN (the peer's rq_psn)
  uint8_t timeout = 12;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;  // 10 us
  uint8_t max_rd_atomic = 4;
  uint8_t max_dest_rd_atomic = 4;
  uint32_t access = rc::kLocalWrite | rc::kRemoteWrite | rc::kRemoteRead | rc::kRemoteAtomic;
  uint32_t qkey = 0x11111111;  // UD
  bool sq_sig_all = false;
  rc::QpCaps cap;
};

struct QpEnd {
  int node = -1;
  uint32_t qpn = 0;
  kit::Cq* scq = nullptr;
  kit::Cq* rcq = nullptr;
};

// Creates a QP on `node` and moves it to INIT. Returns 0 or the engine's errno.
int create_qp(Sim& sim, int node, kit::Cq* scq, kit::Cq* rcq, const QpOptions& o, uint32_t* qpn);
// INIT -> RTR -> RTS towards (peer node, peer qpn); `peer_sq_psn` is the peer's first PSN.
int connect_qp(Sim& sim, int node, uint32_t qpn, int peer, uint32_t peer_qpn, uint32_t peer_sq_psn, const QpOptions& o);
// Both ends of an RC or UC connection: a -> b with `oa`, b -> a with `ob`.
int connect_pair(Sim& sim, QpEnd& a, QpEnd& b, const QpOptions& oa, const QpOptions& ob);
// Moves a QP to ERR.
int to_error(Sim& sim, int node, uint32_t qpn);
rc::QpState qp_state(Sim& sim, int node, uint32_t qpn);

// Seed for a test: MELON_SIM_SEED if set, else `fallback`. Printed so a failure can be replayed.
uint64_t test_seed(uint64_t fallback);
// MELON_SIM_SCALE (default 1.0): multiplies the property test's work-request counts.
double sim_scale();

std::string describe(const rc::Wc& wc);

}  // namespace melon::sim
