// Send and receive WQE writers (see wqe.h). The hot path stores whole big-endian words whose
// layout comes from the PRM field tables (src/mlx5/prm/wqe.h) through dw()/store_*(), so every
// offset is still written once, in prm.
#include "providers/mlx5/wqe.h"

#include "providers/mlx5/byte_order.h"
#include <errno.h>
#include <string.h>

#include "mlx5/prm/wqe.h"
#include "providers/mlx5/tables.h"

namespace melon::mlx5prov {

namespace {
namespace p = mlx5::prm;

// A field's value, shifted into the 32-bit big-endian word that holds it.
constexpr uint32_t dw(const p::Field& f, uint32_t v) {
  uint32_t shift = 32 - f.bit_off % 32 - f.bit_width;
  uint32_t mask = f.bit_width == 32 ? ~0u : (1u << f.bit_width) - 1;
  return (v & mask) << shift;
}
constexpr uint32_t word_of(const p::Field& f) { return f.bit_off / 32; }
constexpr bool same_word(const p::Field& a, const p::Field& b) { return word_of(a) == word_of(b); }

// The control segment's words, as rdma-core composes them (opmod/index/opcode, qpn/ds, flags, imm).
namespace c = p::wqe_ctrl_seg;
static_assert(same_word(c::opmod, c::wqe_index) && same_word(c::wqe_index, c::opcode));
static_assert(same_word(c::qpn, c::ds) && same_word(c::signature, c::se) && same_word(c::fm, c::ce));
static_assert(word_of(c::imm) == 3 && c::imm.bit_width == 32);

inline void be32_at(uint8_t* base, uint32_t word, uint32_t v) {
  uint32_t b = to_be32(v);
  memcpy(base + 4 * word, &b, 4);
}
inline void be64_at(uint8_t* base, uint32_t byte, uint64_t v) {
  uint64_t b = to_be64(v);
  memcpy(base + byte, &b, 8);
}

constexpr uint32_t kSeg = p::kWqeSegUnit;  // 16

// The fm/ce/se bits of word 2 for these send flags.
inline uint32_t ctrl_flags(const SendQueue& sq, unsigned flags) {
  uint32_t v = 0;
  if ((flags & IBV_SEND_SIGNALED) || sq.sig_all) v |= dw(c::ce, 2);  // 2: always a CQE
  if (flags & IBV_SEND_SOLICITED) v |= dw(c::se, 1);
  if (flags & IBV_SEND_FENCE) v |= dw(c::fm, 4);  // PRM fence mode 4: wait for earlier RDMA READs/atomics
  return v;
}

// Bytes of inline data a WR carries (sum of its gather list).
inline uint64_t inline_bytes(const ibv_send_wr& wr) {
  uint64_t n = 0;
  for (int i = 0; i < wr.num_sge; i++) n += wr.sg_list[i].length;
  return n;
}

// The opcode as the integer the application stored: it may be outside the enum (rdma-core: EINVAL).
inline int opcode_of(const ibv_send_wr& wr) {
  int op;
  static_assert(sizeof op == sizeof wr.opcode);
  memcpy(&op, &wr.opcode, sizeof op);
  return op;
}

inline uint8_t* bb(const SendQueue& sq, uint32_t index) {
  return sq.buf + size_t(index & (sq.wqe_cnt - 1)) * p::kSendWqeBB;
}
inline uint8_t* sq_end(const SendQueue& sq) { return sq.buf + size_t(sq.wqe_cnt) * p::kSendWqeBB; }
// The next 16-byte slot, wrapping from the ring's end to its start.
inline uint8_t* advance(const SendQueue& sq, uint8_t* seg, uint32_t bytes) {
  seg += bytes;
  return seg >= sq_end(sq) ? seg - size_t(sq.wqe_cnt) * p::kSendWqeBB : seg;
}

}  // namespace

uint32_t send_wqe_ds(const SendQueue& sq, const ibv_send_wr& wr, int* err) {
  const SendOp* op = send_op(opcode_of(wr));
  if (!op) {
    *err = EINVAL;  // rdma-core: opcode out of its table
    return 0;
  }
  if (wr.num_sge < 0 || wr.num_sge > sq.state_max_gs) {
    *err = ENOMEM;  // rdma-core: max gs exceeded (and every send before RTS)
    return 0;
  }
  uint8_t on = sq.type == IBV_QPT_UD ? kOnUd : sq.type == IBV_QPT_UC ? kOnUc : kOnRc;
  if (!(op->qp_types & on)) {
    *err = EINVAL;
    return 0;
  }
  uint32_t ds = 1;  // control
  if (sq.type == IBV_QPT_UD) ds += kDatagramSegBytes / kSeg;
  if (op->raddr) ds += 1;
  if (op->atomic) ds += 1;
  if ((wr.send_flags & IBV_SEND_INLINE) && wr.num_sge && !op->atomic) {
    uint64_t n = inline_bytes(wr);
    if (n > sq.max_inline) {
      *err = ENOMEM;  // rdma-core set_data_inl_seg
      return 0;
    }
    ds += uint32_t((4 + n + kSeg - 1) / kSeg);
  } else {
    for (int i = 0; i < wr.num_sge; i++)
      if (wr.sg_list[i].length) ds++;
  }
  *err = 0;
  return ds;
}

int write_send_wqe(SendQueue& sq, const ibv_send_wr& wr, const uint8_t* av) {
  int err;
  uint32_t ds = send_wqe_ds(sq, wr, &err);
  if (!ds) return err;
  uint32_t nbb = (ds * kSeg + p::kSendWqeBB - 1) / p::kSendWqeBB;
  if (sq.cur_post - sq.tail + nbb > sq.wqe_cnt) return ENOMEM;  // the ring is full
  const SendOp* op = send_op(opcode_of(wr));
  if (sq.type == IBV_QPT_UD && !av) return EINVAL;

  uint32_t idx = sq.cur_post & (sq.wqe_cnt - 1);
  uint8_t* ctrl = bb(sq, idx);
  be32_at(ctrl, word_of(c::opcode), dw(c::wqe_index, sq.cur_post & 0xffff) | dw(c::opcode, op->wqe_opcode));
  be32_at(ctrl, word_of(c::ds), dw(c::qpn, sq.qpn) | dw(c::ds, ds));
  be32_at(ctrl, word_of(c::fm), ctrl_flags(sq, wr.send_flags));
  uint32_t imm = op->imm == 1 ? wr.imm_data : op->imm == 2 ? to_be32(wr.invalidate_rkey) : 0;  // imm_data is BE
  memcpy(ctrl + 12, &imm, 4);
  uint8_t* seg = advance(sq, ctrl, kSeg);

  if (sq.type == IBV_QPT_UD) {
    // The AH's address vector, with this WR's remote QP (extended AV) and Q_Key.
    namespace d = p::wqe_datagram_seg;
    memcpy(seg, av, kDatagramSegBytes);  // 16-byte slots at 16, 32, 48: never crosses the ring's end
    be32_at(seg, word_of(d::qkey), wr.wr.ud.remote_qkey);
    be32_at(seg, word_of(d::dqpn), dw(d::ext, 1) | dw(d::dqpn, wr.wr.ud.remote_qpn));
    seg = advance(sq, seg, kDatagramSegBytes);
  }
  if (op->raddr) {
    namespace r = p::wqe_raddr_seg;
    uint64_t raddr = op->atomic ? wr.wr.atomic.remote_addr : wr.wr.rdma.remote_addr;
    uint32_t rkey = op->atomic ? wr.wr.atomic.rkey : wr.wr.rdma.rkey;
    be64_at(seg, r::raddr.byte_off(), raddr);
    be32_at(seg, word_of(r::rkey), rkey);
    be32_at(seg, 3, 0);
    seg = advance(sq, seg, kSeg);
  }
  if (op->atomic) {
    namespace a = p::wqe_atomic_seg;
    bool cas = op->wqe_opcode == p::wqe_opcode::ATOMIC_CS;
    be64_at(seg, a::swap_add.byte_off(), cas ? wr.wr.atomic.swap : wr.wr.atomic.compare_add);
    be64_at(seg, a::compare.byte_off(), cas ? wr.wr.atomic.compare_add : 0);
    seg = advance(sq, seg, kSeg);
  }
  if ((wr.send_flags & IBV_SEND_INLINE) && wr.num_sge && !op->atomic) {
    uint32_t total = uint32_t(inline_bytes(wr));
    be32_at(seg, 0, p::kInlineSegFlag | total);
    uint8_t* dst = seg + 4;
    for (int i = 0; i < wr.num_sge; i++) {
      const uint8_t* src = reinterpret_cast<const uint8_t*>(uintptr_t(wr.sg_list[i].addr));
      uint32_t len = wr.sg_list[i].length;
      uint32_t room = uint32_t(sq_end(sq) - dst);
      if (len > room) {  // the data wraps to the ring's start
        memcpy(dst, src, room);
        src += room, len -= room;
        dst = sq.buf;
      }
      memcpy(dst, src, len);
      dst += len;
    }
  } else {
    namespace g = p::wqe_data_seg;
    for (int i = 0; i < wr.num_sge; i++) {
      const ibv_sge& s = wr.sg_list[i];
      if (!s.length) continue;
      be32_at(seg, word_of(g::byte_count), op->atomic ? 8 : s.length);
      be32_at(seg, word_of(g::lkey), s.lkey);
      be64_at(seg, g::addr.byte_off(), s.addr);
      seg = advance(sq, seg, kSeg);
    }
  }
  sq.wrid[idx] = wr.wr_id;
  sq.cur_post += nbb;
  sq.next_tail[idx] = sq.cur_post;
  sq.last_ctrl = ctrl;
  sq.last_bbs = nbb;
  return 0;
}

namespace {
// A scatter list into `dst` (up to `max` entries), closed by the invalid lkey when shorter.
inline void write_scatter(uint8_t* dst, const ibv_recv_wr& wr, uint32_t max) {
  namespace g = p::wqe_data_seg;
  uint32_t n = 0;
  for (int i = 0; i < wr.num_sge; i++) {
    const ibv_sge& s = wr.sg_list[i];
    if (!s.length) continue;
    be32_at(dst, word_of(g::byte_count), s.length);
    be32_at(dst, word_of(g::lkey), s.lkey);
    be64_at(dst, g::addr.byte_off(), s.addr);
    dst += kSeg, n++;
  }
  if (n < max) {
    be32_at(dst, word_of(g::byte_count), 0);
    be32_at(dst, word_of(g::lkey), kInvalidLkey);
    be64_at(dst, g::addr.byte_off(), 0);
  }
}
}  // namespace

int write_recv_wqe(RecvQueue& rq, const ibv_recv_wr& wr) {
  if (wr.num_sge < 0 || wr.num_sge > rq.state_max_gs) return EINVAL;  // rdma-core mlx5_post_recv
  if (rq.head - rq.tail >= rq.wqe_cnt) return ENOMEM;
  uint32_t idx = rq.head & (rq.wqe_cnt - 1);
  write_scatter(rq.buf + size_t(idx) * rq.stride, wr, rq.max_gs);
  rq.wrid[idx] = wr.wr_id;
  rq.head++;
  return 0;
}

bool copy_to_scatter(const uint8_t* wqe, uint32_t max, const uint8_t* src, uint32_t len) {
  namespace g = p::wqe_data_seg;
  for (uint32_t i = 0; i < max && len; i++, wqe += kSeg) {
    uint32_t n, lkey;
    uint64_t addr;
    memcpy(&n, wqe + 4 * word_of(g::byte_count), 4);
    memcpy(&lkey, wqe + 4 * word_of(g::lkey), 4);
    memcpy(&addr, wqe + g::addr.byte_off(), 8);
    if (from_be32(lkey) == kInvalidLkey) break;
    n = from_be32(n) & 0x7fffffff;  // bit 31 (inline) is never set in a receive WQE
    if (n > len) n = len;
    memcpy(reinterpret_cast<void*>(uintptr_t(from_be64(addr))), src, n);
    src += n, len -= n;
  }
  return len == 0;
}

void srq_init(SrqQueue& q) {
  for (uint32_t i = 0; i < q.wqe_cnt; i++) {
    uint8_t* w = q.buf + size_t(i) * q.stride;
    memset(w, 0, 16);
    uint16_t next = to_be16(uint16_t((i + 1) & (q.wqe_cnt - 1)));
    memcpy(w + 2, &next, 2);  // next_wqe_index (rdma-core struct mlx5_wqe_srq_next_seg)
  }
  q.head = 0;
  q.tail = q.wqe_cnt - 1;
  q.counter = 0;
}

int write_srq_wqe(SrqQueue& q, const ibv_recv_wr& wr) {
  if (wr.num_sge < 0 || uint32_t(wr.num_sge) > q.max_gs) return EINVAL;
  if (q.head == q.tail) return ENOMEM;  // only the sentinel is left
  uint8_t* w = q.buf + size_t(q.head) * q.stride;
  write_scatter(w + 16, wr, q.max_gs);
  q.wrid[q.head] = wr.wr_id;
  uint16_t next;
  memcpy(&next, w + 2, 2);
  q.head = from_be16(next) & (q.wqe_cnt - 1);
  q.counter++;
  return 0;
}

void srq_free(SrqQueue& q, uint32_t index) {
  uint8_t* t = q.buf + size_t(q.tail) * q.stride;
  uint16_t next = to_be16(uint16_t(index));
  memcpy(t + 2, &next, 2);
  q.tail = index & (q.wqe_cnt - 1);
}

}  // namespace melon::mlx5prov
