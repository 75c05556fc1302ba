#include "providers/soft/msg_batch.h"

#include <errno.h>
#include <string.h>

#include <algorithm>

#if defined(__APPLE__) && defined(MELON_SOFT_DARWIN_BATCH)
// Private XNU system calls (since OS X 10.11), exported by libSystem but declared in no SDK header;
// the declarations follow xnu's, with our struct.
extern "C" ssize_t sendmsg_x(int s, const melon::soft::MsgHdrX* msgp, unsigned cnt, int flags);
extern "C" ssize_t recvmsg_x(int s, const melon::soft::MsgHdrX* msgp, unsigned cnt, int flags);
#endif

namespace melon::soft {

namespace {

bool usable(const MsgXCalls* c) { return c && !c->refused.load(std::memory_order_relaxed); }

// A kernel without the calls answers ENOSYS; one whose sendmsg_x takes no address (what xnu's
// header still documents) answers EINVAL, and so would a first call we got wrong. Either way: one
// datagram per call from then on. EINVAL after the calls have worked is left to the caller.
bool refuse(MsgXCalls* c) {
  if (errno != ENOSYS && !(errno == EINVAL && !c->worked.load(std::memory_order_relaxed))) return false;
  c->refused.store(true, std::memory_order_relaxed);
  return true;
}

int send_each(int fd, mmsghdr* m, unsigned count) {
  unsigned i = 0;
  for (; i < count; ++i) {
    ssize_t r = sendmsg(fd, &m[i].msg_hdr, 0);
    if (r < 0) break;
    m[i].msg_len = unsigned(r);
  }
  return i || !count ? int(i) : -1;
}

int recv_each(int fd, mmsghdr* m, unsigned count) {
  unsigned i = 0;
  for (; i < count; ++i) {
    ssize_t r = recvmsg(fd, &m[i].msg_hdr, MSG_DONTWAIT);
    if (r < 0) break;
    m[i].msg_len = unsigned(r);
  }
  return i || !count ? int(i) : -1;
}

}  // namespace

MsgXCalls* system_msg_x() {
#if defined(__APPLE__) && defined(MELON_SOFT_DARWIN_BATCH)
  static MsgXCalls calls{sendmsg_x, recvmsg_x};
  return &calls;
#else
  return nullptr;
#endif
}

void to_msg_x(const mmsghdr* m, unsigned count, MsgHdrX* x) {
  for (unsigned i = 0; i < count; ++i) {
    const msghdr& h = m[i].msg_hdr;
    x[i] = MsgHdrX{};
    x[i].msg_name = h.msg_name;
    x[i].msg_namelen = h.msg_namelen;
    x[i].msg_iov = h.msg_iov;
    x[i].msg_iovlen = int(h.msg_iovlen);
    x[i].msg_control = h.msg_controllen ? h.msg_control : nullptr;
    x[i].msg_controllen = socklen_t(h.msg_controllen);
  }
}

void from_msg_x(const MsgHdrX* x, unsigned count, mmsghdr* m) {
  for (unsigned i = 0; i < count; ++i) {
    msghdr& h = m[i].msg_hdr;
    h.msg_namelen = x[i].msg_namelen;
    h.msg_controllen = x[i].msg_controllen;
    h.msg_flags = x[i].msg_flags;
    m[i].msg_len = unsigned(x[i].msg_datalen);
  }
}

int send_msg_x(MsgXCalls* calls, int fd, mmsghdr* m, unsigned count) {
  if (!usable(calls)) return send_each(fd, m, count);
  thread_local MsgHdrX x[kMaxMsgX];
  unsigned sent = 0;
  while (sent < count) {
    const unsigned n = std::min(count - sent, kMaxMsgX);
    to_msg_x(m + sent, n, x);
    ssize_t r = calls->send_x(fd, x, n, 0);
    if (r < 0 && refuse(calls)) {
      int rest = send_each(fd, m + sent, count - sent);
      return rest < 0 ? (sent ? int(sent) : -1) : int(sent) + rest;
    }
    if (r < 0) return sent ? int(sent) : -1;
    calls->worked.store(true, std::memory_order_relaxed);
    // sendmsg_x reports no per-message length: a datagram is sent whole or not at all.
    for (unsigned i = 0; i < unsigned(r); ++i) {
      size_t len = 0;
      for (size_t k = 0; k < size_t(m[sent + i].msg_hdr.msg_iovlen); ++k) len += m[sent + i].msg_hdr.msg_iov[k].iov_len;
      m[sent + i].msg_len = unsigned(len);
    }
    sent += unsigned(r);
    if (unsigned(r) < n) break;  // stopped at one it could not send (the caller sees which)
  }
  return int(sent);
}

int recv_msg_x(MsgXCalls* calls, int fd, mmsghdr* m, unsigned count) {
  if (!usable(calls)) return recv_each(fd, m, count);
  thread_local MsgHdrX x[kMaxMsgX];
  const unsigned n = std::min(count, kMaxMsgX);
  to_msg_x(m, n, x);
  ssize_t r = calls->recv_x(fd, x, n, MSG_DONTWAIT);
  if (r < 0 && refuse(calls)) return recv_each(fd, m, count);
  if (r <= 0) return r == 0 ? 0 : -1;
  calls->worked.store(true, std::memory_order_relaxed);
  from_msg_x(x, unsigned(r), m);
  return int(r);
}

}  // namespace melon::soft
