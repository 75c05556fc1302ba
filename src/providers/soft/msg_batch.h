// Batched datagram calls where the platform has them: sendmmsg/recvmmsg on Linux (called directly
// by tx_batch.cpp and rx_batch.cpp), and on macOS XNU's private sendmsg_x/recvmsg_x, used only when built with
// -DMELON_SOFT_DARWIN_BATCH=ON. The Darwin path has never been compiled or run on a Mac
// (docs/macos.md); what is shared with Linux (turning our mmsghdr batch into msghdr_x entries and
// back, the loop over calls, the fallback) is here and tested on Linux with stand-in calls.
//
// Locks: none. The Darwin calls' msghdr_x arrays are thread_local (each sending or receiving thread
// has its own); MsgXCalls' refused/worked are atomics any thread may set.
#pragma once
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>

#if !defined(__linux__)
// sendmmsg/recvmmsg and their mmsghdr are Linux's; elsewhere our batches use the same layout.
struct mmsghdr {
  msghdr msg_hdr;
  unsigned msg_len;
};
#endif

namespace melon::soft {

// XNU's struct msghdr_x (bsd/sys/socket_private.h in current xnu, a private part of bsd/sys/socket.h
// in older releases): Darwin's struct msghdr (int msg_iovlen, socklen_t msg_controllen) plus
// msg_datalen, the length of each datagram received. Declared here: no SDK header exports it.
struct MsgHdrX {
  void* msg_name;
  socklen_t msg_namelen;
  iovec* msg_iov;
  int msg_iovlen;
  void* msg_control;
  socklen_t msg_controllen;
  int msg_flags;
  size_t msg_datalen;
};

// XNU's defaults for kern.ipc.maxsendmsgx and kern.ipc.maxrecvmsgx (bsd/kern/uipc_syscalls.c): the
// most entries one call takes. We never ask for more.
constexpr unsigned kMaxMsgX = 256;

// The two calls, as XNU declares them (recvmsg_x takes a const array it nevertheless writes).
// refused: the kernel answered ENOSYS, or EINVAL before any call had worked (a sendmsg_x that takes
// no address, as xnu's header documents and older kernels enforce); from then on one
// sendmsg/recvmsg per datagram.
struct MsgXCalls {
  ssize_t (*send_x)(int fd, const MsgHdrX* msgs, unsigned count, int flags);
  ssize_t (*recv_x)(int fd, const MsgHdrX* msgs, unsigned count, int flags);
  std::atomic<bool> refused{false};
  std::atomic<bool> worked{false};
};

// The system's calls: on macOS built with MELON_SOFT_DARWIN_BATCH, else nullptr.
MsgXCalls* system_msg_x();

// One msghdr_x per message: name, iovec and control as the mmsghdr has them; flags and length 0
// (XNU wants them 0 on input).
void to_msg_x(const mmsghdr* m, unsigned count, MsgHdrX* x);
// After a receive of `count` datagrams: each one's length, address and control lengths and flags
// back into the mmsghdr, as recvmmsg leaves them.
void from_msg_x(const MsgHdrX* x, unsigned count, mmsghdr* m);

// Like sendmmsg(fd, m, count, 0): the number of messages sent (from the first), or -1 with errno
// set when none was. XNU stops at the first message it cannot send and reports the ones before.
// Without the calls (`calls` null or refused) one sendmsg per message.
int send_msg_x(MsgXCalls* calls, int fd, mmsghdr* m, unsigned count);
// Like recvmmsg(fd, m, count, MSG_DONTWAIT, nullptr): datagrams received (msg_len set), or -1
// with errno (EAGAIN when there is none).
int recv_msg_x(MsgXCalls* calls, int fd, mmsghdr* m, unsigned count);

}  // namespace melon::soft
