// Event queues: one async EQ (command completions, page requests, port and object events) and
// the completion EQs, each on its own MSI-X vector when the HAL has vectors, or polled.
#include <string.h>

#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/barrier.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

namespace {
constexpr uint32_t kEqeOwnerByte = 63;
constexpr uint8_t kEqeOwnerInit = 1;  // the device flips it to 0 on its first pass

uint64_t async_event_mask() {
  static constexpr uint8_t kTypes[] = {p::event_type::CMD,
                                       p::event_type::PAGE_REQUEST,
                                       p::event_type::PORT_CHANGE,
                                       p::event_type::CQ_ERROR,
                                       p::event_type::PATH_MIG,
                                       p::event_type::COMM_EST,
                                       p::event_type::SQ_DRAINED,
                                       p::event_type::WQ_CATAS_ERROR,
                                       p::event_type::PATH_MIG_FAILED,
                                       p::event_type::WQ_INVAL_REQ_ERROR,
                                       p::event_type::WQ_ACCESS_ERROR,
                                       p::event_type::SRQ_CATAS_ERROR,
                                       p::event_type::SRQ_LAST_WQE,
                                       p::event_type::SRQ_RQ_LIMIT,
                                       p::event_type::INTERNAL_ERROR};
  uint64_t m = 0;
  for (uint8_t t : kTypes) m |= p::event_bit(t);
  return m;
}
}  // namespace

Err Hca::create_eq(Eq& eq, uint32_t log_size, uint64_t mask, uint32_t vector) {
  uint64_t bytes = (uint64_t(1) << log_size) * p::kEqeBytes;
  if (Err e = ledger_.alloc(bytes, 4096, &eq.buf); e != Err::ok) return e;
  uint8_t* q = static_cast<uint8_t*>(eq.buf.va);
  for (uint64_t i = 0; i < (uint64_t(1) << log_size); ++i) q[i * p::kEqeBytes + kEqeOwnerByte] = kEqeOwnerInit;
  uint32_t npages = uint32_t((bytes + 4095) / 4096);
  uint32_t in_len = p::create_eq_in::size_bytes + npages * 8;
  Scratch in(*hal_, in_len);
  uint8_t out[p::create_eq_out::size_bytes] = {};
  if (!in) return Err::no_memory;
  p::cmd_set_header(in.get(), p::opcode::CREATE_EQ, 0);
  p::create_eq_in::view v(in.get());
  v.at(p::create_eq_in::eq_context_entry)
      .set(p::eqc::log_eq_size, log_size)
      .set(p::eqc::uar_page, eq_uar_->index)
      .set(p::eqc::intr, vector)
      .set(p::eqc::log_page_size, 0);  // 4 KiB pages (the field is log2(size) - 12)
  p::eq_set_event_mask(in.get(), mask);
  for (uint32_t i = 0; i < npages; ++i) p::pas_set(v.elem(p::create_eq_in::pas, i), eq.buf.iova + uint64_t(i) * 4096);
  if (Err e = cmd(in.get(), in_len, out, sizeof out); e != Err::ok) {
    ledger_.free(eq.buf);
    eq.buf = {};
    return e;
  }
  eq.eqn = uint32_t(p::create_eq_out::cview(out).get(p::create_eq_out::eq_number));
  eq.log_size = log_size;
  eq.cc = 0;
  eq.vector = vector;
  eq.live = true;
  // Arm it: interrupts (if any) for the next event.
  hal_->write32(uint32_t(eq_uar_->bar_off + p::kUarEqArm), eq.eqn << 24);
  MLX_INFO(*hal_, eq, "EQ %u: %u entries, vector %u", eq.eqn, 1u << log_size, vector);
  return Err::ok;
}

