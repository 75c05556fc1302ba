// libmlx5.so.1 and libefa.so.1 as a program loads them: each function on rdma-core v44's node,
// failing the way its contract reports failure (src/providers/unsupported.h), one function per
// kind of failure, through dlvsym exactly as a linked binary would bind it.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <string>

namespace {

void* open_lib(const char* name) {
  std::string path = std::string(MELON_SHARED_LIB_DIR) + "/" + name;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(h, nullptr) << dlerror();
  return h;
}

template <class F>
F sym(void* h, const char* name, const char* node) {
  void* p = dlvsym(h, name, node);
  EXPECT_NE(p, nullptr) << name << "@" << node;
  return reinterpret_cast<F>(p);
}

TEST(Mlx5Library, EachKindOfFailure) {
  void* h = open_lib("libmlx5.so.1");
  ASSERT_NE(h, nullptr);
  auto is_supported = sym<bool (*)(void*)>(h, "mlx5dv_is_supported", "MLX5_1.8");
  auto open_device = sym<void* (*)(void*, void*)>(h, "mlx5dv_open_device", "MLX5_1.7");
  auto query_device = sym<int (*)(void*, void*)>(h, "mlx5dv_query_device", "MLX5_1.0");
  auto get_event = sym<long (*)(void*, void*, size_t)>(h, "mlx5dv_devx_get_event", "MLX5_1.11");
  auto cancel = sym<int (*)(void*, uint64_t)>(h, "mlx5dv_qp_cancel_posted_send_wrs", "MLX5_1.20");
  auto free_var = sym<void (*)(void*)>(h, "mlx5dv_free_var", "MLX5_1.12");
  ASSERT_TRUE(is_supported && open_device && query_device && get_event && cancel && free_var);

  EXPECT_FALSE(is_supported(nullptr));
  errno = 0;
  EXPECT_EQ(open_device(nullptr, nullptr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(query_device(nullptr, nullptr), EINVAL);  // 0 or an errno value; no context names no device
  errno = 0;
  EXPECT_EQ(get_event(nullptr, nullptr, 64), -1);  // a byte count, or -1 with errno
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(cancel(nullptr, 7), -EOPNOTSUPP);  // a count, or -errno
  free_var(nullptr);
}

TEST(Mlx5Library, InitObjHasBothVersions) {
  void* h = open_lib("libmlx5.so.1");
  ASSERT_NE(h, nullptr);
  auto v12 = sym<int (*)(void*, uint64_t)>(h, "mlx5dv_init_obj", "MLX5_1.2");
  auto v10 = sym<int (*)(void*, uint64_t)>(h, "mlx5dv_init_obj", "MLX5_1.0");
  ASSERT_TRUE(v12 && v10);
  EXPECT_EQ(dlsym(h, "mlx5dv_init_obj"), reinterpret_cast<void*>(v12));  // MLX5_1.2 is the default
  EXPECT_EQ(v12(nullptr, 1), EINVAL);  // no object
  EXPECT_EQ(v10(nullptr, 1), EINVAL);
  uint8_t obj[112] = {};  // a struct mlx5dv_obj with nothing in it
  EXPECT_EQ(v12(obj, 1 << 6), EOPNOTSUPP);  // MLX5DV_OBJ_PD: not offered
  EXPECT_EQ(dlsym(h, "melon_mlx5dv_init_obj"), nullptr);  // internal names stay internal
  EXPECT_EQ(dlvsym(h, "mlx5dv_create_qp", "MLX5_1.0"), nullptr);  // MLX5_1.3 only
}

TEST(EfaLibrary, EachFunctionFails) {
  void* h = open_lib("libefa.so.1");
  ASSERT_NE(h, nullptr);
  auto driver_qp = sym<void* (*)(void*, void*, uint32_t)>(h, "efadv_create_driver_qp", "EFA_1.0");
  auto query = sym<int (*)(void*, void*, uint32_t)>(h, "efadv_query_device", "EFA_1.1");
  auto create_cq = sym<void* (*)(void*, void*, void*, uint32_t)>(h, "efadv_create_cq", "EFA_1.2");
  ASSERT_TRUE(driver_qp && query && create_cq);
  errno = 0;
  EXPECT_EQ(driver_qp(nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(query(nullptr, nullptr, 0), EOPNOTSUPP);
  errno = 0;
  EXPECT_EQ(create_cq(nullptr, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

}  // namespace
