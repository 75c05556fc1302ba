// The soft provider's wire: one UDP socket on port 4791 of a device address, the transport engine
// behind it, and a progress thread, so RDMA WRITE/READ/atomics aimed at this process complete
// without the application calling any verb. UdpTransport is the facade that wires the units, each
// readable and tested alone: packets leave in send batches (tx_batch.h: each payload copied in
// before its ICRC is summed, runs of equal-size packets as one UDP GSO send) through the send queue
// (send_queue.h); arrivals come in receive batches (rx_batch.h: several packets per buffer with UDP
// GRO, each ICRC-checked and steered to its lane); the busy-poll lease (busy_poll_lease.h) says who
// receives; the progress timer (progress_timer.h, progress_fds.h) says when the progress thread
// wakes. Batches are sized to the requester window. This file's members are defined in
// udp_transport.cpp (start and stop, engine calls, sending), udp_receive.cpp (the receive path,
// polls and waiters) and progress_thread.cpp (the progress thread).
//
// Locks, in the order they may nest: rx_mu_ (the receive batch, recvmmsg) -> mu_ (the engine, the
// batch being filled, the progress timer's deadlines) -> the send queue's own (send_queue.h, held
// for pointer moves only; its sender lock is held without mu_). The progress timer's arm lock
// (progress_timer.h) -> mu_. Lanes: this lane's rx_mu_ -> another lane's mu_ (hand_over), and no
// thread holds two lanes' mu_. No thread makes a syscall while holding mu_, so a post waits at most
// for engine work, never for a recvmmsg or a sendmmsg. The busy-poll lease takes no lock; atomics
// (held_, rx_hint_, waiters_, watching_, ...) are read without one and say so where they are declared.
#pragma once
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <memory>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "providers/soft/busy_poll_lease.h"
#include "providers/soft/msg_batch.h"  // mmsghdr off Linux
#include "providers/soft/progress_fds.h"
#include "providers/soft/progress_timer.h"
#include "providers/soft/rx_batch.h"
#include "providers/soft/send_queue.h"
#include "providers/soft/share_forward.h"
#include "providers/soft/soft_counters.h"
#include "providers/soft/steering.h"
#include "providers/soft/tx_batch.h"
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

// Where a transport stands among its device's lanes (hub.h, Hub) and the processes sharing its
// addresses (addr_registry.h). The default is a device of one lane on addresses of its own: its own
// counter file, ordinary sockets, every packet its own.
struct LaneConfig {
  uint32_t count = 1, index = 0;
  TransportStats* stats = nullptr;  // the device's counters, shared by its lanes (nullptr: own file)
  UdpTransport* const* lanes = nullptr;  // every lane by index: packets for their QPs go there
  // The lane of each QPN bucket (steering.h), kNotOurs for another process's; nullptr: the
  // addresses are this device's alone and every packet is lane 0's.
  const uint8_t* lane_of_bucket = nullptr;
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
  // Before start(): the socket of address `addr` joins the group of that address through its
  // registry (addr_registry.h) instead of binding the address alone.
  void share(size_t addr, const ShareJoin& join) { socks_[addr].share = join; }

  // Runs `f(engine)` under the engine lock, wakes the progress thread if a timer moved earlier,
  // and once the lock is released sends what it queued; returns after everything queued so far
  // has been handed to the kernel (the control path: after destroy/modify nothing of the QP is
  // still waiting to be sent).
  template <typename F>
  auto with_engine(F&& f) {
    return call(std::forward<F>(f), Mode::control, 0);
  }
  // The same for posting: never waits for another thread's send. When another thread is sending,
  // it sends these packets too before it lets go (send_queued).
  template <typename F>
  auto post_engine(F&& f) {
    return call(std::forward<F>(f), Mode::post, 0);
  }
  // ibv_post_send to `qpn`: doorbell batching. A post to an RC QP that already awaits an ACK
  // (Engine::awaiting_ack) leaves its packets queued without a syscall: they go out with whatever
  // the next engine activity sends (an arrival, a timer: handling that ACK or timer is such an
  // activity, so they never wait for ever), on the next empty CQ poll (flush_held), or once 64 are
  // queued (one GSO send). A post to an idle QP, and UC/UD posts, send at once (latency).
  template <typename F>
  auto post_send_engine(uint32_t qpn, F&& f) {
    return call(std::forward<F>(f), Mode::post_send, qpn);
  }
  // Sends the packets posts left queued; costs one atomic load when there are none (poll_cq on an
  // empty CQ: the application is about to wait for them).
  void flush_held();
  // Hands every queued packet to the kernel before returning (dereg_mr: nothing queued may point
  // into memory about to be released).
  void drain();

