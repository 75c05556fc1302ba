/* One row per layout fact: a struct's size, a field's offset and size, or an enumerator's value. */
#ifndef MELON_TESTS_VERBS_LAYOUT_TABLE_H
#define MELON_TESTS_VERBS_LAYOUT_TABLE_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
struct melon_layout_row {
  const char* what; /* "struct ibv_wc", "struct ibv_wc.byte_len", "IBV_WC_RECV" */
  long long value; /* size, offset or enumerator value */
  long long size; /* field size, or -1 */
};
extern const struct melon_layout_row melon_layout_ours[];
extern const size_t melon_layout_ours_count;
extern const struct melon_layout_row melon_layout_stock[];
extern const size_t melon_layout_stock_count;
#ifdef __cplusplus
}
#endif
#endif
