// Event queues and completion queues: the commands, and how the device writes EQEs and CQEs into
// host rings (PRM "Event Queues", "Completion Queues"; Linux eq.c and cq.c, rdma-core cq.c are the
// consumers). An entry belongs to software when its owner bit equals the pass parity of the
// consumer index; the device flips it on each pass. Notifications fire once per arm.
#include <string.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
using S = prm::cmd_status::Value;
constexpr uint32_t kPasBytes = 8;
uint32_t pas_count(const Cmd& c, uint32_t fixed) { return c.in_len > fixed ? (c.in_len - fixed) / kPasBytes : 0; }
uint64_t ring_pages(uint64_t bytes, uint8_t log_page_size, uint32_t page_offset_bytes) {
  uint64_t pg = 4096ull << log_page_size;
  return (bytes + page_offset_bytes + pg - 1) / pg;
}
std::vector<uint64_t> read_pas(const uint8_t* first, uint32_t n) {
  std::vector<uint64_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = prm::pas_pa(first + i * kPasBytes);
  return v;
}
}  // namespace

bool Hca::queue_addr(const std::vector<uint64_t>& pas, uint8_t log_page_size, uint32_t page_offset_bytes, uint64_t off,
                     uint64_t* iova) const {
  uint64_t pg = 4096ull << log_page_size;
  uint64_t at = off + page_offset_bytes;
  uint64_t idx = at / pg;
  if (idx >= pas.size()) return false;
  *iova = pas[idx] + at % pg;
  return true;
}

// ---- EQ ----

Eq* Hca::eq_for_event(uint8_t type) {
  for (auto& [n, eq] : eqs_)
    if (eq.mask & prm::event_bit(type)) return &eq;
  return nullptr;
}

bool Hca::post_eqe(Eq& eq, uint8_t type, uint8_t sub_type, const uint8_t* data28) {
  uint32_t size = 1u << eq.log_size;
  if (eq.prod - eq.cons >= size) {
    ++eq.overruns;  // software has not consumed: the event is lost
    return false;
  }
  uint8_t eqe[prm::kEqeBytes] = {};
  prm::eqe::view e(eqe);
  e.set(prm::eqe::event_type, type).set(prm::eqe::event_sub_type, sub_type);
  memcpy(e.bytes(prm::eqe::event_data), data28, prm::eqe::event_data.byte_len());
  e.set(prm::eqe::owner, (eq.prod >> eq.log_size) & 1);
  uint64_t iova;
  if (!queue_addr(eq.pas, eq.log_page_size, eq.page_offset * 64u, uint64_t(eq.prod & (size - 1)) * prm::kEqeBytes,
                  &iova) ||
      !dma_write(iova, eqe, sizeof eqe - 1) || !dma_write(iova + sizeof eqe - 1, eqe + sizeof eqe - 1, 1)) {
    eq.status = prm::eqc_status::EQ_WRITE_FAILURE;
    return false;
  }
  ++eq.prod;
  if (eq.armed) {
    eq.armed = false;
    raise_irq(eq.intr);
  }
  return true;
}

void Hca::post_async(uint8_t type, uint8_t sub_type, const uint8_t* data28) {
  if (Eq* eq = eq_for_event(type)) post_eqe(*eq, type, sub_type, data28);
}

CmdStatus Hca::create_eq(Cmd& c) {
  prm::create_eq_in::cview in(c.in);
  auto ctx = in.at(prm::create_eq_in::eq_context_entry);
  Eq eq;
  eq.log_size = uint8_t(ctx.get(prm::eqc::log_eq_size));
  eq.log_page_size = uint8_t(ctx.get(prm::eqc::log_page_size));
  eq.page_offset = uint8_t(ctx.get(prm::eqc::page_offset));
  eq.uar = uint32_t(ctx.get(prm::eqc::uar_page));
  eq.intr = uint16_t(ctx.get(prm::eqc::intr));
  eq.mask = prm::eq_event_mask(c.in);
  eq.armed = ctx.get(prm::eqc::st) == prm::eqc_st::ARMED;
  if (eq.log_size > prm::get(cur_caps_, prm::cmd_hca_cap::log_max_eq_sz))
    return fail(S::BAD_PARAM_ERR, synd::BAD_QUEUE_SIZE);
  if (!uars_.count(eq.uar)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_UAR);
  if (eq.intr >= cfg_.msix_vectors) return fail(S::BAD_PARAM_ERR, synd::BAD_INTR);
  uint32_t n = pas_count(c, prm::create_eq_in::size_bytes);
  if (n < ring_pages(uint64_t(prm::kEqeBytes) << eq.log_size, eq.log_page_size, eq.page_offset * 64u))
    return fail(S::BAD_PARAM_ERR, synd::PAS_TOO_SHORT);
  if (eqs_.size() >= (1u << prm::get(cur_caps_, prm::cmd_hca_cap::log_max_eq)))
    return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  uint32_t eqn = 1;
  while (eqs_.count(eqn)) ++eqn;
  uint64_t icm = icm_alloc(prm::eqc::size_bytes);
  if (icm == kNoIcm) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  if (!icm_write(icm, ctx.data(), prm::eqc::size_bytes)) return fail(S::INT_ERR, synd::PAGE_DMA_FAULT);
  eq.eqn = eqn;
  eq.pas = read_pas(in.elem(prm::create_eq_in::pas, 0), n);
  icm_keep(IcmObj::eq, eqn, icm);
  eqs_[eqn] = std::move(eq);
  prm::create_eq_out::view(c.out).set(prm::create_eq_out::eq_number, eqn);
  // A page demand that found no EQ is announced to the first EQ that takes it.
  if (regular_pages_owed_ && (eqs_[eqn].mask & prm::event_bit(prm::event_type::PAGE_REQUEST)))
    page_request(regular_pages_owed_);
  return {};
}