  // Receive and process whatever has arrived, from the caller's thread (an application polling
  // an empty CQ), so a busy-polling process needs no thread hand-off. False if nothing came or
  // the progress thread holds the engine.
  //
  // Inside a busy-poll lease (busy_poll_lease.h) every poll receives and the progress thread
  // keeps off the sockets.
  bool poll_progress();
  // Receive and process everything the sockets hold now, from the caller's thread, lease or not
  // (ibv_destroy_qp). Linux's rxe handles a packet when it arrives; here one may wait in a socket
  // for a busy-polling application that is not running, and a QP destroyed meanwhile would lose
  // what reached the device before the destroy (its last ACK: docs/rdmacm.md, "Teardown").
  void receive_arrived();
  // A CQ of this transport was armed (ibv_req_notify_cq): the application is about to block, so
  // the progress thread watches the sockets again at once; unless the lease was left by a waiter
  // that received its own event (the application most likely waits there again, receiving itself):
  // then the lease stays, to its end busy_ns later.
  void app_waits();
  // Blocks until `fd` (a completion channel) is readable or `event_taken()` says this thread's own
  // receive signalled it (verbs::channel_event_taken: the event then never passes through `fd`),
  // receiving in the caller's thread meanwhile: while any thread waits here the progress thread
  // leaves the sockets (it keeps the timers), so an arrival wakes the waiter directly, not the
  // progress thread and then the waiter. 0, or an errno value of poll(): EINTR when a signal
  // handler ran in this thread.
  int wait_readable(int fd, bool (*event_taken)());

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

  // Locks: see the top of this file.
 private:
  enum class Mode { control, post, post_send };
  template <typename F>
  auto call(F&& f, Mode mode, uint32_t qpn) {
    struct Send {
      UdpTransport* t;
      bool wait, send = true;
      ~Send() {
        if (send) t->send_queued(wait);  // after the engine lock is released
        t->arm_timer();  // after the send: the packets do not wait for a timer syscall
      }
    } send{this, mode == Mode::control};
    std::lock_guard<std::mutex> g(mu_);
    struct Flush {
      UdpTransport* t;
      Send& s;
      Mode mode;
      bool backed;
      uint64_t staged, handoffs;
      ~Flush() {
        s.send = mode == Mode::control ? (t->after_engine_call(), true) : t->after_post(backed, staged, handoffs);
      }
    } flush{this, send, mode, mode == Mode::post_send && engine_.awaiting_ack(qpn), staged_, handoffs_};
    return f(engine_);
  }

  struct Socket;  // one per address (below)

  // udp_transport.cpp: engine calls and sending.
  void transmit(const rc::TxPacket& p) override;
  uint64_t now() override { return batch_now_ ? batch_now_ : now_ns(); }
  void after_engine_call();  // with mu_ held: queue the batch, arm the progress thread's timer if needed
  // With mu_ held, after a post: hold what it staged (doorbell batching) or queue it; true if the
  // caller must send the queue.
  bool after_post(bool backed, uint64_t staged_before, uint64_t handoffs_before);
  void publish_totals_locked();  // with mu_ held
  void wake() { fds_.wake(); }
  // With mu_ held: the engine's next deadline (or a lease's end) is now d (ProgressTimer::moved; the
  // progress thread itself plans its wait again anyway). arm_timer() sets the timer fd or wakes the
  // thread once the caller has released mu_ and sent what it queued. Every caller of timer_moved
  // calls arm_timer afterwards.
  void timer_moved(uint64_t d);
  void arm_timer() { timer_.arm(); }
  size_t socket_for(const uint8_t sgid[16]) const;
  // Transmit: the engine fills a batch under mu_ (stage_); after each engine call the batch joins
  // the send queue, and whichever thread holds the queue's sender lock sends queued batches in order.
  // With mu_ held: stage_ joins the send queue; a lone reply a receive held (replies_end_ == 1) and
  // the one message of requests that followed it become one GSO send first (TxBatch::join_held_reply).
  void handoff();
  void send_queued(bool wait);

