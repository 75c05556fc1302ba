// Small resources (UAR, PD, transport domain, Q counters) and the port side: the RoCE address (GID)
// table, the NIC vport context (roce_en, MTU, MAC), and the port registers through ACCESS_REGISTER
// (PAOS, PTYS, PMTU, PPCNT). Linux vport.c, port.c and rdma-core mlx5_vfio.c are the drivers of these.
#include <string.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
using S = prm::cmd_status::Value;
constexpr uint32_t kMaxUars = 1024, kMaxPds = 1u << 20, kMaxTds = 1u << 20, kMaxQCounters = 64;
// PTYS Ethernet protocol bits of a 10/25 GbE ConnectX-4 Lx (mlx5 port.c MLX5E_10GBASE_SR = bit 14,
// MLX5E_25GBASE_SR = bit 29... the model reports 25GBASE-SR as the operating protocol).
constexpr uint32_t kEth10GbaseSr = 1u << 14, kEth25GbaseSr = 1u << 29;

// The lowest free number >= first in `used` below `limit`; 0 when full.
template <class Set>
uint32_t lowest_free(const Set& used, uint32_t first, uint32_t limit) {
  for (uint32_t n = first; n < limit; ++n)
    if (!used.count(n)) return n;
  return 0;
}
}  // namespace

CmdStatus Hca::alloc_uar(Cmd& c) {
  uint32_t n = lowest_free(uars_, kFirstUarIndex, kFirstUarIndex + kMaxUars);
  if (!n) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  uars_.insert(n);
  prm::alloc_uar_out::view(c.out).set(prm::alloc_uar_out::uar, n);
  return {};
}

CmdStatus Hca::dealloc_uar(Cmd& c) {
  uint32_t n = uint32_t(prm::dealloc_uar_in::cview(c.in).get(prm::dealloc_uar_in::uar));
  if (!uars_.count(n)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_UAR);
  for (auto& [k, eq] : eqs_)
    if (eq.uar == n) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  for (auto& [k, cq] : cqs_)
    if (cq.uar == n) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  for (auto& [k, qp] : qps_)
    if (qp.uar == n) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  uars_.erase(n);
  return {};
}

CmdStatus Hca::alloc_pd(Cmd& c) {
  uint32_t n = lowest_free(pds_, 1, kMaxPds);
  if (!n) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  pds_.insert(n);
  prm::alloc_pd_out::view(c.out).set(prm::alloc_pd_out::pd, n);
  return {};
}

CmdStatus Hca::dealloc_pd(Cmd& c) {
  uint32_t n = uint32_t(prm::dealloc_pd_in::cview(c.in).get(prm::dealloc_pd_in::pd));
  if (!pds_.count(n)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_PD);
  for (auto& [k, mk] : mkeys_)
    if (mk.pd == n) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  for (auto& [k, qp] : qps_)
    if (qp.pd == n) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  for (auto& [k, srq] : srqs_)
    if (srq.pd == n) return fail(S::BAD_RES_STATE_ERR, synd::RESOURCE_IN_USE);
  pds_.erase(n);
  return {};
}

CmdStatus Hca::alloc_td(Cmd& c) {
  uint32_t n = lowest_free(tds_, 1, kMaxTds);
  if (!n) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  tds_.insert(n);
  prm::alloc_transport_domain_out::view(c.out).set(prm::alloc_transport_domain_out::transport_domain, n);
  return {};
}

CmdStatus Hca::dealloc_td(Cmd& c) {
  uint32_t n =
      uint32_t(prm::dealloc_transport_domain_in::cview(c.in).get(prm::dealloc_transport_domain_in::transport_domain));
  if (!tds_.erase(n)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_TD);
  return {};
}

CmdStatus Hca::alloc_q_counter(Cmd& c) {
  uint32_t n = lowest_free(qcounters_, 1, kMaxQCounters);
  if (!n) return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  qcounters_[n].id = n;
  prm::alloc_q_counter_out::view(c.out).set(prm::alloc_q_counter_out::counter_set_id, n);
  return {};
}

