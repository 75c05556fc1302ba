#include "providers/soft/udp_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/filter.h>
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "providers/soft/addr_registry.h"
#include "providers/soft/soft_config.h"
#include "providers/soft/steering.h"
#include "roce/ip_udp.h"

// What RoCEv2 needs from the socket layer is not optional: a platform where we do not know how
// to get it is a build error, never an #ifdef that quietly compiles the option out.
#if defined(__linux__)
#if !defined(IP_MTU_DISCOVER) || !defined(IP_PMTUDISC_DO)
#error "soft provider: IP_MTU_DISCOVER/IP_PMTUDISC_DO are needed for IPv4 identification 0 (the ICRC covers it)"
#endif
#if !defined(UDP_NO_CHECK6_RX)
#error "soft provider: UDP_NO_CHECK6_RX (<netinet/udp.h>) is needed to receive IPv6 RoCEv2 with UDP checksum 0"
#endif
#elif defined(__APPLE__)
#if !defined(IP_DONTFRAG)
#error "soft provider: IP_DONTFRAG (macOS 11 SDK or later) is needed for IPv4 identification 0 (the ICRC covers it)"
#endif
#else
#error "soft provider: no known way to send IPv4 identification 0 and receive zero-checksum IPv6 on this platform"
#endif

namespace melon::soft {

namespace {

struct Option {
  int level, name, value;
  const char* text;  // as a person would write the call
  const char* needed_for;  // what breaks without it
};

// XNU's IP_DONTFRAG (bsd/netinet/in.h), named here so that the macOS rules compile everywhere.
constexpr int kXnuIpDontfrag = 28;
#if defined(__APPLE__)
static_assert(IP_DONTFRAG == kXnuIpDontfrag);
#endif

#if defined(__linux__)
constexpr Option kLinuxIpv4[] = {
    {IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO, "IP_MTU_DISCOVER = IP_PMTUDISC_DO",
     "without DF on an unconnected socket Linux sends a non-zero IPv4 identification, which the ICRC "
     "covers: every peer would drop every packet"},
};
constexpr Option kLinuxIpv6[] = {
    {IPPROTO_UDP, UDP_NO_CHECK6_RX, 1, "UDP_NO_CHECK6_RX = 1",
     "RoCEv2 peers (rxe, ConnectX) send UDP checksum 0 over IPv6; without it the kernel drops all they send"},
};
#endif
constexpr Option kDarwinIpv4[] = {
    {IPPROTO_IP, kXnuIpDontfrag, 1, "IP_DONTFRAG = 1",
     "without DF XNU writes a random IPv4 identification, which the ICRC covers: every peer would drop "
     "every packet"},
};

struct OptionList {
  const Option* options;
  size_t count;
};
template <size_t N>
constexpr OptionList list_of(const Option (&a)[N]) {
  return {a, N};
}

// The options a RoCEv2 socket of this family needs on this platform; count 0 with options null: the
// family is unusable there (gid_family_unusable), or its rules are not compiled into this build.
OptionList options_for(Platform p, bool v6) {
  if (p == Platform::darwin) return v6 ? OptionList{nullptr, 0} : list_of(kDarwinIpv4);
#if defined(__linux__)
  return v6 ? list_of(kLinuxIpv6) : list_of(kLinuxIpv4);
#else
  return {nullptr, 0};
#endif
}

std::string address_text(const uint8_t gid[16]) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (roce::gid_is_v4_mapped(gid))
    inet_ntop(AF_INET, gid + 12, buf, sizeof buf);
  else
    inet_ntop(AF_INET6, gid, buf, sizeof buf);
  return buf;
}

int fail(std::string* why, const std::string& what, int err) {
  *why = what + ": " + std::strerror(err);
  return err;
}

// Receive and send buffers: 8 MiB absorbs a window of full-MTU packets; kernels cap it (Linux at
// net.core.rmem_max, without an error; XNU refuses sizes near kern.ipc.maxsockbuf with ENOBUFS), so
// smaller sizes are tried down to 256 KiB. Below that something is wrong with the host.
int set_buffer(const SocketCalls& sys, int fd, int name, const char* text, std::string* why) {
  int last = 0;
  for (int size = 8 << 20; size >= 256 << 10; size /= 2) {
    if (sys.set_option(fd, SOL_SOCKET, name, &size, sizeof size) == 0) return 0;
    last = errno;
  }
  return fail(why, std::string("setsockopt(") + text + " >= 256 KiB)", last);
}

int system_set_option(int fd, int level, int name, const void* value, socklen_t len) {
  return setsockopt(fd, level, name, value, len);
}

int system_sysctl_int(const char* name, int* value) {
#if defined(__APPLE__)
  size_t len = sizeof *value;
  return sysctlbyname(name, value, &len, nullptr, 0);
#else
  (void)name;
  (void)value;
  errno = ENOSYS;  // no sysctlbyname; nothing on Linux asks for one
  return -1;
#endif
}

}  // namespace

