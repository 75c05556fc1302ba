// Moving bytes between packets and registered memory through HostMemory::map, one contiguous span
// at a time: the engine never assumes a key's range is one host pointer.
#pragma once
#include <stdint.h>

#include "rc/engine.h"

namespace melon::rc {

// A local scatter/gather list as a WQE keeps it. Inline data (SendWqe) is one segment whose `addr`
// is the engine's own copy and whose lkey is ignored.
struct Seg {
  uint64_t addr = 0;
  uint32_t len = 0;
  uint32_t lkey = 0;
};

// Checks a whole range without touching it.
MemStatus check_range(HostMemory& mem, KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len,
                      uint32_t access);

// Appends the spans of [addr, addr + len) of `key` to tx.iov (and adds len to tx.payload_len).
// `rest` (>= len): what the work request sends from addr on in this range (HostMemory::will_gather).
MemStatus append_spans(HostMemory& mem, KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len,
                       uint32_t access, TxPacket& tx, uint64_t rest = 0);

// Copies `len` bytes from `src` into [addr, addr + len) of `key`.
MemStatus copy_in(HostMemory& mem, KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, const uint8_t* src,
                  uint32_t len, uint32_t access);

// Gathers `len` bytes at byte offset `off` of a local list into tx.iov (local read access).
MemStatus gather(HostMemory& mem, uint32_t pd, const Seg* seg, int nseg, bool inline_data, uint32_t off, uint32_t len,
                 TxPacket& tx);

// Scatters `len` bytes to byte offset `off` of a local list (local write access). The caller checked
// that off + len fits.
MemStatus scatter(HostMemory& mem, uint32_t pd, const Seg* seg, int nseg, uint32_t off, const uint8_t* src,
                  uint32_t len);

}  // namespace melon::rc
