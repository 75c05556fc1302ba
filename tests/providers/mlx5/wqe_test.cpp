// The mlx5 provider's WQE writers on plain memory, read back through rdma-core's
// <infiniband/mlx5dv.h> (its structs and mlx5dv_set_* helpers build the expected bytes), and the
// errno of every refusal rdma-core's providers/mlx5 gives for the same input.
#include <gtest/gtest.h>
#include <infiniband/mlx5dv.h>

#include <cstring>
#include <vector>

#include "providers/mlx5/tables.h"
#include "providers/mlx5/wqe.h"

namespace mp = melon::mlx5prov;

namespace {

constexpr uint32_t kQpn = 0x123;

struct Ring {
  explicit Ring(uint32_t bbs, ibv_qp_type type = IBV_QPT_RC) : mem(bbs * 64, 0xee), wrid(bbs), next(bbs) {
    sq.buf = mem.data();
    sq.wqe_cnt = bbs;
    sq.max_gs = 4;
    sq.state_max_gs = 4;  // as in RTS
    sq.max_inline = 64;
    sq.qpn = kQpn;
    sq.type = type;
    sq.wrid = wrid.data();
    sq.next_tail = next.data();
  }
  uint8_t* bb(uint32_t i) { return mem.data() + 64 * i; }
  std::vector<uint8_t> mem;
  std::vector<uint64_t> wrid;
  std::vector<uint32_t> next;
  mp::SendQueue sq;
};

ibv_send_wr wr_of(int op, ibv_sge* sg, int n, unsigned flags = IBV_SEND_SIGNALED) {
  ibv_send_wr w{};
  w.wr_id = 0xabcdef;
  std::memcpy(&w.opcode, &op, sizeof op);  // possibly outside the enum, as a C caller may pass
  w.sg_list = sg;
  w.num_sge = n;
  w.send_flags = flags;
  return w;
}

TEST(Mlx5Wqe, SendWithTwoGatherEntriesMatchesMlx5dv) {
  Ring r(8);
  ibv_sge sg[3] = {{0x1000, 100, 0x11}, {0x2000, 0, 0x22}, {0x3000, 300, 0x33}};  // the empty one is skipped
  ibv_send_wr w = wr_of(IBV_WR_SEND, sg, 3, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
  ASSERT_EQ(mp::write_send_wqe(r.sq, w, nullptr), 0);
  uint8_t want[64] = {};
  mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(want), 0, MLX5_OPCODE_SEND, 0, kQpn,
                      MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED, 3, 0, 0);
  mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(want + 16), 100, 0x11, 0x1000);
  mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(want + 32), 300, 0x33, 0x3000);
  EXPECT_EQ(std::memcmp(r.bb(0), want, 48), 0);
  EXPECT_EQ(r.sq.cur_post, 1u);
  EXPECT_EQ(r.wrid[0], 0xabcdefu);
  EXPECT_EQ(r.next[0], 1u);
  EXPECT_EQ(r.sq.last_ctrl, r.bb(0));
}

TEST(Mlx5Wqe, RdmaWriteWithImmCarriesRaddrAndImmediate) {
  Ring r(8);
  r.sq.cur_post = r.sq.tail = 5;  // the WQE index is the producer counter
  ibv_sge sg = {0x4000, 64, 0x44};
  ibv_send_wr w = wr_of(IBV_WR_RDMA_WRITE_WITH_IMM, &sg, 1, 0);
  w.imm_data = htobe32(0xfeedbeef);
  w.wr.rdma.remote_addr = 0x1122334455667788ull;
  w.wr.rdma.rkey = 0xabcd;
  ASSERT_EQ(mp::write_send_wqe(r.sq, w, nullptr), 0);
  uint8_t want[48] = {};
  mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(want), 5, MLX5_OPCODE_RDMA_WRITE_IMM, 0, kQpn, 0, 3, 0,
                      htobe32(0xfeedbeef));
  auto* ra = reinterpret_cast<mlx5_wqe_raddr_seg*>(want + 16);
  ra->raddr = htobe64(0x1122334455667788ull);
  ra->rkey = htobe32(0xabcd);
  mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(want + 32), 64, 0x44, 0x4000);
  EXPECT_EQ(std::memcmp(r.bb(5), want, sizeof want), 0);
  EXPECT_EQ(r.sq.cur_post, 6u);
}