  // udp_receive.cpp: the receive path; polls and waiters (public above).
  // With rx_mu_ held (takes mu_ to process). `hold`: the receive of a busy-polling application or a
  // blocked waiter; what the engine sends in reply stays in stage_ (held_) for the application's
  // next post (one sendmmsg with it), poll or ibv_req_notify_cq, or the end of the lease.
  // `max_msgs` > 0: at most that many receive buffers (datagrams or GRO runs) in this call.
  int receive_batch(size_t sock, bool hold = false, int max_msgs = 0);
  // `likely_id`: the IPv4 identification to try first in the ICRC check (its index in a GRO buffer).
  // In forward mode the owner routes other members' datagrams to their rings first.
  void rx_packet(const Socket& k, const sockaddr_storage& from, const uint8_t* pkt, size_t len, uint16_t likely_id);
  // One datagram from `src`/`sport` to socket k's address, checked (ICRC) and given to its lane's engine.
  void rx_datagram(const Socket& k, const uint8_t src[16], uint16_t sport, const uint8_t* pkt, size_t len,
                   uint16_t likely_id);
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

  // The progress thread (progress_thread.cpp): plans its wait (plan_wait), waits, receives what is
  // ready, runs due timers.
  void run();
  static thread_local const UdpTransport* progress_thread_;  // the transport whose progress thread this is
  struct WaitPlan {
    uint64_t deadline;
    bool leased;  // the sockets are the application's (a busy-poll lease) or a waiter's: not watched
    bool spin_leased;  // a busy-poll lease runs (held replies stay for the application's next poll)
  };
  WaitPlan plan_wait();
  void receive_ready(const pollfd* fds, const std::vector<size_t>& which);  // the sockets' entries, after the wait
  void run_due_timers();
  // What the receive paths watch: each socket's receive fd (none for a forward-mode member) and its
  // wake fd in forward mode; `which` maps each entry to its socket. Guarded by rx_mu_ (roles change under it).
  void watch_set(std::vector<pollfd>* fds, std::vector<size_t>* which) const;
  // Forward mode (share_forward.h), lane 0's progress thread: the registries' ticks and take-overs;
  // true if a socket's role changed (the watch set is rebuilt).
  bool share_tick();

  // Transmit: packets fill a batch (tx_batch.h) that joins the send queue (send_queue.h).
  static constexpr int kMaxHeld = kMaxGsoSegments;  // held packets that make posts send (one GSO run)

