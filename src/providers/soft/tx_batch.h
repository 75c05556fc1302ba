// One batch of outgoing RoCEv2 packets as the kernel will take them: each packet's headers, pad and
// ICRC in a slot, its payload copied into the batch first (the ICRC is summed over the copy, which
// is what leaves), and packets grouped into messages. Consecutive
// packets of one flow of the segment size share one message, sent as one UDP GSO send
// (UDP_SEGMENT = that size, the last segment may be shorter); each socket's consecutive messages
// leave in one sendmmsg (send_batch, below).
//
// Locks: none. A batch belongs to one thread at a time: the engine fills it under the transport's
// engine lock, the send queue hands it to the one sending thread (send_queue.h), then back as a spare.
#pragma once
#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "providers/soft/msg_batch.h"  // mmsghdr off Linux
#include "providers/soft/soft_counters.h"
#include "rc/engine.h"
#include "roce/frame.h"
#include "roce/ip_udp.h"

namespace melon::soft {

constexpr int kMaxIovPerPkt = rc::TxPacket::kMaxIov + 2;  // + the headers and the pad/ICRC tail
using roce::kMaxGsoBytes;
using roce::kMaxGsoSegments;
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

// Sends up to `n` messages of `v` on `fd`: how many left, or -1 with errno (sendmmsg on Linux;
// elsewhere sendmsg_x or one sendmsg per message, msg_batch.h). Tests stand in for it.
using TxSendFn = int (*)(int fd, mmsghdr* v, unsigned n);
int system_send(int fd, mmsghdr* v, unsigned n);

// Hands `b` to the kernel (prepare_send, then consecutive messages of one socket in one `send` on
// fd_of(sock)), by the send queue's one sender. A message the kernel refuses loses its packets
// (tx_errors; the transport retries them). A GSO send refused with EIO (no checksum offload on the
// route) or EINVAL (a limit we do not know of) also makes its socket send one datagram per packet
// from then on (gso[sock] cleared, offload_fallbacks); anything else (ENOBUFS, EAGAIN, no route)
// loses the packets only. Counts tx_calls, tx_packets and tx_gso_sends.
template <typename FdOf>
void send_batch(TxBatch& b, FdOf&& fd_of, std::atomic<bool>* gso, TransportStats& stats, TxSendFn send = system_send) {
  b.prepare_send();
  int off = 0;
  while (off < b.nmsgs) {
    const size_t sock = b.msgs[off].sock;
    int end = off + 1;
    while (end < b.nmsgs && b.msgs[end].sock == sock) ++end;
    const int r = send(fd_of(sock), b.mmsg.data() + off, unsigned(end - off));
    stats.tx_calls.fetch_add(1, std::memory_order_relaxed);
    if (r < 0) {
      if (errno == EINTR) continue;
      const TxMsg& m = b.msgs[off];
      if (m.npkts > 1 && (errno == EIO || errno == EINVAL) && gso[sock].exchange(false)) stats.offload_fallbacks++;
      stats.tx_errors += uint64_t(m.npkts);
      ++off;
      continue;
    }
    for (int j = off; j < off + r; ++j) {
      stats.tx_packets += uint64_t(b.msgs[j].npkts);
      if (b.msgs[j].npkts > 1) stats.tx_gso_sends++;
    }
    off += r;
  }
}

}  // namespace melon::soft