TEST(Mlx5Wqe, CompareAndSwapHasAtomicSegmentAndEightByteData) {
  Ring r(8);
  ibv_sge sg = {0x5000, 8, 0x55};
  ibv_send_wr w = wr_of(IBV_WR_ATOMIC_CMP_AND_SWP, &sg, 1);
  w.wr.atomic.remote_addr = 0x9000;
  w.wr.atomic.rkey = 7;
  w.wr.atomic.compare_add = 0x1111;
  w.wr.atomic.swap = 0x2222;
  ASSERT_EQ(mp::write_send_wqe(r.sq, w, nullptr), 0);
  auto* ctrl = reinterpret_cast<mlx5_wqe_ctrl_seg*>(r.bb(0));
  EXPECT_EQ(be32toh(ctrl->opmod_idx_opcode) & 0xff, uint32_t(MLX5_OPCODE_ATOMIC_CS));
  EXPECT_EQ(be32toh(ctrl->qpn_ds) & 0x3f, 4u);  // ctrl + raddr + atomic + data
  auto* at = reinterpret_cast<mlx5_wqe_atomic_seg*>(r.bb(0) + 32);
  EXPECT_EQ(be64toh(at->swap_add), 0x2222u);
  EXPECT_EQ(be64toh(at->compare), 0x1111u);
  auto* d = reinterpret_cast<mlx5_wqe_data_seg*>(r.bb(0) + 48);
  EXPECT_EQ(be32toh(d->byte_count), 8u);
}

TEST(Mlx5Wqe, UdSendCopiesTheAvAndSetsRemoteQpnAndQkey) {
  Ring r(8, IBV_QPT_UD);
  uint8_t av[48];
  for (int i = 0; i < 48; i++) av[i] = uint8_t(i + 1);
  ibv_sge sg = {0x6000, 10, 0x66};
  ibv_send_wr w = wr_of(IBV_WR_SEND, &sg, 1);
  w.wr.ud.remote_qpn = 0xabcde;
  w.wr.ud.remote_qkey = 0x11111111;
  w.wr.ud.ah = reinterpret_cast<ibv_ah*>(1);
  ASSERT_EQ(mp::write_send_wqe(r.sq, w, av), 0);
  auto* dg = reinterpret_cast<mlx5_wqe_datagram_seg*>(r.bb(0) + 16);
  EXPECT_EQ(be32toh(dg->av.key.qkey.qkey), 0x11111111u);
  EXPECT_EQ(be32toh(dg->av.dqp_dct), uint32_t(MLX5_EXTENDED_UD_AV) | 0xabcde);
  EXPECT_EQ(std::memcmp(dg->av.rgid, av + 32, 16), 0);  // the rest is the AH's, untouched
  EXPECT_EQ(be32toh(reinterpret_cast<mlx5_wqe_ctrl_seg*>(r.bb(0))->qpn_ds) & 0x3f, 5u);  // 1 + 3 + 1
  EXPECT_EQ(mp::write_send_wqe(r.sq, w, nullptr), EINVAL);  // UD without an AV
}

