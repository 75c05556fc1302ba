// A minimal libmlx5.so.1. The stock perftest binaries are linked against libmlx5.so.1 (and call
// mlx5dv_* only with -c DC or --aes_xts). Shipping this one next to our libibverbs.so.1 keeps the
// stock libmlx5 out of the process: it would register itself through rdma-core's private ABI and
// its mlx5dv_* functions would treat our contexts as mlx5 ones (rdma-core-abi.md §1.5, §7.4).
// Every function fails with EOPNOTSUPP; the ConnectX provider will replace this library.
#include <cerrno>

#define MELON_STUB_PTR(name)                                       \
  extern "C" __attribute__((visibility("default"))) void* name() { \
    errno = EOPNOTSUPP;                                            \
    return nullptr;                                                \
  }
#define MELON_STUB_INT(name)                                     \
  extern "C" __attribute__((visibility("default"))) int name() { \
    errno = EOPNOTSUPP;                                          \
    return EOPNOTSUPP;                                           \
  }

MELON_STUB_PTR(mlx5dv_create_qp)  // MLX5_1.3: struct ibv_qp *
MELON_STUB_PTR(mlx5dv_open_device)  // MLX5_1.7: struct ibv_context *
MELON_STUB_INT(mlx5dv_devx_general_cmd)  // MLX5_1.7
MELON_STUB_PTR(mlx5dv_create_mkey)  // MLX5_1.10: struct mlx5dv_mkey *
MELON_STUB_INT(mlx5dv_destroy_mkey)  // MLX5_1.10
MELON_STUB_PTR(mlx5dv_qp_ex_from_ibv_qp_ex)  // MLX5_1.10: struct mlx5dv_qp_ex *
MELON_STUB_INT(mlx5dv_crypto_login)  // MLX5_1.21
MELON_STUB_PTR(mlx5dv_dek_create)  // MLX5_1.21: struct mlx5dv_dek *
MELON_STUB_INT(mlx5dv_dek_destroy)  // MLX5_1.21

// bool mlx5dv_is_supported(struct ibv_device *): never one of ours.
extern "C" __attribute__((visibility("default"))) bool mlx5dv_is_supported(void*) { return false; }
