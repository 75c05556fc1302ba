// WQE segments, CQEs and doorbell constants, checked against rdma-core's <infiniband/mlx5dv.h>:
// struct sizes, byte offsets, opcode and flag values, and byte images built by its mlx5dv_set_*
// helpers (and read by its mlx5dv_get_cqe_* getters) compared with ours.
#include <gtest/gtest.h>
#include <infiniband/mlx5dv.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "mlx5/prm/prm.h"

namespace prm = melon::mlx5::prm;

namespace {

std::string hex(const void* p, size_t n) {
  std::string s;
  const uint8_t* b = static_cast<const uint8_t*>(p);
  char tmp[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(tmp, sizeof tmp, "%02x", b[i]);
    s += tmp;
    if (i % 4 == 3 && i + 1 < n) s += ' ';
  }
  return s;
}

TEST(PrmMlx5dv, SegmentSizesMatch) {
  EXPECT_EQ(prm::cqe64::size_bytes, sizeof(mlx5_cqe64));
  EXPECT_EQ(prm::err_cqe::size_bytes, sizeof(mlx5_err_cqe));
  EXPECT_EQ(prm::wqe_ctrl_seg::size_bytes, sizeof(mlx5_wqe_ctrl_seg));
  EXPECT_EQ(prm::wqe_raddr_seg::size_bytes, sizeof(mlx5_wqe_raddr_seg));
  EXPECT_EQ(prm::wqe_atomic_seg::size_bytes, sizeof(mlx5_wqe_atomic_seg));
  EXPECT_EQ(prm::wqe_data_seg::size_bytes, sizeof(mlx5_wqe_data_seg));
  EXPECT_EQ(prm::wqe_inline_seg::size_bytes, sizeof(mlx5_wqe_inl_data_seg));
  EXPECT_EQ(prm::wqe_datagram_seg::size_bytes, sizeof(mlx5_wqe_datagram_seg));
  EXPECT_EQ(prm::klm::size_bytes, sizeof(mlx5_wqe_umr_klm_seg));
  EXPECT_EQ(prm::kSendWqeBB, uint32_t(MLX5_SEND_WQE_BB));
  EXPECT_EQ(prm::kInlineSegFlag, uint32_t(MLX5_INLINE_SEG));
  EXPECT_EQ(prm::kRcvDbrIndex, uint32_t(MLX5_RCV_DBR));
  EXPECT_EQ(prm::kSndDbrIndex, uint32_t(MLX5_SND_DBR));
}

// Whole-byte fields: our bit offset and width against offsetof/sizeof of the C struct member.
struct ByteField {
  const prm::Field* ours;
  size_t off, size;
  const char* what;
};
#define BF(ns, f, st, m) \
  { &prm::ns::f, offsetof(st, m), sizeof(((st*)nullptr)->m), #ns "." #f }

TEST(PrmMlx5dv, WholeByteFieldsSitWhereMlx5dvPutsThem) {
  const ByteField fields[] = {
      BF(cqe64, wqe_id, mlx5_cqe64, wqe_id),
      BF(cqe64, slid, mlx5_cqe64, slid),
      BF(cqe64, hds_ip_ext, mlx5_cqe64, hds_ip_ext),
      BF(cqe64, l4_hdr_type_etc, mlx5_cqe64, l4_hdr_type_etc),
      BF(cqe64, vlan_info, mlx5_cqe64, vlan_info),
      BF(cqe64, srqn_uidx, mlx5_cqe64, srqn_uidx),
      BF(cqe64, imm_inval_pkey, mlx5_cqe64, imm_inval_pkey),
      BF(cqe64, byte_cnt, mlx5_cqe64, byte_cnt),
      BF(cqe64, timestamp, mlx5_cqe64, timestamp),
      BF(cqe64, wqe_counter, mlx5_cqe64, wqe_counter),
      BF(cqe64, signature, mlx5_cqe64, signature),
      BF(err_cqe, srqn, mlx5_err_cqe, srqn),
      BF(err_cqe, vendor_err_synd, mlx5_err_cqe, vendor_err_synd),
      BF(err_cqe, syndrome, mlx5_err_cqe, syndrome),
      BF(err_cqe, wqe_counter, mlx5_err_cqe, wqe_counter),
      BF(err_cqe, signature, mlx5_err_cqe, signature),
      BF(wqe_ctrl_seg, signature, mlx5_wqe_ctrl_seg, signature),
      BF(wqe_ctrl_seg, dci_stream_channel_id, mlx5_wqe_ctrl_seg, dci_stream_channel_id),
      BF(wqe_ctrl_seg, imm, mlx5_wqe_ctrl_seg, imm),
      BF(wqe_raddr_seg, raddr, mlx5_wqe_raddr_seg, raddr),
      BF(wqe_raddr_seg, rkey, mlx5_wqe_raddr_seg, rkey),
      BF(wqe_atomic_seg, swap_add, mlx5_wqe_atomic_seg, swap_add),
      BF(wqe_atomic_seg, compare, mlx5_wqe_atomic_seg, compare),
      BF(wqe_data_seg, byte_count, mlx5_wqe_data_seg, byte_count),
      BF(wqe_data_seg, lkey, mlx5_wqe_data_seg, lkey),
      BF(wqe_data_seg, addr, mlx5_wqe_data_seg, addr),
      BF(wqe_datagram_seg, qkey, mlx5_wqe_datagram_seg, av.key.qkey.qkey),
      BF(wqe_datagram_seg, rlid, mlx5_wqe_datagram_seg, av.rlid),
      BF(wqe_datagram_seg, rmac, mlx5_wqe_datagram_seg, av.rmac),
      BF(wqe_datagram_seg, tclass, mlx5_wqe_datagram_seg, av.tclass),
      BF(wqe_datagram_seg, hop_limit, mlx5_wqe_datagram_seg, av.hop_limit),
      BF(wqe_datagram_seg, rgid, mlx5_wqe_datagram_seg, av.rgid),
      BF(klm, byte_count, mlx5_wqe_umr_klm_seg, byte_count),
      BF(klm, mkey, mlx5_wqe_umr_klm_seg, mkey),
      BF(klm, address, mlx5_wqe_umr_klm_seg, address),
  };
  for (const ByteField& f : fields) {
    EXPECT_EQ(f.ours->bit_off, f.off * 8) << f.what;
    EXPECT_EQ(f.ours->bit_width, f.size * 8) << f.what;
  }
}
#undef BF

TEST(PrmMlx5dv, CtrlSegmentImageMatchesMlx5dvSetCtrlSeg) {
  alignas(16) uint8_t theirs[16] = {}, ours[16] = {};
  const uint8_t flags = MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED | MLX5_WQE_CTRL_FENCE;
  mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(theirs), 0xbeef, MLX5_OPCODE_RDMA_WRITE_IMM, 0x5, 0x00abcdef,
                      flags, 3, 0x77, htobe32(0x11223344));
  prm::wqe_ctrl_seg::view(ours)
      .set(prm::wqe_ctrl_seg::opmod, 0x5)
      .set(prm::wqe_ctrl_seg::wqe_index, 0xbeef)
      .set(prm::wqe_ctrl_seg::opcode, prm::wqe_opcode::RDMA_WRITE_IMM)
      .set(prm::wqe_ctrl_seg::qpn, 0x00abcdef)
      .set(prm::wqe_ctrl_seg::ds, 3)
      .set(prm::wqe_ctrl_seg::signature, 0x77)
      .set(prm::wqe_ctrl_seg::fm, 4)  // fence
      .set(prm::wqe_ctrl_seg::ce, 2)  // CQE always
      .set(prm::wqe_ctrl_seg::se, 1)
      .set(prm::wqe_ctrl_seg::imm, 0x11223344);
  EXPECT_EQ(hex(ours, 16), hex(theirs, 16));
  // The flag byte built from the named value set is the same byte.
  const uint8_t byte = ours[prm::wqe_ctrl_seg::fm.byte_off()];
  EXPECT_EQ(byte, prm::wqe_ctrl_flag::FENCE | prm::wqe_ctrl_flag::CQ_UPDATE | prm::wqe_ctrl_flag::SOLICITED);
}

TEST(PrmMlx5dv, DataSegmentImageMatchesMlx5dvSetDataSeg) {
  alignas(16) uint8_t theirs[16] = {}, ours[16] = {};
  mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(theirs), 4096, 0x1234abcd, uintptr_t(0x7f0012345000ull));
  prm::wqe_data_seg::view(ours)
      .set(prm::wqe_data_seg::byte_count, 4096)
      .set(prm::wqe_data_seg::lkey, 0x1234abcd)
      .set(prm::wqe_data_seg::addr, 0x7f0012345000ull);
  EXPECT_EQ(hex(ours, 16), hex(theirs, 16));
}

