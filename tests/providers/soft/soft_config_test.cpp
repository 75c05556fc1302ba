// Soft provider configuration: the environment form, the config file, MTU derivation.
#include "providers/soft/soft_config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

using namespace melon::soft;

TEST(SoftConfig, EnvironmentListDefinesDevicesOnAddresses) {
  std::vector<std::string> errors;
  auto v = parse_device_list("a0=127.0.0.2, a1=::1/mtu=1500;a2=10.1.2.3/addr=fe80::1", &errors);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(v[0].name, "a0");
  EXPECT_EQ(v[0].addrs[0].str(), "127.0.0.2");
  EXPECT_EQ(v[1].addrs[0].family, AF_INET6);
  EXPECT_EQ(v[1].if_mtu, 1500u);
  ASSERT_EQ(v[2].addrs.size(), 2u);
  EXPECT_EQ(v[2].addrs[1].str(), "fe80::1");
}

TEST(SoftConfig, BadEnvironmentEntriesAreReportedAndSkipped) {
  std::vector<std::string> errors;
  auto v = parse_device_list(
      "ok=127.0.0.2,noaddr,bad=999.1.1.1,ok=127.0.0.3,x=1.2.3.4/mtu=7,"
      "s*p=1.1.1.1",
      &errors);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].name, "ok");
  EXPECT_EQ(errors.size(), 5u);  // noaddr, bad address, duplicate, bad mtu, bad name
}

TEST(SoftConfig, ConfigFileDirectives) {
  std::vector<std::string> errors;
  int auto_mode = -1;
  auto v = parse_config(
      "# comment\n"
      "device d0 127.0.0.2   # trailing comment\n"
      "\n"
      "device d1 ::1 mtu=9000 addr=127.0.0.5\n"
      "auto off\n"
      "device d2\n"
      "frobnicate\n",
      &auto_mode, &errors);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].name, "d0");
  EXPECT_EQ(v[1].if_mtu, 9000u);
  EXPECT_EQ(v[1].addrs.size(), 2u);
  EXPECT_EQ(auto_mode, 0);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("line 6"), std::string::npos);
  EXPECT_NE(errors[1].find("line 7"), std::string::npos);
}

TEST(SoftConfig, GidOfIpv4AddressIsIpv4Mapped) {
  IpAddr a;
  ASSERT_TRUE(IpAddr::parse("192.168.1.7", &a));
  uint8_t gid[16];
  a.to_gid(gid);
  const uint8_t expect[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 7};
  EXPECT_EQ(std::memcmp(gid, expect, 16), 0);
  EXPECT_FALSE(IpAddr::parse("192.168.1", &a));
  EXPECT_FALSE(IpAddr::parse("fe80::1%nosuchif0", &a));
}

TEST(SoftConfig, IbMtuFitsTheInterfaceMtu) {
  EXPECT_EQ(ib_mtu_for_interface(1500, false), 1024u);
  EXPECT_EQ(ib_mtu_for_interface(1500, true), 1024u);
  EXPECT_EQ(ib_mtu_for_interface(9000, false), 4096u);
  EXPECT_EQ(ib_mtu_for_interface(65536, false), 4096u);
  EXPECT_EQ(ib_mtu_for_interface(2048 + 76, false), 2048u);
  EXPECT_EQ(ib_mtu_for_interface(2048 + 75, false), 1024u);
  EXPECT_EQ(ib_mtu_for_interface(2048 + 76, true), 1024u);  // IPv6 header is 20 bytes longer
}

TEST(SoftConfig, DiscoveryPutsConfiguredDevicesOnTheirInterface) {
  setenv("MELON_SOFT_DEVICES", "cfg0=127.0.0.2", 1);
  setenv("MELON_SOFT_AUTO", "1", 1);
  setenv("MELON_SOFT_CONFIG", "/nonexistent/melon.conf", 1);
  std::vector<std::string> errors;
  auto ifs = host_interfaces();
  auto v = discover_devices(ifs, &errors);
  unsetenv("MELON_SOFT_DEVICES");
  unsetenv("MELON_SOFT_AUTO");
  unsetenv("MELON_SOFT_CONFIG");
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].name, "cfg0");
#if defined(__linux__)
  EXPECT_EQ(v[0].ifname, "lo");  // 127.0.0.2 is in lo's 127.0.0.0/8
  EXPECT_EQ(v[0].if_mtu, 65536u);
