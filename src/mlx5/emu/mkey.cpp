// Memory keys (PRM "Memory Key"; Linux mr.c, rdma-core mlx5_vfio.c): PA and MTT translation, the
// PD and access rights checked on every use, and the length the key covers.
#include <string.h>

#include <random>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
using S = prm::cmd_status::Value;
constexpr uint32_t kNoQp = 0xffffff;
}  // namespace

CmdStatus Hca::create_mkey(Cmd& c) {
  prm::create_mkey_in::cview in(c.in);
  auto m = in.at(prm::create_mkey_in::memory_key_mkey_entry);
  namespace k = prm::mkc;
  Mkey mk;
  mk.access_mode = prm::mkc_get_access_mode(m);
  mk.pd = uint32_t(m.get(k::pd));
  mk.key8 = uint8_t(m.get(k::mkey_7_0));
  mk.lr = m.get(k::lr), mk.lw = m.get(k::lw), mk.rr = m.get(k::rr), mk.rw = m.get(k::rw), mk.a = m.get(k::a);
  mk.start = m.get(k::start_addr);
  mk.len = m.get(k::len);
  mk.len64 = m.get(k::length64);
  mk.log_page_size = uint8_t(m.get(k::log_page_size));
  mk.free = m.get(k::free);
  mk.en_rinval = m.get(k::en_rinval);
  if (mk.access_mode != prm::mkc_access_mode::PA && mk.access_mode != prm::mkc_access_mode::MTT)
    return fail(S::BAD_PARAM_ERR, synd::BAD_ACCESS_MODE);  // KLM/KSM: not on this model
  if (m.get(k::qpn) != kNoQp) return fail(S::BAD_PARAM_ERR, synd::BAD_MKEY_QPN);
  // pg_access (rdma-core's mlx5_vfio sets it on every MR): the MTT entries' rd_en/wr_en say which
  // pages are present; a page with neither is refused here (this model has no page faults).
  bool pg_access = in.get(prm::create_mkey_in::pg_access);
  if (m.get(k::bsf_en) || in.get(prm::create_mkey_in::mkey_umem_valid))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  if (!pds_.count(mk.pd)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_PD);
  if (mk.access_mode == prm::mkc_access_mode::MTT) {
    if (mk.len64) return fail(S::BAD_PARAM_ERR, synd::BAD_MKEY_LENGTH);
    // 4 KiB up to the 5-bit field's 2 GiB: rdma-core's mlx5_vfio caps a buffer's spanning page at
    // 2^31 (MLX5_MAX_PAGE_SHIFT), and Linux's mlx5_ib offers every size the field holds.
    if (mk.log_page_size < 12 || mk.log_page_size > 31) return fail(S::BAD_PARAM_ERR, synd::BAD_PAGE_SIZE);
    uint64_t pg = 1ull << mk.log_page_size;
    uint64_t need = (mk.start % pg + mk.len + pg - 1) / pg;
    uint64_t given = uint64_t(in.get(prm::create_mkey_in::translations_octword_actual_size)) * 2;
    uint64_t room = (c.in_len - prm::create_mkey_in::size_bytes) / prm::kMttBytes;
    if (given > room || given < need) return fail(S::BAD_PARAM_ERR, synd::MTT_TOO_SHORT);
    mk.mtt.resize(need);
    for (uint64_t i = 0; i < need; ++i) {
      const uint8_t* e = in.elem(prm::create_mkey_in::klm_pas_mtt, uint32_t(i * 2));
      uint64_t pa = prm::mtt_pa(e);
      if (pa % pg) return fail(S::BAD_PARAM_ERR, synd::PAGE_NOT_ALIGNED);
      if (pg_access && !prm::get(e, prm::mtt::rd_en) && !prm::get(e, prm::mtt::wr_en))
        return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
      mk.mtt[i] = pa;
    }
  } else if (!mk.len64 && mk.start + mk.len < mk.start) {
    return fail(S::BAD_PARAM_ERR, synd::BAD_MKEY_LENGTH);
  }
  if (mkeys_.size() >= (1u << prm::get(cur_caps_, prm::cmd_hca_cap::log_max_mkey)))
    return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  // The firmware picks the index; this one picks it at random among all the device has (how
  // ConnectX firmware picks is not documented). With the driver's random 8-bit variant an R_Key then
  // has log_max_mkey + 8 unpredictable bits, and no client learns another's keys from its own.
  uint32_t space = 1u << prm::get(cur_caps_, prm::cmd_hca_cap::log_max_mkey);
  if (!mkey_rng_) {
    std::random_device rd;
    mkey_rng_ = (uint64_t(rd()) << 32 | rd()) | 1;
  }
  uint32_t idx;
  do {
    mkey_rng_ ^= mkey_rng_ << 13, mkey_rng_ ^= mkey_rng_ >> 7, mkey_rng_ ^= mkey_rng_ << 17;
    idx = 1 + uint32_t(mkey_rng_ % (space - 1));
  } while (mkeys_.count(idx));
  uint64_t icm = icm_alloc(prm::mkc::size_bytes);
  if (icm == kNoIcm) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  if (!icm_write(icm, m.data(), prm::mkc::size_bytes)) return fail(S::INT_ERR, synd::PAGE_DMA_FAULT);
  mk.index = idx;
  icm_keep(IcmObj::mkey, idx, icm);
  mkeys_[idx] = std::move(mk);
  prm::create_mkey_out::view(c.out).set(prm::create_mkey_out::mkey_index, idx);
  return {};
}