CmdStatus Hca::dealloc_q_counter(Cmd& c) {
  uint32_t n = uint32_t(prm::dealloc_q_counter_in::cview(c.in).get(prm::dealloc_q_counter_in::counter_set_id));
  if (!qcounters_.erase(n)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_Q_COUNTER);
  for (auto& [k, qp] : qps_)
    if (qp.counter_set == n) qp.counter_set = 0;
  return {};
}

CmdStatus Hca::query_q_counter(Cmd& c) {
  prm::query_q_counter_in::cview in(c.in);
  auto it = qcounters_.find(uint32_t(in.get(prm::query_q_counter_in::counter_set_id)));
  if (it == qcounters_.end()) return fail(S::BAD_RES_ERR, synd::UNKNOWN_Q_COUNTER);
  QCounter& q = it->second;
  // The transport's per-QP counters, summed over the QPs bound to this set, less what was cleared.
  QCounter now{q.id};
  for (auto& [n, qp] : qps_) {
    if (qp.counter_set != q.id) continue;
    const rc::QpCounters* k = engine_->counters(n);
    if (!k) continue;
    now.out_of_buffer += uint32_t(k->rnr_naks_sent);  // no receive WQE: an RNR NAK went out
    now.out_of_sequence += uint32_t(k->seq_naks_sent);
    now.duplicate_request += uint32_t(k->duplicates);
    now.packet_seq_err += uint32_t(k->seq_naks_received);
    now.local_ack_timeout_err += uint32_t(k->timeouts);
    now.rnr_nak_retry_err += uint32_t(k->rnr_naks_received);
  }
  namespace o = prm::query_q_counter_out;
  o::view(c.out)
      .set(o::out_of_buffer, now.out_of_buffer - q.out_of_buffer)
      .set(o::out_of_sequence, now.out_of_sequence - q.out_of_sequence)
      .set(o::duplicate_request, now.duplicate_request - q.duplicate_request)
      .set(o::rnr_nak_retry_err, now.rnr_nak_retry_err - q.rnr_nak_retry_err)
      .set(o::packet_seq_err, now.packet_seq_err - q.packet_seq_err)
      .set(o::local_ack_timeout_err, now.local_ack_timeout_err - q.local_ack_timeout_err);
  if (in.get(prm::query_q_counter_in::clear)) q = now;  // the baseline the next query subtracts
  return {};
}

// ---- GID table ----

CmdStatus Hca::set_roce_address(Cmd& c) {
  prm::set_roce_address_in::cview in(c.in);
  uint32_t idx = uint32_t(in.get(prm::set_roce_address_in::roce_address_index));
  uint32_t port = uint32_t(in.get(prm::set_roce_address_in::vhca_port_num));
  if (idx >= prm::get(roce_caps_, prm::roce_cap::roce_address_table_size))
    return fail(S::BAD_PARAM_ERR, synd::BAD_GID_INDEX);
  if (port > 1) return fail(S::BAD_PARAM_ERR, synd::BAD_PORT);
  auto a = in.at(prm::set_roce_address_in::roce_address);
  uint32_t version = uint32_t(a.get(prm::roce_addr_layout::roce_version));
  uint32_t l3 = uint32_t(a.get(prm::roce_addr_layout::roce_l3_type));
  if ((version != prm::roce_version::VERSION_1 && version != prm::roce_version::VERSION_2) ||
      (l3 != prm::roce_l3_type::IPV4 && l3 != prm::roce_l3_type::IPV6))
    return fail(S::BAD_PARAM_ERR, synd::BAD_ROCE_ADDRESS);
  GidEntry& g = gids_[idx];
  memcpy(g.addr, a.data(), sizeof g.addr);
  // An all-zero address clears the entry (Linux deletes a GID this way).
  static const uint8_t kZero[16] = {};
  g.valid = memcmp(a.bytes(prm::roce_addr_layout::source_l3_address), kZero, 16) != 0;
  return {};
}

