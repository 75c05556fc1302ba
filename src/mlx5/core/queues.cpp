// Completion queues and shared receive queues: rings in DMA segments given as 4 KiB PAS pages.
#include <string.h>

#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/page_list.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

namespace {
constexpr uint32_t kQueuePageShift = 12;  // queues are described in 4 KiB pages (log_page_size 0)

// Rings must start on a 4 KiB boundary and be long enough.
bool ring_ok(const DmaSegment* segs, uint32_t n, uint64_t need) {
  return segs && n && (segs[0].iova & 0xfff) == 0 && segments_bytes(segs, n) >= need &&
         best_page_shift(segs, n, segs[0].iova, kQueuePageShift) == kQueuePageShift;
}

uint32_t fill_pas(uint8_t* pas, const DmaSegment* segs, uint32_t n) {
  uint32_t i = 0;
  for_each_page(segs, n, kQueuePageShift, [&](uint64_t pa) { p::pas_set(pas + 8 * i++, pa); });
  return i;
}
}  // namespace

// ---- CQ ---------------------------------------------------------------------------------------

Err Hca::create_cq(const CqParams& cp, Cq** out) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  uint32_t log_max_sz = uint32_t(p::get(caps_.general, p::cmd_hca_cap::log_max_cq_sz));
  if (cp.log_size > (log_max_sz ? log_max_sz : 22) || cp.log_size > kMaxLogQueueSize || cp.comp_vector >= ncomp_eqs_ ||
      !cp.dbr_iova || (cp.dbr_iova & 7))
    return Err::invalid;
  if (!ring_ok(cp.buf, cp.nbuf, (uint64_t(1) << cp.log_size) * 64)) return Err::invalid;
  uint32_t npages = uint32_t(for_each_page(cp.buf, cp.nbuf, kQueuePageShift, [](uint64_t) {}));
  uint32_t in_len = p::create_cq_in::size_bytes + npages * 8;
  Scratch in(*hal_, in_len);
  uint8_t o[p::create_cq_out::size_bytes] = {};
  if (!in) return Err::no_memory;
  p::cmd_set_header(in.get(), p::opcode::CREATE_CQ, 0);
  p::create_cq_in::view v(in.get());
  uint32_t eqn = comp_eqs_[cp.comp_vector].eqn;
  v.at(p::create_cq_in::cq_context)
      .set(p::cqc::cqe_sz, p::cqc_cqe_sz::BYTES_64)
      .set(p::cqc::log_cq_size, cp.log_size)
      .set(p::cqc::uar_page, cp.uar ? cp.uar->index : eq_uar_->index)
      .set(p::cqc::c_eqn, eqn)
      .set(p::cqc::log_page_size, kQueuePageShift - 12)
      .set(p::cqc::dbr_addr, cp.dbr_iova);
  fill_pas(v.elem(p::create_cq_in::pas, 0), cp.buf, cp.nbuf);
  if (Err e = cmd(in.get(), in_len, o, sizeof o); e != Err::ok) return e;
  uint32_t cqn = uint32_t(p::create_cq_out::cview(o).get(p::create_cq_out::cqn));
  Cq* cq = new_obj<Cq>(ObjKind::cq);
  if (!cq) {
    uint8_t din[p::destroy_cq_in::size_bytes] = {}, dout[p::destroy_cq_out::size_bytes] = {};
    p::cmd_set_header(din, p::opcode::DESTROY_CQ, 0);
    p::destroy_cq_in::view(din).set(p::destroy_cq_in::cqn, cqn);
    cmd(din, sizeof din, dout, sizeof dout);
    return Err::no_memory;
  }
  cq->cqn = cqn;
  cq->log_size = cp.log_size;
  cq->eqn = eqn;
  cq->owner = cp.owner;
  cq->uar = cp.uar;
  if (cp.uar) cp.uar->refs++;
  MLX_DBG(*hal_, cq, "CQ %u: %u entries on EQ %u", cqn, 1u << cp.log_size, eqn);
  *out = cq;
  return Err::ok;
}

Err Hca::query_cq(Cq* cq, CqQuery* q) {
  if (!cq || cq->kind != ObjKind::cq) return Err::invalid;
  uint8_t in[p::query_cq_in::size_bytes] = {};
  Scratch out(*hal_, p::query_cq_out::size_bytes);
  if (!out) return Err::no_memory;
  p::cmd_set_header(in, p::opcode::QUERY_CQ, 0);
  p::query_cq_in::view(in).set(p::query_cq_in::cqn, cq->cqn);
  if (Err e = cmd(in, sizeof in, out.get(), p::query_cq_out::size_bytes); e != Err::ok) return e;
  auto c = p::query_cq_out::cview(out.get()).at(p::query_cq_out::cq_context);
  q->log_size = uint32_t(c.get(p::cqc::log_cq_size));
  q->eqn = uint32_t(c.get(p::cqc::c_eqn));
  q->status = uint32_t(c.get(p::cqc::status));
  q->period = uint32_t(c.get(p::cqc::cq_period));
  q->max_count = uint32_t(c.get(p::cqc::cq_max_count));
  q->uar_page = uint32_t(c.get(p::cqc::uar_page));
  return Err::ok;
}

