// See mmio_trap.h. A small x86-64 decoder for the instructions that touch MMIO in practice.
#include "mmio_trap.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>

#if !defined(__x86_64__) || !defined(__linux__)
#error "tests/vfio's MMIO trap decodes x86-64 instructions on Linux"
#endif

namespace melon::vfio {

namespace {

struct Region {
  std::atomic<uintptr_t> base{0};
  size_t len = 0;
  MmioTarget* target = nullptr;
};
constexpr int kMaxRegions = 8;
Region g_regions[kMaxRegions];

struct sigaction g_old_segv, g_old_trap;
std::atomic<bool> g_installed{false};
std::atomic<uint64_t> g_loads{0}, g_stores{0}, g_steps{0};

// The single-stepped load in flight (one at a time, any thread).
std::atomic<int> g_step_lock{0};
thread_local uintptr_t t_step_page = 0;

Region* find_region(uintptr_t a) {
  for (auto& r : g_regions) {
    uintptr_t b = r.base.load(std::memory_order_acquire);
    if (b && a >= b && a < b + r.len) return &r;
  }
  return nullptr;
}

void die(const char* what, const uint8_t* ip) {
  char buf[256];
  int n = snprintf(buf, sizeof buf, "melon-vfio: %s at %p:", what, static_cast<const void*>(ip));
  for (int i = 0; i < 15 && n < int(sizeof buf) - 4; ++i) n += snprintf(buf + n, sizeof buf - n, " %02x", ip[i]);
  n += snprintf(buf + n, sizeof buf - n, "\n");
  ssize_t w = write(2, buf, size_t(n));
  (void)w;
  abort();
}

// gregs index of general register 0..15 (rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15).
int greg_index(int r) {
  static const int map[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                              REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};
  return map[r & 15];
}

struct Insn {
  size_t len = 0;  // total length
  bool rex_w = false, opsize = false, rex = false;
  int rex_r = 0, rex_b = 0;
  uint8_t pfx_rep = 0;  // F2 / F3
  int reg = 0;  // ModRM.reg (with REX.R)
  int mod = 0, rm = 0;
};

// ModRM (+ SIB + displacement) at p; returns bytes consumed.
size_t modrm_len(const uint8_t* p, Insn& in) {
  uint8_t m = p[0];
  in.mod = m >> 6;
  in.reg = ((m >> 3) & 7) | (in.rex_r << 3);
  in.rm = (m & 7) | (in.rex_b << 3);
  size_t n = 1;
  if (in.mod == 3) return n;
  if ((m & 7) == 4) {  // SIB
    uint8_t sib = p[1];
    ++n;
    if (in.mod == 0 && (sib & 7) == 5) n += 4;
  } else if (in.mod == 0 && (m & 7) == 5) {
    n += 4;  // RIP-relative
  }
  if (in.mod == 1) n += 1;
  if (in.mod == 2) n += 4;
  return n;
}

uint64_t get_reg(ucontext_t* uc, int r) { return uint64_t(uc->uc_mcontext.gregs[greg_index(r)]); }
void set_reg(ucontext_t* uc, int r, uint64_t v) { uc->uc_mcontext.gregs[greg_index(r)] = int64_t(v); }

// 8-bit register operand: without REX, 4..7 are AH, CH, DH, BH.
uint8_t get_reg8(ucontext_t* uc, const Insn& in, int r) {
  if (!in.rex && r >= 4 && r < 8) return uint8_t(get_reg(uc, r - 4) >> 8);
  return uint8_t(get_reg(uc, r));
}
void set_reg8(ucontext_t* uc, const Insn& in, int r, uint8_t v) {
  if (!in.rex && r >= 4 && r < 8) {
    uint64_t x = get_reg(uc, r - 4);
    set_reg(uc, r - 4, (x & ~0xff00ull) | uint64_t(v) << 8);
    return;
  }
  set_reg(uc, r, (get_reg(uc, r) & ~0xffull) | v);
}
// Destination write of an `n`-byte load into a general register (32-bit writes zero-extend).
void set_reg_sized(ucontext_t* uc, int r, uint64_t v, size_t n) {
  if (n == 8)
    set_reg(uc, r, v);
  else if (n == 4)
    set_reg(uc, r, v & 0xffffffffull);
  else if (n == 2)
    set_reg(uc, r, (get_reg(uc, r) & ~0xffffull) | (v & 0xffff));
}

uint8_t* xmm_bytes(ucontext_t* uc, int r) { return reinterpret_cast<uint8_t*>(&uc->uc_mcontext.fpregs->_xmm[r & 15]); }

// What an instruction does to memory, if it is one we emulate.
enum class Op { kNone, kStoreReg, kStoreImm, kStoreXmm, kLoadReg, kLoadZx, kLoadSx, kLoadXmm };

struct Decoded {
  Insn in;
  Op op = Op::kNone;
  size_t width = 0;  // bytes moved
  uint64_t imm = 0;
  bool xmm_zero_upper = false;  // a movd/movq/movss/movsd load clears the rest of the register
};

Decoded decode(const uint8_t* ip) {
  Decoded d;
  Insn& in = d.in;
  const uint8_t* p = ip;
  for (int i = 0; i < 14; ++i, ++p) {  // legacy prefixes
    uint8_t b = *p;
    if (b == 0x66)
      in.opsize = true;
    else if (b == 0xf2 || b == 0xf3)
      in.pfx_rep = b;
    else if (b == 0x67 || b == 0xf0 || b == 0x2e || b == 0x3e || b == 0x26 || b == 0x36 || b == 0x64 || b == 0x65)
      continue;
    else
      break;
  }
  if ((*p & 0xf0) == 0x40) {
    in.rex = true;
    in.rex_w = *p & 8;
    in.rex_r = (*p >> 2) & 1;
    in.rex_b = *p & 1;
    ++p;
  }
  size_t gw = in.rex_w ? 8 : in.opsize ? 2 : 4;
  uint8_t op = *p++;
  if (op == 0x88 || op == 0x89 || op == 0x8a || op == 0x8b) {
    p += modrm_len(p, in);
    if (in.mod == 3) return d;
    d.op = (op & 2) ? Op::kLoadReg : Op::kStoreReg;
    d.width = (op & 1) ? gw : 1;
  } else if (op == 0xc6 || op == 0xc7) {
    p += modrm_len(p, in);
    if (in.mod == 3 || (in.reg & 7) != 0) return d;
    d.op = Op::kStoreImm;
    if (op == 0xc6) {
      d.width = 1;
      d.imm = *p++;
    } else if (gw == 2) {
      d.width = 2;
      d.imm = uint16_t(p[0] | p[1] << 8);
      p += 2;
    } else {
      int32_t v;
      memcpy(&v, p, 4);
      p += 4;
      d.width = gw;
      d.imm = uint64_t(int64_t(v));
    }
  } else if (op == 0x0f) {
    uint8_t op2 = *p++;
    if (op2 == 0xb6 || op2 == 0xb7 || op2 == 0xbe || op2 == 0xbf) {  // movzx / movsx
      p += modrm_len(p, in);
      if (in.mod == 3) return d;
      d.op = (op2 & 8) ? Op::kLoadSx : Op::kLoadZx;
      d.width = (op2 & 1) ? 2 : 1;
    } else if (op2 == 0xc3) {  // movnti
      p += modrm_len(p, in);
      if (in.mod == 3) return d;
      d.op = Op::kStoreReg;
      d.width = in.rex_w ? 8 : 4;
    } else if (op2 == 0x10 || op2 == 0x11 || op2 == 0x28 || op2 == 0x29 || op2 == 0x2b || op2 == 0xe7 ||
               ((op2 == 0x6f || op2 == 0x7f) && (in.opsize || in.pfx_rep == 0xf3)) ||
               ((op2 == 0x6e || op2 == 0x7e) && in.opsize) || (op2 == 0x7e && in.pfx_rep == 0xf3) ||
               (op2 == 0xd6 && in.opsize)) {
      p += modrm_len(p, in);
      if (in.mod == 3) return d;
      bool store = op2 == 0x11 || op2 == 0x29 || op2 == 0x2b || op2 == 0xe7 || op2 == 0x7f || op2 == 0xd6 ||
                   (op2 == 0x7e && in.opsize);
      d.op = store ? Op::kStoreXmm : Op::kLoadXmm;
      d.width = 16;
      if (op2 == 0x10 || op2 == 0x11) {
        if (in.pfx_rep == 0xf3)
          d.width = 4;
        else if (in.pfx_rep == 0xf2)
          d.width = 8;
        d.xmm_zero_upper = in.pfx_rep != 0;
      }
      if (op2 == 0x6e || op2 == 0x7e) {
        d.width = (in.rex_w || in.pfx_rep == 0xf3) ? 8 : 4;
        d.xmm_zero_upper = true;
      }
      if (op2 == 0xd6) d.width = 8;
    } else {
      return d;
    }
  } else {
    return d;
  }
  in.len = size_t(p - ip);
  return d;
}

void fill_for_step(Region* r, uintptr_t addr) {
  // The bytes a load may read (up to 32 from the faulting address, within its page), fresh.
  uintptr_t page = addr & ~uintptr_t(4095);
  uintptr_t start = addr & ~uintptr_t(3), end = start + 32;
  if (end > page + 4096) end = page + 4096;
  if (mprotect(reinterpret_cast<void*>(page), 4096, PROT_READ | PROT_WRITE) != 0) abort();
  for (uintptr_t a = start; a < end; a += 4) r->target->mmio_load(a - r->base.load(), reinterpret_cast<void*>(a), 4);
  if (mprotect(reinterpret_cast<void*>(page), 4096, PROT_READ) != 0) abort();
}

void chain(const struct sigaction& old, int sig, siginfo_t* si, void* ctx) {
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction) old.sa_sigaction(sig, si, ctx);
    return;
  }
  if (old.sa_handler == SIG_IGN) return;
  if (old.sa_handler == SIG_DFL || old.sa_handler == nullptr) {
    signal(sig, SIG_DFL);  // re-raise on return: the fault repeats with the default action
    if (sig == SIGTRAP) raise(sig);
    return;
  }
  old.sa_handler(sig);
}

