// libmlx5.so.1: the mlx5dv_* entry points through which an application finds out whether a device
// is an mlx5 one and reaches its queues directly. No device of ours is one yet (the soft provider
// is not), so they answer "not mlx5"; the ConnectX provider will implement them here.
//
// Shipping this library next to our libibverbs.so.1 keeps rdma-core's own libmlx5 out of the
// process (perftest, UCX, libfabric and pyverbs link it): it would register itself through
// rdma-core's private ABI and treat our contexts as its own.
#include <cstdint>
#include <type_traits>

#include "abi/gen/mlx5dv_prototypes.h"
#include "providers/unsupported.h"

MELON_DV_FALSE(mlx5dv_is_supported, (struct ibv_device*))
MELON_DV_NULL(struct ibv_context*, mlx5dv_open_device, (struct ibv_device*, struct mlx5dv_context_attr*))
MELON_DV_ERRNO(mlx5dv_query_device, (struct ibv_context*, struct mlx5dv_context*))
MELON_DV_NULL(struct ibv_cq_ex*, mlx5dv_create_cq,
              (struct ibv_context*, struct ibv_cq_init_attr_ex*, struct mlx5dv_cq_init_attr*))
MELON_DV_NULL(struct ibv_qp*, mlx5dv_create_qp,
              (struct ibv_context*, struct ibv_qp_init_attr_ex*, struct mlx5dv_qp_init_attr*))

// mlx5dv_init_obj has two versions in rdma-core v44: the default MLX5_1.2 one and the MLX5_1.0
// one of binaries linked before MLX5_1.2. Both are defined under internal names and versioned
// explicitly; the static_asserts hold them to rdma-core's prototype. Mach-O has no symbol
// versions: there the function is simply exported.
#if defined(__ELF__)
MELON_DV_EXPORT int melon_mlx5dv_init_obj(struct mlx5dv_obj*, uint64_t) {
  errno = EOPNOTSUPP;
  return EOPNOTSUPP;
}
__asm__(".symver melon_mlx5dv_init_obj, mlx5dv_init_obj@@MLX5_1.2");
MELON_DV_EXPORT __attribute__((alias("melon_mlx5dv_init_obj"))) int melon_mlx5dv_init_obj_1_0(struct mlx5dv_obj*,
                                                                                              uint64_t);
__asm__(".symver melon_mlx5dv_init_obj_1_0, mlx5dv_init_obj@MLX5_1.0");
static_assert(std::is_same_v<decltype(melon_mlx5dv_init_obj), decltype(mlx5dv_init_obj)>);
static_assert(std::is_same_v<decltype(melon_mlx5dv_init_obj_1_0), decltype(mlx5dv_init_obj)>);
#else
MELON_DV_ERRNO(mlx5dv_init_obj, (struct mlx5dv_obj*, uint64_t))
#endif
