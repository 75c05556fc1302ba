// The "new post send" interface (struct ibv_qp_ex, ibv_wr_*) for providers whose native interface
// is ibv_post_send: each builder call records one work request; ibv_wr_complete links them into a
// chain and posts it through the context's post_send; ibv_wr_abort drops them. A provider that
// can build its queue entries directly (mlx5) installs its own function pointers instead.
//
// Semantics follow rdma-core's man page ibv_wr_post(3): wr_id and wr_flags are read from the
// ibv_qp_ex when the opcode builder is called; the data setters (wr_set_sge*, wr_set_inline_data*)
// and the address setters (wr_set_ud_addr, wr_set_xrc_srqn) apply to the last opcode; inline data
// is copied at once, so the caller may reuse its buffer; an error in any builder makes
// wr_complete fail and post nothing.
#include "verbs/internal.h"

#include <cerrno>
#include <cstring>
#include <deque>
#include <new>
#include <vector>

namespace melon::verbs {

struct WrBatch {
  struct Wr {
    ibv_send_wr wr{};
    std::vector<ibv_sge> sges;
    std::vector<uint8_t> inline_data;
  };
  uint64_t allowed = 0;  // send_ops_flags of the QP
  std::deque<Wr> wrs;  // deque: elements never move
  int error = 0;
  bool open = false;
};

namespace {

QpBase* base(ibv_qp_ex* qp) { return reinterpret_cast<QpBase*>(qp); }
WrBatch* batch(ibv_qp_ex* qp) { return base(qp)->batch; }

void fail(ibv_qp_ex* qp, int err) {
  WrBatch* b = batch(qp);
  if (!b->error) b->error = err;
}

// Start a new request of `opcode` (allowed by send-ops flag `flag`).
WrBatch::Wr* begin(ibv_qp_ex* qp, uint64_t flag, ibv_wr_opcode opcode) {
  WrBatch* b = batch(qp);
  if (!b->open) {
    fail(qp, EINVAL);  // outside wr_start/wr_complete
    return nullptr;
  }
  if (!(b->allowed & flag)) {
    fail(qp, EINVAL);  // not requested at QP creation
    return nullptr;
  }
  try {
    b->wrs.emplace_back();
  } catch (const std::bad_alloc&) {
    fail(qp, ENOMEM);  // nothing may be thrown back into a C caller
    return nullptr;
  }
  WrBatch::Wr& w = b->wrs.back();
  w.wr.wr_id = qp->wr_id;
  w.wr.send_flags = qp->wr_flags;
  w.wr.opcode = opcode;
  return &w;
}

// The request the data/address setters apply to.
WrBatch::Wr* current(ibv_qp_ex* qp) {
  WrBatch* b = batch(qp);
  if (!b->open || b->wrs.empty()) {
    fail(qp, EINVAL);
    return nullptr;
  }
  return &b->wrs.back();
}

void wr_atomic_cmp_swp(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, uint64_t compare, uint64_t swap) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_CMP_AND_SWP)) {
    w->wr.wr.atomic.remote_addr = remote_addr;
    w->wr.wr.atomic.rkey = rkey;
    w->wr.wr.atomic.compare_add = compare;
    w->wr.wr.atomic.swap = swap;
  }
}

void wr_atomic_fetch_add(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_FETCH_AND_ADD)) {
    w->wr.wr.atomic.remote_addr = remote_addr;
    w->wr.wr.atomic.rkey = rkey;
    w->wr.wr.atomic.compare_add = add;
  }
}

void wr_bind_mw(ibv_qp_ex* qp, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_BIND_MW, IBV_WR_BIND_MW)) {
    w->wr.bind_mw.mw = mw;
    w->wr.bind_mw.rkey = rkey;
    if (info) w->wr.bind_mw.bind_info = *info;
  }
}

void wr_local_inv(ibv_qp_ex* qp, uint32_t invalidate_rkey) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_LOCAL_INV, IBV_WR_LOCAL_INV)) w->wr.invalidate_rkey = invalidate_rkey;
}

void wr_rdma_read(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_RDMA_READ, IBV_WR_RDMA_READ)) {
    w->wr.wr.rdma.remote_addr = remote_addr;
    w->wr.wr.rdma.rkey = rkey;
  }
}

void wr_rdma_write(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_RDMA_WRITE, IBV_WR_RDMA_WRITE)) {
    w->wr.wr.rdma.remote_addr = remote_addr;
    w->wr.wr.rdma.rkey = rkey;
  }
}

void wr_rdma_write_imm(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, __be32 imm) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM)) {
    w->wr.wr.rdma.remote_addr = remote_addr;
    w->wr.wr.rdma.rkey = rkey;
    w->wr.imm_data = imm;
  }
}

void wr_send(ibv_qp_ex* qp) { begin(qp, IBV_QP_EX_WITH_SEND, IBV_WR_SEND); }

void wr_send_imm(ibv_qp_ex* qp, __be32 imm) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_SEND_WITH_IMM, IBV_WR_SEND_WITH_IMM)) w->wr.imm_data = imm;
}

void wr_send_inv(ibv_qp_ex* qp, uint32_t invalidate_rkey) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_SEND_WITH_INV, IBV_WR_SEND_WITH_INV)) w->wr.invalidate_rkey = invalidate_rkey;
}

