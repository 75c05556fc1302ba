// A soft device's lanes: QPs run on the transport engine (src/rc), carried over UDP
// (udp_transport.h). A Hub joins a device to its lanes: it answers the engines' memory lookups
// from the device's MR table, turns engine completions into ibv_wc on the provider's CQs, and
// engine events into async events.
//
// Lanes: a device runs `MELON_SOFT_LANES` transports (default: one per online CPU, at most 4; 1
// where the kernel cannot steer by QPN), each an engine, a socket per address and a progress
// thread. The sockets of one address (of every lane of every process there) form a SO_REUSEPORT
// group steered by destination QPN (steering.h, addr_registry.h), and each lane draws QPNs in the
// buckets it claimed, so the QPs of a device spread over cores. A QP lives in one lane, and so do its verbs; a QP on an SRQ lives in the SRQ's lane; a CQ
// may collect from QPs of several lanes. The counter file shows the device's totals.
//
// Locks: g_hubs_mu (hub.cpp: the device -> hub map, reference counts) -> map_mu_ (QPN/SRQN -> verbs
// object, for async events). load_ is atomic; lanes_, registries_ and the bucket tables are set
// before the hub is published (acquire) and read-only after.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "providers/soft/addr_registry.h"
#include "providers/soft/soft.h"
#include "providers/soft/udp_transport.h"
#include "rc/engine.h"

namespace melon::soft {

// Forwards one QP's completions from the engine to a provider CQ.
struct CqForward final : rc::CompletionSink {
  SoftCq* cq = nullptr;
  bool push(const rc::Wc& wc) override;
};

class Hub;

// How a device's addresses are shared with other processes (docs/verbs.md, "One address, many
// processes"): not at all, through the kernel's SO_REUSEPORT steering by QPN (Linux), or by one
// owner receiving for all and forwarding through shared-memory rings (share_forward.h; macOS).
enum class ShareMode { off, reuseport, forward };

// One lane's view of its device's memory: Hub::map through a key cache of its own (MrTable::Cache),
// used only by that lane's engine, under its lock.
class LaneMemory final : public rc::HostMemory {
 public:
  explicit LaneMemory(Hub* hub) : hub_(hub) {}
  rc::MemStatus map(rc::KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len, uint32_t access,
                    rc::Span* first) override;
  bool invalidate(uint32_t pd, uint32_t rkey) override { return false; }  // no memory windows yet

 private:
  Hub* hub_;
  MrTable::Cache cache_;
};

class Hub final : private rc::EventSink {
 public:
  // The hub of `dev`, started on first use and kept while any context holds it; errno on failure.
  static Hub* acquire(SoftDevice* dev, int* err);
  static void release(Hub* hub);

  SoftDevice* device() const { return dev_; }
  const uint8_t* gid() const { return gid_; }

  size_t lanes() const { return lanes_.size(); }
  UdpTransport& lane(size_t i) { return *lanes_[i]; }
  // The lane of one of this device's QPNs (its bucket's; steering.h).
  UdpTransport& lane_of(uint32_t qpn) { return *lanes_[lane_index_of(qpn)]; }
  size_t lane_index_of(uint32_t qpn) const {
    const uint8_t l = lane_of_bucket_[bucket_of_qpn(qpn)];
    return shared_ && l != kNotOurs ? l : 0;
  }
  // The buckets a lane draws its QPNs from (EngineConfig::random_qpn_arg; n = 0: any QPN).
  struct LaneQpns {
    uint8_t buckets[kQpnBuckets];
    uint32_t n = 0;
  };
  // Whether the device's addresses are shared with other processes (steering available), and the
  // registries it shares them through (for tests and melonctl).
  bool shared() const { return shared_; }
  ShareMode share_mode() const { return mode_; }
  const std::vector<std::shared_ptr<AddressRegistry>>& registries() const { return registries_; }
  // QPN 1's datagrams steered to lane 0's sockets on every address (AddressRegistry::claim_gsi);
  // 0 when the addresses are not shared.
  int claim_gsi();
  // The lane for a new QP or SRQ: the one holding the fewest; released with unuse().
  size_t choose_lane();
  void use(size_t lane) { load_[lane]++; }
  void unuse(size_t lane) { load_[lane]--; }
  // Receive on the lanes in `mask` (bit i: lane i) from the caller's thread (UdpTransport::poll_progress).
  bool poll_progress(uint32_t mask);
  // What every lane's sockets hold now, received and processed (UdpTransport::receive_arrived).
  void receive_arrived() {
    for (auto& l : lanes_) l->receive_arrived();
  }
  // Everything queued on every lane handed to the kernel (UdpTransport::drain).
  void drain();
  // f(lane) for each lane in `mask` (bit i: lane i; a CQ's `lanes`, or ~0u for all).
  template <typename F>
  void each_lane(uint32_t mask, F&& f) {
    for (size_t i = 0; i < lanes_.size(); ++i)
      if (mask & (1u << i)) f(*lanes_[i]);
  }

  void add_qp(uint32_t qpn, ibv_qp* qp);
  void remove_qp(uint32_t qpn);
  void add_srq(uint32_t srqn, ibv_srq* srq);
  void remove_srq(uint32_t srqn);

  // The engine's memory lookup (rc::HostMemory::map; process memory: a key's range is one span),
  // through a lane's `cache`.
  rc::MemStatus map_key(MrTable::Cache& cache, rc::KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len,
                        uint32_t access, rc::Span* first);

 private:
  explicit Hub(SoftDevice* dev);
  ~Hub() override;
  int start(std::string* why);
  void qp_event(uint32_t qpn, rc::AsyncEvent ev) override;
  void srq_event(uint32_t srqn, rc::AsyncEvent ev) override;

  SoftDevice* dev_;
  uint8_t gid_[16];
  int refs_ = 0;
  bool started_ = false;
  std::unique_ptr<CounterFile> counters_;  // the device's, shared by its lanes
  bool shared_ = false;
  ShareMode mode_ = ShareMode::off;
  uint8_t lane_of_bucket_[kQpnBuckets];  // LaneConfig::lane_of_bucket, set by start()
  std::unique_ptr<LaneQpns[]> lane_qpns_;
  std::vector<std::shared_ptr<AddressRegistry>> registries_;  // before lanes_: they leave through them
  std::vector<std::vector<int>> slots_;  // [registry][lane]: the socket slot each lane joined with
  std::vector<std::unique_ptr<LaneMemory>> lane_mem_;  // before lanes_: their engines use it
  std::vector<std::unique_ptr<UdpTransport>> lanes_;
  std::vector<UdpTransport*> lane_ptrs_;  // the same, for LaneConfig::lanes
  std::unique_ptr<std::atomic<int>[]> load_;  // QPs and SRQs per lane
  std::mutex map_mu_;
  std::map<uint32_t, ibv_qp*> qps_;
  std::map<uint32_t, ibv_srq*> srqs_;
};

}  // namespace melon::soft
