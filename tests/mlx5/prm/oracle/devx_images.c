/* Reference byte images of a handful of commands, built by a second, independent encoder:
 * rdma-core's DEVX_SET/DEVX_SET64/DEVX_ADDR_OF (infiniband/mlx5dv.h) over the kernel's
 * mlx5_ifc.h structs. Prints "<name> <hex bytes>" per image; prm_devx_images_test builds the same
 * commands with src/mlx5/prm and compares. The values here and in the test are the same inputs,
 * written twice on purpose (they are test data, not layout facts). */
#include <infiniband/mlx5dv.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
#define BIT(n) (1UL << (n))
#define BIT_ULL(n) (1ULL << (n))
#include <mlx5_ifc.h>

static void emit(const char* name, const void* p, size_t n) {
  const uint8_t* b = p;
  printf("%s ", name);
  for (size_t i = 0; i < n; ++i) printf("%02x", b[i]);
  printf("\n");
}

static const uint8_t kGidIpv4Remote[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 2};
static const uint8_t kGidIpv4Local[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 1};

static void create_mkey(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(create_mkey_in) + 2 * DEVX_ST_SZ_BYTES(mtt)];
  memset(in, 0, sizeof in);
  DEVX_SET(create_mkey_in, in, opcode, MLX5_CMD_OP_CREATE_MKEY);
  DEVX_SET(create_mkey_in, in, translations_octword_actual_size, 1);
  void* mkc = DEVX_ADDR_OF(create_mkey_in, in, memory_key_mkey_entry);
  DEVX_SET(mkc, mkc, a, 1);
  DEVX_SET(mkc, mkc, rw, 1);
  DEVX_SET(mkc, mkc, rr, 1);
  DEVX_SET(mkc, mkc, lw, 1);
  DEVX_SET(mkc, mkc, lr, 1);
  DEVX_SET(mkc, mkc, access_mode_1_0, MLX5_MKC_ACCESS_MODE_MTT);
  DEVX_SET(mkc, mkc, qpn, 0xffffff);
  DEVX_SET(mkc, mkc, mkey_7_0, 0x42);
  DEVX_SET(mkc, mkc, pd, 0x1234);
  DEVX_SET64(mkc, mkc, start_addr, 0x7f0000201000ull);
  DEVX_SET64(mkc, mkc, len, 0x2000);
  DEVX_SET(mkc, mkc, translations_octword_size, 1);
  DEVX_SET(mkc, mkc, log_page_size, 12);
  uint8_t* mtt = DEVX_ADDR_OF(create_mkey_in, in, klm_pas_mtt);
  DEVX_SET(mtt, mtt, ptag_63_32, 0x1);
  DEVX_SET(mtt, mtt, ptag_31_8, 0x234560);
  DEVX_SET(mtt, mtt, rd_en, 1);
  DEVX_SET(mtt, mtt, wr_en, 1);
  mtt += DEVX_ST_SZ_BYTES(mtt);
  DEVX_SET(mtt, mtt, ptag_63_32, 0x1);
  DEVX_SET(mtt, mtt, ptag_31_8, 0x234570);
  DEVX_SET(mtt, mtt, rd_en, 1);
  DEVX_SET(mtt, mtt, wr_en, 1);
  emit("create_mkey", in, sizeof in);
}

static void create_qp(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(create_qp_in) + 8];
  memset(in, 0, sizeof in);
  DEVX_SET(create_qp_in, in, opcode, MLX5_CMD_OP_CREATE_QP);
  void* qpc = DEVX_ADDR_OF(create_qp_in, in, qpc);
  DEVX_SET(qpc, qpc, st, MLX5_QPC_ST_RC);
  DEVX_SET(qpc, qpc, pm_state, MLX5_QPC_PM_STATE_MIGRATED);
  DEVX_SET(qpc, qpc, pd, 0x1234);
  DEVX_SET(qpc, qpc, log_msg_max, 30);
  DEVX_SET(qpc, qpc, log_rq_size, 8);
  DEVX_SET(qpc, qpc, log_rq_stride, 2);
  DEVX_SET(qpc, qpc, log_sq_size, 8);
  DEVX_SET(qpc, qpc, uar_page, 0x21);
  DEVX_SET(qpc, qpc, log_page_size, 0);
  DEVX_SET(qpc, qpc, cqn_snd, 0x401);
  DEVX_SET(qpc, qpc, cqn_rcv, 0x402);
  DEVX_SET64(qpc, qpc, dbr_addr, 0x1000f000ull);
  _devx_set64(DEVX_ADDR_OF(create_qp_in, in, pas), 0x20000000ull, 0);
  emit("create_qp", in, sizeof in);
}

