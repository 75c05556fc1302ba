#include "rc/scatter_gather.h"

#include <string.h>

namespace melon::rc {

MemStatus check_range(HostMemory& mem, KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len,
                      uint32_t access) {
  return mem.check(kind, pd, key, addr, len, access);
}

MemStatus append_spans(HostMemory& mem, KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len,
                       uint32_t access, TxPacket& tx, uint64_t rest) {
  if (rest > len) mem.will_gather(key, addr, rest);
  while (len) {
    Span s;
    MemStatus st = mem.map(kind, pd, key, addr, len, access, &s);
    if (st != MemStatus::ok) return st;
    if (s.len == 0 || s.len > len || tx.niov == TxPacket::kMaxIov)
      return MemStatus::out_of_range;  // host broke the contract
    tx.iov[tx.niov++] = s;
    tx.payload_len += s.len;
    addr += s.len;
    len -= s.len;
  }
  return MemStatus::ok;
}

MemStatus copy_in(HostMemory& mem, KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, const uint8_t* src,
                  uint32_t len, uint32_t access) {
  while (len) {
    Span s;
    MemStatus st = mem.map(kind, pd, key, addr, len, access, &s);
    if (st != MemStatus::ok) return st;
    if (s.len == 0 || s.len > len) return MemStatus::out_of_range;
    memcpy(s.ptr, src, s.len);
    src += s.len;
    addr += s.len;
    len -= s.len;
  }
  return MemStatus::ok;
}

MemStatus gather(HostMemory& mem, uint32_t pd, const Seg* seg, int nseg, bool inline_data, uint32_t off, uint32_t len,
                 TxPacket& tx) {
  for (int i = 0; i < nseg && len; ++i) {
    const Seg& s = seg[i];
    if (off >= s.len) {
      off -= s.len;
      continue;
    }
    uint32_t n = s.len - off < len ? s.len - off : len;
    if (inline_data) {
      tx.iov[tx.niov++] = Span{reinterpret_cast<uint8_t*>(uintptr_t(s.addr)) + off, n};
      tx.payload_len += n;
      tx.inline_payload = true;
    } else if (MemStatus st = append_spans(mem, KeyKind::local, pd, s.lkey, s.addr + off, n, 0, tx, s.len - off);
               st != MemStatus::ok) {
      return st;
    }
    len -= n;
    off = 0;
  }
  return MemStatus::ok;
}

MemStatus scatter(HostMemory& mem, uint32_t pd, const Seg* seg, int nseg, uint32_t off, const uint8_t* src,
                  uint32_t len) {
  for (int i = 0; i < nseg && len; ++i) {
    const Seg& s = seg[i];
    if (off >= s.len) {
      off -= s.len;
      continue;
    }
    uint32_t n = s.len - off < len ? s.len - off : len;
    if (MemStatus st = copy_in(mem, KeyKind::local, pd, s.lkey, s.addr + off, src, n, kLocalWrite); st != MemStatus::ok)
      return st;
    src += n;
    len -= n;
    off = 0;
  }
  return MemStatus::ok;
}

}  // namespace melon::rc
