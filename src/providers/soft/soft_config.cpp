#include "providers/soft/soft_config.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/if_packet.h>
#else
#include <net/if_dl.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace melon::soft {

// ---- addresses ------------------------------------------------------------------------------------

bool IpAddr::parse(const std::string& text, IpAddr* out) {
  IpAddr a;
  std::string t = text;
  size_t pct = t.find('%');
  std::string scope;
  if (pct != std::string::npos) {
    scope = t.substr(pct + 1);
    t = t.substr(0, pct);
  }
  if (inet_pton(AF_INET, t.c_str(), a.bytes) == 1 && scope.empty()) {
    a.family = AF_INET;
  } else if (inet_pton(AF_INET6, t.c_str(), a.bytes) == 1) {
    a.family = AF_INET6;
    if (!scope.empty()) {
      a.scope_id = if_nametoindex(scope.c_str());
      if (!a.scope_id) return false;
    }
  } else {
    return false;
  }
  *out = a;
  return true;
}

std::string IpAddr::str() const {
  char buf[INET6_ADDRSTRLEN] = "";
  if (family == AF_INET || family == AF_INET6) inet_ntop(family, bytes, buf, sizeof(buf));
  return buf;
}

void IpAddr::to_gid(uint8_t gid[16]) const {
  if (family == AF_INET) {
    std::memset(gid, 0, 10);
    gid[10] = gid[11] = 0xff;
    std::memcpy(gid + 12, bytes, 4);
  } else {
    std::memcpy(gid, bytes, 16);
  }
}

bool IpAddr::operator==(const IpAddr& o) const {
  size_t n = family == AF_INET ? 4 : 16;
  return family == o.family && std::memcmp(bytes, o.bytes, n) == 0;
}

std::string DeviceSpec::identity() const {
  std::string id = name + "|" + ifname + "|" + std::to_string(if_mtu) + (configured ? "|c" : "|a");
  for (const IpAddr& a : addrs) id += "|" + a.str();
  return id;
}

unsigned ib_mtu_for_interface(unsigned if_mtu, bool ipv6) {
  // RoCEv2 packet = IP header + UDP (8) + BTH (12) + the largest extended header (AtomicETH,
  // 28) + ImmDt (4) + payload + ICRC (4).
  unsigned overhead = (ipv6 ? 40u : 20u) + 8 + 12 + 28 + 4 + 4;
  unsigned best = 256;
  for (unsigned m = 256; m <= 4096; m *= 2)
    if (if_mtu >= m + overhead) best = m;
  return best;
}

// ---- host interfaces ------------------------------------------------------------------------------

namespace {

bool sockaddr_to_ip(const sockaddr* sa, IpAddr* out) {
  if (!sa) return false;
  IpAddr a;
  if (sa->sa_family == AF_INET) {
    a.family = AF_INET;
    std::memcpy(a.bytes, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    a.family = AF_INET6;
    std::memcpy(a.bytes, &s6->sin6_addr, 16);
    a.scope_id = s6->sin6_scope_id;
  } else {
    return false;
  }
  *out = a;
  return true;
}

unsigned interface_mtu(const char* name) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return 0;
  ifreq req{};
  std::snprintf(req.ifr_name, sizeof(req.ifr_name), "%s", name);
  unsigned mtu = 0;
  if (ioctl(fd, SIOCGIFMTU, &req) == 0 && req.ifr_mtu > 0) mtu = static_cast<unsigned>(req.ifr_mtu);
  close(fd);
  return mtu;
}

HostInterface* find_or_add(std::vector<HostInterface>& ifs, const char* name) {
  for (HostInterface& i : ifs)
    if (i.name == name) return &i;
  ifs.emplace_back();
  ifs.back().name = name;
  return &ifs.back();
}

}  // namespace