TEST(PrmMlx5dv, DatagramSegmentImageMatchesMlx5dvSetDgramSeg) {
  alignas(16) uint8_t theirs[48] = {}, ours[48] = {};
  uint8_t rmac[6] = {0x02, 0x11, 0x22, 0x33, 0x44, 0x55};
  uint8_t rgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 2};
  const uint32_t grh_gid_fl = (1u << 30) | (3u << 20) | 0x12345;  // grh, sgid index 3, flow label
  mlx5dv_set_dgram_seg(reinterpret_cast<mlx5_wqe_datagram_seg*>(theirs), uint64_t(0x11111111) << 32, 0x000abc, 1,
                       (0x7 << 4) | 0x3, 0, 0xc001, rmac, 0x68, 64, grh_gid_fl, rgid);
  prm::wqe_datagram_seg::view v(ours);
  v.set(prm::wqe_datagram_seg::qkey, 0x11111111)
      .set(prm::wqe_datagram_seg::ext, 1)
      .set(prm::wqe_datagram_seg::dqpn, 0x000abc)
      .set(prm::wqe_datagram_seg::stat_rate, 0x7)
      .set(prm::wqe_datagram_seg::sl, 0x3)
      .set(prm::wqe_datagram_seg::rlid, 0xc001)  // RoCE: UDP source port
      .set_bytes(prm::wqe_datagram_seg::rmac, rmac)
      .set(prm::wqe_datagram_seg::tclass, 0x68)
      .set(prm::wqe_datagram_seg::hop_limit, 64)
      .set(prm::wqe_datagram_seg::grh, 1)
      .set(prm::wqe_datagram_seg::sgid_index, 3)
      .set(prm::wqe_datagram_seg::flow_label, 0x12345)
      .set_bytes(prm::wqe_datagram_seg::rgid, rgid);
  EXPECT_EQ(hex(ours, 48), hex(theirs, 48));
  EXPECT_EQ(prm::wqe_datagram_seg::ext.bit_off, 64u);
  EXPECT_EQ(be32toh(reinterpret_cast<mlx5_wqe_datagram_seg*>(ours)->av.dqp_dct) & MLX5_EXTENDED_UD_AV,
            uint32_t(MLX5_EXTENDED_UD_AV));
}

