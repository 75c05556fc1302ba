#include "providers/soft/udp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "providers/soft/udp_socket.h"
#include "rc/wire.h"
#include "roce/frame.h"
#include "roce/icrc_udp.h"
#include "roce/ip_udp.h"

namespace melon::soft {

using namespace roce;

namespace {

socklen_t to_sockaddr(const uint8_t gid[16], uint16_t port, sockaddr_storage* ss, uint32_t scope = 0) {
  memset(ss, 0, sizeof *ss);
  if (gid_is_v4_mapped(gid)) {
    auto* s = reinterpret_cast<sockaddr_in*>(ss);
    s->sin_family = AF_INET;
    s->sin_port = htons(port);
    memcpy(&s->sin_addr, gid + 12, 4);
    return sizeof *s;
  }
  auto* s = reinterpret_cast<sockaddr_in6*>(ss);
  s->sin6_family = AF_INET6;
  s->sin6_port = htons(port);
  s->sin6_scope_id = scope;
  memcpy(&s->sin6_addr, gid, 16);
  return sizeof *s;
}

bool from_sockaddr(const sockaddr_storage& ss, uint8_t gid[16], uint16_t* port) {
  if (ss.ss_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&ss);
    gid_from_ipv4(gid, ntohl(s->sin_addr.s_addr));
    *port = ntohs(s->sin_port);
    return true;
  }
  if (ss.ss_family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&ss);
    memcpy(gid, &s->sin6_addr, 16);
    *port = ntohs(s->sin6_port);
    return true;
  }
  return false;
}

}  // namespace

UdpTransport::UdpTransport(const std::vector<LocalAddress>& addrs, rc::HostMemory& memory, rc::EventSink* events,
                           const rc::EngineConfig& config, uint16_t port, const char* counter_name)
    : port_(port),
      engine_(rc::Host{memory, *this, *this, events}, config),
      counters_(counter_name),
      stats_(counters_.counters()) {
  for (const LocalAddress& a : addrs) socks_.push_back({a, !gid_is_v4_mapped(a.gid), -1});
  tx_.resize(kBatch);
  tx_msgs_.resize(kBatch);
  rx_buf_.resize(kBatch * kRxBuf);
  rx_msgs_.resize(kBatch);
  rx_iov_.resize(kBatch);
  rx_from_.resize(kBatch);
}

UdpTransport::~UdpTransport() { stop(); }

uint64_t UdpTransport::now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

size_t UdpTransport::bound() const {
  size_t n = 0;
  for (const Socket& k : socks_) n += k.fd >= 0;
  return n;
}

int UdpTransport::start(std::string* why) {
  int last_err = EADDRNOTAVAIL;
  std::string last_why = "no address";
  std::vector<std::string> unbound;
  for (Socket& k : socks_) {
    if (const char* no = gid_family_unusable(k.v6)) {  // refused at use too, with the reason (soft_device.cpp)
      last_err = EAFNOSUPPORT;
      last_why = no;
      continue;
    }
    std::string w;
    bool bind_failed = false;
    int fd = open_roce_socket(k.addr.gid, k.addr.scope_id, port_, &w, &bind_failed);
    if (fd >= 0) {
      k.fd = fd;
      continue;
    }
    last_err = errno;
    last_why = w;
    if (!bind_failed) {  // the host cannot carry RoCEv2 right: no half-working device
      stop();
      if (why) *why = w;
      return last_err;
    }
    unbound.push_back(w);
  }
  if (!bound()) {
    if (why) *why = last_why;
    return last_err;
  }
  // Not silent: packets to these GIDs will not arrive.
  for (const std::string& w : unbound)
    std::fprintf(stderr, "melondma soft: %s; packets to this address will not be received\n", w.c_str());
  int p[2];
  if (pipe(p) < 0) {
    int e = errno;
    stop();
    if (why) *why = std::string("pipe: ") + strerror(e);
    return e;
  }
  wake_rd_ = p[0];
  wake_wr_ = p[1];
  // The progress thread drains the wake pipe until EAGAIN; a blocking pipe would hang it.
  if (fcntl(wake_rd_, F_SETFL, O_NONBLOCK) != 0 || fcntl(wake_wr_, F_SETFL, O_NONBLOCK) != 0) {
    int e = errno;
    stop();
    if (why) *why = std::string("fcntl(O_NONBLOCK) on the wake pipe: ") + strerror(e);
    return e;
  }
  running_ = true;
  thread_ = std::thread([this] { run(); });
  return 0;
}

