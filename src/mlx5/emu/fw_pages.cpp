// Firmware pages (PRM "ICM pages"; the driver side is Linux pagealloc.c and rdma-core mlx5_vfio.c):
// the device asks for host pages at boot, before INIT_HCA and later through PAGE_REQUEST events
// (a negative count asks the driver to take pages back). It keeps its object contexts in them (ICM),
// so every page it holds is tracked, and a page is never touched once given back.
#include <string.h>

#include <stdio.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
using S = prm::cmd_status::Value;
constexpr uint32_t kPage = 4096;
constexpr uint32_t kSlot = 256;  // one object context per ICM slot
constexpr uint32_t kMaxPages = 1u << 16;  // what this model accepts in total (256 MiB)
}  // namespace

CmdStatus Hca::query_pages(Cmd& c) {
  prm::query_pages_in::cview in(c.in);
  if (in.get(prm::query_pages_in::function_id) || in.get(prm::query_pages_in::embedded_cpu_function))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FUNCTION_ID);
  int32_t held = int32_t(pages_.size()), n = 0;
  switch (c.op_mod) {
    case prm::query_pages_op_mod::BOOT_PAGES: n = int32_t(cfg_.boot_pages) - held; break;
    case prm::query_pages_op_mod::INIT_PAGES: n = int32_t(cfg_.boot_pages + cfg_.init_pages) - held; break;
    default: n = regular_pages_owed_; break;
  }
  if (c.op_mod != prm::query_pages_op_mod::REGULAR_PAGES && n < 0) n = 0;
  prm::query_pages_out::view(c.out).set(prm::query_pages_out::num_pages, uint32_t(n));
  return {};
}

CmdStatus Hca::manage_pages(Cmd& c) {
  prm::manage_pages_in::cview in(c.in);
  if (in.get(prm::manage_pages_in::function_id) || in.get(prm::manage_pages_in::embedded_cpu_function))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FUNCTION_ID);
  uint32_t n = uint32_t(in.get(prm::manage_pages_in::input_num_entries));
  if (c.op_mod == prm::manage_pages_op_mod::ALLOCATION_FAIL) {
    if (regular_pages_owed_ > 0) regular_pages_owed_ = 0;  // the driver could not: stop asking
    return {};
  }
  if (c.op_mod == prm::manage_pages_op_mod::ALLOCATION_SUCCESS) {
    if (uint64_t(n) * 8 > c.in_len - prm::manage_pages_in::size_bytes)
      return fail(S::BAD_INP_LEN_ERR, synd::PAGE_ENTRIES_MISMATCH);
    if (pages_.size() + n > kMaxPages) return fail(S::BAD_PARAM_ERR, synd::TOO_MANY_PAGES);
    // Check every page before taking any: the command either takes all or none.
    std::set<uint64_t> batch;
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t pa = prm::get_bits(in.elem(prm::manage_pages_in::pas, i), 0, 64);
      if (pa % kPage) return fail(S::BAD_PARAM_ERR, synd::PAGE_NOT_ALIGNED);
      if (pages_.count(pa) || !batch.insert(pa).second) return fail(S::BAD_PARAM_ERR, synd::PAGE_ALREADY_GIVEN);
    }
    // Firmware clears the pages it is given (ICM starts zeroed); an unmapped page fails here.
    static const uint8_t kZero[kPage] = {};
    for (uint64_t pa : batch)
      if (!dma_write(pa, kZero, kPage)) return fail(S::BAD_PARAM_ERR, synd::PAGE_DMA_FAULT);
    for (uint64_t pa : batch) {
      pages_[pa] = FwPage{pa, false};
      returned_pages_.erase(pa);
    }
    stats_.fw_pages_held = uint32_t(pages_.size());
    if (regular_pages_owed_ > 0)
      regular_pages_owed_ -= int32_t(n) < regular_pages_owed_ ? int32_t(n) : regular_pages_owed_;
    boot_pages_done_ = boot_pages_done_ || pages_.size() >= cfg_.boot_pages;
    init_pages_done_ = init_pages_done_ || pages_.size() >= cfg_.boot_pages + cfg_.init_pages;
    return {};
  }
  // HCA_RETURN_PAGES: hand back up to n pages that hold no contexts.
  uint32_t room = (c.out_len - prm::manage_pages_out::size_bytes) / 8;
  if (n > room) return fail(S::BAD_OUTP_LEN_ERR, synd::PAGE_ENTRIES_MISMATCH);
  prm::manage_pages_out::view out(c.out);
  uint32_t given = 0;
  for (auto it = pages_.begin(); it != pages_.end() && given < n;) {
    if (it->second.used) {
      ++it;
      continue;
    }
    prm::set_bits(out.elem(prm::manage_pages_out::pas, given++), 0, 64, it->first);
    returned_pages_.insert(it->first);
    it = pages_.erase(it);
  }
  out.set(prm::manage_pages_out::output_num_entries, given);
  stats_.fw_pages_held = uint32_t(pages_.size());
  if (regular_pages_owed_ < 0)
    regular_pages_owed_ += int32_t(given) < -regular_pages_owed_ ? int32_t(given) : -regular_pages_owed_;
  return {};
}

