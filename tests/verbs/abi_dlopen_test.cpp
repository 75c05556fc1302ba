// The built libibverbs.so.1 as a dynamic loader sees it: symbol versions (including the private
// node's default version: IBVERBS_PABI_VERSION in rdma-core's CMakeLists.txt), and a device found through the exported entry
// points only.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace {

class SharedLibrary : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    setenv("MELON_SOFT_DEVICES", "dl0=127.0.0.2", 1);
    std::string path = std::string(MELON_SHARED_LIB_DIR) + "/libibverbs.so.1";
    h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
  }
  // No dlclose: the library keeps its device registry for the life of the process (apps may
  // hold ibv_device pointers), and unloading it would make that memory look leaked.
  void* h = nullptr;
};

TEST_F(SharedLibrary, SymbolsSitInRdmaCoreVersionNodes) {
  struct {
    const char *sym, *node;
  } rows[] = {
      {"ibv_create_comp_channel", "IBVERBS_1.0"},   {"ibv_read_sysfs_file", "IBVERBS_1.0"},
      {"ibv_get_device_list", "IBVERBS_1.1"},       {"ibv_query_port", "IBVERBS_1.1"},
      {"ibv_get_pkey_index", "IBVERBS_1.5"},        {"ibv_qp_to_qp_ex", "IBVERBS_1.6"},
      {"ibv_reg_mr_iova", "IBVERBS_1.7"},           {"ibv_reg_mr_iova2", "IBVERBS_1.8"},
      {"ibv_get_device_index", "IBVERBS_1.9"},      {"ibv_query_ece", "IBVERBS_1.10"},
      {"_ibv_query_gid_ex", "IBVERBS_1.11"},        {"ibv_reg_dmabuf_mr", "IBVERBS_1.12"},
      {"ibv_is_fork_initialized", "IBVERBS_1.13"},  {"ibv_query_qp_data_in_order", "IBVERBS_1.14"},
      {"ibv_query_gid_type", "IBVERBS_PRIVATE_34"},
  };
  for (auto& r : rows) EXPECT_NE(dlvsym(h, r.sym, r.node), nullptr) << r.sym << "@" << r.node;
  // In the wrong node, a symbol must not resolve (that would hide a packaging error).
  EXPECT_EQ(dlvsym(h, "ibv_reg_mr_iova2", "IBVERBS_1.1"), nullptr);
  EXPECT_EQ(dlvsym(h, "ibv_query_gid_type", "IBVERBS_1.1"), nullptr);
  // The private symbol is the DEFAULT version: an unversioned lookup finds it.
  EXPECT_EQ(dlsym(h, "ibv_query_gid_type"), dlvsym(h, "ibv_query_gid_type", "IBVERBS_PRIVATE_34"));
  // Internal names stay internal.
  EXPECT_EQ(dlsym(h, "melon_query_gid_type"), nullptr);
  EXPECT_EQ(dlsym(h, "melon_pabi_query_gid_type"), nullptr);
}

TEST_F(SharedLibrary, FindsTheConfiguredDevice) {
  using get_list_t = void** (*)(int*);
  using get_name_t = const char* (*)(void*);
  using free_list_t = void (*)(void**);
  auto get_list = reinterpret_cast<get_list_t>(dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1"));
  auto get_name = reinterpret_cast<get_name_t>(dlvsym(h, "ibv_get_device_name", "IBVERBS_1.1"));
  auto free_list = reinterpret_cast<free_list_t>(dlvsym(h, "ibv_free_device_list", "IBVERBS_1.1"));
  ASSERT_TRUE(get_list && get_name && free_list);
  int n = -1;
  void** list = get_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 1);
  EXPECT_STREQ(get_name(list[0]), "dl0");
  free_list(list);
}

