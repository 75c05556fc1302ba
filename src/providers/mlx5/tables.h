// The mlx5 provider's translation tables, each fact once:
//   send_op()        ibv_wr_opcode -> WQE opcode, the segments it carries, the QP types that take it
//                    and the work completion it ends in (rdma-core providers/mlx5/qp.c mlx5_ib_opcode,
//                    cq.c handle_good_req);
//   wc_status_of()   CQE error syndrome -> ibv_wc_status (rdma-core cq.c mlx5_handle_error_cqe);
//   errno_of()       uapi::Status -> errno (docs/uapi.md).
#pragma once

#include <infiniband/verbs.h>
#include <stdint.h>

#include "uapi/abi.h"

namespace melon::mlx5prov {

// Which QP types a send opcode is valid on.
enum : uint8_t { kOnRc = 1, kOnUc = 2, kOnUd = 4 };

struct SendOp {
  uint8_t wqe_opcode;  // prm::wqe_opcode
  bool raddr;  // a remote address segment follows the control (and datagram) segment
  bool atomic;  // an atomic segment follows the remote address segment
  uint8_t imm;  // 0: none, 1: ctrl.imm = imm_data, 2: ctrl.imm = invalidate_rkey
  uint8_t qp_types;  // kOnRc | kOnUc | kOnUd
  ibv_wc_opcode wc;  // the requester's completion
  bool valid;
};

// nullptr for an opcode this provider cannot post (LOCAL_INV, BIND_MW, TSO, DRIVER1, ...).
const SendOp* send_op(int ibv_opcode);
// The requester's completion opcode for a WQE opcode found in a CQE (IBV_WC_SEND for unknown ones).
ibv_wc_opcode wc_opcode_of_wqe(uint8_t wqe_opcode, bool* with_imm);

ibv_wc_status wc_status_of(uint8_t syndrome);

int errno_of(uapi::Status s);

}  // namespace melon::mlx5prov
