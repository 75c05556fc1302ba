// Turning DMA segments into the page lists the HCA wants (MTTs for mkeys, PAS for queues).
//
// Segments come from the HAL in host pages (16 KiB on Apple silicon, 4 KiB on x86); the HCA
// translates in pages of 2^shift bytes, shift >= 12. Contiguous segments are coalesced into runs
// first; a shift fits when every run boundary inside the range falls on a 2^shift boundary and
// the first run's offset in its page equals the virtual address's. best_page_shift() picks the
// largest fitting shift up to a cap; for_each_page() walks the pages of that size.
#pragma once

#include "mlx5/core/hal.h"

namespace melon::mlx5::core {

// The largest shift in [12, max_shift] that maps `va` onto the segments, or 0 when even 4 KiB
// pages do not (misaligned segments).
uint32_t best_page_shift(const DmaSegment* segs, uint32_t n, uint64_t va, uint32_t max_shift);

// Pages of 2^shift bytes covering the segments, in order: calls f(page_iova) for each and
// returns how many there were.
template <class F>
uint64_t for_each_page(const DmaSegment* segs, uint32_t n, uint32_t shift, F&& f) {
  uint64_t size = uint64_t(1) << shift, count = 0;
  uint64_t last = ~uint64_t(0);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t end = segs[i].iova + segs[i].len;
    for (uint64_t pa = segs[i].iova & ~(size - 1); pa < end; pa += size) {
      // Contiguous segments that meet inside a page share it: emit it once.
      if (pa == last) continue;
      f(pa);
      ++count;
      last = pa;
    }
  }
  return count;
}

// Total bytes of the segments.
inline uint64_t segments_bytes(const DmaSegment* segs, uint32_t n) {
  uint64_t b = 0;
  for (uint32_t i = 0; i < n; ++i) b += segs[i].len;
  return b;
}

}  // namespace melon::mlx5::core
