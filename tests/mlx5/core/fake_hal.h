// A small fake device behind the HAL, for the command interface and the page manager on their own:
// a command queue engine that reads entries and mailboxes from host memory (IOVA = address + a
// fixed offset), hands the input to a per-test responder, writes the output back and clears the
// ownership bit. Faults: never answer (timeout), a delivery status. Everything the emulator does
// beyond that is tested on the emulator (bring_up_test.cpp and friends).
#pragma once

#include <stdlib.h>
#include <string.h>

#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "mlx5/core/cmd_queue.h"
#include "mlx5/core/hal.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core::test {

namespace p = prm;

class FakeHal : public Hal {
 public:
  static constexpr uint64_t kIovaOffset = 0x100000000000ull;  // IOVAs are not addresses
  using Responder = std::function<void(const std::vector<uint8_t>& in, std::vector<uint8_t>& out)>;

  FakeHal() {
    bar_.assign(0x2000, 0);
    set_be32(0x04, 5u << 16);  // cmdif rev 5
    set_be32(0x14, (5u << 4) | 6u);  // 32 slots, 64-byte stride
  }
  ~FakeHal() {
    for (auto* p : allocs_) free(p);
  }

  Responder respond;  // default: status OK, output zero
  bool never_complete = false;
  uint8_t delivery_status = 0;
  std::vector<uint32_t> completed_slots;

  uint32_t read32(uint32_t off) override { return get_be32(off); }
  void write32(uint32_t off, uint32_t v) override {
    if (off == p::init_seg_offset::cmd_dbell) return ring(v);
    set_be32(off, v);
    if (off == p::init_seg_offset::cmdq_addr_l_sz)  // keep the geometry bits the device owns
      set_be32(off, (v & 0xfffff000u) | (5u << 4) | 6u);
  }
  void write64(uint32_t, uint64_t) override {}
  uint64_t bar_size() override { return bar_.size(); }
  uint16_t config_read16(uint32_t) override { return 0; }
  void config_write16(uint32_t, uint16_t) override {}
  int function_reset() override { return 0; }
  uint32_t host_page_size() override { return 16384; }
  int dma_alloc(uint64_t size, uint64_t align, DmaBuffer* out) override {
    if (fail_allocs > 0) {
      --fail_allocs;
      return kHalNoMemory;
    }
    void* p = aligned_alloc(align, size);
    memset(p, 0, size);
    allocs_.insert(p);
    *out = {p, uint64_t(uintptr_t(p)) + kIovaOffset, size, 0};
    ++dma_live;
    return 0;
  }
  void dma_free(const DmaBuffer& b) override {
    allocs_.erase(b.va);
    free(b.va);
    --dma_live;
  }
  int dma_pin(uint64_t, uint64_t, bool, PinnedRange*) override { return kHalUnsupported; }
  uint32_t dma_pinned_segments(const PinnedRange&, uint32_t, DmaSegment*, uint32_t) override { return 0; }
  void dma_unpin(const PinnedRange&) override {}
  uint32_t vector_count() override { return 0; }
  int vector_enable(uint32_t, VectorHandler*) override { return kHalUnsupported; }
  void vector_disable(uint32_t) override {}
  void schedule_service() override {}
  uint64_t now_ns() override { return now; }
  void delay_us(uint32_t us) override { now += uint64_t(us) * 1000; }
  void* lock_create() override { return new std::mutex; }
  void lock_destroy(void* l) override { delete static_cast<std::mutex*>(l); }
  void lock(void* l) override { static_cast<std::mutex*>(l)->lock(); }
  void unlock(void* l) override { static_cast<std::mutex*>(l)->unlock(); }
  void* mem_alloc(size_t n) override {
    if (fail_mem > 0) {
      --fail_mem;
      return nullptr;
    }
    mem_bytes += int64_t(n);
    return calloc(1, n);
  }
  void mem_free(void* q, size_t n) override {
    mem_bytes -= int64_t(n);
    free(q);
  }
  void log(LogLevel, const char* line) override { lines.emplace_back(line); }

  bool logged(const std::string& s) const {
    for (auto& l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }

  uint64_t now = 1;
  int64_t dma_live = 0, mem_bytes = 0;
  int fail_allocs = 0;  // dma_alloc calls to fail
  int fail_mem = 0;  // mem_alloc calls to fail
  std::vector<std::string> lines;
  uint64_t cmds = 0;

 private:
  static uint8_t* va(uint64_t iova) { return reinterpret_cast<uint8_t*>(uintptr_t(iova - kIovaOffset)); }
  uint32_t get_be32(uint32_t off) const {
    return (uint32_t(bar_[off]) << 24) | (uint32_t(bar_[off + 1]) << 16) | (uint32_t(bar_[off + 2]) << 8) |
           bar_[off + 3];
  }
  void set_be32(uint32_t off, uint32_t v) {
    bar_[off] = uint8_t(v >> 24), bar_[off + 1] = uint8_t(v >> 16), bar_[off + 2] = uint8_t(v >> 8),
    bar_[off + 3] = uint8_t(v);
  }
  // The device side of the command interface (PRM): gather input, run, scatter output, hand back.
  void ring(uint32_t bits) {
    uint64_t q = (uint64_t(get_be32(0x10)) << 32) | (get_be32(0x14) & 0xfffff000u);
    for (uint32_t s = 0; s < 32; ++s) {
      if (!(bits & (1u << s))) continue;
      uint8_t* e = va(q) + s * 64;
      if (never_complete) continue;
      ++cmds;
      p::cmd_queue_entry::view v(e);
      uint32_t ilen = uint32_t(v.get(p::cmd_queue_entry::input_length));
      uint32_t olen = uint32_t(v.get(p::cmd_queue_entry::output_length));
      std::vector<uint8_t> in(ilen), out(olen);
      memcpy(in.data(), v.bytes(p::cmd_queue_entry::command_input_inline_data), ilen < 16 ? ilen : 16);
      uint64_t box = p::cmd_entry_in_mailbox(e);
      for (uint32_t off = 16; off < ilen; off += 512) {
        uint32_t n = ilen - off < 512 ? ilen - off : 512;
        memcpy(in.data() + off, va(box), n);
        box = p::mailbox_next(va(box));
      }
      if (respond) respond(in, out);
      memcpy(v.bytes(p::cmd_queue_entry::command_output_inline_data), out.data(), olen < 16 ? olen : 16);
      box = p::cmd_entry_out_mailbox(e);
      for (uint32_t off = 16; off < olen; off += 512) {
        uint32_t n = olen - off < 512 ? olen - off : 512;
        memcpy(va(box), out.data() + off, n);
        box = p::mailbox_next(va(box));
      }
      v.set(p::cmd_queue_entry::status, delivery_status);
      completed_slots.push_back(s);
      __atomic_store_n(e + 63, uint8_t(e[63] & ~1u), __ATOMIC_RELEASE);
    }
  }
  std::vector<uint8_t> bar_;
  std::set<void*> allocs_;
};

// A CmdWaitHooks that never has anything to do.
struct NoHooks : CmdWaitHooks {
  void cmd_wait_idle() override {}
  bool cmd_device_dead() override { return dead; }
  bool dead = false;
};

}  // namespace melon::mlx5::core::test