TEST_F(SharedLibrary, PrivateStubsLetAStockProviderLink) {
  // What Debian 12's libmlx5.so.1/libefa.so.1 import from the private node (nm -D --undefined-only).
  for (const char* sym : {"verbs_register_driver_34", "ibv_cmd_get_context", "verbs_set_ops",
                          "_verbs_init_and_alloc_context", "verbs_allow_disassociate_destroy"})
    EXPECT_NE(dlvsym(h, sym, "IBVERBS_PRIVATE_34"), nullptr) << sym;
  // Each fails the way rdma-core's does (driver.h prototypes): an errno value from the command
  // wrappers, -1 with errno from the ones that return a count, *bad_wr set by the post calls.
  using cmd_t = int (*)(void*, void*, void*, size_t, void*, size_t);
  auto cmd = reinterpret_cast<cmd_t>(dlvsym(h, "ibv_cmd_alloc_pd", "IBVERBS_PRIVATE_34"));
  ASSERT_NE(cmd, nullptr);
  EXPECT_EQ(cmd(nullptr, nullptr, nullptr, 0, nullptr, 0), EOPNOTSUPP);
  using poll_t = int (*)(void*, int, void*);
  auto poll = reinterpret_cast<poll_t>(dlvsym(h, "ibv_cmd_poll_cq", "IBVERBS_PRIVATE_34"));
  ASSERT_NE(poll, nullptr);
  errno = 0;
  EXPECT_EQ(poll(nullptr, 4, nullptr), -1);  // a count: never a positive errno
  EXPECT_EQ(errno, EOPNOTSUPP);
  using post_t = int (*)(void*, void*, void**);
  auto post = reinterpret_cast<post_t>(dlvsym(h, "ibv_cmd_post_send", "IBVERBS_PRIVATE_34"));
  ASSERT_NE(post, nullptr);
  int wr = 0;
  void* bad = nullptr;
  EXPECT_EQ(post(nullptr, &wr, &bad), EOPNOTSUPP);
  EXPECT_EQ(bad, &wr);
  using read_t = int (*)(char*, size_t, void*, const char*, ...);
  auto read = reinterpret_cast<read_t>(dlvsym(h, "ibv_read_ibdev_sysfs_file", "IBVERBS_PRIVATE_34"));
  ASSERT_NE(read, nullptr);
  char buf[8];
  errno = 0;
  EXPECT_EQ(read(buf, sizeof(buf), nullptr, "%s", "node_type"), -1);  // a length: never a positive errno
  EXPECT_EQ(errno, EOPNOTSUPP);
  using open_t = void* (*)(void*, void*);
  auto open = reinterpret_cast<open_t>(dlvsym(h, "verbs_open_device", "IBVERBS_PRIVATE_34"));
  ASSERT_NE(open, nullptr);
  errno = 0;
  EXPECT_EQ(open(nullptr, nullptr), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(SharedLibrary, SysfsPathIsTheStringLibrdmacmReadsFrom) {
  // librdmacm's rdma_create_event_channel calls it as rdma-core v44 declares it (driver.h):
  // `const char *ibv_get_sysfs_path(void)`, and hands the result to ibv_read_sysfs_file.
  using path_t = const char* (*)(void);
  using read_t = int (*)(const char*, const char*, char*, size_t);
  auto path = reinterpret_cast<path_t>(dlvsym(h, "ibv_get_sysfs_path", "IBVERBS_1.0"));
  auto read = reinterpret_cast<read_t>(dlvsym(h, "ibv_read_sysfs_file", "IBVERBS_1.0"));
  ASSERT_TRUE(path && read);
  const char* root = path();
  ASSERT_NE(root, nullptr);
  EXPECT_STREQ(root, "/melondma/sysfs");
  EXPECT_EQ(path(), root);  // one string for the life of the process
  char buf[64];
  EXPECT_EQ(read(root, "class/infiniband/dl0/node_type", buf, sizeof(buf)), 5);
  EXPECT_STREQ(buf, "1: CA");
  errno = 0;
  EXPECT_EQ(read(root, "class/misc/rdma_cm/abi_version", buf, sizeof(buf)), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST(SharedLibraryVariant, OneDefaultPrivateNodePlusAliases) {
  std::string path = std::string(MELON_PABI_VARIANT_DIR) + "/libibverbs.so.1";
  void* v = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(v, nullptr) << dlerror();
  void* def = dlvsym(v, "ibv_query_gid_type", "IBVERBS_PRIVATE_57");
  ASSERT_NE(def, nullptr);
  EXPECT_NE(dlvsym(v, "ibv_query_gid_type", "IBVERBS_PRIVATE_34"), nullptr);
  EXPECT_NE(dlvsym(v, "ibv_query_gid_type", "IBVERBS_PRIVATE_64"), nullptr);
  EXPECT_EQ(dlvsym(v, "ibv_query_gid_type", "IBVERBS_PRIVATE_59"), nullptr);
  // The unversioned lookup binds the default ("@@") version: it did not get lost.
  EXPECT_EQ(dlsym(v, "ibv_query_gid_type"), def);
  // Built without the private stubs.
  EXPECT_EQ(dlsym(v, "ibv_cmd_alloc_pd"), nullptr);
  EXPECT_NE(dlvsym(v, "ibv_get_device_list", "IBVERBS_1.1"), nullptr);
}

}  // namespace
