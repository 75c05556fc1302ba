// Hca: power-up/FLR, the service loop, DMA and interrupts as the device sees them.
#include "mlx5/emu/hca.h"

#include "roce/ip_udp.h"
#include "roce/opcode.h"

#include <string.h>

namespace melon::mlx5::emu {

void Hca::reset(bool power_on) {
  uint64_t t = now();
  state_ = FwState::kBooting;
  boot_done_ns_ = t + cfg_.init_delay_ns;
  health_epoch_ns_ = t;
  health_synd_ = 0;
  health_counter_frozen_ = 0;
  cmdq_addr_h_ = cmdq_addr_l_ = 0;
  cmdq_valid_ = false;
  pending_cmd_bits_ = busy_cmd_bits_ = 0;
  doorbells_.clear();
  rx_.clear();
  faults_.cmd_timeout = false;
  faults_.health_stall = false;
  drop_objects();
  engine_reset();
  for (auto& [iova, p] : pages_) returned_pages_.insert(iova);  // FLR: the driver gets every page back
  pages_.clear();
  icm_slots_.clear();
  stats_.fw_pages_held = 0;
  boot_pages_done_ = init_pages_done_ = false;
  regular_pages_owed_ = 0;
  roce_en_ = roce_en_stuck_ = false;
  vport_mtu_ = pmtu_admin_ = 0;
  port_admin_ = port_oper_ = prm::kPortUp;
  torn_down_since_flr_ = false;
  issi_ = 0;
  cfg_reset();
  if (power_on) cfg_enumerate();  // FLR leaves it to whoever reset the function to restore
  memset(iseg_, 0, sizeof iseg_);
}

void Hca::update_fw_state() {
  if (state_ == FwState::kBooting && now() >= boot_done_ns_) state_ = FwState::kReady;
}

void Hca::enter_fatal(uint8_t syndrome) {
  if (state_ == FwState::kFatal) return;
  health_counter_frozen_ = uint32_t((now() - health_epoch_ns_) / cfg_.health_period_ns);
  health_synd_ = syndrome;
  state_ = FwState::kFatal;
  doorbells_.clear();
}

bool Hca::dma_read(uint64_t iova, void* dst, size_t len) {
  if (state_ == FwState::kRemoved || !(pci_[kPciCommand] & kPciCommandBusMaster)) {
    ++stats_.dma_faults;
    return false;
  }
  if (!ports_.dma->read(iova, dst, len)) {
    ++stats_.dma_faults;
    return false;
  }
  return true;
}

bool Hca::dma_write(uint64_t iova, const void* src, size_t len) {
  if (state_ == FwState::kRemoved || !(pci_[kPciCommand] & kPciCommandBusMaster)) {
    ++stats_.dma_faults;
    return false;
  }
  if (!ports_.dma->write(iova, src, len)) {
    ++stats_.dma_faults;
    return false;
  }
  return true;
}

bool Hca::dma_writable(uint64_t iova, size_t len) {
  if (state_ == FwState::kRemoved || !(pci_[kPciCommand] & kPciCommandBusMaster) || !ports_.dma->writable(iova, len)) {
    ++stats_.dma_faults;
    return false;
  }
  return true;
}

bool DmaPort::writable(uint64_t iova, size_t len) {
  std::unique_ptr<uint8_t[]> scratch(new uint8_t[len ? len : 1]);
  return read(iova, scratch.get(), len);
}

// MSI-X (PCIe 6.1.4): a message goes out only while MSI-X is enabled, the function is not masked
// and the vector's entry is not; otherwise its Pending Bit is set and it goes when that changes.
void Hca::raise_irq(uint16_t vector) {
  if (state_ == FwState::kRemoved || vector >= cfg_.msix_vectors) return;
  if (msix_blocked(vector)) {
    if (!msix_pending_[vector]) ++stats_.irqs_held;
    msix_pending_[vector] = true;
    return;
  }
  out_.irqs.push_back(vector);
}

uint64_t Hca::next_deadline() {
  if (state_ != FwState::kBooting && (pending_cmd_bits_ || !doorbells_.empty() || !rx_.empty())) return 0;
  return timer_deadline();
}

uint64_t Hca::timer_deadline() {
  if (state_ == FwState::kBooting) return boot_done_ns_;
  return state_ == FwState::kInitialized && engine_ ? engine_->next_deadline() : UINT64_MAX;
}

namespace {
// A frame (IP, UDP, BTH...) that is an RC ACK: opcode Acknowledge, AETH syndrome ACK (not a NAK,
// not RNR), nothing else. Those alone are held: their order against other replies is kept below.
bool is_plain_ack(const std::vector<uint8_t>& f) {
  roce::IpUdp h;
  if (roce::parse_ip_udp(f.data(), f.size(), h) != roce::ParseError::ok || f.size() < h.hdr_len + 16) return false;
  const uint8_t* bth = f.data() + h.hdr_len;
  return bth[0] == 0x11 && (bth[12] >> 5) == 0;  // IBA 9.2 opcode 10001b; 9.3.5 AETH syndrome 000xxxxx
}

bool is_request(const std::vector<uint8_t>& f) {
  roce::IpUdp h;
  if (roce::parse_ip_udp(f.data(), f.size(), h) != roce::ParseError::ok || f.size() < h.hdr_len + 12) return false;
  return roce::op_info(f[h.hdr_len]).is(roce::kRequest);
}
}  // namespace

// After a received packet: if the device had nothing to send before it, it completed a receive (the
// host is told and may answer at once) and it made only plain ACKs, they wait for that answer.
void Hca::hold_acks(size_t first_new, uint64_t recv_cqes_before) {
  const size_t n = out_.frames.size() - first_new;
  if (!ack_hold_ns_ || first_new != 0 || n == 0 || n > 2 || !held_.empty() || recv_cqes_ == recv_cqes_before) return;
  for (const auto& f : out_.frames)
    if (!is_plain_ack(f)) return;
  held_.swap(out_.frames);
  held_until_ = now() + ack_hold_ns_;
  holding_ = true;
}

// The held ACKs join what the device sends now: after it if that is requests only (the peer's
// ping-pong gets our request and the ACK together), else before it (everything queued was made
// after them: another reply of their QP must not pass them). With nothing to send they wait until
// `due`.
void Hca::release_held(bool due) {
  if (held_.empty() || (out_.frames.empty() && !due)) return;
  bool requests = true;
  for (const auto& f : out_.frames) requests = requests && is_request(f);
  if (requests) {
    for (auto& f : held_) out_.frames.push_back(std::move(f));
  } else {
    for (auto& f : out_.frames) held_.push_back(std::move(f));
    held_.swap(out_.frames);
  }
  held_.clear();
  holding_ = false;
}

bool Hca::service() {
  kick_ = false;  // everything queued is taken below
  update_fw_state();
  if (!alive()) {
    doorbells_.clear(), rx_.clear();  // a dead device does nothing
    return false;
  }
  if (state_ == FwState::kBooting) return false;
  bool worked = false;
  if (pending_cmd_bits_) {
    run_commands();
    worked = true;
  }
  while (!doorbells_.empty()) {
    Doorbell db = doorbells_.front();
    doorbells_.pop_front();
    run_doorbell(db);
    worked = true;
  }
  while (!rx_.empty() && state_ == FwState::kInitialized) {
    std::vector<uint8_t> f = std::move(rx_.front());
    rx_.pop_front();
    release_held(false);  // anything sent before this packet's answer takes held ACKs with it
    const size_t first_new = out_.frames.size();
    const uint64_t recv_cqes = recv_cqes_;
    rx_frame(f);
    hold_acks(first_new, recv_cqes);
    worked = true;
  }
  rx_.clear();
  if (state_ == FwState::kInitialized && engine_->next_deadline() <= now()) {
    engine_->tick();
    engine_done();
    worked = true;
  }
  release_held(!held_.empty() && (held_until_ <= now() || state_ != FwState::kInitialized || !ack_hold_ns_));
  return worked;
}

void Hca::run_doorbell(const Doorbell& db) {
  if (state_ != FwState::kInitialized) {
    ++stats_.doorbells_ignored;
    return;
  }
  switch (db.kind) {
    case DbKind::kCqArm: cq_doorbell(db); break;
    case DbKind::kEqArm:
    case DbKind::kEqUpdate: eq_doorbell(db); break;
    case DbKind::kSend: send_doorbell(db); break;
  }
}

void Hca::drop_objects() {
  for (auto& [n, qp] : qps_) tp_destroy_qp(qp);
  for (auto& [n, s] : srqs_) tp_destroy_srq(s);
  qps_.clear();
  srqs_.clear();
  cqs_.clear();
  eqs_.clear();
  mkeys_.clear();
  uars_.clear();
  pds_.clear();
  umems_.clear();
  tds_.clear();
  qcounters_.clear();
  icm_of_.clear();
  for (GidEntry& g : gids_) g = GidEntry{};
  doorbells_.clear();
}

}  // namespace melon::mlx5::emu
