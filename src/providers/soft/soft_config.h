// Which soft RoCE devices exist: one per usable host interface (getifaddrs), plus devices the user
// adds on a given IP address (environment and config file). Pure data; no verbs objects here.
//
//   MELON_SOFT_DEVICES="soft0=127.0.0.2,soft1=127.0.0.3[/mtu=1500]"   devices on explicit addresses
//   MELON_SOFT_CONFIG=/path/to/file    config file (default /etc/melondma/soft.conf when present)
//   MELON_SOFT_AUTO=0                  no devices from the host's interfaces
//
// Config file: one directive per line, '#' starts a comment.
//   device <name> <ip-address> [mtu=<bytes>] [addr=<another ip-address>]... [gid1=ipv4] [uc=reliable]
// gid1=ipv4 (also "/gid1=ipv4" in MELON_SOFT_DEVICES): GID index 1 is the device's first IPv4
// address, which is then also the first IPv4-mapped GID in the table (MLX's JACCL publishes the
// first IPv4-mapped GID and connects with sgid_index 1; docs/verbs.md).
// uc=reliable (also "/uc=reliable"): the device's UC QPs run as RC on the wire (src/verbs/provider.h, reliable_uc_wanted).
//   auto on|off
//
// Locks: none. No shared state: each call reads the environment, file and interfaces afresh and
// returns values the caller owns.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace melon::soft {

// An IPv4 or IPv6 address (with scope for link-local IPv6).
struct IpAddr {
  int family = 0;  // AF_INET or AF_INET6
  uint8_t bytes[16] = {};
  uint32_t scope_id = 0;

  static bool parse(const std::string& text, IpAddr* out);
  std::string str() const;
  // The RoCEv2 GID of this address: IPv4-mapped (::ffff:a.b.c.d) or the IPv6 address itself.
  void to_gid(uint8_t gid[16]) const;
  bool operator==(const IpAddr& o) const;
};

struct DeviceSpec {
  std::string name;  // ibv_device name
  std::string ifname;  // owning interface, "" if none was found
  unsigned ifindex = 0;
  bool configured = false;  // from MELON_SOFT_DEVICES / the config file
  std::vector<IpAddr> addrs;  // GID table order, unless gid_map says otherwise
  // GID index -> index into addrs, when the table is not addrs itself (gid1=ipv4). Addresses stay
  // unique in addrs (the transport binds each once); only the table repeats one.
  std::vector<uint8_t> gid_map;
  unsigned if_mtu = 1500;  // bytes, of the interface (or mtu=)
  uint8_t mac[6] = {};
  bool has_mac = false;
  bool uc_reliable = false;  // uc=reliable

  std::string identity() const;  // stable across rediscovery
};

struct HostInterface {
  std::string name;
  unsigned index = 0;
  unsigned flags = 0;  // IFF_*
  unsigned mtu = 0;
  std::vector<IpAddr> addrs;
  std::vector<IpAddr> masks;  // parallel to addrs (may be family 0)
  uint8_t mac[6] = {};
  bool has_mac = false;
};

// The host's interfaces (getifaddrs + SIOCGIFMTU).
std::vector<HostInterface> host_interfaces();

// Parse "name=addr[/mtu=N],..." (environment form). Bad entries are reported in *errors and skipped.
std::vector<DeviceSpec> parse_device_list(const std::string& text, std::vector<std::string>* errors);

// Parse a config file's text. *auto_mode: -1 unchanged, 0 off, 1 on.
std::vector<DeviceSpec> parse_config(const std::string& text, int* auto_mode, std::vector<std::string>* errors);

// Everything: configured devices first, then one per interface unless auto is off. Uses the
// environment and the config file; interfaces come from `ifs`.
std::vector<DeviceSpec> discover_devices(const std::vector<HostInterface>& ifs, std::vector<std::string>* errors);

// Every environment tunable of the soft provider but the device list and config file above, read
// from the environment at each call (tests change them between devices). The defaults, and what
// each turns (docs/verbs.md says more):
struct SoftTunables {
  uint64_t poll_ns = 2000;  // MELON_SOFT_POLL_NS: an empty CQ poll looks at the socket this often
  uint64_t busy_ns = 1000000;  // MELON_SOFT_BUSY_NS: a busy-poll lease ends this long after a poll; 0: none
  bool defer = true;  // MELON_SOFT_DEFER=0: replies to a leased receive leave at once
  bool gso = true;  // MELON_SOFT_GSO=0: no UDP GSO or GRO (one datagram per call)
  bool stats = false;  // MELON_SOFT_STATS=1: a transport's counters on stderr when it stops
  bool debug = false;  // MELON_SOFT_DEBUG (set): why a device, a lane or a window is as it is
  unsigned long lanes = 0;  // MELON_SOFT_LANES: lanes per device (used when 1..kMaxLanes)
  unsigned long window = 0;  // MELON_SOFT_WINDOW: per-QP requester window (used when 1..kMaxQpWr)
  bool shared_window = true;  // MELON_SOFT_SHARED_WINDOW=0: no window shared by a lane's QPs
  // Where counter files go (soft_counters.h): $MELON_STATS_DIR, else $XDG_RUNTIME_DIR/melondma,
  // else /tmp/melondma-<euid>.
  std::string stats_dir;
};
SoftTunables soft_tunables();

// Largest IB MTU (256..4096 bytes) whose RoCEv2 packet fits in an interface MTU of `if_mtu`.
unsigned ib_mtu_for_interface(unsigned if_mtu, bool ipv6);

}  // namespace melon::soft