TEST(Mlx5Wqe, InlineDataWrapsAroundTheRingEnd) {
  Ring r(2);
  r.sq.cur_post = r.sq.tail = 1;  // the last WQEBB: the data runs into WQEBB 0
  uint8_t data[60];
  for (int i = 0; i < 60; i++) data[i] = uint8_t(0xa0 + i);
  ibv_sge sg = {uintptr_t(data), 60, 0};
  ibv_send_wr w = wr_of(IBV_WR_SEND, &sg, 1, IBV_SEND_INLINE);
  ASSERT_EQ(mp::write_send_wqe(r.sq, w, nullptr), 0);
  uint8_t* wqe = r.bb(1);
  EXPECT_EQ(be32toh(reinterpret_cast<mlx5_wqe_ctrl_seg*>(wqe)->qpn_ds) & 0x3f, 1u + (4 + 60 + 15) / 16);
  uint32_t bc;
  std::memcpy(&bc, wqe + 16, 4);
  EXPECT_EQ(be32toh(bc), uint32_t(MLX5_INLINE_SEG) | 60);
  EXPECT_EQ(std::memcmp(wqe + 20, data, 44), 0);  // to the ring's end
  EXPECT_EQ(std::memcmp(r.bb(0), data + 44, 16), 0);  // then from its start
  EXPECT_EQ(r.sq.cur_post, 3u);
}

TEST(Mlx5Wqe, RefusalsCarryRdmaCoresErrno) {
  Ring r(4);
  ibv_sge sg[5] = {{1, 1, 1}, {2, 1, 1}, {3, 1, 1}, {4, 1, 1}, {5, 1, 1}};
  ibv_send_wr w = wr_of(IBV_WR_SEND, sg, 5);
  EXPECT_EQ(mp::write_send_wqe(r.sq, w, nullptr), ENOMEM);  // more entries than max_gs
  std::vector<uint8_t> big(65);
  ibv_sge s = {uintptr_t(big.data()), 65, 0};
  ibv_send_wr inl = wr_of(IBV_WR_SEND, &s, 1, IBV_SEND_INLINE);
  EXPECT_EQ(mp::write_send_wqe(r.sq, inl, nullptr), ENOMEM);  // inline beyond max_inline
  ibv_send_wr bad = wr_of(77, sg, 1);
  EXPECT_EQ(mp::write_send_wqe(r.sq, bad, nullptr), EINVAL);  // opcode out of range
  ibv_send_wr bind = wr_of(IBV_WR_BIND_MW, sg, 1);
  EXPECT_EQ(mp::write_send_wqe(r.sq, bind, nullptr), EINVAL);  // not postable here
  r.sq.state_max_gs = -1;  // RESET .. RTR
  ibv_send_wr ok = wr_of(IBV_WR_SEND, sg, 1);
  EXPECT_EQ(mp::write_send_wqe(r.sq, ok, nullptr), ENOMEM);
  EXPECT_EQ(r.sq.cur_post, 0u);
  for (uint8_t b : r.mem) ASSERT_EQ(b, 0xee);  // nothing written by any refusal
}

TEST(Mlx5Wqe, FullRingIsEnomemUntilCompletionsMoveTheTail) {
  Ring r(4);
  ibv_sge sg = {1, 1, 1};
  ibv_send_wr w = wr_of(IBV_WR_SEND, &sg, 1);
  for (int i = 0; i < 4; i++) ASSERT_EQ(mp::write_send_wqe(r.sq, w, nullptr), 0);
  EXPECT_EQ(mp::write_send_wqe(r.sq, w, nullptr), ENOMEM);
  r.sq.tail = r.next[0];  // the first WQE completed
  EXPECT_EQ(mp::write_send_wqe(r.sq, w, nullptr), 0);
}

TEST(Mlx5Wqe, ReadOnUdIsInvalid) {
  Ring r(4, IBV_QPT_UD);
  ibv_sge sg = {1, 1, 1};
  ibv_send_wr w = wr_of(IBV_WR_RDMA_READ, &sg, 1);
  uint8_t av[48] = {};
  EXPECT_EQ(mp::write_send_wqe(r.sq, w, av), EINVAL);
}

