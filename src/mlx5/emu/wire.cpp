#include "mlx5/emu/wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <vector>

#include "roce/icrc.h"
#include "roce/icrc_udp.h"
#include "roce/opcode.h"
#include "roce/ip_udp.h"

namespace melon::mlx5::emu {

namespace {

// A GID (IPv4-mapped or IPv6) and a port as the socket address of its family, all other bytes zero
// (transmit_many compares two addresses by their bytes).
socklen_t to_sockaddr(const uint8_t gid[16], uint16_t port, sockaddr_storage* ss) {
  memset(ss, 0, sizeof(sockaddr_in6));
  if (roce::gid_is_v4_mapped(gid)) {
    auto* a = reinterpret_cast<sockaddr_in*>(ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    a->sin_addr.s_addr = htonl(roce::gid_to_ipv4(gid));
    return sizeof *a;
  }
  auto* a = reinterpret_cast<sockaddr_in6*>(ss);
  a->sin6_family = AF_INET6;
  a->sin6_port = htons(port);
  memcpy(&a->sin6_addr, gid, 16);
  return sizeof *a;
}

// The sender's address as a GID; returns its port.
uint16_t from_sockaddr(const sockaddr_storage& ss, uint8_t gid[16]) {
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    memcpy(gid, &a.sin6_addr, 16);
    return ntohs(a.sin6_port);
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
  roce::gid_from_ipv4(gid, ntohl(a.sin_addr.s_addr));
  return ntohs(a.sin_port);
}

}  // namespace

FramePort* MemoryLink::add_port() {
  ports_.emplace_back(new Port);
  ports_.back()->link = this;
  return ports_.back().get();
}

void MemoryLink::attach(FramePort* port, Device* dev) {
  for (auto& p : ports_)
    if (p.get() == port) p->dev = dev;
}

void MemoryLink::Port::transmit(const uint8_t* frame, size_t len) {
  ++link->frames_;
  if (link->drop && link->drop(link->drop_arg, frame, len)) {
    ++link->dropped_;
    return;
  }
  for (auto& p : link->ports_)
    if (p.get() != this && p->dev) p->dev->receive_frame(frame, len);
}

// One received datagram, with room in front for the IP/UDP headers the socket hid; with UDP GRO
// several of one sender's datagrams back to back (a GSO send arrives whole over loopback).
struct UdpWire::RxSlot {
  static constexpr size_t kHeadroom = 64;
  uint8_t buf[kHeadroom + 65536];
  sockaddr_storage from;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
};

UdpWire::UdpWire(uint32_t ip, uint16_t port) : v6_(false), port_(port), rx_(new RxSlot[kRxBatch]) {
  roce::gid_from_ipv4(gid_, ip);
}

UdpWire::UdpWire(const uint8_t gid[16], uint16_t port)
    : v6_(!roce::gid_is_v4_mapped(gid)), port_(port), rx_(new RxSlot[kRxBatch]) {
  memcpy(gid_, gid, 16);
}

UdpWire::~UdpWire() {
  stop();
  if (fd_ >= 0) close(fd_);
}

int UdpWire::open() {
  fd_ = socket(v6_ ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);  // SOCK_CLOEXEC is Linux's
  if (fd_ < 0) return errno;
  fcntl(fd_, F_SETFD, FD_CLOEXEC);
#ifdef __linux__
  // DF on every IPv4 packet, and with it identification 0 on an unconnected socket (Linux
  // ip_select_ident): the ICRC in transmit() assumes 0, and a peer that checks the ICRC over the
  // header it received (Linux rxe, hardware) drops anything else. The soft provider does the same.
  int pmtu = IP_PMTUDISC_DO;
  if (setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu) != 0) {
    int e = errno;
    close(fd_);
    fd_ = -1;
    return e;
  }
#endif
  // A window of full-MTU packets must fit in the socket buffers, or the kernel drops them silently.
  int buf = 4 << 20, one = 1;
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf) != 0 ||
      setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf) != 0 ||
      (v6_ && (setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0
#ifdef UDP_NO_CHECK6_RX  // Linux: accept zero-checksum IPv6 datagrams (XNU: docs/macos.md, soft provider)
               || setsockopt(fd_, IPPROTO_UDP, UDP_NO_CHECK6_RX, &one, sizeof one) != 0
#endif
               ))) {
    int e = errno;
    close(fd_);
    fd_ = -1;
    return e;
  }