TEST(PrmMlx5dv, InlineSegmentCarriesTheInlineBit) {
  alignas(4) uint8_t ours[4] = {};
  prm::wqe_inline_seg::view(ours).set(prm::wqe_inline_seg::inline_flag, 1).set(prm::wqe_inline_seg::byte_count, 60);
  uint32_t theirs = htobe32(60 | MLX5_INLINE_SEG);
  EXPECT_EQ(hex(ours, 4), hex(&theirs, 4));
}

TEST(PrmMlx5dv, RaddrAndAtomicSegmentsAreBigEndianWords) {
  alignas(16) mlx5_wqe_raddr_seg r = {};
  r.raddr = htobe64(0x0000555500001000ull);
  r.rkey = htobe32(0xdeadbeef);
  alignas(16) uint8_t ours[16] = {};
  prm::wqe_raddr_seg::view(ours)
      .set(prm::wqe_raddr_seg::raddr, 0x0000555500001000ull)
      .set(prm::wqe_raddr_seg::rkey, 0xdeadbeef);
  EXPECT_EQ(hex(ours, 16), hex(&r, 16));
  alignas(16) mlx5_wqe_atomic_seg a = {};
  a.swap_add = htobe64(0x0102030405060708ull);
  a.compare = htobe64(0x1112131415161718ull);
  alignas(16) uint8_t oa[16] = {};
  prm::wqe_atomic_seg::view(oa)
      .set(prm::wqe_atomic_seg::swap_add, 0x0102030405060708ull)
      .set(prm::wqe_atomic_seg::compare, 0x1112131415161718ull);
  EXPECT_EQ(hex(oa, 16), hex(&a, 16));
}