void on_segv(int sig, siginfo_t* si, void* vctx) {
  auto* uc = static_cast<ucontext_t*>(vctx);
  uintptr_t addr = reinterpret_cast<uintptr_t>(si->si_addr);
  Region* r = find_region(addr);
  if (!r) return chain(g_old_segv, sig, si, vctx);
  uint64_t off = addr - r->base.load();
  auto* ip = reinterpret_cast<const uint8_t*>(uc->uc_mcontext.gregs[REG_RIP]);
  bool is_write = uc->uc_mcontext.gregs[REG_ERR] & 2;
  Decoded d = decode(ip);
  if (d.op == Op::kNone) {
    if (is_write) die("an MMIO store this interposer cannot decode", ip);
    // A load we do not emulate (CMP/TEST with memory, ...): single-step it on a fresh read-only page.
    int expected = 0;
    while (!g_step_lock.compare_exchange_weak(expected, 1, std::memory_order_acquire)) expected = 0;
    fill_for_step(r, addr);
    t_step_page = addr & ~uintptr_t(4095);
    uc->uc_mcontext.gregs[REG_EFL] |= 0x100;  // TF
    ++g_steps;
    return;
  }
  bool store = d.op == Op::kStoreReg || d.op == Op::kStoreImm || d.op == Op::kStoreXmm;
  if (store != is_write) die("an MMIO access whose direction the decoder misread", ip);
  uint8_t buf[16] = {};
  switch (d.op) {
    case Op::kStoreReg: {
      uint64_t v = d.width == 1 ? get_reg8(uc, d.in, d.in.reg) : get_reg(uc, d.in.reg);
      memcpy(buf, &v, d.width);
      break;
    }
    case Op::kStoreImm: memcpy(buf, &d.imm, d.width); break;
    case Op::kStoreXmm: memcpy(buf, xmm_bytes(uc, d.in.reg), d.width); break;
    default: break;
  }
  if (store) {
    r->target->mmio_store(off, buf, d.width);
    ++g_stores;
  } else {
    r->target->mmio_load(off, buf, d.width);
    ++g_loads;
    uint64_t v = 0;
    memcpy(&v, buf, d.width > 8 ? 8 : d.width);
    switch (d.op) {
      case Op::kLoadReg:
        if (d.width == 1)
          set_reg8(uc, d.in, d.in.reg, uint8_t(v));
        else
          set_reg_sized(uc, d.in.reg, v, d.width);
        break;
      case Op::kLoadZx: set_reg_sized(uc, d.in.reg, v, d.in.rex_w ? 8 : d.in.opsize ? 2 : 4); break;
      case Op::kLoadSx: {
        int64_t s = d.width == 1 ? int64_t(int8_t(v)) : int64_t(int16_t(v));
        set_reg_sized(uc, d.in.reg, uint64_t(s), d.in.rex_w ? 8 : d.in.opsize ? 2 : 4);
        break;
      }
      case Op::kLoadXmm: {
        uint8_t* x = xmm_bytes(uc, d.in.reg);
        if (d.xmm_zero_upper) memset(x, 0, 16);
        memcpy(x, buf, d.width);
        break;
      }
      default: break;
    }
  }
  uc->uc_mcontext.gregs[REG_RIP] += int64_t(d.in.len);
}

