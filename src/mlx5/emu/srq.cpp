// Shared receive queues, as SRQ (srqc) or RMP (rmpc over a linked-list work queue), and ARM_RQ's
// limit watermark (PRM "Shared Receive Queue", "RMP").
#include <string.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
using S = prm::cmd_status::Value;
}

CmdStatus Hca::add_srq(Srq& s, const uint8_t* pas, uint32_t npas, const uint8_t* ctx, uint32_t ctx_len, uint32_t* n) {
  if (s.log_size > prm::get(cur_caps_, prm::cmd_hca_cap::log_max_srq_sz))
    return fail(S::BAD_PARAM_ERR, synd::BAD_QUEUE_SIZE);
  if ((1u << s.log_stride) > prm::get(cur_caps_, prm::cmd_hca_cap::max_wqe_sz_rq) || s.log_stride < 4)
    return fail(S::BAD_PARAM_ERR, synd::BAD_STRIDE);
  if (!pds_.count(s.pd)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_PD);
  if (s.dbr % 4) return fail(S::BAD_PARAM_ERR, synd::BAD_DBR_ADDR);
  uint64_t pg = 4096ull << s.log_page_size;
  uint64_t bytes = (uint64_t(1) << s.log_stride) << s.log_size;
  if (npas < (bytes + s.page_offset * 64u + pg - 1) / pg) return fail(S::BAD_PARAM_ERR, synd::PAS_TOO_SHORT);
  if (srqs_.size() >= (1u << prm::get(cur_caps_, prm::cmd_hca_cap::log_max_srq)))
    return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  uint64_t icm = icm_alloc(ctx_len);
  if (icm == kNoIcm) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  if (!icm_write(icm, ctx, ctx_len)) return fail(S::INT_ERR, synd::PAGE_DMA_FAULT);
  uint32_t srqn = srq_cursor_;
  while (srqs_.count(srqn)) srqn = (srqn + 1) & 0xffffff ? (srqn + 1) & 0xffffff : 1;
  srq_cursor_ = srqn + 1;
  s.srqn = srqn;
  s.pas.resize(npas);
  for (uint32_t i = 0; i < npas; ++i) s.pas[i] = prm::pas_pa(pas + 8 * i);
  if (!tp_create_srq(s)) {
    icm_free(icm);
    return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  }
  icm_keep(IcmObj::srq, srqn, icm);
  srqs_[srqn] = std::move(s);
  *n = srqn;
  return {};
}

CmdStatus Hca::remove_srq(uint32_t srqn, bool rmp) {
  auto it = srqs_.find(srqn);
  if (it == srqs_.end() || it->second.rmp != rmp) return fail(S::BAD_RES_ERR, synd::UNKNOWN_SRQ);
  if (it->second.refs) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  tp_destroy_srq(it->second);
  icm_release(IcmObj::srq, srqn);
  srqs_.erase(it);
  return {};
}

CmdStatus Hca::create_srq(Cmd& c) {
  prm::create_srq_in::cview in(c.in);
  auto ctx = in.at(prm::create_srq_in::srq_context_entry);
  namespace k = prm::srqc;
  Srq s;
  s.log_size = uint8_t(ctx.get(k::log_srq_size));
  s.log_stride = uint8_t(ctx.get(k::log_rq_stride) + 4);  // srqc stride is in 16-byte units
  s.log_page_size = uint8_t(ctx.get(k::log_page_size));
  s.page_offset = uint8_t(ctx.get(k::page_offset));
  s.pd = uint32_t(ctx.get(k::pd));
  s.dbr = ctx.get(k::dbr_addr);
  s.lwm = uint16_t(ctx.get(k::lwm));
  if (ctx.get(k::xrcd) || ctx.get(k::wq_signature)) return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  uint32_t srqn = 0;
  CmdStatus st = add_srq(s, in.elem(prm::create_srq_in::pas, 0), (c.in_len - prm::create_srq_in::size_bytes) / 8,
                         ctx.data(), prm::srqc::size_bytes, &srqn);
  if (st.ok()) prm::create_srq_out::view(c.out).set(prm::create_srq_out::srqn, srqn);
  return st;
}

CmdStatus Hca::destroy_srq(Cmd& c) {
  return remove_srq(uint32_t(prm::destroy_srq_in::cview(c.in).get(prm::destroy_srq_in::srqn)), false);
}

