// The transport behind the emulated QPs: src/rc's engine through its host seam (rc/host.h).
//
// Memory: the engine asks for host bytes by key; the device resolves the mkey (PD, rights, bounds,
// MTT) into IOVAs and stages the bytes in its own buffers through DmaPort, as a NIC's DMA engine
// moves them through its internal buffers. After every engine call the staged writes go back to
// host memory first, then the CQEs, then the events, so software never sees a completion before
// its data.
#include <errno.h>
#include <string.h>

#include "mlx5/emu/hca.h"
#include "rc/wire.h"
#include "roce/frame.h"

namespace melon::mlx5::emu {

namespace {
namespace q = prm::qpc;
namespace a = prm::ads;

uint8_t prm_state_of(rc::QpState s) {
  switch (s) {
    case rc::QpState::reset: return prm::qpc_state::RST;
    case rc::QpState::init: return prm::qpc_state::INIT;
    case rc::QpState::rtr: return prm::qpc_state::RTR;
    case rc::QpState::rts: return prm::qpc_state::RTS;
    case rc::QpState::sqd: return prm::qpc_state::SQD;
    case rc::QpState::sqe: return prm::qpc_state::SQER;
    case rc::QpState::err: return prm::qpc_state::ERR;
  }
  return prm::qpc_state::ERR;
}
}  // namespace

class Hca::EngineHost final : public rc::HostMemory, public rc::FrameLink, public rc::Clock, public rc::EventSink {
 public:
  explicit EngineHost(Hca& h) : h_(h) {}

  // The mkey access bits a transport access needs.
  static uint32_t mkey_access(rc::KeyKind kind, uint32_t access) {
    uint32_t acc = kind == rc::KeyKind::remote ? kAccRemote : 0;
    if (access & (rc::kLocalWrite | rc::kRemoteWrite)) acc |= kAccWrite;
    if (access & rc::kRemoteRead || access == 0) acc |= kAccRead;
    // IBA o10-39: an atomic needs Remote Atomic access on the key, not Remote Write.
    if (access & rc::kRemoteAtomic) acc |= kAccAtomic;
    return acc;
  }

  rc::MemStatus map(rc::KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len, uint32_t access,
                    rc::Span* first) override {
    uint32_t acc = mkey_access(kind, access);
    uint8_t st = h_.mkey_resolve(key, pd, addr, len, acc, &segs_);
    if (st) return rc::MemStatus(st);
    *first = rc::Span{};
    if (len == 0) return rc::MemStatus::ok;
    if (acc == (acc & (kAccRead | kAccRemote))) {  // a payload that leaves: fetched a block at a time
      if (const uint8_t* p = from_block(key, pd, acc, addr, len)) {
        *first = rc::Span{const_cast<uint8_t*>(p), len};
        return rc::MemStatus::ok;
      }
    }
    Staged s;
    s.buf.reset(new uint8_t[len]);
    s.len = len;
    s.segs = segs_;
    s.writable = acc & (kAccWrite | kAccAtomic);  // an atomic writes its result back
    // Reads and atomics need the bytes. A span mapped for a write alone goes back whole at flush(),
    // and the engine writes every byte of it first (rc/host.h), so its old bytes are not fetched:
    // only the IOMMU's answer is asked for, as the read gave it. (A fetch cost melon-emud a system
    // call per received SEND or WRITE packet.) Key checks without a write (check()) are never staged.
    bool fetch = !s.writable || (acc & kAccAtomic);
    uint64_t off = 0;
    for (const IovaSeg& g : s.segs) {
      if (!(fetch ? h_.dma_read(g.iova, s.buf.get() + off, g.len) : h_.dma_writable(g.iova, g.len)))
        return rc::MemStatus::no_access;
      off += g.len;
    }
    *first = rc::Span{s.buf.get(), len};
    staged_.push_back(std::move(s));
    return rc::MemStatus::ok;
  }

  void will_gather(uint32_t key, uint64_t addr, uint64_t rest) override { ahead_ = Ahead{key, addr, rest}; }

  // The mkey's checks alone: nothing is read, nothing staged, nothing written back.
  rc::MemStatus check(rc::KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len,
                      uint32_t access) override {
    return rc::MemStatus(h_.mkey_resolve(key, pd, addr, len, mkey_access(kind, access), &segs_));
  }