const SocketCalls& system_socket_calls() {
  static const SocketCalls calls{system_set_option, system_sysctl_int};
  return calls;
}

int set_socket_options(Platform p, const SocketCalls& sys, int fd, bool v6, std::string* why) {
  if (int e = set_buffer(sys, fd, SO_RCVBUF, "SO_RCVBUF", why)) return e;
  if (int e = set_buffer(sys, fd, SO_SNDBUF, "SO_SNDBUF", why)) return e;
  const OptionList l = options_for(p, v6);
  for (size_t i = 0; i < l.count; ++i) {
    const Option& o = l.options[i];
    if (sys.set_option(fd, o.level, o.name, &o.value, sizeof o.value) != 0) {
      int e = errno;
      return fail(why, std::string("setsockopt(") + o.text + ") failed (" + o.needed_for + ")", e);
    }
  }
  return 0;
}

int check_host_rules(Platform p, const SocketCalls& sys, bool v6, std::string* why) {
  if (p != Platform::darwin || v6) return 0;
  // XNU's ip_output writes identification 0 into a DF datagram only while net.inet.ip.rfc6864 is 1.
  int on = 0;
  if (sys.read_sysctl_int("net.inet.ip.rfc6864", &on) != 0)
    return fail(why, "cannot read sysctl net.inet.ip.rfc6864 (XNU writes IPv4 identification 0 only while it is 1)",
                errno);
  if (!on) {
    *why =
        "sysctl net.inet.ip.rfc6864 is 0: XNU then writes a random IPv4 identification into every "
        "datagram, which the RoCEv2 ICRC covers, and every peer would drop every packet. "
        "'sudo sysctl -w net.inet.ip.rfc6864=1' restores the default";
    return EOPNOTSUPP;
  }
  return 0;
}

bool steering_available(std::string* why) {
#if defined(__linux__)
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(why, "socket()", errno), false;
  const int on = 1;
  int e = setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) == 0 ? 0 : errno;
  if (e) {
    fail(why, "setsockopt(SO_REUSEPORT)", e);
  } else {
    std::vector<CbpfInsn> prog = build_steering_program(SteeringTable{});
    sock_fprog fp{static_cast<unsigned short>(prog.size()), reinterpret_cast<sock_filter*>(prog.data())};
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &fp, sizeof fp) != 0)
      fail(why, "setsockopt(SO_ATTACH_REUSEPORT_CBPF)", e = errno);
  }
  close(fd);
  return e == 0;
#else
  *why = "no socket steering by QPN on this platform (SO_ATTACH_REUSEPORT_CBPF is Linux's)";
  return false;
#endif
}

const char* gid_family_unusable(Platform p, bool ipv6) {
  if (p == Platform::darwin && ipv6)
    return "IPv6 GIDs are unusable on macOS: XNU's udp6_input drops every UDP/IPv6 datagram whose checksum is "
           "0, which is what RoCEv2 peers (Linux rxe, ConnectX) send, and a socket cannot opt out. Use an IPv4 "
           "GID (docs/verbs.md, \"macOS\")";
  return nullptr;
}