#if defined(__linux__) && defined(UDP_GRO)
  // Datagrams of one GSO send arrive as one (drain() cuts them apart): one copy and one queue entry
  // in the kernel instead of one per packet. Without it (Linux before 5.0) one datagram each.
  setsockopt(fd_, SOL_UDP, UDP_GRO, &one, sizeof one);
#endif
  sockaddr_storage ss{};
  socklen_t sl = to_sockaddr(gid_, port_, &ss);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&ss), sl) != 0) {
    int e = errno;
    close(fd_);
    fd_ = -1;
    return e;
  }
  return 0;
}

// The socket sends from its bound port, not the frame's entropy port, and the kernel picks the IPv4
// identification (0, see open()): the ICRC covers both, so a frame written with others gets it
// recomputed, in place, for what the peer will see (the soft provider and rxe solve for the
// identification, roce/icrc_udp.h). The emulated device writes its frames with source_port() and
// identification 0, so their ICRC is already that one. False for a frame this socket cannot send.
bool UdpWire::to_datagram(uint8_t* frame, size_t len, Datagram* d) const {
  roce::IpUdp h;
  if (fd_ < 0 || roce::parse_ip_udp(frame, len, h) != roce::ParseError::ok || h.v6 != v6_) return false;
  size_t n = h.udp_len - 8;
  if (n < roce::kIcrcSize || h.hdr_len + n > len) return false;
  d->tl = to_sockaddr(h.dst, h.dport, &d->to);
  d->data = frame + h.hdr_len;
  d->len = n;
  d->ip = h;
  d->ip.sport = port_;
  d->ip.ip_id = 0;
  if (h.sport == port_ && h.ip_id == 0) return true;
  roce::store_icrc(d->data + n - roce::kIcrcSize, roce::icrc_for_udp_payload(d->ip, d->data, n - roce::kIcrcSize));
  return true;
}

void UdpWire::transmit(const uint8_t* frame, size_t len) {
  std::vector<uint8_t> copy(frame, frame + len);
  Datagram d;
  if (to_datagram(copy.data(), len, &d)) sendto(fd_, d.data, d.len, 0, reinterpret_cast<sockaddr*>(&d.to), d.tl);
}

void UdpWire::set_segment_id(Datagram& d, unsigned i) {
  if (v6_ || !i) return;  // IPv6 has no identification
  const size_t body = d.len - roce::kIcrcSize;
  uint8_t* icrc = d.data + body;
  IdDeltas* e = nullptr;
  for (IdDeltas& x : deltas_)
    if (x.len == body) e = &x;
  if (!e) {
    e = &deltas_[next_delta_++ % (sizeof deltas_ / sizeof deltas_[0])];
    e->len = body, e->have = 0;
  }
  if (e->have >> i & 1) {
    roce::store_icrc(icrc, roce::load_icrc(icrc) ^ e->d[i]);
    return;
  }
  roce::IpUdp h = d.ip;
  h.ip_id = uint16_t(i);
  const uint32_t fresh = roce::icrc_for_udp_payload(h, d.data, body);
  e->d[i] = fresh ^ roce::load_icrc(icrc);
  e->have |= 1ull << i;
  roce::store_icrc(icrc, fresh);
}

void UdpWire::clear_segment_id(Datagram& d, unsigned i) {
  if (v6_ || !i) return;
  roce::store_icrc(d.data + d.len - roce::kIcrcSize, roce::icrc_for_udp_payload(d.ip, d.data, d.len - roce::kIcrcSize));
}

