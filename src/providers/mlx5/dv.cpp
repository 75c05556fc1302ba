// mlx5 provider: what libmlx5.so.1's mlx5dv_query_device / mlx5dv_init_obj return for mlx5_0's
// objects: the queues this process has mapped (rdma-core providers/mlx5 mlx5dv_init_obj reports
// the same fields of its own queues), so an application can write WQEs and poll CQEs itself.
#include <errno.h>
#include <string.h>

#include "mlx5/prm/cqe.h"
#include "mlx5/prm/wqe.h"
#include "providers/mlx5/dv_types.h"
#include "providers/mlx5/mlx5.h"

namespace melon::mlx5prov {

int Mlx5Context::direct(uint32_t request, void* in, void* out) {
  switch (request) {
    case kDvQueryDevice: {
      auto* c = static_cast<mlx5dv_context*>(out);
      c->version = 0;
      c->flags = 0;  // no CQE compression, no MPW, no enhanced MPW
      c->comp_mask = 0;  // none of the optional fields
      return 0;
    }
    case kDvQp: {
      auto* q = static_cast<ibv_qp*>(in);
      if (q->context != &vctx.context) return EINVAL;
      Mlx5Qp* qp = Mlx5Qp::from(q);
      auto* o = static_cast<mlx5dv_qp*>(out);
      o->dbrec = qp->dbrec;
      o->sq.buf = qp->sq.buf;
      o->sq.wqe_cnt = qp->sq.wqe_cnt;
      o->sq.stride = mlx5::prm::kSendWqeBB;
      o->rq.buf = qp->rq.buf;
      o->rq.wqe_cnt = qp->rq.wqe_cnt;
      o->rq.stride = qp->rq.stride;
      // The send doorbell register; size 0: ring it with the 8-byte doorbell only (no BlueFlame).
      o->bf.reg = static_cast<uint8_t*>(uar_map_.addr) + uar_.db_offset;
      o->bf.size = 0;
      o->comp_mask = 0;  // none of the optional fields (UAR mmap offset, raw QP handles)
      return 0;
    }
    case kDvCq: {
      auto* c = static_cast<ibv_cq*>(in);
      if (c->context != &vctx.context) return EINVAL;
      Mlx5Cq* cq = Mlx5Cq::from(c);
      auto* o = static_cast<mlx5dv_cq*>(out);
      o->buf = cq->ring;
      o->dbrec = cq->dbrec;
      o->cqe_cnt = cq->cqe_cnt;
      o->cqe_size = mlx5::prm::kCqeBytes;
      o->cq_uar = uar_map_.addr;
      o->cqn = cq->cqn;
      o->comp_mask = 0;
      return 0;
    }
    case kDvSrq: {
      auto* s = static_cast<ibv_srq*>(in);
      if (s->context != &vctx.context) return EINVAL;
      Mlx5Srq* srq = Mlx5Srq::from(s);
      auto* o = static_cast<mlx5dv_srq*>(out);
      std::lock_guard<std::mutex> lock(srq->mu);
      o->buf = srq->q.buf;
      o->dbrec = srq->dbrec;
      o->stride = srq->q.stride;
      o->head = srq->q.head;
      o->tail = srq->q.tail;
      o->comp_mask = 0;  // no SRQN (the uapi does not report it)
      return 0;
    }
    default: return EOPNOTSUPP;
  }
}

}  // namespace melon::mlx5prov
