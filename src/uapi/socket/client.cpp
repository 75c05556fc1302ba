#include "uapi/socket/client.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "uapi/socket/protocol.h"

namespace melon::uapi {

bool SocketClient::connect(const char* path) {
  close();
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const size_t len = strlen(path);
  if (len >= sizeof(a.sun_path)) {
    errno = ENAMETOOLONG;
    return false;
  }
  memcpy(a.sun_path, path, len + 1);
  fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    int e = errno;
    close();
    errno = e;
    return false;
  }
  return true;
}

void SocketClient::close() {
  if (fd_ >= 0) ::close(fd_);
  if (event_fd_ >= 0) ::close(event_fd_);
  fd_ = event_fd_ = -1;
}

Status SocketClient::call(uint32_t selector, const void* in, uint32_t in_len, void* out, uint32_t out_cap,
                          uint32_t* out_len, int* fd_out, int fd_in) {
  if (fd_out) *fd_out = -1;
  if (out_len) *out_len = 0;
  if (fd_ < 0 || in_len > kMaxSocketMessage - sizeof(SocketRequest)) return Status::device_dead;
  uint8_t buf[kMaxSocketMessage];
  SocketRequest rq{selector, out_cap};
  memcpy(buf, &rq, sizeof rq);
  if (in_len) memcpy(buf + sizeof rq, in, in_len);
  iovec siov{buf, sizeof rq + in_len};
  msghdr sm{};
  sm.msg_iov = &siov;
  sm.msg_iovlen = 1;
  alignas(cmsghdr) char sctl[CMSG_SPACE(sizeof(int))] = {};
  if (fd_in >= 0) {
    sm.msg_control = sctl;
    sm.msg_controllen = sizeof sctl;
    cmsghdr* c = CMSG_FIRSTHDR(&sm);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd_in, sizeof(int));
  }
  if (sendmsg(fd_, &sm, MSG_NOSIGNAL) != ssize_t(sizeof rq + in_len)) return Status::device_dead;
  iovec iov{buf, sizeof buf};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t n;
  do n = recvmsg(fd_, &mh, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < ssize_t(sizeof(SocketReply))) return Status::device_dead;
  SocketReply rp;
  memcpy(&rp, buf, sizeof rp);
  int passed = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) memcpy(&passed, CMSG_DATA(c), sizeof(int));
  if (fd_out)
    *fd_out = passed;
  else if (passed >= 0)
    ::close(passed);
  uint32_t len = rp.out_len;
  if (len > uint32_t(n) - sizeof rp || len > out_cap) return Status::device_dead;
  if (len) memcpy(out, buf + sizeof rp, len);
  if (out_len) *out_len = len;
  return Status(rp.status);
}

Status SocketClient::open(OpenResp* out) {
  OpenReq rq{kAbiVersion, 0, ~0ull};
  OpenResp rp{};
  int efd = -1;
  // This process's memory, for the device's access to its MRs. Opened by the process itself, so
  // no ptrace right (PR_SET_PTRACER, Yama) is asked of it; without it the daemon reaches no MR.
  int mem = ::open("/proc/self/mem", O_RDWR | O_CLOEXEC);
  Status s = call(uint32_t(Selector::open), &rq, wire_size<OpenReq>, &rp, wire_size<OpenResp>, nullptr, &efd, mem);
  if (mem >= 0) ::close(mem);
  if (s == Status::ok)
    event_fd_ = efd;
  else if (efd >= 0)
    ::close(efd);
  if (out) *out = rp;
  return s;
}

void* SocketClient::map(MapKind kind, uint32_t handle, uint64_t* len, Status* st) {
  MapResp rp{};
  int mfd = -1;
  *st = call(Selector::map, MapReq{uint32_t(kind), handle}, &rp, &mfd);
  if (*st != Status::ok) return nullptr;
  if (mfd < 0) {
    *st = Status::unsupported;
    return nullptr;
  }
  void* p = mmap(nullptr, rp.length, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, off_t(rp.offset));
  ::close(mfd);
  if (p == MAP_FAILED) {
    *st = Status::no_memory;
    return nullptr;
  }
  *len = rp.length;
  return p;
}

}  // namespace melon::uapi