socklen_t roce_sockaddr(const uint8_t gid[16], uint32_t scope_id, uint16_t port, sockaddr_storage* ss) {
  // Only the address's own size is cleared (a packet's destination; the rest of ss is never read).
  if (!roce::gid_is_v4_mapped(gid)) {
    auto* s = reinterpret_cast<sockaddr_in6*>(ss);
    *s = sockaddr_in6{};
    s->sin6_family = AF_INET6;
    s->sin6_port = htons(port);
    s->sin6_scope_id = scope_id;
    std::memcpy(&s->sin6_addr, gid, 16);
    return sizeof *s;
  }
  auto* s = reinterpret_cast<sockaddr_in*>(ss);
  *s = sockaddr_in{};
  s->sin_family = AF_INET;
  s->sin_port = htons(port);
  std::memcpy(&s->sin_addr, gid + 12, 4);
  return sizeof *s;
}

int open_roce_socket(const uint8_t gid[16], uint32_t scope_id, uint16_t port, std::string* why, bool* bind_failed,
                     const ShareJoin* share) {
  *bind_failed = false;
  const bool v6 = !roce::gid_is_v4_mapped(gid);
  const std::string addr = address_text(gid);
  if (const char* no = gid_family_unusable(v6)) {
    *why = addr + ": " + no;
    errno = EAFNOSUPPORT;
    return -1;
  }
  sockaddr_storage ss{};
  const socklen_t sl = roce_sockaddr(gid, scope_id, port, &ss);
  int fd = socket(ss.ss_family, SOCK_DGRAM, 0);
  if (fd < 0) {
    errno = fail(why, addr + ": socket()", errno);
    return -1;
  }
  int e = fcntl(fd, F_SETFD, FD_CLOEXEC) == 0 ? 0 : fail(why, "fcntl(FD_CLOEXEC)", errno);
  if (!e) e = set_socket_options(kPlatform, system_socket_calls(), fd, v6, why);
  if (!e) e = check_host_rules(kPlatform, system_socket_calls(), v6, why);
#if defined(__linux__)
  const int on = 1;
  if (!e && share && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0)
    e = fail(why, "setsockopt(SO_REUSEPORT)", errno);
#endif
  if (!e && (share ? (errno = share->registry->join(share->slot, fd, &ss, sl)) != 0
                   : bind(fd, reinterpret_cast<sockaddr*>(&ss), sl) != 0)) {
    *bind_failed = true;
    e = fail(why, "bind(" + addr + " port " + std::to_string(port) + ")", errno);
  }
  if (e) {
    if (!*bind_failed) *why = addr + ": " + *why;
    if (share) share->registry->leave(share->slot, -1);
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

SocketOffloads enable_offloads(int fd) {
  SocketOffloads o;
#if defined(__linux__)
  const bool batch = soft_tunables().gso;
  const int off = 0, on = 1;
  // UDP_SEGMENT 0 sets no default segment size (each send says its own): a pure capability probe.
  o.gso = batch && setsockopt(fd, SOL_UDP, UDP_SEGMENT, &off, sizeof off) == 0;
  o.gro = batch && setsockopt(fd, SOL_UDP, UDP_GRO, &on, sizeof on) == 0;
  o.rxq_ovfl = setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, &on, sizeof on) == 0;
#else
  (void)fd;
#endif
  return o;
}

int check_roce_host(bool ipv4, bool ipv6, std::string* why) {
  for (bool v6 : {false, true}) {
    if (!(v6 ? ipv6 : ipv4) || gid_family_unusable(v6)) continue;  // unusable GIDs fail at use, with the reason
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) return fail(why, v6 ? "socket(AF_INET6)" : "socket(AF_INET)", errno);
    int e = set_socket_options(kPlatform, system_socket_calls(), fd, v6, why);
    close(fd);
    if (!e) e = check_host_rules(kPlatform, system_socket_calls(), v6, why);
    if (e) return e;
  }
  return 0;
}

}  // namespace melon::soft
