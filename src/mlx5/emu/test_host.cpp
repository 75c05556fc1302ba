#include "mlx5/emu/test_host.h"

#include <stdlib.h>
#include <string.h>

namespace melon::mlx5::emu {

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }
}  // namespace

TestHost::~TestHost() {
  for (auto& [iova, m] : maps_)
    if (m.owned) ::free(m.host);
}

TestHost::Buffer TestHost::alloc(size_t len, size_t align) {
  if (len == 0) len = 1;
  if (align < kPage) align = kPage;
  size_t bytes = round_up(len, kPage);
  void* p = aligned_alloc(kPage, bytes);
  if (!p) return {};
  memset(p, 0, bytes);
  std::lock_guard<std::mutex> g(mu_);
  uint64_t iova = round_up(next_iova_, align);
  next_iova_ = iova + bytes + kPage;  // one unmapped guard page after every window
  maps_[iova] = Mapping{iova, bytes, static_cast<uint8_t*>(p), true};
  return Buffer{p, iova, len};
}

bool TestHost::free(uint64_t iova) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = maps_.find(iova);
  if (it == maps_.end() || !it->second.owned) return false;
  ::free(it->second.host);
  maps_.erase(it);
  return true;
}

uint64_t TestHost::map(void* va, size_t len, size_t align) {
  if (align < kPage) align = kPage;
  uintptr_t start = reinterpret_cast<uintptr_t>(va) & ~uintptr_t(kPage - 1);
  size_t off = reinterpret_cast<uintptr_t>(va) - start;
  size_t bytes = round_up(off + (len ? len : 1), kPage);
  std::lock_guard<std::mutex> g(mu_);
  uint64_t iova = round_up(next_iova_, align);
  next_iova_ = iova + bytes + kPage;
  maps_[iova] = Mapping{iova, bytes, reinterpret_cast<uint8_t*>(start), false};
  return iova + off;
}

bool TestHost::unmap(uint64_t iova) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = maps_.find(iova & ~uint64_t(kPage - 1));
  if (it == maps_.end() || it->second.owned) return false;
  maps_.erase(it);
  return true;
}

const TestHost::Mapping* TestHost::find(uint64_t iova, size_t len) const {
  auto it = maps_.upper_bound(iova);
  if (it == maps_.begin()) return nullptr;
  --it;
  const Mapping& m = it->second;
  if (iova < m.iova || len > m.len || iova - m.iova > m.len - len) return nullptr;
  return &m;
}

void* TestHost::va(uint64_t iova, size_t len) const {
  std::lock_guard<std::mutex> g(mu_);
  const Mapping* m = find(iova, len);
  return m ? m->host + (iova - m->iova) : nullptr;
}

uint64_t TestHost::iova_of(const void* va) const {
  auto p = static_cast<const uint8_t*>(va);
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [iova, m] : maps_)
    if (p >= m.host && p < m.host + m.len) return iova + uint64_t(p - m.host);
  return 0;
}

size_t TestHost::mapped_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  size_t n = 0;
  for (auto& [iova, m] : maps_) n += m.len;
  return n;
}

uint8_t* TestHost::bytes_at(uint64_t iova, size_t len) {
  if (const Mapping* m = find(iova, len)) return m->host + (iova - m->iova);
  ++faults_;
  last_fault_ = iova;
  return nullptr;
}

bool TestHost::read(uint64_t iova, void* dst, size_t len) {
  {
    std::lock_guard<std::mutex> g(mu_);
    const uint8_t* p = bytes_at(iova, len);
    if (!p) return false;
    memcpy(dst, p, len);
  }
  if (on_read) on_read(iova, len);
  return true;
}

bool TestHost::write(uint64_t iova, const void* src, size_t len) {
  {
    std::lock_guard<std::mutex> g(mu_);
    uint8_t* p = bytes_at(iova, len);
    if (!p) return false;
    memcpy(p, src, len);
  }
  if (on_write) on_write(iova, len);
  return true;
}

bool TestHost::writable(uint64_t iova, size_t len) {
  std::lock_guard<std::mutex> g(mu_);
  return bytes_at(iova, len) != nullptr;
}

void TestHost::raise(uint16_t vector) {
  if (vector < kVectors) {
    std::lock_guard<std::mutex> g(irq_mu_);
    ++irqs_[vector];
  }
  irq_cv_.notify_all();
  if (on_irq) on_irq(vector);
}

uint64_t TestHost::irq_count(uint16_t vector) const { return vector < kVectors ? irqs_[vector].load() : 0; }

uint64_t TestHost::wait_irq(uint16_t vector, uint64_t seen, unsigned timeout_ms) {
  if (vector >= kVectors) return 0;
  std::unique_lock<std::mutex> g(irq_mu_);
  irq_cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), [&] { return irqs_[vector].load() > seen; });
  return irqs_[vector].load();
}

}  // namespace melon::mlx5::emu
