// The HCA life cycle: bring-up, teardown, no-FLR re-init and recovery by function reset.
// The order is Linux's (main.c mlx5_function_setup, mlx5_load, mlx5_unload, mlx5_function_teardown)
// and rdma-core's mlx5_vfio_setup_function; each step is one small function below.
#include <string.h>

#include "mlx5/core/bar.h"
#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

namespace {
constexpr uint32_t kPciCommand = 0x04;  // PCI config space command register (low 16 bits)
constexpr uint32_t kPciMemorySpace = 1u << 1, kPciBusMaster = 1u << 2;
constexpr uint32_t kFwPollUs = 1000;
constexpr uint16_t kIssi = 1;
constexpr uint32_t kSeverityCrit =
    2;  // health_buffer.severity: syslog-like, 2 = critical (Linux health.c)  // the interface version this driver speaks (PRM: ISSI 1)
}  // namespace

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

// ---- the steps --------------------------------------------------------------------------------

Err Hca::wait_fw(uint32_t timeout_ms) {
  uint64_t start = hal_->now_ns();
  last_cmd_ = {};
  while (true) {
    if (hal_->read32(0) == 0xffffffffu) return Err::dead;  // nothing behind the BAR
    if (!bar_field(*hal_, p::initial_seg::initializing)) return Err::ok;
    if (hal_->now_ns() - start > uint64_t(timeout_ms) * 1000000ull) return Err::timeout;
    hal_->delay_us(kFwPollUs);
  }
}

Err Hca::enable_hca() {
  uint8_t in[p::enable_hca_in::size_bytes] = {}, out[p::enable_hca_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ENABLE_HCA, 0);
  Err e = cmd(in, sizeof in, out, sizeof out);
  hca_enabled_ = e == Err::ok;
  return e;
}

Err Hca::disable_hca() {
  uint8_t in[p::disable_hca_in::size_bytes] = {}, out[p::disable_hca_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::DISABLE_HCA, 0);
  Err e = cmd(in, sizeof in, out, sizeof out);
  if (e == Err::ok) hca_enabled_ = false;
  return e;
}

Err Hca::set_issi() {
  uint8_t qin[p::query_issi_in::size_bytes] = {}, qout[p::query_issi_out::size_bytes] = {};
  p::cmd_set_header(qin, p::opcode::QUERY_ISSI, 0);
  if (Err e = cmd(qin, sizeof qin, qout, sizeof qout); e != Err::ok) return e;
  uint32_t supported = uint32_t(p::query_issi_out::cview(qout).get(p::query_issi_out::supported_issi_dw0));
  if (!(supported & (1u << kIssi))) {
    MLX_ERR(*hal_, pci, "firmware does not support ISSI %u (supported mask 0x%x)", kIssi, supported);
    return Err::unsupported;
  }
  uint8_t in[p::set_issi_in::size_bytes] = {}, out[p::set_issi_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::SET_ISSI, 0);
  p::set_issi_in::view(in).set(p::set_issi_in::current_issi, kIssi);
  return cmd(in, sizeof in, out, sizeof out);
}

Err Hca::query_caps(uint8_t type, uint8_t mode, uint8_t* cap) {
  uint8_t in[p::query_hca_cap_in::size_bytes] = {};
  Scratch out(*hal_, p::query_hca_cap_out::size_bytes);
  if (!out) return Err::no_memory;
  p::cmd_set_header(in, p::opcode::QUERY_HCA_CAP, p::cap_op_mod(type, mode));
  if (Err e = cmd(in, sizeof in, out.get(), p::query_hca_cap_out::size_bytes); e != Err::ok) return e;
  memcpy(cap, p::query_hca_cap_out::cview(out.get()).bytes(p::query_hca_cap_out::capability), HcaCaps::kCapBytes);
  return Err::ok;
}