CmdStatus Hca::query_roce_address(Cmd& c) {
  prm::query_roce_address_in::cview in(c.in);
  uint32_t idx = uint32_t(in.get(prm::query_roce_address_in::roce_address_index));
  if (idx >= prm::get(roce_caps_, prm::roce_cap::roce_address_table_size))
    return fail(S::BAD_PARAM_ERR, synd::BAD_GID_INDEX);
  if (in.get(prm::query_roce_address_in::vhca_port_num) > 1) return fail(S::BAD_PARAM_ERR, synd::BAD_PORT);
  uint8_t* dst = prm::query_roce_address_out::view(c.out).at(prm::query_roce_address_out::roce_address).data();
  if (gids_[idx].valid) memcpy(dst, gids_[idx].addr, sizeof gids_[idx].addr);
  return {};
}

// ---- vport ----

CmdStatus Hca::query_vport_state(Cmd& c) {
  prm::query_vport_state_in::cview in(c.in);
  if (in.get(prm::query_vport_state_in::other_vport) || in.get(prm::query_vport_state_in::vport_number))
    return fail(S::BAD_PARAM_ERR, synd::BAD_VPORT);
  bool up = port_oper_ == prm::kPortUp && ports_.wire;
  prm::query_vport_state_out::view(c.out)
      .set(prm::query_vport_state_out::admin_state, port_admin_ == prm::kPortUp ? 1 : 0)
      .set(prm::query_vport_state_out::state, up ? prm::vport_state::UP : prm::vport_state::DOWN);
  return {};
}

CmdStatus Hca::query_nic_vport_context(Cmd& c) {
  prm::query_nic_vport_context_in::cview in(c.in);
  if (in.get(prm::query_nic_vport_context_in::other_vport) || in.get(prm::query_nic_vport_context_in::vport_number))
    return fail(S::BAD_PARAM_ERR, synd::BAD_VPORT);
  auto v = prm::query_nic_vport_context_out::view(c.out).at(prm::query_nic_vport_context_out::nic_vport_context);
  namespace n = prm::nic_vport_context;
  v.set(n::roce_en, roce_en_).set(n::mtu, vport_mtu_ ? vport_mtu_ : cfg_.port_mtu + 18);
  v.set(n::system_image_guid, cfg_.node_guid).set(n::port_guid, cfg_.node_guid).set(n::node_guid, cfg_.node_guid);
  uint8_t perm[8] = {0, 0};
  memcpy(perm + 2, cfg_.mac, 6);
  memcpy(v.bytes(n::permanent_address), perm, 8);
  return {};
}

CmdStatus Hca::modify_nic_vport_context(Cmd& c) {
  prm::modify_nic_vport_context_in::cview in(c.in);
  if (in.get(prm::modify_nic_vport_context_in::other_vport) || in.get(prm::modify_nic_vport_context_in::vport_number))
    return fail(S::BAD_PARAM_ERR, synd::BAD_VPORT);
  auto sel = in.at(prm::modify_nic_vport_context_in::field_select);
  auto v = in.at(prm::modify_nic_vport_context_in::nic_vport_context);
  namespace fs = prm::modify_nic_vport_field_select;
  uint32_t known = 0;
  for (const prm::Field* f : {&fs::roce_en, &fs::mtu}) known |= uint32_t(1) << (31 - (f->bit_off % 32));
  uint32_t bits = uint32_t(prm::get_bits(sel.data(), 0, 32));
  if (bits & ~known) return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);  // other fields: not on this model
  if (sel.get(fs::roce_en)) roce_en_ = v.get(prm::nic_vport_context::roce_en) && !roce_en_stuck_;
  if (sel.get(fs::mtu)) {
    uint32_t mtu = uint32_t(v.get(prm::nic_vport_context::mtu));
    if (mtu < 68 || mtu > cfg_.port_mtu + 18 + 256) return fail(S::BAD_PARAM_ERR, synd::BAD_MTU);
    vport_mtu_ = uint16_t(mtu);
  }
  return {};
}

// ---- UMEM ----

