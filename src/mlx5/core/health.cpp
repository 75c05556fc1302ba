// Health (Linux health.c poll_health and its fatal sensors), the fatal path, and the deferred
// work the platform runs through service().
#include <string.h>

#include "mlx5/core/bar.h"
#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/pci.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

namespace {
constexpr uint32_t kSeverityCrit = 2;  // health_buffer.severity: syslog-like, 2 = critical (Linux health.c)
}  // namespace

// ---- health and deferred work -----------------------------------------------------------------

void Hca::log_health_buffer() {
  auto field = [&](const p::Field& f) {
    p::Field abs = f;
    abs.bit_off += p::initial_seg::health_buffer.bit_off;
    return bar_field(*hal_, abs);
  };
  uint32_t synd = field(p::health_buffer::synd);
  const char* name = p::health_syndrome::name_of(synd);
  MLX_ERR(*hal_, health,
          "syndrome 0x%x %s, ext_synd 0x%04x, severity %u, rfr %u, irisc %u, fw_version 0x%08x, hw_id 0x%08x", synd,
          name ? name : "UNRECOGNIZED", field(p::health_buffer::ext_synd), field(p::health_buffer::severity),
          field(p::health_buffer::rfr), field(p::health_buffer::irisc_index), field(p::health_buffer::fw_version),
          field(p::health_buffer::hw_id));
}

// Fatal when the firmware asks for recovery (rfr, Linux's fatal sensor) or reports a critical
// syndrome (severity <= CRIT): either way it will not come back without a reset.
bool Hca::fatal_syndrome_sensor() {
  auto health = [&](const p::Field& f) {
    p::Field abs = f;
    abs.bit_off += p::initial_seg::health_buffer.bit_off;
    return bar_field(*hal_, abs);
  };
  uint32_t synd = health(p::health_buffer::synd);
  if (synd && (health(p::health_buffer::rfr) || health(p::health_buffer::severity) <= kSeverityCrit)) {
    enter_fatal(FatalReason::fw_syndrome, uint8_t(synd));
    return true;
  }
  return false;
}

bool Hca::health_check() {
  HcaState s = state();
  if (s == HcaState::fatal) return true;
  if (s == HcaState::detached || !cmd_ready_) return false;
  auto health = [&](const p::Field& f) {
    p::Field abs = f;
    abs.bit_off += p::initial_seg::health_buffer.bit_off;
    return bar_field(*hal_, abs);
  };
  if (hal_->read32(p::init_seg_offset::health) == 0xffffffffu && hal_->read32(0) == 0xffffffffu) {
    enter_fatal(FatalReason::pci_gone, 0);
    return true;
  }
  if (bar_field(*hal_, p::initial_seg::nic_interface) == p::nic_interface::DISABLED) {
    enter_fatal(FatalReason::nic_disabled, 0);
    return true;
  }
  uint32_t synd = health(p::health_buffer::synd);
  if (fatal_syndrome_sensor()) return true;
  uint32_t count = bar_field(*hal_, p::initial_seg::health_counter);
  health_miss_ = count == health_count_ ? health_miss_ + 1 : 0;
  health_count_ = count;
  if (health_miss_ >= cfg_.health_misses) {
    enter_fatal(FatalReason::health_stalled, uint8_t(synd));
    return true;
  }
  if (synd) {
    const char* name = p::health_syndrome::name_of(synd);
    MLX_WARN(*hal_, health, "non-fatal health syndrome 0x%x %s", synd, name ? name : "UNRECOGNIZED");
  }
  return false;
}

void Hca::fence_bus_master() {
  hal_->config_write16(kPciCommand, uint16_t(hal_->config_read16(kPciCommand) & ~kPciBusMaster));
}

// Fatal: stop new work, fence the device off the bus, keep every buffer it may write.
void Hca::enter_fatal(FatalReason r, uint8_t syndrome) {
  HcaState prev = HcaState(__atomic_exchange_n(&state_, uint8_t(HcaState::fatal), __ATOMIC_ACQ_REL));
  if (prev == HcaState::fatal) return;
  fatal_reason_ = r;
  fatal_syndrome_ = syndrome;
  stats_.fatal_events++;
  cmd_.fence();
  fence_bus_master();
  ledger_.set_fenced(true);
  pages_.quarantine_given();
  MLX_ERR(*hal_, health, "device fatal: %s; new work stopped, bus mastering off, DMA quarantined",
          fatal_reason_name(r));
  if (r != FatalReason::pci_gone) log_health_buffer();
  notify_lost();
}

// The device and every object on it are lost (fatal, or reset under live objects): tell the
// device sink and every owner, once.
void Hca::notify_lost() {
  AsyncEvent ev{p::event_type::INTERNAL_ERROR, 0, 0, "INTERNAL_ERROR"};
  if (device_sink_) device_sink_->on_async_event(ev);
  HalLock l(*hal_, obj_lock_);
  for (ObjHeader* o = objs_; o; o = o->next) {
    EventSink* s = o->kind == ObjKind::qp    ? static_cast<Qp*>(o)->owner
                   : o->kind == ObjKind::cq  ? static_cast<Cq*>(o)->owner
                   : o->kind == ObjKind::srq ? static_cast<Srq*>(o)->owner
                                             : nullptr;
    if (s) s->on_async_event(ev);
  }
}

bool Hca::cmd_device_dead() {
  if (state() == HcaState::fatal) return true;
  // A removed device reads all ones: do not wait out a long timeout for it.
  if (hal_->read32(0) == 0xffffffffu) return true;
  // Nor for firmware that has declared itself dead: a command waiting in service() would otherwise
  // hold off the health poll for the whole command timeout (the DEXT runs both on one queue).
  return cmd_ready_ && fatal_syndrome_sensor();
}

// Also runs inside the page command that run_pending() issues from here: polling is reentrant
// (each EQ has its lock, taken only while draining) and run_pending() is a try-lock.
void Hca::cmd_wait_idle() {
  if (cmd_.event_mode() && !vectors_) poll_events();
  if (pages_.has_pending()) pages_.run_pending();
}

void Hca::service() {
  if (state() != HcaState::up) return;
  if (!vectors_) poll_events();
  if (pages_.has_pending()) pages_.run_pending();
  if (__atomic_exchange_n(&port_dirty_, false, __ATOMIC_ACQ_REL)) query_port();
  uint64_t now = hal_->now_ns();
  if (now - last_health_ns_ >= uint64_t(cfg_.health_interval_ms) * 1000000ull) {
    last_health_ns_ = now;
    health_check();
  }
}

}  // namespace melon::mlx5::core