std::vector<HostInterface> host_interfaces() {
  std::vector<HostInterface> ifs;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return ifs;
  for (ifaddrs* ia = list; ia; ia = ia->ifa_next) {
    if (!ia->ifa_name) continue;
    HostInterface* hi = find_or_add(ifs, ia->ifa_name);
    hi->flags = ia->ifa_flags;
    if (!ia->ifa_addr) continue;
    IpAddr a, m;
    if (sockaddr_to_ip(ia->ifa_addr, &a)) {
      hi->addrs.push_back(a);
      if (!sockaddr_to_ip(ia->ifa_netmask, &m)) m = IpAddr{};
      hi->masks.push_back(m);
    }
#if defined(__linux__)
    else if (ia->ifa_addr->sa_family == AF_PACKET) {
      const auto* ll = reinterpret_cast<const sockaddr_ll*>(ia->ifa_addr);
      if (ll->sll_halen == 6) {
        std::memcpy(hi->mac, ll->sll_addr, 6);
        hi->has_mac = std::memcmp(hi->mac, "\0\0\0\0\0\0", 6) != 0;
      }
    }
#else
    else if (ia->ifa_addr->sa_family == AF_LINK) {
      const auto* dl = reinterpret_cast<const sockaddr_dl*>(ia->ifa_addr);
      if (dl->sdl_alen == 6) {
        std::memcpy(hi->mac, LLADDR(dl), 6);
        hi->has_mac = std::memcmp(hi->mac, "\0\0\0\0\0\0", 6) != 0;
      }
    }
#endif
  }
  freeifaddrs(list);
  for (HostInterface& hi : ifs) {
    hi.index = if_nametoindex(hi.name.c_str());
    hi.mtu = interface_mtu(hi.name.c_str());
  }
  return ifs;
}

// ---- parsing --------------------------------------------------------------------------------------

namespace {

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() >= 64) return false;
  for (char c : n)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

// gid1=ipv4: the table is addrs[0], the first IPv4 address, then addrs[1...]. false without one.
bool map_gid1_ipv4(DeviceSpec* spec) {
  size_t v4 = 0;
  while (v4 < spec->addrs.size() && spec->addrs[v4].family != AF_INET) v4++;
  if (v4 == spec->addrs.size()) return false;
  spec->gid_map = {0, uint8_t(v4)};
  for (size_t i = 1; i < spec->addrs.size(); i++) spec->gid_map.push_back(uint8_t(i));
  return true;
}

// "mtu=N" or "addr=IP" into spec. false on a bad option.
bool apply_option(const std::string& opt, DeviceSpec* spec) {
  if (opt.rfind("mtu=", 0) == 0) {
    char* end = nullptr;
    unsigned long v = std::strtoul(opt.c_str() + 4, &end, 10);
    if (*end || v < 256 + 76 || v > 1u << 20) return false;
    spec->if_mtu = static_cast<unsigned>(v);
    spec->configured = true;
    return true;
  }
  if (opt == "uc=reliable") {
    spec->uc_reliable = true;
    return true;
  }
  if (opt.rfind("addr=", 0) == 0) {
    IpAddr a;
    if (!IpAddr::parse(opt.substr(5), &a) || spec->addrs.size() >= 16) return false;
    spec->addrs.push_back(a);
    return true;
  }
  return false;
}

bool make_spec(const std::string& name, const std::string& addr, const std::vector<std::string>& opts, DeviceSpec* out,
               std::string* why) {
  DeviceSpec s;
  s.name = name;
  s.configured = true;
  s.if_mtu = 0;  // 0: take it from the owning interface
  IpAddr a;
  if (!valid_name(name)) {
    *why = "bad device name '" + name + "'";
    return false;
  }
  if (!IpAddr::parse(addr, &a)) {
    *why = "bad address '" + addr + "'";
    return false;
  }
  s.addrs.push_back(a);
  bool gid1_ipv4 = false;
  for (const std::string& o : opts) {
    if (o == "gid1=ipv4") {
      gid1_ipv4 = true;
    } else if (!apply_option(o, &s)) {
      *why = "bad option '" + o + "'";
      return false;
    }
  }
  if (gid1_ipv4 && !map_gid1_ipv4(&s)) {  // after every addr=, so the first IPv4 one is known
    *why = "gid1=ipv4 on a device without an IPv4 address";
    return false;
  }
  *out = s;
  return true;
}

