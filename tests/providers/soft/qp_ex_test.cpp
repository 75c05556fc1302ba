// The library's generic ibv_qp_ex builders (src/verbs/qp_ex.cpp): ibv_wr_* calls between
// ibv_wr_start and ibv_wr_complete become one ibv_send_wr chain on the context's post_send.
#include "verbs/provider.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace melon;

namespace {

struct Posted {
  ibv_send_wr wr;
  std::vector<ibv_sge> sges;
  std::string bytes;  // gathered from the SGEs (inline data or our buffers)
};
std::vector<Posted> g_posted;
int g_post_rc = 0;

int record_post_send(ibv_qp*, ibv_send_wr* wr, ibv_send_wr** bad) {
  if (g_post_rc) {
    *bad = wr;
    return g_post_rc;
  }
  for (; wr; wr = wr->next) {
    Posted p{*wr, {}, {}};
    for (int i = 0; i < wr->num_sge; i++) {
      p.sges.push_back(wr->sg_list[i]);
      p.bytes.append(reinterpret_cast<const char*>(wr->sg_list[i].addr), wr->sg_list[i].length);
    }
    g_posted.push_back(p);
  }
  return 0;
}

class QpEx : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    setenv("MELON_SOFT_DEVICES", "qx0=127.0.1.4", 1);
    list = ibv_get_device_list(nullptr);
    ASSERT_NE(list, nullptr);
    ASSERT_NE(list[0], nullptr);
    ctx = ibv_open_device(list[0]);
    ASSERT_NE(ctx, nullptr);
    ctx->ops.post_send = record_post_send;  // stands in for the provider's data path
    ibv_qp_init_attr_ex attr{};
    attr.qp_type = IBV_QPT_RC;
    verbs::init_qp_fields(&qp, ctx, &attr);
    g_posted.clear();
    g_post_rc = 0;
  }
  void TearDown() override {
    verbs::release_qp_ex_ops(&qp);
    verbs::destroy_sync_fields(&qp.ibv.qp_base.mutex, &qp.ibv.qp_base.cond);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    unsetenv("MELON_SOFT_DEVICES");
  }
  ibv_qp_ex* qpx() { return ibv_qp_to_qp_ex(&qp.ibv.qp_base); }

  ibv_device** list = nullptr;
  ibv_context* ctx = nullptr;
  verbs::QpBase qp{};
  char buf[64] = "0123456789abcdef";
};

TEST_F(QpEx, OnlyExtendedQpsConvert) {
  EXPECT_EQ(qpx(), nullptr);
  ASSERT_EQ(verbs::init_qp_ex_ops(&qp, IBV_QP_EX_WITH_SEND), 0);
  EXPECT_EQ(qpx(), &qp.ibv);
}

TEST_F(QpEx, BatchBecomesOneChainInOrder) {
  ASSERT_EQ(verbs::init_qp_ex_ops(
                &qp, IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD),
            0);
  ibv_qp_ex* x = qpx();
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, 0x1234, 0xabc000);
  ibv_wr_set_sge(x, 77, reinterpret_cast<uintptr_t>(buf), 4);
  x->wr_id = 2;
  x->wr_flags = 0;
  ibv_wr_send_imm(x, htonl(0xfeed));
  char scratch[8] = "inline!";
  ibv_wr_set_inline_data(x, scratch, 7);
  std::memset(scratch, 'X', sizeof(scratch));  // copied at the call: reuse is allowed
  x->wr_id = 3;
  ibv_wr_atomic_fetch_add(x, 0x99, 0x8000, 5);
  ibv_sge two[2] = {{reinterpret_cast<uintptr_t>(buf), 2, 1}, {reinterpret_cast<uintptr_t>(buf) + 10, 2, 2}};
  ibv_wr_set_sge_list(x, 2, two);
  ASSERT_EQ(ibv_wr_complete(x), 0);

  ASSERT_EQ(g_posted.size(), 3u);
  EXPECT_EQ(g_posted[0].wr.wr_id, 1u);
  EXPECT_EQ(g_posted[0].wr.opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(g_posted[0].wr.send_flags, unsigned(IBV_SEND_SIGNALED));
  EXPECT_EQ(g_posted[0].wr.wr.rdma.rkey, 0x1234u);
  EXPECT_EQ(g_posted[0].wr.wr.rdma.remote_addr, 0xabc000u);
  ASSERT_EQ(g_posted[0].sges.size(), 1u);
  EXPECT_EQ(g_posted[0].sges[0].lkey, 77u);
  EXPECT_EQ(g_posted[0].bytes, "0123");

  EXPECT_EQ(g_posted[1].wr.opcode, IBV_WR_SEND_WITH_IMM);
  EXPECT_EQ(g_posted[1].wr.imm_data, htonl(0xfeed));
  EXPECT_TRUE(g_posted[1].wr.send_flags & IBV_SEND_INLINE);
  EXPECT_EQ(g_posted[1].bytes, "inline!");

  EXPECT_EQ(g_posted[2].wr.opcode, IBV_WR_ATOMIC_FETCH_AND_ADD);
  EXPECT_EQ(g_posted[2].wr.wr.atomic.compare_add, 5u);
  EXPECT_EQ(g_posted[2].wr.wr.atomic.rkey, 0x99u);
  EXPECT_EQ(g_posted[2].bytes, "01ab");
}