Err Hca::modify_cq(Cq* cq, uint16_t period, uint16_t max_count) {
  if (!cq || cq->kind != ObjKind::cq) return Err::invalid;
  if (period >= (1u << 12)) return Err::invalid;  // cq_period is 12 bits
  Scratch in(*hal_, p::modify_cq_in::size_bytes);
  uint8_t out[p::modify_cq_out::size_bytes] = {};
  if (!in) return Err::no_memory;
  p::cmd_set_header(in.get(), p::opcode::MODIFY_CQ, p::kModifyCqOpModModify);
  p::modify_cq_in::view v(in.get());
  v.set(p::modify_cq_in::cqn, cq->cqn).set(p::modify_cq_in::field_select, p::cq_modify::PERIOD | p::cq_modify::COUNT);
  v.at(p::modify_cq_in::cq_context).set(p::cqc::cq_period, period).set(p::cqc::cq_max_count, max_count);
  return cmd(in.get(), p::modify_cq_in::size_bytes, out, sizeof out);
}

// MODIFY_CQ op_mod RESIZE_CQ: the firmware moves the CQ to the new ring (same context, doorbell
// record and CQN) and leaves a RESIZE_CQ CQE in the old one; the consumer carries the unpolled CQEs
// over (rdma-core's mlx5 and Linux mlx5_ib do it the same way). The old ring stays the caller's to
// free once the consumer has passed the boundary.
Err Hca::resize_cq(Cq* cq, uint32_t log_size, const DmaSegment* buf, uint32_t nbuf, CmdFailure* fail) {
  if (!cq || cq->kind != ObjKind::cq) return Err::invalid;
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  if (!p::get(caps_.general, p::cmd_hca_cap::cq_resize)) return Err::unsupported;
  uint32_t log_max_sz = uint32_t(p::get(caps_.general, p::cmd_hca_cap::log_max_cq_sz));
  if (log_size > (log_max_sz ? log_max_sz : 22) || log_size > kMaxLogQueueSize) return Err::invalid;
  if (!ring_ok(buf, nbuf, (uint64_t(1) << log_size) * 64)) return Err::invalid;
  uint32_t npages = uint32_t(for_each_page(buf, nbuf, kQueuePageShift, [](uint64_t) {}));
  uint32_t in_len = p::modify_cq_in::size_bytes + npages * 8;
  Scratch in(*hal_, in_len);
  uint8_t out[p::modify_cq_out::size_bytes] = {};
  if (!in) return Err::no_memory;
  p::cmd_set_header(in.get(), p::opcode::MODIFY_CQ, p::kModifyCqOpModResize);
  p::modify_cq_in::view v(in.get());
  v.set(p::modify_cq_in::cqn, cq->cqn)
      .set(p::modify_cq_in::field_select,
           p::cq_resize_select::LOG_CQ_SIZE | p::cq_resize_select::PAGE_OFFSET | p::cq_resize_select::LOG_PAGE_SIZE);
  v.at(p::modify_cq_in::cq_context)
      .set(p::cqc::log_cq_size, log_size)
      .set(p::cqc::page_offset, 0)
      .set(p::cqc::log_page_size, kQueuePageShift - 12);
  fill_pas(v.elem(p::modify_cq_in::pas, 0), buf, nbuf);
  if (Err e = cmd(in.get(), in_len, out, sizeof out, fail); e != Err::ok) return e;
  MLX_DBG(*hal_, cq, "CQ %u: resized from %u to %u entries", cq->cqn, 1u << cq->log_size, 1u << log_size);
  cq->log_size = log_size;
  return Err::ok;
}

Err Hca::destroy_cq(Cq* cq) {
  if (!cq || cq->kind != ObjKind::cq) return Err::invalid;
  if (cq->refs) return Err::in_use;
  uint8_t in[p::destroy_cq_in::size_bytes] = {}, out[p::destroy_cq_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::DESTROY_CQ, 0);
  p::destroy_cq_in::view(in).set(p::destroy_cq_in::cqn, cq->cqn);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  if (cq->uar) cq->uar->refs--;
  delete_obj(cq, sizeof(Cq));
  return Err::ok;
}

// ---- SRQ --------------------------------------------------------------------------------------