std::vector<std::string> split(const std::string& s, const char* seps) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (std::strchr(seps, c)) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

bool name_taken(const std::vector<DeviceSpec>& v, const std::string& name) {
  for (const DeviceSpec& d : v)
    if (d.name == name) return true;
  return false;
}

// The interface that owns `a`: an exact address match, else one whose subnet contains it, else
// (IPv4 127/8, IPv6 ::1) the loopback interface.
const HostInterface* owner_of(const std::vector<HostInterface>& ifs, const IpAddr& a) {
  for (const HostInterface& hi : ifs)
    for (const IpAddr& x : hi.addrs)
      if (x == a) return &hi;
  for (const HostInterface& hi : ifs)
    for (size_t i = 0; i < hi.addrs.size(); i++) {
      const IpAddr &x = hi.addrs[i], &m = hi.masks[i];
      if (x.family != a.family || m.family != a.family) continue;
      size_t n = a.family == AF_INET ? 4 : 16;
      bool same = true;
      for (size_t b = 0; b < n; b++) same = same && ((x.bytes[b] ^ a.bytes[b]) & m.bytes[b]) == 0;
      if (same) return &hi;
    }
  bool loop = (a.family == AF_INET && a.bytes[0] == 127) ||
              (a.family == AF_INET6 && std::memcmp(a.bytes, in6addr_loopback.s6_addr, 16) == 0);
  if (loop)
    for (const HostInterface& hi : ifs)
      if (hi.flags & IFF_LOOPBACK) return &hi;
  return nullptr;
}

}  // namespace

std::vector<DeviceSpec> parse_device_list(const std::string& text, std::vector<std::string>* errors) {
  std::vector<DeviceSpec> out;
  for (const std::string& entry : split(text, ",; \t\n")) {
    size_t eq = entry.find('=');
    std::string why;
    DeviceSpec s;
    if (eq == std::string::npos) {
      why = "expected name=address";
    } else {
      std::vector<std::string> parts = split(entry.substr(eq + 1), "/");
      std::string addr = parts.empty() ? "" : parts[0];
      std::vector<std::string> opts(parts.begin() + (parts.empty() ? 0 : 1), parts.end());
      if (make_spec(entry.substr(0, eq), addr, opts, &s, &why)) {
        if (name_taken(out, s.name))
          why = "duplicate device name '" + s.name + "'";
        else {
          out.push_back(s);
          continue;
        }
      }
    }
    if (errors) errors->push_back("MELON_SOFT_DEVICES: '" + entry + "': " + why);
  }
  return out;
}

std::vector<DeviceSpec> parse_config(const std::string& text, int* auto_mode, std::vector<std::string>* errors) {
  std::vector<DeviceSpec> out;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    lineno++;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::vector<std::string> w = split(line, " \t\r");
    if (w.empty()) continue;
    std::string why;
    if (w[0] == "device" && w.size() >= 3) {
      DeviceSpec s;
      std::vector<std::string> opts(w.begin() + 3, w.end());
      if (make_spec(w[1], w[2], opts, &s, &why)) {
        if (!name_taken(out, s.name)) {
          out.push_back(s);
          continue;
        }
        why = "duplicate device name '" + s.name + "'";
      }
    } else if (w[0] == "auto" && w.size() == 2 && (w[1] == "on" || w[1] == "off")) {
      if (auto_mode) *auto_mode = w[1] == "on";
      continue;
    } else {
      why = "unknown directive";
    }
    if (errors) errors->push_back("config line " + std::to_string(lineno) + ": " + why);
  }
  return out;
}

