// Counters of one soft device's transport, kept in a small shared file so that a person can read
// them from outside the process (`melonctl stat`), as rxe's and mlx5's hw_counters are read from
// sysfs. Receive drops are counted by reason: a peer whose packets all fail the ICRC shows up here
// instead of as silent retries.
//
// File: <dir>/<device>.<pid>, dir = $MELON_STATS_DIR, else $XDG_RUNTIME_DIR/melondma, else
// /tmp/melondma-<uid> (mode 0700). Layout (host byte order), read by tools/melonctl:
//   0   char[8]  "MELSTAT1"
//   8   uint32   counter count N
//   12  uint32   pid
//   16  char[48] device name (NUL-padded)
//   64  N x char[32] counter names (NUL-padded)
//   64 + 32 N    N x uint64 counter values
//
// Locks: none. Every counter is a lock-free atomic in the mapped file, incremented relaxed by
// whichever thread sees the event; a reader outside the process may see a snapshot mid-update.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace melon::soft {

// The one list of counters: name, meaning (docs/verbs.md shows the same list).
#define MELON_SOFT_COUNTERS(X)                                                                                        \
  X(rx_packets, "RoCEv2 packets whose ICRC was right, handed to the transport engine")                                \
  X(tx_packets, "packets sent")                                                                                       \
  X(rx_bad_icrc, "dropped: ICRC wrong (corrupted, or the sender computed it over other headers)")                     \
  X(rx_malformed, "dropped: truncated (longer than the receive buffer) or from an unknown address family")            \
  X(rx_engine_dropped, "dropped by the transport engine: bad header, unknown QP, QP in the wrong state")              \
  X(tx_errors, "packets the kernel refused to send (no buffer space, no route)")                                      \
  X(rx_buffer_drops, "dropped by the kernel before we could read them: socket receive buffer full")                   \
  X(retransmits, "times the transport went back to resend (retry timeout, sequence NAK, lost READ response)")         \
  X(timeouts, "retry timer expiries (no ACK in time)")                                                                \
  X(acks_coalesced, "AckReq'd packets acknowledged by the ACK of a later one in the same receive batch")              \
  X(tx_gso_sends, "sends that carried several packets in one call (UDP GSO)")                                         \
  X(rx_gro_buffers, "receive buffers that held several packets (UDP GRO)")                                            \
  X(offload_fallbacks, "sockets without UDP GSO or GRO, and GSO sends the kernel refused")                            \
  X(tx_calls, "send system calls (sendmmsg, or sendmsg where there is none)")                                         \
  X(tx_deferred, "packets a post left queued to leave with later ones (doorbell batching)")                           \
  X(busy_poll_leases, "times a busy-polling application took receiving over from the progress thread")                \
  X(lanes, "transports (engine, sockets, thread) of the device; 1 where steering by QPN is unavailable")              \
  X(rx_lane_handovers, "packets steered to a lane for another lane's QP (merged by GRO), handed over")                \
  X(tx_replies_joined, "held replies (ACKs) sent in one GSO send with the next post's request (busy-poll ping-pong)") \
  X(rx_unknown_qpn, "dropped: for a QPN no lane of this process owns (another process's, while steering is rebuilt)")

struct TransportStats {
#define MELON_SOFT_COUNTER_FIELD(name, text) std::atomic<uint64_t> name{0};
  MELON_SOFT_COUNTERS(MELON_SOFT_COUNTER_FIELD)
#undef MELON_SOFT_COUNTER_FIELD
};

struct CounterInfo {
  const char* name;
  const char* meaning;
};
inline constexpr CounterInfo kCounters[] = {
#define MELON_SOFT_COUNTER_INFO(name, text) {#name, text},
    MELON_SOFT_COUNTERS(MELON_SOFT_COUNTER_INFO)
#undef MELON_SOFT_COUNTER_INFO
};
inline constexpr size_t kCounterCount = sizeof(kCounters) / sizeof(kCounters[0]);
static_assert(sizeof(TransportStats) == kCounterCount * sizeof(uint64_t), "one 64-bit word per counter, in list order");

// The counters of one device in this process: in the shared file when it could be made, else in
// process memory (MELON_SOFT_DEBUG says why). The file is removed on destruction.
class CounterFile {
 public:
  explicit CounterFile(const char* device);
  ~CounterFile();
  CounterFile(const CounterFile&) = delete;
  CounterFile& operator=(const CounterFile&) = delete;

  TransportStats& counters() { return *stats_; }
  const std::string& path() const { return path_; }  // "" when not shared

  // The directory the files go to (see above); "" if none can be used.
  static std::string directory();
  // Creates `dir` if missing; whether it is a directory only this user can write.
  static bool make_private_directory(const std::string& dir);

 private:
  TransportStats local_;
  TransportStats* stats_ = &local_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  int owner_ = 0;  // the process that made the file
};

}  // namespace melon::soft
