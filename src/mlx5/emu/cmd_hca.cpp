// Life-cycle commands: ENABLE/DISABLE_HCA, ISSI, HCA capabilities, INIT/TEARDOWN_HCA, NOP,
// QUERY_ADAPTER. The sequence a driver must follow is Linux main.c's mlx5_function_setup and
// rdma-core mlx5_vfio.c's mlx5_vfio_setup_function: enable, ISSI, boot pages, caps, init pages, init.
#include <string.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
using S = prm::cmd_status::Value;
namespace cap = prm::cmd_hca_cap;
constexpr uint32_t kSupportedIssi = 0x3;  // ISSI 0 and 1
}  // namespace

// Capabilities of a ConnectX-4 Lx as this model implements them (the limits are the model's; the
// feature bits say what it does).
void Hca::build_caps() {
  memset(max_caps_, 0, sizeof max_caps_);
  cap::view c(max_caps_);
  // Queue and object limits stay within what the transport takes (rc/limits.h).
  c.set(cap::log_max_srq_sz, 14).set(cap::log_max_qp_sz, 14).set(cap::log_max_qp, 12).set(cap::log_max_srq, 14);
  c.set(cap::log_max_cq_sz, 22).set(cap::log_max_cq, 14).set(cap::log_max_eq_sz, 22).set(cap::log_max_mkey, 20);
  c.set(cap::log_max_eq, 5).set(cap::max_indirection, 0).set(cap::log_max_mrw_sz, 64);
  c.set(cap::log_max_klm_list_size, 0).set(cap::log_max_ra_req_qp, 4).set(cap::log_max_ra_res_qp, 4);
  c.set(cap::release_all_pages, 0).set(cap::force_teardown, 1).set(cap::fast_teardown, 0);
  c.set(cap::gid_table_size, 256).set(cap::pkey_table_size, 0).set(cap::local_ca_ack_delay, 16);
  c.set(cap::port_type, prm::kPortTypeEth).set(cap::num_ports, 1).set(cap::log_max_msg, 30);
  c.set(cap::max_tc, 8).set(cap::stat_rate_support, 0).set(cap::cqe_version, 1).set(cap::cmdif_checksum, 3);
  c.set(cap::roce, 1).set(cap::atomic, 1).set(cap::cq_oi, 1).set(cap::cq_resize, 1).set(cap::cq_moderation, 1);
  c.set(cap::ud, 1).set(cap::uc, 1).set(cap::rc, 1).set(cap::xrc, 0).set(cap::dct, 0);
  c.set(cap::uar_4k, 1).set(cap::uar_sz, 13).set(cap::log_pg_sz, 12).set(cap::bf, 1).set(cap::log_bf_reg_size, 9);
  c.set(cap::driver_version, 0).set(cap::cache_line_128byte, 1);
  c.set(cap::max_wqe_sz_sq, 1024).set(cap::max_wqe_sz_rq, 512).set(cap::log_max_transport_domain, 20);
  c.set(cap::log_max_pd, 20).set(cap::log_max_xrcd, 0).set(cap::log_max_rq, 20).set(cap::log_max_sq, 20);
  c.set(cap::log_max_rmp, 16).set(cap::log_max_wq_sz, 16).set(cap::log_uar_page_sz, cfg_.max_log_uar_page_sz);
  c.set(cap::device_frequency_khz, 156250).set(cap::num_of_uars_per_page, 1);
  // DEVX UMEM registrations with uid 0 (rdma-core's mlx5_vfio refuses a device without it).
  c.set(cap::umem_uid_0, 1).set(cap::log_max_umem, 16);
  memcpy(cur_caps_, max_caps_, sizeof cur_caps_);
  prm::set(cur_caps_, cap::cmdif_checksum, cfg_.cmd_signatures ? 3 : 0);
  prm::set(cur_caps_, cap::log_uar_page_sz, 0);  // 4 KiB UAR pages until a driver asks for more
  memset(roce_caps_, 0, sizeof roce_caps_);
  prm::roce_cap::view r(roce_caps_);
  r.set(prm::roce_cap::roce_version, 0x1 | 0x4);  // RoCE v1 and v2 (mlx5_ifc MLX5_ROCE_VERSION_*_CAP)
  r.set(prm::roce_cap::l3_type, (1 << 1) | (1 << 2));  // IPv4 and IPv6 (MLX5_ROCE_L3_TYPE_*_CAP)
  r.set(prm::roce_cap::r_roce_dest_udp_port, 4791);
  r.set(prm::roce_cap::r_roce_min_src_udp_port, 0xc000).set(prm::roce_cap::r_roce_max_src_udp_port, 0xffff);
  r.set(prm::roce_cap::roce_address_table_size, 256);
}

CmdStatus Hca::enable_hca(Cmd& c) {
  prm::enable_hca_in::cview in(c.in);
  if (in.get(prm::enable_hca_in::function_id) != 0 || in.get(prm::enable_hca_in::embedded_cpu_function))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FUNCTION_ID);
  if (state_ >= FwState::kEnabled) return fail(S::BAD_SYS_STATE_ERR, synd::HCA_ALREADY_ENABLED);
  state_ = FwState::kEnabled;
  issi_ = 0;
  build_caps();
  boot_pages_done_ = init_pages_done_ = false;
  regular_pages_owed_ = 0;
  return {};
}

CmdStatus Hca::disable_hca(Cmd& c) {
  prm::disable_hca_in::cview in(c.in);
  if (in.get(prm::disable_hca_in::function_id) != 0 || in.get(prm::disable_hca_in::embedded_cpu_function))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FUNCTION_ID);
  if (state_ == FwState::kInitialized) return fail(S::BAD_SYS_STATE_ERR, synd::HCA_ALREADY_INITIALIZED);
  // Pages still held are forgotten: the driver may free them now.
  for (auto& [iova, p] : pages_) returned_pages_.insert(iova);
  pages_.clear();
  icm_slots_.clear();
  stats_.fw_pages_held = 0;
  state_ = FwState::kReady;
  return {};
}