CmdStatus Hca::destroy_eq(Cmd& c) {
  uint32_t eqn = uint32_t(prm::destroy_eq_in::cview(c.in).get(prm::destroy_eq_in::eq_number));
  auto it = eqs_.find(eqn);
  if (it == eqs_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_EQ);
  for (auto& [n, cq] : cqs_)
    if (cq.eqn == eqn) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  icm_release(IcmObj::eq, eqn);
  eqs_.erase(it);
  return {};
}

CmdStatus Hca::query_eq(Cmd& c) {
  uint32_t eqn = uint32_t(prm::query_eq_in::cview(c.in).get(prm::query_eq_in::eq_number));
  auto it = eqs_.find(eqn);
  if (it == eqs_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_EQ);
  const Eq& eq = it->second;
  prm::query_eq_out::view out(c.out);
  auto ctx = out.at(prm::query_eq_out::eq_context_entry);
  ctx.set(prm::eqc::status, eq.status)
      .set(prm::eqc::st, eq.armed ? prm::eqc_st::ARMED : prm::eqc_st::FIRED)
      .set(prm::eqc::log_eq_size, eq.log_size)
      .set(prm::eqc::uar_page, eq.uar)
      .set(prm::eqc::intr, eq.intr)
      .set(prm::eqc::log_page_size, eq.log_page_size)
      .set(prm::eqc::page_offset, eq.page_offset)
      .set(prm::eqc::consumer_counter, eq.cons & 0xffffff)
      .set(prm::eqc::producer_counter, eq.prod & 0xffffff);
  out.set(prm::query_eq_out::event_bitmask, eq.mask);
  return {};
}

// ---- CQ ----

uint32_t Hca::cq_consumer_index(Cq& cq) {
  uint8_t rec[4];
  if (!dma_read(cq.dbr, rec, sizeof rec)) return cq.prod;
  return uint32_t(prm::get(rec, prm::cq_dbrec::set_ci));
}

void Hca::cq_error(Cq& cq, uint8_t syndrome) {
  cq.status =
      syndrome == prm::cq_error_syndrome::CQ_OVERRUN ? prm::cqc_status::CQ_OVERFLOW : prm::cqc_status::CQ_WRITE_FAIL;
  uint8_t data[28] = {};
  prm::set(data, prm::cq_error::cqn, cq.cqn);
  prm::set(data, prm::cq_error::syndrome, syndrome);
  post_async(prm::event_type::CQ_ERROR, 0, data);
}

