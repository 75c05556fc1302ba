// mlx5 provider: the posting verbs. Each writes its WQEs (wqe.cpp), then publishes the producer
// counter in the doorbell record; sends then ring the UAR doorbell with the last WQE's first 8
// bytes (PRM "Send Doorbell"; rdma-core qp.c post_send_db). No call into the driver.
#include "providers/mlx5/byte_order.h"
#include <errno.h>
#include <string.h>

#include "mlx5/prm/doorbell.h"
#include "providers/mlx5/mlx5.h"

namespace melon::mlx5prov {

int mlx5_post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Mlx5Qp* qp = Mlx5Qp::from(ibqp);
  int err = 0;
  unsigned n = 0;
  std::lock_guard<std::mutex> lock(qp->sq_mu);
  for (; wr; wr = wr->next, n++) {
    const uint8_t* av = nullptr;
    if (ibqp->qp_type == IBV_QPT_UD) {
      ibv_ah* ah = wr->wr.ud.ah;
      if (!ah || ah->context != ibqp->context) {
        err = EINVAL;
        break;
      }
      av = reinterpret_cast<Mlx5Ah*>(ah)->av;
    }
    if ((err = write_send_wqe(qp->sq, *wr, av))) break;
  }
  if (err && bad) *bad = wr;
  if (n) qp->ctx->send_doorbell(qp);
  return err;
}

void Mlx5Context::send_doorbell(Mlx5Qp* qp) {
  std::lock_guard<std::mutex> lock(uar_mu_);
  auto* reg = reinterpret_cast<volatile uint64_t*>(static_cast<uint8_t*>(uar_map_.addr) + bf_offset_);
  uint64_t v = mlx5prov::ring_send_doorbell(qp->sq, &qp->dbrec[mlx5::prm::kSndDbrIndex], reg);
  t_->kick(uar_.handle, bf_offset_, v);
  // Alternate between the UAR's two BlueFlame buffers, as rdma-core does with a shared bfreg
  // (bf->offset ^= buf_size): consecutive doorbells never land on the same buffer.
  if (uar_.bf_bytes) bf_offset_ ^= uar_.bf_bytes;
}

int mlx5_post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Mlx5Qp* qp = Mlx5Qp::from(ibqp);
  if (ibqp->srq) {
    if (bad) *bad = wr;
    return EINVAL;  // receives go to the SRQ
  }
  int err = 0;
  unsigned n = 0;
  std::lock_guard<std::mutex> lock(qp->rq_mu);
  for (; wr; wr = wr->next, n++)
    if ((err = write_recv_wqe(qp->rq, *wr))) break;
  if (err && bad) *bad = wr;
  if (n) {
    ring_recv_doorbell(qp->rq.head, &qp->dbrec[mlx5::prm::kRcvDbrIndex]);
  }
  return err;
}

int mlx5_post_srq_recv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Mlx5Srq* srq = Mlx5Srq::from(ibsrq);
  int err = 0;
  unsigned n = 0;
  std::lock_guard<std::mutex> lock(srq->mu);
  for (; wr; wr = wr->next, n++)
    if ((err = write_srq_wqe(srq->q, *wr))) break;
  if (err && bad) *bad = wr;
  if (n) {
    ring_recv_doorbell(srq->q.counter, &srq->dbrec[0]);
  }
  return err;
}

}  // namespace melon::mlx5prov