void Hca::destroy_eq(Eq& eq) {
  if (!eq.live) return;
  uint8_t in[p::destroy_eq_in::size_bytes] = {}, out[p::destroy_eq_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::DESTROY_EQ, 0);
  p::destroy_eq_in::view(in).set(p::destroy_eq_in::eq_number, eq.eqn);
  Err e = cmd(in, sizeof in, out, sizeof out);
  {
    // An interrupt on another CPU may be draining it right now: wait for it, then it is gone.
    HalLock l(*hal_, eq.lock);
    eq.live = false;
  }
  // Refused or unanswered: the device may still write events into it.
  ledger_.free(eq.buf, e != Err::ok);
  eq.buf = {};
}

Err Hca::setup_eqs() {
  uint32_t nvec = hal_->vector_count();
  vectors_ = nvec > 0;
  uint32_t n = cfg_.comp_eqs;
  // Vectors first: an event (the completion of CREATE_EQ itself) may come before the last EQ.
  if (vectors_) {
    for (uint32_t v = 0; v < nvec && v < 1 + n; ++v) {
      if (hal_->vector_enable(v, this) != kHalOk) {
        MLX_ERR(*hal_, eq, "vector %u could not be enabled", v);
        return Err::unsupported;
      }
    }
  }
  if (Err e = create_eq(async_eq_, cfg_.async_eq_log_size, async_event_mask(), 0); e != Err::ok) return e;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t vec = nvec > 1 ? 1 + i % (nvec - 1) : 0;
    if (Err e = create_eq(comp_eqs_[i], cfg_.comp_eq_log_size, p::event_bit(p::event_type::COMP), vec); e != Err::ok)
      return e;
    ncomp_eqs_ = i + 1;
  }
  // From here on, command completions arrive as events; take any that came while we set up.
  cmd_.set_event_mode(true);
  poll_events();
  MLX_INFO(*hal_, eq, "async EQ %u + %u completion EQs, %s", async_eq_.eqn, ncomp_eqs_,
           vectors_ ? "MSI-X vectors" : "polled");
  return Err::ok;
}

void Hca::drain_eq(Eq& eq, bool from_vector) {
  if (!eq.live) return;
  HalLock l(*hal_, eq.lock);
  if (!eq.live) return;
  uint32_t nent = 1u << eq.log_size;
  uint32_t n = 0;
  while (true) {
    uint8_t* eqe = static_cast<uint8_t*>(eq.buf.va) + uint64_t(eq.cc & (nent - 1)) * p::kEqeBytes;
    uint8_t owner = __atomic_load_n(eqe + kEqeOwnerByte, __ATOMIC_ACQUIRE) & 1;
    if (owner != ((eq.cc & nent) ? 1 : 0)) break;  // still the device's
    udma_from_device_barrier();  // the EQE's contents only after its owner bit (Linux eq.c: dma_rmb)
    dispatch_eqe(eqe);
    ++eq.cc;
    ++n;
  }
  stats_.events += n;
  // Consumer index update and re-arm in one doorbell. After an interrupt always (Linux does the
  // same: an EQ left unarmed never interrupts again); when polling only if something was taken.
  if (n || from_vector) hal_->write32(uint32_t(eq_uar_->bar_off + p::kUarEqArm), (eq.eqn << 24) | (eq.cc & 0xffffff));
}

void Hca::poll_events() {
  drain_eq(async_eq_);
  for (uint32_t i = 0; i < ncomp_eqs_; ++i) drain_eq(comp_eqs_[i]);
}

void Hca::on_vector(uint32_t vector) {
  if (vector == 0) drain_eq(async_eq_, true);
  for (uint32_t i = 0; i < ncomp_eqs_; ++i)
    if (comp_eqs_[i].vector == vector) drain_eq(comp_eqs_[i], true);
}

