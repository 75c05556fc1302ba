// emu::Device: the locked façade over Hca. Effects that leave the device (MSI-X, frames) are
// collected under the lock and delivered after it is dropped, so a host callback may call back in.
#include "mlx5/emu/device.h"

#include <time.h>

#include <chrono>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

uint64_t SteadyClock::now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

namespace {
// Takes the device lock; on release, delivers what the model queued for the host. Frames leave in
// the order the model made them even when several threads run the device (melon-emud's doorbell
// watcher and wire thread): one releasing thread at a time is the sender, and it also sends what
// others queued meanwhile, so no lock is held while a frame is handed to the port.
class Locked {
 public:
  explicit Locked(Hca& h) : h_(h), g_(h.mu_) {}
  ~Locked() {
    Hca::Outbox out;
    out.irqs.swap(h_.out_.irqs);
    if (!h_.ports_.wire) h_.out_.frames.clear();  // no link: dropped
    bool sender = !h_.sending_ && !h_.out_.frames.empty();
    if (sender) {
      h_.sending_ = true;
      out.frames.swap(h_.out_.frames);
    }
    // The worker is woken for queued work it is meant to run (kick_), and when a timer now falls
    // before it meant to look; not for doorbells and frames a host thread runs itself
    // (set_host_services): waking it for those had it race that thread for the lock, per packet.
    bool kick = h_.kick_ || (h_.worker_wake_at_ && h_.timer_deadline() < h_.worker_wake_at_);
    g_.unlock();
    if (kick) h_.wake_.notify_all();
    for (uint16_t v : out.irqs)
      if (h_.ports_.irq) h_.ports_.irq->raise(v);
    while (sender) {
      h_.ports_.wire->transmit_many(out.frames.data(), out.frames.size());
      out.frames.clear();
      std::lock_guard<std::mutex> g(h_.mu_);
      out.frames.swap(h_.out_.frames);
      sender = !out.frames.empty();
      h_.sending_ = sender;
    }
  }

 private:
  Hca& h_;
  std::unique_lock<std::mutex> g_;
};
}  // namespace

Device::Device(const HostPorts& ports, const DeviceConfig& config) : hca_(new Hca(ports, config)) {}

Device::~Device() { stop_worker(); }

uint32_t Device::read32(uint64_t off) {
  Locked l(*hca_);
  return hca_->mmio_read32(off);
}

void Device::write32(uint64_t off, uint32_t value) {
  uint8_t b[4];
  for (int i = 0; i < 4; ++i) b[i] = uint8_t(value >> (8 * i));
  Locked l(*hca_);
  hca_->mmio_write(off, b, 4);
}

void Device::write64(uint64_t off, uint64_t value) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(value >> (8 * i));
  Locked l(*hca_);
  hca_->mmio_write(off, b, 8);
}

void Device::write_block(uint64_t off, const void* src, size_t len) {
  Locked l(*hca_);
  hca_->mmio_write(off, static_cast<const uint8_t*>(src), len);
}

uint32_t Device::config_read(uint32_t off, unsigned width) {
  Locked l(*hca_);
  return hca_->cfg_read(off, width);
}

void Device::config_write(uint32_t off, unsigned width, uint32_t value) {
  Locked l(*hca_);
  hca_->cfg_write(off, width, value);
}

void Device::flr() {
  Locked l(*hca_);
  if (hca_->state_ == FwState::kRemoved) return;
  hca_->reset(false);
}

void Device::enumerate() {
  Locked l(*hca_);
  if (hca_->state_ == FwState::kRemoved) return;
  hca_->cfg_enumerate();
}

bool Device::service() {
  Locked l(*hca_);
  return hca_->service();
}

void Device::start_worker() {
  {
    std::lock_guard<std::mutex> g(hca_->mu_);
    if (hca_->worker_.joinable()) return;
    hca_->worker_stop_ = false;
  }
  Hca* h = hca_.get();
  hca_->worker_ = std::thread([this, h] {
    for (;;) {
      {
        std::unique_lock<std::mutex> g(h->mu_);
        if (h->worker_stop_) return;
        if (!h->kick_) {
          uint64_t due = h->next_deadline();
          uint64_t now = h->now();
          if (h->manual_clock_ && due > now + 1'000'000) due = now + 1'000'000;
          if (due > now) {
            h->worker_wake_at_ = due;
            if (due == UINT64_MAX)
              h->wake_.wait(g);
            else
              h->wake_.wait_for(g, std::chrono::nanoseconds(due - now));
          }
          h->worker_wake_at_ = 0;
        }
        if (h->worker_stop_) return;
      }
      while (service()) {}
    }
  });
}

void Device::stop_worker() {
  {
    std::lock_guard<std::mutex> g(hca_->mu_);
    if (!hca_->worker_.joinable()) return;
    hca_->worker_stop_ = true;
  }
  hca_->wake_.notify_all();
  hca_->worker_.join();
}

void Device::receive_frame(const uint8_t* frame, size_t len) {
  Locked l(*hca_);
  if (hca_->state_ == FwState::kRemoved) return;
  hca_->rx_.emplace_back(frame, frame + len);
  if (!hca_->host_services_) hca_->kick_ = true;
}

void Device::set_ack_hold(uint32_t ns) {
  Locked l(*hca_);
  hca_->ack_hold_ns_ = ns;
  if (!ns) hca_->release_held(true);
}

void Device::release_due_acks() {
  if (!hca_->holding_.load(std::memory_order_relaxed)) return;
  Locked l(*hca_);
  hca_->release_held(hca_->held_until_ <= hca_->now());
}

void Device::set_host_services(bool on) {
  Locked l(*hca_);
  hca_->host_services_ = on;
}

void Device::set_faults(const Faults& f) {
  Locked l(*hca_);
  if (f.health_stall && !hca_->faults_.health_stall) hca_->freeze_health_counter();
  hca_->faults_ = f;
}

Faults Device::faults() const {
  std::lock_guard<std::mutex> g(hca_->mu_);
  return hca_->faults_;
}

void Device::inject_fatal(uint8_t syndrome) {
  Locked l(*hca_);
  if (hca_->state_ == FwState::kRemoved) return;
  hca_->enter_fatal(syndrome);
}

void Device::surprise_remove() {
  Locked l(*hca_);
  hca_->state_ = FwState::kRemoved;
}

Device::Stats Device::stats() const {
  std::lock_guard<std::mutex> g(hca_->mu_);
  return hca_->stats_;
}

const DeviceConfig& Device::config() const { return hca_->cfg_; }

Hca& Device::hca() { return *hca_; }

}  // namespace melon::mlx5::emu