// A window's frames in as few system calls as the kernel allows: one sendmmsg for up to 64 frames,
// and within it one GSO send per run of frames to one peer of one size (see the class comment). Each
// frame still leaves as a datagram of its own, one RoCE packet; the ICRC of a GSO send's segment i
// covers identification i.
void UdpWire::transmit_many(std::vector<uint8_t>* frames, size_t n) {
#ifdef __linux__
  constexpr unsigned kBatch = 64;
  struct Msg {
    unsigned first, count;
    size_t seg;  // every segment's size but the last's
    bool open;  // a further datagram of size <= seg may join
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(uint16_t))];
  };
  Datagram d[kBatch];
  iovec iov[kBatch];
  mmsghdr m[kBatch];
  Msg msg[kBatch];
  size_t i = 0;
  while (i < n) {
    unsigned k = 0, nm = 0;
    const bool gso = gso_.load(std::memory_order_relaxed);
    for (; i < n && k < kBatch; i++) {
      if (!to_datagram(frames[i].data(), frames[i].size(), &d[k])) continue;
      iov[k] = iovec{d[k].data, d[k].len};
      Msg* last = nm ? &msg[nm - 1] : nullptr;
      if (gso && last && last->open && d[k].len <= last->seg && last->count < unsigned(roce::kMaxGsoSegments) &&
          (last->count + 1) * last->seg <= roce::kMaxGsoBytes && d[k].tl == d[last->first].tl &&
          !memcmp(&d[k].to, &d[last->first].to, d[k].tl)) {
        set_segment_id(d[k], last->count);
        last->count++;
        if (d[k].len < last->seg) last->open = false;
      } else {
        msg[nm++] = Msg{k, 1, d[k].len, true, {}};
      }
      k++;
    }
    for (unsigned j = 0; j < nm; j++) {
      msghdr& h = m[j].msg_hdr;
      m[j] = mmsghdr{};
      h.msg_name = &d[msg[j].first].to;
      h.msg_namelen = d[msg[j].first].tl;
      h.msg_iov = &iov[msg[j].first];
      h.msg_iovlen = msg[j].count;
      if (msg[j].count > 1) {  // one send, cut by the kernel into datagrams of msg[j].seg bytes
        h.msg_control = msg[j].ctrl;
        h.msg_controllen = sizeof msg[j].ctrl;
        cmsghdr* c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        const uint16_t seg = uint16_t(msg[j].seg);
        memcpy(CMSG_DATA(c), &seg, sizeof seg);
      }
    }
    for (unsigned sent = 0; sent < nm;) {
      int r = sendmmsg(fd_, m + sent, nm - sent, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const Msg& bad = msg[sent];
        if (bad.count > 1 && r < 0 && (errno == EIO || errno == EINVAL)) {
          // The kernel takes no GSO send here: off from now on, and these frames leave singly, each
          // with its ICRC for identification 0 again.
          gso_ = false;
          for (unsigned s = 1; s < bad.count; s++) clear_segment_id(d[bad.first + s], s);
          for (unsigned s = 0; s < bad.count; s++) {
            Datagram& x = d[bad.first + s];
            sendto(fd_, x.data, x.len, 0, reinterpret_cast<sockaddr*>(&x.to), x.tl);
          }
        }
        sent++;  // otherwise these datagrams are lost, as a dropped frame is; the transport retransmits
        continue;
      }
      for (unsigned j = sent; j < sent + unsigned(r); j++)
        if (msg[j].count > 1) gso_sends_++;
      sent += unsigned(r);
    }
  }
#else
  for (size_t i = 0; i < n; i++) {
    Datagram d;
    if (to_datagram(frames[i].data(), frames[i].size(), &d))
      sendto(fd_, d.data, d.len, 0, reinterpret_cast<sockaddr*>(&d.to), d.tl);
  }
#endif
}

int UdpWire::poll(int timeout_ms) {
  if (fd_ < 0 || !dev_) return 0;
  if (timeout_ms != 0) {  // wait unlocked: another thread may drain meanwhile (poll_now)
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return 0;
  }
  std::lock_guard<std::mutex> g(rx_mu_);
  return drain();
}

int UdpWire::poll_now() {
  if (fd_ < 0 || !dev_ || !rx_mu_.try_lock()) return 0;
  int n = drain();
  rx_mu_.unlock();
  return n;
}

