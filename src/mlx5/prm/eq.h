// Event queues: EQ context and CREATE/DESTROY/QUERY_EQ.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_EQC(F, S, A) \
  F(status, 0, 4)              \
  F(ec, 13, 1)                 \
  F(oi, 14, 1)                 \
  F(st, 20, 4)                 \
  F(page_offset, 84, 6)        \
  F(log_eq_size, 99, 5)        \
  F(uar_page, 104, 24)         \
  F(intr, 180, 12)             \
  F(log_page_size, 195, 5)     \
  F(consumer_counter, 328, 24) \
  F(producer_counter, 360, 24)
MELON_PRM_STRUCT(eqc, 512, MELON_PRM_EQC)

#define MELON_PRM_CREATE_EQ_IN(F, S, A) \
  F(opcode, 0, 16)                      \
  F(uid, 16, 16)                        \
  F(op_mod, 48, 16)                     \
  S(eq_context_entry, 128, eqc)         \
  F(event_bitmask, 704, 256)            \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(create_eq_in, 2176, MELON_PRM_CREATE_EQ_IN)

#define MELON_PRM_CREATE_EQ_OUT(F, S, A) \
  F(status, 0, 8)                        \
  F(syndrome, 32, 32)                    \
  F(eq_number, 88, 8)
MELON_PRM_STRUCT(create_eq_out, 128, MELON_PRM_CREATE_EQ_OUT)

#define MELON_PRM_DESTROY_EQ_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(op_mod, 48, 16)                      \
  F(eq_number, 88, 8)
MELON_PRM_STRUCT(destroy_eq_in, 128, MELON_PRM_DESTROY_EQ_IN)

#define MELON_PRM_DESTROY_EQ_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(destroy_eq_out, 128, MELON_PRM_DESTROY_EQ_OUT)

#define MELON_PRM_QUERY_EQ_IN(F, S, A) \
  F(opcode, 0, 16)                     \
  F(op_mod, 48, 16)                    \
  F(eq_number, 88, 8)
MELON_PRM_STRUCT(query_eq_in, 128, MELON_PRM_QUERY_EQ_IN)

#define MELON_PRM_QUERY_EQ_OUT(F, S, A) \
  F(status, 0, 8)                       \
  F(syndrome, 32, 32)                   \
  S(eq_context_entry, 128, eqc)         \
  F(event_bitmask, 704, 64)             \
  A(pas, 2176, 64)
MELON_PRM_STRUCT(query_eq_out, 2176, MELON_PRM_QUERY_EQ_OUT)

#define MELON_PRM_EQC_STATUS(V) \
  V(OK, 0x0)                    \
  V(EQ_WRITE_FAILURE, 0xa)
MELON_PRM_VALUES(eqc_status, uint8_t, MELON_PRM_EQC_STATUS)
#define MELON_PRM_EQC_ST(V) \
  V(ARMED, 0x9)             \
  V(FIRED, 0xa)
MELON_PRM_VALUES(eqc_st, uint8_t, MELON_PRM_EQC_ST)

// CREATE_EQ's event_bitmask is 256 bits wide; event type n is bit n of its first 64-bit word.
inline void eq_set_event_mask(void* create_eq_in_buf, uint64_t mask) {
  set_bits(create_eq_in_buf, create_eq_in::event_bitmask.bit_off, 64, mask);
}
inline uint64_t eq_event_mask(const void* create_eq_in_buf) {
  return get_bits(create_eq_in_buf, create_eq_in::event_bitmask.bit_off, 64);
}
inline constexpr uint64_t event_bit(uint8_t event_type) { return uint64_t(1) << event_type; }

}  // namespace melon::mlx5::prm