TEST_F(QpEx, AbortPostsNothing) {
  ASSERT_EQ(verbs::init_qp_ex_ops(&qp, IBV_QP_EX_WITH_SEND), 0);
  ibv_qp_ex* x = qpx();
  ibv_wr_start(x);
  ibv_wr_send(x);
  ibv_wr_abort(x);
  EXPECT_TRUE(g_posted.empty());
  ibv_wr_start(x);
  ibv_wr_send(x);
  ibv_wr_set_sge(x, 1, reinterpret_cast<uintptr_t>(buf), 1);
  EXPECT_EQ(ibv_wr_complete(x), 0);
  EXPECT_EQ(g_posted.size(), 1u);
}

TEST_F(QpEx, MisuseFailsTheWholeBatch) {
  ASSERT_EQ(verbs::init_qp_ex_ops(&qp, IBV_QP_EX_WITH_SEND), 0);
  ibv_qp_ex* x = qpx();
  ibv_wr_start(x);
  ibv_wr_send(x);
  ibv_wr_rdma_read(x, 1, 2);  // not enabled at creation
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  EXPECT_TRUE(g_posted.empty());

  ibv_wr_start(x);
  ibv_wr_set_sge(x, 1, 2, 3);  // no opcode yet
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  EXPECT_TRUE(g_posted.empty());

  EXPECT_EQ(ibv_wr_complete(x), EINVAL);  // no wr_start
}

TEST_F(QpEx, PostErrorsAreReturned) {
  ASSERT_EQ(verbs::init_qp_ex_ops(&qp, IBV_QP_EX_WITH_SEND), 0);
  g_post_rc = ENOMEM;
  ibv_qp_ex* x = qpx();
  ibv_wr_start(x);
  ibv_wr_send(x);
  EXPECT_EQ(ibv_wr_complete(x), ENOMEM);
}

TEST_F(QpEx, UdAddressAppliesToTheCurrentRequest) {
  ASSERT_EQ(verbs::init_qp_ex_ops(&qp, IBV_QP_EX_WITH_SEND), 0);
  ibv_qp_ex* x = qpx();
  auto* ah = reinterpret_cast<ibv_ah*>(buf);
  ibv_wr_start(x);
  ibv_wr_send(x);
  ibv_wr_set_ud_addr(x, ah, 0x42, 0x11111111);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  ASSERT_EQ(g_posted.size(), 1u);
  EXPECT_EQ(g_posted[0].wr.wr.ud.ah, ah);
  EXPECT_EQ(g_posted[0].wr.wr.ud.remote_qpn, 0x42u);
  EXPECT_EQ(g_posted[0].wr.wr.ud.remote_qkey, 0x11111111u);
}

TEST_F(QpEx, AtomicWriteHasNoSendWrFormAndIsRefused) {
  EXPECT_EQ(verbs::init_qp_ex_ops(&qp, IBV_QP_EX_WITH_ATOMIC_WRITE), EOPNOTSUPP);
  EXPECT_EQ(qpx(), nullptr);
}

}  // namespace
