#include "providers/soft/tx_batch.h"

#include <netinet/udp.h>
#include <string.h>

#include <algorithm>

#include "providers/soft/udp_socket.h"
#include "rc/wire.h"
#include "roce/icrc.h"
#include "roce/icrc_udp.h"

namespace melon::soft {

using namespace roce;

TxBatch::TxBatch(uint32_t window)
    : slots(window), msgs(window), iov(size_t(window) * 4 + kMaxIovPerPkt), mmsg(window) {}

uint8_t* TxBatch::reserve(size_t n) {
  constexpr size_t kChunk = 64 << 10;  // > the largest packet payload (path MTU 4096)
  if (chunk_off + n > kChunk) {
    ++chunk;
    chunk_off = 0;
  }
  if (chunk == chunks.size()) chunks.emplace_back(new uint8_t[kChunk]);
  uint8_t* d = chunks[chunk].get() + chunk_off;
  chunk_off += n;
  return d;
}

void TxBatch::add(const rc::TxPacket& p, const TxSource& src) {
  uint32_t payload = 0;
  for (int i = 0; i < p.niov; ++i) payload += p.iov[i].len;
  const uint32_t len = uint32_t(transport_header_len(p.pkt.bth.opcode) + payload + pad_for(payload) + kIcrcSize);

  // Join the message before when it goes to the same place and this packet can be its next GSO
  // segment: every segment but the last has the segment size, the last may be shorter.
  TxMsg* m = nmsgs ? &msgs[nmsgs - 1] : nullptr;
  const bool join = m && src.gso[src.sock].load(std::memory_order_relaxed) && m->open && m->sock == src.sock &&
                    len <= m->seg && m->npkts < kMaxGsoSegments && size_t(m->npkts + 1) * m->seg <= kMaxGsoBytes &&
                    m->niov + 3 <= kMaxIovPerMsg && !memcmp(m->dgid, p.av->dgid, 16);

  // The ICRC covers IP and UDP as the kernel will send them: from this socket's address and port (a
  // socket has one source port, so the engine's entropy port in tx_ip() is replaced), DF set (see
  // UdpTransport::start()), and the IPv4 identification: 0 for a datagram of its own; GSO gives the
  // segments of one send the identifications 0, 1, 2, ... (Linux inet_gso_segment), so the i-th
  // packet of a message is summed with i.
  IpUdp ip = rc::tx_ip(p);
  ip.v6 = src.v6;
  memcpy(ip.src, src.gid, 16);
  ip.sport = src.port;
  ip.dport = kRoceV2Port;
  ip.ip_id = join ? uint16_t(m->npkts) : 0;
  ip.df = true;
  // Every payload is copied into the batch before its ICRC is summed, and the copy is what leaves,
  // so the ICRC covers exactly the bytes on the wire (rxe too copies, then sums). RC payloads sent
  // straight from registered memory put a wrong ICRC on the wire whenever the application rewrote
  // a buffer still being sent (ucx_perftest's put_bw stamps every iteration into the buffer it
  // writes from), and every receiver drops such a packet. UC/UD sends complete once handed over,
  // and inline data lives in a WQE a concurrent ibv_destroy_qp frees: those needed the copy anyway.
  Span body{nullptr, payload};
  if (payload) {
    body.ptr = reserve(payload);
    uint32_t at = 0;
    for (int i = 0; i < p.niov; ++i) memcpy(body.ptr + at, p.iov[i].ptr, p.iov[i].len), at += p.iov[i].len;
  }
  TxSlot& s = slots[nslots++];
  write_payload_frame(ip, p.pkt, &body, payload ? 1 : 0, s.frame);
  s.ip = ip;
  iovec* v = &iov[n_iov];
  int n = 0;
  v[n++] = {s.frame.transport, s.frame.transport_len};
  if (payload) v[n++] = {body.ptr, payload};
  v[n++] = {s.frame.tail, s.frame.tail_len};
  const OpInfo& op = op_info(p.pkt.bth.opcode);
  const uint8_t kind = op.is(kRequest) ? kTxRequest : op.is(kAck | kAtomicAck | kReadResp) ? kTxReply : kTxOther;
  n_iov += n;
  if (join) {
    m->niov += n;
    ++m->npkts;
    m->kinds |= kind;
    if (len < m->seg) m->open = false;
    return;
  }
  m = &msgs[nmsgs++];
  m->sock = src.sock;
  memcpy(m->dgid, p.av->dgid, 16);
  m->first_iov = n_iov - n;
  m->niov = n;
  m->npkts = 1;
  m->seg = len;
  m->open = true;
  m->kinds = kind;
  m->first_slot = nslots - 1;
  m->to_len = roce_sockaddr(p.av->dgid, 0, kRoceV2Port, &m->to);
}

bool TxBatch::join_held_reply(const std::atomic<bool>* gso, JoinDelta* delta) {
  // The ACK a receive held and the SEND the application posted next would leave as two datagrams,
  // and the peer, which waits for both (its SEND's completion and our SEND), would wait for two
  // trips through the stack. As one GSO send they make one: the requests first (every segment but
  // the last has the segment size, and the ACK is the shortest packet), the reply last. Requests
  // and replies are separate packet streams (a QP's requester and responder), so each keeps its
  // order. The reply's ICRC changes with its IPv4 identification, which as segment i becomes i.
  if (nmsgs != 2) return false;
  TxMsg& a = msgs[0];
  TxMsg& m = msgs[1];
  TxSlot& s = slots[a.first_slot];
  const int n = a.niov + m.niov;
  if (a.kinds != kTxReply || a.npkts != 1 || a.niov != 2 || m.kinds != kTxRequest || !m.open || m.sock != a.sock ||
      !gso[m.sock].load(std::memory_order_relaxed) || a.seg > m.seg || m.npkts >= kMaxGsoSegments ||
      size_t(m.npkts + 1) * m.seg > kMaxGsoBytes || n > kMaxIovPerMsg || memcmp(m.dgid, a.dgid, 16) ||
      a.first_iov != 0 || m.first_iov != a.niov)
    return false;
  const size_t pad = s.frame.tail_len - kIcrcSize;
  const uint16_t id = uint16_t(m.npkts);
  if (!s.ip.v6 && id != s.ip.ip_id) {  // IPv6 has no identification
    // The ICRC is affine in the identification: one XOR with a difference kept per length and id.
    const size_t len = s.frame.transport_len + pad;
    if (len != delta->len || s.ip.ip_id != delta->from || id != delta->to)
      *delta = {len, s.ip.ip_id, id, icrc_id_change(len, s.ip.ip_id, id)};
    store_icrc(s.frame.tail + pad, load_icrc(s.frame.tail + pad) ^ delta->delta);
    s.ip.ip_id = id;
  }
  std::rotate(iov.begin(), iov.begin() + a.niov, iov.begin() + n);
  m.first_iov = 0;
  m.niov = n;
  ++m.npkts;
  m.kinds |= kTxReply;
  m.open = false;
  msgs[0] = m;
  nmsgs = 1;
  return true;
}

void TxBatch::prepare_send() {
  for (int i = 0; i < nmsgs; ++i) {
    TxMsg& m = msgs[i];
    msghdr& h = mmsg[i].msg_hdr;
    memset(&mmsg[i], 0, sizeof(mmsghdr));
    h.msg_name = &m.to;
    h.msg_namelen = m.to_len;
    h.msg_iov = &iov[m.first_iov];
    h.msg_iovlen = m.niov;
#if defined(__linux__)
    if (m.npkts > 1) {  // one send, cut by the kernel into datagrams of m.seg bytes
      h.msg_control = m.ctrl;
      h.msg_controllen = sizeof m.ctrl;
      cmsghdr* c = CMSG_FIRSTHDR(&h);
      c->cmsg_level = SOL_UDP;
      c->cmsg_type = UDP_SEGMENT;
      c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      uint16_t seg = uint16_t(m.seg);
      memcpy(CMSG_DATA(c), &seg, sizeof seg);
    }
#endif
  }
}

int system_send(int fd, mmsghdr* v, unsigned n) {
#if defined(__linux__)
  return sendmmsg(fd, v, n, 0);
#else  // sendmsg_x with MELON_SOFT_DARWIN_BATCH, else one sendmsg per message (msg_batch.h)
  return send_msg_x(system_msg_x(), fd, v, n);
#endif
}

}  // namespace melon::soft
