// Property test: random RC traffic in both directions over lossy, duplicating, reordering,
// corrupting links, checked against a shadow model.
//
// Each run connects two hosts with a few RC QP pairs ("lanes") and posts random work requests of
// every RC opcode (SEND, SEND_WITH_IMM, SEND_WITH_INV, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ,
// ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD) from both ends, in batches. Sizes run from 0 to 1 MiB,
// mostly small; path MTU 256..4096; first PSNs just below 2^24 so they wrap; signaled and
// unsignaled; multi-SGE on both sides (scatter lists with gaps that must stay untouched); inline for
// small sends (the source is scribbled over right after posting). The shadow model applies every
// operation in posting order, which is the order a responder executes one QP's requests (IBA 9.5:
// requests on a QP execute in order), so atomics must behave as if serial.
//
// Checked: every signaled WR completes exactly once, in order, with status, opcode, byte_len and
// qp_num right; receive completions match the sends in order (byte_len, imm, WITH_IMM/WITH_INV);
// SEND_WITH_INV invalidates its rkey exactly once; after each batch the touched bytes of every
// region equal the shadow, and at the end of a run every byte of every region does; no completion
// arrives after the last batch; no CQ overflows; every corrupted frame is rejected with bad_icrc;
// on a link without faults no ACK timer fires (two runs share a window budget among 6-8 QPs).
//
// The generator keeps to what IBA defines: within a batch no RDMA WRITE or atomic targets bytes an
// earlier READ of the same batch reads (a duplicate READ request is executed again, so a retried
// READ may see a later WRITE: the result of such a race is undefined), and READ sinks and receive
// buffers are never reused within a batch.
//
// Scale: MELON_SIM_SCALE=<factor> multiplies the number of work requests (default 1: 112,000 WRs
// over all runs). MELON_SIM_SEED=<n> replaces every run's seed (printed at the start of each run).
#include <gtest/gtest.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "roce/aeth.h"
#include "roce/psn.h"
#include "sim/sim.h"