Err Hca::create_srq(const SrqParams& sp, Srq** out) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  if (!sp.pd || sp.pd->kind != ObjKind::pd || sp.log_stride < 4 || sp.log_stride > 11 || !sp.dbr_iova ||
      (sp.dbr_iova & 3))
    return Err::invalid;
  uint32_t log_max = uint32_t(p::get(caps_.general, p::cmd_hca_cap::log_max_srq_sz));
  if (sp.log_size > (log_max ? log_max : 15) || sp.log_size > kMaxLogQueueSize) return Err::invalid;
  if (!ring_ok(sp.buf, sp.nbuf, (uint64_t(1) << sp.log_size) << sp.log_stride)) return Err::invalid;
  uint32_t npages = uint32_t(for_each_page(sp.buf, sp.nbuf, kQueuePageShift, [](uint64_t) {}));
  uint32_t in_len = p::create_srq_in::size_bytes + npages * 8;
  Scratch in(*hal_, in_len);
  uint8_t o[p::create_srq_out::size_bytes] = {};
  if (!in) return Err::no_memory;
  p::cmd_set_header(in.get(), p::opcode::CREATE_SRQ, 0);
  p::create_srq_in::view v(in.get());
  v.at(p::create_srq_in::srq_context_entry)
      .set(p::srqc::log_srq_size, sp.log_size)
      .set(p::srqc::log_rq_stride, sp.log_stride - 4)
      .set(p::srqc::pd, sp.pd->pdn)
      .set(p::srqc::cqn, sp.cq ? sp.cq->cqn : 0)
      .set(p::srqc::log_page_size, kQueuePageShift - 12)
      .set(p::srqc::dbr_addr, sp.dbr_iova);
  fill_pas(v.elem(p::create_srq_in::pas, 0), sp.buf, sp.nbuf);
  if (Err e = cmd(in.get(), in_len, o, sizeof o); e != Err::ok) return e;
  uint32_t srqn = uint32_t(p::create_srq_out::cview(o).get(p::create_srq_out::srqn));
  Srq* srq = new_obj<Srq>(ObjKind::srq);
  if (!srq) {
    uint8_t din[p::destroy_srq_in::size_bytes] = {}, dout[p::destroy_srq_out::size_bytes] = {};
    p::cmd_set_header(din, p::opcode::DESTROY_SRQ, 0);
    p::destroy_srq_in::view(din).set(p::destroy_srq_in::srqn, srqn);
    cmd(din, sizeof din, dout, sizeof dout);
    return Err::no_memory;
  }
  srq->srqn = srqn;
  srq->pd = sp.pd;
  srq->cq = sp.cq;
  srq->owner = sp.owner;
  sp.pd->refs++;
  if (sp.cq) sp.cq->refs++;
  MLX_DBG(*hal_, srq, "SRQ %u: %u WQEs of %u bytes", srqn, 1u << sp.log_size, 1u << sp.log_stride);
  *out = srq;
  return Err::ok;
}

Err Hca::query_srq(Srq* srq, SrqQuery* q) {
  if (!srq || srq->kind != ObjKind::srq) return Err::invalid;
  uint8_t in[p::query_srq_in::size_bytes] = {};
  Scratch out(*hal_, p::query_srq_out::size_bytes);
  if (!out) return Err::no_memory;
  p::cmd_set_header(in, p::opcode::QUERY_SRQ, 0);
  p::query_srq_in::view(in).set(p::query_srq_in::srqn, srq->srqn);
  if (Err e = cmd(in, sizeof in, out.get(), p::query_srq_out::size_bytes); e != Err::ok) return e;
  auto c = p::query_srq_out::cview(out.get()).at(p::query_srq_out::srq_context_entry);
  q->state = uint32_t(c.get(p::srqc::state));
  q->log_size = uint32_t(c.get(p::srqc::log_srq_size));
  q->pd = uint32_t(c.get(p::srqc::pd));
  q->lwm = uint32_t(c.get(p::srqc::lwm));
  q->wqe_cnt = uint32_t(c.get(p::srqc::wqe_cnt));
  return Err::ok;
}

// The SRQ limit event (SRQ_RQ_LIMIT) fires once fewer than `limit` WQEs remain.
Err Hca::arm_srq(Srq* srq, uint16_t limit) {
  if (!srq || srq->kind != ObjKind::srq) return Err::invalid;
  uint8_t in[p::arm_rq_in::size_bytes] = {}, out[p::arm_rq_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ARM_RQ, p::kArmRqOpModSrq);
  p::arm_rq_in::view(in).set(p::arm_rq_in::srq_number, srq->srqn).set(p::arm_rq_in::lwm, limit);
  return cmd(in, sizeof in, out, sizeof out);
}

Err Hca::destroy_srq(Srq* srq) {
  if (!srq || srq->kind != ObjKind::srq) return Err::invalid;
  if (srq->refs) return Err::in_use;
  uint8_t in[p::destroy_srq_in::size_bytes] = {}, out[p::destroy_srq_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::DESTROY_SRQ, 0);
  p::destroy_srq_in::view(in).set(p::destroy_srq_in::srqn, srq->srqn);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  srq->pd->refs--;
  if (srq->cq) srq->cq->refs--;
  delete_obj(srq, sizeof(Srq));
  return Err::ok;
}

}  // namespace melon::mlx5::core
