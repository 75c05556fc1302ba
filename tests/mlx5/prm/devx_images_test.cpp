// Byte-exact command images: ours (src/mlx5/prm typed views) against a second encoder, rdma-core's
// DEVX_SET over the kernel's mlx5_ifc.h structs (oracle/devx_images.c, run at build time).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mlx5/prm/prm.h"

namespace prm = melon::mlx5::prm;
using Bytes = std::vector<uint8_t>;

namespace {

const std::map<std::string, std::string>& reference() {
  static const std::map<std::string, std::string> images = [] {
    std::map<std::string, std::string> m;
    std::ifstream in(MELON_DEVX_IMAGES);
    std::string name, hex;
    while (in >> name >> hex) m[name] = hex;
    return m;
  }();
  return images;
}

std::string hex(const Bytes& b) {
  std::string s;
  char t[3];
  for (uint8_t c : b) {
    std::snprintf(t, sizeof t, "%02x", c);
    s += t;
  }
  return s;
}

void expect_image(const char* name, const Bytes& ours) {
  auto it = reference().find(name);
  ASSERT_NE(it, reference().end()) << "no reference image " << name << " in " << MELON_DEVX_IMAGES;
  EXPECT_EQ(hex(ours), it->second) << name;
}

const uint8_t kGidRemote[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 2};
const uint8_t kGidLocal[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 1};

TEST(PrmDevxImages, CreateMkeyWithTwoMtts) {
  using namespace prm::create_mkey_in;
  Bytes in(size_bytes + 2 * prm::kMttBytes);
  view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::CREATE_MKEY, 0);
  v.set(translations_octword_actual_size, 1);
  prm::mkc::view m = v.at(memory_key_mkey_entry);
  m.set(prm::mkc::a, 1).set(prm::mkc::rw, 1).set(prm::mkc::rr, 1).set(prm::mkc::lw, 1).set(prm::mkc::lr, 1);
  prm::mkc_set_access_mode(m, prm::mkc_access_mode::MTT);
  m.set(prm::mkc::qpn, 0xffffff)
      .set(prm::mkc::mkey_7_0, 0x42)
      .set(prm::mkc::pd, 0x1234)
      .set(prm::mkc::start_addr, 0x7f0000201000ull)
      .set(prm::mkc::len, 0x2000)
      .set(prm::mkc::translations_octword_size, 1)
      .set(prm::mkc::log_page_size, 12);
  prm::mtt_set(v.elem(klm_pas_mtt, 0), 0x123456000ull, true, true);
  prm::mtt_set(v.elem(klm_pas_mtt, 0) + prm::kMttBytes, 0x123457000ull, true, true);
  expect_image("create_mkey", in);
  // The bytes of the oracle program (tests/mlx5/prm/oracle/devx_images.c): LR/LW/RR/RW + A, MTT, qpn 0xffffff, key 0x42, pd 0x1234.
  EXPECT_EQ(prm::mkc_get_access_mode(prm::mkc::cview(m)), prm::mkc_access_mode::MTT);
  EXPECT_EQ(prm::mtt_pa(v.elem(klm_pas_mtt, 0)), 0x123456000ull);
}

TEST(PrmDevxImages, CreateRcQp) {
  Bytes in(prm::create_qp_in::size_bytes + 8);
  prm::create_qp_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::CREATE_QP, 0);
  v.at(prm::create_qp_in::qpc)
      .set(prm::qpc::st, prm::qpc_st::RC)
      .set(prm::qpc::pm_state, prm::qpc_pm_state::MIGRATED)
      .set(prm::qpc::pd, 0x1234)
      .set(prm::qpc::log_msg_max, 30)
      .set(prm::qpc::log_rq_size, 8)
      .set(prm::qpc::log_rq_stride, 2)
      .set(prm::qpc::log_sq_size, 8)
      .set(prm::qpc::uar_page, 0x21)
      .set(prm::qpc::log_page_size, 0)
      .set(prm::qpc::cqn_snd, 0x401)
      .set(prm::qpc::cqn_rcv, 0x402)
      .set(prm::qpc::dbr_addr, 0x1000f000ull);
  prm::pas_set(v.elem(prm::create_qp_in::pas, 0), 0x20000000ull);
  expect_image("create_qp", in);
}

