// Definitions of provider entry points (mlx5dv_*, efadv_*) that our stack does not implement.
// Each fails the way its rdma-core v44 contract reports failure, i.e. what rdma-core itself answers
// for a device without the operation (mlx5dv.h, efadv.h and their man pages):
//   MELON_DV_NULL      pointer result: NULL with errno EOPNOTSUPP
//   MELON_DV_ERRNO     int result that is 0 or an errno value: EOPNOTSUPP (errno set as well)
//   MELON_DV_NEG_ERRNO int result that is a count or -errno: -EOPNOTSUPP
//   MELON_DV_MINUS1    a length or a descriptor, or -1 with errno: -1, errno EOPNOTSUPP
//   MELON_DV_FALSE     a capability question: false
//   MELON_DV_VOID      nothing to report (the object it releases can never have been made)
// The parameter lists are checked against rdma-core's prototypes by the generated header the
// including file includes first (src/abi/gen/*_prototypes.h): a mismatch does not compile.
#pragma once

#include <cerrno>

#define MELON_DV_EXPORT extern "C" __attribute__((visibility("default")))

#define MELON_DV_NULL(type, name, params) \
  MELON_DV_EXPORT type name params {      \
    errno = EOPNOTSUPP;                   \
    return nullptr;                       \
  }
#define MELON_DV_ERRNO(name, params) \
  MELON_DV_EXPORT int name params {  \
    errno = EOPNOTSUPP;              \
    return EOPNOTSUPP;               \
  }
#define MELON_DV_NEG_ERRNO(name, params) \
  MELON_DV_EXPORT int name params {      \
    errno = EOPNOTSUPP;                  \
    return -EOPNOTSUPP;                  \
  }
#define MELON_DV_MINUS1(type, name, params) \
  MELON_DV_EXPORT type name params {        \
    errno = EOPNOTSUPP;                     \
    return -1;                              \
  }
#define MELON_DV_FALSE(name, params) \
  MELON_DV_EXPORT bool name params { return false; }
#define MELON_DV_VOID(name, params) \
  MELON_DV_EXPORT void name params {}
