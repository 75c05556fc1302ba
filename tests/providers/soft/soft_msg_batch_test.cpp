// The macOS batch path of the soft provider (src/providers/soft/msg_batch.h), as far as Linux can
// check it: XNU's sendmsg_x/recvmsg_x cannot run here, so stand-ins with the semantics xnu's
// bsd/kern/uipc_syscalls.c gives them (one datagram per msghdr_x entry; flags and msg_datalen 0 on
// input; recvmsg_x takes only MSG_DONTWAIT, fills msg_datalen, the address and control lengths and
// msg_flags; a count past kern.ipc.maxsendmsgx/maxrecvmsgx is cut to it) carry real datagrams over
// loopback. What is ours (msghdr_x built from the mmsghdr batch and read back, the split at 256, the
// ENOSYS fallback) is what these tests check; the real calls are untested (docs/macos.md).
#include <arpa/inet.h>
#include <errno.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "providers/soft/msg_batch.h"

namespace {

using melon::soft::kMaxMsgX;
using melon::soft::MsgHdrX;
using melon::soft::MsgXCalls;

// XNU's LP64 layout of struct msghdr_x (user64_msghdr_x in bsd/sys/socket_private.h): what the
// kernel copies in, so our declaration must match it field for field on a 64-bit Mac.
static_assert(sizeof(void*) != 8 || offsetof(MsgHdrX, msg_name) == 0);
static_assert(sizeof(void*) != 8 || offsetof(MsgHdrX, msg_namelen) == 8);
static_assert(sizeof(void*) != 8 || offsetof(MsgHdrX, msg_iov) == 16);
static_assert(sizeof(void*) != 8 || offsetof(MsgHdrX, msg_iovlen) == 24);
static_assert(sizeof(void*) != 8 || offsetof(MsgHdrX, msg_control) == 32);
static_assert(sizeof(void*) != 8 || offsetof(MsgHdrX, msg_controllen) == 40);
static_assert(sizeof(void*) != 8 || offsetof(MsgHdrX, msg_flags) == 44);
static_assert(sizeof(void*) != 8 || offsetof(MsgHdrX, msg_datalen) == 48);
static_assert(sizeof(void*) != 8 || sizeof(MsgHdrX) == 56);

int g_calls = 0;  // stand-in calls made
unsigned g_largest = 0;  // the most entries one call was given

msghdr plain(const MsgHdrX& x) {
  msghdr h{};
  h.msg_name = x.msg_name;
  h.msg_namelen = x.msg_namelen;
  h.msg_iov = x.msg_iov;
  h.msg_iovlen = size_t(x.msg_iovlen);
  h.msg_control = x.msg_control;
  h.msg_controllen = x.msg_controllen;
  return h;
}

ssize_t fake_send_x(int fd, const MsgHdrX* x, unsigned cnt, int flags) {
  ++g_calls;
  g_largest = std::max(g_largest, cnt);
  if (cnt > kMaxMsgX || flags != 0) return errno = EINVAL, -1;
  unsigned i = 0;
  for (; i < cnt; ++i) {
    if (x[i].msg_flags || x[i].msg_datalen) return errno = EINVAL, -1;  // must be 0 on input
    msghdr h = plain(x[i]);
    if (sendmsg(fd, &h, 0) < 0) break;
  }
  return i ? ssize_t(i) : -1;
}

ssize_t fake_recv_x(int fd, const MsgHdrX* cx, unsigned cnt, int flags) {
  ++g_calls;
  g_largest = std::max(g_largest, cnt);
  if (flags & ~MSG_DONTWAIT) return errno = EINVAL, -1;
  if (cnt > kMaxMsgX) cnt = kMaxMsgX;
  auto* x = const_cast<MsgHdrX*>(cx);
  unsigned i = 0;
  for (; i < cnt; ++i) {
    if (x[i].msg_flags) return errno = EINVAL, -1;
    msghdr h = plain(x[i]);
    ssize_t r = recvmsg(fd, &h, MSG_DONTWAIT);
    if (r < 0) break;
    x[i].msg_datalen = size_t(r);
    x[i].msg_namelen = h.msg_namelen;
    x[i].msg_controllen = socklen_t(h.msg_controllen);
    x[i].msg_flags = h.msg_flags;
  }
  return i ? ssize_t(i) : -1;
}

ssize_t no_such_call(int, const MsgHdrX*, unsigned, int) {
  ++g_calls;
  return errno = ENOSYS, -1;
}

// sendmsg_x as xnu's header documents it: no address (an unconnected socket cannot use it).
ssize_t send_x_without_address(int fd, const MsgHdrX* x, unsigned cnt, int flags) {
  for (unsigned i = 0; i < cnt; ++i)
    if (x[i].msg_name || x[i].msg_namelen) return ++g_calls, errno = EINVAL, -1;
  return fake_send_x(fd, x, cnt, flags);
}

// Two UDP sockets on loopback, a -> b.
struct Pair {
  int a = -1, b = -1;
  sockaddr_in to{}, from{};
  Pair() {
    a = socket(AF_INET, SOCK_DGRAM, 0);
    b = socket(AF_INET, SOCK_DGRAM, 0);
    int big = 4 << 20;
    setsockopt(b, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    for (auto [fd, addr] : {std::pair{a, &from}, std::pair{b, &to}}) {
      addr->sin_family = AF_INET;
      inet_pton(AF_INET, "127.0.0.1", &addr->sin_addr);
      bind(fd, reinterpret_cast<sockaddr*>(addr), sizeof *addr);
      socklen_t l = sizeof *addr;
      getsockname(fd, reinterpret_cast<sockaddr*>(addr), &l);
    }
  }
  ~Pair() {
    close(a);
    close(b);
  }
};

// `n` datagrams of distinct lengths and contents, each from two iovecs, to `p.to`.
struct Outgoing {
  std::vector<std::string> head, body;
  std::vector<iovec> iov;
  std::vector<mmsghdr> m;
  Outgoing(Pair& p, unsigned n) : head(n), body(n), iov(2 * n), m(n) {
    for (unsigned i = 0; i < n; ++i) {
      head[i] = "#" + std::to_string(i) + ":";
      body[i] = std::string(1 + i % 97, char('a' + i % 26));
      iov[2 * i] = {head[i].data(), head[i].size()};
      iov[2 * i + 1] = {body[i].data(), body[i].size()};
      m[i] = {};
      m[i].msg_hdr.msg_name = &p.to;
      m[i].msg_hdr.msg_namelen = sizeof p.to;
      m[i].msg_hdr.msg_iov = &iov[2 * i];
      m[i].msg_hdr.msg_iovlen = 2;
    }
  }
  std::string text(unsigned i) const { return head[i] + body[i]; }
};

// Receives up to `n` datagrams with recv_msg_x into batches of `batch`; checks each against `out`.
void receive_all(MsgXCalls* calls, Pair& p, const Outgoing& out, unsigned n, unsigned batch) {
  std::vector<std::vector<char>> buf(batch, std::vector<char>(256));
  std::vector<iovec> iov(batch);
  std::vector<sockaddr_in> from(batch);
  std::vector<mmsghdr> m(batch);
  unsigned got = 0;
  for (int spins = 0; got < n && spins < 10000; ++spins) {
    for (unsigned i = 0; i < batch; ++i) {
      iov[i] = {buf[i].data(), buf[i].size()};
      m[i] = {};
      m[i].msg_hdr.msg_name = &from[i];
      m[i].msg_hdr.msg_namelen = sizeof from[i];
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
    }
    int r = melon::soft::recv_msg_x(calls, p.b, m.data(), batch);
    if (r < 0) {
      ASSERT_EQ(errno, EAGAIN);
      usleep(100);
      continue;
    }
    for (int i = 0; i < r; ++i, ++got) {
      ASSERT_EQ(std::string(buf[size_t(i)].data(), m[size_t(i)].msg_len), out.text(got)) << "datagram " << got;
      EXPECT_EQ(m[size_t(i)].msg_hdr.msg_namelen, sizeof(sockaddr_in));
      EXPECT_EQ(from[size_t(i)].sin_port, p.from.sin_port) << "the sender's address comes back";
      EXPECT_EQ(m[size_t(i)].msg_hdr.msg_flags & MSG_TRUNC, 0);
    }
  }
  EXPECT_EQ(got, n);
}

TEST(SoftMsgBatch, MsgHdrXEntriesCarryTheBatchAndLengthsComeBack) {
  sockaddr_in sa{};
  iovec iov[3] = {};
  char ctrl[32];
  mmsghdr m[2] = {};
  m[0].msg_hdr = {&sa, sizeof sa, iov, 3, ctrl, sizeof ctrl, MSG_TRUNC};
  m[1].msg_hdr = {nullptr, 0, iov + 1, 1, ctrl, 0, 0};
  MsgHdrX x[2];
  melon::soft::to_msg_x(m, 2, x);
  EXPECT_EQ(x[0].msg_name, &sa);
  EXPECT_EQ(x[0].msg_namelen, sizeof sa);
  EXPECT_EQ(x[0].msg_iov, iov);
  EXPECT_EQ(x[0].msg_iovlen, 3);
  EXPECT_EQ(x[0].msg_control, ctrl);
  EXPECT_EQ(x[0].msg_controllen, sizeof ctrl);
  EXPECT_EQ(x[0].msg_flags, 0) << "XNU wants msg_flags 0 on input";
  EXPECT_EQ(x[0].msg_datalen, 0u);
  EXPECT_EQ(x[1].msg_name, nullptr);
  EXPECT_EQ(x[1].msg_iov, iov + 1);
  EXPECT_EQ(x[1].msg_control, nullptr) << "no control buffer without a length";

  x[0].msg_datalen = 1234;
  x[0].msg_namelen = 16;
  x[0].msg_controllen = 20;
  x[0].msg_flags = MSG_CTRUNC;
  melon::soft::from_msg_x(x, 1, m);
  EXPECT_EQ(m[0].msg_len, 1234u);
  EXPECT_EQ(m[0].msg_hdr.msg_namelen, 16u);
  EXPECT_EQ(m[0].msg_hdr.msg_controllen, 20u);
  EXPECT_EQ(m[0].msg_hdr.msg_flags, MSG_CTRUNC);
  EXPECT_EQ(m[0].msg_hdr.msg_iov, iov) << "the buffers themselves are left alone";
}

// 600 datagrams in one send_msg_x: the calls get at most 256 entries each, every datagram arrives
// whole and in order, and each msg_len says what was sent.
TEST(SoftMsgBatch, BatchesLongerThanTheKernelLimitGoOutInSeveralCallsAndArriveIntact) {
  MsgXCalls calls{fake_send_x, fake_recv_x};
  Pair p;
  constexpr unsigned kN = 600;
  Outgoing out(p, kN);
  g_calls = 0;
  g_largest = 0;
  ASSERT_EQ(melon::soft::send_msg_x(&calls, p.a, out.m.data(), kN), int(kN)) << strerror(errno);
  EXPECT_EQ(g_calls, 3) << "256 + 256 + 88";
  EXPECT_EQ(g_largest, kMaxMsgX);
  for (unsigned i = 0; i < kN; ++i) ASSERT_EQ(out.m[i].msg_len, out.text(i).size());
  g_calls = 0;
  receive_all(&calls, p, out, kN, 300);
  EXPECT_GE(g_calls, 3);
  EXPECT_LE(g_largest, kMaxMsgX);
  EXPECT_FALSE(calls.refused.load());
}

// Without any datagram waiting: -1 with EAGAIN, as recvmmsg with MSG_DONTWAIT.
TEST(SoftMsgBatch, AnEmptySocketAnswersEagain) {
  MsgXCalls calls{fake_send_x, fake_recv_x};
  Pair p;
  char b[16];
  iovec iov{b, sizeof b};
  mmsghdr m{};
  m.msg_hdr.msg_iov = &iov;
  m.msg_hdr.msg_iovlen = 1;
  EXPECT_EQ(melon::soft::recv_msg_x(&calls, p.b, &m, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
}

// A kernel without the calls (ENOSYS): the same batch goes out and comes in one datagram per call,
// and the calls are not tried again.
TEST(SoftMsgBatch, WithoutTheCallsEveryDatagramGoesThroughSendmsgAndRecvmsg) {
  MsgXCalls calls{no_such_call, no_such_call};
  Pair p;
  constexpr unsigned kN = 40;
  Outgoing out(p, kN);
  g_calls = 0;
  ASSERT_EQ(melon::soft::send_msg_x(&calls, p.a, out.m.data(), kN), int(kN)) << strerror(errno);
  EXPECT_TRUE(calls.refused.load());
  EXPECT_EQ(melon::soft::send_msg_x(&calls, p.a, out.m.data(), 0), 0);
  receive_all(&calls, p, out, kN, 16);
  EXPECT_EQ(g_calls, 1) << "only the first call, refused";
}

// A kernel whose sendmsg_x refuses an address: the first batch answers EINVAL, and from then on
// every datagram goes through sendmsg; receiving through recvmsg_x is not tried either.
TEST(SoftMsgBatch, ASendmsgXWithoutAddressesFallsBackToOneSendmsgPerDatagram) {
  MsgXCalls calls{send_x_without_address, fake_recv_x};
  Pair p;
  constexpr unsigned kN = 20;
  Outgoing out(p, kN);
  g_calls = 0;
  ASSERT_EQ(melon::soft::send_msg_x(&calls, p.a, out.m.data(), kN), int(kN)) << strerror(errno);
  EXPECT_TRUE(calls.refused.load());
  EXPECT_EQ(g_calls, 1);
  receive_all(&calls, p, out, kN, 8);
  EXPECT_EQ(g_calls, 1);
}

// Once the calls have worked, an EINVAL is one batch's error, not a reason to stop using them.
TEST(SoftMsgBatch, AnErrorAfterTheCallsWorkedIsReturnedNotAFallback) {
  MsgXCalls calls{fake_send_x, fake_recv_x};
  Pair p;
  Outgoing out(p, 2);
  ASSERT_EQ(melon::soft::send_msg_x(&calls, p.a, out.m.data(), 1), 1);
  calls.send_x = [](int, const MsgHdrX*, unsigned, int) -> ssize_t { return errno = EINVAL, -1; };
  EXPECT_EQ(melon::soft::send_msg_x(&calls, p.a, out.m.data() + 1, 1), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_FALSE(calls.refused.load());
}

// Without MELON_SOFT_DARWIN_BATCH on macOS there are no system calls to use (and on Linux never).
TEST(SoftMsgBatch, TheSystemCallsExistOnlyInTheDarwinBatchBuild) {
#if defined(__APPLE__) && defined(MELON_SOFT_DARWIN_BATCH)
  EXPECT_NE(melon::soft::system_msg_x(), nullptr);
#else
  EXPECT_EQ(melon::soft::system_msg_x(), nullptr);
#endif
}

}  // namespace