// General caps: no command checksums, UAR pages of the host page size (Linux handle_hca_cap);
// RoCE caps: software-chosen UDP source ports when the device allows it (rdma-core
// handle_hca_cap_roce).
Err Hca::set_hca_caps() {
  if (Err e = query_caps(p::cap_type::GENERAL_DEVICE, p::cap_mode::GET_CUR, caps_.general); e != Err::ok) return e;
  if (Err e = query_caps(p::cap_type::GENERAL_DEVICE, p::cap_mode::GET_MAX, caps_.general_max); e != Err::ok) return e;
  Scratch in(*hal_, p::set_hca_cap_in::size_bytes);
  uint8_t out[p::set_hca_cap_out::size_bytes] = {};
  if (!in) return Err::no_memory;
  p::cmd_set_header(in.get(), p::opcode::SET_HCA_CAP, p::cap_op_mod(p::cap_type::GENERAL_DEVICE, 0));
  uint8_t* cap = p::set_hca_cap_in::view(in.get()).bytes(p::set_hca_cap_in::capability);
  memcpy(cap, caps_.general, HcaCaps::kCapBytes);
  p::cmd_hca_cap::view c(cap);
  c.set(p::cmd_hca_cap::cmdif_checksum, 0);
  uint32_t page_shift = 0;
  while ((1u << page_shift) < hal_->host_page_size()) ++page_shift;
  // UAR pages of the host page size when the device allows it (Linux asks unconditionally); else the
  // largest it has, and the user-client layer maps several UARs per host page.
  uint32_t want = page_shift - 12, max = uint32_t(p::get(caps_.general_max, p::cmd_hca_cap::log_uar_page_sz));
  c.set(p::cmd_hca_cap::log_uar_page_sz, want < max ? want : max);
  if (Err e = cmd(in.get(), p::set_hca_cap_in::size_bytes, out, sizeof out); e != Err::ok) return e;

  if (!p::get(caps_.general, p::cmd_hca_cap::roce)) return Err::ok;
  uint8_t roce_max[HcaCaps::kCapBytes];
  if (Err e = query_caps(p::cap_type::ROCE, p::cap_mode::GET_CUR, caps_.roce); e != Err::ok) return e;
  if (Err e = query_caps(p::cap_type::ROCE, p::cap_mode::GET_MAX, roce_max); e != Err::ok) return e;
  if (p::get(caps_.roce, p::roce_cap::sw_r_roce_src_udp_port) || !p::get(roce_max, p::roce_cap::sw_r_roce_src_udp_port))
    return Err::ok;
  memset(in.get(), 0, p::set_hca_cap_in::size_bytes);
  p::cmd_set_header(in.get(), p::opcode::SET_HCA_CAP, p::cap_op_mod(p::cap_type::ROCE, 0));
  memcpy(cap, caps_.roce, HcaCaps::kCapBytes);
  p::set(cap, p::roce_cap::sw_r_roce_src_udp_port, 1);
  return cmd(in.get(), p::set_hca_cap_in::size_bytes, out, sizeof out);
}

Err Hca::init_hca() {
  uint8_t in[p::init_hca_in::size_bytes] = {}, out[p::init_hca_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::INIT_HCA, 0);
  Err e = cmd(in, sizeof in, out, sizeof out);
  hca_inited_ = e == Err::ok;
  return e;
}

Err Hca::teardown_hca() {
  uint8_t in[p::teardown_hca_in::size_bytes] = {}, out[p::teardown_hca_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::TEARDOWN_HCA, 0);
  p::teardown_hca_in::view(in).set(p::teardown_hca_in::profile, p::teardown_profile::GRACEFUL_CLOSE);
  Err e = cmd(in, sizeof in, out, sizeof out);
  if (e == Err::ok) hca_inited_ = false;
  return e;
}

Err Hca::query_all_caps() {
  if (Err e = query_caps(p::cap_type::GENERAL_DEVICE, p::cap_mode::GET_CUR, caps_.general); e != Err::ok) return e;
  p::cmd_hca_cap::cview c(caps_.general);
  caps_.has_roce = c.get(p::cmd_hca_cap::roce);
  if (caps_.has_roce)
    if (Err e = query_caps(p::cap_type::ROCE, p::cap_mode::GET_CUR, caps_.roce); e != Err::ok) return e;
  caps_.log_max_qp = uint32_t(c.get(p::cmd_hca_cap::log_max_qp));
  caps_.log_max_cq = uint32_t(c.get(p::cmd_hca_cap::log_max_cq));
  caps_.log_max_srq = uint32_t(c.get(p::cmd_hca_cap::log_max_srq));
  caps_.log_max_mkey = uint32_t(c.get(p::cmd_hca_cap::log_max_mkey));
  caps_.log_max_pd = uint32_t(c.get(p::cmd_hca_cap::log_max_pd));
  caps_.log_max_eq = uint32_t(c.get(p::cmd_hca_cap::log_max_eq));
  caps_.log_bf_reg_size = uint32_t(c.get(p::cmd_hca_cap::log_bf_reg_size));
  caps_.bf = c.get(p::cmd_hca_cap::bf);
  caps_.gid_table_size = uint32_t(c.get(p::cmd_hca_cap::gid_table_size));
  caps_.num_ports = uint32_t(c.get(p::cmd_hca_cap::num_ports));
  caps_.port_type = uint32_t(c.get(p::cmd_hca_cap::port_type));
  caps_.log_uar_page_sz = uint32_t(c.get(p::cmd_hca_cap::log_uar_page_sz));
  if (caps_.has_roce && !caps_.gid_table_size)
    caps_.gid_table_size = uint32_t(p::get(caps_.roce, p::roce_cap::roce_address_table_size));
  MLX_INFO(*hal_, pci, "caps: log_max_qp %u log_max_cq %u log_max_mkey %u roce %u gid table %u port type %u",
           caps_.log_max_qp, caps_.log_max_cq, caps_.log_max_mkey, caps_.has_roce, caps_.gid_table_size,
           caps_.port_type);
  return Err::ok;
}

