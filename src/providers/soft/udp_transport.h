// The soft provider's wire: one UDP socket on port 4791 of a device address, the transport engine
// behind it, and a progress thread, so RDMA WRITE/READ/atomics aimed at this process complete
// without the application calling any verb. Packets leave in sendmmsg batches gathered straight
// from registered memory (runs of equal-size packets as one UDP GSO send where the kernel has it);
// arrivals come in recvmmsg batches (several packets per buffer with UDP GRO) and are ICRC-checked
// (icrc_udp.h). Batches are sized to the requester window.
#pragma once
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <deque>
#include <memory>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "providers/soft/msg_batch.h"  // mmsghdr off Linux
#include "providers/soft/soft_counters.h"
#include "providers/soft/udp_socket.h"
#include "rc/engine.h"
#include "roce/frame.h"

namespace melon::soft {

// One local address of the device, as a GID (IPv4-mapped or IPv6), with the IPv6 scope.
struct LocalAddress {
  uint8_t gid[16];
  uint32_t scope_id = 0;
};

class UdpTransport;

// Where a transport stands among its device's lanes (soft_qp.h, Hub; udp_socket.h, ReuseGroup).
// The default is a device of one lane: its own counter file, an ordinary socket.
struct LaneConfig {
  uint32_t count = 1, index = 0;
  TransportStats* stats = nullptr;  // the device's counters, shared by its lanes (nullptr: own file)
  UdpTransport* const* lanes = nullptr;  // every lane by index: packets for their QPs go there
};

// The engine's frame link and clock; memory and events are the provider's (rc/host.h).
class UdpTransport final : private rc::FrameLink, private rc::Clock {
 public:
  // One socket per address; a packet leaves from the socket whose address is its source GID.
  // Memory and events are called with the engine lock held. With a `counter_name` (the device
  // name) the counters are published for melonctl (soft_counters.h).
  UdpTransport(const std::vector<LocalAddress>& addrs, rc::HostMemory& memory, rc::EventSink* events,
               const rc::EngineConfig& config = {}, uint16_t port = 4791, const char* counter_name = nullptr,
               const LaneConfig& lane = {});
  ~UdpTransport() override;

  // Opens every address's socket (udp_socket.h) and starts the progress thread. A socket option
  // that cannot be set fails the start (errno value, *why says which and what it would break); an
  // address that cannot be bound is skipped with a warning on stderr, and the start fails only if
  // none could be bound.
  int start(std::string* why = nullptr);
  void stop();
  // Stops the progress thread only (sockets open, nothing more received); stop() does the rest.
  // A device's lanes all halt before any closes, since a lane may hand packets to another.
  bool halt();
  size_t bound() const;

  // Runs `f(engine)` under the engine lock, wakes the progress thread if a timer moved earlier,
  // and once the lock is released sends what it queued; returns after everything queued so far
  // has been handed to the kernel (the control path: after destroy/modify nothing of the QP is
  // still waiting to be sent).
  template <typename F>
  auto with_engine(F&& f) {
    return call(std::forward<F>(f), true);
  }
  // The same for posting: never waits for another thread's send. When another thread is sending,
  // it sends these packets too before it lets go (send_queued).
  template <typename F>
  auto post_engine(F&& f) {
    return call(std::forward<F>(f), false);
  }
  // Hands every queued packet to the kernel before returning (dereg_mr: nothing queued may point
  // into memory about to be released).
  void drain();

  // Receive and process whatever has arrived, from the caller's thread (an application polling
  // an empty CQ), so a busy-polling process needs no thread hand-off. False if nothing came or
  // the progress thread holds the engine.
  bool poll_progress();

  const TransportStats& stats() const { return stats_; }
  static uint64_t now_ns();