// Under rx_mu_: datagrams reach the device in the order the socket gave them, whichever thread reads.
int UdpWire::drain() {
  int n = 0;
  for (;;) {
    unsigned got = 0;
    size_t lens[kRxBatch], segs[kRxBatch];  // bytes received; the size of each datagram in them
#ifdef __linux__
    // Up to kRxBatch datagrams a call; fewer means the queue was empty, so no call is made only to
    // fail (one system call less per wake-up on a ping-pong's path).
    iovec iov[kRxBatch];
    mmsghdr m[kRxBatch];
    for (unsigned i = 0; i < kRxBatch; i++) {
      iov[i] = iovec{rx_[i].buf + RxSlot::kHeadroom, sizeof rx_[i].buf - RxSlot::kHeadroom};
      m[i] = mmsghdr{};
      m[i].msg_hdr.msg_name = &rx_[i].from;
      m[i].msg_hdr.msg_namelen = sizeof rx_[i].from;
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
      m[i].msg_hdr.msg_control = rx_[i].ctrl;
      m[i].msg_hdr.msg_controllen = sizeof rx_[i].ctrl;
    }
    int r = recvmmsg(fd_, m, kRxBatch, MSG_DONTWAIT, nullptr);
    if (r <= 0) return n;
    got = unsigned(r);
    for (unsigned i = 0; i < got; i++) {
      lens[i] = m[i].msg_len;
      segs[i] = lens[i];
      if (m[i].msg_hdr.msg_flags & MSG_TRUNC) lens[i] = 0;  // cannot be checked whole: dropped
#ifdef UDP_GRO
      for (cmsghdr* c = CMSG_FIRSTHDR(&m[i].msg_hdr); c; c = CMSG_NXTHDR(&m[i].msg_hdr, c))
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
          int v;
          memcpy(&v, CMSG_DATA(c), sizeof v);
          if (v > 0) segs[i] = size_t(v);
        }
#endif
    }
#else
    socklen_t fl = sizeof rx_[0].from;
    ssize_t r = recvfrom(fd_, rx_[0].buf + RxSlot::kHeadroom, sizeof rx_[0].buf - RxSlot::kHeadroom, MSG_DONTWAIT,
                         reinterpret_cast<sockaddr*>(&rx_[0].from), &fl);
    if (r <= 0) return n;
    got = 1;
    lens[0] = segs[0] = size_t(r);
#endif
    for (unsigned i = 0; i < got; i++) {
      // Rebuild the IP/UDP headers the socket hid; the one unknowable field, the IPv4 identification,
      // is recovered from the ICRC (roce/icrc_udp.h) so the device checks the frame as it came.
      // (IPv6's traffic class, flow label and hop limit are masked out of the ICRC.) A GRO buffer's
      // k-th datagram most likely carries identification k (a GSO send's numbering): tried first.
      roce::IpUdp h;
      h.v6 = v6_;
      h.sport = from_sockaddr(rx_[i].from, h.src);
      memcpy(h.dst, gid_, 16);
      h.dport = port_;
      uint16_t k = 0;
      for (size_t off = 0; off < lens[i] && segs[i]; off += segs[i], k++) {
        uint8_t* data = rx_[i].buf + RxSlot::kHeadroom + off;
        const size_t len = lens[i] - off < segs[i] ? lens[i] - off : segs[i];
        uint16_t id = 0;
        if (!roce::icrc_check_udp_payload(h, data, len, &id, k)) {
          ++bad_icrc_;
          continue;
        }
        h.ip_id = id;
        uint8_t hdr[RxSlot::kHeadroom];
        size_t hl = roce::write_ip_udp(h, len, hdr);
        // In front of the datagram: the headroom, or the tail of the one before it, which
        // receive_frame has copied already.
        memcpy(data - hl, hdr, hl);
        dev_->receive_frame(data - hl, hl + len);
        ++n;
      }
    }
#ifdef __linux__
    if (got < kRxBatch) return n;
#endif
  }
}

void UdpWire::start() {
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_) {
      poll(1);
      while (dev_ && dev_->service()) {}
    }
  });
}

void UdpWire::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace melon::mlx5::emu
