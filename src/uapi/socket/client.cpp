#include "dext/emuhost/uapi_client.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "dext/emuhost/socket_protocol.h"

namespace melon::dext {

bool UapiClient::connect(const std::string& path) {
  close();
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof(a.sun_path)) {
    errno = ENAMETOOLONG;
    return false;
  }
  memcpy(a.sun_path, path.c_str(), path.size() + 1);
  fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    int e = errno;
    close();
    errno = e;
    return false;
  }
  // The daemon reaches this process's registered memory with process_vm_readv/writev; under Yama's
  // ptrace_scope 1 only a declared tracer may, so declare the daemon (no effect without Yama).
  ucred cr{};
  socklen_t crl = sizeof cr;
  if (getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cr, &crl) == 0 && cr.pid > 0) prctl(PR_SET_PTRACER, cr.pid, 0, 0, 0);
  return true;
}

void UapiClient::close() {
  if (fd_ >= 0) ::close(fd_);
  if (event_fd_ >= 0) ::close(event_fd_);
  fd_ = event_fd_ = -1;
}

uapi::Status UapiClient::call(uint32_t selector, const void* in, uint32_t in_len, void* out, uint32_t out_cap,
                              uint32_t* out_len, int* fd_out) {
  if (fd_out) *fd_out = -1;
  if (out_len) *out_len = 0;
  if (fd_ < 0 || in_len > kMaxSocketMessage - sizeof(SocketRequest)) return uapi::Status::device_dead;
  uint8_t buf[kMaxSocketMessage];
  SocketRequest rq{selector, out_cap};
  memcpy(buf, &rq, sizeof rq);
  if (in_len) memcpy(buf + sizeof rq, in, in_len);
  if (send(fd_, buf, sizeof rq + in_len, MSG_NOSIGNAL) != ssize_t(sizeof rq + in_len)) return uapi::Status::device_dead;
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
  if (n < ssize_t(sizeof(SocketReply))) return uapi::Status::device_dead;
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
  if (len > uint32_t(n) - sizeof rp || len > out_cap) return uapi::Status::device_dead;
  if (len) memcpy(out, buf + sizeof rp, len);
  if (out_len) *out_len = len;
  return uapi::Status(rp.status);
}

uapi::Status UapiClient::open(uapi::OpenResp* out) {
  uapi::OpenReq rq{uapi::kAbiVersion, 0, ~0ull};
  uapi::OpenResp rp{};
  int efd = -1;
  uapi::Status s = call(uapi::Selector::open, rq, &rp, &efd);
  if (s == uapi::Status::ok)
    event_fd_ = efd;
  else if (efd >= 0)
    ::close(efd);
  if (out) *out = rp;
  return s;
}

void* UapiClient::map(uapi::MapKind kind, uint32_t handle, uint64_t* len, uapi::Status* st) {
  uapi::MapResp rp{};
  int mfd = -1;
  *st = call(uapi::Selector::map, uapi::MapReq{uint32_t(kind), handle}, &rp, &mfd);
  if (*st != uapi::Status::ok) return nullptr;
  if (mfd < 0) {
    *st = uapi::Status::unsupported;
    return nullptr;
  }
  void* p = mmap(nullptr, rp.length, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, off_t(rp.offset));
  ::close(mfd);
  if (p == MAP_FAILED) {
    *st = uapi::Status::no_memory;
    return nullptr;
  }
  *len = rp.length;
  return p;
}

}  // namespace melon::dext
