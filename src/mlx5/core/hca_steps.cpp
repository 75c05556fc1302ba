// The bring-up steps, one function each: build the command, check the answer (rdma-core
// mlx5_vfio.c and Linux main.c do the same steps).
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
constexpr uint32_t kFwPollUs = 1000;
constexpr uint16_t kIssi = 1;  // the interface version this driver speaks (PRM: ISSI 1)
}  // namespace

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

// The host's byte order, once, after the boot pages (Linux main.c set_hca_ctrl, for a PF; rdma-core
// mlx5_vfio_set_hca_ctrl): HOST_ENDIANNESS.he = 0, a little-endian host (device.h
// MLX5_SET_HOST_ENDIANNESS). rdma-core's VFIO driver taught us this one (docs/emulator.md).
Err Hca::set_host_endianness() {
  uint8_t in[p::access_register_in::size_bytes + p::register_host_endianness::size_bytes] = {};
  uint8_t out[p::access_register_out::size_bytes + p::register_host_endianness::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ACCESS_REG, p::access_reg_op_mod::WRITE);
  p::access_register_in::view(in).set(p::access_register_in::register_id, p::reg_id::HOST_ENDIANNESS);
  p::register_host_endianness::view(p::access_register_in::view(in).elem(p::access_register_in::register_data, 0))
      .set(p::register_host_endianness::he, 0);
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
  // largest it has, and alloc_uar takes every UAR of a host page, so a mapping holds one owner's.
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
  if (caps_.log_uar_page_sz > kMaxLogUarPage) {
    MLX_ERR(*hal_, pci, "UAR page size 2^%u x 4 KiB is not believable", caps_.log_uar_page_sz);
    return Err::unsupported;
  }
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
}  // namespace melon::mlx5::core
