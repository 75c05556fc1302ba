// The HCA life cycle: bring-up, teardown, no-FLR re-init and recovery by function reset.
// The order is Linux's (main.c mlx5_function_setup, mlx5_load, mlx5_unload, mlx5_function_teardown)
// and rdma-core's mlx5_vfio_setup_function; each step is one small function in hca_steps.cpp.
#include <string.h>

#include "mlx5/core/bar.h"
#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/pci.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

const char* stage_name(Stage s) {
#define MELON_MLX_STAGE_NAME(n, str) \
  case Stage::n: return str;
  switch (s) { MELON_MLX_STAGES(MELON_MLX_STAGE_NAME) }
#undef MELON_MLX_STAGE_NAME
  return "?";
}

const char* fatal_reason_name(FatalReason r) {
#define MELON_MLX_FATAL_NAME(n, str) \
  case FatalReason::n: return str;
  switch (r) { MELON_MLX_FATAL_REASONS(MELON_MLX_FATAL_NAME) }
#undef MELON_MLX_FATAL_NAME
  return "?";
}

const char* hca_state_name(HcaState s) {
  switch (s) {
    case HcaState::detached: return "detached";
    case HcaState::down: return "down";
    case HcaState::up: return "up";
    case HcaState::fatal: return "fatal";
  }
  return "?";
}

const char* err_name(Err e) {
#define MELON_MLX_ERR_NAME(n, str) \
  case Err::n: return str;
  switch (e) { MELON_MLX_ERRORS(MELON_MLX_ERR_NAME) }
#undef MELON_MLX_ERR_NAME
  return "?";
}

void Hca::attach(Hal* hal, const HcaConfig& cfg) {
  hal_ = hal;
  cfg_ = cfg;
  if (cfg_.comp_eqs == 0) cfg_.comp_eqs = 1;
  if (cfg_.comp_eqs > kMaxCompEqs) cfg_.comp_eqs = kMaxCompEqs;
  ledger_.init(hal);
  pages_.init(hal, &ledger_, &cmd_);
  pages_.set_limit(cfg_.max_fw_pages);
  obj_lock_ = hal->lock_create();
  async_eq_.lock = hal->lock_create();
  for (auto& eq : comp_eqs_) eq.lock = hal->lock_create();
  set_state(HcaState::down);
}

void Hca::detach() {
  if (state() == HcaState::detached || !hal_) return;
  // A failed bring-up leaves the state down with pieces allocated: teardown takes them back.
  if (state() != HcaState::down || cmd_ready_ || ledger_.live_buffers()) teardown();
  hal_->lock_destroy(obj_lock_);
  hal_->lock_destroy(async_eq_.lock);
  for (auto& eq : comp_eqs_) hal_->lock_destroy(eq.lock);
  obj_lock_ = async_eq_.lock = nullptr;
  for (auto& eq : comp_eqs_) eq.lock = nullptr;
  set_state(HcaState::detached);
}

Err Hca::fail(Err e) {
  failure_.err = e;
  failure_.cmd = last_cmd_;
  const char* sn = p::cmd_status::name_of(last_cmd_.status);
  MLX_ERR(*hal_, pci, "stage '%s' failed: %s (opcode %s(0x%x) status %s(0x%x) syndrome 0x%x)",
          stage_name(failure_.stage), err_name(e), p::opcode_name(last_cmd_.opcode), last_cmd_.opcode,
          sn ? sn : "UNKNOWN", last_cmd_.status, last_cmd_.syndrome);
  return e;
}

Err Hca::cmd(const void* in, uint32_t in_len, void* out, uint32_t out_len, CmdFailure* f, uint32_t timeout_ms) {
  if (state() == HcaState::fatal) return Err::dead;
  CmdFailure local;
  Err e = cmd_.exec(in, in_len, out, out_len, &local, timeout_ms);
  if (e != Err::ok) last_cmd_ = local;
  if (f) *f = local;
  // A timeout only costs the slot (quarantined); the health poller decides whether the device
  // is fatal.
  return e;
}

// ---- bring-up ---------------------------------------------------------------------------------

// ENABLE_HCA .. port query: the part of the sequence a no-FLR re-init repeats.
Err Hca::setup_from_enable() {
  Err e;
  if ((e = step(Stage::enable_hca, enable_hca())) != Err::ok) return e;
  if ((e = step(Stage::issi, set_issi())) != Err::ok) return e;
  if ((e = step(Stage::boot_pages, pages_.satisfy_startup(p::query_pages_op_mod::BOOT_PAGES, &last_cmd_))) != Err::ok)
    return e;
  if ((e = step(Stage::hca_ctrl, set_host_endianness())) != Err::ok) return e;
  if ((e = step(Stage::set_hca_cap, set_hca_caps())) != Err::ok) return e;
  if ((e = step(Stage::init_pages, pages_.satisfy_startup(p::query_pages_op_mod::INIT_PAGES, &last_cmd_))) != Err::ok)
    return e;
  if ((e = step(Stage::init_hca, init_hca())) != Err::ok) return e;
  if ((e = step(Stage::query_caps, query_all_caps())) != Err::ok) return e;
  if ((e = step(Stage::uar, alloc_uar(&eq_uar_))) != Err::ok) return e;
  // The EQ UAR is the core's own, not a client object.
  unlink(eq_uar_);
  if ((e = step(Stage::eqs, setup_eqs())) != Err::ok) return e;
  if ((e = step(Stage::pd_td, alloc_pd_td())) != Err::ok) return e;
  if (cfg_.enable_roce && caps_.port_type == p::kPortTypeEth)
    if ((e = step(Stage::roce_en, set_roce_en(true))) != Err::ok) return e;
  if ((e = step(Stage::port_query, query_port())) != Err::ok) return e;
  return Err::ok;
}

