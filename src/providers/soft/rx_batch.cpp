#include "providers/soft/rx_batch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <string.h>

#include "providers/soft/steering.h"
#include "roce/frame.h"
#include "roce/icrc_udp.h"

namespace melon::soft {

using namespace roce;

int RxBatch::system_recv(int fd, mmsghdr* v, unsigned n) {
#if defined(__linux__)
  return recvmmsg(fd, v, n, MSG_DONTWAIT, nullptr);
#else  // recvmsg_x with MELON_SOFT_DARWIN_BATCH, else one recvmsg per datagram (msg_batch.h)
  return recv_msg_x(system_msg_x(), fd, v, n);
#endif
}

void RxBatch::setup(bool gro, uint32_t window) {
  buf_size_ = gro ? kBufGro : kBuf;
  const size_t n = gro ? 32 : std::clamp<size_t>(window, 64, 512);
  buf_.resize(n * buf_size_);
  msgs_.resize(n);
  iov_.resize(n);
  from_.resize(n);
  ctrl_.resize(n * kCtrl);
  for (size_t i = 0; i < n; ++i) {
    iov_[i] = {buf_.data() + i * buf_size_, buf_size_};
    memset(&msgs_[i], 0, sizeof(mmsghdr));
    msgs_[i].msg_hdr.msg_iov = &iov_[i];
    msgs_[i].msg_hdr.msg_iovlen = 1;
    msgs_[i].msg_hdr.msg_name = &from_[i];
  }
}

int RxBatch::receive(int fd, int nmsg) {
  nmsg = std::min(nmsg, capacity());
  for (int i = 0; i < nmsg; ++i) {
    msghdr& h = msgs_[size_t(i)].msg_hdr;
    h.msg_namelen = sizeof(sockaddr_storage);
    h.msg_control = &ctrl_[size_t(i) * kCtrl];
    h.msg_controllen = kCtrl;
    h.msg_flags = 0;
  }
  const int n = nmsg > 0 ? recv_(fd, msgs_.data(), unsigned(nmsg)) : 0;
  return std::max(n, 0);
}

bool RxBatch::segment(int i, uint32_t* rxq_drops, size_t* seg) const {
  const msghdr& h = msgs_[size_t(i)].msg_hdr;
  const size_t len = msgs_[size_t(i)].msg_len;
  *seg = len;
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), c)) {
#if defined(__linux__)
    if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      int v;
      memcpy(&v, CMSG_DATA(c), sizeof v);
      if (v > 0) *seg = size_t(v);
    } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
      uint32_t drops;  // the socket's running total: count what is new since the last report
      memcpy(&drops, CMSG_DATA(c), sizeof drops);
      stats_.rx_buffer_drops += uint32_t(drops - *rxq_drops);
      *rxq_drops = drops;
    }
#else
    (void)rxq_drops;
#endif
  }
  if (h.msg_flags & MSG_TRUNC) {
    stats_.rx_malformed++;
    return false;
  }
  if (len > *seg) stats_.rx_gro_buffers++;
  return true;
}

bool sockaddr_gid(const sockaddr_storage& ss, uint8_t gid[16], uint16_t* port) {
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

RxTo check_datagram(const RxLocal& at, const uint8_t src[16], uint16_t sport, const uint8_t* pkt, size_t len,
                    uint16_t likely_id, TransportStats& stats, IpUdp* ip, uint8_t* lane) {
  ip->v6 = at.v6;
  memcpy(ip->src, src, 16);
  memcpy(ip->dst, at.gid, 16);
  ip->sport = sport;
  ip->dport = at.port;
  ip->udp_len = uint16_t(len + kUdpHeaderSize);
  ip->hdr_len = uint8_t((at.v6 ? kIpv6HeaderSize : kIpv4HeaderSize) + kUdpHeaderSize);
  uint16_t id = 0;
  if (!icrc_check_udp_payload(*ip, pkt, len, &id, likely_id)) {
    stats.rx_bad_icrc++;
    return RxTo::bad_icrc;
  }
  ip->ip_id = id;
  stats.rx_packets++;
  *lane = uint8_t(at.lane);
  if (!at.lane_of_bucket || len < 8) return RxTo::engine;
  const uint32_t qpn = uint32_t(pkt[5]) << 16 | uint32_t(pkt[6]) << 8 | pkt[7];  // BTH: destination QP
  const uint8_t to = at.lane_of_bucket[bucket_of_qpn(qpn)];
  if (to == kNotOurs) {
    // The one place a packet for a QPN of no lane here ends: another process's (steered here
    // while the group's program is rebuilt after a member died: RC sends it again), QP1 with no
    // CM agent, or a QPN nobody holds.
    stats.rx_unknown_qpn++;
    return RxTo::unknown_qpn;
  }
  if (to == at.lane) return RxTo::engine;
  *lane = to;
  return RxTo::lane;
}

}  // namespace melon::soft