CmdStatus Hca::create_umem(Cmd& c) {
  prm::create_umem_in::cview in(c.in);
  namespace um = prm::umem;
  const uint8_t* u = c.in + prm::create_umem_in::umem.byte_off();
  Umem x;
  x.log_page_size = uint8_t(prm::get(u, um::log_page_size) + 12);
  x.page_offset = uint32_t(prm::get(u, um::page_offset));
  uint64_t n = prm::get(u, um::num_of_mtt);
  uint64_t room = (c.in_len - prm::create_umem_in::size_bytes) / prm::kMttBytes;
  if (prm::get(u, um::ats)) return fail(S::BAD_PARAM_ERR, synd::BAD_FIELD_SELECT);
  if (n == 0 || n > room || n > (1u << 20)) return fail(S::BAD_PARAM_ERR, synd::MTT_TOO_SHORT);
  if (x.log_page_size > 30 || x.page_offset >= (1ull << x.log_page_size))
    return fail(S::BAD_PARAM_ERR, synd::BAD_PAGE_SIZE);
  if (umems_.size() >= (1u << prm::get(cur_caps_, prm::cmd_hca_cap::log_max_umem)))
    return fail(S::NO_RES_ERR, synd::NO_FREE_INDEX);
  const uint8_t* mtt = u + um::size_bytes;
  uint64_t pg = 1ull << x.log_page_size;
  x.writable = true;
  x.mtt.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t* e = mtt + i * prm::kMttBytes;
    uint64_t pa = prm::mtt_pa(e);
    if (pa % pg) return fail(S::BAD_PARAM_ERR, synd::PAGE_NOT_ALIGNED);
    if (!prm::get(e, prm::mtt::rd_en)) return fail(S::BAD_PARAM_ERR, synd::BAD_UMEM);
    if (!prm::get(e, prm::mtt::wr_en)) x.writable = false;
    x.mtt[i] = pa;
  }
  uint32_t id = 1;
  while (umems_.count(id)) ++id;
  x.id = id;
  umems_[id] = std::move(x);
  prm::create_umem_out::view(c.out).set(prm::create_umem_out::umem_id, id);
  return {};
}

CmdStatus Hca::destroy_umem(Cmd& c) {
  uint32_t id = uint32_t(prm::destroy_umem_in::cview(c.in).get(prm::destroy_umem_in::umem_id));
  if (!umems_.count(id)) return fail(S::BAD_RES_ERR, synd::UNKNOWN_UMEM);
  umems_.erase(id);
  return {};
}

// ---- ACCESS_REGISTER ----

