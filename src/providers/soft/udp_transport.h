// The soft provider's wire: one UDP socket on port 4791 of a device address, the transport engine
// behind it, and a progress thread, so RDMA WRITE/READ/atomics aimed at this process complete
// without the application calling any verb. Packets leave in sendmmsg batches gathered straight
// from registered memory; arrivals come in recvmmsg batches and are ICRC-checked (icrc_udp.h).
#pragma once
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "providers/soft/soft_counters.h"
#include "rc/engine.h"
#include "roce/frame.h"

#if !defined(__linux__)
// sendmmsg/recvmmsg are Linux's; elsewhere the same batches go out one sendmsg at a time.
struct mmsghdr {
  msghdr msg_hdr;
  unsigned msg_len;
};
#endif

namespace melon::soft {

// One local address of the device, as a GID (IPv4-mapped or IPv6), with the IPv6 scope.
struct LocalAddress {
  uint8_t gid[16];
  uint32_t scope_id = 0;
};

// The engine's frame link and clock; memory and events are the provider's (rc/host.h).
class UdpTransport final : private rc::FrameLink, private rc::Clock {
 public:
  // One socket per address; a packet leaves from the socket whose address is its source GID.
  // Memory and events are called with the engine lock held. With a `counter_name` (the device
  // name) the counters are published for melonctl (soft_counters.h).
  UdpTransport(const std::vector<LocalAddress>& addrs, rc::HostMemory& memory, rc::EventSink* events,
               const rc::EngineConfig& config = {}, uint16_t port = 4791, const char* counter_name = nullptr);
  ~UdpTransport() override;

  // Opens every address's socket (udp_socket.h) and starts the progress thread. A socket option
  // that cannot be set fails the start (errno value, *why says which and what it would break); an
  // address that cannot be bound is skipped with a warning on stderr, and the start fails only if
  // none could be bound.
  int start(std::string* why = nullptr);
  void stop();
  size_t bound() const;

  // Runs `f(engine)` under the engine lock, then sends what it queued and wakes the progress
  // thread if a timer moved earlier.
  template <typename F>
  auto with_engine(F&& f) {
    std::lock_guard<std::mutex> g(mu_);
    struct Flush {
      UdpTransport* t;
      ~Flush() { t->after_engine_call(); }
    } flush{this};
    return f(engine_);
  }

  // Receive and process whatever has arrived, from the caller's thread (an application polling
  // an empty CQ), so a busy-polling process needs no thread hand-off. False if nothing came or
  // the progress thread holds the engine.
  bool poll_progress();

  const TransportStats& stats() const { return stats_; }
  static uint64_t now_ns();

 private:
  void transmit(const rc::TxPacket& p) override;
  uint64_t now() override { return batch_now_ ? batch_now_ : now_ns(); }
  void flush_tx();
  void after_engine_call();
  void run();
  int receive_batch(size_t sock);  // with mu_ held
  void wake();
  size_t socket_for(const uint8_t sgid[16]) const;

  static constexpr int kBatch = 64;
  static constexpr int kMaxIovPerPkt = rc::TxPacket::kMaxIov + 2;
  static constexpr size_t kRxBuf = 9216;

  struct Socket {
    LocalAddress addr;
    bool v6 = false;
    int fd = -1;
  };
  std::vector<Socket> socks_;
  uint16_t port_;
  int wake_rd_ = -1, wake_wr_ = -1;
  std::mutex mu_;
  rc::Engine engine_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  uint64_t armed_deadline_ = UINT64_MAX;
  uint64_t batch_now_ = 0;  // one clock reading for a whole receive batch (0: read the clock)
  CounterFile counters_;
  TransportStats& stats_;  // in counters_

  // Transmit batch (guarded by mu_).
  struct TxSlot {
    roce::PayloadFrame frame;  // transport headers, pad + ICRC around the payload
    sockaddr_storage to;
    size_t sock;
    iovec iov[kMaxIovPerPkt];
  };
  std::vector<TxSlot> tx_;
  std::vector<mmsghdr> tx_msgs_;
  int tx_count_ = 0;

  // Receive batch (progress thread only).
  std::vector<uint8_t> rx_buf_;
  std::vector<mmsghdr> rx_msgs_;
  std::vector<iovec> rx_iov_;
  std::vector<sockaddr_storage> rx_from_;
};

}  // namespace melon::soft
