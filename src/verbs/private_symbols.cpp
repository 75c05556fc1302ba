// The IBVERBS_PRIVATE_<N> node (linked into the shared library only).
//
// ibv_devinfo imports ibv_query_gid_type from it. Its definition carries an explicit default
// version on an internal name; a plain definition left for the version script to version would
// lose its "@@" as soon as an alias for another private ABI number is added (GNU ld symbol
// versioning; rdma-core's libibverbs.map.in keeps one default private node the same way).
//
// With MELON_IBVERBS_PRIVATE_STUBS the node also holds the rest of rdma-core's private ABI as
// stubs (what Debian 12's libmlx5.so.1 and libefa.so.1 import, nm -D --undefined-only): if a
// stock provider library (libmlx5.so.1, libefa.so.1, ...) is ever loaded next to us, it links
// under BIND_NOW, its constructor's verbs_register_driver_<N> call is ignored, and any ibv_cmd_* it
// might call fails with EOPNOTSUPP instead of reaching a kernel that is not there.
#include "verbs/pabi_config.h"

#include "abi/gen/ibverbs_prototypes.h"

#include <cerrno>
#include <type_traits>

#define MELON_STR2(x) #x
#define MELON_STR(x) MELON_STR2(x)

extern "C" int melon_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                                    ibv_gid_type_sysfs* type);

// ELF only: .symver and the alias attribute have no Mach-O counterpart (no symbol versions, no
// aliases), so on macOS the private ABI's one function is exported under its own name.
#if defined(__ELF__)
extern "C" __attribute__((visibility("default"))) int melon_pabi_query_gid_type(ibv_context* context, uint8_t port_num,
                                                                                unsigned int index,
                                                                                ibv_gid_type_sysfs* type) {
  return melon_query_gid_type(context, port_num, index, type);
}
__asm__(".symver melon_pabi_query_gid_type, ibv_query_gid_type@@IBVERBS_PRIVATE_" MELON_STR(MELON_IBVERBS_PABI));
// The alias carries rdma-core's prototype (driver.h) although it is defined under another name.
static_assert(std::is_same_v<decltype(melon_pabi_query_gid_type), decltype(ibv_query_gid_type)>);

// Extra private ABI numbers (other distributions): non-default aliases of the same function.
#define MELON_PABI_ALIAS(n)                                                                                         \
  extern "C"                                                                                                        \
      __attribute__((visibility("default"), alias("melon_pabi_query_gid_type"))) int melon_pabi_query_gid_type_##n( \
          ibv_context*, uint8_t, unsigned int, ibv_gid_type_sysfs*);                                                \
  __asm__(".symver melon_pabi_query_gid_type_" #n ", ibv_query_gid_type@IBVERBS_PRIVATE_" #n);                      \
  static_assert(std::is_same_v<decltype(melon_pabi_query_gid_type_##n), decltype(ibv_query_gid_type)>);
MELON_IBVERBS_EXTRA_PABI_LIST(MELON_PABI_ALIAS)
#else
extern "C" __attribute__((visibility("default"))) int ibv_query_gid_type(ibv_context* context, uint8_t port_num,
                                                                         unsigned int index, ibv_gid_type_sysfs* type) {
  return melon_query_gid_type(context, port_num, index, type);
}
#endif

#if MELON_IBVERBS_PRIVATE_STUBS
#define MELON_PRIV_ERRNO(name, params)                                \
  extern "C" __attribute__((visibility("default"))) int name params { \
    errno = EOPNOTSUPP;                                               \
    return EOPNOTSUPP;                                                \
  }
#define MELON_PRIV_COUNT(name, params)                                \
  extern "C" __attribute__((visibility("default"))) int name params { \
    errno = EOPNOTSUPP;                                               \
    return -1;                                                        \
  }
#define MELON_PRIV_POST(name, params) MELON_PRIV_POST_(name, MELON_PRIV_UNPACK params)
#define MELON_PRIV_UNPACK(a, b, c) a, b, c
#define MELON_PRIV_POST_(name, ...) MELON_PRIV_POST__(name, __VA_ARGS__)
#define MELON_PRIV_POST__(name, queue, wr, bad)                                             \
  extern "C" __attribute__((visibility("default"))) int name(queue, wr first, bad bad_wr) { \
    if (bad_wr) *bad_wr = first;                                                            \
    errno = EOPNOTSUPP;                                                                     \
    return EOPNOTSUPP;                                                                      \
  }
#define MELON_PRIV_NULL(name, type, params)                            \
  extern "C" __attribute__((visibility("default"))) type name params { \
    errno = EOPNOTSUPP;                                                \
    return nullptr;                                                    \
  }
#define MELON_PRIV_VOID(name, params) \
  extern "C" __attribute__((visibility("default"))) void name params {}
#define MELON_PRIV_CUSTOM(name)
#include "verbs/private_stubs.inc"

// The attribute count a command buffer needs, links included (cmd_ioctl.h). Only a stock
// provider building a command calls it, and our execute_ioctl fails before linking buffers, so the
// caller's own count is the whole answer.
extern "C" __attribute__((visibility("default"))) unsigned int __ioctl_final_num_attrs(unsigned int num_attrs,
                                                                                       ibv_command_buffer*) {
  return num_attrs;
}

// A data object in rdma-core (a bool), and must stay one: importers copy-relocate it.
extern "C" __attribute__((visibility("default"))) bool verbs_allow_disassociate_destroy = false;
#endif