void Hca::page_request(int32_t npages) {
  if (npages == 0) return;
  Eq* eq = eq_for_event(prm::event_type::PAGE_REQUEST);
  if (!eq) return;  // announced when an EQ for it appears, and always visible to QUERY_PAGES
  uint8_t data[28] = {};
  prm::set(data, prm::pages_req_event::function_id, 0);
  prm::set(data, prm::pages_req_event::num_pages, uint32_t(npages));
  post_eqe(*eq, prm::event_type::PAGE_REQUEST, 0, data);
}

uint64_t Hca::icm_alloc(uint32_t bytes) {
  uint32_t need = (bytes + kSlot - 1) / kSlot * kSlot;
  if (need > kPage) return kNoIcm;
  for (auto& [iova, page] : pages_) {
    // First fit inside one page.
    for (uint32_t off = 0; off + need <= kPage; off += kSlot) {
      uint64_t a = iova + off;
      bool clash = false;
      auto it = icm_slots_.upper_bound(a + need - 1);
      if (it != icm_slots_.begin()) {
        --it;
        clash = it->first + it->second > a;
      }
      if (clash) continue;
      icm_slots_[a] = need;
      page.used = true;
      return a;
    }
  }
  // Out of ICM: ask for more (real firmware asks before it runs out; this model asks when it does).
  if (cfg_.trace_commands)
    fprintf(stderr, "emu: out of ICM (%zu pages, %zu slots)\n", pages_.size(), icm_slots_.size());
  regular_pages_owed_ += int32_t(cfg_.regular_pages);
  page_request(int32_t(cfg_.regular_pages));
  return kNoIcm;
}

void Hca::icm_free(uint64_t a) {
  auto it = icm_slots_.find(a);
  if (it == icm_slots_.end()) return;
  icm_slots_.erase(it);
  uint64_t page = a & ~uint64_t(kPage - 1);
  auto lo = icm_slots_.lower_bound(page);
  auto p = pages_.find(page);
  if (p != pages_.end()) p->second.used = lo != icm_slots_.end() && lo->first < page + kPage;
}

bool Hca::icm_write(uint64_t a, const void* ctx, uint32_t len) {
  uint64_t page = a & ~uint64_t(kPage - 1);
  if (!pages_.count(page)) {
    if (returned_pages_.count(page)) ++stats_.page_use_after_take;
    return false;
  }
  if (!dma_write(a, ctx, len)) {
    // The host pulled a page the firmware still owns: an ICM fetch fault is fatal (health.c).
    enter_fatal(prm::health_syndrome::ICM_FETCH_PCI_ERR);
    return false;
  }
  return true;
}

void Hca::release_all_pages_to_driver() {
  for (auto& [iova, p] : pages_) p.used = false;
  icm_slots_.clear();
}

}  // namespace melon::mlx5::emu