  // Lanes: packets this lane's sockets received (ICRC right), and those among them that belonged
  // to another lane's QP (UDP GRO merges one sender's packets for several QPs into one buffer,
  // which the kernel steers by the first) and were handed to it. For tests.
  uint64_t lane_rx_packets() const { return lane_rx_packets_.load(std::memory_order_relaxed); }
  uint64_t lane_handed_over() const { return lane_handed_over_.load(std::memory_order_relaxed); }
  // The engine's counters (retransmissions, ...) added to the shared counters (the progress thread
  // does it every millisecond; the Hub before it prints a device's totals).
  void publish_totals();
  // With MELON_SOFT_STATS=1: every counter of a device in one line on stderr.
  static void print_counters(const char* name, const TransportStats& stats);

  // Locks, in the order they may nest: rx_mu_ (receive buffers, recvmmsg) -> mu_ (the engine and
  // the batch being filled) -> q_mu_ (the send queue, held for pointer moves only). tx_mu_ (the
  // one thread sending) -> q_mu_. Lanes: this lane's rx_mu_ -> another lane's mu_ (hand_over), and
  // no thread holds two lanes' mu_. No thread makes a syscall while holding mu_, so a post waits at
  // most for engine work, never for a recvmmsg or a sendmmsg.
 private:
  template <typename F>
  auto call(F&& f, bool wait) {
    struct Send {
      UdpTransport* t;
      bool wait;
      ~Send() { t->send_queued(wait); }  // after the engine lock is released
    } send{this, wait};
    std::lock_guard<std::mutex> g(mu_);
    struct Flush {
      UdpTransport* t;
      ~Flush() { t->after_engine_call(); }
    } flush{this};
    return f(engine_);
  }

  void transmit(const rc::TxPacket& p) override;
  uint64_t now() override { return batch_now_ ? batch_now_ : now_ns(); }
  void after_engine_call();  // with mu_ held: queue the batch, wake the progress thread if needed
  void run();
  int receive_batch(size_t sock);  // with rx_mu_ held (takes mu_ to process)
  void publish_totals_locked();  // with mu_ held
  // Packets of another lane's QPs: set aside while processing a batch (pointing into the receive
  // buffers, under rx_mu_), handed over after mu_ is released (no thread holds two lanes' mu_).
  struct Foreign {
    uint32_t lane;
    roce::IpUdp ip;
    const uint8_t* pkt;
    size_t len;
  };
  void hand_over();
  void receive_handed(const Foreign* f, size_t n);  // from another lane's thread
  void wake();
  size_t socket_for(const uint8_t sgid[16]) const;

  // Transmit: packets queue in slots; consecutive full-size packets of one flow share one message
  // (one UDP GSO send, UDP_SEGMENT = their size), and each socket's messages leave in one sendmmsg.
  static constexpr int kMaxIovPerPkt = rc::TxPacket::kMaxIov + 2;
  static constexpr int kMaxGsoSegments = 64;  // UDP_MAX_SEGMENTS of Linux 4.18..6.0 (128 since)
  static constexpr size_t kMaxGsoBytes = 65507;  // the largest IPv4 UDP payload, all segments together
  static constexpr int kMaxIovPerMsg = 1024;  // UIO_MAXIOV
  // Receive: one datagram per buffer, or with UDP GRO up to 64 KiB of one flow's packets.
  static constexpr size_t kRxBuf = 9216;
  static constexpr size_t kRxBufGro = 65536;

