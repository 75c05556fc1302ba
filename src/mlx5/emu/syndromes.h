// Command syndromes this model returns with a failing status. Real firmware's syndromes are opaque
// 32-bit numbers that only the vendor's tools decode; these are the emulator's own, one per check,
// so a test can assert which check refused a command (docs/emulator.md lists them).
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::emu {

#define MELON_EMU_SYNDROMES(V)           \
  V(NONE, 0x0)                           \
  V(UNKNOWN_OPCODE, 0xe0000001)          \
  V(BAD_OP_MOD, 0xe0000002)              \
  V(INPUT_TOO_SHORT, 0xe0000003)         \
  V(OUTPUT_TOO_SHORT, 0xe0000004)        \
  V(RESERVED_NOT_ZERO, 0xe0000005)       \
  V(UID_NOT_SUPPORTED, 0xe0000006)       \
  V(HCA_NOT_ENABLED, 0xe0000010)         \
  V(HCA_NOT_INITIALIZED, 0xe0000011)     \
  V(HCA_ALREADY_ENABLED, 0xe0000012)     \
  V(HCA_ALREADY_INITIALIZED, 0xe0000013) \
  V(BAD_FUNCTION_ID, 0xe0000014)         \
  V(BAD_ISSI, 0xe0000015)                \
  V(BOOT_PAGES_MISSING, 0xe0000020)      \
  V(INIT_PAGES_MISSING, 0xe0000021)      \
  V(TOO_MANY_PAGES, 0xe0000022)          \
  V(PAGE_NOT_ALIGNED, 0xe0000023)        \
  V(PAGE_ALREADY_GIVEN, 0xe0000024)      \
  V(PAGE_ENTRIES_MISMATCH, 0xe0000025)   \
  V(PAGE_DMA_FAULT, 0xe0000026)          \
  V(BAD_CAP_TYPE, 0xe0000030)            \
  V(CAP_NOT_SETTABLE, 0xe0000031)        \
  V(CAP_ABOVE_MAX, 0xe0000032)           \
  V(OBJECTS_STILL_EXIST, 0xe0000033)     \
  V(NO_FREE_INDEX, 0xe0000040)           \
  V(UNKNOWN_UAR, 0xe0000041)             \
  V(UNKNOWN_PD, 0xe0000042)              \
  V(UNKNOWN_TD, 0xe0000043)              \
  V(UNKNOWN_EQ, 0xe0000044)              \
  V(UNKNOWN_CQ, 0xe0000045)              \
  V(UNKNOWN_MKEY, 0xe0000046)            \
  V(UNKNOWN_QP, 0xe0000047)              \
  V(UNKNOWN_SRQ, 0xe0000048)             \
  V(UNKNOWN_Q_COUNTER, 0xe0000049)       \
  V(RESOURCE_IN_USE, 0xe000004a)         \
  V(BAD_QUEUE_SIZE, 0xe0000050)          \
  V(BAD_STRIDE, 0xe0000051)              \
  V(PAS_TOO_SHORT, 0xe0000052)           \
  V(BAD_PAGE_SIZE, 0xe0000053)           \
  V(BAD_INTR, 0xe0000054)                \
  V(BAD_CQE_SIZE, 0xe0000055)            \
  V(BAD_DBR_ADDR, 0xe0000056)            \
  V(RESIZE_TOO_SMALL, 0xe0000057)        \
  V(CQ_IN_ERROR, 0xe0000058)             \
  V(CQ_RING_FULL, 0xe0000059)            \
  V(BAD_ACCESS_MODE, 0xe0000060)         \
  V(BAD_MKEY_LENGTH, 0xe0000061)         \
  V(MTT_TOO_SHORT, 0xe0000062)           \
  V(BAD_MKEY_QPN, 0xe0000063)            \
  V(BAD_QP_TYPE, 0xe0000070)             \
  V(BAD_QP_STATE, 0xe0000071)            \
  V(BAD_MTU, 0xe0000072)                 \
  V(BAD_GID_INDEX, 0xe0000073)           \
  V(BAD_PORT, 0xe0000074)                \
  V(BAD_RQ_TYPE, 0xe0000075)             \
  V(BAD_PKEY_INDEX, 0xe0000076)          \
  V(BAD_RD_ATOMIC, 0xe0000077)           \
  V(ROCE_DISABLED, 0xe0000078)           \
  V(GSI_TAKEN, 0xe0000079)               \
  V(BAD_REGISTER, 0xe0000080)            \
  V(BAD_REGISTER_VALUE, 0xe0000081)      \
  V(BAD_ROCE_ADDRESS, 0xe0000082)        \
  V(BAD_FIELD_SELECT, 0xe0000083)        \
  V(BAD_VPORT, 0xe0000084)               \
  V(UNKNOWN_UMEM, 0xe0000085)            \
  V(BAD_UMEM, 0xe0000086)                \
  V(INJECTED, 0xe00000ff)
MELON_PRM_VALUES(synd, uint32_t, MELON_EMU_SYNDROMES)

}  // namespace melon::mlx5::emu