  struct Socket {
    LocalAddress addr;
    bool v6 = false;
    int fd = -1;
    SocketOffloads offloads;
    uint32_t rxq_drops = 0;  // the kernel's drop count at the last receive (SO_RXQ_OVFL)
    ShareJoin share;  // the address's group, when processes share it (registry nullptr: ours alone)
    uint16_t src_port = 0;  // the port fd sends from (the transport's, or a forward-mode member's own)
    std::unique_ptr<ShareForward> fwd;  // forward mode: the owner's routing or the member's ring
  };
  std::vector<Socket> socks_;
  uint16_t port_;
  std::mutex rx_mu_, mu_;
  MonotonicClock clock_;
  ProgressFds fds_;  // the progress thread's wake pipe and timer fd (opened by start())
  ProgressTimer timer_{clock_, fds_, mu_};  // when the progress thread wakes (its state guarded by mu_)
  rc::Engine engine_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  bool halted_ = false;  // halt() stopped a running thread; stop() has yet to finish
  // Set when the progress thread's ppoll saw a socket readable, cleared when a receive drains it:
  // an application polling an empty CQ reads this instead of making an empty recvmmsg.
  std::atomic<bool> rx_hint_{false};
  std::atomic<uint64_t> last_poll_rx_{0};  // when poll_progress() last looked without the hint
  uint64_t poll_interval_ns_ = 2000;  // MELON_SOFT_POLL_NS overrides (benchmarks)
  BusyPollLease lease_;  // MELON_SOFT_BUSY_NS overrides its 1 ms; 0: no lease
  // A leased receive that made more than kMaxHeldReplies packets to send (a window refill, not a
  // ping-pong's ACK) is a stream (BusyPollLease::note_stream): the progress thread (and the second
  // core) is to send it while the application posts.
  static constexpr int kMaxHeldReplies = 4;
  std::atomic<int> waiters_{0};
  std::atomic<bool> watching_{false};  // the progress thread's next wait includes the sockets
  // Threads that must receive (the progress thread, waiters) take rx_mu_ through this, and a polling
  // application does not try for it while any of them waits (poll_progress).
  std::atomic<int> rx_blocked_{0};
  struct RxLock {
    explicit RxLock(UdpTransport* t) : t(t) {
      t->rx_blocked_.fetch_add(1);
      t->rx_mu_.lock();
      t->rx_blocked_.fetch_sub(1);
    }
    ~RxLock() { t->rx_mu_.unlock(); }
    UdpTransport* t;
  };  // threads in wait_readable(): they receive, the progress thread does not
  bool defer_ = true;  // the application receives; the progress thread keeps off the sockets
  uint64_t batch_now_ = 0;  // one clock reading for a whole receive batch (0: read the clock)
  std::string name_;
  LaneConfig lane_;
  CounterFile counters_;
  TransportStats& stats_;  // in counters_, or the device's (lane_.stats)
  rc::QpCounters published_;  // the engine totals already added to stats_ (guarded by mu_)
  uint64_t published_dropped_ = 0;
  std::vector<Foreign> foreign_;  // guarded by rx_mu_
  // Probes (steering.h) a receive set aside for the registry, told after mu_ is released (guarded by rx_mu_).
  struct ProbeSeen {
    size_t sock;
    uint8_t bytes[kProbeLen];
  };
  std::vector<ProbeSeen> probes_;
  uint64_t next_share_tick_ = 0;  // lane 0's progress thread: when to look at the registries again
  std::atomic<bool> share_tick_now_{false};  // a receive saw an owner hand the port to us: tick at once
  std::atomic<uint32_t> roles_{0};  // bumped when a socket's role changed (forward mode): watchers rebuild
  bool forwarding_ = false;  // a socket is in forward mode (set by start(), read-only after)
  std::atomic<uint64_t> lane_rx_packets_{0}, lane_handed_over_{0};  // written under rx_mu_

  std::unique_ptr<TxBatch> stage_;  // guarded by mu_
  JoinDelta join_delta_;  // guarded by mu_
  uint64_t staged_ = 0, handoffs_ = 0;  // packets transmit() staged, batches handed off (guarded by mu_)
  std::atomic<bool> held_{false};  // stage_ holds packets a post left there (set and cleared under mu_)
  int replies_end_ = 0;  // stage_'s first messages, held by a receive into an empty stage_ (guarded by mu_)
  std::unique_ptr<SendQueue> sendq_;
  std::unique_ptr<std::atomic<bool>[]> gso_;  // per socket: cleared by the sender if the kernel refuses

  RxBatch rx_{stats_};  // the receive buffers (guarded by rx_mu_), sized to the window by start()
  int rx_lease_msgs_ = 1;  // the recvmmsg vector of a leased poll (poll_progress; guarded by rx_mu_)
  uint32_t window_;
};

}  // namespace melon::soft