CmdStatus Hca::query_srq(Cmd& c) {
  auto it = srqs_.find(uint32_t(prm::query_srq_in::cview(c.in).get(prm::query_srq_in::srqn)));
  if (it == srqs_.end() || it->second.rmp) return fail(S::BAD_RES_ERR, synd::UNKNOWN_SRQ);
  const Srq& s = it->second;
  namespace k = prm::srqc;
  prm::query_srq_out::view(c.out)
      .at(prm::query_srq_out::srq_context_entry)
      .set(k::state, s.state)
      .set(k::log_srq_size, s.log_size)
      .set(k::log_rq_stride, s.log_stride - 4)
      .set(k::page_offset, s.page_offset)
      .set(k::log_page_size, s.log_page_size)
      .set(k::pd, s.pd)
      .set(k::lwm, s.lwm)
      .set(k::wqe_cnt, s.taken & 0xffff)
      .set(k::dbr_addr, s.dbr);
  return {};
}

CmdStatus Hca::arm_rq(Cmd& c) {
  prm::arm_rq_in::cview in(c.in);
  auto it = srqs_.find(uint32_t(in.get(prm::arm_rq_in::srq_number)));
  if (it == srqs_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_SRQ);
  it->second.lwm = uint16_t(in.get(prm::arm_rq_in::lwm));
  tp_arm_srq(it->second);
  return {};
}

CmdStatus Hca::create_rmp(Cmd& c) {
  auto ctx = prm::create_rmp_in::cview(c.in).at(prm::create_rmp_in::ctx);
  auto wq = ctx.at(prm::rmpc::wq);
  namespace w = prm::wq;
  if (ctx.get(prm::rmpc::state) != prm::rmpc_state::RDY) return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  if (wq.get(w::wq_type) != prm::wq_type::LINKED_LIST || wq.get(w::wq_signature) || wq.get(w::dbr_umem_valid) ||
      wq.get(w::wq_umem_valid))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  Srq s;
  s.rmp = true;
  s.log_size = uint8_t(wq.get(w::log_wq_sz));
  s.log_stride = uint8_t(wq.get(w::log_wq_stride));
  s.log_page_size = uint8_t(wq.get(w::log_wq_pg_sz));
  s.page_offset = uint8_t(wq.get(w::page_offset));
  s.pd = uint32_t(wq.get(w::pd));
  s.dbr = wq.get(w::dbr_addr);
  uint32_t pas_off = prm::create_rmp_in::ctx.byte_off() + prm::rmpc::wq.byte_off() + w::pas.byte_off();
  uint32_t rmpn = 0;
  CmdStatus st = add_srq(s, c.in + pas_off, c.in_len > pas_off ? (c.in_len - pas_off) / 8 : 0, ctx.data(),
                         prm::rmpc::size_bytes, &rmpn);
  if (st.ok()) prm::create_rmp_out::view(c.out).set(prm::create_rmp_out::rmpn, rmpn);
  return st;
}

CmdStatus Hca::destroy_rmp(Cmd& c) {
  return remove_srq(uint32_t(prm::destroy_rmp_in::cview(c.in).get(prm::destroy_rmp_in::rmpn)), true);
}

CmdStatus Hca::query_rmp(Cmd& c) {
  auto it = srqs_.find(uint32_t(prm::query_rmp_in::cview(c.in).get(prm::query_rmp_in::rmpn)));
  if (it == srqs_.end() || !it->second.rmp) return fail(S::BAD_RES_ERR, synd::UNKNOWN_SRQ);
  const Srq& s = it->second;
  auto ctx = prm::query_rmp_out::view(c.out).at(prm::query_rmp_out::rmp_context);
  ctx.set(prm::rmpc::state, s.state == 0 ? prm::rmpc_state::RDY : prm::rmpc_state::ERR);
  namespace w = prm::wq;
  ctx.at(prm::rmpc::wq)
      .set(w::wq_type, prm::wq_type::LINKED_LIST)
      .set(w::pd, s.pd)
      .set(w::dbr_addr, s.dbr)
      .set(w::hw_counter, s.taken)
      .set(w::log_wq_stride, s.log_stride)
      .set(w::log_wq_pg_sz, s.log_page_size)
      .set(w::log_wq_sz, s.log_size);
  return {};
}

}  // namespace melon::mlx5::emu
