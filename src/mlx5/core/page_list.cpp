#include "mlx5/core/page_list.h"

namespace melon::mlx5::core {

uint32_t best_page_shift(const DmaSegment* segs, uint32_t n, uint64_t va, uint32_t max_shift) {
  if (!n) return 0;
  // Every boundary between runs of contiguous segments must be page aligned; OR them together
  // and the lowest set bit limits the page size.
  uint64_t bounds = 0;
  for (uint32_t i = 0; i < n; ++i) {
    bool joins_prev = i > 0 && segs[i - 1].iova + segs[i - 1].len == segs[i].iova;
    if (i > 0 && !joins_prev) bounds |= segs[i].iova | (segs[i - 1].iova + segs[i - 1].len);
  }
  // The first page's offset must be the virtual address's offset.
  uint64_t off_mismatch = segs[0].iova ^ va;
  // No page larger than the whole range needs (it would only add translation reach).
  uint64_t total = segs[0].iova & 0xfff;
  for (uint32_t i = 0; i < n; ++i) total += segs[i].len;
  uint32_t reach = 12;
  while (reach < 63 && (uint64_t(1) << reach) < total) ++reach;
  if (max_shift > reach) max_shift = reach;
  for (uint32_t s = max_shift; s >= 12; --s) {
    uint64_t mask = (uint64_t(1) << s) - 1;
    if ((bounds & mask) == 0 && (off_mismatch & mask) == 0) return s;
  }
  return 0;
}

}  // namespace melon::mlx5::core