// Runs in the event context: no commands here. Page requests are only noted; service() does them.
void Hca::dispatch_eqe(const uint8_t* eqe) {
  p::eqe::cview e(eqe);
  uint8_t type = uint8_t(e.get(p::eqe::event_type));
  const uint8_t* data = e.bytes(p::eqe::event_data);
  switch (type) {
    case p::event_type::CMD:
      cmd_.complete(uint32_t(p::get(data, p::cmd_inter_comp_event::command_completion_vector)));
      return;
    case p::event_type::PAGE_REQUEST: {
      stats_.page_requests++;
      uint16_t func = uint16_t(p::get(data, p::pages_req_event::function_id));
      int32_t n = int32_t(p::get(data, p::pages_req_event::num_pages));
      pages_.note_request(func, n);
      hal_->schedule_service();
      return;
    }
    case p::event_type::COMP: {
      uint32_t cqn = uint32_t(p::get(data, p::comp_event::cq_number));
      EventSink* owner = nullptr;
      {
        HalLock l(*hal_, obj_lock_);
        for (ObjHeader* o = objs_; o; o = o->next)
          if (o->kind == ObjKind::cq && static_cast<Cq*>(o)->cqn == cqn) {
            static_cast<Cq*>(o)->completions++;
            owner = static_cast<Cq*>(o)->owner;
            break;
          }
      }
      if (owner) owner->on_completion(cqn);
      return;
    }
    case p::event_type::CQ_ERROR: route_async(type, 0, uint32_t(p::get(data, p::cq_error::cqn)), false); return;
    case p::event_type::PORT_CHANGE:
      route_async(type, uint8_t(e.get(p::eqe::event_sub_type)),
                  uint32_t(p::get(data, p::port_state_change_event::port_num)), false);
      return;
    default:
      route_async(type, uint8_t(e.get(p::eqe::event_sub_type)), uint32_t(p::get(data, p::qp_events::qpn_rqn_sqn)),
                  p::get(data, p::qp_events::type) == p::kEventObjSrq);
      return;
  }
}

// An async event goes to the object it names (QP, SRQ, CQ), or to the device sink.
void Hca::route_async(uint8_t type, uint8_t sub, uint32_t number, bool srq_obj) {
  const char* name = p::event_type::name_of(type);
  AsyncEvent ev{type, sub, number, name ? name : "UNKNOWN"};
  EventSink* sink = nullptr;
  bool device_level = type == p::event_type::PORT_CHANGE || type == p::event_type::INTERNAL_ERROR;
  if (!device_level) {
    bool is_srq = srq_obj || type == p::event_type::SRQ_CATAS_ERROR || type == p::event_type::SRQ_RQ_LIMIT;
    HalLock l(*hal_, obj_lock_);
    for (ObjHeader* o = objs_; o && !sink; o = o->next) {
      if (type == p::event_type::CQ_ERROR && o->kind == ObjKind::cq && static_cast<Cq*>(o)->cqn == number) {
        static_cast<Cq*>(o)->errors++;
        sink = static_cast<Cq*>(o)->owner;
      } else if (type != p::event_type::CQ_ERROR && is_srq && o->kind == ObjKind::srq &&
                 static_cast<Srq*>(o)->srqn == number) {
        static_cast<Srq*>(o)->errors++;
        sink = static_cast<Srq*>(o)->owner;
      } else if (type != p::event_type::CQ_ERROR && !is_srq && o->kind == ObjKind::qp &&
                 static_cast<Qp*>(o)->qpn == number) {
        static_cast<Qp*>(o)->events++;
        sink = static_cast<Qp*>(o)->owner;
      }
    }
  } else {
    sink = device_sink_;
  }
  if (type == p::event_type::PORT_CHANGE) {
    __atomic_store_n(&port_dirty_, true, __ATOMIC_RELEASE);
    hal_->schedule_service();
  }
  if (type == p::event_type::PORT_CHANGE)
    MLX_INFO(*hal_, port, "port %u change: %s", number,
             p::port_change_subtype::name_of(sub) ? p::port_change_subtype::name_of(sub) : "?");
  if (!sink) {
    stats_.unrouted_events++;
    MLX_WARN(*hal_, eq, "event %s(0x%x) for 0x%x has no owner", ev.name, type, number);
    return;
  }
  sink->on_async_event(ev);
}

}  // namespace melon::mlx5::core