TEST(PrmDevxImages, Init2RtrOverRoceV2) {
  Bytes in(prm::init2rtr_qp_in::size_bytes);
  prm::init2rtr_qp_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::INIT2RTR_QP, 0);
  v.set(prm::init2rtr_qp_in::qpn, 0x123);
  prm::qpc::view q = v.at(prm::init2rtr_qp_in::qpc);
  q.set(prm::qpc::mtu, prm::qpc_mtu::MTU_1K_BYTES)
      .set(prm::qpc::log_msg_max, 30)
      .set(prm::qpc::remote_qpn, 0x456)
      .set(prm::qpc::next_rcv_psn, 0xabc)
      .set(prm::qpc::min_rnr_nak, 12)
      .set(prm::qpc::log_rra_max, 3);
  prm::ads::view a = q.at(prm::qpc::primary_address_path);
  const uint8_t rmac[6] = {0x02, 0x11, 0x22, 0x33, 0x44, 0x55};
  a.set(prm::ads::src_addr_index, 1)
      .set(prm::ads::hop_limit, 64)
      .set_bytes(prm::ads::rgid_rip, kGidRemote)
      .set(prm::ads::udp_sport, 0xc001)
      .set(prm::ads::vhca_port_num, 1)
      .set(prm::ads::dscp, 26);
  prm::set_mac(a.data(), prm::ads::rmac_47_32, prm::ads::rmac_31_0, rmac);
  expect_image("init2rtr_qp", in);
}

TEST(PrmDevxImages, Rtr2Rts) {
  Bytes in(prm::rtr2rts_qp_in::size_bytes);
  prm::rtr2rts_qp_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::RTR2RTS_QP, 0);
  v.set(prm::rtr2rts_qp_in::qpn, 0x123);
  prm::qpc::view q = v.at(prm::rtr2rts_qp_in::qpc);
  q.set(prm::qpc::log_sra_max, 3)
      .set(prm::qpc::retry_count, 7)
      .set(prm::qpc::rnr_retry, 7)
      .set(prm::qpc::next_send_psn, 0x777);
  q.at(prm::qpc::primary_address_path).set(prm::ads::ack_timeout, 14);
  expect_image("rtr2rts_qp", in);
}

TEST(PrmDevxImages, CreateCq) {
  Bytes in(prm::create_cq_in::size_bytes + 8);
  prm::create_cq_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::CREATE_CQ, 0);
  v.at(prm::create_cq_in::cq_context)
      .set(prm::cqc::cqe_sz, prm::cqc_cqe_sz::BYTES_64)
      .set(prm::cqc::log_cq_size, 10)
      .set(prm::cqc::uar_page, 0x21)
      .set(prm::cqc::c_eqn, 7)
      .set(prm::cqc::log_page_size, 4)
      .set(prm::cqc::cq_period, 16)
      .set(prm::cqc::cq_max_count, 32)
      .set(prm::cqc::dbr_addr, 0x1000e000ull);
  prm::pas_set(v.elem(prm::create_cq_in::pas, 0), 0x30000000ull);
  expect_image("create_cq", in);
}

TEST(PrmDevxImages, CreateAsyncEq) {
  Bytes in(prm::create_eq_in::size_bytes + 8);
  prm::create_eq_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::CREATE_EQ, 0);
  v.at(prm::create_eq_in::eq_context_entry)
      .set(prm::eqc::log_eq_size, 7)
      .set(prm::eqc::uar_page, 1)
      .set(prm::eqc::intr, 0)
      .set(prm::eqc::log_page_size, 0);
  prm::eq_set_event_mask(
      in.data(), prm::event_bit(prm::event_type::CMD) | prm::event_bit(prm::event_type::PAGE_REQUEST) |
                     prm::event_bit(prm::event_type::PORT_CHANGE) | prm::event_bit(prm::event_type::INTERNAL_ERROR));
  prm::pas_set(v.elem(prm::create_eq_in::pas, 0), 0x40000000ull);
  expect_image("create_eq", in);
}

