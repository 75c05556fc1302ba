// libmlx5.so.1: the mlx5dv_* entry points through which an application finds out whether a device
// is an mlx5 one and reaches its queues directly. For mlx5_0 (src/providers/mlx5, compiled into our
// libibverbs.so.1) mlx5dv_query_device and mlx5dv_init_obj answer through the context's
// ContextOps::direct() (a virtual call: no symbol beyond rdma-core's exports crosses the two
// libraries); every other device answers "not mlx5" (EOPNOTSUPP).
//
// Shipping this library next to our libibverbs.so.1 keeps rdma-core's own libmlx5 out of the
// process (perftest, UCX, libfabric and pyverbs link it): it would register itself through
// rdma-core's private ABI and treat our contexts as its own.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "providers/mlx5/dv_types.h"  // completes struct mlx5dv_context / mlx5dv_obj (rdma-core layout)
#include "abi/gen/mlx5dv_prototypes.h"
#include "providers/unsupported.h"
#include "verbs/provider.h"

namespace {
namespace mp = melon::mlx5prov;

// The provider behind a context (every context comes from our libibverbs).
melon::verbs::ContextOps* ops_of(ibv_context* ctx) { return ctx ? melon::verbs::ContextBase::from(ctx)->ops : nullptr; }
int fail(int e) {
  errno = e;
  return e;
}
}  // namespace

// Our mlx5 provider names its devices mlx5_<n>; no other provider of ours uses that prefix.
MELON_DV_EXPORT bool mlx5dv_is_supported(struct ibv_device* device) {
  return device && std::strncmp(device->name, "mlx5_", 5) == 0;
}
MELON_DV_NULL(struct ibv_context*, mlx5dv_open_device, (struct ibv_device*, struct mlx5dv_context_attr*))

MELON_DV_EXPORT int mlx5dv_query_device(struct ibv_context* ctx, struct mlx5dv_context* attrs) {
  melon::verbs::ContextOps* ops = ops_of(ctx);
  if (!ops || !attrs) return fail(EINVAL);
  if (int e = ops->direct(mp::kDvQueryDevice, nullptr, attrs)) return fail(e);
  return 0;
}

namespace {
// An mlx5 context (one whose provider answers the direct-verbs query), else nullptr with errno set.
verbs_context* mlx5_context(ibv_context* ctx) {
  melon::verbs::ContextOps* ops = ops_of(ctx);
  mlx5dv_context probe{};
  if (!ops || ops->direct(mp::kDvQueryDevice, nullptr, &probe) != 0) {
    errno = ops ? EOPNOTSUPP : EINVAL;
    return nullptr;
  }
  return &melon::verbs::ContextBase::from(ctx)->vctx;
}
}  // namespace

// The plain creation verbs when nothing mlx5-specific is asked for (no CQE compression or size,
// no DC, no creation flags, no mlx5 send ops): called through the context's own slots, as the
// inline ibv_create_*_ex wrappers do.
MELON_DV_EXPORT struct ibv_cq_ex* mlx5dv_create_cq(struct ibv_context* ctx, struct ibv_cq_init_attr_ex* attr,
                                                   struct mlx5dv_cq_init_attr* mlx5_attr) {
  verbs_context* v = mlx5_context(ctx);
  if (!v) return nullptr;
  if (!attr) return errno = EINVAL, nullptr;
  if (mlx5_attr && mlx5_attr->comp_mask) return errno = EOPNOTSUPP, nullptr;
  return v->create_cq_ex(ctx, attr);
}

MELON_DV_EXPORT struct ibv_qp* mlx5dv_create_qp(struct ibv_context* ctx, struct ibv_qp_init_attr_ex* attr,
                                                struct mlx5dv_qp_init_attr* mlx5_attr) {
  verbs_context* v = mlx5_context(ctx);
  if (!v) return nullptr;
  if (!attr) return errno = EINVAL, nullptr;
  if (mlx5_attr && mlx5_attr->comp_mask) return errno = EOPNOTSUPP, nullptr;
  return v->create_qp_ex(ctx, attr);
}

namespace {
// rdma-core's mlx5dv_init_obj: every object the type bits name, in order; the first failure ends it.
int init_obj(struct mlx5dv_obj* obj, uint64_t type) {
  if (!obj) return fail(EINVAL);
  if (type & ~(mp::kDvObjQp | mp::kDvObjCq | mp::kDvObjSrq)) return fail(EOPNOTSUPP);  // RWQ, DM, AH, PD
  struct Item {
    uint64_t bit;
    mp::DvRequest req;
    ibv_context* ctx;
    void* in;
    void* out;
  };
  const Item items[] = {
      {mp::kDvObjQp, mp::kDvQp, obj->qp.in ? obj->qp.in->context : nullptr, obj->qp.in, obj->qp.out},
      {mp::kDvObjCq, mp::kDvCq, obj->cq.in ? obj->cq.in->context : nullptr, obj->cq.in, obj->cq.out},
      {mp::kDvObjSrq, mp::kDvSrq, obj->srq.in ? obj->srq.in->context : nullptr, obj->srq.in, obj->srq.out},
  };
  for (const Item& it : items) {
    if (!(type & it.bit)) continue;
    melon::verbs::ContextOps* ops = ops_of(it.ctx);
    if (!ops || !it.out) return fail(EINVAL);
    if (int e = ops->direct(it.req, it.in, it.out)) return fail(e);
  }
  return 0;
}
}  // namespace

// mlx5dv_init_obj has two versions in rdma-core v44: the default MLX5_1.2 one and the MLX5_1.0
// one of binaries linked before MLX5_1.2 (the same fields for QP, CQ and SRQ). Both are defined under
// internal names and versioned explicitly; the static_asserts hold them to rdma-core's prototype.
// Mach-O has no symbol versions: there the function is simply exported.
#if defined(__ELF__)
MELON_DV_EXPORT int melon_mlx5dv_init_obj(struct mlx5dv_obj* obj, uint64_t type) { return init_obj(obj, type); }
__asm__(".symver melon_mlx5dv_init_obj, mlx5dv_init_obj@@MLX5_1.2");
MELON_DV_EXPORT __attribute__((alias("melon_mlx5dv_init_obj"))) int melon_mlx5dv_init_obj_1_0(struct mlx5dv_obj*,
                                                                                              uint64_t);
__asm__(".symver melon_mlx5dv_init_obj_1_0, mlx5dv_init_obj@MLX5_1.0");
static_assert(std::is_same_v<decltype(melon_mlx5dv_init_obj), decltype(mlx5dv_init_obj)>);
static_assert(std::is_same_v<decltype(melon_mlx5dv_init_obj_1_0), decltype(mlx5dv_init_obj)>);
#else
MELON_DV_EXPORT int mlx5dv_init_obj(struct mlx5dv_obj* obj, uint64_t type) { return init_obj(obj, type); }
#endif