  struct Socket {
    LocalAddress addr;
    bool v6 = false;
    int fd = -1;
    SocketOffloads offloads;
    uint32_t rxq_drops = 0;  // the kernel's drop count at the last receive (SO_RXQ_OVFL)
    int claim = -1;  // lane 0 of several: this process's claim on the address (udp_socket.h)
  };
  std::vector<Socket> socks_;
  uint16_t port_;
  int wake_rd_ = -1, wake_wr_ = -1;
  std::mutex rx_mu_, mu_, q_mu_, tx_mu_;
  rc::Engine engine_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  bool halted_ = false;  // halt() stopped a running thread; stop() has yet to finish
  // Set when the progress thread's ppoll saw a socket readable, cleared when a receive drains it:
  // an application polling an empty CQ reads this instead of making an empty recvmmsg.
  std::atomic<bool> rx_hint_{false};
  std::atomic<uint64_t> last_poll_rx_{0};  // when poll_progress() last looked without the hint
  uint64_t poll_interval_ns_ = 2000;  // MELON_SOFT_POLL_NS overrides (benchmarks)
  uint64_t armed_deadline_ = UINT64_MAX;
  uint64_t batch_now_ = 0;  // one clock reading for a whole receive batch (0: read the clock)
  uint64_t totals_at_ = 0;  // when the engine's counter totals were last copied out (progress thread)
  bool totals_stale_ = false;
  std::string name_;
  LaneConfig lane_;
  CounterFile counters_;
  TransportStats& stats_;  // in counters_, or the device's (lane_.stats)
  rc::QpCounters published_;  // the engine totals already added to stats_ (guarded by mu_)
  uint64_t published_dropped_ = 0;
  std::vector<Foreign> foreign_;  // guarded by rx_mu_
  std::atomic<uint64_t> lane_rx_packets_{0}, lane_handed_over_{0};  // written under rx_mu_

  // Transmit: the engine fills a batch under mu_ (stage_); after each engine call the batch joins
  // the send queue, and whichever thread holds tx_mu_ sends queued batches in order.
  struct TxSlot {
    roce::PayloadFrame frame;  // transport headers, pad + ICRC around the payload
  };
  struct TxMsg {
    size_t sock;
    uint8_t dgid[16];
    int first_iov, niov;
    int npkts;
    uint32_t seg;  // size of every packet but the last (the GSO segment size)
    bool open;  // a further packet of size <= seg may join
    sockaddr_storage to;
    socklen_t to_len;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(uint16_t))];
  };
  struct TxBatch {
    explicit TxBatch(uint32_t window);
    bool full(int niov) const {
      return nslots == int(slots.size()) || nmsgs == int(msgs.size()) || n_iov + niov > int(iov.size());
    }
    // A copy of `n` bytes that lives as long as the batch.
    uint8_t* copy(const uint8_t* p, size_t n);
    void clear() { nslots = nmsgs = n_iov = 0, chunk = chunk_off = 0; }
    std::vector<TxSlot> slots;
    std::vector<TxMsg> msgs;
    std::vector<iovec> iov;
    std::vector<mmsghdr> mmsg;
    int nslots = 0, nmsgs = 0, n_iov = 0;
    std::vector<std::unique_ptr<uint8_t[]>> chunks;
    size_t chunk = 0, chunk_off = 0;
  };
  void handoff();  // with mu_ held: stage_ joins the send queue
  void send_queued(bool wait);
  void send_batch(TxBatch& b);  // with tx_mu_ held
  std::unique_ptr<TxBatch> stage_;  // guarded by mu_
  std::deque<std::unique_ptr<TxBatch>> sendq_;  // guarded by q_mu_
  std::vector<std::unique_ptr<TxBatch>> spare_;  // guarded by q_mu_
  std::unique_ptr<std::atomic<bool>[]> gso_;  // per socket: cleared by the sender if the kernel refuses

  // Receive batch (guarded by rx_mu_), sized to the window; set up once in start().
  void rx_setup();
  void rx_packet(const Socket& k, const sockaddr_storage& from, const uint8_t* pkt, size_t len);
  size_t rx_buf_size_ = kRxBuf;
  std::vector<uint8_t> rx_buf_;
  std::vector<mmsghdr> rx_msgs_;
  std::vector<iovec> rx_iov_;
  std::vector<sockaddr_storage> rx_from_;
  static constexpr size_t kRxCtrl = CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint32_t));
  std::vector<char> rx_ctrl_;
  uint32_t window_;
};

}  // namespace melon::soft
