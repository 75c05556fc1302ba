#include "roce/icrc_udp.h"

#include "roce/crc32.h"
#include "roce/icrc.h"
#include "roce/opcode.h"

namespace melon::roce {

namespace {

// GF(2) 32x32 matrices as 32 column vectors: col[i] is the image of bit i.
struct Mat {
  uint32_t col[32];
};

constexpr uint32_t apply(const Mat& m, uint32_t v) {
  uint32_t r = 0;
  for (int i = 0; v; ++i, v >>= 1)
    if (v & 1) r ^= m.col[i];
  return r;
}

constexpr uint32_t kPoly = 0xedb88320u;

// One zero byte through the raw (no init, no final xor) reflected CRC register: linear.
constexpr uint32_t zero_byte(uint32_t c) {
  for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
  return c;
}
// Its inverse: a shifted-out 1 left the polynomial's top bit set in the register.
constexpr uint32_t zero_byte_inverse(uint32_t c) {
  for (int k = 0; k < 8; ++k) c = (c & 0x80000000u) ? ((c ^ kPoly) << 1) | 1 : c << 1;
  return c;
}

// Raw CRC register after the two identification bytes (hi, lo) starting from 0: linear in the id.
constexpr uint32_t raw_crc_of_id(uint16_t id) {
  uint32_t c = zero_byte(uint32_t(id >> 8));
  return zero_byte(c ^ (id & 0xff));
}

// The same matrix as 8 tables of 16: the image of each nibble value at each nibble position, so a
// product is 8 lookups instead of up to 32 conditional XORs (it runs up to 17 times per received
// packet, and for 8-byte messages it was most of the receive side's ICRC time).
struct NibbleMat {
  uint32_t t[8][16];
};

constexpr NibbleMat nibbles(const Mat& m) {
  NibbleMat n{};
  for (int p = 0; p < 8; ++p)
    for (int v = 0; v < 16; ++v)
      for (int b = 0; b < 4; ++b)
        if (v >> b & 1) n.t[p][v] ^= m.col[4 * p + b];
  return n;
}

constexpr uint32_t apply(const NibbleMat& m, uint32_t v) {
  uint32_t r = 0;
  for (int p = 0; p < 8; ++p) r ^= m.t[p][(v >> (4 * p)) & 15];
  return r;
}

struct Solver {
  Mat inv_pow[17];  // (zero byte)^-(2^k)
  NibbleMat inv_pow_tab[17];  // the same, for the receive path
  uint32_t row[16];  // id bit b = parity(row[b] & v) for v in the image of raw_crc_of_id
  bool ready = false;
};

constexpr Solver make_solver() {
  Solver s{};
  for (int i = 0; i < 32; ++i) s.inv_pow[0].col[i] = zero_byte_inverse(1u << i);
  for (int k = 1; k < 17; ++k)
    for (int i = 0; i < 32; ++i) s.inv_pow[k].col[i] = apply(s.inv_pow[k - 1], s.inv_pow[k - 1].col[i]);
  for (int k = 0; k < 17; ++k) s.inv_pow_tab[k] = nibbles(s.inv_pow[k]);
  // Left inverse of the 32x16 id map by elimination: reduce the columns so each owns one pivot bit.
  uint32_t cols[16] = {}, comb[16] = {};
  int pivot[16] = {};
  for (int i = 0; i < 16; ++i) {
    cols[i] = raw_crc_of_id(uint16_t(1u << i));
    comb[i] = 1u << i;
  }
  for (int i = 0; i < 16; ++i) {
    int p = -1;
    for (int b = 0; b < 32 && p < 0; ++b)
      if (cols[i] >> b & 1) p = b;
    if (p < 0) return s;
    pivot[i] = p;
    for (int j = 0; j < 16; ++j)
      if (j != i && (cols[j] >> p & 1)) {
        cols[j] ^= cols[i];
        comb[j] ^= comb[i];
      }
  }
  // v = sum z_i cols_i with z_i = bit pivot[i] of v, and cols_i = C * comb_i, so id = sum z_i comb_i.
  for (int i = 0; i < 16; ++i)
    for (int b = 0; b < 16; ++b)
      if (comb[i] >> b & 1) s.row[b] |= 1u << pivot[i];
  s.ready = true;
  return s;
}

constexpr Solver kSolver = make_solver();
static_assert(kSolver.ready);
// The tables give every matrix's columns back (both products are linear, so they agree everywhere).
constexpr bool tables_match() {
  for (int k = 0; k < 17; ++k)
    for (int i = 0; i < 32; ++i)
      if (apply(kSolver.inv_pow_tab[k], 1u << i) != kSolver.inv_pow[k].col[i]) return false;
  return true;
}
static_assert(tables_match());
static_assert(zero_byte_inverse(zero_byte(0x12345678u)) == 0x12345678u);

uint32_t icrc_with_id(IpUdp h, uint16_t id, bool df, const uint8_t* roce, size_t len) {
  uint8_t hdr[kIpv6HeaderSize + kUdpHeaderSize];
  h.ip_id = id;
  h.df = df;
  size_t n = write_ip_udp(h, len + kIcrcSize, hdr);
  Icrc c;
  c.begin_with_bth(hdr, n, roce);
  c.add(roce + kBthSize, len - kBthSize);
  return c.value();
}

}  // namespace

uint32_t icrc_for_udp_payload(const IpUdp& hdr, const uint8_t* roce, size_t len) {
  return icrc_with_id(hdr, hdr.ip_id, hdr.df, roce, len);
}

bool icrc_check_udp_payload(const IpUdp& hdr, const uint8_t* roce, size_t len, uint16_t* ip_id, uint16_t likely_id) {
  if (len < kBthSize + kIcrcSize) return false;
  size_t body = len - kIcrcSize;
  uint32_t wire = load_icrc(roce + body);
  if (hdr.v6) {
    if (ip_id) *ip_id = 0;
    return icrc_with_id(hdr, 0, false, roce, body) == wire;
  }
  // The likely identification first (DF set, as RoCE senders send): one CRC, no solving. For id 0
  // that CRC is the solver's first one, so a wrong guess of 0 costs nothing.
  const uint32_t guessed = icrc_with_id(hdr, likely_id, true, roce, body);
  if (guessed == wire) {
    if (ip_id) *ip_id = likely_id;
    return true;
  }
  const uint32_t zero_df = likely_id ? icrc_with_id(hdr, 0, true, roce, body) : guessed;
  const Solver& s = kSolver;
  // Pseudo-packet: 8 LRH bytes, then the IPv4 header with the id at offsets 4..5, so 8+6 = 14
  // bytes up to the end of the id and everything after it follows.
  size_t after = 8 + kIpv4HeaderSize + kUdpHeaderSize + body - 14;
  for (int pass = 0; pass < 2; ++pass) {
    bool df = pass == 0;  // RoCE senders set DF: that case first
    uint32_t d = wire ^ (df ? zero_df : icrc_with_id(hdr, 0, df, roce, body));
    for (int k = 0; k < 17; ++k)
      if (after >> k & 1) d = apply(s.inv_pow_tab[k], d);
    uint16_t id = 0;
    for (int b = 0; b < 16; ++b)
      if (__builtin_parity(s.row[b] & d)) id |= uint16_t(1u << b);
    if (raw_crc_of_id(id) == d) {
      if (ip_id) *ip_id = id;
      return true;
    }
  }
  return false;
}

}  // namespace melon::roce