void UdpTransport::stop() {
  if (running_.exchange(false)) {
    wake();
    thread_.join();
  }
  for (Socket& k : socks_) {
    if (k.fd >= 0) close(k.fd);
    k.fd = -1;
  }
  if (wake_rd_ >= 0) close(wake_rd_);
  if (wake_wr_ >= 0) close(wake_wr_);
  wake_rd_ = wake_wr_ = -1;
}

size_t UdpTransport::socket_for(const uint8_t sgid[16]) const {
  size_t first = socks_.size();
  for (size_t i = 0; i < socks_.size(); ++i) {
    if (socks_[i].fd < 0) continue;
    if (!memcmp(socks_[i].addr.gid, sgid, 16)) return i;
    if (first == socks_.size()) first = i;
  }
  return first;
}

void UdpTransport::wake() {
  char c = 1;
  if (wake_wr_ >= 0) (void)!write(wake_wr_, &c, 1);
}

void UdpTransport::transmit(const rc::TxPacket& p) {
  if (tx_count_ == kBatch) flush_tx();
  TxSlot& s = tx_[tx_count_];
  s.sock = socket_for(p.av->sgid);
  if (s.sock == socks_.size()) {
    stats_.tx_errors++;
    return;
  }
  const Socket& k = socks_[s.sock];
  // The ICRC covers IP and UDP as the kernel will send them: from this socket's address and port (a
  // socket has one source port, so the engine's entropy port in tx_ip() is replaced), IPv4
  // identification 0 with DF set (see start()).
  IpUdp ip = rc::tx_ip(p);
  ip.v6 = k.v6;
  memcpy(ip.src, k.addr.gid, 16);
  ip.sport = port_;
  ip.dport = kRoceV2Port;
  ip.ip_id = 0;
  ip.df = true;
  write_payload_frame(ip, p.pkt, p.iov, p.niov, s.frame);
  int n = 0;
  s.iov[n++] = {s.frame.transport, s.frame.transport_len};
  for (int i = 0; i < p.niov; ++i) s.iov[n++] = {p.iov[i].ptr, p.iov[i].len};
  s.iov[n++] = {s.frame.tail, s.frame.tail_len};

  mmsghdr& m = tx_msgs_[tx_count_];
  memset(&m, 0, sizeof m);
  m.msg_hdr.msg_name = &s.to;
  m.msg_hdr.msg_namelen = to_sockaddr(p.av->dgid, kRoceV2Port, &s.to);
  m.msg_hdr.msg_iov = s.iov;
  m.msg_hdr.msg_iovlen = n;
  ++tx_count_;
  // The payload iovecs point into registered memory that may change after this call returns;
  // sending before the engine lock is released keeps the gather exact (flush_tx in after_engine_call).
}

void UdpTransport::flush_tx() {
  // Consecutive packets for the same socket go out in one sendmmsg.
  int off = 0;
  while (off < tx_count_) {
    size_t sock = tx_[off].sock;
    int end = off + 1;
    while (end < tx_count_ && tx_[end].sock == sock) ++end;
    int fd = socks_[sock].fd;
#if defined(__linux__)
    int r = sendmmsg(fd, tx_msgs_.data() + off, unsigned(end - off), 0);
#else
    int r = sendmsg(fd, &tx_msgs_[off].msg_hdr, 0) < 0 ? -1 : 1;
#endif
    if (r < 0) {
      if (errno == EINTR) continue;
      // ENOBUFS/EAGAIN or an unreachable peer: the packet is lost; the transport retries.
      stats_.tx_errors++;
      ++off;
      continue;
    }
    stats_.tx_packets += uint64_t(r);
    off += r;
  }
  tx_count_ = 0;
}

void UdpTransport::after_engine_call() {
  flush_tx();
  uint64_t d = engine_.next_deadline();
  if (d < armed_deadline_) wake();
}

