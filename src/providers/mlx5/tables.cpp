#include "providers/mlx5/tables.h"

#include <errno.h>

#include "mlx5/prm/cqe.h"
#include "mlx5/prm/wqe.h"

namespace melon::mlx5prov {

namespace {
namespace w = mlx5::prm::wqe_opcode;
namespace s = mlx5::prm::cqe_syndrome;

constexpr uint8_t kRcUc = kOnRc | kOnUc;
constexpr uint8_t kAll = kOnRc | kOnUc | kOnUd;

// Indexed by ibv_wr_opcode (IBV_WR_RDMA_WRITE 0 ... IBV_WR_SEND_WITH_INV 9 are the ones we post).
constexpr SendOp kSendOps[] = {
    /* IBV_WR_RDMA_WRITE          */ {w::RDMA_WRITE, true, false, 0, kRcUc, IBV_WC_RDMA_WRITE, true},
    /* IBV_WR_RDMA_WRITE_WITH_IMM */ {w::RDMA_WRITE_IMM, true, false, 1, kRcUc, IBV_WC_RDMA_WRITE, true},
    /* IBV_WR_SEND                */ {w::SEND, false, false, 0, kAll, IBV_WC_SEND, true},
    /* IBV_WR_SEND_WITH_IMM       */ {w::SEND_IMM, false, false, 1, kAll, IBV_WC_SEND, true},
    /* IBV_WR_RDMA_READ           */ {w::RDMA_READ, true, false, 0, kOnRc, IBV_WC_RDMA_READ, true},
    /* IBV_WR_ATOMIC_CMP_AND_SWP  */ {w::ATOMIC_CS, true, true, 0, kOnRc, IBV_WC_COMP_SWAP, true},
    /* IBV_WR_ATOMIC_FETCH_AND_ADD*/ {w::ATOMIC_FA, true, true, 0, kOnRc, IBV_WC_FETCH_ADD, true},
    /* IBV_WR_LOCAL_INV           */ {},
    /* IBV_WR_BIND_MW             */ {},
    /* IBV_WR_SEND_WITH_INV       */ {w::SEND_INVAL, false, false, 2, kOnRc, IBV_WC_SEND, true},
};
static_assert(IBV_WR_RDMA_WRITE == 0 && IBV_WR_RDMA_READ == 4 && IBV_WR_SEND_WITH_INV == 9);

struct SyndromeRow {
  uint8_t syndrome;
  ibv_wc_status status;
};
constexpr SyndromeRow kSyndromes[] = {
    {s::LOCAL_LENGTH_ERR, IBV_WC_LOC_LEN_ERR},
    {s::LOCAL_QP_OP_ERR, IBV_WC_LOC_QP_OP_ERR},
    {s::LOCAL_PROT_ERR, IBV_WC_LOC_PROT_ERR},
    {s::WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR},
    {s::MW_BIND_ERR, IBV_WC_MW_BIND_ERR},
    {s::BAD_RESP_ERR, IBV_WC_BAD_RESP_ERR},
    {s::LOCAL_ACCESS_ERR, IBV_WC_LOC_ACCESS_ERR},
    {s::REMOTE_INVAL_REQ_ERR, IBV_WC_REM_INV_REQ_ERR},
    {s::REMOTE_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR},
    {s::REMOTE_OP_ERR, IBV_WC_REM_OP_ERR},
    {s::TRANSPORT_RETRY_EXC_ERR, IBV_WC_RETRY_EXC_ERR},
    {s::RNR_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR},
    {s::REMOTE_ABORTED_ERR, IBV_WC_REM_ABORT_ERR},
};
}  // namespace

const SendOp* send_op(int op) {
  if (op < 0 || op >= int(sizeof kSendOps / sizeof kSendOps[0]) || !kSendOps[op].valid) return nullptr;
  return &kSendOps[op];
}

ibv_wc_opcode wc_opcode_of_wqe(uint8_t wqe_opcode, bool* with_imm) {
  *with_imm = false;
  for (const SendOp& o : kSendOps)
    if (o.valid && o.wqe_opcode == wqe_opcode) {
      *with_imm = o.wqe_opcode == w::RDMA_WRITE_IMM;  // rdma-core reports IMM on a WRITE_IMM requester
      return o.wc;
    }
  return IBV_WC_SEND;
}

ibv_wc_status wc_status_of(uint8_t syndrome) {
  for (const SyndromeRow& r : kSyndromes)
    if (r.syndrome == syndrome) return r.status;
  return IBV_WC_GENERAL_ERR;
}

int errno_of(uapi::Status st) {
  using S = uapi::Status;
  switch (st) {
    case S::ok: return 0;
    case S::quota_client:
    case S::quota_device:
    case S::quota_queue_client:
    case S::quota_queue_device:
    case S::quota_pinned_client:
    case S::quota_pinned_device:
    case S::no_memory: return ENOMEM;
    case S::quota_queue_user:  // a user's limits: the quota errno
    case S::quota_pinned_user:
    case S::quota_user_clients: return EDQUOT;
    case S::bad_address: return EFAULT;  // as ibv_reg_mr's pinning fails on Linux
    case S::busy: return EBUSY;
    case S::taken: return EADDRINUSE;  // QP1 is another process's, as the soft provider's claim says
    case S::unsupported: return EOPNOTSUPP;
    case S::not_permitted: return EPERM;
    case S::device_dead:
    case S::firmware: return EIO;
    case S::no_event: return EAGAIN;
    default: return EINVAL;  // malformed, bad handle, wrong state, invalid field
  }
}

}  // namespace melon::mlx5prov