void on_trap(int sig, siginfo_t* si, void* vctx) {
  auto* uc = static_cast<ucontext_t*>(vctx);
  if (!t_step_page) return chain(g_old_trap, sig, si, vctx);
  mprotect(reinterpret_cast<void*>(t_step_page), 4096, PROT_NONE);
  t_step_page = 0;
  uc->uc_mcontext.gregs[REG_EFL] &= ~0x100ll;
  g_step_lock.store(0, std::memory_order_release);
}

void install() {
  if (g_installed.exchange(true)) return;
  struct sigaction sa = {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
  sa.sa_sigaction = on_trap;
  sigaction(SIGTRAP, &sa, &g_old_trap);
}

}  // namespace

void mmio_trap_register(void* base, size_t len, MmioTarget* target) {
  install();
  for (auto& r : g_regions) {
    uintptr_t expected = 0;
    if (r.base.load() != 0) continue;
    r.len = len;
    r.target = target;
    if (r.base.compare_exchange_strong(expected, reinterpret_cast<uintptr_t>(base))) return;
  }
  abort();
}

void mmio_trap_unregister(void* base) {
  for (auto& r : g_regions)
    if (r.base.load() == reinterpret_cast<uintptr_t>(base)) r.base.store(0);
}

MmioTrapStats mmio_trap_stats() { return {g_loads.load(), g_stores.load(), g_steps.load()}; }

}  // namespace melon::vfio