int UdpTransport::receive_batch(size_t sock) {
  // Called with mu_ held: the receive buffers are shared with poll_progress(), and taking the
  // datagrams under the lock keeps them in arrival order whoever reads them.
  const Socket& k = socks_[sock];
  for (int i = 0; i < kBatch; ++i) {
    rx_iov_[i] = {rx_buf_.data() + size_t(i) * kRxBuf, kRxBuf};
    memset(&rx_msgs_[i], 0, sizeof(mmsghdr));
    rx_msgs_[i].msg_hdr.msg_iov = &rx_iov_[i];
    rx_msgs_[i].msg_hdr.msg_iovlen = 1;
    rx_msgs_[i].msg_hdr.msg_name = &rx_from_[i];
    rx_msgs_[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
  }
#if defined(__linux__)
  int n = recvmmsg(k.fd, rx_msgs_.data(), kBatch, MSG_DONTWAIT, nullptr);
#else
  int n = 0;
  for (; n < kBatch; ++n) {
    ssize_t r = recvmsg(k.fd, &rx_msgs_[n].msg_hdr, MSG_DONTWAIT);
    if (r < 0) break;
    rx_msgs_[n].msg_len = unsigned(r);
  }
  if (n == 0) n = -1;
#endif
  if (n <= 0) return 0;
  batch_now_ = now_ns();
  for (int i = 0; i < n; ++i) {
    const uint8_t* pkt = rx_buf_.data() + size_t(i) * kRxBuf;
    size_t len = rx_msgs_[i].msg_len;
    if (rx_msgs_[i].msg_hdr.msg_flags & MSG_TRUNC) {
      stats_.rx_malformed++;
      continue;
    }
    IpUdp ip;
    ip.v6 = k.v6;
    uint16_t sport = 0;
    if (!from_sockaddr(rx_from_[i], ip.src, &sport)) {
      stats_.rx_malformed++;
      continue;
    }
    memcpy(ip.dst, k.addr.gid, 16);
    ip.sport = sport;
    ip.dport = port_;
    ip.udp_len = uint16_t(len + kUdpHeaderSize);
    ip.hdr_len = uint8_t((k.v6 ? kIpv6HeaderSize : kIpv4HeaderSize) + kUdpHeaderSize);
    uint16_t id = 0;
    if (!icrc_check_udp_payload(ip, pkt, len, &id)) {
      stats_.rx_bad_icrc++;
      continue;
    }
    ip.ip_id = id;
    stats_.rx_packets++;
    engine_.receive(ip, pkt, len);
  }
  stats_.rx_engine_dropped.store(engine_.dropped_packets(), std::memory_order_relaxed);
  engine_.tick();
  batch_now_ = 0;
  flush_tx();
  return n;
}

bool UdpTransport::poll_progress() {
  if (!running_ || !mu_.try_lock()) return false;  // the progress thread is at it already
  int got = 0;
  for (size_t s = 0; s < socks_.size(); ++s)
    if (socks_[s].fd >= 0) got += receive_batch(s);
  if (engine_.next_deadline() <= now_ns()) {
    engine_.tick();
    flush_tx();
  }
  mu_.unlock();
  return got > 0;
}

void UdpTransport::run() {
  std::vector<pollfd> fds;
  std::vector<size_t> which;
  for (size_t i = 0; i < socks_.size(); ++i)
    if (socks_[i].fd >= 0) {
      fds.push_back({socks_[i].fd, POLLIN, 0});
      which.push_back(i);
    }
  fds.push_back({wake_rd_, POLLIN, 0});
  const size_t nsock = which.size();
  while (running_) {
    uint64_t deadline;
    {
      std::lock_guard<std::mutex> g(mu_);
      deadline = engine_.next_deadline();
      armed_deadline_ = deadline;
    }
    timespec ts{}, *tsp = nullptr;
    if (deadline != UINT64_MAX) {
      uint64_t now = now_ns();
      uint64_t wait = deadline <= now ? 0 : deadline - now;
      ts.tv_sec = time_t(wait / 1000000000ull);
      ts.tv_nsec = long(wait % 1000000000ull);
      tsp = &ts;
    }
#if defined(__linux__)
    int r = ppoll(fds.data(), fds.size(), tsp, nullptr);
#else
    int r = poll(fds.data(), nfds_t(fds.size()),
                 tsp ? int((uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec) + 999999) / 1000000) : -1);
#endif
    if (r < 0 && errno != EINTR) break;
    if (fds[nsock].revents & POLLIN) {
      char buf[64];
      while (read(wake_rd_, buf, sizeof buf) > 0) {}
    }
    for (size_t s = 0; s < nsock; ++s) {
      if (!(fds[s].revents & POLLIN)) continue;
      for (int i = 0; i < 16; ++i) {  // drain a burst, but look at timers in between
        std::lock_guard<std::mutex> g(mu_);
        if (receive_batch(which[s]) <= 0) break;
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    if (engine_.next_deadline() <= now_ns()) {
      engine_.tick();
      flush_tx();
    }
  }
}

}  // namespace melon::soft
