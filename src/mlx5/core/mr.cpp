// Memory keys over DMA segments: MTT translation in HCA pages (4 KiB, or larger when the segments
// allow), contiguous segments coalesced (page_list.h).
#include <string.h>

#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/page_list.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

namespace {
constexpr uint32_t kMaxMrPageShift = 30;
constexpr uint32_t kMaxMtts = 1u << 16;  // one command's mailboxes hold at most ~5000; cap below
uint8_t g_key_variant = 0x5a;  // without a random source: rotates so a stale key misses after re-registration
}  // namespace

Err Hca::create_mr(Pd* pd, uint64_t va, uint64_t len, uint32_t access, const DmaSegment* segs, uint32_t nsegs, Mr** out,
                   uint32_t max_page_shift) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  if (!pd || pd->kind != ObjKind::pd || !len || !segs || !nsegs) return Err::invalid;
  if (segments_bytes(segs, nsegs) < len) return Err::invalid;
  // Remote write/atomic need local write (IBA 10.6.3.1).
  if ((access & (kAccessRemoteWrite | kAccessRemoteAtomic)) && !(access & kAccessLocalWrite)) return Err::invalid;
  uint32_t shift = best_page_shift(segs, nsegs, va, max_page_shift ? max_page_shift : kMaxMrPageShift);
  if (!shift) {
    MLX_ERR(*hal_, mr, "segments of va 0x%llx are not 4 KiB aligned", (unsigned long long)va);
    return Err::invalid;
  }
  uint64_t nmtt = for_each_page(segs, nsegs, shift, [](uint64_t) {});
  // Each command carries at most kMaxMailboxes of MTTs.
  uint64_t cap = (uint64_t(CmdQueue::kMaxMailboxes) * p::kMailboxDataBytes - p::create_mkey_in::size_bytes) / 8;
  if (nmtt > cap || nmtt > kMaxMtts) return Err::invalid;
  uint32_t octs = uint32_t((nmtt + 1) / 2);  // MTTs come in pairs (16-byte octwords)
  uint32_t in_len = p::create_mkey_in::size_bytes + octs * 16;
  Scratch in(*hal_, in_len);
  uint8_t o[p::create_mkey_out::size_bytes] = {};
  if (!in) return Err::no_memory;
  p::cmd_set_header(in.get(), p::opcode::CREATE_MKEY, 0);
  p::create_mkey_in::view v(in.get());
  // The key's 8 variant bits: random, so no client can predict another's keys from its own
  // (ReDMArk); the firmware picks the 24-bit index.
  uint8_t key;
  if (!hal_->random_bytes(&key, 1)) key = __atomic_fetch_add(&g_key_variant, 1, __ATOMIC_RELAXED);
  auto m = v.at(p::create_mkey_in::memory_key_mkey_entry);
  p::mkc_set_access_mode(m, p::mkc_access_mode::MTT);
  m.set(p::mkc::lr, 1)
      .set(p::mkc::lw, (access & kAccessLocalWrite) != 0)
      .set(p::mkc::rr, (access & kAccessRemoteRead) != 0)
      .set(p::mkc::rw, (access & kAccessRemoteWrite) != 0)
      .set(p::mkc::a, (access & kAccessRemoteAtomic) != 0)
      .set(p::mkc::qpn, 0xffffff)
      .set(p::mkc::mkey_7_0, key)
      .set(p::mkc::pd, pd->pdn)
      .set(p::mkc::start_addr, va)
      .set(p::mkc::len, len)
      .set(p::mkc::translations_octword_size, octs)
      .set(p::mkc::log_page_size, shift);
  v.set(p::create_mkey_in::translations_octword_actual_size, octs);
  uint32_t i = 0;
  for_each_page(segs, nsegs, shift,
                [&](uint64_t pa) { p::mtt_set(v.elem(p::create_mkey_in::klm_pas_mtt, 2 * i++), pa, true, true); });
  if (Err e = cmd(in.get(), in_len, o, sizeof o); e != Err::ok) return e;
  uint32_t index = uint32_t(p::create_mkey_out::cview(o).get(p::create_mkey_out::mkey_index));
  Mr* mr = new_obj<Mr>(ObjKind::mr);
  if (!mr) {
    uint8_t din[p::destroy_mkey_in::size_bytes] = {}, dout[p::destroy_mkey_out::size_bytes] = {};
    p::cmd_set_header(din, p::opcode::DESTROY_MKEY, 0);
    p::destroy_mkey_in::view(din).set(p::destroy_mkey_in::mkey_index, index);
    cmd(din, sizeof din, dout, sizeof dout);
    return Err::no_memory;
  }
  mr->pd = pd;
  pd->refs++;
  mr->mkey = (index << 8) | key;
  mr->va = va;
  mr->len = len;
  mr->access = access;
  mr->page_shift = shift;
  mr->mtts = uint32_t(nmtt);
  MLX_DBG(*hal_, mr, "mkey 0x%x: va 0x%llx len %llu, %u MTTs of %u KiB", mr->mkey, (unsigned long long)va,
          (unsigned long long)len, mr->mtts, (1u << shift) / 1024);
  *out = mr;
  return Err::ok;
}

