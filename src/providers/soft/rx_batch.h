// The receive side of a soft device's sockets, up to the engine's door: recvmmsg buffers sized to
// the requester window (several packets per buffer with UDP GRO), the splitting of each buffer into
// RoCEv2 packets (a GRO buffer holds packets of its segment size back to back, the last one possibly
// shorter), and the check of each packet (ICRC over the IP and UDP fields the socket hid, icrc_udp.h)
// that decides where it goes: this lane's engine, another lane's, or nowhere. Every packet that goes
// nowhere is counted (TransportStats): truncated datagrams, bad ICRCs, QPNs of no lane, and the
// kernel's own drops for a full socket buffer (SO_RXQ_OVFL).
//
// Locks: none of its own. The buffers belong to one thread at a time: UdpTransport calls receive()
// and split() under its receive lock (rx_mu_), which also keeps packets in arrival order whoever
// reads them. check_datagram() is a pure function that counts in the (atomic) counters.
#pragma once
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "providers/soft/msg_batch.h"  // mmsghdr off Linux
#include "providers/soft/soft_counters.h"
#include "roce/ip_udp.h"

namespace melon::soft {

class RxBatch {
 public:
  // Receives up to `n` datagrams from `fd` without blocking (recvmmsg with MSG_DONTWAIT on Linux,
  // recv_msg_x elsewhere: msg_batch.h); the count, or <= 0 for none. Tests stand in for it.
  using RecvFn = int (*)(int fd, mmsghdr* v, unsigned n);
  static int system_recv(int fd, mmsghdr* v, unsigned n);

  // One datagram per buffer, or with UDP GRO up to 64 KiB of one flow's packets.
  static constexpr size_t kBuf = 9216;
  static constexpr size_t kBufGro = 65536;
  static constexpr size_t kCtrl = CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint32_t));

  explicit RxBatch(TransportStats& stats, RecvFn recv = system_recv) : stats_(stats), recv_(recv) {}
  // Without GRO one buffer per packet, as many as a window (64..512); with GRO a buffer holds up
  // to 64 KiB of one flow's packets, and 32 of them more than a window.
  void setup(bool gro, uint32_t window);
  bool gro() const { return buf_size_ == kBufGro; }
  int capacity() const { return int(msgs_.size()); }

  // Receives up to `nmsg` (at most capacity()) datagrams from `fd`; how many came (0: none).
  int receive(int fd, int nmsg);
  // For each packet of the `n` datagrams receive() returned, in order: f(from, pkt, len, nth), nth
  // its index in its buffer (the IPv4 identification it likely carries: it does when the buffer is
  // one GSO send of a Linux sender, whose inet_gso_segment numbers the segments 0, 1, 2, ...).
  // Truncated datagrams are dropped (rx_malformed); GRO buffers are counted, and the kernel's drops
  // for the socket since its last report (*rxq_drops: the running total it reported then).
  template <typename F>
  void split(int n, uint32_t* rxq_drops, F&& f) const {
    for (int i = 0; i < n; ++i) {
      size_t seg;
      if (!segment(i, rxq_drops, &seg)) continue;
      const uint8_t* buf = buf_.data() + size_t(i) * buf_size_;
      const size_t len = msgs_[size_t(i)].msg_len;
      uint16_t nth = 0;
      for (size_t off = 0; off < len; off += seg, ++nth) f(from_[size_t(i)], buf + off, std::min(seg, len - off), nth);
    }
  }

 private:
  // Datagram i's packet size (its length, or its GRO segment size); false if it was truncated.
  bool segment(int i, uint32_t* rxq_drops, size_t* seg) const;

  TransportStats& stats_;
  RecvFn recv_;
  size_t buf_size_ = kBuf;
  std::vector<uint8_t> buf_;
  std::vector<mmsghdr> msgs_;
  std::vector<iovec> iov_;
  std::vector<sockaddr_storage> from_;
  std::vector<char> ctrl_;
};

// The sender of a datagram as a GID (IPv4-mapped for IPv4) and port; false for another family.
bool sockaddr_gid(const sockaddr_storage& ss, uint8_t gid[16], uint16_t* port);

constexpr uint8_t kNotOurs = 0xff;  // LaneConfig::lane_of_bucket: a bucket no lane of this device owns
// Where a datagram arrived: the receiving socket's address and port, and the lanes' steering.
struct RxLocal {
  bool v6;
  const uint8_t* gid;  // 16 bytes
  uint16_t port;
  const uint8_t* lane_of_bucket;  // LaneConfig's: the lane of each QPN bucket (nullptr: all this lane's)
  uint32_t lane;  // this lane's index
};
enum class RxTo : uint8_t {
  bad_icrc,  // dropped (rx_bad_icrc)
  unknown_qpn,  // a right ICRC, for a QPN of no lane here: dropped (rx_unknown_qpn)
  engine,  // this lane's engine
  lane,  // another lane's engine (*lane)
};
// One datagram from `src`/`sport` to `at`: *ip is set to the IP and UDP fields its ICRC covers (the
// IPv4 identification that makes it right, `likely_id` tried first), and the ICRC checked. A packet
// that passes counts in rx_packets and goes to the lane of its destination QP's bucket.
RxTo check_datagram(const RxLocal& at, const uint8_t src[16], uint16_t sport, const uint8_t* pkt, size_t len,
                    uint16_t likely_id, TransportStats& stats, roce::IpUdp* ip, uint8_t* lane);

}  // namespace melon::soft
