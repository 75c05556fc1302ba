// Memory keys: mkey context, MTT entries, physical address list, CREATE/DESTROY/QUERY_MKEY.
// Bit offsets and widths are PRM facts; tests/mlx5/prm checks every one against the kernel's mlx5_ifc.h.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

#define MELON_PRM_CMD_PAS(F, S, A) \
  F(pa_h, 0, 32)                   \
  F(pa_l, 32, 20)
MELON_PRM_STRUCT(cmd_pas, 64, MELON_PRM_CMD_PAS)

#define MELON_PRM_MTT(F, S, A) \
  F(ptag_63_32, 0, 32)         \
  F(ptag_31_8, 32, 24)         \
  F(wr_en, 62, 1)              \
  F(rd_en, 63, 1)
MELON_PRM_STRUCT(mtt, 64, MELON_PRM_MTT)

#define MELON_PRM_MKC(F, S, A)                \
  F(free, 1, 1)                               \
  F(access_mode_4_2, 3, 3)                    \
  F(relaxed_ordering_write, 13, 1)            \
  F(small_fence_on_rdma_read_response, 15, 1) \
  F(umr_en, 16, 1)                            \
  F(a, 17, 1)                                 \
  F(rw, 18, 1)                                \
  F(rr, 19, 1)                                \
  F(lw, 20, 1)                                \
  F(lr, 21, 1)                                \
  F(access_mode_1_0, 22, 2)                   \
  F(ma_translation_mode, 26, 2)               \
  F(qpn, 32, 24)                              \
  F(mkey_7_0, 56, 8)                          \
  F(length64, 96, 1)                          \
  F(bsf_en, 97, 1)                            \
  F(sync_umr, 98, 1)                          \
  F(expected_sigerr_count, 101, 1)            \
  F(en_rinval, 103, 1)                        \
  F(pd, 104, 24)                              \
  F(start_addr, 128, 64)                      \
  F(len, 192, 64)                             \
  F(bsf_octword_size, 256, 32)                \
  F(translations_octword_size, 416, 32)       \
  F(relaxed_ordering_read, 473, 1)            \
  F(log_page_size, 475, 5)
MELON_PRM_STRUCT(mkc, 512, MELON_PRM_MKC)

#define MELON_PRM_CREATE_MKEY_IN(F, S, A)      \
  F(opcode, 0, 16)                             \
  F(uid, 16, 16)                               \
  F(op_mod, 48, 16)                            \
  F(pg_access, 96, 1)                          \
  F(mkey_umem_valid, 97, 1)                    \
  S(memory_key_mkey_entry, 128, mkc)           \
  F(translations_octword_actual_size, 768, 32) \
  A(klm_pas_mtt, 2176, 32)
MELON_PRM_STRUCT(create_mkey_in, 2176, MELON_PRM_CREATE_MKEY_IN)

#define MELON_PRM_CREATE_MKEY_OUT(F, S, A) \
  F(status, 0, 8)                          \
  F(syndrome, 32, 32)                      \
  F(mkey_index, 72, 24)
MELON_PRM_STRUCT(create_mkey_out, 128, MELON_PRM_CREATE_MKEY_OUT)

#define MELON_PRM_DESTROY_MKEY_IN(F, S, A) \
  F(opcode, 0, 16)                         \
  F(uid, 16, 16)                           \
  F(op_mod, 48, 16)                        \
  F(mkey_index, 72, 24)
MELON_PRM_STRUCT(destroy_mkey_in, 128, MELON_PRM_DESTROY_MKEY_IN)

#define MELON_PRM_DESTROY_MKEY_OUT(F, S, A) \
  F(status, 0, 8)                           \
  F(syndrome, 32, 32)
MELON_PRM_STRUCT(destroy_mkey_out, 128, MELON_PRM_DESTROY_MKEY_OUT)

#define MELON_PRM_QUERY_MKEY_IN(F, S, A) \
  F(opcode, 0, 16)                       \
  F(op_mod, 48, 16)                      \
  F(mkey_index, 72, 24)                  \
  F(pg_access, 96, 1)
MELON_PRM_STRUCT(query_mkey_in, 128, MELON_PRM_QUERY_MKEY_IN)

#define MELON_PRM_QUERY_MKEY_OUT(F, S, A) \
  F(status, 0, 8)                         \
  F(syndrome, 32, 32)                     \
  S(memory_key_mkey_entry, 128, mkc)      \
  F(bsf0_klm0_pas_mtt0_1, 2176, 128)      \
  F(bsf1_klm1_pas_mtt2_3, 2304, 128)
MELON_PRM_STRUCT(query_mkey_out, 2432, MELON_PRM_QUERY_MKEY_OUT)

// mkc.access_mode_4_2:access_mode_1_0, a 5-bit value split in two fields.
#define MELON_PRM_MKC_ACCESS_MODE(V) \
  V(PA, 0x0)                         \
  V(MTT, 0x1)                        \
  V(KLMS, 0x2)                       \
  V(KSM, 0x3)
MELON_PRM_VALUES(mkc_access_mode, uint8_t, MELON_PRM_MKC_ACCESS_MODE)
inline constexpr uint32_t kMttBytes = mtt::Self::size_bits / 8;  // 8

// KLM entry (indirect mkey translation): not in mlx5_ifc.h; checked against mlx5dv.h's
// struct mlx5_wqe_umr_klm_seg.
#define MELON_PRM_KLM(F, S, A) \
  F(byte_count, 0, 32)         \
  F(mkey, 32, 32)              \
  F(address, 64, 64)
MELON_PRM_STRUCT(klm, 128, MELON_PRM_KLM)

// Typed helpers: the access mode is one 5-bit value split over two fields of mkc.
inline void mkc_set_access_mode(mkc::view m, uint8_t mode) {
  m.set(mkc::access_mode_1_0, mode & 0x3).set(mkc::access_mode_4_2, (mode >> 2) & 0x7);
}
inline uint8_t mkc_get_access_mode(mkc::cview m) {
  return uint8_t((m.get(mkc::access_mode_4_2) << 2) | m.get(mkc::access_mode_1_0));
}
// One MTT entry: a page address (bits 63:8 kept) and read/write enables.
inline void mtt_set(void* entry, uint64_t pa, bool rd, bool wr) {
  mtt::view(entry)
      .set(mtt::ptag_63_32, pa >> 32)
      .set(mtt::ptag_31_8, (pa & 0xffffffffu) >> 8)
      .set(mtt::rd_en, rd)
      .set(mtt::wr_en, wr);
}
inline uint64_t mtt_pa(const void* entry) {
  mtt::cview m(entry);
  return (m.get(mtt::ptag_63_32) << 32) | (m.get(mtt::ptag_31_8) << 8);
}
// One physical address list entry (4 KiB pages): used by EQ, CQ, QP, SRQ and MANAGE_PAGES.
inline void pas_set(void* entry, uint64_t pa) {
  cmd_pas::view(entry).set(cmd_pas::pa_h, pa >> 32).set(cmd_pas::pa_l, (pa & 0xffffffffu) >> 12);
}
inline uint64_t pas_pa(const void* entry) {
  cmd_pas::cview p(entry);
  return (p.get(cmd_pas::pa_h) << 32) | (p.get(cmd_pas::pa_l) << 12);
}

}  // namespace melon::mlx5::prm
