// Exports of rdma-core v44's librdmacm that ours does not implement: rsockets and multicast. Each
// fails with ENOSYS (docs/rdmacm.md lists them). rpoll and rselect are the exception: with no
// rsocket ever created, every descriptor is an ordinary one, and rdma-core's rpoll/rselect then
// behave as poll/select (rping and ucmatose call rpoll on the event channel's fd).
#include <poll.h>
#include <sys/select.h>

#include <cerrno>
#include <cstdarg>

#include "abi/gen/rdmacm_prototypes.h"

#define MELON_CM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
template <typename T>
T nosys(T value) {
  errno = ENOSYS;
  return value;
}
}  // namespace

MELON_CM_EXPORT int rpoll(struct pollfd* fds, nfds_t nfds, int timeout) { return poll(fds, nfds, timeout); }
MELON_CM_EXPORT int rselect(int nfds, fd_set* r, fd_set* w, fd_set* e, struct timeval* timeout) {
  return select(nfds, r, w, e, timeout);
}

MELON_CM_EXPORT int rsocket(int, int, int) { return nosys(-1); }
MELON_CM_EXPORT int rbind(int, const struct sockaddr*, socklen_t) { return nosys(-1); }
MELON_CM_EXPORT int rlisten(int, int) { return nosys(-1); }
MELON_CM_EXPORT int raccept(int, struct sockaddr*, socklen_t*) { return nosys(-1); }
MELON_CM_EXPORT int rconnect(int, const struct sockaddr*, socklen_t) { return nosys(-1); }
MELON_CM_EXPORT int rshutdown(int, int) { return nosys(-1); }
MELON_CM_EXPORT int rclose(int) { return nosys(-1); }
MELON_CM_EXPORT ssize_t rrecv(int, void*, size_t, int) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT ssize_t rrecvfrom(int, void*, size_t, int, struct sockaddr*, socklen_t*) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT ssize_t rrecvmsg(int, struct msghdr*, int) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT ssize_t rsend(int, const void*, size_t, int) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT ssize_t rsendto(int, const void*, size_t, int, const struct sockaddr*, socklen_t) {
  return nosys(ssize_t(-1));
}
MELON_CM_EXPORT ssize_t rsendmsg(int, const struct msghdr*, int) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT ssize_t rread(int, void*, size_t) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT ssize_t rreadv(int, const struct iovec*, int) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT ssize_t rwrite(int, const void*, size_t) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT ssize_t rwritev(int, const struct iovec*, int) { return nosys(ssize_t(-1)); }
MELON_CM_EXPORT int rgetpeername(int, struct sockaddr*, socklen_t*) { return nosys(-1); }
MELON_CM_EXPORT int rgetsockname(int, struct sockaddr*, socklen_t*) { return nosys(-1); }
MELON_CM_EXPORT int rsetsockopt(int, int, int, const void*, socklen_t) { return nosys(-1); }
MELON_CM_EXPORT int rgetsockopt(int, int, int, void*, socklen_t*) { return nosys(-1); }
MELON_CM_EXPORT int rfcntl(int, int, ...) { return nosys(-1); }
MELON_CM_EXPORT off_t riomap(int, void*, size_t, int, int, off_t) { return nosys(off_t(-1)); }
MELON_CM_EXPORT int riounmap(int, void*, size_t) { return nosys(-1); }
MELON_CM_EXPORT size_t riowrite(int, const void*, size_t, off_t, int) { return nosys(size_t(0)); }

// Multicast needs a multicast-capable UD path and (on IB) the SA's MCMemberRecord: not yet.
MELON_CM_EXPORT int rdma_join_multicast(struct rdma_cm_id*, struct sockaddr*, void*) { return nosys(-1); }
MELON_CM_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id*, struct rdma_cm_join_mc_attr_ex*, void*) {
  return nosys(-1);
}
MELON_CM_EXPORT int rdma_leave_multicast(struct rdma_cm_id*, struct sockaddr*) { return nosys(-1); }