CmdStatus Hca::access_register(Cmd& c) {
  prm::access_register_in::cview in(c.in);
  uint32_t id = uint32_t(in.get(prm::access_register_in::register_id));
  bool read = c.op_mod == prm::access_reg_op_mod::READ;
  const uint8_t* rin = in.elem(prm::access_register_in::register_data, 0);
  uint32_t rin_len = c.in_len - prm::access_register_in::size_bytes;
  uint8_t* rout = prm::access_register_out::view(c.out).elem(prm::access_register_out::register_data, 0);
  uint32_t rout_len = c.out_len - prm::access_register_out::size_bytes;
  auto need = [&](uint32_t bytes) { return rin_len >= bytes && (!read || rout_len >= bytes); };
  switch (id) {
    case prm::reg_id::PAOS: {
      namespace r = prm::paos_reg;
      if (!need(r::size_bytes)) return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER);
      if (r::cview(rin).get(r::local_port) != 1) return fail(S::BAD_PARAM_ERR, synd::BAD_PORT);
      if (!read) {
        if (r::cview(rin).get(r::ase)) {
          uint8_t admin = uint8_t(r::cview(rin).get(r::admin_status));
          if (admin != prm::kPortUp && admin != prm::kPortDown) return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER_VALUE);
          uint8_t was = port_oper_;
          port_admin_ = port_oper_ = admin;
          if (was != port_oper_) {
            uint8_t data[28] = {};
            prm::set(data, prm::port_state_change_event::port_num, 1);
            post_async(prm::event_type::PORT_CHANGE,
                       port_oper_ == prm::kPortUp ? prm::port_change_subtype::ACTIVE : prm::port_change_subtype::DOWN,
                       data);
          }
        }
        return {};
      }
      r::view(rout).set(r::local_port, 1).set(r::admin_status, port_admin_).set(r::oper_status, port_oper_);
      return {};
    }
    case prm::reg_id::PTYS: {
      namespace r = prm::ptys_reg;
      if (!need(r::size_bytes)) return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER);
      if (r::cview(rin).get(r::local_port) != 1) return fail(S::BAD_PARAM_ERR, synd::BAD_PORT);
      if (!(r::cview(rin).get(r::proto_mask) & prm::kPtysEth)) return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER_VALUE);
      if (!read) return {};  // speed changes are accepted and not modelled
      r::view(rout)
          .set(r::local_port, 1)
          .set(r::proto_mask, prm::kPtysEth)
          .set(r::eth_proto_capability, kEth10GbaseSr | kEth25GbaseSr)
          .set(r::eth_proto_admin, kEth10GbaseSr | kEth25GbaseSr)
          .set(r::eth_proto_oper, port_oper_ == prm::kPortUp ? kEth25GbaseSr : 0);
      return {};
    }
    case prm::reg_id::PMTU: {
      namespace r = prm::pmtu_reg;
      if (!need(r::size_bytes)) return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER);
      if (r::cview(rin).get(r::local_port) != 1) return fail(S::BAD_PARAM_ERR, synd::BAD_PORT);
      uint32_t max = cfg_.port_mtu + 18 + 256;  // Ethernet MTU incl. L2 header room, as firmware reports
      if (!read) {
        uint32_t admin = uint32_t(r::cview(rin).get(r::admin_mtu));
        if (admin < 68 || admin > max) return fail(S::BAD_PARAM_ERR, synd::BAD_MTU);
        pmtu_admin_ = uint16_t(admin);
        return {};
      }
      uint32_t admin = pmtu_admin_ ? pmtu_admin_ : max;
      r::view(rout).set(r::local_port, 1).set(r::max_mtu, max).set(r::admin_mtu, admin).set(r::oper_mtu, admin);
      return {};
    }
    case prm::reg_id::PPCNT: {
      namespace r = prm::ppcnt_reg;
      if (!need(r::size_bytes)) return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER);
      if (r::cview(rin).get(r::local_port) != 1) return fail(S::BAD_PARAM_ERR, synd::BAD_PORT);
      if (r::cview(rin).get(r::grp) != prm::kPpcntIeee8023Group)
        return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER_VALUE);
      if (!read) return fail(S::BAD_PARAM_ERR, synd::BAD_OP_MOD);
      r::view out(rout);
      out.set(r::local_port, 1).set(r::grp, prm::kPpcntIeee8023Group);
      namespace g = prm::eth_802_3_cntrs_grp_data_layout;
      uint8_t* cs = out.bytes(r::counter_set);
      prm::set(cs, g::a_frames_transmitted_ok_high, stats_.frames_tx >> 32);
      prm::set(cs, g::a_frames_transmitted_ok_low, stats_.frames_tx & 0xffffffffu);
      prm::set(cs, g::a_frames_received_ok_high, stats_.frames_rx >> 32);
      prm::set(cs, g::a_frames_received_ok_low, stats_.frames_rx & 0xffffffffu);
      return {};
    }
    case prm::reg_id::HOST_ENDIANNESS: {
      // Written by Linux's set_hca_ctrl and rdma-core's mlx5_vfio_set_hca_ctrl after the boot
      // pages; this model's byte order is fixed (little-endian host), so it keeps the value only.
      namespace r = prm::register_host_endianness;
      if (!need(r::size_bytes)) return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER);
      if (!read) {
        host_endianness_ = uint8_t(r::cview(rin).get(r::he));
        return {};
      }
      r::view(rout).set(r::he, host_endianness_);
      return {};
    }
    default: return fail(S::BAD_PARAM_ERR, synd::BAD_REGISTER);
  }
}

}  // namespace melon::mlx5::emu
