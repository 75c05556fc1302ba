// A minimal libefa.so.1 (see mlx5_stub.cpp): the stock perftest binaries link it, and call
// efadv_* only for EFA devices or -c SRD.
#include <cerrno>

// struct ibv_qp *efadv_create_qp_ex(...)
extern "C" __attribute__((visibility("default"))) void* efadv_create_qp_ex() {
  errno = EOPNOTSUPP;
  return nullptr;
}

// int efadv_query_device(...)
extern "C" __attribute__((visibility("default"))) int efadv_query_device() { return EOPNOTSUPP; }
