// Doorbells through a watched UAR page: how a client's doorbell writes reach the device when its UAR
// mapping is memory rather than MMIO (melon-emud on Linux; docs/uapi.md "Doorbells").
//
// On hardware the UAR page is the device's: a store at the CQ arm doorbell (prm::kUarCqDoorbell,
// 0x20) or at a send doorbell / BlueFlame buffer (UarResp::db_offset, 0x800, and the second buffer
// at db_offset + bf_bytes) is an MMIO write. melon-emud hands out a shared memory page instead and
// a watcher thread in the daemon plays the bus: it compares those doorbell words with the values it
// saw last and writes every new one to the device's BAR0 at the same offset of the object's UAR
// page. A map of kind `uar` whose MapResp::flags has kMapWatched is such a page; without the flag
// (real MMIO) the client must never touch the block below.
//
// Several QPs and CQs may share one UAR page (rdma-core's shared bfreg), and a word the watcher
// polls keeps only the last value written to it: QP A's doorbell at 0x800 overwritten by QP B's
// before a scan would be lost, where MMIO would have delivered both. So the watcher also reads the
// doorbell records of every QP and CQ bound to the page (the provider writes them before the UAR
// doorbell, as rdma-core does): a QP whose send counter (record dword 1) moved is rung, a CQ whose
// arm word (record dword 1: sn, cmd, ci) changed is armed with it, each once whichever way it was
// seen. A CQ's record comes with the arm word at kCqArmNone, a value no arm writes; the provider
// must leave it so until its first arm (rdma-core's create_cq clears it: on a watched page, don't),
// or a first arm (sn 0, ci 0: all zero) would look like no arm at all.
//
// The watcher spins while doorbells come and sleeps when they stop. So that a doorbell written to a
// sleeping device is not left lying, the page holds one more 64-byte block, at kUarWatchOffset (in
// the range the PRM leaves reserved, below the BlueFlame buffers and above the EQ doorbells):
//
//   sleeping  written by the daemon: nonzero while its watcher sleeps (or is about to)
//   kick      a futex word: the client adds 1 and wakes it (FUTEX_WAKE, not private: the page is
//             shared between processes) after a doorbell, when it finds `sleeping` set
//
// The client, after each doorbell store (8-byte doorbell or BlueFlame copy):
//
//     if (uar_watch_sleeping(w)) { uar_watch_kick(w); futex(&w->kick, FUTEX_WAKE, 1); }
//
// The daemon sets `sleeping`, issues a full fence, reads `kick`, scans the doorbells once more and
// only then sleeps on `kick` (with the value it read). Either the client's load sees `sleeping`, or
// the daemon's scan sees the doorbell (and the doorbell record, stored before it): the two fences
// order store-then-load on both sides. A kick that finds every word and record as before (the same
// bytes written again: a QP reset to counter 0 posting the same first WQE) rings every QP of the
// page, a no-op for those with nothing new.
//
// Freestanding: <stdint.h> and compiler builtins only (the provider, the daemon and the DEXT share it).
#pragma once

#include <stdint.h>

#include "uapi/abi.h"

namespace melon::uapi {

// A watched CQ's doorbell record arm word (dword 1, as stored) before the first arm: cmd 0xf, which
// is no arm command (next 0, solicited 1).
inline constexpr uint32_t kCqArmNone = 0xffffffffu;

// Where the block sits in the UAR page; 64 bytes, one cache line of its own.
inline constexpr uint32_t kUarWatchOffset = 0x400;

struct UarWatch {
  uint32_t kick;  // client: += 1 and FUTEX_WAKE when `sleeping` was seen set
  uint32_t sleeping;  // daemon: 1 while the watcher sleeps, 0 while it polls
  uint32_t reserved[14];  // zero
};
static_assert(sizeof(UarWatch) == 64);
static_assert(kUarWatchOffset % 64 == 0 && kUarWatchOffset + sizeof(UarWatch) <= 0x800);

inline UarWatch* uar_watch(void* uar_page) {
  return reinterpret_cast<UarWatch*>(static_cast<uint8_t*>(uar_page) + kUarWatchOffset);
}

// After the doorbell store: true when the watcher sleeps and must be woken. The full fence orders
// the doorbell store before the load of `sleeping` (a store-load order no weaker barrier gives).
inline bool uar_watch_sleeping(const UarWatch* w) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return __atomic_load_n(&w->sleeping, __ATOMIC_RELAXED) != 0;
}

// Bumps the futex word; the caller then wakes one waiter on &w->kick.
inline void uar_watch_kick(UarWatch* w) { __atomic_fetch_add(&w->kick, 1u, __ATOMIC_SEQ_CST); }

}  // namespace melon::uapi
