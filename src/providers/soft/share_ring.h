// A receive ring between two processes of one user sharing an address in forward mode (docs/verbs.md,
// "One address, many processes"; share_forward.h): the owner of the address's socket copies a
// datagram for another member's QP into that member's ring, the member reads it from there.
// One producer (the owner), one consumer (the member), fixed-size slots in a shared mapping.
//
// The mapping is a trust boundary: the other side may have crashed halfway through a write, or be
// buggy or hostile. Each side keeps its own copy of the ring's geometry and of its own index, reads
// the other side's index once per call and checks it, and takes every length from a slot into a local
// before using it: nothing the other side writes can make it read or write outside the mapping. A
// slot is published by the producer's index moving past it (release), after it was written, so a
// producer that dies mid-write leaves nothing half-visible; a slot that fails the checks anyway is
// counted (bad) and skipped.
//
// Locks: none. Each object is used by one thread at a time (the transport's rx_mu_ guards both
// sides, share_forward.h); the two processes synchronise only through the two indices (atomic
// loads and stores, acquire/release).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <string>

namespace melon::soft {

struct RingShared;  // the mapping's layout (share_ring.cpp)
constexpr uint32_t kRingSlots = 512;  // a requester window of packets (the largest per-QP window)
constexpr uint32_t kRingDatagram = 9216;  // the largest datagram a slot holds (the receive buffer's size)

// What travels with a datagram: where it came from (the owner's recvmsg), and the IPv4 identification
// to try first in the ICRC check (its index in a GRO buffer).
struct RingMeta {
  uint8_t src[16];  // the sender's address as a GID (IPv4-mapped or IPv6)
  uint16_t sport = 0;
  uint16_t likely_id = 0;
  bool v6 = false;
};

// Where things are in the mapping (byte offsets), for tests that play a torn or hostile peer:
// each side's index (uint32_t), the first slot, a slot's stride; a slot is a uint32_t length, the
// RingMeta fields, then the datagram at `data`.
struct RingLayout {
  size_t head, tail, slots, stride, data;
};
RingLayout ring_layout();
// The bytes a ring of kRingSlots slots takes (the file's size).
size_t ring_bytes();
// Lays out an empty ring in `mem` (ring_bytes() bytes) tagged `nonce` (the member's, addr_registry.h).
void ring_init(void* mem, uint64_t nonce);

// The owner's side.
class RingProducer {
 public:
  // Over `mem` (ring_bytes() bytes): false when it is no ring of this layout or of another nonce (a
  // member that left and whose slot a new one took), and nothing is written then.
  bool attach(void* mem, size_t bytes, uint64_t nonce);
  // Copies one datagram in; false (and counted) when the ring is full or the datagram longer than a slot.
  bool push(const uint8_t* data, size_t len, const RingMeta& meta);
  uint64_t full_drops() const { return full_drops_; }
  uint64_t oversize_drops() const { return oversize_drops_; }

 private:
  RingShared* ring_ = nullptr;
  uint32_t head_ = 0;  // ours; the shared copy is only written
  uint64_t full_drops_ = 0, oversize_drops_ = 0;
};

// The member's side.
class RingConsumer {
 public:
  bool attach(void* mem, size_t bytes, uint64_t nonce);
  // Whether a datagram waits (one acquire load; no syscall).
  bool pending() const;
  // Up to `max` datagrams, oldest first, each given to f(data, len, meta) while it is still in its
  // slot (the slot is freed after the call returns): the number given.
  template <typename F>
  uint32_t pop(uint32_t max, F&& f) {
    uint32_t n = 0;
    const uint8_t* data;
    size_t len;
    RingMeta meta;
    while (n < max && next(&data, &len, &meta)) {
      f(data, len, meta);
      release();
      ++n;
    }
    return n;
  }
  // Slots that failed the checks (a length past a slot, an index past the ring), skipped.
  uint64_t bad() const { return bad_; }

 private:
  bool next(const uint8_t** data, size_t* len, RingMeta* meta);
  void release();
  RingShared* ring_ = nullptr;
  uint32_t tail_ = 0;  // ours
  uint64_t bad_ = 0;
};

// The ring's file beside the address's registry, mapped. create(): a new file (any old one at the
// path removed first, so an owner still mapping the old one writes into nothing we read), owned by
// the member; open(): the owner maps a member's. Unmapped and closed on destruction; unlink() removes
// the file (the member, leaving; whoever reclaims a dead member).
class RingFile {
 public:
  RingFile() = default;
  ~RingFile();
  RingFile(const RingFile&) = delete;
  RingFile& operator=(const RingFile&) = delete;
  int create(const std::string& path, uint64_t nonce, std::string* why);
  int open(const std::string& path, std::string* why);
  void* mem() const { return mem_; }
  size_t bytes() const { return bytes_; }
  void close();

 private:
  void* mem_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace melon::soft