Err Hca::alloc_pd_td() {
  uint8_t in[p::alloc_pd_in::size_bytes] = {}, out[p::alloc_pd_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ALLOC_PD, 0);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  pdn_ = uint32_t(p::alloc_pd_out::cview(out).get(p::alloc_pd_out::pd));
  pd_live_ = true;
  uint8_t tin[p::alloc_transport_domain_in::size_bytes] = {}, tout[p::alloc_transport_domain_out::size_bytes] = {};
  p::cmd_set_header(tin, p::opcode::ALLOC_TRANSPORT_DOMAIN, 0);
  if (Err e = cmd(tin, sizeof tin, tout, sizeof tout); e != Err::ok) return e;
  tdn_ = uint32_t(p::alloc_transport_domain_out::cview(tout).get(p::alloc_transport_domain_out::transport_domain));
  td_live_ = true;
  return Err::ok;
}

// Sets the NIC vport's roce_en and reads it back: a device that accepts the write but keeps
// RoCE off (the no-FLR re-init quirk) is reported as Err::bad_state at this stage.
Err Hca::set_roce_en(bool on) {
  Scratch in(*hal_, p::modify_nic_vport_context_in::size_bytes);
  if (!in) return Err::no_memory;
  uint8_t out[p::modify_nic_vport_context_out::size_bytes] = {};
  p::cmd_set_header(in.get(), p::opcode::MODIFY_NIC_VPORT_CONTEXT, 0);
  p::modify_nic_vport_context_in::view v(in.get());
  v.at(p::modify_nic_vport_context_in::field_select).set(p::modify_nic_vport_field_select::roce_en, 1);
  v.at(p::modify_nic_vport_context_in::nic_vport_context).set(p::nic_vport_context::roce_en, on);
  if (Err e = cmd(in.get(), p::modify_nic_vport_context_in::size_bytes, out, sizeof out); e != Err::ok) return e;
  roce_enabled_ = on;
  uint8_t qin[p::query_nic_vport_context_in::size_bytes] = {};
  Scratch qout(*hal_, p::query_nic_vport_context_out::size_bytes);
  if (!qout) return Err::no_memory;
  p::cmd_set_header(qin, p::opcode::QUERY_NIC_VPORT_CONTEXT, 0);
  if (Err e = cmd(qin, sizeof qin, qout.get(), p::query_nic_vport_context_out::size_bytes); e != Err::ok) return e;
  bool now = p::query_nic_vport_context_out::cview(qout.get())
                 .at(p::query_nic_vport_context_out::nic_vport_context)
                 .get(p::nic_vport_context::roce_en);
  port_.roce_en = now;
  if (now != on) {
    last_cmd_ = {p::opcode::MODIFY_NIC_VPORT_CONTEXT, 0, 0, 0};
    MLX_ERR(*hal_, port, "roce_en reads back %u after setting it to %u", now, on);
    return Err::bad_state;
  }
  return Err::ok;
}