bool Hca::post_cqe(Cq& cq, uint8_t* cqe, bool solicited) {
  if (cq.status != prm::cqc_status::OK) return false;
  uint32_t size = 1u << cq.log_size;
  if (!cq.oi && ((cq.prod - cq_consumer_index(cq)) & 0xffffff) >= size) {
    cq_error(cq, prm::cq_error_syndrome::CQ_OVERRUN);
    return false;
  }
  prm::cqe64::view v(cqe);
  v.set(prm::cqe64::owner, (cq.prod >> cq.log_size) & 1);
  uint32_t stride = cq.cqe_sz == prm::cqc_cqe_sz::BYTES_128 ? 128 : 64;
  uint64_t iova;
  // A 128-byte CQE carries the 64-byte format in its second half (rdma-core cq.c get_cqe64).
  if (!queue_addr(cq.pas, cq.log_page_size, cq.page_offset * 64u, uint64_t(cq.prod & (size - 1)) * stride + stride - 64,
                  &iova) ||
      !dma_write(iova, cqe, 63) || !dma_write(iova + 63, cqe + 63, 1)) {
    cq_error(cq, prm::cq_error_syndrome::CQ_ACCESS_VIOLATION_ERROR);
    return false;
  }
  ++cq.prod;
  if (cq.arm == CqArm::kNext || (cq.arm == CqArm::kSolicited && solicited)) {
    cq.arm = CqArm::kNone;
    auto eq = eqs_.find(cq.eqn);
    if (eq != eqs_.end()) {
      uint8_t data[28] = {};
      prm::set(data, prm::comp_event::cq_number, cq.cqn);
      post_eqe(eq->second, prm::event_type::COMP, 0, data);
    }
  }
  return true;
}

CmdStatus Hca::create_cq(Cmd& c) {
  prm::create_cq_in::cview in(c.in);
  auto ctx = in.at(prm::create_cq_in::cq_context);
  Cq cq;
  cq.log_size = uint8_t(ctx.get(prm::cqc::log_cq_size));
  cq.log_page_size = uint8_t(ctx.get(prm::cqc::log_page_size));
  cq.page_offset = uint8_t(ctx.get(prm::cqc::page_offset));
  cq.cqe_sz = uint8_t(ctx.get(prm::cqc::cqe_sz));
  cq.oi = ctx.get(prm::cqc::oi);
  cq.uar = uint32_t(ctx.get(prm::cqc::uar_page));
  cq.eqn = uint32_t(ctx.get(prm::cqc::c_eqn));
  cq.dbr = ctx.get(prm::cqc::dbr_addr);
  cq.cq_period = uint16_t(ctx.get(prm::cqc::cq_period));
  cq.cq_max_count = uint16_t(ctx.get(prm::cqc::cq_max_count));
  if (cq.cqe_sz > prm::cqc_cqe_sz::BYTES_128) return fail(S::BAD_PARAM_ERR, synd::BAD_CQE_SIZE);
  if (cq.log_size > prm::get(cur_caps_, prm::cmd_hca_cap::log_max_cq_sz))
    return fail(S::BAD_PARAM_ERR, synd::BAD_QUEUE_SIZE);
  if (in.get(prm::create_cq_in::cq_umem_valid) || ctx.get(prm::cqc::dbr_umem_valid) || ctx.get(prm::cqc::apu_cq) ||
      ctx.get(prm::cqc::cqe_comp_en))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);  // umem, APU and CQE compression: not on this model
  if (!uars_.count(cq.uar)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_UAR);
  if (!eqs_.count(cq.eqn)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_EQ);
  if (cq.dbr % 8) return fail(S::BAD_PARAM_ERR, synd::BAD_DBR_ADDR);
  uint32_t n = pas_count(c, prm::create_cq_in::size_bytes);
  uint64_t bytes = uint64_t(cq.cqe_sz ? 128 : 64) << cq.log_size;
  if (n < ring_pages(bytes, cq.log_page_size, cq.page_offset * 64u)) return fail(S::BAD_PARAM_ERR, synd::PAS_TOO_SHORT);
  if (cqs_.size() >= (1u << prm::get(cur_caps_, prm::cmd_hca_cap::log_max_cq)))
    return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  uint32_t cqn = cq_cursor_;
  while (cqs_.count(cqn)) cqn = (cqn + 1) & 0xffffff ? (cqn + 1) & 0xffffff : 1;
  cq_cursor_ = cqn + 1;
  uint64_t icm = icm_alloc(prm::cqc::size_bytes);
  if (icm == kNoIcm) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  if (!icm_write(icm, ctx.data(), prm::cqc::size_bytes)) return fail(S::INT_ERR, synd::PAGE_DMA_FAULT);
  cq.cqn = cqn;
  cq.pas = read_pas(in.elem(prm::create_cq_in::pas, 0), n);
  icm_keep(IcmObj::cq, cqn, icm);
  cqs_[cqn] = std::move(cq);
  prm::create_cq_out::view(c.out).set(prm::create_cq_out::cqn, cqn);
  return {};
}

CmdStatus Hca::destroy_cq(Cmd& c) {
  uint32_t cqn = uint32_t(prm::destroy_cq_in::cview(c.in).get(prm::destroy_cq_in::cqn));
  auto it = cqs_.find(cqn);
  if (it == cqs_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_CQ);
  if (it->second.refs) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  icm_release(IcmObj::cq, cqn);
  cqs_.erase(it);
  return {};
}