#endif
  bool have_lo = false;
  for (const DeviceSpec& s : v) have_lo = have_lo || s.name == "soft_lo";
  EXPECT_TRUE(have_lo);
  ASSERT_EQ(errors.size(), 1u);  // the missing config file named explicitly
}

TEST(SoftConfig, ArbitraryInputNeverCrashesTheParsers) {
  // Deterministic pseudo-random text built from the characters the grammar cares about.
  const char alphabet[] = "device auto on off mtu= addr= /,;=#\n\t 0123456789.:abcdefxyz%_-*";
  uint32_t x = 12345;
  for (int round = 0; round < 3000; round++) {
    std::string s;
    int len = static_cast<int>(x % 120);
    for (int i = 0; i < len; i++) {
      x = x * 1103515245u + 12345u;
      s += alphabet[(x >> 16) % (sizeof(alphabet) - 1)];
    }
    x = x * 1103515245u + 12345u;
    std::vector<std::string> errors;
    int auto_mode = -1;
    for (const DeviceSpec& d : parse_device_list(s, &errors)) {
      EXPECT_FALSE(d.name.empty());
      EXPECT_LT(d.name.size(), 64u);
      EXPECT_FALSE(d.addrs.empty());
    }
    for (const DeviceSpec& d : parse_config(s, &auto_mode, &errors)) EXPECT_FALSE(d.addrs.empty());
    EXPECT_TRUE(auto_mode == -1 || auto_mode == 0 || auto_mode == 1);
  }
}

// Every environment tunable in one place (soft_tunables): defaults when unset, each value as the
// code that uses it reads it, and read again at each call.
TEST(SoftConfig, TunablesComeFromTheEnvironmentAtEachCall) {
  const char* names[] = {"MELON_SOFT_POLL_NS",       "MELON_SOFT_BUSY_NS", "MELON_SOFT_DEFER", "MELON_SOFT_GSO",
                         "MELON_SOFT_STATS",         "MELON_SOFT_DEBUG",   "MELON_SOFT_LANES", "MELON_SOFT_WINDOW",
                         "MELON_SOFT_SHARED_WINDOW", "MELON_STATS_DIR",    "XDG_RUNTIME_DIR"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names)
    if (const char* v = getenv(n)) saved.emplace_back(n, v);
  for (const char* n : names) unsetenv(n);
  SoftTunables d = soft_tunables();
  EXPECT_EQ(d.poll_ns, 2000u);
  EXPECT_EQ(d.busy_ns, 1000000u);
  EXPECT_TRUE(d.defer && d.gso && d.shared_window);
  EXPECT_FALSE(d.stats || d.debug);
  EXPECT_EQ(d.lanes, 0u);
  EXPECT_EQ(d.window, 0u);
  EXPECT_EQ(d.stats_dir, "/tmp/melondma-" + std::to_string(geteuid()));
  setenv("MELON_SOFT_POLL_NS", "7", 1);
  setenv("MELON_SOFT_BUSY_NS", "0", 1);
  setenv("MELON_SOFT_DEFER", "0", 1);
  setenv("MELON_SOFT_GSO", "0", 1);
  setenv("MELON_SOFT_STATS", "1", 1);
  setenv("MELON_SOFT_DEBUG", "", 1);  // set, even empty
  setenv("MELON_SOFT_LANES", "3", 1);
  setenv("MELON_SOFT_WINDOW", "99", 1);
  setenv("MELON_SOFT_SHARED_WINDOW", "0", 1);
  setenv("XDG_RUNTIME_DIR", "/run/user/x", 1);
  SoftTunables t = soft_tunables();
  EXPECT_EQ(t.poll_ns, 7u);
  EXPECT_EQ(t.busy_ns, 0u);
  EXPECT_FALSE(t.defer || t.gso || t.shared_window);
  EXPECT_TRUE(t.stats && t.debug);
  EXPECT_EQ(t.lanes, 3u);
  EXPECT_EQ(t.window, 99u);
  EXPECT_EQ(t.stats_dir, "/run/user/x/melondma");
  setenv("MELON_STATS_DIR", "/somewhere", 1);
  setenv("MELON_SOFT_GSO", "1", 1);
  setenv("MELON_SOFT_STATS", "yes", 1);  // only "1" turns it on
  t = soft_tunables();
  EXPECT_EQ(t.stats_dir, "/somewhere");
  EXPECT_TRUE(t.gso);
  EXPECT_FALSE(t.stats);
  for (const char* n : names) unsetenv(n);
  for (auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
}
