#include "providers/soft/steering.h"

namespace melon::soft {

namespace {

// Classic BPF opcodes (linux/filter.h and linux/bpf_common.h; the values are the ABI).
constexpr uint16_t kLdAbsW = 0x20;  // BPF_LD | BPF_W | BPF_ABS: A = big-endian word at k
constexpr uint16_t kAndK = 0x54;  // BPF_ALU | BPF_AND | BPF_K
constexpr uint16_t kRshK = 0x74;  // BPF_ALU | BPF_RSH | BPF_K
constexpr uint16_t kJa = 0x05;  // BPF_JMP | BPF_JA: skip k
constexpr uint16_t kJeqK = 0x15;  // BPF_JMP | BPF_JEQ | BPF_K
constexpr uint16_t kJgeK = 0x35;  // BPF_JMP | BPF_JGE | BPF_K
constexpr uint16_t kRetK = 0x06;  // BPF_RET | BPF_K
constexpr uint16_t kRetA = 0x16;  // BPF_RET | BPF_A

struct Run {
  uint32_t first, index;
};

// A binary search over runs of buckets with one index: [jge first-of-right] [ja over left] [left]
// [right]. Jump offsets of jt/jf are 8 bits, so the far jump is a JA (32 bits).
void emit_tree(const std::vector<Run>& runs, size_t lo, size_t hi, std::vector<CbpfInsn>* out) {
  if (hi - lo == 1) {
    out->push_back({kRetK, 0, 0, runs[lo].index});
    return;
  }
  const size_t mid = (lo + hi) / 2;
  std::vector<CbpfInsn> left;
  emit_tree(runs, lo, mid, &left);
  out->push_back({kJgeK, 0, 1, runs[mid].first});
  out->push_back({kJa, 0, 0, uint32_t(left.size())});
  out->insert(out->end(), left.begin(), left.end());
  emit_tree(runs, mid, hi, out);
}

uint32_t load_be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}
void store_be32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24), p[1] = uint8_t(v >> 16), p[2] = uint8_t(v >> 8), p[3] = uint8_t(v);
}

}  // namespace

std::vector<CbpfInsn> build_steering_program(const SteeringTable& t) {
  std::vector<CbpfInsn> p = {
      {kLdAbsW, 0, 0, 0},  // 0: word 0: a probe's magic, or a BTH's opcode, flags and P_Key
      {kJeqK, 0, 7, kProbeMagic},  // 1: not a probe: to 9
      {kLdAbsW, 0, 0, 4},  // 2
      {kJeqK, 0, 4, t.secret[0]},  // 3: a wrong secret: to 8
      {kLdAbsW, 0, 0, 8},  // 4
      {kJeqK, 0, 2, t.secret[1]},  // 5
      {kLdAbsW, 0, 0, 12},  // 6: the index the probe names
      {kRetA, 0, 0, 0},  // 7
      {kRetK, 0, 0, kNoSocket},  // 8
      {kLdAbsW, 0, 0, 4},  // 9: BTH word 1: reserved byte, destination QPN
      {kAndK, 0, 0, 0xffffff},  // 10
      {kJeqK, 0, 1, 1},  // 11: the GSI (QP1)
      {kRetK, 0, 0, t.gsi_index},  // 12
      {kRshK, 0, 0, kBucketShift},  // 13: A = the bucket
  };
  std::vector<Run> runs;
  for (uint32_t b = 0; b < kQpnBuckets; ++b)
    if (runs.empty() || runs.back().index != t.index_of_bucket[b]) runs.push_back({b, t.index_of_bucket[b]});
  emit_tree(runs, 0, runs.size(), &p);
  return p;
}

uint32_t run_steering_program(const std::vector<CbpfInsn>& prog, const uint8_t* pkt, size_t len) {
  uint32_t a = 0;
  for (size_t pc = 0; pc < prog.size(); ++pc) {
    const CbpfInsn& i = prog[pc];
    switch (i.code) {
      case kLdAbsW:
        if (size_t(i.k) + 4 > len) return 0;  // the kernel ends the program with 0
        a = load_be32(pkt + i.k);
        break;
      case kAndK: a &= i.k; break;
      case kRshK: a >>= i.k; break;
      case kJa: pc += i.k; break;
      case kJeqK: pc += a == i.k ? i.jt : i.jf; break;
      case kJgeK: pc += a >= i.k ? i.jt : i.jf; break;
      case kRetK: return i.k;
      case kRetA: return a;
      default: return 0;
    }
  }
  return 0;
}

void write_probe(uint8_t out[kProbeLen], const uint32_t secret[2], const Probe& p) {
  store_be32(out, kProbeMagic);
  store_be32(out + 4, secret[0]);
  store_be32(out + 8, secret[1]);
  store_be32(out + 12, p.index);
  store_be32(out + 16, p.generation);
}

bool is_probe(const uint8_t* pkt, size_t len) { return len == kProbeLen && load_be32(pkt) == kProbeMagic; }

bool read_probe(const uint8_t* pkt, size_t len, const uint32_t secret[2], Probe* p) {
  if (!is_probe(pkt, len) || load_be32(pkt + 4) != secret[0] || load_be32(pkt + 8) != secret[1]) return false;
  p->index = load_be32(pkt + 12);
  p->generation = load_be32(pkt + 16);
  return true;
}

}  // namespace melon::soft