Err Hca::bring_up() {
  if (state() == HcaState::up) return Err::ok;
  if (state() != HcaState::down) return Err::bad_state;
  uint64_t t0 = hal_->now_ns();
  failure_ = {};
  last_cmd_ = {};
  MLX_INFO(*hal_, pci, "bring-up");
  hal_->config_write16(kPciCommand, uint16_t(hal_->config_read16(kPciCommand) | kPciMemorySpace | kPciBusMaster));
  Err e;
  if ((e = step(Stage::wait_fw, wait_fw(cfg_.fw_init_timeout_ms))) != Err::ok) return e;
  if ((e = step(Stage::cmd_init, cmd_.init(hal_, &ledger_, this))) != Err::ok) return e;
  cmd_ready_ = true;
  cmd_.set_default_timeout_ms(cfg_.cmd_timeout_ms);
  // The firmware finishes initializing once it knows where the command queue is.
  if ((e = step(Stage::wait_fw, wait_fw(cfg_.fw_init_timeout_ms))) != Err::ok) return e;
  if ((e = setup_from_enable()) != Err::ok) return e;
  health_miss_ = 0;
  health_count_ = bar_field(*hal_, p::initial_seg::health_counter);
  set_state(HcaState::up);
  stats_.bring_ups++;
  stats_.last_bring_up_ns = hal_->now_ns() - t0;
  MLX_INFO(*hal_, pci, "up in %llu us: %u firmware pages, %llu commands",
           (unsigned long long)(stats_.last_bring_up_ns / 1000), pages_.given(),
           (unsigned long long)cmd_.commands_run());
  return Err::ok;
}

// ---- teardown ---------------------------------------------------------------------------------

// Client objects, then what bring-up created after INIT_HCA, in reverse.
Err Hca::unload() {
  Err first = Err::ok;
  auto keep = [&](Stage s, Err e) {
    if (e != Err::ok && first == Err::ok) {
      failure_.stage = s;
      first = fail(e);
    }
  };
  keep(Stage::objects, destroy_all_objects());
  if (roce_enabled_) keep(Stage::roce_en, set_roce_en(false));
  if (td_live_) {
    uint8_t in[p::dealloc_transport_domain_in::size_bytes] = {}, out[p::dealloc_transport_domain_out::size_bytes] = {};
    p::cmd_set_header(in, p::opcode::DEALLOC_TRANSPORT_DOMAIN, 0);
    p::dealloc_transport_domain_in::view(in).set(p::dealloc_transport_domain_in::transport_domain, tdn_);
    keep(Stage::pd_td, cmd(in, sizeof in, out, sizeof out));
    td_live_ = false;
  }
  if (pd_live_) {
    uint8_t in[p::dealloc_pd_in::size_bytes] = {}, out[p::dealloc_pd_out::size_bytes] = {};
    p::cmd_set_header(in, p::opcode::DEALLOC_PD, 0);
    p::dealloc_pd_in::view(in).set(p::dealloc_pd_in::pd, pdn_);
    keep(Stage::pd_td, cmd(in, sizeof in, out, sizeof out));
    pd_live_ = false;
  }
  for (uint32_t i = ncomp_eqs_; i-- > 0;) destroy_eq(comp_eqs_[i]);
  ncomp_eqs_ = 0;
  // Back to polling before the EQ that carries command completions goes away.
  cmd_.set_event_mode(false);
  destroy_eq(async_eq_);
  if (vectors_)
    for (uint32_t v = 0; v < hal_->vector_count() && v < 1 + kMaxCompEqs; ++v) hal_->vector_disable(v);
  vectors_ = false;
  if (eq_uar_) {
    keep(Stage::uar, release_uar_indices(*eq_uar_));
    hal_->mem_free(eq_uar_, sizeof(Uar));
    eq_uar_ = nullptr;
  }
  return first;
}

Err Hca::release_hca() {
  Err e;
  if (hca_inited_ && (e = step(Stage::teardown_hca, teardown_hca())) != Err::ok) return e;
  if ((e = step(Stage::reclaim_pages, pages_.reclaim_all(&last_cmd_))) != Err::ok) return e;
  if (hca_enabled_ && (e = step(Stage::disable_hca, disable_hca())) != Err::ok) return e;
  return Err::ok;
}

