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

#include <cerrno>

extern "C" int melon_query_gid_type(struct ibv_context* context, unsigned char port_num, unsigned int index, int* type);

#define MELON_STR2(x) #x
#define MELON_STR(x) MELON_STR2(x)

extern "C" __attribute__((visibility("default"))) int melon_pabi_query_gid_type(struct ibv_context* context,
                                                                                unsigned char port_num,
                                                                                unsigned int index, int* type) {
  return melon_query_gid_type(context, port_num, index, type);
}
__asm__(".symver melon_pabi_query_gid_type, ibv_query_gid_type@@IBVERBS_PRIVATE_" MELON_STR(MELON_IBVERBS_PABI));

// Extra private ABI numbers (other distributions): non-default aliases of the same function.
#define MELON_PABI_ALIAS(n)                                                                                         \
  extern "C"                                                                                                        \
      __attribute__((visibility("default"), alias("melon_pabi_query_gid_type"))) int melon_pabi_query_gid_type_##n( \
          struct ibv_context*, unsigned char, unsigned int, int*);                                                  \
  __asm__(".symver melon_pabi_query_gid_type_" #n ", ibv_query_gid_type@IBVERBS_PRIVATE_" #n);
MELON_IBVERBS_EXTRA_PABI_LIST(MELON_PABI_ALIAS)

#if MELON_IBVERBS_PRIVATE_STUBS
#define MELON_PRIV_INT(name)                                     \
  extern "C" __attribute__((visibility("default"))) int name() { \
    errno = EOPNOTSUPP;                                          \
    return EOPNOTSUPP;                                           \
  }
#define MELON_PRIV_PTR(name)                                       \
  extern "C" __attribute__((visibility("default"))) void* name() { \
    errno = EOPNOTSUPP;                                            \
    return nullptr;                                                \
  }
#define MELON_PRIV_VOID(name) \
  extern "C" __attribute__((visibility("default"))) void name() {}
#include "verbs/private_stubs.inc"

// A data object in rdma-core (a bool), and must stay one: importers copy-relocate it.
extern "C" __attribute__((visibility("default"))) bool verbs_allow_disassociate_destroy = false;
#endif
