// Command interface transport: command queue entry, mailbox block, generic command header.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_CMD_QUEUE_ENTRY(F, S, A) \
  F(type, 0, 8)                            \
  F(input_length, 32, 32)                  \
  F(input_mailbox_pointer_63_32, 64, 32)   \
  F(input_mailbox_pointer_31_9, 96, 23)    \
  F(command_input_inline_data, 128, 128)   \
  F(command_output_inline_data, 256, 128)  \
  F(output_mailbox_pointer_63_32, 384, 32) \
  F(output_mailbox_pointer_31_9, 416, 23)  \
  F(output_length, 448, 32)                \
  F(token, 480, 8)                         \
  F(signature, 488, 8)                     \
  F(status, 504, 7)                        \
  F(ownership, 511, 1)
MELON_PRM_STRUCT(cmd_queue_entry, 512, MELON_PRM_CMD_QUEUE_ENTRY)

#define MELON_PRM_CMD_IF_BOX(F, S, A) \
  F(mailbox_data, 0, 4096)            \
  F(next_pointer_63_32, 4480, 32)     \
  F(next_pointer_31_10, 4512, 22)     \
  F(block_number, 4544, 32)           \
  F(token, 4584, 8)                   \
  F(ctrl_signature, 4592, 8)          \
  F(signature, 4600, 8)
MELON_PRM_STRUCT(cmd_if_box, 4608, MELON_PRM_CMD_IF_BOX)

#define MELON_PRM_CMD_IN(F, S, A) \
  F(opcode, 0, 16)                \
  F(op_mod, 48, 16)               \
  A(command, 64, 32)
MELON_PRM_STRUCT(cmd_in, 64, MELON_PRM_CMD_IN)

#define MELON_PRM_CMD_OUT(F, S, A) \
  F(status, 0, 8)                  \
  F(syndrome, 32, 32)              \
  F(command_output, 64, 32)
MELON_PRM_STRUCT(cmd_out, 96, MELON_PRM_CMD_OUT)

inline constexpr uint32_t kCmdEntryBytes = cmd_queue_entry::size_bytes;  // 64
inline constexpr uint32_t kMailboxDataBytes = cmd_if_box::mailbox_data.byte_len();  // 512
inline constexpr uint32_t kMailboxBytes = 1024;  // a block is 576 bytes, placed on 1 KiB boundaries
inline constexpr uint32_t kInlineInputBytes = cmd_queue_entry::command_input_inline_data.byte_len();  // 16
inline constexpr uint32_t kInlineOutputBytes = cmd_queue_entry::command_output_inline_data.byte_len();  // 16
inline constexpr uint8_t kCmdQueueEntryTypePcie = 0x7;  // cmd_queue_entry.type

// Delivery status: cmd_queue_entry.status, written by the HCA when it could not even parse the
// entry (the command itself never ran). 0 means the command was delivered; see cmd_status then.
#define MELON_PRM_DELIVERY_STATUS(V) \
  V(DELIVERED, 0x0)                  \
  V(SIGNATURE_ERR, 0x1)              \
  V(TOKEN_ERR, 0x2)                  \
  V(BAD_BLOCK_NUMBER, 0x3)           \
  V(BAD_OUTPUT_POINTER, 0x4)         \
  V(BAD_INPUT_POINTER, 0x5)          \
  V(FW_INTERNAL_ERR, 0x6)            \
  V(INPUT_LEN_ERR, 0x7)              \
  V(OUTPUT_LEN_ERR, 0x8)             \
  V(RESERVED_NOT_ZERO, 0x9)          \
  V(BAD_COMMAND_TYPE, 0x10)
MELON_PRM_VALUES(delivery_status, uint8_t, MELON_PRM_DELIVERY_STATUS)