SoftTunables soft_tunables() {
  SoftTunables t;
  auto is = [](const char* name, const char* v) {
    const char* e = std::getenv(name);
    return e && !std::strcmp(e, v);
  };
  if (const char* e = std::getenv("MELON_SOFT_POLL_NS")) t.poll_ns = std::strtoull(e, nullptr, 10);
  if (const char* e = std::getenv("MELON_SOFT_BUSY_NS")) t.busy_ns = std::strtoull(e, nullptr, 10);
  if (const char* e = std::getenv("MELON_SOFT_DEFER")) t.defer = std::atoi(e) != 0;
  t.gso = !is("MELON_SOFT_GSO", "0");
  t.stats = is("MELON_SOFT_STATS", "1");
  t.debug = std::getenv("MELON_SOFT_DEBUG") != nullptr;
  if (const char* e = std::getenv("MELON_SOFT_LANES")) t.lanes = std::strtoul(e, nullptr, 10);
  if (const char* e = std::getenv("MELON_SOFT_WINDOW")) t.window = std::strtoul(e, nullptr, 10);
  t.shared_window = !is("MELON_SOFT_SHARED_WINDOW", "0");
  if (const char* e = std::getenv("MELON_SOFT_SHARE")) t.share = e;
  if (const char* e = std::getenv("MELON_STATS_DIR"); e && *e)
    t.stats_dir = e;
  else if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x)
    t.stats_dir = std::string(x) + "/melondma";
  else
    t.stats_dir = "/tmp/melondma-" + std::to_string(geteuid());
  return t;
}

std::vector<DeviceSpec> discover_devices(const std::vector<HostInterface>& ifs, std::vector<std::string>* errors) {
  std::vector<DeviceSpec> specs;
  int auto_mode = 1;

  const char* path = std::getenv("MELON_SOFT_CONFIG");
  std::string file = path ? path : "/etc/melondma/soft.conf";
  std::ifstream f(file);
  if (f) {
    std::stringstream ss;
    ss << f.rdbuf();
    for (DeviceSpec& s : parse_config(ss.str(), &auto_mode, errors)) specs.push_back(s);
  } else if (path && errors) {
    errors->push_back("MELON_SOFT_CONFIG: cannot read " + file);
  }
  if (const char* env = std::getenv("MELON_SOFT_DEVICES")) {
    for (DeviceSpec& s : parse_device_list(env, errors)) {
      if (name_taken(specs, s.name)) {
        if (errors) errors->push_back("MELON_SOFT_DEVICES: duplicate device name '" + s.name + "'");
        continue;
      }
      specs.push_back(s);
    }
  }
  if (const char* a = std::getenv("MELON_SOFT_AUTO"))
    auto_mode = std::strcmp(a, "0") != 0 && std::strcmp(a, "off") != 0;

  // Configured devices: the owning interface gives the MTU (unless mtu= was given).
  for (DeviceSpec& s : specs) {
    if (const HostInterface* hi = owner_of(ifs, s.addrs.front())) {
      s.ifname = hi->name;
      s.ifindex = hi->index;
      if (!s.if_mtu) s.if_mtu = hi->mtu ? hi->mtu : 1500;
    }
    if (!s.if_mtu) s.if_mtu = 1500;
  }

  if (auto_mode) {
    for (const HostInterface& hi : ifs) {
      if (!(hi.flags & IFF_UP) || !(hi.flags & IFF_RUNNING) || hi.addrs.empty()) continue;
      DeviceSpec s;
      s.name = "soft_" + hi.name;
      if (s.name.size() >= 64 || name_taken(specs, s.name)) continue;
      s.ifname = hi.name;
      s.ifindex = hi.index;
      s.if_mtu = hi.mtu ? hi.mtu : 1500;
      // GID order: IPv4 addresses first, then IPv6.
      for (const IpAddr& a : hi.addrs)
        if (a.family == AF_INET && s.addrs.size() < 16) s.addrs.push_back(a);
      for (const IpAddr& a : hi.addrs)
        if (a.family == AF_INET6 && s.addrs.size() < 16) s.addrs.push_back(a);
      std::memcpy(s.mac, hi.mac, 6);
      s.has_mac = hi.has_mac;
      specs.push_back(s);
    }
  }
  return specs;
}

}  // namespace melon::soft