CmdStatus Hca::query_issi(Cmd& c) {
  prm::query_issi_out::view out(c.out);
  out.set(prm::query_issi_out::current_issi, issi_);
  out.set(prm::query_issi_out::supported_issi_dw0, kSupportedIssi);
  return {};
}

CmdStatus Hca::set_issi(Cmd& c) {
  uint32_t issi = uint32_t(prm::set_issi_in::cview(c.in).get(prm::set_issi_in::current_issi));
  if (issi >= 32 || !(kSupportedIssi & (1u << issi))) return fail(S::BAD_PARAM_ERR, synd::BAD_ISSI);
  issi_ = uint16_t(issi);
  return {};
}

CmdStatus Hca::query_hca_cap(Cmd& c) {
  uint8_t type = uint8_t(c.op_mod >> 1), mode = c.op_mod & 1;
  prm::query_hca_cap_in::cview in(c.in);
  if (in.get(prm::query_hca_cap_in::other_function) || in.get(prm::query_hca_cap_in::function_id))
    return fail(S::BAD_PARAM_ERR, synd::BAD_FUNCTION_ID);
  uint8_t* dst = prm::query_hca_cap_out::view(c.out).bytes(prm::query_hca_cap_out::capability);
  if (type == prm::cap_type::GENERAL_DEVICE)
    memcpy(dst, mode == prm::cap_mode::GET_CUR ? cur_caps_ : max_caps_, sizeof cur_caps_);
  else if (type == prm::cap_type::ROCE)
    memcpy(dst, roce_caps_, sizeof roce_caps_);
  else
    return fail(S::BAD_PARAM_ERR, synd::BAD_CAP_TYPE);
  return {};
}

CmdStatus Hca::set_hca_cap(Cmd& c) {
  if (state_ == FwState::kInitialized) return fail(S::BAD_SYS_STATE_ERR, synd::HCA_ALREADY_INITIALIZED);
  if (c.op_mod & 1) return fail(S::BAD_PARAM_ERR, synd::BAD_OP_MOD);
  uint8_t type = uint8_t(c.op_mod >> 1);
  const uint8_t* src = prm::set_hca_cap_in::cview(c.in).bytes(prm::set_hca_cap_in::capability);
  if (type == prm::cap_type::ROCE) return {};  // nothing in the RoCE caps is settable on this device
  if (type != prm::cap_type::GENERAL_DEVICE) return fail(S::BAD_PARAM_ERR, synd::BAD_CAP_TYPE);
  // The fields a driver may lower (Linux main.c handle_hca_cap); other fields are ignored as
  // firmware ignores them. A value above the maximum is refused.
  static const prm::Field* const kSettable[] = {&cap::log_max_qp,
                                                &cap::pkey_table_size,
                                                &cap::cmdif_checksum,
                                                &cap::cache_line_128byte,
                                                &cap::log_uar_page_sz,
                                                &cap::uar_4k,
                                                &cap::release_all_pages,
                                                &cap::driver_version,
                                                &cap::roce,
                                                &cap::atomic,
                                                &cap::num_of_uars_per_page};
  for (const prm::Field* f : kSettable)
    if (prm::get(src, *f) > prm::get(max_caps_, *f)) return fail(S::BAD_PARAM_ERR, synd::CAP_ABOVE_MAX);
  for (const prm::Field* f : kSettable) prm::set(cur_caps_, *f, prm::get(src, *f));
  return {};
}

CmdStatus Hca::init_hca(Cmd& c) {
  if (state_ == FwState::kInitialized) return fail(S::BAD_SYS_STATE_ERR, synd::HCA_ALREADY_INITIALIZED);
  if (!init_pages_done_) return fail(S::BAD_SYS_STATE_ERR, synd::INIT_PAGES_MISSING);
  state_ = FwState::kInitialized;
  if (torn_down_since_flr_ && faults_.fw_14_22_roce_en_lost) roce_en_ = false, roce_en_stuck_ = true;
  regular_pages_owed_ += int32_t(cfg_.regular_pages);
  page_request(regular_pages_owed_);
  return {};
}

CmdStatus Hca::teardown_hca(Cmd& c) {
  uint32_t profile = uint32_t(prm::teardown_hca_in::cview(c.in).get(prm::teardown_hca_in::profile));
  if (profile != prm::teardown_profile::GRACEFUL_CLOSE && profile != prm::teardown_profile::FORCE_CLOSE)
    return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  drop_objects();
  state_ = FwState::kEnabled;
  torn_down_since_flr_ = true;
  regular_pages_owed_ = 0;
  for (auto& [iova, p] : pages_) p.used = false;
  icm_slots_.clear();
  init_pages_done_ = pages_.size() >= cfg_.boot_pages + cfg_.init_pages;
  return {};
}

CmdStatus Hca::nop(Cmd& c) { return {}; }

CmdStatus Hca::query_adapter(Cmd& c) {
  auto b = prm::query_adapter_out::view(c.out).at(prm::query_adapter_out::query_adapter_struct);
  b.set(prm::query_adapter_param_block::ieee_vendor_id, 0x0002c9);  // Mellanox OUI
  b.set(prm::query_adapter_param_block::vsd_vendor_id, kPciVendorMellanox);
  static const char kPsid[16] = "MT_EMU0000001";
  memcpy(b.bytes(prm::query_adapter_param_block::vsd_contd_psid), kPsid, sizeof kPsid);
  return {};
}

}  // namespace melon::mlx5::emu
