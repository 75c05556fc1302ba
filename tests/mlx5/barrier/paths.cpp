// The provider's device-ordered paths (src/providers/mlx5/doorbells.h) as out-of-line functions, so
// check_barriers.py can read their instructions: this file is compiled for aarch64 and x86-64 and
// disassembled. Each function is what the provider runs at that point (post.cpp, cq.cpp), with the
// queue state passed in.
#include "providers/mlx5/doorbells.h"

namespace mp = melon::mlx5prov;

extern "C" {

uint64_t path_send_doorbell(uint32_t cur_post, const uint8_t* last_ctrl, volatile uint32_t* dbrec,
                            volatile uint64_t* uar) {
  return mp::ring_send_doorbell(cur_post, last_ctrl, dbrec, uar);
}

void path_recv_doorbell(uint32_t head, volatile uint32_t* dbrec) { mp::ring_recv_doorbell(head, dbrec); }

// The poller's first steps: the owner check, then the CQE's contents (its byte count, at byte 44).
uint32_t path_poll_cqe(const uint8_t* cqe, uint32_t ci, uint32_t log_cnt) {
  const uint8_t* c = mp::take_cqe(cqe, ci, log_cnt);
  if (!c) return 0;
  uint32_t byte_cnt;
  __builtin_memcpy(&byte_cnt, c + 44, 4);
  return byte_cnt | 1;
}

void path_cq_clean_ci(volatile uint32_t* dbrec, uint32_t ci) { mp::set_cq_ci_after_clean(dbrec, ci); }

void path_cq_arm(volatile uint32_t* dbrec_arm, uint32_t word, volatile uint64_t* uar, uint64_t db) {
  mp::ring_cq_arm(dbrec_arm, word, uar, db);
}
}