static void init2rtr_qp(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(init2rtr_qp_in)];
  memset(in, 0, sizeof in);
  DEVX_SET(init2rtr_qp_in, in, opcode, MLX5_CMD_OP_INIT2RTR_QP);
  DEVX_SET(init2rtr_qp_in, in, qpn, 0x123);
  void* qpc = DEVX_ADDR_OF(init2rtr_qp_in, in, qpc);
  DEVX_SET(qpc, qpc, mtu, MLX5_QPC_MTU_1K_BYTES);
  DEVX_SET(qpc, qpc, log_msg_max, 30);
  DEVX_SET(qpc, qpc, remote_qpn, 0x456);
  DEVX_SET(qpc, qpc, next_rcv_psn, 0xabc);
  DEVX_SET(qpc, qpc, min_rnr_nak, 12);
  DEVX_SET(qpc, qpc, log_rra_max, 3);
  void* ads = DEVX_ADDR_OF(qpc, qpc, primary_address_path);
  DEVX_SET(ads, ads, src_addr_index, 1);
  DEVX_SET(ads, ads, hop_limit, 64);
  memcpy(DEVX_ADDR_OF(ads, ads, rgid_rip), kGidIpv4Remote, 16);
  DEVX_SET(ads, ads, rmac_47_32, 0x0211);
  DEVX_SET(ads, ads, rmac_31_0, 0x22334455);
  DEVX_SET(ads, ads, udp_sport, 0xc001);
  DEVX_SET(ads, ads, vhca_port_num, 1);
  DEVX_SET(ads, ads, dscp, 26);
  emit("init2rtr_qp", in, sizeof in);
}

static void rtr2rts_qp(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(rtr2rts_qp_in)];
  memset(in, 0, sizeof in);
  DEVX_SET(rtr2rts_qp_in, in, opcode, MLX5_CMD_OP_RTR2RTS_QP);
  DEVX_SET(rtr2rts_qp_in, in, qpn, 0x123);
  void* qpc = DEVX_ADDR_OF(rtr2rts_qp_in, in, qpc);
  DEVX_SET(qpc, qpc, log_sra_max, 3);
  DEVX_SET(qpc, qpc, retry_count, 7);
  DEVX_SET(qpc, qpc, rnr_retry, 7);
  DEVX_SET(qpc, qpc, next_send_psn, 0x777);
  DEVX_SET(ads, DEVX_ADDR_OF(qpc, qpc, primary_address_path), ack_timeout, 14);
  emit("rtr2rts_qp", in, sizeof in);
}

static void create_cq(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(create_cq_in) + 8];
  memset(in, 0, sizeof in);
  DEVX_SET(create_cq_in, in, opcode, MLX5_CMD_OP_CREATE_CQ);
  void* cqc = DEVX_ADDR_OF(create_cq_in, in, cq_context);
  DEVX_SET(cqc, cqc, cqe_sz, MLX5_CQC_CQE_SZ_64_BYTES);
  DEVX_SET(cqc, cqc, log_cq_size, 10);
  DEVX_SET(cqc, cqc, uar_page, 0x21);
  DEVX_SET(cqc, cqc, c_eqn_or_apu_element, 7);
  DEVX_SET(cqc, cqc, log_page_size, 4);
  DEVX_SET(cqc, cqc, cq_period, 16);
  DEVX_SET(cqc, cqc, cq_max_count, 32);
  DEVX_SET64(cqc, cqc, dbr_addr, 0x1000e000ull);
  _devx_set64(DEVX_ADDR_OF(create_cq_in, in, pas), 0x30000000ull, 0);
  emit("create_cq", in, sizeof in);
}

static void create_eq(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(create_eq_in) + 8];
  memset(in, 0, sizeof in);
  DEVX_SET(create_eq_in, in, opcode, MLX5_CMD_OP_CREATE_EQ);
  void* eqc = DEVX_ADDR_OF(create_eq_in, in, eq_context_entry);
  DEVX_SET(eqc, eqc, log_eq_size, 7);
  DEVX_SET(eqc, eqc, uar_page, 1);
  DEVX_SET(eqc, eqc, intr, 0);
  DEVX_SET(eqc, eqc, log_page_size, 0);
  DEVX_SET64(create_eq_in, in, event_bitmask, (1ull << 0x0a) | (1ull << 0x0b) | (1ull << 0x09) | (1ull << 0x08));
  _devx_set64(DEVX_ADDR_OF(create_eq_in, in, pas), 0x40000000ull, 0);
  emit("create_eq", in, sizeof in);
}