// Scatter to CQE: our format values are mlx5dv.h's op_own flags, and its getter reads them.
TEST(PrmMlx5dv, CqeFormatsAreMlx5dvsInlineScatterFlags) {
  alignas(64) mlx5_cqe64 cqe;
  memset(&cqe, 0, sizeof cqe);
  prm::cqe64::view v(&cqe);
  v.set(prm::cqe64::opcode, prm::cqe_opcode::RESP_SEND).set(prm::cqe64::format, prm::cqe_format::INLINE_SCATTER_32);
  EXPECT_EQ(cqe.op_own & (MLX5_INLINE_SCATTER_32 | MLX5_INLINE_SCATTER_64), MLX5_INLINE_SCATTER_32);
  EXPECT_EQ(mlx5dv_get_cqe_format(&cqe), prm::cqe_format::INLINE_SCATTER_32);
  v.set(prm::cqe64::format, prm::cqe_format::INLINE_SCATTER_64);
  EXPECT_EQ(cqe.op_own & (MLX5_INLINE_SCATTER_32 | MLX5_INLINE_SCATTER_64), MLX5_INLINE_SCATTER_64);
  EXPECT_EQ(mlx5dv_get_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND);
}

TEST(PrmMlx5dv, CqeWrittenByUsIsReadByMlx5dvGetters) {
  for (uint8_t owner = 0; owner < 2; ++owner) {
    alignas(64) mlx5_cqe64 cqe;
    memset(&cqe, 0, sizeof cqe);
    prm::cqe64::view(&cqe)
        .set(prm::cqe64::opcode, prm::cqe_opcode::RESP_SEND_IMM)
        .set(prm::cqe64::format, 0)
        .set(prm::cqe64::se, 1)
        .set(prm::cqe64::owner, owner)
        .set(prm::cqe64::qpn, 0x00c0ffee)
        .set(prm::cqe64::sop_drop, 0x12)
        .set(prm::cqe64::byte_cnt, 1024)
        .set(prm::cqe64::wqe_counter, 0x4321)
        .set(prm::cqe64::rqpn, 0x000123)
        .set(prm::cqe64::flags, 0x20)
        .set(prm::cqe64::imm_inval_pkey, 0xfeedface);
    EXPECT_EQ(mlx5dv_get_cqe_opcode(&cqe), MLX5_CQE_RESP_SEND_IMM);
    EXPECT_EQ(mlx5dv_get_cqe_owner(&cqe), owner);
    EXPECT_EQ(mlx5dv_get_cqe_se(&cqe), 1);
    EXPECT_EQ(mlx5dv_get_cqe_format(&cqe), 0);
    EXPECT_EQ(be32toh(cqe.sop_drop_qpn) & 0xffffff, 0x00c0ffeeu);
    EXPECT_EQ(be32toh(cqe.sop_drop_qpn) >> 24, 0x12u);
    EXPECT_EQ(be32toh(cqe.byte_cnt), 1024u);
    EXPECT_EQ(be16toh(cqe.wqe_counter), 0x4321);
    EXPECT_EQ(be32toh(cqe.flags_rqpn), 0x20000123u);
    EXPECT_EQ(be32toh(cqe.imm_inval_pkey), 0xfeedfaceu);
    // And mlx5dv's setter is read back by us.
    mlx5dv_set_cqe_owner(&cqe, !owner);
    EXPECT_EQ(prm::get(&cqe, prm::cqe64::owner), uint64_t(!owner));
    EXPECT_EQ(prm::get(&cqe, prm::cqe64::opcode), uint64_t(MLX5_CQE_RESP_SEND_IMM));
  }
}