Err Hca::query_port() {
  uint8_t in[p::query_vport_state_in::size_bytes] = {}, out[p::query_vport_state_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::QUERY_VPORT_STATE, 0);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  p::query_vport_state_out::cview o(out);
  port_.vport_state = uint8_t(o.get(p::query_vport_state_out::state));
  port_.admin_state = uint8_t(o.get(p::query_vport_state_out::admin_state));
  uint8_t qin[p::query_nic_vport_context_in::size_bytes] = {};
  Scratch qout(*hal_, p::query_nic_vport_context_out::size_bytes);
  if (!qout) return Err::no_memory;
  p::cmd_set_header(qin, p::opcode::QUERY_NIC_VPORT_CONTEXT, 0);
  if (Err e = cmd(qin, sizeof qin, qout.get(), p::query_nic_vport_context_out::size_bytes); e != Err::ok) return e;
  auto ctx = p::query_nic_vport_context_out::cview(qout.get()).at(p::query_nic_vport_context_out::nic_vport_context);
  port_.mtu = uint16_t(ctx.get(p::nic_vport_context::mtu));
  port_.roce_en = ctx.get(p::nic_vport_context::roce_en);
  // permanent_address is a 64-bit field holding the MAC in its low 48 bits.
  uint64_t mac = ctx.get(p::nic_vport_context::permanent_address);
  for (int i = 0; i < 6; ++i) port_.mac[i] = uint8_t(mac >> (40 - 8 * i));
  MLX_INFO(*hal_, port, "vport %s (admin %u), mtu %u, roce_en %u, mac %02x:%02x:%02x:%02x:%02x:%02x",
           port_.vport_state == p::vport_state::UP ? "up" : "down", port_.admin_state, port_.mtu, port_.roce_en,
           port_.mac[0], port_.mac[1], port_.mac[2], port_.mac[3], port_.mac[4], port_.mac[5]);
  return Err::ok;
}

// PAOS through ACCESS_REG: local port 1, admin status with its enable bit (ase).
Err Hca::set_port_admin(bool up) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  uint8_t in[p::access_register_in::size_bytes + p::paos_reg::size_bytes] = {};
  uint8_t out[p::access_register_out::size_bytes + p::paos_reg::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ACCESS_REG, p::access_reg_op_mod::WRITE);
  p::access_register_in::view(in).set(p::access_register_in::register_id, p::reg_id::PAOS);
  p::paos_reg::view(p::access_register_in::view(in).elem(p::access_register_in::register_data, 0))
      .set(p::paos_reg::local_port, 1)
      .set(p::paos_reg::admin_status, up ? p::kPortUp : p::kPortDown)
      .set(p::paos_reg::ase, 1);
  return cmd(in, sizeof in, out, sizeof out);
}

Err Hca::query_port_oper(bool* up) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  uint8_t in[p::access_register_in::size_bytes + p::paos_reg::size_bytes] = {};
  uint8_t out[p::access_register_out::size_bytes + p::paos_reg::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ACCESS_REG, p::access_reg_op_mod::READ);
  p::access_register_in::view(in).set(p::access_register_in::register_id, p::reg_id::PAOS);
  p::paos_reg::view(p::access_register_in::view(in).elem(p::access_register_in::register_data, 0))
      .set(p::paos_reg::local_port, 1);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  *up = p::paos_reg::cview(p::access_register_out::cview(out).elem(p::access_register_out::register_data, 0))
            .get(p::paos_reg::oper_status) == p::kPortUp;
  return Err::ok;
}

// ---- bring-up ---------------------------------------------------------------------------------

// ENABLE_HCA .. port query: the part of the sequence a no-FLR re-init repeats.
Err Hca::setup_from_enable() {
  Err e;
  if ((e = step(Stage::enable_hca, enable_hca())) != Err::ok) return e;
  if ((e = step(Stage::issi, set_issi())) != Err::ok) return e;
  if ((e = step(Stage::boot_pages, pages_.satisfy_startup(p::query_pages_op_mod::BOOT_PAGES, &last_cmd_))) != Err::ok)
    return e;
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
    keep(Stage::uar, dealloc_uar_index(eq_uar_->index));
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
  // Fatal when the firmware asks for recovery (rfr, Linux's fatal sensor) or reports a critical
  // syndrome (severity <= CRIT): either way it will not come back without a reset.
  uint32_t synd = health(p::health_buffer::synd);
  if (synd && (health(p::health_buffer::rfr) || health(p::health_buffer::severity) <= kSeverityCrit)) {
    enter_fatal(FatalReason::fw_syndrome, uint8_t(synd));
    return true;
  }
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
  return hal_->read32(0) == 0xffffffffu;
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
