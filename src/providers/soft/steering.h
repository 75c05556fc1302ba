// Steering datagrams to the sockets of one address's SO_REUSEPORT group by destination QPN: the
// classic BPF program the kernel runs for each datagram (Linux SO_ATTACH_REUSEPORT_CBPF), built from
// a table, and the probe that tells a socket its place in the group. Pure functions: no sockets,
// no locks (addr_registry.cpp attaches the program and sends the probes).
//
// The kernel runs the program with the data starting at the UDP payload (Linux
// reuseport_select_sock, given the UDP header length by the UDP lookup), so offset 0 is the BTH,
// whose second word holds the destination QPN in its low 24 bits (IBA 9.2). The program returns an
// index into the group's socket array; an index past its end makes the kernel pick by hash. The
// array is in join order, and when a socket leaves the last one moves into its slot
// (reuseport_detach_sock): the registry tracks those indices, and the program is rebuilt from it.
//
// A QPN's bucket is its top byte: each lane of each process claims whole buckets, so a process draws
// QPNs that steer to it (lane_qpn) and QPN 1 (the GSI, IBA 13.4.3) has a rule of its own.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace melon::soft {

constexpr uint32_t kQpnBuckets = 256;
constexpr unsigned kBucketShift = 16;
inline uint32_t bucket_of_qpn(uint32_t qpn) { return (qpn >> kBucketShift) & 0xff; }
// A QPN with the random low bits of `r` in one of `n` buckets (`buckets`; n = 0: any bucket). The
// engine replaces the low bits by the QP's slot and keeps the bucket (rc/engine.cpp choose_qpn).
inline uint32_t lane_qpn(uint32_t r, const uint8_t* buckets, uint32_t n) {
  if (!n) return r;
  const uint32_t top = buckets[(r >> 24) % n];
  return (r & ((1u << kBucketShift) - 1)) | (top << kBucketShift);
}

// One classic BPF instruction, laid out as Linux's struct sock_filter (linux/filter.h).
struct CbpfInsn {
  uint16_t code;
  uint8_t jt, jf;
  uint32_t k;
};

// What the program steers: bucket b to socket index index_of_bucket[b] (kNoSocket: none, the
// kernel's hash picks), QPN 1 to gsi_index, probes carrying `secret` to the index they name.
constexpr uint32_t kNoSocket = 0xffffffffu;
struct SteeringTable {
  uint32_t secret[2] = {0, 0};
  uint32_t gsi_index = kNoSocket;
  uint32_t index_of_bucket[kQpnBuckets];
  SteeringTable() {
    for (uint32_t& i : index_of_bucket) i = kNoSocket;
  }
};
// The program for `t` (at most a few hundred instructions; Linux takes 4096).
std::vector<CbpfInsn> build_steering_program(const SteeringTable& t);
// What the kernel would return for this datagram (the instructions build_steering_program emits;
// an out-of-bounds load ends with 0, as in the kernel). For tests.
uint32_t run_steering_program(const std::vector<CbpfInsn>& prog, const uint8_t* pkt, size_t len);

// A probe: a datagram the program steers to the socket index it carries, so the socket that
// receives it learns its place in the group after a member died (its sockets left in an order
// nobody saw). It carries the registry's secret, which only processes of the user can read, so a
// remote sender cannot make a socket believe a wrong index; and the generation it belongs to.
//   0  u32 kProbeMagic (an opcode byte 0xFF: no RoCE packet; rc drops it as malformed anyway)
//   4  u32 secret[0]   8  u32 secret[1]   12 u32 index   16 u32 generation   (big-endian words)
constexpr uint32_t kProbeMagic = 0xff4d4c50;
constexpr size_t kProbeLen = 20;
struct Probe {
  uint32_t index, generation;
};
void write_probe(uint8_t out[kProbeLen], const uint32_t secret[2], const Probe& p);
// Whether `pkt` is a probe (magic and length); *p set and true only if it carries `secret`.
bool is_probe(const uint8_t* pkt, size_t len);
bool read_probe(const uint8_t* pkt, size_t len, const uint32_t secret[2], Probe* p);

}  // namespace melon::soft
