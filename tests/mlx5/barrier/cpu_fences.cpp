// The self-test's input: the provider's paths as 842afb3 ordered them, with C++ fences, which order
// memory between CPUs only (on arm64 `dmb ish`). check_barriers.py must reject every one of them.
#include <stdint.h>

extern "C" {

uint64_t path_send_doorbell(uint32_t cur_post, const uint8_t* last_ctrl, volatile uint32_t* dbrec,
                            volatile uint64_t* uar) {
  __atomic_thread_fence(__ATOMIC_RELEASE);
  *dbrec = __builtin_bswap32(cur_post & 0xffff);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  uint64_t v;
  __builtin_memcpy(&v, last_ctrl, 8);
  *uar = v;
  return v;
}

void path_recv_doorbell(uint32_t head, volatile uint32_t* dbrec) {
  __atomic_thread_fence(__ATOMIC_RELEASE);
  *dbrec = __builtin_bswap32(head & 0xffff);
}

uint32_t path_poll_cqe(const uint8_t* cqe, uint32_t ci, uint32_t log_cnt) {
  uint8_t own = cqe[63];
  if ((own >> 4) == 0xf || (own & 1) != ((ci >> log_cnt) & 1)) return 0;
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  uint32_t byte_cnt;
  __builtin_memcpy(&byte_cnt, cqe + 44, 4);
  return byte_cnt | 1;
}

void path_cq_clean_ci(volatile uint32_t* dbrec, uint32_t ci) { *dbrec = __builtin_bswap32(ci & 0xffffff); }

void path_cq_arm(volatile uint32_t* dbrec_arm, uint32_t word, volatile uint64_t* uar, uint64_t db) {
  *dbrec_arm = word;
  __atomic_thread_fence(__ATOMIC_RELEASE);
  *uar = db;
}
}
