// The path MTU of a route: the port's active MTU, capped by what the local interface carries. RoCE
// has no subnet administrator to ask; a port may report more (mlx5_0 on melon-emud says 4096) than
// the Ethernet link under it takes, and a connection at that MTU would lose every full packet.
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "rdmacm/internal.h"

namespace melon::rdmacm {
namespace {

// RoCEv2 headers around a payload: IPv6 40 + UDP 8 + BTH 12 + RETH 16 + ICRC 4, with room for a
// VLAN tag and an immediate (IPv4 needs less).
constexpr unsigned kRoceOverhead = 96;

// The IPv4 address `a` stands for (AF_INET, or an IPv4-mapped AF_INET6), if any.
bool v4_of(const sockaddr* a, in_addr* out) {
  if (a->sa_family == AF_INET) {
    *out = reinterpret_cast<const sockaddr_in*>(a)->sin_addr;
    return true;
  }
  const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
  if (a->sa_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&v6)) return false;
  std::memcpy(out, v6.s6_addr + 12, 4);
  return true;
}

bool same_address(const sockaddr* a, const sockaddr* b) {
  in_addr x, y;
  if (v4_of(a, &x) && v4_of(b, &y)) return x.s_addr == y.s_addr;
  return a->sa_family == AF_INET6 && b->sa_family == AF_INET6 &&
         !std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                      &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr));
}

// The MTU of the interface holding `local`, or 0 if none does.
unsigned interface_mtu_of(const sockaddr* local) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return 0;
  unsigned mtu = 0;
  for (ifaddrs* i = list; i && !mtu; i = i->ifa_next) {
    if (!i->ifa_addr || !same_address(i->ifa_addr, local)) continue;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);  // closed below; no SOCK_CLOEXEC on macOS
    if (fd < 0) break;
    ifreq req{};
    std::snprintf(req.ifr_name, sizeof(req.ifr_name), "%s", i->ifa_name);
    if (ioctl(fd, SIOCGIFMTU, &req) == 0 && req.ifr_mtu > 0) mtu = unsigned(req.ifr_mtu);
    close(fd);
  }
  freeifaddrs(list);
  return mtu;
}

}  // namespace

uint8_t route_mtu(const Device* d, const sockaddr* local) {
  return cap_mtu(uint8_t(d->port.active_mtu), interface_mtu_of(local));
}

uint8_t cap_mtu(uint8_t ib_mtu, unsigned if_mtu) {
  if (!if_mtu) return ib_mtu;  // no interface holds the address (it may be the provider's own)
  uint8_t m = ib_mtu;
  while (m > IBV_MTU_256 && (128u << m) + kRoceOverhead > if_mtu) --m;
  return m;
}

}  // namespace melon::rdmacm