TEST(PrmMlx5dv, ErrorCqeFieldsMatch) {
  alignas(64) mlx5_err_cqe e;
  memset(&e, 0, sizeof e);
  prm::err_cqe::view(&e)
      .set(prm::err_cqe::syndrome, prm::cqe_syndrome::REMOTE_ACCESS_ERR)
      .set(prm::err_cqe::vendor_err_synd, 0x88)
      .set(prm::err_cqe::s_wqe_opcode, prm::wqe_opcode::RDMA_READ)
      .set(prm::err_cqe::qpn, 0x000777)
      .set(prm::err_cqe::wqe_counter, 9)
      .set(prm::err_cqe::opcode, prm::cqe_opcode::REQ_ERR)
      .set(prm::err_cqe::owner, 1);
  EXPECT_EQ(e.syndrome, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
  EXPECT_EQ(e.vendor_err_synd, 0x88);
  EXPECT_EQ(be32toh(e.s_wqe_opcode_qpn), (uint32_t(MLX5_OPCODE_RDMA_READ) << 24) | 0x777);
  EXPECT_EQ(be16toh(e.wqe_counter), 9);
  EXPECT_EQ(mlx5dv_get_cqe_opcode(reinterpret_cast<mlx5_cqe64*>(&e)), MLX5_CQE_REQ_ERR);
  EXPECT_EQ(e.op_own & MLX5_CQE_OWNER_MASK, 1);
}

TEST(PrmMlx5dv, OwnerBitDecidesWhoOwnsACqe) {
  alignas(64) uint8_t cqe[64] = {};
  prm::set(cqe, prm::cqe64::opcode, prm::cqe_opcode::REQ);
  prm::set(cqe, prm::cqe64::owner, 0);
  EXPECT_TRUE(prm::cqe_sw_owned(cqe, 3, 4));  // first pass: owner 0
  EXPECT_FALSE(prm::cqe_sw_owned(cqe, 19, 4));  // second pass expects owner 1
  prm::set(cqe, prm::cqe64::opcode, prm::cqe_opcode::INVALID);
  EXPECT_FALSE(prm::cqe_sw_owned(cqe, 3, 4));
}

struct NamedValue {
  const char* ours;
  uint32_t ours_value;
  uint32_t theirs;
};

void expect_covers(const prm::ConstantSet& set, const std::vector<NamedValue>& rows) {
  EXPECT_EQ(rows.size(), set.count) << set.name << ": every value needs a row";
  for (const NamedValue& r : rows) EXPECT_EQ(r.ours_value, r.theirs) << set.name << "::" << r.ours;
}

#define ROW(ns, name, theirs) \
  { #name, prm::ns::name, uint32_t(theirs) }
TEST(PrmMlx5dv, OpcodesAndFlagsMatch) {
  expect_covers(prm::wqe_opcode::set, {
                                          ROW(wqe_opcode, NOP, MLX5_OPCODE_NOP),
                                          ROW(wqe_opcode, SEND_INVAL, MLX5_OPCODE_SEND_INVAL),
                                          ROW(wqe_opcode, RDMA_WRITE, MLX5_OPCODE_RDMA_WRITE),
                                          ROW(wqe_opcode, RDMA_WRITE_IMM, MLX5_OPCODE_RDMA_WRITE_IMM),
                                          ROW(wqe_opcode, SEND, MLX5_OPCODE_SEND),
                                          ROW(wqe_opcode, SEND_IMM, MLX5_OPCODE_SEND_IMM),
                                          ROW(wqe_opcode, TSO, MLX5_OPCODE_TSO),
                                          ROW(wqe_opcode, RDMA_READ, MLX5_OPCODE_RDMA_READ),
                                          ROW(wqe_opcode, ATOMIC_CS, MLX5_OPCODE_ATOMIC_CS),
                                          ROW(wqe_opcode, ATOMIC_FA, MLX5_OPCODE_ATOMIC_FA),
                                          ROW(wqe_opcode, ATOMIC_MASKED_CS, MLX5_OPCODE_ATOMIC_MASKED_CS),
                                          ROW(wqe_opcode, ATOMIC_MASKED_FA, MLX5_OPCODE_ATOMIC_MASKED_FA),
                                          ROW(wqe_opcode, FMR, MLX5_OPCODE_FMR),
                                          ROW(wqe_opcode, LOCAL_INVAL, MLX5_OPCODE_LOCAL_INVAL),
                                          ROW(wqe_opcode, CONFIG_CMD, MLX5_OPCODE_CONFIG_CMD),
                                          ROW(wqe_opcode, UMR, MLX5_OPCODE_UMR),
                                      });
  expect_covers(prm::cqe_opcode::set, {
                                          ROW(cqe_opcode, REQ, MLX5_CQE_REQ),
                                          ROW(cqe_opcode, RESP_WR_IMM, MLX5_CQE_RESP_WR_IMM),
                                          ROW(cqe_opcode, RESP_SEND, MLX5_CQE_RESP_SEND),
                                          ROW(cqe_opcode, RESP_SEND_IMM, MLX5_CQE_RESP_SEND_IMM),
                                          ROW(cqe_opcode, RESP_SEND_INV, MLX5_CQE_RESP_SEND_INV),
                                          ROW(cqe_opcode, RESIZE_CQ, MLX5_CQE_RESIZE_CQ),
                                          ROW(cqe_opcode, NO_PACKET, MLX5_CQE_NO_PACKET),
                                          ROW(cqe_opcode, SIGNATURE_ERR, MLX5_CQE_SIG_ERR),
                                          ROW(cqe_opcode, REQ_ERR, MLX5_CQE_REQ_ERR),
                                          ROW(cqe_opcode, RESP_ERR, MLX5_CQE_RESP_ERR),
                                          ROW(cqe_opcode, INVALID, MLX5_CQE_INVALID),
                                      });
  expect_covers(prm::wqe_ctrl_flag::set,
                {
                    ROW(wqe_ctrl_flag, SOLICITED, MLX5_WQE_CTRL_SOLICITED),
                    ROW(wqe_ctrl_flag, CQ_UPDATE, MLX5_WQE_CTRL_CQ_UPDATE),
                    ROW(wqe_ctrl_flag, INITIATOR_SMALL_FENCE, MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE),
                    ROW(wqe_ctrl_flag, FENCE, MLX5_WQE_CTRL_FENCE),
                });
  expect_covers(prm::cqe_syndrome::set,
                {
                    ROW(cqe_syndrome, LOCAL_LENGTH_ERR, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR),
                    ROW(cqe_syndrome, LOCAL_QP_OP_ERR, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR),
                    ROW(cqe_syndrome, LOCAL_PROT_ERR, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR),
                    ROW(cqe_syndrome, WR_FLUSH_ERR, MLX5_CQE_SYNDROME_WR_FLUSH_ERR),
                    ROW(cqe_syndrome, MW_BIND_ERR, MLX5_CQE_SYNDROME_MW_BIND_ERR),
                    ROW(cqe_syndrome, BAD_RESP_ERR, MLX5_CQE_SYNDROME_BAD_RESP_ERR),
                    ROW(cqe_syndrome, LOCAL_ACCESS_ERR, MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR),
                    ROW(cqe_syndrome, REMOTE_INVAL_REQ_ERR, MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR),
                    ROW(cqe_syndrome, REMOTE_ACCESS_ERR, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR),
                    ROW(cqe_syndrome, REMOTE_OP_ERR, MLX5_CQE_SYNDROME_REMOTE_OP_ERR),
                    ROW(cqe_syndrome, TRANSPORT_RETRY_EXC_ERR, MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR),
                    ROW(cqe_syndrome, RNR_RETRY_EXC_ERR, MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR),
                    ROW(cqe_syndrome, REMOTE_ABORTED_ERR, MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR),
                });
}
#undef ROW

}  // namespace
