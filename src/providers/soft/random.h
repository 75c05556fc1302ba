// Unpredictable numbers for what a remote sender must not guess: memory keys and QPNs (a forged
// RoCE packet needs only a QPN, a PSN in the window and, for RDMA, an rkey and an address; the
// ReDMArk study, USENIX Security 2021, shows what predictable keys cost).
//
// Locks: none; the system's generator is safe from any thread.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace melon::soft {

// Fills `buf` from the operating system's CSPRNG (getrandom on Linux, arc4random_buf on Darwin).
void random_bytes(void* buf, size_t len);
uint32_t random_u32();

}  // namespace melon::soft
