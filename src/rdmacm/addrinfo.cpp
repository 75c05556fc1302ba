// rdma_getaddrinfo / rdma_freeaddrinfo: getaddrinfo(3) answers as rdma_addrinfo, the way rdma-core's
// librdmacm fills them for IP addresses (no InfiniBand names, no route data).
#include <netdb.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "abi/gen/rdmacm_prototypes.h"

#define MELON_CM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

sockaddr* copy_addr(const sockaddr* sa, socklen_t len) {
  auto* p = static_cast<sockaddr*>(calloc(1, len));
  if (p) std::memcpy(p, sa, len);
  return p;
}

}  // namespace

MELON_CM_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const struct rdma_addrinfo* hints,
                                     struct rdma_addrinfo** res) {
  if (!res || (!node && !service && !(hints && (hints->ai_src_addr || hints->ai_dst_addr)))) {
    errno = EINVAL;
    return -1;
  }
  addrinfo h{};
  h.ai_socktype = SOCK_STREAM;
  int flags = hints ? hints->ai_flags : 0;
  if (flags & RAI_NUMERICHOST) h.ai_flags |= AI_NUMERICHOST;
  if (flags & RAI_PASSIVE) h.ai_flags |= AI_PASSIVE;
  h.ai_family = hints && hints->ai_family ? hints->ai_family : AF_UNSPEC;
  auto* r = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (!r) return -1;
  r->ai_flags = flags;
  r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
  r->ai_port_space =
      hints && hints->ai_port_space ? hints->ai_port_space : (r->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP : RDMA_PS_TCP);
  if (node || service) {
    addrinfo* ai = nullptr;
    const int e = getaddrinfo(node, service, &h, &ai);
    if (e) {
      free(r);
      errno = e == EAI_SYSTEM ? errno : (e == EAI_MEMORY ? ENOMEM : EADDRNOTAVAIL);
      return e;
    }
    r->ai_family = ai->ai_family;
    sockaddr* a = copy_addr(ai->ai_addr, ai->ai_addrlen);
    if (flags & RAI_PASSIVE) {
      r->ai_src_addr = a;
      r->ai_src_len = ai->ai_addrlen;
    } else {
      r->ai_dst_addr = a;
      r->ai_dst_len = ai->ai_addrlen;
    }
    if (ai->ai_canonname) (flags & RAI_PASSIVE ? r->ai_src_canonname : r->ai_dst_canonname) = strdup(ai->ai_canonname);
    freeaddrinfo(ai);
  }
  if (hints && hints->ai_src_addr && !r->ai_src_addr) {
    r->ai_src_addr = copy_addr(hints->ai_src_addr, hints->ai_src_len);
    r->ai_src_len = hints->ai_src_len;
    if (!r->ai_family) r->ai_family = hints->ai_src_addr->sa_family;
  }
  if (hints && hints->ai_dst_addr && !r->ai_dst_addr) {
    r->ai_dst_addr = copy_addr(hints->ai_dst_addr, hints->ai_dst_len);
    r->ai_dst_len = hints->ai_dst_len;
    if (!r->ai_family) r->ai_family = hints->ai_dst_addr->sa_family;
  }
  *res = r;
  return 0;
}

MELON_CM_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_route);
    free(res->ai_connect);
    free(res);
    res = next;
  }
}