static void manage_pages(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(manage_pages_in) + 2 * 8];
  memset(in, 0, sizeof in);
  DEVX_SET(manage_pages_in, in, opcode, MLX5_CMD_OP_MANAGE_PAGES);
  DEVX_SET(manage_pages_in, in, op_mod, MLX5_MANAGE_PAGES_IN_OP_MOD_ALLOCATION_SUCCESS);
  DEVX_SET(manage_pages_in, in, function_id, 0);
  DEVX_SET(manage_pages_in, in, input_num_entries, 2);
  uint8_t* pas = DEVX_ADDR_OF(manage_pages_in, in, pas);
  _devx_set64(pas, 0x50000000ull, 0);
  _devx_set64(pas, 0x50001000ull, 64);
  emit("manage_pages", in, sizeof in);
}

static void query_hca_cap(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(query_hca_cap_in)];
  memset(in, 0, sizeof in);
  DEVX_SET(query_hca_cap_in, in, opcode, MLX5_CMD_OP_QUERY_HCA_CAP);
  DEVX_SET(query_hca_cap_in, in, op_mod, (MLX5_SET_HCA_CAP_OP_MOD_ROCE << 1) | 1);
  emit("query_hca_cap", in, sizeof in);
}

static void set_roce_address(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(set_roce_address_in)];
  memset(in, 0, sizeof in);
  DEVX_SET(set_roce_address_in, in, opcode, MLX5_CMD_OP_SET_ROCE_ADDRESS);
  DEVX_SET(set_roce_address_in, in, roce_address_index, 1);
  DEVX_SET(set_roce_address_in, in, vhca_port_num, 1);
  void* addr = DEVX_ADDR_OF(set_roce_address_in, in, roce_address);
  memcpy(DEVX_ADDR_OF(roce_addr_layout, addr, source_l3_address), kGidIpv4Local, 16);
  DEVX_SET(roce_addr_layout, addr, source_mac_47_32, 0x02aa);
  DEVX_SET(roce_addr_layout, addr, source_mac_31_0, 0xbbccddee);
  DEVX_SET(roce_addr_layout, addr, roce_l3_type, 0 /* IPv4 (device.h) */);
  DEVX_SET(roce_addr_layout, addr, roce_version, 2 /* RoCE v2 (device.h) */);
  emit("set_roce_address", in, sizeof in);
}

static void modify_nic_vport_roce_en(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(modify_nic_vport_context_in)];
  memset(in, 0, sizeof in);
  DEVX_SET(modify_nic_vport_context_in, in, opcode, MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT);
  DEVX_SET(modify_nic_vport_context_in, in, field_select.roce_en, 1);
  DEVX_SET(modify_nic_vport_context_in, in, field_select.mtu, 1);
  DEVX_SET(modify_nic_vport_context_in, in, nic_vport_context.roce_en, 1);
  DEVX_SET(modify_nic_vport_context_in, in, nic_vport_context.mtu, 1500 + 14 + 4 + 4);
  emit("modify_nic_vport_context", in, sizeof in);
}

static void access_register_pmtu(void) {
  uint8_t in[DEVX_ST_SZ_BYTES(access_register_in) + DEVX_ST_SZ_BYTES(pmtu_reg)];
  memset(in, 0, sizeof in);
  DEVX_SET(access_register_in, in, opcode, MLX5_CMD_OP_ACCESS_REG);
  DEVX_SET(access_register_in, in, op_mod, MLX5_ACCESS_REGISTER_IN_OP_MOD_READ);
  DEVX_SET(access_register_in, in, register_id, 0x5003 /* PMTU (driver.h) */);
  void* reg = DEVX_ADDR_OF(access_register_in, in, register_data);
  DEVX_SET(pmtu_reg, reg, local_port, 1);
  DEVX_SET(pmtu_reg, reg, admin_mtu, 4200);
  emit("access_register_pmtu", in, sizeof in);
}

int main(void) {
  create_mkey();
  create_qp();
  init2rtr_qp();
  rtr2rts_qp();
  create_cq();
  create_eq();
  manage_pages();
  query_hca_cap();
  set_roce_address();
  modify_nic_vport_roce_en();
  access_register_pmtu();
  return 0;
}
