// libefa.so.1: the efadv_* entry points of rdma-core v44's EFA provider. No device of ours is an
// EFA one, so every one fails as src/providers/unsupported.h describes. The library exists so that
// programs linked against it (perftest, libfabric, pyverbs) load without rdma-core's own libefa,
// which would register itself through rdma-core's private ABI.
#include "abi/gen/efadv_prototypes.h"
#include "providers/unsupported.h"

MELON_DV_NULL(struct ibv_qp*, efadv_create_driver_qp, (struct ibv_pd*, struct ibv_qp_init_attr*, uint32_t))
MELON_DV_NULL(struct ibv_qp*, efadv_create_qp_ex,
              (struct ibv_context*, struct ibv_qp_init_attr_ex*, struct efadv_qp_init_attr*, uint32_t))
MELON_DV_ERRNO(efadv_query_device, (struct ibv_context*, struct efadv_device_attr*, uint32_t))
MELON_DV_ERRNO(efadv_query_ah, (struct ibv_ah*, struct efadv_ah_attr*, uint32_t))
MELON_DV_NULL(struct ibv_cq_ex*, efadv_create_cq,
              (struct ibv_context*, struct ibv_cq_init_attr_ex*, struct efadv_cq_init_attr*, uint32_t))
// rdma-core returns the EFA part of an EFA CQ; a CQ of ours has none.
MELON_DV_NULL(struct efadv_cq*, efadv_cq_from_ibv_cq_ex, (struct ibv_cq_ex*))