// Command status: the `status` byte of every command's output; `syndrome` narrows it down.
#define MELON_PRM_CMD_STATUS(V)   \
  V(OK, 0x0)                      \
  V(INT_ERR, 0x1)                 \
  V(BAD_OP_ERR, 0x2)              \
  V(BAD_PARAM_ERR, 0x3)           \
  V(BAD_SYS_STATE_ERR, 0x4)       \
  V(BAD_RES_ERR, 0x5)             \
  V(RES_BUSY, 0x6)                \
  V(LIM_ERR, 0x8)                 \
  V(BAD_RES_STATE_ERR, 0x9)       \
  V(IX_ERR, 0xa)                  \
  V(NO_RES_ERR, 0xf)              \
  V(BAD_QP_STATE_ERR, 0x10)       \
  V(BAD_PKT_ERR, 0x30)            \
  V(BAD_SIZE_OUTS_CQES_ERR, 0x40) \
  V(BAD_INP_LEN_ERR, 0x50)        \
  V(BAD_OUTP_LEN_ERR, 0x51)
MELON_PRM_VALUES(cmd_status, uint8_t, MELON_PRM_CMD_STATUS)

// Every command input starts with opcode/op_mod and every output with status/syndrome.
inline void cmd_set_header(void* in, uint16_t opcode, uint16_t op_mod) {
  set(in, cmd_in::opcode, opcode);
  set(in, cmd_in::op_mod, op_mod);
}
inline uint16_t cmd_opcode(const void* in) { return uint16_t(get(in, cmd_in::opcode)); }
inline uint16_t cmd_op_mod(const void* in) { return uint16_t(get(in, cmd_in::op_mod)); }
inline void cmd_set_result(void* out, uint8_t status, uint32_t syndrome) {
  set(out, cmd_out::status, status);
  set(out, cmd_out::syndrome, syndrome);
}
inline uint8_t cmd_status_of(const void* out) { return uint8_t(get(out, cmd_out::status)); }
inline uint32_t cmd_syndrome_of(const void* out) { return uint32_t(get(out, cmd_out::syndrome)); }

// Mailbox and queue-entry pointers are split in two fields (high dword, low bits above the
// alignment); these join and split them.
inline void cmd_entry_set_in_mailbox(void* entry, uint64_t pa) {
  set(entry, cmd_queue_entry::input_mailbox_pointer_63_32, pa >> 32);
  set(entry, cmd_queue_entry::input_mailbox_pointer_31_9, (pa & 0xffffffffu) >> 9);
}
inline void cmd_entry_set_out_mailbox(void* entry, uint64_t pa) {
  set(entry, cmd_queue_entry::output_mailbox_pointer_63_32, pa >> 32);
  set(entry, cmd_queue_entry::output_mailbox_pointer_31_9, (pa & 0xffffffffu) >> 9);
}
inline uint64_t cmd_entry_in_mailbox(const void* entry) {
  return (get(entry, cmd_queue_entry::input_mailbox_pointer_63_32) << 32) |
         (get(entry, cmd_queue_entry::input_mailbox_pointer_31_9) << 9);
}
inline uint64_t cmd_entry_out_mailbox(const void* entry) {
  return (get(entry, cmd_queue_entry::output_mailbox_pointer_63_32) << 32) |
         (get(entry, cmd_queue_entry::output_mailbox_pointer_31_9) << 9);
}
inline void mailbox_set_next(void* box, uint64_t pa) {
  set(box, cmd_if_box::next_pointer_63_32, pa >> 32);
  set(box, cmd_if_box::next_pointer_31_10, (pa & 0xffffffffu) >> 10);
}
inline uint64_t mailbox_next(const void* box) {
  return (get(box, cmd_if_box::next_pointer_63_32) << 32) | (get(box, cmd_if_box::next_pointer_31_10) << 10);
}

// The 8-bit XOR signature the PRM uses for entries and mailboxes when checksums are on: the XOR
// of all bytes in [0, len) must come out 0xff once the signature byte is filled in.
inline uint8_t xor8(const void* buf, uint32_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  uint8_t x = 0;
  for (uint32_t i = 0; i < len; ++i) x ^= p[i];
  return x;
}

}  // namespace melon::mlx5::prm