Err Hca::teardown() {
  if (state() == HcaState::detached) return Err::bad_state;
  Err e = Err::ok;
  failure_ = {};
  if (state() == HcaState::fatal) {
    // The device cannot be talked to: reset it, then everything it held is ours again.
    hal_->function_reset();
    stats_.resets++;
    reset_software_state();
  } else {
    MLX_INFO(*hal_, pci, "teardown");
    Err u = unload();
    Err r = cmd_ready_ ? release_hca() : Err::ok;
    e = u != Err::ok ? u : r;
    if (e != Err::ok || state() == HcaState::fatal) {
      // Something refused to go: only a reset makes the memory safe to free.
      MLX_ERR(*hal_, pci, "teardown incomplete (%s); resetting the function", err_name(e));
      hal_->function_reset();
      stats_.resets++;
      reset_software_state();
    } else {
      cmd_.shutdown();
      cmd_ready_ = false;
      pages_.destroy();
      if (ledger_.quarantined_buffers()) {
        // A command that never completed may still write its buffers: reset before freeing them.
        MLX_WARN(*hal_, pci, "%llu quarantined DMA buffers: resetting the function before freeing them",
                 (unsigned long long)ledger_.quarantined_buffers());
        hal_->function_reset();
        stats_.resets++;
        ledger_.release_quarantine();
      }
    }
  }
  set_state(HcaState::down);
  uint32_t objs = 0;
  for (uint32_t k = 0; k < uint32_t(ObjKind::count); ++k) objs += live_[k];
  if (ledger_.live_buffers() || pages_.chunks() || objs) {
    MLX_ERR(*hal_, pci, "teardown left %llu DMA buffers, %u page chunks, %u objects",
            (unsigned long long)ledger_.live_buffers(), pages_.chunks(), objs);
    return e != Err::ok ? e : Err::leak;
  }
  MLX_INFO(*hal_, pci, "down: every page back (%llu given, %llu returned in all), no DMA left",
           (unsigned long long)pages_.given_total(), (unsigned long long)pages_.returned_total());
  return e;
}

// After a function reset the device holds nothing of ours: forget every object, release every
// quarantine, free every buffer.
void Hca::reset_software_state() {
  drop_all_objects();
  cmd_.set_event_mode(false);
  if (vectors_)
    for (uint32_t v = 0; v < hal_->vector_count() && v < 1 + kMaxCompEqs; ++v) hal_->vector_disable(v);
  vectors_ = false;
  ledger_.set_fenced(false);
  for (uint32_t i = 0; i < ncomp_eqs_; ++i) {
    ledger_.free(comp_eqs_[i].buf);
    comp_eqs_[i].buf = {};
    comp_eqs_[i].live = false;
  }
  ncomp_eqs_ = 0;
  ledger_.free(async_eq_.buf);
  async_eq_.buf = {};
  async_eq_.live = false;
  if (eq_uar_) hal_->mem_free(eq_uar_, sizeof(Uar));
  eq_uar_ = nullptr;
  pages_.reset_done();
  pages_.destroy();
  if (cmd_ready_) cmd_.shutdown();
  cmd_ready_ = false;
  ledger_.release_quarantine();
  hca_enabled_ = hca_inited_ = roce_enabled_ = pd_live_ = td_live_ = false;
  fatal_reason_ = FatalReason::none;
  fatal_syndrome_ = 0;
}

Err Hca::recover() {
  if (state() == HcaState::detached) return Err::bad_state;
  MLX_WARN(*hal_, pci, "recovery: function reset and full bring-up (was %s)", hca_state_name(state()));
  failure_ = {};
  // Objects still alive (a recovery asked for while up) vanish with the reset: their owners hear of
  // it (after a fatal error they already have).
  if (state() != HcaState::fatal && objs_) notify_lost();
  if (hal_->function_reset() != kHalOk) {
    failure_.stage = Stage::function_reset;
    return fail(Err::dead);
  }
  stats_.resets++;
  reset_software_state();
  set_state(HcaState::down);
  return bring_up();
}

Err Hca::reinit(bool* used_reset) {
  if (used_reset) *used_reset = false;
  if (state() != HcaState::up) return Err::bad_state;
  stats_.reinits++;
  failure_ = {};
  MLX_INFO(*hal_, pci, "re-init without function reset");
  set_state(HcaState::down);
  Err e = unload();
  if (e == Err::ok) e = release_hca();
  if (e == Err::ok) {
    uint64_t t0 = hal_->now_ns();
    e = setup_from_enable();
    if (e == Err::ok) {
      set_state(HcaState::up);
      stats_.last_bring_up_ns = hal_->now_ns() - t0;
      health_miss_ = 0;
      return Err::ok;
    }
  }
  reinit_failure_ = failure_;
  stats_.reinit_fallbacks++;
  const char* sn = p::cmd_status::name_of(failure_.cmd.status);
  MLX_WARN(
      *hal_, pci,
      "re-init failed at stage '%s' (opcode %s(0x%x) status %s(0x%x) syndrome 0x%x): falling back to function reset",
      stage_name(failure_.stage), p::opcode_name(failure_.cmd.opcode), failure_.cmd.opcode, sn ? sn : "UNKNOWN",
      failure_.cmd.status, failure_.cmd.syndrome);
  if (used_reset) *used_reset = true;
  return recover();
}

}  // namespace melon::mlx5::core
