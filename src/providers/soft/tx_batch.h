// One batch of outgoing RoCEv2 packets as the kernel will take them: each packet's headers, pad and
// ICRC in a slot, its payload copied into the batch first (the ICRC is summed over the copy, which
// is what leaves), and packets grouped into messages. Consecutive
// packets of one flow of the segment size share one message, sent as one UDP GSO send
// (UDP_SEGMENT = that size, the last segment may be shorter); each socket's messages leave in
// one sendmmsg (UdpTransport::send_batch).
//
// Locks: none. A batch belongs to one thread at a time: the engine fills it under the transport's
// engine lock, the send queue hands it to the one sending thread (send_queue.h), then back as a spare.
#pragma once
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "providers/soft/msg_batch.h"  // mmsghdr off Linux
#include "rc/engine.h"
#include "roce/frame.h"
#include "roce/ip_udp.h"

namespace melon::soft {

constexpr int kMaxIovPerPkt = rc::TxPacket::kMaxIov + 2;  // + the headers and the pad/ICRC tail
constexpr int kMaxGsoSegments = 64;  // UDP_MAX_SEGMENTS of Linux 4.18..6.0 (128 since)
constexpr size_t kMaxGsoBytes = 65507;  // the largest IPv4 UDP payload, all segments together
constexpr int kMaxIovPerMsg = 1024;  // UIO_MAXIOV

struct TxSlot {
  roce::PayloadFrame frame;  // transport headers, pad + ICRC around the payload
  roce::IpUdp ip;  // what its ICRC covers (join_held_reply computes it again for another IPv4 id)
};
enum TxKind : uint8_t { kTxRequest = 1, kTxReply = 2, kTxOther = 4 };
struct TxMsg {
  size_t sock;
  uint8_t dgid[16];
  int first_iov, niov;
  int npkts;
  uint32_t seg;  // size of every packet but the last (the GSO segment size)
  bool open;  // a further packet of size <= seg may join
  uint8_t kinds;  // TxKind bits of its packets (join_held_reply)
  int first_slot;
  sockaddr_storage to;
  socklen_t to_len;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(uint16_t))];
};
// The ICRC change for the last (length, identification) a joined reply moved between: a
// ping-pong's ACKs all have one length and become segment 1, so it is computed once.
struct JoinDelta {
  size_t len = 0;
  uint16_t from = 0, to = 0;
  uint32_t delta = 0;
};

// Where a packet leaves from: its socket's index, address and port, and whether that socket may
// send GSO (cleared by the sender when the kernel refuses one).
struct TxSource {
  size_t sock;
  const uint8_t* gid;  // 16 bytes
  bool v6;
  uint16_t port;
  const std::atomic<bool>* gso;  // per socket, indexed by sock
};

struct TxBatch {
  // A whole window's packets fit one batch (a large post, or an ACK opening the window).
  explicit TxBatch(uint32_t window);
  bool full(int niov) const {
    return nslots == int(slots.size()) || nmsgs == int(msgs.size()) || n_iov + niov > int(iov.size());
  }
  // Adds `p` from `src` (the caller has checked !full(p.niov + 2)): its frame and ICRC, and joins
  // the message before when it goes to the same place and can be its next GSO segment.
  void add(const rc::TxPacket& p, const TxSource& src);
  // A busy-polling ping-pong: the lone reply (ACK) a receive held as this batch's first message,
  // and the one message of requests posted after it, become one GSO send, the requests first.
  // True if joined (`gso`: per socket, as in TxSource).
  bool join_held_reply(const std::atomic<bool>* gso, JoinDelta* delta);
  // Fills mmsg[0..nmsgs) for sendmmsg (UDP_SEGMENT on the GSO messages, Linux).
  void prepare_send();
  // `n` bytes that live as long as the batch (a packet's payload, copied in).
  uint8_t* reserve(size_t n);
  void clear() { nslots = nmsgs = n_iov = 0, chunk = chunk_off = 0; }

  std::vector<TxSlot> slots;
  std::vector<TxMsg> msgs;
  std::vector<iovec> iov;
  std::vector<mmsghdr> mmsg;
  int nslots = 0, nmsgs = 0, n_iov = 0;
  std::vector<std::unique_ptr<uint8_t[]>> chunks;
  size_t chunk = 0, chunk_off = 0;
};

}  // namespace melon::soft