Err Hca::register_user_mr(Pd* pd, uint64_t addr, uint64_t len, uint32_t access, Mr** out) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  if (!pd || pd->kind != ObjKind::pd || !len) return Err::invalid;
  PinnedRange pin;
  if (hal_->dma_pin(addr, len, (access & kAccessLocalWrite) != 0, &pin) != kHalOk) return Err::no_memory;
  Scratch segs(*hal_, sizeof(DmaSegment) * pin.segments);
  if (!segs) {
    hal_->dma_unpin(pin);
    return Err::no_memory;
  }
  DmaSegment* s = reinterpret_cast<DmaSegment*>(segs.get());
  uint32_t n = hal_->dma_pinned_segments(pin, 0, s, pin.segments);
  Err e = create_mr(pd, addr, len, access, s, n, out);
  if (e != Err::ok) {
    hal_->dma_unpin(pin);
    return e;
  }
  (*out)->pin = pin;
  (*out)->pinned = true;
  return Err::ok;
}

Err Hca::query_mr(Mr* mr, MrQuery* q) {
  if (!mr || mr->kind != ObjKind::mr) return Err::invalid;
  uint8_t in[p::query_mkey_in::size_bytes] = {}, out[p::query_mkey_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::QUERY_MKEY, 0);
  p::query_mkey_in::view(in).set(p::query_mkey_in::mkey_index, mr->mkey >> 8);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  auto m = p::query_mkey_out::cview(out).at(p::query_mkey_out::memory_key_mkey_entry);
  q->pd = uint32_t(m.get(p::mkc::pd));
  q->start = m.get(p::mkc::start_addr);
  q->len = m.get(p::mkc::len);
  q->access = (m.get(p::mkc::lw) ? kAccessLocalWrite : 0) | (m.get(p::mkc::rw) ? kAccessRemoteWrite : 0) |
              (m.get(p::mkc::rr) ? kAccessRemoteRead : 0) | (m.get(p::mkc::a) ? kAccessRemoteAtomic : 0);
  q->log_page_size = uint32_t(m.get(p::mkc::log_page_size));
  q->free = m.get(p::mkc::free);
  return Err::ok;
}

Err Hca::destroy_mr(Mr* mr) {
  if (!mr || mr->kind != ObjKind::mr) return Err::invalid;
  uint8_t in[p::destroy_mkey_in::size_bytes] = {}, out[p::destroy_mkey_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::DESTROY_MKEY, 0);
  p::destroy_mkey_in::view(in).set(p::destroy_mkey_in::mkey_index, mr->mkey >> 8);
  Err e = cmd(in, sizeof in, out, sizeof out);
  if (e != Err::ok && e != Err::dead) return e;
  // Dead: the record goes, but pinned memory stays pinned until the function reset.
  if (mr->pinned && e == Err::ok) hal_->dma_unpin(mr->pin);
  if (e == Err::dead) return e;
  mr->pd->refs--;
  delete_obj(mr, sizeof(Mr));
  return Err::ok;
}

}  // namespace melon::mlx5::core