TEST(Mlx5Wqe, ReceiveWqeEndsWithTheInvalidLkey) {
  std::vector<uint8_t> mem(4 * 64, 0xee);
  std::vector<uint64_t> wrid(4);
  mp::RecvQueue q;
  q.buf = mem.data();
  q.wqe_cnt = 4;
  q.stride = 64;
  q.max_gs = 4;
  q.wrid = wrid.data();
  ibv_sge sg = {0x7000, 128, 0x77};
  ibv_recv_wr w{};
  w.wr_id = 9;
  w.sg_list = &sg;
  w.num_sge = 1;
  EXPECT_EQ(mp::write_recv_wqe(q, w), EINVAL);  // RESET: rdma-core's qp_state_max_gs -1
  q.state_max_gs = 4;
  ASSERT_EQ(mp::write_recv_wqe(q, w), 0);
  uint8_t want[32] = {};
  mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(want), 128, 0x77, 0x7000);
  mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(want + 16), 0, MLX5_INVALID_LKEY, 0);
  EXPECT_EQ(std::memcmp(mem.data(), want, 32), 0);
  EXPECT_EQ(wrid[0], 9u);
  EXPECT_EQ(q.head, 1u);
  ibv_sge five[5] = {};
  w.sg_list = five;
  w.num_sge = 5;
  EXPECT_EQ(mp::write_recv_wqe(q, w), EINVAL);  // more than max_gs
}

TEST(Mlx5Wqe, SrqFreeListFollowsNextSegments) {
  std::vector<uint8_t> mem(4 * 32, 0);
  std::vector<uint64_t> wrid(4);
  mp::SrqQueue q;
  q.buf = mem.data();
  q.wqe_cnt = 4;
  q.stride = 32;
  q.max_gs = 1;
  q.wrid = wrid.data();
  mp::srq_init(q);
  auto next_of = [&](uint32_t i) {
    return be16toh(reinterpret_cast<mlx5_wqe_srq_next_seg*>(mem.data() + 32 * i)->next_wqe_index);
  };
  EXPECT_EQ(next_of(0), 1u);
  EXPECT_EQ(next_of(3), 0u);
  ibv_sge sg = {0x8000, 16, 0x88};
  ibv_recv_wr w{};
  w.sg_list = &sg;
  w.num_sge = 1;
  for (int i = 0; i < 3; i++) {
    w.wr_id = 100 + i;
    ASSERT_EQ(mp::write_srq_wqe(q, w), 0);
  }
  EXPECT_EQ(mp::write_srq_wqe(q, w), ENOMEM);  // one WQE stays as the list's sentinel
  EXPECT_EQ(q.counter, 3u);
  auto* d = reinterpret_cast<mlx5_wqe_data_seg*>(mem.data() + 32 + 16);
  EXPECT_EQ(be64toh(d->addr), 0x8000u);
  mp::srq_free(q, 1);  // WQE 1 completed: linked after the old tail (3)
  EXPECT_EQ(next_of(3), 1u);
  w.wr_id = 200;
  ASSERT_EQ(mp::write_srq_wqe(q, w), 0);  // takes WQE 3, the old sentinel
  EXPECT_EQ(wrid[3], 200u);
}

TEST(Mlx5Tables, SyndromesAndOpcodesMapAsRdmaCoreDoes) {
  EXPECT_EQ(mp::wc_status_of(0x05), IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(mp::wc_status_of(0x13), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(mp::wc_status_of(0x15), IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(mp::wc_status_of(0x16), IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(mp::wc_status_of(0x77), IBV_WC_GENERAL_ERR);
  bool imm;
  EXPECT_EQ(mp::wc_opcode_of_wqe(MLX5_OPCODE_RDMA_READ, &imm), IBV_WC_RDMA_READ);
  EXPECT_EQ(mp::wc_opcode_of_wqe(MLX5_OPCODE_RDMA_WRITE_IMM, &imm), IBV_WC_RDMA_WRITE);
  EXPECT_TRUE(imm);
  EXPECT_EQ(mp::wc_opcode_of_wqe(MLX5_OPCODE_ATOMIC_FA, &imm), IBV_WC_FETCH_ADD);
  EXPECT_EQ(mp::send_op(IBV_WR_SEND_WITH_INV)->wqe_opcode, uint8_t(MLX5_OPCODE_SEND_INVAL));
  EXPECT_EQ(mp::send_op(IBV_WR_LOCAL_INV), nullptr);
}

}  // namespace
