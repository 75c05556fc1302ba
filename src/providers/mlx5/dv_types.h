// The direct-verbs structures libmlx5.so.1 fills for the mlx5 provider's objects, with rdma-core's
// names and layout (<infiniband/mlx5dv.h>, v44; tests/providers/mlx5/dv_layout_test.cpp compares
// every offset), and the requests libmlx5.so.1 sends the provider through ContextOps::direct().
// Only the leading fields of mlx5dv_context are declared: the provider answers none of the
// optional ones (comp_mask 0), so nothing past them is ever written.
#pragma once

#include <stdint.h>
#include <sys/types.h>

struct ibv_qp;
struct ibv_cq;
struct ibv_srq;
struct ibv_wq;
struct ibv_dm;
struct ibv_ah;
struct ibv_pd;
struct mlx5dv_rwq;
struct mlx5dv_dm;
struct mlx5dv_ah;
struct mlx5dv_pd;

struct mlx5dv_context {
  uint8_t version;
  uint64_t flags;
  uint64_t comp_mask;  // in: the optional fields asked for; out: those filled (none)
};

// mlx5dv_create_cq / mlx5dv_create_qp extras: only their comp_mask is read (0: nothing extra asked).
struct mlx5dv_cq_init_attr {
  uint64_t comp_mask;
};
struct mlx5dv_qp_init_attr {
  uint64_t comp_mask;
};

struct mlx5dv_qp {
  uint32_t* dbrec;  // __be32[2]: receive, send
  struct {
    void* buf;
    uint32_t wqe_cnt;
    uint32_t stride;
  } sq;
  struct {
    void* buf;
    uint32_t wqe_cnt;
    uint32_t stride;
  } rq;
  struct {
    void* reg;
    uint32_t size;
  } bf;
  uint64_t comp_mask;
  off_t uar_mmap_offset;
  uint32_t tirn, tisn, rqn, sqn;
  uint64_t tir_icm_addr;
};

struct mlx5dv_cq {
  void* buf;
  uint32_t* dbrec;
  uint32_t cqe_cnt;
  uint32_t cqe_size;
  void* cq_uar;
  uint32_t cqn;
  uint64_t comp_mask;
};

struct mlx5dv_srq {
  void* buf;
  uint32_t* dbrec;
  uint32_t stride;
  uint32_t head;
  uint32_t tail;
  uint64_t comp_mask;
  uint32_t srqn;
};

struct mlx5dv_obj {
  struct {
    struct ibv_qp* in;
    struct mlx5dv_qp* out;
  } qp;
  struct {
    struct ibv_cq* in;
    struct mlx5dv_cq* out;
  } cq;
  struct {
    struct ibv_srq* in;
    struct mlx5dv_srq* out;
  } srq;
  struct {
    struct ibv_wq* in;
    struct mlx5dv_rwq* out;
  } rwq;
  struct {
    struct ibv_dm* in;
    struct mlx5dv_dm* out;
  } dm;
  struct {
    struct ibv_ah* in;
    struct mlx5dv_ah* out;
  } ah;
  struct {
    struct ibv_pd* in;
    struct mlx5dv_pd* out;
  } pd;
};

namespace melon::mlx5prov {

// mlx5dv_init_obj's type bits (rdma-core enum mlx5dv_obj_type).
enum : uint64_t {
  kDvObjQp = 1 << 0,
  kDvObjCq = 1 << 1,
  kDvObjSrq = 1 << 2,
  kDvObjRwq = 1 << 3,
  kDvObjDm = 1 << 4,
  kDvObjAh = 1 << 5,
  kDvObjPd = 1 << 6
};

// ContextOps::direct() requests: (in, out).
enum DvRequest : uint32_t {
  kDvQueryDevice = 1,  // (nullptr, mlx5dv_context*)
  kDvQp = 2,  // (ibv_qp*, mlx5dv_qp*)
  kDvCq = 3,  // (ibv_cq*, mlx5dv_cq*)
  kDvSrq = 4,  // (ibv_srq*, mlx5dv_srq*)
};

}  // namespace melon::mlx5prov
