#include "dext/emuhost/emu_hal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/random.h>
#endif

#include <chrono>
#include <thread>

namespace melon::dext {

namespace core = mlx5::core;

EmuHal::EmuHal(mlx5::emu::Device& dev, mlx5::emu::TestHost& host, mlx5::emu::ManualClock* clock,
               const EmuHalOptions& opt)
    : dev_(dev), host_(host), clock_(clock), opt_(opt) {
  // The handler runs under irq_mu_, so vector_disable() returns only once no call is in flight
  // (as an interrupt dispatch source's cancel does).
  host_.on_irq = [this](uint16_t v) {
    std::lock_guard<std::mutex> l(irq_mu_);
    if (v < 64 && handlers_[v]) handlers_[v]->on_vector(v);
  };
}

EmuHal::~EmuHal() { host_.on_irq = nullptr; }

// The device's registers are big-endian and BAR0 moves bytes little-endian: swap, as
// ioread32be/iowrite32be do.
uint32_t EmuHal::read32(uint32_t off) { return __builtin_bswap32(dev_.read32(off)); }
void EmuHal::write32(uint32_t off, uint32_t value) { dev_.write32(off, __builtin_bswap32(value)); }
void EmuHal::write64(uint32_t off, uint64_t value) { dev_.write64(off, __builtin_bswap64(value)); }
uint64_t EmuHal::bar_size() { return mlx5::emu::kBar0Bytes; }

uint16_t EmuHal::config_read16(uint32_t off) { return uint16_t(dev_.config_read(off, 2)); }
void EmuHal::config_write16(uint32_t off, uint16_t value) { dev_.config_write(off, 2, value); }

int EmuHal::function_reset() {
  dev_.flr();
  dev_.enumerate();  // Linux's pci_reset_function restores the configuration it saved
  resets_++;
  return core::kHalOk;
}

int EmuHal::dma_alloc(uint64_t size, uint64_t align, core::DmaBuffer* out) {
  if (fail_allocs_ > 0) {
    fail_allocs_--;
    return core::kHalNoMemory;
  }
  if (fail_after_ >= 0 && fail_after_-- == 0) return core::kHalNoMemory;
  auto b = host_.alloc(size, align < mlx5::emu::TestHost::kPage ? mlx5::emu::TestHost::kPage : align);
  if (!b) return core::kHalNoMemory;
  *out = {b.va, b.iova, b.len, b.iova};
  dma_live_++;
  return core::kHalOk;
}

void EmuHal::dma_free(const core::DmaBuffer& buf) {
  if (host_.free(buf.iova)) dma_live_--;
}

// Each host page gets its own IOVA window (as an IOMMU on macOS may hand them out), so the core
// sees one segment per host page unless they happen to be contiguous.
int EmuHal::dma_pin(uint64_t addr, uint64_t len, bool, core::PinnedRange* out) {
  if (!addr || !len) return core::kHalFault;
  std::vector<core::DmaSegment> segs;
  uint64_t page = opt_.pin_per_host_page ? opt_.host_page_size : len + addr;
  for (uint64_t a = addr; a < addr + len;) {
    uint64_t end = opt_.pin_per_host_page ? ((a / page) + 1) * page : addr + len;
    if (end > addr + len) end = addr + len;
    uint64_t iova = host_.map(reinterpret_cast<void*>(a), end - a);
    if (!iova) {
      for (auto& s : segs) host_.unmap(s.iova);
      return core::kHalFault;
    }
    segs.push_back({iova, end - a});
    a = end;
  }
  std::lock_guard<std::mutex> l(mu_);
  out->token = next_pin_++;
  out->segments = uint32_t(segs.size());
  pins_[out->token] = std::move(segs);
  return core::kHalOk;
}

uint32_t EmuHal::dma_pinned_segments(const core::PinnedRange& r, uint32_t first, core::DmaSegment* out, uint32_t max) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pins_.find(r.token);
  if (it == pins_.end()) return 0;
  uint32_t n = 0;
  for (uint32_t i = first; i < it->second.size() && n < max; ++i) out[n++] = it->second[i];
  return n;
}

void EmuHal::dma_unpin(const core::PinnedRange& r) {
  std::vector<core::DmaSegment> segs;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = pins_.find(r.token);
    if (it == pins_.end()) return;
    segs = std::move(it->second);
    pins_.erase(it);
  }
  for (auto& s : segs) host_.unmap(s.iova);
}

uint64_t EmuHal::pinned_ranges() const {
  std::lock_guard<std::mutex> l(mu_);
  return pins_.size();
}

uint32_t EmuHal::vector_count() { return opt_.interrupts ? dev_.config().msix_vectors : 0; }

int EmuHal::vector_enable(uint32_t vector, core::VectorHandler* h) {
  if (vector >= 64 || vector >= vector_count()) return core::kHalUnsupported;
  std::lock_guard<std::mutex> l(irq_mu_);
  handlers_[vector] = h;
  return core::kHalOk;
}

void EmuHal::vector_disable(uint32_t vector) {
  std::lock_guard<std::mutex> l(irq_mu_);
  if (vector < 64) handlers_[vector] = nullptr;
}

bool EmuHal::random_bytes(void* p, size_t n) {
#if defined(__linux__)
  return getrandom(p, n, 0) == ssize_t(n);
#else
  arc4random_buf(p, n);  // libSystem's (stdlib.h): never fails
  return true;
#endif
}

uint64_t EmuHal::now_ns() {
  if (clock_) return clock_->now_ns();
  return uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Deterministic: the device does its work now and virtual time moves by the delay.
void EmuHal::delay_us(uint32_t us) {
  if (clock_) {
    clock_->advance(uint64_t(us) * 1000);
    dev_.service();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void* EmuHal::lock_create() { return new std::mutex; }
void EmuHal::lock_destroy(void* l) { delete static_cast<std::mutex*>(l); }
void EmuHal::lock(void* l) { static_cast<std::mutex*>(l)->lock(); }
void EmuHal::unlock(void* l) { static_cast<std::mutex*>(l)->unlock(); }

void* EmuHal::mem_alloc(size_t size) {
  void* p = calloc(1, size);
  if (p) mem_bytes_ += int64_t(size);
  return p;
}

void EmuHal::mem_free(void* p, size_t size) {
  if (!p) return;
  mem_bytes_ -= int64_t(size);
  free(p);
}

void EmuHal::log(core::LogLevel level, const char* line) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (log_.size() < 100000) log_.emplace_back(line);
  }
  if (opt_.echo_log && level <= opt_.echo_level) fprintf(stderr, "%s\n", line);
}

std::vector<std::string> EmuHal::log_lines() const {
  std::lock_guard<std::mutex> l(mu_);
  return log_;
}

bool EmuHal::logged(const std::string& needle) const {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& s : log_)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

void EmuHal::clear_log() {
  std::lock_guard<std::mutex> l(mu_);
  log_.clear();
}

}  // namespace melon::dext