TEST(PrmDevxImages, ManagePagesGivesTwoPages) {
  Bytes in(prm::manage_pages_in::size_bytes + 16);
  prm::manage_pages_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::MANAGE_PAGES, prm::manage_pages_op_mod::ALLOCATION_SUCCESS);
  v.set(prm::manage_pages_in::function_id, 0).set(prm::manage_pages_in::input_num_entries, 2);
  prm::pas_set(v.elem(prm::manage_pages_in::pas, 0), 0x50000000ull);
  prm::pas_set(v.elem(prm::manage_pages_in::pas, 1), 0x50001000ull);
  expect_image("manage_pages", in);
}

TEST(PrmDevxImages, QueryCurrentRoceCaps) {
  Bytes in(prm::query_hca_cap_in::size_bytes);
  prm::cmd_set_header(in.data(), prm::opcode::QUERY_HCA_CAP,
                      prm::cap_op_mod(prm::cap_type::ROCE, prm::cap_mode::GET_CUR));
  expect_image("query_hca_cap", in);
}

TEST(PrmDevxImages, SetRoceV2Ipv4Address) {
  Bytes in(prm::set_roce_address_in::size_bytes);
  prm::set_roce_address_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::SET_ROCE_ADDRESS, 0);
  v.set(prm::set_roce_address_in::roce_address_index, 1).set(prm::set_roce_address_in::vhca_port_num, 1);
  prm::roce_addr_layout::view a = v.at(prm::set_roce_address_in::roce_address);
  const uint8_t mac[6] = {0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee};
  a.set_bytes(prm::roce_addr_layout::source_l3_address, kGidLocal)
      .set(prm::roce_addr_layout::roce_l3_type, prm::roce_l3_type::IPV4)
      .set(prm::roce_addr_layout::roce_version, prm::roce_version::VERSION_2);
  prm::set_mac(a.data(), prm::roce_addr_layout::source_mac_47_32, prm::roce_addr_layout::source_mac_31_0, mac);
  expect_image("set_roce_address", in);
}

TEST(PrmDevxImages, EnableRoceAndSetMtu) {
  Bytes in(prm::modify_nic_vport_context_in::size_bytes);
  prm::modify_nic_vport_context_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::MODIFY_NIC_VPORT_CONTEXT, 0);
  v.at(prm::modify_nic_vport_context_in::field_select)
      .set(prm::modify_nic_vport_field_select::roce_en, 1)
      .set(prm::modify_nic_vport_field_select::mtu, 1);
  v.at(prm::modify_nic_vport_context_in::nic_vport_context)
      .set(prm::nic_vport_context::roce_en, 1)
      .set(prm::nic_vport_context::mtu, 1500 + 14 + 4 + 4);
  expect_image("modify_nic_vport_context", in);
}

TEST(PrmDevxImages, ReadPmtuThroughAccessRegister) {
  Bytes in(prm::access_register_in::size_bytes + prm::pmtu_reg::size_bytes);
  prm::access_register_in::view v(in.data());
  prm::cmd_set_header(in.data(), prm::opcode::ACCESS_REG, prm::access_reg_op_mod::READ);
  v.set(prm::access_register_in::register_id, prm::reg_id::PMTU);
  prm::pmtu_reg::view(v.elem(prm::access_register_in::register_data, 0))
      .set(prm::pmtu_reg::local_port, 1)
      .set(prm::pmtu_reg::admin_mtu, 4200);
  expect_image("access_register_pmtu", in);
}

}  // namespace