CmdStatus Hca::query_cq(Cmd& c) {
  uint32_t cqn = uint32_t(prm::query_cq_in::cview(c.in).get(prm::query_cq_in::cqn));
  auto it = cqs_.find(cqn);
  if (it == cqs_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_CQ);
  Cq& cq = it->second;
  auto ctx = prm::query_cq_out::view(c.out).at(prm::query_cq_out::cq_context);
  uint8_t st = cq.arm == CqArm::kNext        ? prm::cqc_st::NOTIFICATION_REQUEST_ARMED
               : cq.arm == CqArm::kSolicited ? prm::cqc_st::SOLICITED_NOTIFICATION_REQUEST_ARMED
                                             : prm::cqc_st::FIRED;
  ctx.set(prm::cqc::status, cq.status)
      .set(prm::cqc::cqe_sz, cq.cqe_sz)
      .set(prm::cqc::oi, cq.oi)
      .set(prm::cqc::st, st)
      .set(prm::cqc::page_offset, cq.page_offset)
      .set(prm::cqc::log_cq_size, cq.log_size)
      .set(prm::cqc::uar_page, cq.uar)
      .set(prm::cqc::cq_period, cq.cq_period)
      .set(prm::cqc::cq_max_count, cq.cq_max_count)
      .set(prm::cqc::c_eqn, cq.eqn)
      .set(prm::cqc::log_page_size, cq.log_page_size)
      .set(prm::cqc::consumer_counter, cq_consumer_index(cq))
      .set(prm::cqc::producer_counter, cq.prod & 0xffffff)
      .set(prm::cqc::dbr_addr, cq.dbr);
  return {};
}

CmdStatus Hca::modify_cq(Cmd& c) {
  prm::modify_cq_in::cview in(c.in);
  auto it = cqs_.find(uint32_t(in.get(prm::modify_cq_in::cqn)));
  if (it == cqs_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_CQ);
  if (c.op_mod == prm::kModifyCqOpModResize) return resize_cq(c, it->second);
  if (c.op_mod != prm::kModifyCqOpModModify) return fail(S::BAD_PARAM_ERR, synd::BAD_OP_MOD);
  uint32_t sel = uint32_t(in.get(prm::modify_cq_in::field_select));
  if (sel & ~uint32_t(prm::cq_modify::PERIOD | prm::cq_modify::COUNT | prm::cq_modify::OVERRUN))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  auto ctx = in.at(prm::modify_cq_in::cq_context);
  if (sel & prm::cq_modify::PERIOD) it->second.cq_period = uint16_t(ctx.get(prm::cqc::cq_period));
  if (sel & prm::cq_modify::COUNT) it->second.cq_max_count = uint16_t(ctx.get(prm::cqc::cq_max_count));
  if (sel & prm::cq_modify::OVERRUN) it->second.oi = ctx.get(prm::cqc::oi);
  return {};
}