CmdStatus Hca::destroy_mkey(Cmd& c) {
  uint32_t idx = uint32_t(prm::destroy_mkey_in::cview(c.in).get(prm::destroy_mkey_in::mkey_index));
  auto it = mkeys_.find(idx);
  if (it == mkeys_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_MKEY);
  icm_release(IcmObj::mkey, idx);
  mkeys_.erase(it);
  return {};
}

CmdStatus Hca::query_mkey(Cmd& c) {
  uint32_t idx = uint32_t(prm::query_mkey_in::cview(c.in).get(prm::query_mkey_in::mkey_index));
  auto it = mkeys_.find(idx);
  if (it == mkeys_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_MKEY);
  const Mkey& mk = it->second;
  auto m = prm::query_mkey_out::view(c.out).at(prm::query_mkey_out::memory_key_mkey_entry);
  namespace k = prm::mkc;
  prm::mkc_set_access_mode(m, mk.access_mode);
  m.set(k::lr, mk.lr).set(k::lw, mk.lw).set(k::rr, mk.rr).set(k::rw, mk.rw).set(k::a, mk.a);
  m.set(k::free, mk.free).set(k::en_rinval, mk.en_rinval);
  m.set(k::qpn, kNoQp).set(k::mkey_7_0, mk.key8).set(k::length64, mk.len64).set(k::pd, mk.pd);
  m.set(k::start_addr, mk.start).set(k::len, mk.len).set(k::log_page_size, mk.log_page_size);
  m.set(k::translations_octword_size, (mk.mtt.size() + 1) / 2);
  return {};
}

// Resolves [va, va+len) of key `key` for an access by PD `pd` into IOVA segments. Returns 0 when
// allowed, else why not, numbered as rc::MemStatus (1 bad key, 2 wrong PD, 3 out of range, 4 no access).
uint8_t Hca::mkey_resolve(uint32_t key, uint32_t pd, uint64_t va, uint64_t len, uint32_t access,
                          std::vector<IovaSeg>* segs) {
  auto it = mkeys_.find(key >> 8);
  if (it == mkeys_.end() || it->second.key8 != uint8_t(key) || it->second.free) return 1;
  const Mkey& mk = it->second;
  if (mk.pd != pd) return 2;
  bool remote = access & kAccRemote;
  if (!mk.len64 && (va < mk.start || len > mk.len || va - mk.start > mk.len - len)) return 3;
  if ((access & kAccWrite) && !(remote ? mk.rw : mk.lw)) return 4;
  if ((access & kAccRead) && remote && !mk.rr) return 4;
  if ((access & kAccAtomic) && !mk.a) return 4;
  if (segs) segs->clear();
  if (len == 0) return 0;
  if (mk.access_mode == prm::mkc_access_mode::PA) {
    if (segs) segs->push_back({va, len});
    return 0;
  }
  uint64_t pg = 1ull << mk.log_page_size;
  uint64_t base = mk.start & ~(pg - 1);
  uint64_t at = va;
  while (at < va + len) {
    uint64_t page = (at - base) / pg;
    uint64_t in_page = (at - base) % pg;
    uint64_t n = pg - in_page < va + len - at ? pg - in_page : va + len - at;
    uint64_t iova = mk.mtt[page] + in_page;
    if (segs) {
      if (!segs->empty() && segs->back().iova + segs->back().len == iova)
        segs->back().len += n;  // contiguous pages merge into one DMA
      else
        segs->push_back({iova, n});
    }
    at += n;
  }
  return 0;
}

}  // namespace melon::mlx5::emu