void wr_send_tso(ibv_qp_ex* qp, void* hdr, uint16_t hdr_sz, uint16_t mss) {
  if (auto* w = begin(qp, IBV_QP_EX_WITH_TSO, IBV_WR_TSO)) {
    w->wr.tso.hdr = hdr;
    w->wr.tso.hdr_sz = hdr_sz;
    w->wr.tso.mss = mss;
  }
}

void wr_atomic_write(ibv_qp_ex* qp, uint32_t, uint64_t, const void*) {
  fail(qp, EOPNOTSUPP);  // rejected at creation; kept non-NULL for safety
}

void wr_set_ud_addr(ibv_qp_ex* qp, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  if (auto* w = current(qp)) {
    w->wr.wr.ud.ah = ah;
    w->wr.wr.ud.remote_qpn = remote_qpn;
    w->wr.wr.ud.remote_qkey = remote_qkey;
  }
}

void wr_set_xrc_srqn(ibv_qp_ex* qp, uint32_t remote_srqn) {
  if (auto* w = current(qp)) w->wr.qp_type.xrc.remote_srqn = remote_srqn;
}

void wr_set_sge(ibv_qp_ex* qp, uint32_t lkey, uint64_t addr, uint32_t length) {
  if (auto* w = current(qp)) {
    try {
      w->sges.assign(1, ibv_sge{addr, length, lkey});
    } catch (const std::bad_alloc&) {
      fail(qp, ENOMEM);
    }
    w->inline_data.clear();
  }
}

void wr_set_sge_list(ibv_qp_ex* qp, size_t num_sge, const ibv_sge* sg_list) {
  if (auto* w = current(qp)) {
    if (num_sge && !sg_list) {
      fail(qp, EINVAL);
      return;
    }
    try {
      w->sges.assign(sg_list, sg_list + num_sge);
    } catch (const std::bad_alloc&) {
      fail(qp, ENOMEM);
    }
    w->inline_data.clear();
  }
}

void wr_set_inline_data_list(ibv_qp_ex* qp, size_t num_buf, const ibv_data_buf* buf_list) {
  if (auto* w = current(qp)) {
    if (num_buf && !buf_list) {
      fail(qp, EINVAL);
      return;
    }
    w->inline_data.clear();
    for (size_t i = 0; i < num_buf; i++) {
      const auto* p = static_cast<const uint8_t*>(buf_list[i].addr);
      if (buf_list[i].length && !p) {
        fail(qp, EINVAL);
        return;
      }
      try {
        w->inline_data.insert(w->inline_data.end(), p, p + buf_list[i].length);
      } catch (const std::bad_alloc&) {
        fail(qp, ENOMEM);
        return;
      }
    }
    w->sges.clear();
    try {
      w->sges.reserve(1);  // so wr_complete need not allocate
    } catch (const std::bad_alloc&) {
      fail(qp, ENOMEM);
    }
    w->wr.send_flags |= IBV_SEND_INLINE;
  }
}

void wr_set_inline_data(ibv_qp_ex* qp, void* addr, size_t length) {
  ibv_data_buf one{addr, length};
  wr_set_inline_data_list(qp, 1, &one);
}

void wr_start(ibv_qp_ex* qp) {
  WrBatch* b = batch(qp);
  b->wrs.clear();  // never allocates
  b->error = 0;
  b->open = true;
}

int wr_complete(ibv_qp_ex* qp) {
  WrBatch* b = batch(qp);
  int err = b->open ? b->error : EINVAL;
  if (!err && !b->wrs.empty()) {
    ibv_send_wr* prev = nullptr;
    for (auto it = b->wrs.rbegin(); it != b->wrs.rend(); ++it) {
      WrBatch::Wr& w = *it;
      if (!w.inline_data.empty()) {
        w.sges.clear();  // capacity >= 1 is reserved when inline data is set
        w.sges.push_back(
            ibv_sge{reinterpret_cast<uintptr_t>(w.inline_data.data()), static_cast<uint32_t>(w.inline_data.size()), 0});
      }
      w.wr.sg_list = w.sges.empty() ? nullptr : w.sges.data();
      w.wr.num_sge = static_cast<int>(w.sges.size());
      w.wr.next = prev;
      prev = &w.wr;
    }
    ibv_send_wr* bad = nullptr;
    ibv_qp* q = &qp->qp_base;
    err = q->context->ops.post_send(q, prev, &bad);
  }
  b->wrs.clear();
  b->error = 0;
  b->open = false;
  return err;
}

void wr_abort(ibv_qp_ex* qp) {
  WrBatch* b = batch(qp);
  b->wrs.clear();
  b->error = 0;
  b->open = false;
}

constexpr uint64_t kTranslatable = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                   IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                                   IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                                   IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV |
                                   IBV_QP_EX_WITH_TSO;

}  // namespace

int init_qp_ex_ops(QpBase* qp, uint64_t send_ops_flags) {
  if (send_ops_flags & ~kTranslatable) return EOPNOTSUPP;  // e.g. IBV_QP_EX_WITH_ATOMIC_WRITE
  auto* b = new (std::nothrow) WrBatch;
  if (!b) return ENOMEM;
  b->allowed = send_ops_flags;
  qp->batch = b;
  qp->extended = true;
  ibv_qp_ex& x = qp->ibv;
  x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_send_tso = wr_send_tso;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_xrc_srqn = wr_set_xrc_srqn;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_atomic_write = wr_atomic_write;
  return 0;
}

void release_qp_ex_ops(QpBase* qp) {
  delete qp->batch;
  qp->batch = nullptr;
}

}  // namespace melon::verbs