  // SEND with invalidate: the rkey's mkey goes free if it allows remote invalidation (mkc.en_rinval).
  bool invalidate(uint32_t pd, uint32_t rkey) override {
    auto it = h_.mkeys_.find(rkey >> 8);
    if (it == h_.mkeys_.end() || it->second.key8 != uint8_t(rkey) || it->second.pd != pd || it->second.free ||
        !it->second.en_rinval)
      return false;
    it->second.free = true;
    return true;
  }

  void transmit(const rc::TxPacket& p) override {
    roce::IpUdp ip = rc::tx_ip(p);
    if (uint16_t sport = h_.ports_.wire ? h_.ports_.wire->source_port() : 0) ip.sport = sport;
    std::vector<uint8_t> f(roce::frame_length(ip.v6, p.pkt.bth.opcode, p.payload_len));
    f.resize(roce::write_frame(ip, p.pkt, p.iov, p.niov, f.data()));
    ++h_.stats_.frames_tx;
    h_.out_.frames.push_back(std::move(f));
  }

  uint64_t now() override { return h_.now(); }

  void qp_event(uint32_t qpn, rc::AsyncEvent ev) override { events_.push_back({qpn, ev, false}); }
  void srq_event(uint32_t srqn, rc::AsyncEvent ev) override { events_.push_back({srqn, ev, true}); }

  // Staged writes to host memory, in the order the engine made them.
  void flush() {
    for (Staged& s : staged_) {
      if (!s.writable) continue;
      uint64_t off = 0;
      for (const IovaSeg& g : s.segs) {
        h_.dma_write(g.iova, s.buf.get() + off, g.len);
        off += g.len;
      }
    }
    staged_.clear();
    nblocks_ = 0;
    ahead_ = {};
  }

  struct Event {
    uint32_t n;
    rc::AsyncEvent ev;
    bool srq;
  };
  std::vector<Event> events_;

 private:
  struct Staged {
    std::unique_ptr<uint8_t[]> buf;
    uint32_t len = 0;
    std::vector<IovaSeg> segs;
    bool writable = false;
  };
  // Payload bytes fetched for several packets at once (will_gather): a block holds up to kBlock
  // bytes of one key from where a send said it would gather, and serves that send's later packets
  // in the same engine call, which checked each one's range against the mkey first (map()). In
  // melon-emud each DMA read of client memory is a system call (a 64 KiB read costs what 4 of
  // 4 KiB do); a window of 4 KiB packets took one each. Blocks end with the engine call (flush()),
  // so a retransmission reads memory afresh.
  static constexpr uint64_t kBlock = 64 * 1024;
  struct Block {
    uint32_t key = 0, pd = 0, acc = 0;
    uint64_t addr = 0, len = 0;
    std::unique_ptr<uint8_t[]> buf{new uint8_t[kBlock]};  // kept for the next call's blocks
  };
  struct Ahead {
    uint32_t key = 0;
    uint64_t addr = 0, rest = 0;
  };

  // The bytes of [addr, addr + len) from a block of this call, or from a new one if the send said it
  // gathers more than `len` from `addr`; nullptr: map() stages them on its own.
  const uint8_t* from_block(uint32_t key, uint32_t pd, uint32_t acc, uint64_t addr, uint32_t len) {
    for (size_t i = 0; i < nblocks_; i++) {
      const Block& b = blocks_[i];
      if (b.key == key && b.pd == pd && b.acc == acc && addr >= b.addr && addr - b.addr + len <= b.len)
        return b.buf.get() + (addr - b.addr);
    }
    if (ahead_.key != key || ahead_.addr != addr || ahead_.rest <= len || nblocks_ == kMaxBlocks) return nullptr;
    const uint64_t n = ahead_.rest < kBlock ? ahead_.rest : kBlock;
    ahead_ = {};
    if (h_.state_ == FwState::kRemoved || !(h_.pci_[kPciCommand] & kPciCommandBusMaster) ||
        h_.mkey_resolve(key, pd, addr, n, acc, &segs_))
      return nullptr;
    if (blocks_.size() == nblocks_) blocks_.emplace_back();
    Block& b = blocks_[nblocks_];
    uint64_t off = 0;
    for (const IovaSeg& g : segs_) {
      // A page past the packet's own bytes that cannot be read leaves the decision, and the fault,
      // to the packet's own read (map()), as without blocks.
      if (!h_.ports_.dma->read(g.iova, b.buf.get() + off, g.len)) return nullptr;
      off += g.len;
    }
    b.key = key, b.pd = pd, b.acc = acc, b.addr = addr, b.len = n;
    ++nblocks_;
    return b.buf.get();
  }

