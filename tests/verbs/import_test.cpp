// ibv_context::cmd_fd is a real descriptor (dup, poll, close with the context) and
// ibv_import_device() on a duplicate of it gives a second context sharing the first one's
// provider context, as rdma-core's does with the uverbs descriptor (issue 8 item 6).
#include <infiniband/verbs.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace {

class Import : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    setenv("MELON_SOFT_DEVICES", "imp0=127.0.9.2", 1);
    list = ibv_get_device_list(nullptr);
    ASSERT_NE(list, nullptr);
    ASSERT_NE(list[0], nullptr);
    ctx = ibv_open_device(list[0]);
    ASSERT_NE(ctx, nullptr);
  }
  void TearDown() override {
    if (ctx) EXPECT_EQ(ibv_close_device(ctx), 0);
    ibv_free_device_list(list);
  }
  static bool open_fd(int fd) { return fcntl(fd, F_GETFD) != -1; }

  ibv_device** list = nullptr;
  ibv_context* ctx = nullptr;
};

TEST_F(Import, CmdFdIsARealDescriptorClosedWithTheContext) {
  int fd = ctx->cmd_fd;
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(open_fd(fd));
  EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  EXPECT_NE(fd, ctx->async_fd);
  int d = dup(fd);  // pyverbs: os.dup(ctx.cmd_fd)
  ASSERT_GE(d, 0);
  EXPECT_EQ(close(d), 0);
  ibv_context* other = ibv_open_device(list[0]);
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->cmd_fd, fd);  // one per context
  EXPECT_EQ(ibv_close_device(other), 0);
  ASSERT_EQ(ibv_close_device(ctx), 0);
  ctx = nullptr;
  errno = 0;
  EXPECT_FALSE(open_fd(fd));  // closed with its context (nothing else opens files meanwhile)
  EXPECT_EQ(errno, EBADF);
}

TEST_F(Import, ImportedContextSharesTheOriginalsObjects) {
  int d = dup(ctx->cmd_fd);
  ASSERT_GE(d, 0);
  ibv_context* imp = ibv_import_device(d);
  ASSERT_NE(imp, nullptr);
  EXPECT_NE(imp, ctx);
  EXPECT_EQ(imp->cmd_fd, d);  // the descriptor passed in now belongs to the imported context
  EXPECT_EQ(imp->device, ctx->device);
  EXPECT_EQ(imp->async_fd, ctx->async_fd);
  ibv_device_attr a{}, b{};
  ASSERT_EQ(ibv_query_device(ctx, &a), 0);
  ASSERT_EQ(ibv_query_device(imp, &b), 0);
  EXPECT_EQ(a.node_guid, b.node_guid);

  // A PD of the original, a CQ of the import, and a QP joining them through the import.
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(imp, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  static char buf[4096];
  ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 2;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);

  // Closing the original first leaves everything usable through the import.
  ASSERT_EQ(ibv_close_device(ctx), 0);
  ctx = nullptr;
  ibv_port_attr pa{};
  EXPECT_EQ(ibv_query_port(imp, 1, &pa), 0);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
  EXPECT_EQ(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(imp), 0);
  EXPECT_FALSE(open_fd(d));
}

TEST_F(Import, ForeignDescriptorsAndObjectHandlesAreRefused) {
  errno = 0;
  EXPECT_EQ(ibv_import_device(-1), nullptr);
  EXPECT_EQ(errno, EBADF);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(p[0]), nullptr);  // a descriptor, but no context's
  EXPECT_EQ(errno, EINVAL);
  close(p[0]);
  close(p[1]);
  // A PD or MR handle that names nothing is EINVAL; device memory is not importable (EOPNOTSUPP).
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(ctx, pd->handle + 0x10000), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(pd, 0xabcdef), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(nullptr, pd->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(ctx, 1), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