// MODIFY_CQ op_mod RESIZE_CQ: the CQ moves to a new ring at once. The RESIZE_CQ CQE goes into the
// old ring where the next CQE would have gone, and the producer counter moves on past it, so the
// next CQE lands one after it in the new ring: the consumer copies the CQEs it has not polled to
// the same indexes of the new ring (rdma-core's mlx5 does), polls the boundary CQE and goes on.
CmdStatus Hca::resize_cq(Cmd& c, Cq& cq) {
  prm::modify_cq_in::cview in(c.in);
  uint32_t sel = uint32_t(in.get(prm::modify_cq_in::field_select));
  constexpr uint32_t kKnown =
      prm::cq_resize_select::LOG_CQ_SIZE | prm::cq_resize_select::PAGE_OFFSET | prm::cq_resize_select::LOG_PAGE_SIZE;
  if (!(sel & prm::cq_resize_select::LOG_CQ_SIZE) || (sel & ~kKnown) || in.get(prm::modify_cq_in::cq_umem_valid))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  if (cq.status != prm::cqc_status::OK) return fail(S::BAD_RES_STATE_ERR, synd::CQ_IN_ERROR);
  auto ctx = in.at(prm::modify_cq_in::cq_context);
  uint8_t log_size = uint8_t(ctx.get(prm::cqc::log_cq_size));
  uint8_t log_page_size =
      sel & prm::cq_resize_select::LOG_PAGE_SIZE ? uint8_t(ctx.get(prm::cqc::log_page_size)) : cq.log_page_size;
  uint8_t page_offset =
      sel & prm::cq_resize_select::PAGE_OFFSET ? uint8_t(ctx.get(prm::cqc::page_offset)) : cq.page_offset;
  if (log_size > prm::get(cur_caps_, prm::cmd_hca_cap::log_max_cq_sz))
    return fail(S::BAD_PARAM_ERR, synd::BAD_QUEUE_SIZE);
  uint32_t n = pas_count(c, prm::modify_cq_in::size_bytes);
  uint64_t bytes = uint64_t(cq.cqe_sz ? 128 : 64) << log_size;
  if (n < ring_pages(bytes, log_page_size, page_offset * 64u)) return fail(S::BAD_PARAM_ERR, synd::PAS_TOO_SHORT);
  // The unpolled CQEs and the boundary's place in the count must fit the new ring, and the
  // boundary needs a free entry in the old one.
  uint32_t outstanding = (cq.prod + cq.queued - cq_consumer_index(cq)) & 0xffffff;
  if ((1ull << log_size) < uint64_t(outstanding) + 1) return fail(S::BAD_PARAM_ERR, synd::RESIZE_TOO_SMALL);
  uint32_t old_size = 1u << cq.log_size;
  if (outstanding >= old_size) return fail(S::BAD_RES_STATE_ERR, synd::CQ_RING_FULL);
  uint8_t cqe[64] = {};
  prm::cqe64::view v(cqe);
  v.set(prm::cqe64::opcode, prm::cqe_opcode::RESIZE_CQ).set(prm::cqe64::owner, (cq.prod >> cq.log_size) & 1);
  uint32_t stride = cq.cqe_sz == prm::cqc_cqe_sz::BYTES_128 ? 128 : 64;
  uint64_t iova;
  if (!queue_addr(cq.pas, cq.log_page_size, cq.page_offset * 64u,
                  uint64_t(cq.prod & (old_size - 1)) * stride + stride - 64, &iova) ||
      !dma_write(iova, cqe, 63) || !dma_write(iova + 63, cqe + 63, 1))
    return fail(S::INT_ERR, synd::PAGE_DMA_FAULT);
  ++cq.prod;
  cq.log_size = log_size;
  cq.log_page_size = log_page_size;
  cq.page_offset = page_offset;
  cq.pas = read_pas(in.elem(prm::modify_cq_in::pas, 0), n);
  return {};
}

// ---- doorbells for EQ and CQ ----

void Hca::eq_doorbell(const Doorbell& db) {
  uint32_t v =
      uint32_t(prm::get(db.bytes, prm::eq_uar_db::eqn)) << 24 | uint32_t(prm::get(db.bytes, prm::eq_uar_db::ci));
  auto it = eqs_.find(v >> 24);
  if (it == eqs_.end() || it->second.uar != db.uar) {
    ++stats_.doorbells_ignored;
    return;
  }
  Eq& eq = it->second;
  // The 24-bit consumer index extends the device's 32-bit counters.
  eq.cons = (eq.prod & ~0xffffffu) | (v & 0xffffff);
  if (eq.cons > eq.prod) eq.cons -= 0x1000000;
  if (db.kind == DbKind::kEqArm) {
    eq.armed = true;
    if (eq.cons != eq.prod) {  // events software has not consumed yet: interrupt at once
      eq.armed = false;
      raise_irq(eq.intr);
    }
  }
}

void Hca::cq_doorbell(const Doorbell& db) {
  uint32_t cqn = uint32_t(prm::get(db.bytes, prm::cq_uar_db::cqn));
  auto it = cqs_.find(cqn);
  if (it == cqs_.end() || it->second.uar != db.uar) {
    ++stats_.doorbells_ignored;
    return;
  }
  Cq& cq = it->second;
  uint32_t ci = uint32_t(prm::get(db.bytes, prm::cq_uar_db::ci));
  uint8_t cmd = uint8_t(prm::get(db.bytes, prm::cq_uar_db::cmd));
  cq.arm_sn = uint8_t(prm::get(db.bytes, prm::cq_uar_db::sn));
  cq.arm = cmd == prm::kCqArmSolicited ? CqArm::kSolicited : CqArm::kNext;
  if (cmd == prm::kCqArmNext && ((cq.prod - ci) & 0xffffff) != 0) {
    // CQEs past the consumer index already: notify now (PRM: arming with unpolled CQEs fires).
    cq.arm = CqArm::kNone;
    auto eq = eqs_.find(cq.eqn);
    if (eq != eqs_.end()) {
      uint8_t data[28] = {};
      prm::set(data, prm::comp_event::cq_number, cq.cqn);
      post_eqe(eq->second, prm::event_type::COMP, 0, data);
    }
  }
}

}  // namespace melon::mlx5::emu