namespace {

using namespace melon::rc;
using namespace melon::sim;
namespace kit = melon::kit;

constexpr size_t kMiB = 1 << 20;
constexpr size_t kMaxMsg = kMiB;
constexpr size_t kTargetZone = 2 * kMiB;  // RDMA WRITE / READ area of a target region
constexpr size_t kAtomicSlots = 512;  // 8-byte atomic slots after the zone
constexpr size_t kTargetSize = kTargetZone + kAtomicSlots * 8;
constexpr size_t kSinkSize = 2 * kMiB + 64 * 1024;  // READ and atomic results, per batch
constexpr size_t kRecvSize = 2 * kMiB + 64 * 1024;  // receive buffers, per batch
constexpr size_t kSrcSize = kMiB + 64 * 1024;  // gather source, never written
constexpr size_t kScratchSize = 64 * 1024;  // inline sources, scribbled after posting
constexpr size_t kInvPool = 160;  // rkeys SEND_WITH_INV may invalidate per batch
constexpr uint32_t kPd = 7;

struct RunConfig {
  const char* name;
  uint64_t seed;
  int lanes;
  uint64_t wrs;  // work requests in this run (before MELON_SIM_SCALE)
  Faults faults;
  bool v6;
  double p_big;  // share of WRs of 64 KiB .. 1 MiB
  double p_medium;  // share of 4 KiB .. 64 KiB
  uint32_t span_split = 0;  // hosts answer HostMemory::map in spans ending at these boundaries (emulator-like)
  uint64_t rx_batch_ns = 0;  // hosts read arrivals in batches (Sim::rx_batch_ns): responders coalesce ACKs
  bool shared_window = false;  // each engine's RC QPs share a budget (EngineConfig::max_inflight_total)
};

struct Totals {
  uint64_t wrs = 0, signaled = 0, recvs = 0, bytes = 0, frames = 0, lost = 0, duplicated = 0, reordered = 0,
           corrupted = 0, retransmits = 0, timeouts = 0, seq_naks = 0, rnr_naks = 0, duplicates = 0;
  uint64_t by_op[10] = {};
  double wall_s = 0, virtual_s = 0;
};
Totals g_totals;

struct Interval {
  size_t off, len;
};
bool overlaps(const Interval& a, const Interval& b) {
  return a.len && b.len && a.off < b.off + b.len && b.off < a.off + a.len;
}

WcOpcode wc_opcode_for(WrOpcode op) {
  switch (op) {
    case WrOpcode::rdma_write:
    case WrOpcode::rdma_write_with_imm: return WcOpcode::rdma_write;
    case WrOpcode::rdma_read: return WcOpcode::rdma_read;
    case WrOpcode::atomic_cmp_and_swp: return WcOpcode::comp_swap;
    case WrOpcode::atomic_fetch_and_add: return WcOpcode::fetch_add;
    default: return WcOpcode::send;
  }
}

const char* op_name(WrOpcode op) {
  static const char* names[] = {
      "RDMA_WRITE",         "RDMA_WRITE_WITH_IMM",  "SEND",      "SEND_WITH_IMM", "RDMA_READ",
      "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "LOCAL_INV", "BIND_MW",       "SEND_WITH_INV"};
  return names[int(op)];
}

// A generated work request, held until it is posted.
struct PendingWr {
  SendWr wr;
  std::vector<Sge> sges;
  bool needs_recv = false;
  RecvWr recv;
  std::vector<Sge> recv_sges;
  Interval scratch{0, 0};  // inline source to scribble over after posting
  std::string what;
};

struct Expect {
  Wc wc;
  std::string what;
};

// One end of a lane: a QP, its CQs, its regions and their shadows.
struct Side {
  int node = 0;
  QpEnd end;
  QpOptions opt;
  kit::Cq scq, rcq;
  Region* target = nullptr;
  Region* sink = nullptr;
  Region* recv = nullptr;
  Region* scratch = nullptr;
  std::vector<Region*> inv_pool;
  std::vector<uint8_t> target_shadow, sink_shadow, recv_shadow;
  std::deque<Expect> expect_send, expect_recv;
  std::deque<PendingWr> queue;
  bool late_mode = false;  // this batch's receives are posted late
  std::vector<RecvWr> late_recvs;
  std::vector<std::vector<Sge>> late_sges;
  // Batch state.
  size_t sink_used = 0, recv_used = 0, scratch_used = 0, inv_used = 0;
  std::vector<Interval> reads_on_peer;  // READ source ranges on the peer's target this batch
  std::vector<Interval> touched_target, touched_sink, touched_recv;
  uint64_t next_wr_id = 1, next_recv_id = 1ull << 40;
};

struct Lane {
  Side side[2];
};

class PropertyRun {
 public:
  PropertyRun(const RunConfig& cfg, uint64_t seed) : cfg_(cfg), seed_(seed), sim_(seed, cfg.faults) {
    sim_.rx_batch_ns = cfg.rx_batch_ns;
  }

  // Returns an empty string on success, else the first failure.
  std::string run(uint64_t wrs);
  Sim& sim() { return sim_; }
  uint64_t posted() const { return posted_; }
  uint64_t signaled() const { return signaled_; }
  uint64_t recvs() const { return recvs_; }
  uint64_t bytes() const { return bytes_; }
  const uint64_t* by_op() const { return by_op_; }
  std::vector<Lane>& lanes() { return lanes_; }

 private:
  uint64_t uni(uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(gen_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen_) < p; }
  uint32_t draw_size();
  void fill_random(uint8_t* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t v = gen_();
      memcpy(p + i, &v, 8);
    }
    for (; i < n; ++i) p[i] = uint8_t(gen_());
  }
  std::string setup();
  void generate(Lane& lane, int s);
  void gen_one(Lane& lane, int s);
  void split_local(Region* r, size_t base, uint32_t total, uint32_t max_sge, std::vector<Sge>& out, size_t* used);
  std::string post_one(Lane& lane, int s);
  bool poll_all();
  std::string check_batch();
  std::string check_region(const char* what, Region* r, const std::vector<uint8_t>& shadow,
                           const std::vector<Interval>& ranges);
  std::string diagnose();
  std::string fail(const std::string& m) {
    if (failure_.empty()) failure_ = m;
    return failure_;
  }

  RunConfig cfg_;
  uint64_t seed_;
  Sim sim_;
  std::mt19937_64 gen_{0};
  int a_ = 0, b_ = 0;
  std::vector<Lane> lanes_;
  std::vector<Region*> src_;  // per node
  std::vector<std::vector<uint8_t>> src_copy_;
  std::string failure_;
  uint64_t posted_ = 0, signaled_ = 0, recvs_ = 0, bytes_ = 0, batch_ = 0;
  uint64_t by_op_[10] = {};
};

uint32_t PropertyRun::draw_size() {
  double r = std::uniform_real_distribution<double>(0, 1)(gen_);
  if (r < 0.04) return 0;
  r -= 0.04;
  if (r < cfg_.p_big) return chance(0.25) ? uint32_t(kMaxMsg) : uint32_t(uni(64 * 1024 + 1, kMaxMsg));
  r -= cfg_.p_big;
  if (r < cfg_.p_medium) return uint32_t(uni(4097, 64 * 1024));
  r -= cfg_.p_medium;
  if (r < 0.2) return uint32_t(uni(65, 4096));
  return uint32_t(uni(1, 64));
}

std::string PropertyRun::setup() {
  gen_.seed(seed_ ^ 0x9e3779b97f4a7c15ull);
  EngineConfig ec[2];
  for (auto& c : ec) {
    c.max_inflight_packets = uint32_t(uni(16, 256));
    c.ack_every = uint32_t(uni(4, 64));
    (void)uni(1, 32);  // once drew a responder setting that nothing read; kept so earlier seeds replay
  }
  // Drawn after the rest, so runs without a shared budget replay their earlier seeds.
  if (cfg_.shared_window)
    for (auto& c : ec) c.max_inflight_total = uint32_t(uni(c.max_inflight_packets / 2, 3 * c.max_inflight_packets));
  a_ = sim_.add_node("A", cfg_.v6, ec[0]);
  b_ = sim_.add_node("B", cfg_.v6, ec[1]);
  for (int n : {a_, b_}) sim_.mem(n).split_spans_every(cfg_.span_split);
  for (int n : {a_, b_}) {
    Region& r = sim_.mem(n).add(kPd, kSrcSize, 0);
    fill_random(r.data(), r.size());
    src_.push_back(&r);
    src_copy_.push_back(r.contents());
  }
  lanes_.resize(size_t(cfg_.lanes));
  for (Lane& lane : lanes_) {
    uint8_t mtu = uint8_t(uni(1, 5));
    uint32_t depth = uint32_t(uni(8, 128));
    for (int s = 0; s < 2; ++s) {
      Side& sd = lane.side[s];
      sd.node = s == 0 ? a_ : b_;
      QpOptions& o = sd.opt;
      o.pd = kPd;
      o.path_mtu = mtu;
      o.sq_psn = uint32_t(melon::roce::kPsnMask - uni(0, 4000));
      o.timeout = uint8_t(uni(6, 12));  // 262 us .. 16.8 ms
      o.retry_cnt = 7;
      o.rnr_retry = 7;
      o.min_rnr_timer = uint8_t(uni(1, 4));
      o.max_rd_atomic = uint8_t(uni(1, 16));
      o.cap.max_send_wr = depth;
      o.cap.max_recv_wr = depth;
      o.cap.max_send_sge = uint32_t(uni(1, 8));
      o.cap.max_recv_sge = uint32_t(uni(1, 8));
      o.cap.max_inline_data = 256;
      kit::Memory& m = sim_.mem(sd.node);
      sd.target = &m.add(kPd, kTargetSize, kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
      sd.sink = &m.add(kPd, kSinkSize, kLocalWrite);
      sd.recv = &m.add(kPd, kRecvSize, kLocalWrite);
      sd.scratch = &m.add(kPd, kScratchSize, 0);
      for (Region* r : {sd.target, sd.sink, sd.recv}) fill_random(r->data(), r->size());
      sd.target_shadow = sd.target->contents();
      sd.sink_shadow = sd.sink->contents();
      sd.recv_shadow = sd.recv->contents();
      for (size_t i = 0; i < kInvPool; ++i) sd.inv_pool.push_back(&m.add(kPd, 64, kRemoteRead | kRemoteWrite));
      sd.end.node = sd.node;
      sd.end.scq = &sd.scq;
      sd.end.rcq = &sd.rcq;
    }
    // The responder's read/atomic resources match the requester's limit (IBA 9.5: a requester
    // must not exceed the responder's max_dest_rd_atomic).
    lane.side[0].opt.max_dest_rd_atomic = lane.side[1].opt.max_rd_atomic;
    lane.side[1].opt.max_dest_rd_atomic = lane.side[0].opt.max_rd_atomic;
    int rc = connect_pair(sim_, lane.side[0].end, lane.side[1].end, lane.side[0].opt, lane.side[1].opt);
    if (rc) return fail("connect_pair failed: errno " + std::to_string(rc));
    char buf[200];
    snprintf(buf, sizeof buf, "  lane qp 0x%x<->0x%x mtu %u depth %u psn 0x%06x/0x%06x timeout %u/%u rd_atomic %u/%u\n",
             lane.side[0].end.qpn, lane.side[1].end.qpn, mtu_bytes(mtu), depth, lane.side[0].opt.sq_psn,
             lane.side[1].opt.sq_psn, lane.side[0].opt.timeout, lane.side[1].opt.timeout,
             lane.side[0].opt.max_rd_atomic, lane.side[1].opt.max_rd_atomic);
    printf("%s", buf);
  }
  return "";
}

// Splits `total` bytes of region `r` starting at `base` into 1..max_sge SGEs with small gaps
// between them (bytes nobody may write); advances *used past the span and the gaps.
void PropertyRun::split_local(Region* r, size_t base, uint32_t total, uint32_t max_sge, std::vector<Sge>& out,
                              size_t* used) {
  uint32_t n = uint32_t(uni(1, max_sge));
  if (total == 0 && chance(0.5)) n = 0;
  std::vector<uint32_t> cuts;
  for (uint32_t i = 1; i < n; ++i) cuts.push_back(uint32_t(uni(0, total)));
  std::sort(cuts.begin(), cuts.end());
  uint32_t prev = 0;
  size_t off = base;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t end = i + 1 < n ? cuts[i] : total;
    uint32_t len = end - prev;
    out.push_back(Sge{r->va(off), len, r->lkey});
    off += len + (i + 1 < n ? uni(0, 15) : 0);
    prev = end;
  }
  *used = off;
}

void PropertyRun::gen_one(Lane& lane, int s) {
  Side& me = lane.side[s];
  Side& peer = lane.side[1 - s];
  PendingWr p;
  SendWr& wr = p.wr;
  wr.wr_id = (uint64_t(s) << 56) | me.next_wr_id++;
  static const WrOpcode ops[] = {WrOpcode::send,
                                 WrOpcode::send_with_imm,
                                 WrOpcode::send_with_inv,
                                 WrOpcode::rdma_write,
                                 WrOpcode::rdma_write_with_imm,
                                 WrOpcode::rdma_read,
                                 WrOpcode::atomic_cmp_and_swp,
                                 WrOpcode::atomic_fetch_and_add};
  static const int weights[] = {20, 10, 5, 20, 10, 20, 7, 8};
  std::discrete_distribution<int> pick(std::begin(weights), std::end(weights));
  WrOpcode op = ops[pick(gen_)];
  uint32_t size = draw_size();
  bool is_atomic = op == WrOpcode::atomic_cmp_and_swp || op == WrOpcode::atomic_fetch_and_add;
  bool is_send = op == WrOpcode::send || op == WrOpcode::send_with_imm || op == WrOpcode::send_with_inv;
  size_t recv_room = kRecvSize - peer.recv_used;
  size_t sink_room = kSinkSize - me.sink_used;

  if (op == WrOpcode::send_with_inv && peer.inv_used == kInvPool) op = WrOpcode::send_with_imm;
  if ((is_send || op == WrOpcode::rdma_write_with_imm) && recv_room < 64 * 16 + 64) op = WrOpcode::rdma_write;
  is_send = op == WrOpcode::send || op == WrOpcode::send_with_imm || op == WrOpcode::send_with_inv;
  if (is_send && size > recv_room - 64 * 16 - 64) size = uint32_t(recv_room - 64 * 16 - 64);

  // Remote target for WRITE / atomics: avoid the bytes an earlier READ of this batch reads.
  Interval remote{0, 0};
  if (op == WrOpcode::rdma_write || op == WrOpcode::rdma_write_with_imm) {
    bool ok = false;
    for (int tries = 0; tries < 16 && !ok; ++tries) {
      remote = {size_t(uni(0, kTargetZone - size)), size};
      ok = true;
      for (const Interval& r : me.reads_on_peer) ok = ok && !overlaps(r, remote);
    }
    if (!ok) op = WrOpcode::rdma_read;
  } else if (is_atomic) {
    bool ok = false;
    for (int tries = 0; tries < 16 && !ok; ++tries) {
      remote = {kTargetZone + 8 * size_t(uni(0, kAtomicSlots - 1)), 8};
      ok = true;
      for (const Interval& r : me.reads_on_peer) ok = ok && !overlaps(r, remote);
    }
    if (!ok) op = WrOpcode::rdma_read;
    size = 8;
  }
  is_atomic = op == WrOpcode::atomic_cmp_and_swp || op == WrOpcode::atomic_fetch_and_add;
  if (op == WrOpcode::rdma_read) {
    if (sink_room < 16 * 8 + 8) {
      op = WrOpcode::rdma_write;  // sink full: a zero-length write keeps the op count
      size = 0;
      remote = {0, 0};
    } else {
      if (size > sink_room - 16 * 8 - 8) size = uint32_t(sink_room - 16 * 8 - 8);
      // READ anywhere in the peer's target, atomic slots included.
      remote = {size_t(uni(0, kTargetSize - size)), size};
    }
  }
  if (is_atomic && sink_room < 16) {
    op = WrOpcode::rdma_write;
    size = 0;
    remote = {0, 0};
    is_atomic = false;
  }
  wr.opcode = op;
  if (chance(0.5)) wr.send_flags |= kSignaled;
  if (chance(0.05)) wr.send_flags |= kFence;
  if (is_send && chance(0.2)) wr.send_flags |= kSolicited;

  std::vector<uint8_t> data;  // what the message carries (SEND/WRITE)
  if (op == WrOpcode::rdma_read) {
    // Scatter into this side's sink; the expected bytes are the shadow of the peer's target now.
    split_local(me.sink, me.sink_used, size, me.opt.cap.max_send_sge, p.sges, &me.sink_used);
    me.sink_used = (me.sink_used + 8) & ~size_t(7);
    size_t off = remote.off;
    for (const Sge& g : p.sges) {
      memcpy(me.sink_shadow.data() + (g.addr - me.sink->va()), peer.target_shadow.data() + off, g.length);
      me.touched_sink.push_back({size_t(g.addr - me.sink->va()), g.length});
      off += g.length;
    }
    me.reads_on_peer.push_back(remote);
    wr.remote_addr = peer.target->va(remote.off);
    wr.rkey = peer.target->rkey;
  } else if (is_atomic) {
    size_t off = me.sink_used;
    me.sink_used += 8;
    p.sges.push_back(Sge{me.sink->va(off), 8, me.sink->lkey});
    uint64_t cur;
    memcpy(&cur, peer.target_shadow.data() + remote.off, 8);
    uint64_t next;
    if (op == WrOpcode::atomic_cmp_and_swp) {
      wr.compare_add = chance(0.5) ? cur : gen_();
      wr.swap = gen_();
      next = cur == wr.compare_add ? wr.swap : cur;
    } else {
      wr.compare_add = chance(0.5) ? uni(0, 1000) : gen_();
      next = cur + wr.compare_add;
    }
    memcpy(peer.target_shadow.data() + remote.off, &next, 8);
    memcpy(me.sink_shadow.data() + off, &cur, 8);
    peer.touched_target.push_back(remote);
    me.touched_sink.push_back({off, 8});
    wr.remote_addr = peer.target->va(remote.off);
    wr.rkey = peer.target->rkey;
  } else {
    // SEND / WRITE: gather from the source region, or inline from scratch.
    bool inl = size <= me.opt.cap.max_inline_data && chance(0.5) && me.scratch_used + size <= kScratchSize;
    uint32_t nsge = uint32_t(uni(0, me.opt.cap.max_send_sge));
    if (size > 0 && nsge == 0) nsge = 1;
    std::vector<uint32_t> cuts;
    for (uint32_t i = 1; i < nsge; ++i) cuts.push_back(uint32_t(uni(0, size)));
    std::sort(cuts.begin(), cuts.end());
    uint32_t prev = 0;
    for (uint32_t i = 0; i < nsge; ++i) {
      uint32_t end = i + 1 < nsge ? cuts[i] : size;
      uint32_t len = end - prev;
      prev = end;
      if (inl) {
        fill_random(me.scratch->data() + me.scratch_used, len);
        p.sges.push_back(Sge{me.scratch->va(me.scratch_used), len, me.scratch->lkey});
        data.insert(data.end(), me.scratch->data() + me.scratch_used, me.scratch->data() + me.scratch_used + len);
        me.scratch_used += len;
      } else {
        size_t off = size_t(uni(0, kSrcSize - len));
        Region* src = src_[size_t(me.node)];
        p.sges.push_back(Sge{src->va(off), len, src->lkey});
        data.insert(data.end(), src->data() + off, src->data() + off + len);
      }
    }
    if (inl) {
      wr.send_flags |= kInline;
      p.scratch = {size_t(p.sges.empty() ? 0 : p.sges[0].addr - me.scratch->va()), size};
    }
    if (op == WrOpcode::rdma_write || op == WrOpcode::rdma_write_with_imm) {
      wr.remote_addr = peer.target->va(remote.off);
      wr.rkey = peer.target->rkey;
      if (size) memcpy(peer.target_shadow.data() + remote.off, data.data(), size);
      peer.touched_target.push_back(remote);
    }
  }
  wr.sg_list = nullptr;
  wr.num_sge = int(p.sges.size());
  if (op == WrOpcode::send_with_imm || op == WrOpcode::rdma_write_with_imm) wr.imm = uint32_t(gen_());
  if (op == WrOpcode::send_with_inv) wr.invalidate_rkey = peer.inv_pool[peer.inv_used++]->rkey;

  // The receive the peer needs (SENDs and WRITE_WITH_IMM consume one, IBA 9.4.4 / 9.4.5).
  Wc rw;
  if (is_send || op == WrOpcode::rdma_write_with_imm) {
    p.needs_recv = true;
    uint32_t room = is_send ? size + uint32_t(uni(0, 64)) : uint32_t(uni(0, 64));
    size_t base = peer.recv_used;
    split_local(peer.recv, base, room, peer.opt.cap.max_recv_sge, p.recv_sges, &peer.recv_used);
    peer.touched_recv.push_back({base, peer.recv_used - base});
    if (is_send) {
      size_t doff = 0;
      for (const Sge& g : p.recv_sges) {
        size_t n = std::min<size_t>(g.length, size - doff);
        if (n) memcpy(peer.recv_shadow.data() + (g.addr - peer.recv->va()), data.data() + doff, n);
        doff += n;
      }
    }
    p.recv.wr_id = peer.next_recv_id++;
    p.recv.num_sge = int(p.recv_sges.size());
    rw.wr_id = p.recv.wr_id;
    rw.opcode = is_send ? WcOpcode::recv : WcOpcode::recv_rdma_with_imm;
    rw.byte_len = size;
    rw.qp_num = peer.end.qpn;
    if (op == WrOpcode::send_with_imm || op == WrOpcode::rdma_write_with_imm) {
      rw.wc_flags = kWcWithImm;
      rw.imm = wr.imm;
    } else if (op == WrOpcode::send_with_inv) {
      rw.wc_flags = kWcWithInv;
      rw.imm = wr.invalidate_rkey;
    }
  }
  char what[160];
  snprintf(what, sizeof what, "lane %d side %c %s wr_id 0x%llx len %u%s%s", int(&lane - lanes_.data()), "AB"[s],
           op_name(op), (unsigned long long)wr.wr_id, size, (wr.send_flags & kInline) ? " inline" : "",
           (wr.send_flags & kSignaled) ? " signaled" : "");
  p.what = what;
  if (p.needs_recv) peer.expect_recv.push_back({rw, p.what});
  ++by_op_[int(op)];
  bytes_ += size;
  me.queue.push_back(std::move(p));
}

void PropertyRun::generate(Lane& lane, int s) {
  Side& me = lane.side[s];
  uint32_t n = uint32_t(uni(1, me.opt.cap.max_send_wr));
  for (uint32_t i = 0; i < n; ++i) gen_one(lane, s);
  // The last WR of a batch is signaled: its completion says the whole batch is done (completions
  // are in order, IBA 10.8.6).
  me.queue.back().wr.send_flags |= kSignaled;
  me.queue.back().what += " signaled";
  for (PendingWr& p : me.queue) {
    if (!(p.wr.send_flags & kSignaled)) continue;
    Wc w;
    w.wr_id = p.wr.wr_id;
    w.opcode = wc_opcode_for(p.wr.opcode);
    uint32_t len = 0;
    for (const Sge& g : p.sges) len += g.length;
    w.byte_len = len;
    w.qp_num = me.end.qpn;
    me.expect_send.push_back({w, p.what});
    ++signaled_;
  }
}

std::string PropertyRun::post_one(Lane& lane, int s) {
  Side& me = lane.side[s];
  Side& peer = lane.side[1 - s];
  PendingWr p = std::move(me.queue.front());
  me.queue.pop_front();
  if (p.needs_recv) {
    p.recv.sg_list = p.recv_sges.data();
    if (peer.late_mode) {
      peer.late_sges.push_back(p.recv_sges);
      peer.late_recvs.push_back(p.recv);
    } else {
      int rc = sim_.engine(peer.node).post_recv(peer.end.qpn, p.recv);
      if (rc) return fail("post_recv failed with errno " + std::to_string(rc) + " for " + p.what);
    }
    ++recvs_;
  }
  p.wr.sg_list = p.sges.data();
  int rc = sim_.engine(me.node).post_send(me.end.qpn, p.wr);
  if (rc) return fail("post_send failed with errno " + std::to_string(rc) + " for " + p.what);
  // Inline data was copied at post time: scribbling over the source must not change the message.
  if (p.scratch.len) fill_random(me.scratch->data() + p.scratch.off, p.scratch.len);
  ++posted_;
  return "";
}

bool matches(const Wc& got, const Wc& want, bool recv) {
  if (got.wr_id != want.wr_id || got.status != want.status || got.opcode != want.opcode ||
      got.byte_len != want.byte_len || got.qp_num != want.qp_num)
    return false;
  if (recv) {
    uint32_t f = got.wc_flags & (kWcWithImm | kWcWithInv);
    if (f != want.wc_flags) return false;
    if (f && got.imm != want.imm) return false;
  }
  return true;
}

// Polls every CQ and matches completions against the expectations. False on a mismatch.
bool PropertyRun::poll_all() {
  for (Lane& lane : lanes_) {
    for (Side& sd : lane.side) {
      Wc wc;
      while (sd.scq.poll(&wc)) {
        if (wc.status != WcStatus::success) {
          fail("error completion " + describe(wc) + " on the send CQ" +
               (sd.expect_send.empty() ? std::string() : "; next expected: " + sd.expect_send.front().what));
          return false;
        }
        if (sd.expect_send.empty()) {
          fail("unexpected send completion " + describe(wc) + " (nothing outstanding)");
          return false;
        }
        const Expect& e = sd.expect_send.front();
        if (!matches(wc, e.wc, false)) {
          fail("send completion mismatch for " + e.what + ": got " + describe(wc) + ", want " + describe(e.wc));
          return false;
        }
        sd.expect_send.pop_front();
      }
      while (sd.rcq.poll(&wc)) {
        if (wc.status != WcStatus::success) {
          fail("error completion " + describe(wc) + " on the receive CQ" +
               (sd.expect_recv.empty() ? std::string() : "; next expected: " + sd.expect_recv.front().what));
          return false;
        }
        if (sd.expect_recv.empty()) {
          fail("unexpected receive completion " + describe(wc) + " (no SEND/WRITE_IMM outstanding)");
          return false;
        }
        const Expect& e = sd.expect_recv.front();
        if (!matches(wc, e.wc, true)) {
          fail("receive completion mismatch for " + e.what + ": got " + describe(wc) + ", want " + describe(e.wc));
          return false;
        }
        sd.expect_recv.pop_front();
      }
    }
  }
  return true;
}

std::string PropertyRun::check_region(const char* what, Region* r, const std::vector<uint8_t>& shadow,
                                      const std::vector<Interval>& ranges) {
  for (const Interval& iv : ranges) {
    if (!iv.len || memcmp(r->data() + iv.off, shadow.data() + iv.off, iv.len) == 0) continue;
    size_t i = iv.off;
    while (r->data()[i] == shadow[i]) ++i;
    char buf[200];
    snprintf(buf, sizeof buf, "%s region differs from the shadow at offset %zu (range %zu+%zu): got 0x%02x want 0x%02x",
             what, i, iv.off, iv.len, r->data()[i], shadow[i]);
    return fail(buf);
  }
  return "";
}

std::string PropertyRun::check_batch() {
  for (Lane& lane : lanes_) {
    for (int s = 0; s < 2; ++s) {
      Side& sd = lane.side[s];
      std::string e;
      if (!(e = check_region("target", sd.target, sd.target_shadow, sd.touched_target)).empty()) return e;
      if (!(e = check_region("sink", sd.sink, sd.sink_shadow, sd.touched_sink)).empty()) return e;
      if (!(e = check_region("recv", sd.recv, sd.recv_shadow, sd.touched_recv)).empty()) return e;
      for (size_t i = 0; i < sd.inv_used; ++i) {
        Region* r = sd.inv_pool[i];
        if (r->invalidations != 1 || r->rkey_valid)
          return fail("SEND_WITH_INV target rkey 0x" + std::to_string(r->rkey) + " invalidated " +
                      std::to_string(r->invalidations) + " times (want exactly once)");
      }
      for (size_t i = sd.inv_used; i < kInvPool; ++i)
        if (sd.inv_pool[i]->invalidations) return fail("an rkey no SEND_WITH_INV named was invalidated");
      // Next batch: fresh keys (as if re-registered), empty sinks and receive areas.
      for (Region* r : sd.inv_pool) {
        r->rkey_valid = true;
        r->invalidations = 0;
      }
      sd.inv_used = sd.sink_used = sd.recv_used = sd.scratch_used = 0;
      sd.reads_on_peer.clear();
      sd.touched_target.clear();
      sd.touched_sink.clear();
      sd.touched_recv.clear();
    }
  }
  return "";
}

std::string PropertyRun::diagnose() {
  std::string d;
  char buf[400];
  for (Lane& lane : lanes_) {
    for (int s = 0; s < 2; ++s) {
      Side& sd = lane.side[s];
      const QpCounters* c = sim_.engine(sd.node).counters(sd.end.qpn);
      snprintf(buf, sizeof buf,
               "\n  qp 0x%x (%c) state %s: %zu send / %zu recv completions outstanding%s%s; tx %llu rx %llu "
               "retransmits %llu timeouts %llu seq_naks rx %llu rnr_naks rx %llu dup %llu dropped %llu",
               sd.end.qpn, "AB"[s], qp_state_name(qp_state(sim_, sd.node, sd.end.qpn)), sd.expect_send.size(),
               sd.expect_recv.size(), sd.expect_send.empty() ? "" : ", next: ",
               sd.expect_send.empty() ? "" : sd.expect_send.front().what.c_str(),
               (unsigned long long)(c ? c->tx_packets : 0), (unsigned long long)(c ? c->rx_packets : 0),
               (unsigned long long)(c ? c->retransmits : 0), (unsigned long long)(c ? c->timeouts : 0),
               (unsigned long long)(c ? c->seq_naks_received : 0), (unsigned long long)(c ? c->rnr_naks_received : 0),
               (unsigned long long)(c ? c->duplicates : 0), (unsigned long long)(c ? c->dropped : 0));
      d += buf;
    }
  }
  for (const std::string& e : sim_.errors()) d += "\n  sim: " + e;
  return d;
}

std::string PropertyRun::run(uint64_t wrs) {
  if (!setup().empty()) return failure_;
  auto all_done = [&] {
    if (!poll_all()) return true;
    for (Lane& lane : lanes_)
      for (Side& sd : lane.side)
        if (!sd.expect_send.empty() || !sd.expect_recv.empty()) return false;
    return true;
  };
  while (posted_ < wrs) {
    ++batch_;
    for (Lane& lane : lanes_) {
      for (int s = 0; s < 2; ++s) {
        // Now and then the responder's receives come late: the requester meets RNR NAKs and
        // retries after the RNR timer (IBA 9.7.5.2.8).
        lane.side[1 - s].late_mode = chance(0.05);
        generate(lane, s);
      }
    }
    // Post in a random interleaving of all queues, letting time pass between posts now and then.
    for (;;) {
      std::vector<std::pair<int, int>> ready;
      for (int l = 0; l < int(lanes_.size()); ++l)
        for (int s = 0; s < 2; ++s)
          if (!lanes_[size_t(l)].side[s].queue.empty()) ready.push_back({l, s});
      if (ready.empty()) break;
      auto [l, s] = ready[size_t(uni(0, ready.size() - 1))];
      if (!post_one(lanes_[size_t(l)], s).empty()) return failure_;
      if (chance(0.3)) sim_.run_for(uni(0, 20000));
      if (!sim_.errors().empty()) return fail("simulator: " + sim_.errors().front());
    }
    // Late receives arrive after a while.
    for (Lane& lane : lanes_) {
      for (Side& sd : lane.side) {
        if (sd.late_recvs.empty()) continue;
        uint64_t when = sim_.now() + uni(0, 200000);
        Side* sp = &sd;
        sim_.at(when, [this, sp] {
          for (size_t i = 0; i < sp->late_recvs.size(); ++i) {
            sp->late_recvs[i].sg_list = sp->late_sges[i].data();
            int rc = sim_.engine(sp->node).post_recv(sp->end.qpn, sp->late_recvs[i]);
            if (rc) fail("late post_recv failed with errno " + std::to_string(rc));
          }
          sp->late_recvs.clear();
          sp->late_sges.clear();
        });
      }
    }
    uint64_t limit = sim_.now() + 30'000'000'000ull;  // 30 s of virtual time
    bool done = sim_.run_until(all_done, limit);
    if (!failure_.empty()) return failure_ + diagnose();
    if (!sim_.errors().empty()) return fail("simulator: " + sim_.errors().front()) + diagnose();
    if (!done)
      return fail("batch " + std::to_string(batch_) + " stalled at t=" + std::to_string(sim_.now())) + diagnose();
    if (!check_batch().empty()) return failure_ + " (batch " + std::to_string(batch_) + ")";
  }
  // Stragglers (duplicates, late retransmissions) must not produce anything more.
  sim_.run_for(100'000'000);
  if (!poll_all()) return failure_ + diagnose();
  // Every byte of every region equals the shadow.
  for (Lane& lane : lanes_) {
    for (Side& sd : lane.side) {
      std::string e;
      if (!(e = check_region("target (final)", sd.target, sd.target_shadow, {{0, kTargetSize}})).empty()) return e;
      if (!(e = check_region("sink (final)", sd.sink, sd.sink_shadow, {{0, kSinkSize}})).empty()) return e;
      if (!(e = check_region("recv (final)", sd.recv, sd.recv_shadow, {{0, kRecvSize}})).empty()) return e;
      if (sd.scq.overflows() || sd.rcq.overflows()) return fail("CQ overflow");
    }
  }
  for (size_t n = 0; n < src_.size(); ++n)
    if (src_[n]->contents() != src_copy_[n]) return fail("a gather source region was written");
  if (!sim_.errors().empty()) return fail("simulator: " + sim_.errors().front());
  if (sim_.stats().corrupted != sim_.stats().corrupt_rejected) return fail("a corrupted frame was not rejected");
  return "";
}

void PrintTo(const RunConfig& c, std::ostream* os) { *os << c.name; }

class SimProperty : public testing::TestWithParam<RunConfig> {};

TEST_P(SimProperty, RandomTrafficCompletesInOrderAndMemoryMatchesShadowModel) {
  // engine bugs (each has its own named test in edge_test.cpp): a PSN-sequence NAK that follows an
  // RNR NAK for the same PSN uses up retry_cnt (Edge.RnrNakFollowedBySequenceNak...), and
  // advancing sequence NAKs inside one long message are not counted as progress
  // (Edge.SequenceNaksThatAdvance...). Both end random traffic in RETRY_EXC_ERR.
  const RunConfig& cfg = GetParam();
  uint64_t seed = test_seed(cfg.seed);
  uint64_t wrs = uint64_t(double(cfg.wrs) * sim_scale());
  printf(
      "[sim] run %s: seed %llu (replay: MELON_SIM_SEED=%llu --gtest_filter='*%s'), %llu WRs, loss %.1f%% dup %.1f%% "
      "reorder %.1f%% corrupt %.1f%%, %s\n",
      cfg.name, (unsigned long long)seed, (unsigned long long)seed, cfg.name, (unsigned long long)wrs,
      cfg.faults.loss * 100, cfg.faults.dup * 100, cfg.faults.reorder * 100, cfg.faults.corrupt * 100,
      cfg.v6 ? "IPv6" : "IPv4");
  auto t0 = std::chrono::steady_clock::now();
  PropertyRun run(cfg, seed);
  std::string failure = run.run(wrs);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const SimStats& st = run.sim().stats();
  uint64_t retx = 0, timeouts = 0, seq = 0, rnr = 0, dups = 0;
  for (Lane& lane : run.lanes()) {
    for (Side& sd : lane.side) {
      if (const QpCounters* c = run.sim().engine(sd.node).counters(sd.end.qpn)) {
        retx += c->retransmits;
        timeouts += c->timeouts;
        seq += c->seq_naks_received;
        rnr += c->rnr_naks_received;
        dups += c->duplicates;
      }
    }
  }
  printf(
      "[sim] run %s: %llu WRs (%llu signaled, %llu receives, %.1f MiB), %llu frames, %llu lost, %llu duplicated, "
      "%llu reordered, %llu corrupted (%llu rejected), %llu retransmits, %llu timeouts, %llu seq NAKs, %llu RNR NAKs, "
      "%llu duplicates seen; %.3f s virtual, %.1f s wall\n",
      cfg.name, (unsigned long long)run.posted(), (unsigned long long)run.signaled(), (unsigned long long)run.recvs(),
      double(run.bytes()) / kMiB, (unsigned long long)st.frames, (unsigned long long)st.lost,
      (unsigned long long)st.duplicated, (unsigned long long)st.reordered, (unsigned long long)st.corrupted,
      (unsigned long long)st.corrupt_rejected, (unsigned long long)retx, (unsigned long long)timeouts,
      (unsigned long long)seq, (unsigned long long)rnr, (unsigned long long)dups, double(run.sim().now()) / 1e9, wall);
  g_totals.wrs += run.posted();
  g_totals.signaled += run.signaled();
  g_totals.recvs += run.recvs();
  g_totals.bytes += run.bytes();
  g_totals.frames += st.frames;
  g_totals.lost += st.lost;
  g_totals.duplicated += st.duplicated;
  g_totals.reordered += st.reordered;
  g_totals.corrupted += st.corrupted;
  g_totals.retransmits += retx;
  g_totals.timeouts += timeouts;
  g_totals.seq_naks += seq;
  g_totals.rnr_naks += rnr;
  g_totals.duplicates += dups;
  for (int i = 0; i < 10; ++i) g_totals.by_op[i] += run.by_op()[i];
  // A link that loses, duplicates, reorders and corrupts nothing leaves no ACK timer to fire: every
  // packet a requester stops after asks for the ACK that restarts it (RNR NAKs have their own timer).
  const Faults& f = cfg.faults;
  if (!f.loss && !f.dup && !f.reorder && !f.corrupt) EXPECT_EQ(timeouts, 0u) << "a QP waited for its ACK timer";
  g_totals.wall_s += wall;
  g_totals.virtual_s += double(run.sim().now()) / 1e9;
  EXPECT_EQ(failure, "") << "seed " << seed << " (replay with MELON_SIM_SEED=" << seed << ")";
}

Faults faults(double loss, double dup, double reorder, double corrupt) {
  Faults f;
  f.loss = loss;
  f.dup = dup;
  f.reorder = reorder;
  f.corrupt = corrupt;
  return f;
}

// 112,000 WRs in all. Big messages are rarer where loss makes each one expensive.
const RunConfig kRuns[] = {
    {"Clean", 0x5eed0001, 2, 25000, faults(0, 0, 0, 0), false, 0.003, 0.05},
    {"Loss1pct", 0x5eed0002, 2, 25000, faults(0.01, 0, 0, 0), false, 0.002, 0.04},
    {"MixedFaultsIpv6", 0x5eed0003, 2, 20000, faults(0.01, 0.01, 0.02, 0.01), true, 0.002, 0.04, 4096},
    {"HeavyFaults", 0x5eed0004, 2, 10000, faults(0.03, 0.02, 0.03, 0.02), false, 0.0005, 0.01},
    {"ReorderAndDup", 0x5eed0005, 2, 20000, faults(0.005, 0.03, 0.05, 0.005), false, 0.002, 0.04, 4096},
    {"MixedFaultsInReceiveBatches", 0x5eed0006, 2, 5000, faults(0.01, 0.01, 0.02, 0.01), false, 0.002, 0.04, 0, 20000},
    {"CleanSharedWindow", 0x5eed0007, 8, 4000, faults(0, 0, 0, 0), false, 0.02, 0.2, 0, 20000, true},
    {"LossSharedWindow", 0x5eed0008, 6, 3000, faults(0.01, 0.005, 0.01, 0.005), false, 0.01, 0.1, 0, 0, true},
};

INSTANTIATE_TEST_SUITE_P(Runs, SimProperty, testing::ValuesIn(kRuns),
                         [](const testing::TestParamInfo<RunConfig>& i) { return std::string(i.param.name); });

class TotalsPrinter : public testing::Environment {
 public:
  void TearDown() override {
    const Totals& t = g_totals;
    printf(
        "[sim] TOTAL: %llu WRs (SEND %llu, SEND_WITH_IMM %llu, SEND_WITH_INV %llu, RDMA_WRITE %llu, "
        "RDMA_WRITE_WITH_IMM %llu, RDMA_READ %llu, CMP_SWAP %llu, FETCH_ADD %llu), %llu signaled, %llu receives, "
        "%.1f MiB; %llu frames, %llu lost, %llu duplicated, %llu reordered, %llu corrupted; %llu retransmits, "
        "%llu timeouts, %llu seq NAKs, %llu RNR NAKs; %.2f s virtual, %.1f s wall\n",
        (unsigned long long)t.wrs, (unsigned long long)t.by_op[2], (unsigned long long)t.by_op[3],
        (unsigned long long)t.by_op[9], (unsigned long long)t.by_op[0], (unsigned long long)t.by_op[1],
        (unsigned long long)t.by_op[4], (unsigned long long)t.by_op[5], (unsigned long long)t.by_op[6],
        (unsigned long long)t.signaled, (unsigned long long)t.recvs, double(t.bytes) / kMiB,
        (unsigned long long)t.frames, (unsigned long long)t.lost, (unsigned long long)t.duplicated,
        (unsigned long long)t.reordered, (unsigned long long)t.corrupted, (unsigned long long)t.retransmits,
        (unsigned long long)t.timeouts, (unsigned long long)t.seq_naks, (unsigned long long)t.rnr_naks, t.virtual_s,
        t.wall_s);
  }
};
const auto* g_env = testing::AddGlobalTestEnvironment(new TotalsPrinter);

}  // namespace
