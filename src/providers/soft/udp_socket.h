// The soft provider's RoCEv2 sockets: every option the protocol needs, set and checked, and what
// the host's IP stack must do for our packets to be right. A socket that cannot be set up fails
// loudly (device open, transport start) instead of sending packets every peer drops.
//
//   IPv4, Linux   IP_MTU_DISCOVER = IP_PMTUDISC_DO: DF set; an unconnected DF socket sends IP
//                 identification 0, the value our ICRC covers (IBA A17.4.1: the ICRC includes it).
//   IPv4, macOS   IP_DONTFRAG = 1, and sysctl net.inet.ip.rfc6864 = 1 (XNU ip_output writes ID 0
//                 into atomic datagrams only while it is on; otherwise a random ID breaks the ICRC).
//   IPv6, Linux   UDP_NO_CHECK6_RX = 1: RoCEv2 senders (rxe, ConnectX) leave the UDP checksum 0;
//                 without it the kernel drops every such datagram (RFC 6936 lets a socket opt in).
//   IPv6, macOS   unusable: XNU's udp6_input drops zero-checksum datagrams and has no opt-in.
//
// Locks: none. A socket is set up by one thread (device open or transport start) before any other
// thread sees its descriptor; the checks read the kernel's state, not ours.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace melon::soft {

// The rules above are per platform, and macOS's are compiled on every platform, so that tests on
// Linux show their logic with stand-in calls (tests/providers/soft/soft_platform_rules_test.cpp; docs/macos.md
// says what only a Mac can show). A Linux build has both platforms' rules, a Mac build macOS's.
enum class Platform { linux_host, darwin };
#if defined(__APPLE__)
constexpr Platform kPlatform = Platform::darwin;
#else
constexpr Platform kPlatform = Platform::linux_host;
#endif
// The system calls the rules make. system_socket_calls(): setsockopt, and sysctlbyname on macOS.
struct SocketCalls {
  int (*set_option)(int fd, int level, int name, const void* value, socklen_t len);  // 0, or -1 with errno
  int (*read_sysctl_int)(const char* name, int* value);  // 0, or -1 with errno
};
const SocketCalls& system_socket_calls();
// The buffers and the options of the table above on `fd`; 0, or an errno value with *why naming the
// option and what breaks without it.
int set_socket_options(Platform p, const SocketCalls& sys, int fd, bool v6, std::string* why);
// The host-wide settings those options rely on (macOS IPv4: net.inet.ip.rfc6864 = 1); 0, or an errno
// value with *why saying what is wrong and how to restore it.
int check_host_rules(Platform p, const SocketCalls& sys, bool v6, std::string* why);
// Why platform `p` cannot use a GID of this family for RoCEv2 (nullptr: it can).
const char* gid_family_unusable(Platform p, bool ipv6);

// Lanes (hub.h, Hub) and processes sharing an address (addr_registry.h): every socket on an
// address joins one SO_REUSEPORT group (Linux 3.9), steered by destination QPN with a classic BPF
// program (SO_ATTACH_REUSEPORT_CBPF, Linux 4.5; steering.h); the registry binds each socket (so it
// knows the kernel's join order) and rebuilds the program.
constexpr uint32_t kMaxLanes = 16;

class AddressRegistry;
// A socket that joins its address's group: the registry and its slot there (addr_registry.h).
struct ShareJoin {
  AddressRegistry* registry = nullptr;
  int slot = -1;
};

// Opens the socket of one local address (a RoCEv2 GID: IPv4-mapped or IPv6, with the IPv6 scope)
// with every option set, then binds it to `port` (with `share`: SO_REUSEPORT, bound through the
// registry). Returns the descriptor, or -1 with errno set and *why naming the step that failed. A
// failed bind sets *bind_failed (the address may be in use or gone); any other failure is a host
// that cannot carry RoCEv2 correctly.
// The UDP address of a GID (IPv4-mapped: sockaddr_in, else sockaddr_in6 with its scope); its length.
socklen_t roce_sockaddr(const uint8_t gid[16], uint32_t scope_id, uint16_t port, sockaddr_storage* ss);

int open_roce_socket(const uint8_t gid[16], uint32_t scope_id, uint16_t port, std::string* why, bool* bind_failed,
                     const ShareJoin* share = nullptr);

// Whether this host can steer an address's group by QPN (SO_REUSEPORT and the steering program,
// tried on an unbound socket); false with *why if not. Without it an address is one process's and
// a device runs one lane.
bool steering_available(std::string* why);

// Batching and loss accounting the kernel may or may not offer. None is needed for correctness: a
// socket without them sends and receives one datagram per packet and counts the fallback.
//   gso       UDP_SEGMENT (Linux 4.18): equal-size packets leave in one send call
//   gro       UDP_GRO (Linux 5.0): several packets of one flow arrive in one receive buffer
//   rxq_ovfl  SO_RXQ_OVFL (Linux 2.6.33): every receive reports the socket's drop count
// MELON_SOFT_GSO=0 turns gso and gro off (benchmarks comparing both paths in one run).
struct SocketOffloads {
  bool gso = false, gro = false, rxq_ovfl = false;
};
SocketOffloads enable_offloads(int fd);

// The checks of open_roce_socket without binding anything, for device open: 0, or an errno value
// with *why saying what is wrong and what it would break.
int check_roce_host(bool ipv4, bool ipv6, std::string* why);

// Why this platform cannot use a GID of this family for RoCEv2 (nullptr: it can).
inline const char* gid_family_unusable(bool ipv6) { return gid_family_unusable(kPlatform, ipv6); }

}  // namespace melon::soft