  static constexpr size_t kMaxBlocks = 64;  // a call's worth (4 MiB); more sends stage per packet
  Hca& h_;
  std::vector<Staged> staged_;
  std::vector<IovaSeg> segs_;
  std::vector<Block> blocks_;  // the first nblocks_ are this call's
  size_t nblocks_ = 0;
  Ahead ahead_;
};

void Hca::engine_reset() {
  held_.clear();  // ACKs of the transport that goes
  holding_ = false;
  engine_.reset();
  eh_.reset(new EngineHost(*this));
  rc::Host host{*eh_, *eh_, *eh_, eh_.get()};
  engine_.reset(new rc::Engine(host));
  pending_cqes_.clear();
}

bool CqSink::push(const rc::Wc& wc) {
  auto it = hca->cqs_.find(cqn);
  if (it == hca->cqs_.end()) return false;
  Cq& cq = it->second;
  if (cq.status != prm::cqc_status::OK) return false;
  // Room: the ring minus what software has not consumed and what is queued already.
  uint32_t size = 1u << cq.log_size;
  if (!cq.oi && ((cq.prod + cq.queued - hca->cq_consumer_index(cq)) & 0xffffff) >= size) {
    // Overrun: the CQ goes to error once the completions it accepted are written (engine_done);
    // the transport moves the QP whose completion is lost to ERR.
    cq.overrun_pending = true;
    return false;
  }
  ++cq.queued;
  hca->pending_cqes_.push_back({cqn, send, wc});
  return true;
}

void Hca::engine_done() {
  eh_->flush();
  std::vector<PendingCqe> cqes;
  cqes.swap(pending_cqes_);
  for (const PendingCqe& p : cqes) {
    auto it = cqs_.find(p.cqn);
    if (it != cqs_.end()) --it->second.queued;
    write_completion(p);
  }
  for (auto& [cqn, cq] : cqs_)
    if (cq.overrun_pending) {
      cq.overrun_pending = false;
      if (cq.status == prm::cqc_status::OK) cq_error(cq, prm::cq_error_syndrome::CQ_OVERRUN);
    }
  std::vector<EngineHost::Event> evs;
  evs.swap(eh_->events_);
  for (const EngineHost::Event& e : evs) {
    uint8_t type;
    switch (e.ev) {
      case rc::AsyncEvent::comm_est: type = prm::event_type::COMM_EST; break;
      case rc::AsyncEvent::sq_drained: type = prm::event_type::SQ_DRAINED; break;
      case rc::AsyncEvent::qp_fatal: type = prm::event_type::WQ_CATAS_ERROR; break;
      case rc::AsyncEvent::qp_req_err: type = prm::event_type::WQ_INVAL_REQ_ERROR; break;
      case rc::AsyncEvent::qp_access_err: type = prm::event_type::WQ_ACCESS_ERROR; break;
      case rc::AsyncEvent::qp_last_wqe_reached: type = prm::event_type::SRQ_LAST_WQE; break;
      case rc::AsyncEvent::srq_limit_reached: type = prm::event_type::SRQ_RQ_LIMIT; break;
      case rc::AsyncEvent::srq_err: type = prm::event_type::SRQ_CATAS_ERROR; break;
      // The QP's completion had nowhere to go: a local work queue catastrophic error for the QP
      // (IBA 11.6.3.1), after the CQ's own CQ_ERROR above.
      case rc::AsyncEvent::cq_err: type = prm::event_type::WQ_CATAS_ERROR; break;
      default: continue;
    }
    uint32_t n = e.n;
    if (e.srq) {  // the transport names its own SRQ number; the driver knows the PRM one
      n = 0;
      for (auto& [srqn, s] : srqs_)
        if (s.engine_srq && s.engine_srqn == e.n) n = srqn;
      if (!n) continue;
    }
    uint8_t data[28] = {};
    prm::set(data, prm::qp_events::type, e.srq ? prm::kEventObjSrq : prm::kEventObjQp);
    prm::set(data, prm::qp_events::qpn_rqn_sqn, n);
    post_async(type, 0, data);
  }
}

bool Hca::tp_create_qp(Qp& qp, uint32_t* qpn) {
  rc::QpInit init;
  init.type = qp.st == prm::qpc_st::RC ? rc::QpType::rc : qp.st == prm::qpc_st::UC ? rc::QpType::uc : rc::QpType::ud;
  // QP1 is a UD QP whose number on the wire is 1 (IBA 13.4): the GSI's datagrams reach it.
  if (qp.st == prm::qpc_st::QP1) init.fixed_qpn = 1;
  init.pd = qp.pd;
  if (!qp.no_sq) {
    Cq& c = cqs_[qp.cqn_snd];
    if (!c.send_sink)
      c.send_sink.reset(new CqSink), c.send_sink->hca = this, c.send_sink->cqn = c.cqn, c.send_sink->send = true;
    init.send_cq = c.send_sink.get();
  }
  if (qp.rq_type != 3) {
    Cq& c = cqs_[qp.cqn_rcv];
    if (!c.recv_sink) c.recv_sink.reset(new CqSink), c.recv_sink->hca = this, c.recv_sink->cqn = c.cqn;
    init.recv_cq = c.recv_sink.get();
  }
  if (qp.rq_type == 1) init.srq = srqs_[qp.srqn].engine_srq;
  init.cap.max_send_wr = qp.no_sq ? 1 : 1u << qp.log_sq_size;
  init.cap.max_recv_wr = qp.rq_type == 0 ? 1u << qp.log_rq_size : 1;
  init.cap.max_send_sge = rc::kMaxSge;
  init.cap.max_recv_sge = rc::kMaxSge;
  init.cap.max_inline_data = rc::kMaxInlineData;
  init.sq_sig_all = false;  // the WQE's ce bits decide (PRM ctrl segment)
  // Responder scatter to CQE (qpc.cs_res): 32 bytes, what 64-byte CQEs hold. The 64-byte mode needs
  // 128-byte CQEs, which this model does not make: such a QP places every SEND in its buffers.
  if (prm::get(qp.qpc, prm::qpc::cs_res) == prm::qpc_cs_res::SCAT_DATA32_CQE && init.type != rc::QpType::ud &&
      qp.rq_type == 0)
    init.scatter_to_wc = uint8_t(rc::kWcInlineMax);
  int r = engine_->create_qp(init, qpn);
  engine_done();
  if (r) return false;
  qp.user_index = uint32_t(prm::get(qp.qpc, q::user_index));
  qp.avs.assign(qp.no_sq ? 0 : size_t(1) << qp.log_sq_size, rc::AddressVector{});
  return true;
}

bool Hca::tp_modify_qp(Qp& qp, uint8_t to) {
  prm::qpc::cview c(qp.qpc);
  auto path = c.at(q::primary_address_path);
  rc::QpAttr at;
  uint32_t mask = rc::kAttrState;
  bool ud = prm::qpc_st_datagram(qp.st), rc_qp = qp.st == prm::qpc_st::RC;
  // QP1's Q_Key is the GSI's, whatever the context says: a MAD with any other is dropped (IBA 13.4.6.1).
  auto qkey_of = [&] { return qp.st == prm::qpc_st::QP1 ? prm::kGsiQkey : uint32_t(c.get(q::q_key)); };
  switch (to) {
    case prm::qpc_state::RST: at.qp_state = rc::QpState::reset; break;
    case prm::qpc_state::ERR: at.qp_state = rc::QpState::err; break;
    case prm::qpc_state::INIT:
      at.qp_state = rc::QpState::init;
      at.pkey_index = uint16_t(path.get(a::pkey_index));
      mask |= rc::kAttrPkeyIndex | rc::kAttrPort;
      if (ud) {
        at.qkey = qkey_of();
        mask |= rc::kAttrQkey;
      } else {
        at.qp_access_flags = (c.get(q::rwe) ? rc::kRemoteWrite : 0) | (c.get(q::rre) ? rc::kRemoteRead : 0) |
                             (c.get(q::rae) ? rc::kRemoteAtomic : 0);
        mask |= rc::kAttrAccessFlags;
      }
      break;
    case prm::qpc_state::RTR: {
      at.qp_state = rc::QpState::rtr;
      if (ud) break;
      at.path_mtu = uint8_t(c.get(q::mtu));
      at.dest_qp_num = uint32_t(c.get(q::remote_qpn));
      at.rq_psn = uint32_t(c.get(q::next_rcv_psn));
      memcpy(at.av.dgid, path.bytes(a::rgid_rip), 16);
      uint32_t gi = uint32_t(path.get(a::src_addr_index));
      gids_[gi].gid(at.av.sgid);
      at.av.hop_limit = uint8_t(path.get(a::hop_limit));
      at.av.traffic_class = uint8_t(path.get(a::tclass));
      at.av.flow_label = uint32_t(path.get(a::flow_label));
      mask |= rc::kAttrAv | rc::kAttrPathMtu | rc::kAttrDestQpn | rc::kAttrRqPsn;
      if (rc_qp) {
        at.max_dest_rd_atomic = uint8_t(1u << c.get(q::log_rra_max));
        at.min_rnr_timer = uint8_t(c.get(q::min_rnr_nak));
        mask |= rc::kAttrMaxDestRdAtomic | rc::kAttrMinRnrTimer;
      }
      break;
    }
    case prm::qpc_state::RTS:
      at.qp_state = rc::QpState::rts;
      at.sq_psn = uint32_t(c.get(q::next_send_psn));
      if (qp.state == prm::qpc_state::RTR) mask |= rc::kAttrSqPsn;
      // What the optional parameters may have changed on the way to RTS (prm/qp_modify.h).
      if (ud) {
        at.qkey = qkey_of();
        mask |= rc::kAttrQkey;
      } else {
        at.qp_access_flags = (c.get(q::rwe) ? rc::kRemoteWrite : 0) | (c.get(q::rre) ? rc::kRemoteRead : 0) |
                             (c.get(q::rae) ? rc::kRemoteAtomic : 0);
        mask |= rc::kAttrAccessFlags;
      }
      if (rc_qp) {
        at.min_rnr_timer = uint8_t(c.get(q::min_rnr_nak));
        mask |= rc::kAttrMinRnrTimer;
      }
      if (rc_qp && qp.state == prm::qpc_state::RTR) {
        at.timeout = uint8_t(path.get(a::ack_timeout));
        at.retry_cnt = uint8_t(c.get(q::retry_count));
        at.rnr_retry = uint8_t(c.get(q::rnr_retry));
        at.max_rd_atomic = uint8_t(1u << c.get(q::log_sra_max));
        mask |= rc::kAttrTimeout | rc::kAttrRetryCnt | rc::kAttrRnrRetry | rc::kAttrMaxQpRdAtomic;
      }
      break;
    default: return false;
  }
  if (to == prm::qpc_state::RTS && qp.state == prm::qpc_state::SQER) at.cur_qp_state = rc::QpState::sqe;
  int r = engine_->modify_qp(qp.qpn, at, mask);
  engine_done();
  if (r) return false;
  if (to == prm::qpc_state::INIT && qp.state == prm::qpc_state::RST) qp.sq_pi = qp.rq_taken = 0;
  return true;
}

uint8_t Hca::tp_state(Qp& qp) {
  rc::QpAttr at;
  rc::QpInit init;
  if (engine_->query_qp(qp.qpn, &at, &init)) return qp.state;
  return prm_state_of(at.qp_state);
}

void Hca::tp_query_qp(Qp& qp, uint8_t* out) {
  rc::QpAttr at;
  rc::QpInit init;
  if (engine_->query_qp(qp.qpn, &at, &init)) return;
  prm::qpc::view v(out);
  qp.state = prm_state_of(at.qp_state);
  v.set(q::next_send_psn, at.sq_psn & 0xffffff).set(q::next_rcv_psn, at.rq_psn & 0xffffff);
}

void Hca::tp_destroy_qp(Qp& qp) {
  if (engine_) engine_->destroy_qp(qp.qpn), engine_done();
}

bool Hca::tp_create_srq(Srq& s) {
  int r = engine_->create_srq(s.pd, 1u << s.log_size, rc::kMaxSge, s.lwm, &s.engine_srq, &s.engine_srqn);
  engine_done();
  return r == 0;
}

void Hca::tp_arm_srq(Srq& s) {
  if (s.engine_srq) engine_->modify_srq(s.engine_srq, s.lwm), engine_done();
}

void Hca::tp_destroy_srq(Srq& s) {
  if (engine_ && s.engine_srq) engine_->destroy_srq(s.engine_srq), engine_done();
  s.engine_srq = nullptr;
}

}  // namespace melon::mlx5::emu

namespace melon::mlx5::emu {
// Here, where EngineHost is complete.
Hca::Hca(const HostPorts& ports, const DeviceConfig& config) : ports_(ports), cfg_(config) {
  manual_clock_ = ports_.clock != nullptr;
  if (!ports_.clock) ports_.clock = &own_clock_;
  engine_reset();
  reset(true);
}
Hca::~Hca() = default;
}  // namespace melon::mlx5::emu
