#include "common/host_kit.h"

#include <string.h>

namespace melon::kit {

using namespace melon::rc;

// ---- memory ------------------------------------------------------------------------------------

Region& Memory::add(uint32_t pd, size_t size, uint32_t access) {
  Region& r = regions_.emplace_back();
  r.pd = pd;
  r.access = access;
  r.lkey = next_key_;
  r.rkey = next_key_ ^ 0x00a5a500;
  next_key_ += 0x100;
  r.words.assign((size + 7) / 8, 0);
  r.bytes = size;
  r.base = uint64_t(uintptr_t(r.words.data()));
  by_lkey_[r.lkey] = &r;
  by_rkey_[r.rkey] = &r;
  return r;
}

Region& Memory::add_at(uint32_t pd, uint64_t va, size_t size, uint32_t lkey, uint32_t rkey, uint32_t access) {
  Region& r = regions_.emplace_back();
  r.pd = pd;
  r.access = access;
  r.lkey = lkey;
  r.rkey = rkey;
  r.words.assign((size + 7) / 8, 0);
  r.bytes = size;
  r.base = va;
  by_lkey_[lkey] = &r;
  by_rkey_[rkey] = &r;
  return r;
}

namespace {
bool in_bounds(const Region& r, uint64_t addr, uint64_t len) {
  return addr >= r.base && addr - r.base <= r.size() && len <= r.size() - (addr - r.base);
}
}  // namespace

uint8_t* Memory::at(uint32_t rkey, uint64_t va, size_t len) {
  auto it = by_rkey_.find(rkey);
  if (it == by_rkey_.end() || !in_bounds(*it->second, va, len)) return nullptr;
  return it->second->data() + (va - it->second->base);
}

MemStatus Memory::map(KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len, uint32_t access,
                      Span* first) {
  ++maps;
  uint8_t* host = nullptr;
  MemStatus st = MemStatus::bad_key;
  bool remote = kind == KeyKind::remote;
  if (any_) {
    host = reinterpret_cast<uint8_t*>(uintptr_t(addr));
    st = MemStatus::ok;
  } else {
    auto& keys = remote ? by_rkey_ : by_lkey_;
    auto it = keys.find(key);
    if (it != keys.end()) {
      Region& r = *it->second;
      uint32_t need = remote ? access : access & kLocalWrite;  // local read needs no permission
      if (remote && !r.rkey_valid)
        st = MemStatus::bad_key;
      else if (r.pd != pd)
        st = MemStatus::wrong_pd;
      else if (!in_bounds(r, addr, len))
        st = MemStatus::out_of_range;
      else if (need & ~r.access)
        st = MemStatus::no_access;
      else
        st = MemStatus::ok;
      if (st == MemStatus::ok) host = r.data() + (addr - r.base);
    }
  }
  if (st != MemStatus::ok) {
    ++(remote ? remote_denied : local_denied);
    return st;
  }
  if (remote) ++remote_accesses;
  uint32_t n = len;
  if (split_) {
    uint64_t to_boundary = split_ - addr % split_;
    if (to_boundary < n) n = uint32_t(to_boundary);
  }
  *first = Span{host, n};
  return MemStatus::ok;
}

bool Memory::invalidate(uint32_t pd, uint32_t rkey) {
  auto it = by_rkey_.find(rkey);
  if (it == by_rkey_.end() || it->second->pd != pd) return false;
  it->second->rkey_valid = false;
  ++it->second->invalidations;
  return true;
}

// ---- CQ ----------------------------------------------------------------------------------------

bool Cq::push(const Wc& wc) {
  if (uint8_t(wc.status) > uint8_t(WcStatus::general_err)) ++invalid_;
  if (q_.size() >= capacity_) {
    ++overflows_;
    return false;
  }
  if (wc.status != WcStatus::success) ++errors_;
  q_.push_back(wc);
  ++total_;
  return true;
}

bool Cq::poll(Wc* wc) {
  if (q_.empty()) return false;
  *wc = q_.front();
  q_.pop_front();
  return true;
}

std::vector<Wc> Cq::drain() {
  std::vector<Wc> v(q_.begin(), q_.end());
  q_.clear();
  return v;
}

// ---- wire --------------------------------------------------------------------------------------

void FrameWire::transmit(const TxPacket& p) {
  std::vector<uint8_t> f;
  if (!pool_.empty()) {
    f.swap(pool_.back());
    pool_.pop_back();
  }
  roce::IpUdp ip = tx_ip(p);
  f.resize(roce::frame_length(ip.v6, p.pkt.bth.opcode, p.payload_len));
  f.resize(roce::write_frame(ip, p.pkt, p.iov, p.niov, f.data()));
  ++packets;
  payload_bytes += p.payload_len;
  if (check) {
    roce::IpUdp rip;
    const uint8_t* roce;
    size_t len;
    roce::Packet pkt;
    if (roce::read_frame(f.data(), f.size(), rip, &roce, &len) != roce::ParseError::ok ||
        roce::parse_transport(roce, len, pkt) != roce::ParseError::ok || pkt.payload_len != p.payload_len)
      ++malformed;
  }
  if (on_frame)
    on_frame(std::move(f), p);
  else
    frames.push_back(std::move(f));
}

bool deliver(Engine& e, const std::vector<uint8_t>& frame) {
  roce::IpUdp ip;
  const uint8_t* roce;
  size_t len;
  if (roce::read_frame(frame.data(), frame.size(), ip, &roce, &len) != roce::ParseError::ok) return false;
  e.receive(ip, roce, len);
  return true;
}

// ---- events and pairs -------------------------------------------------------------------------

size_t Events::count(AsyncEvent ev) const {
  size_t n = 0;
  for (const Event& e : log) n += e.ev == ev;
  return n;
}

Pair::Pair(const EngineConfig& ca, const EngineConfig& cb) {
  a.engine = std::make_unique<Engine>(Host{a.mem, a.wire, clock, &a.events}, ca);
  b.engine = std::make_unique<Engine>(Host{b.mem, b.wire, clock, &b.events}, cb);
}

int Pair::connect(const QpInit& init, QpParams pa, QpParams pb) {
  QpInit i = init;
  i.send_cq = &a.scq;
  i.recv_cq = &a.rcq;
  if (int r = a.engine->create_qp(i, &a.qpn)) return r;
  i.send_cq = &b.scq;
  i.recv_cq = &b.rcq;
  if (int r = b.engine->create_qp(i, &b.qpn)) return r;
  pa.type = pb.type = init.type;
  pa.dest_qpn = b.qpn;
  pb.dest_qpn = a.qpn;
  pa.av = av_v4(1, 2);
  pb.av = av_v4(2, 1);
  pa.rq_psn = pb.sq_psn;
  pb.rq_psn = pa.sq_psn;
  if (int r = bring_up(*a.engine, a.qpn, pa)) return r;
  return bring_up(*b.engine, b.qpn, pb);
}

size_t Pair::pump(Side& from) {
  Side& to = &from == &a ? b : a;
  size_t n = 0;
  while (!from.wire.frames.empty()) {
    std::vector<uint8_t> f = std::move(from.wire.frames.front());
    from.wire.frames.pop_front();
    deliver(*to.engine, f);
    ++n;
  }
  return n;
}

void Pair::settle() {
  while (pump(a) + pump(b)) {}
}

size_t Pair::drop(Side& from) {
  size_t n = from.wire.frames.size();
  from.wire.frames.clear();
  return n;
}

// ---- QP bring-up -------------------------------------------------------------------------------

int bring_up(Engine& e, uint32_t qpn, const QpParams& p, QpState until) {
  QpAttr a;
  a.qp_state = QpState::init;
  a.qp_access_flags = p.access;
  a.qkey = p.qkey;
  bool ud = p.type == QpType::ud, rc = p.type == QpType::rc;
  uint32_t mask = kAttrState | kAttrPkeyIndex | kAttrPort | (ud ? kAttrQkey : kAttrAccessFlags);
  if (int r = e.modify_qp(qpn, a, mask)) return r;
  if (until == QpState::init) return 0;
  a.qp_state = QpState::rtr;
  a.av = p.av;
  a.path_mtu = p.path_mtu;
  a.dest_qp_num = p.dest_qpn;
  a.rq_psn = p.rq_psn;
  a.max_dest_rd_atomic = p.max_dest_rd_atomic;
  a.min_rnr_timer = p.min_rnr_timer;
  mask = ud ? kAttrState
            : kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn |
                  (rc ? kAttrMaxDestRdAtomic | kAttrMinRnrTimer : 0);
  if (int r = e.modify_qp(qpn, a, mask)) return r;
  if (until == QpState::rtr) return 0;
  a.qp_state = QpState::rts;
  a.sq_psn = p.sq_psn;
  a.timeout = p.timeout;
  a.retry_cnt = p.retry_cnt;
  a.rnr_retry = p.rnr_retry;
  a.max_rd_atomic = p.max_rd_atomic;
  mask = rc ? kAttrState | kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic
            : kAttrState | kAttrSqPsn;
  return e.modify_qp(qpn, a, mask);
}

AddressVector av_v4(uint8_t from, uint8_t to) {
  AddressVector av;
  roce::gid_from_ipv4(av.sgid, 0x0a000000u | from);
  roce::gid_from_ipv4(av.dgid, 0x0a000000u | to);
  return av;
}

}  // namespace melon::kit
