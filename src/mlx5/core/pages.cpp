#include "mlx5/core/pages.h"

#include <string.h>

#include "mlx5/core/log.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/cmd_if.h"
#include "mlx5/prm/hca.h"
#include "mlx5/prm/mkey.h"
#include "mlx5/prm/opcodes.h"

namespace melon::mlx5::core {

namespace p = prm;

const char* page_state_name(PageState s) {
  switch (s) {
    case PageState::allocated: return "allocated";
    case PageState::given: return "given";
    case PageState::returned: return "returned";
    case PageState::quarantined: return "quarantined";
  }
  return "?";
}

void PageManager::init(Hal* hal, DmaLedger* ledger, CmdQueue* cmd) {
  hal_ = hal;
  ledger_ = ledger;
  cmd_ = cmd;
}

void PageManager::set_state(Chunk& c, uint32_t i, PageState s) {
  --counts_[uint8_t(c.state[i])];
  ++counts_[uint8_t(s)];
  c.state[i] = s;
}

Err PageManager::grow_table() {
  uint32_t cap = cap_ ? cap_ * 2 : 16;
  Chunk** t = static_cast<Chunk**>(hal_->mem_alloc(sizeof(Chunk*) * cap));
  if (!t) return Err::no_memory;
  if (chunks_) {
    memcpy(t, chunks_, sizeof(Chunk*) * nchunks_);
    hal_->mem_free(chunks_, sizeof(Chunk*) * cap_);
  }
  chunks_ = t;
  cap_ = cap;
  return Err::ok;
}

Err PageManager::take_free_page(uint32_t* chunk, uint32_t* index) {
  for (uint32_t c = 0; c < nchunks_; ++c)
    for (uint32_t i = 0; i < kPagesPerChunk; ++i)
      if (chunks_[c]->state[i] == PageState::allocated || chunks_[c]->state[i] == PageState::returned) {
        *chunk = c, *index = i;
        return Err::ok;
      }
  if (nchunks_ == cap_)
    if (Err e = grow_table(); e != Err::ok) return e;
  Chunk* c = static_cast<Chunk*>(hal_->mem_alloc(sizeof(Chunk)));
  if (!c) return Err::no_memory;
  if (Err e = ledger_->alloc(uint64_t(kPagesPerChunk) * kPageBytes, kPageBytes, &c->buf); e != Err::ok) {
    hal_->mem_free(c, sizeof(Chunk));
    return e;
  }
  for (uint32_t i = 0; i < kPagesPerChunk; ++i) c->state[i] = PageState::allocated;
  counts_[uint8_t(PageState::allocated)] += kPagesPerChunk;
  chunks_[nchunks_] = c;
  *chunk = nchunks_++, *index = 0;
  return Err::ok;
}

PageManager::Chunk* PageManager::find(uint64_t iova, uint32_t* index) {
  for (uint32_t c = 0; c < nchunks_; ++c) {
    uint64_t base = chunks_[c]->buf.iova;
    if (iova >= base && iova < base + uint64_t(kPagesPerChunk) * kPageBytes && (iova - base) % kPageBytes == 0) {
      *index = uint32_t((iova - base) / kPageBytes);
      return chunks_[c];
    }
  }
  return nullptr;
}

// Chunks with no page given or quarantined go back to the ledger.
void PageManager::free_idle_chunks() {
  uint32_t kept = 0;
  for (uint32_t c = 0; c < nchunks_; ++c) {
    Chunk* ch = chunks_[c];
    bool busy = false;
    for (uint32_t i = 0; i < kPagesPerChunk; ++i)
      busy |= ch->state[i] == PageState::given || ch->state[i] == PageState::quarantined;
    if (busy) {
      chunks_[kept++] = ch;
      continue;
    }
    for (uint32_t i = 0; i < kPagesPerChunk; ++i) --counts_[uint8_t(ch->state[i])];
    ledger_->free(ch->buf);
    hal_->mem_free(ch, sizeof(Chunk));
  }
  nchunks_ = kept;
}

Err PageManager::give(uint16_t function_id, uint32_t npages, CmdFailure* fail) {
  if (npages > limit_ || given() + npages > limit_) {
    MLX_ERR(*hal_, pages, "firmware asks for %u pages with %u given; the limit is %u", npages, given(), limit_);
    uint8_t fin[p::manage_pages_in::size_bytes] = {}, out[p::manage_pages_out::size_bytes] = {};
    p::cmd_set_header(fin, p::opcode::MANAGE_PAGES, p::manage_pages_op_mod::ALLOCATION_FAIL);
    p::manage_pages_in::view(fin).set(p::manage_pages_in::function_id, function_id);
    cmd_->exec(fin, sizeof fin, out, sizeof out, nullptr, 0, true);
    return Err::no_memory;
  }
  while (npages) {
    uint32_t n = npages < kMaxPerCommand ? npages : kMaxPerCommand;
    uint32_t in_len = p::manage_pages_in::size_bytes + n * 8;
    Scratch in(*hal_, in_len);
    uint8_t out[p::manage_pages_out::size_bytes] = {};
    if (!in) return Err::no_memory;
    p::manage_pages_in::view v(in.get());
    p::cmd_set_header(in.get(), p::opcode::MANAGE_PAGES, p::manage_pages_op_mod::ALLOCATION_SUCCESS);
    v.set(p::manage_pages_in::function_id, function_id).set(p::manage_pages_in::input_num_entries, n);
    uint32_t got = 0;
    Err e = Err::ok;
    for (; got < n; ++got) {
      uint32_t c, i;
      if ((e = take_free_page(&c, &i)) != Err::ok) break;
      set_state(*chunks_[c], i, PageState::given);
      p::pas_set(v.elem(p::manage_pages_in::pas, got), chunks_[c]->buf.iova + uint64_t(i) * kPageBytes);
    }
    if (e != Err::ok) {
      // Out of memory: undo, and tell the firmware we cannot (PRM: MANAGE_PAGES allocation fail).
      for (uint32_t k = 0; k < got; ++k) {
        uint32_t idx;
        if (Chunk* c = find(p::pas_pa(v.elem(p::manage_pages_in::pas, k)), &idx))
          set_state(*c, idx, PageState::allocated);
      }
      MLX_ERR(*hal_, pages, "cannot allocate %u pages for function %u", n, function_id);
      uint8_t fin[p::manage_pages_in::size_bytes] = {};
      p::cmd_set_header(fin, p::opcode::MANAGE_PAGES, p::manage_pages_op_mod::ALLOCATION_FAIL);
      p::manage_pages_in::view(fin).set(p::manage_pages_in::function_id, function_id);
      cmd_->exec(fin, sizeof fin, out, sizeof out, nullptr, 0, true);
      return e;
    }
    e = cmd_->exec(in.get(), in_len, out, sizeof out, fail, 0, true);
    if (e != Err::ok) {
      // A refused give leaves the pages with us; an unanswered one may have reached the device.
      PageState back = e == Err::cmd_status || e == Err::delivery ? PageState::allocated : PageState::quarantined;
      for (uint32_t k = 0; k < n; ++k) {
        uint32_t idx;
        if (Chunk* c = find(p::pas_pa(v.elem(p::manage_pages_in::pas, k)), &idx)) set_state(*c, idx, back);
      }
      MLX_ERR(*hal_, pages, "giving %u pages failed: %s; pages %s", n, err_name(e), page_state_name(back));
      return e;
    }
    given_total_ += n;
    npages -= n;
    MLX_DBG(*hal_, pages, "gave %u pages to function %u (%u given)", n, function_id, given());
  }
  return Err::ok;
}

Err PageManager::reclaim(uint16_t function_id, uint32_t npages, uint32_t* got_out, CmdFailure* fail) {
  uint32_t got_total = 0;
  while (npages) {
    uint32_t n = npages < kMaxPerCommand ? npages : kMaxPerCommand;
    uint8_t in[p::manage_pages_in::size_bytes] = {};
    uint32_t out_len = p::manage_pages_out::size_bytes + n * 8;
    Scratch out(*hal_, out_len);
    if (!out) return Err::no_memory;
    p::cmd_set_header(in, p::opcode::MANAGE_PAGES, p::manage_pages_op_mod::HCA_RETURN_PAGES);
    p::manage_pages_in::view(in)
        .set(p::manage_pages_in::function_id, function_id)
        .set(p::manage_pages_in::input_num_entries, n);
    if (Err e = cmd_->exec(in, sizeof in, out.get(), out_len, fail, 0, true); e != Err::ok) {
      if (got_out) *got_out = got_total;
      return e;
    }
    p::manage_pages_out::cview o(out.get());
    uint32_t got = uint32_t(o.get(p::manage_pages_out::output_num_entries));
    if (got > n) {
      MLX_ERR(*hal_, pages, "firmware returned %u pages for a request of %u", got, n);
      got = n;
    }
    for (uint32_t k = 0; k < got; ++k) {
      uint64_t pa = p::pas_pa(o.elem(p::manage_pages_out::pas, k));
      uint32_t idx;
      Chunk* c = find(pa, &idx);
      if (!c || c->state[idx] != PageState::given) {
        // Accounting must stay exact: a page we never gave is reported, never freed.
        ++unknown_returns_;
        MLX_ERR(*hal_, pages, "firmware returned page 0x%llx that it did not hold", (unsigned long long)pa);
        continue;
      }
      set_state(*c, idx, PageState::returned);
      ++returned_total_;
    }
    got_total += got;
    if (got < n) break;  // the firmware has no more to give back
    npages -= n;
  }
  free_idle_chunks();
  if (got_out) *got_out = got_total;
  MLX_DBG(*hal_, pages, "reclaimed %u pages (%u still given)", got_total, given());
  return Err::ok;
}

Err PageManager::satisfy_startup(uint16_t query_op_mod, CmdFailure* fail) {
  uint8_t in[p::query_pages_in::size_bytes] = {}, out[p::query_pages_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::QUERY_PAGES, query_op_mod);
  if (Err e = cmd_->exec(in, sizeof in, out, sizeof out, fail); e != Err::ok) return e;
  p::query_pages_out::cview o(out);
  int32_t n = int32_t(o.get(p::query_pages_out::num_pages));
  function_id_ = uint16_t(o.get(p::query_pages_out::function_id));
  MLX_INFO(*hal_, pages, "%s: firmware asks for %d pages",
           query_op_mod == p::query_pages_op_mod::BOOT_PAGES ? "boot" : "init", n);
  if (n <= 0) return Err::ok;
  return give(function_id_, uint32_t(n), fail);
}

Err PageManager::reclaim_all(CmdFailure* fail) {
  // Bounded: each round must bring pages back, or the firmware is keeping some.
  for (int round = 0; given() && round < 64; ++round) {
    uint32_t got = 0;
    if (Err e = reclaim(function_id_, given(), &got, fail); e != Err::ok) return e;
    if (!got) break;
  }
  if (given()) {
    MLX_ERR(*hal_, pages, "firmware kept %u pages after teardown", given());
    return Err::leak;
  }
  return Err::ok;
}

void PageManager::note_request(uint16_t function_id, int32_t npages) {
  function_id_ = function_id;
  __atomic_add_fetch(&pending_, npages, __ATOMIC_ACQ_REL);
  __atomic_store_n(&pending_flag_, true, __ATOMIC_RELEASE);
}

Err PageManager::run_pending() {
  if (__atomic_exchange_n(&busy_, true, __ATOMIC_ACQ_REL)) return Err::ok;  // already running
  Err e = Err::ok;
  while (__atomic_exchange_n(&pending_flag_, false, __ATOMIC_ACQ_REL)) {
    int32_t n = __atomic_exchange_n(&pending_, 0, __ATOMIC_ACQ_REL);
    if (n > 0) {
      MLX_INFO(*hal_, pages, "page request: give %d", n);
      e = give(function_id_, uint32_t(n), nullptr);
    } else if (n < 0) {
      MLX_INFO(*hal_, pages, "page request: take %d", -n);
      e = reclaim(function_id_, uint32_t(-n), nullptr, nullptr);
    }
  }
  __atomic_store_n(&busy_, false, __ATOMIC_RELEASE);
  return e;
}

void PageManager::quarantine_given() {
  for (uint32_t c = 0; c < nchunks_; ++c)
    for (uint32_t i = 0; i < kPagesPerChunk; ++i)
      if (chunks_[c]->state[i] == PageState::given) set_state(*chunks_[c], i, PageState::quarantined);
}

void PageManager::reset_done() {
  for (uint32_t c = 0; c < nchunks_; ++c)
    for (uint32_t i = 0; i < kPagesPerChunk; ++i)
      if (chunks_[c]->state[i] == PageState::given || chunks_[c]->state[i] == PageState::quarantined)
        set_state(*chunks_[c], i, PageState::returned);
  __atomic_store_n(&pending_, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&pending_flag_, false, __ATOMIC_RELEASE);
  free_idle_chunks();
}

uint32_t PageManager::destroy() {
  uint32_t left = given() + count(PageState::quarantined);
  for (uint32_t c = 0; c < nchunks_; ++c) {
    bool unsafe = false;
    for (uint32_t i = 0; i < kPagesPerChunk; ++i) {
      unsafe |= chunks_[c]->state[i] == PageState::given || chunks_[c]->state[i] == PageState::quarantined;
      --counts_[uint8_t(chunks_[c]->state[i])];
    }
    ledger_->free(chunks_[c]->buf, unsafe);
    hal_->mem_free(chunks_[c], sizeof(Chunk));
  }
  if (chunks_) hal_->mem_free(chunks_, sizeof(Chunk*) * cap_);
  chunks_ = nullptr;
  nchunks_ = cap_ = 0;
  return left;
}

}  // namespace melon::mlx5::core
