// Our mlx5dv structures (src/providers/mlx5/dv_types.h) against rdma-core's <infiniband/mlx5dv.h>:
// every field we declare sits where rdma-core's does, with its size.
#include <gtest/gtest.h>
#include <infiniband/mlx5dv.h>

#include <cstddef>

namespace ours {
#include "providers/mlx5/dv_types.h"
}

namespace {

#define SAME(type, field)                                                    \
  EXPECT_EQ(offsetof(ours::type, field), offsetof(::type, field)) << #field; \
  EXPECT_EQ(sizeof(ours::type::field), sizeof(::type::field)) << #field

TEST(Mlx5DvLayout, QpCqSrqAndObjMatchRdmaCore) {
  SAME(mlx5dv_qp, dbrec);
  SAME(mlx5dv_qp, sq);
  SAME(mlx5dv_qp, rq);
  SAME(mlx5dv_qp, bf);
  SAME(mlx5dv_qp, comp_mask);
  SAME(mlx5dv_qp, uar_mmap_offset);
  SAME(mlx5dv_qp, sqn);
  SAME(mlx5dv_qp, tir_icm_addr);
  EXPECT_EQ(sizeof(ours::mlx5dv_qp), sizeof(::mlx5dv_qp));
  SAME(mlx5dv_cq, buf);
  SAME(mlx5dv_cq, dbrec);
  SAME(mlx5dv_cq, cqe_cnt);
  SAME(mlx5dv_cq, cqe_size);
  SAME(mlx5dv_cq, cq_uar);
  SAME(mlx5dv_cq, cqn);
  SAME(mlx5dv_cq, comp_mask);
  EXPECT_EQ(sizeof(ours::mlx5dv_cq), sizeof(::mlx5dv_cq));
  SAME(mlx5dv_srq, buf);
  SAME(mlx5dv_srq, dbrec);
  SAME(mlx5dv_srq, stride);
  SAME(mlx5dv_srq, head);
  SAME(mlx5dv_srq, tail);
  SAME(mlx5dv_srq, comp_mask);
  SAME(mlx5dv_srq, srqn);
  EXPECT_EQ(sizeof(ours::mlx5dv_srq), sizeof(::mlx5dv_srq));
  SAME(mlx5dv_obj, qp);
  SAME(mlx5dv_obj, cq);
  SAME(mlx5dv_obj, srq);
  SAME(mlx5dv_obj, rwq);
  SAME(mlx5dv_obj, dm);
  SAME(mlx5dv_obj, ah);
  SAME(mlx5dv_obj, pd);
  EXPECT_EQ(sizeof(ours::mlx5dv_obj), sizeof(::mlx5dv_obj));
  SAME(mlx5dv_cq_init_attr, comp_mask);
  SAME(mlx5dv_qp_init_attr, comp_mask);
  SAME(mlx5dv_context, version);
  SAME(mlx5dv_context, flags);
  SAME(mlx5dv_context, comp_mask);
  EXPECT_EQ(uint64_t(ours::melon::mlx5prov::kDvObjQp), uint64_t(MLX5DV_OBJ_QP));
  EXPECT_EQ(uint64_t(ours::melon::mlx5prov::kDvObjCq), uint64_t(MLX5DV_OBJ_CQ));
  EXPECT_EQ(uint64_t(ours::melon::mlx5prov::kDvObjSrq), uint64_t(MLX5DV_OBJ_SRQ));
  EXPECT_EQ(uint64_t(ours::melon::mlx5prov::kDvObjPd), uint64_t(MLX5DV_OBJ_PD));
}

}  // namespace
