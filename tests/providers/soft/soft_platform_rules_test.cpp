// The soft provider's macOS-only rules, run on Linux with stand-ins for the system calls
// (src/providers/soft/udp_socket.h): what XNU needs of a RoCEv2 socket (IP_DONTFRAG for IPv4
// identification 0, buffers below kern.ipc.maxsockbuf), the host setting that rule relies on
// (sysctl net.inet.ip.rfc6864), IPv6 refused (udp6_input drops zero UDP checksums), and the
// progress thread's poll() timeout (progress_timer.h). The stand-ins behave as XNU is documented to; that XNU
// does so only a Mac can show (docs/macos.md, "macOS-only code tested on Linux").
#include <errno.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "providers/soft/udp_socket.h"
#include "providers/soft/progress_timer.h"

namespace {

using melon::soft::check_host_rules;
using melon::soft::gid_family_unusable;
using melon::soft::Platform;
using melon::soft::set_socket_options;
using melon::soft::SocketCalls;

// XNU's values (bsd/netinet/in.h), not Linux's: the stand-in sees what a Mac kernel would.
constexpr int kXnuIpDontfrag = 28;

struct Call {
  int level, name, value;
};
std::vector<Call> g_calls;
int g_refuse_level = -1, g_refuse_name = -1, g_refuse_errno = 0;
int g_max_buffer = INT_MAX;  // XNU: ENOBUFS above kern.ipc.maxsockbuf's share
int fake_setsockopt(int, int level, int name, const void* value, socklen_t len) {
  int v = 0;
  if (len == sizeof v) std::memcpy(&v, value, sizeof v);
  g_calls.push_back({level, name, v});
  if (level == g_refuse_level && name == g_refuse_name) return errno = g_refuse_errno, -1;
  if (level == SOL_SOCKET && (name == SO_RCVBUF || name == SO_SNDBUF) && v > g_max_buffer) return errno = ENOBUFS, -1;
  return 0;
}

int g_sysctl_reads = 0, g_rfc6864 = 1, g_sysctl_errno = 0;
std::string g_sysctl_name;
int fake_sysctl(const char* name, int* value) {
  ++g_sysctl_reads;
  g_sysctl_name = name;
  if (g_sysctl_errno) return errno = g_sysctl_errno, -1;
  *value = g_rfc6864;
  return 0;
}

constexpr SocketCalls kFake{fake_setsockopt, fake_sysctl};

class SoftPlatformRules : public ::testing::Test {
 protected:
  void SetUp() override {
    g_calls.clear();
    g_refuse_level = g_refuse_name = -1;
    g_max_buffer = INT_MAX;
    g_sysctl_reads = 0;
    g_rfc6864 = 1;
    g_sysctl_errno = 0;
  }
  static bool set(int level, int name, int value) {
    for (const Call& c : g_calls)
      if (c.level == level && c.name == name && c.value == value) return true;
    return false;
  }
  static bool touched(int level, int name) {
    for (const Call& c : g_calls)
      if (c.level == level && c.name == name) return true;
    return false;
  }
  std::string why;
};

TEST_F(SoftPlatformRules, DarwinIpv4SocketGetsDontfragAndNoLinuxOption) {
  ASSERT_EQ(set_socket_options(Platform::darwin, kFake, 3, false, &why), 0) << why;
  EXPECT_TRUE(set(IPPROTO_IP, kXnuIpDontfrag, 1));
  EXPECT_TRUE(set(SOL_SOCKET, SO_RCVBUF, 8 << 20));
  EXPECT_TRUE(set(SOL_SOCKET, SO_SNDBUF, 8 << 20));
  EXPECT_FALSE(touched(IPPROTO_IP, IP_MTU_DISCOVER));  // Linux's way to DF; a Mac has no such option
  EXPECT_EQ(g_calls.size(), 3u);
}

TEST_F(SoftPlatformRules, DarwinIpv6SocketGetsBuffersOnlyAndItsFamilyIsRefused) {
  ASSERT_EQ(set_socket_options(Platform::darwin, kFake, 3, true, &why), 0) << why;
  EXPECT_FALSE(touched(IPPROTO_UDP, UDP_NO_CHECK6_RX));  // no opt-in exists on XNU
  EXPECT_EQ(g_calls.size(), 2u);
  const char* no = gid_family_unusable(Platform::darwin, true);
  ASSERT_NE(no, nullptr);
  EXPECT_NE(std::string(no).find("udp6_input"), std::string::npos) << no;
  EXPECT_NE(std::string(no).find("IPv4"), std::string::npos) << no;  // says what to use instead
  EXPECT_EQ(gid_family_unusable(Platform::darwin, false), nullptr);
}

TEST_F(SoftPlatformRules, LinuxRulesAreTheirOwn) {
  ASSERT_EQ(set_socket_options(Platform::linux_host, kFake, 3, false, &why), 0) << why;
  EXPECT_TRUE(set(IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO));
  EXPECT_FALSE(touched(IPPROTO_IP, kXnuIpDontfrag));
  g_calls.clear();
  ASSERT_EQ(set_socket_options(Platform::linux_host, kFake, 3, true, &why), 0) << why;
  EXPECT_TRUE(set(IPPROTO_UDP, UDP_NO_CHECK6_RX, 1));
  EXPECT_EQ(gid_family_unusable(Platform::linux_host, true), nullptr);
  EXPECT_EQ(check_host_rules(Platform::linux_host, kFake, false, &why), 0);
  EXPECT_EQ(g_sysctl_reads, 0);
}

TEST_F(SoftPlatformRules, XnuBufferLimitIsMetBySmallerSizes) {
  g_max_buffer = 2 << 20;  // ENOBUFS above 2 MiB
  ASSERT_EQ(set_socket_options(Platform::darwin, kFake, 3, false, &why), 0) << why;
  EXPECT_TRUE(set(SOL_SOCKET, SO_RCVBUF, 2 << 20));
  EXPECT_TRUE(set(SOL_SOCKET, SO_SNDBUF, 2 << 20));
  EXPECT_FALSE(set(SOL_SOCKET, SO_RCVBUF, 1 << 20));  // stops at the first size taken
  g_calls.clear();
  g_max_buffer = 128 << 10;  // below the 256 KiB floor: the host is refused, with the reason
  EXPECT_EQ(set_socket_options(Platform::darwin, kFake, 3, false, &why), ENOBUFS);
  EXPECT_NE(why.find("SO_RCVBUF >= 256 KiB"), std::string::npos) << why;
  EXPECT_FALSE(touched(IPPROTO_IP, kXnuIpDontfrag));
}

TEST_F(SoftPlatformRules, RefusedDontfragFailsTheSocketAndSaysWhy) {
  g_refuse_level = IPPROTO_IP;
  g_refuse_name = kXnuIpDontfrag;
  g_refuse_errno = ENOPROTOOPT;
  EXPECT_EQ(set_socket_options(Platform::darwin, kFake, 3, false, &why), ENOPROTOOPT);
  EXPECT_NE(why.find("IP_DONTFRAG = 1"), std::string::npos) << why;
  EXPECT_NE(why.find("random IPv4 identification"), std::string::npos) << why;
}

TEST_F(SoftPlatformRules, Rfc6864SysctlMustBeOnForIpv4) {
  EXPECT_EQ(check_host_rules(Platform::darwin, kFake, false, &why), 0) << why;
  EXPECT_EQ(g_sysctl_reads, 1);
  EXPECT_EQ(g_sysctl_name, "net.inet.ip.rfc6864");

  g_rfc6864 = 0;
  EXPECT_EQ(check_host_rules(Platform::darwin, kFake, false, &why), EOPNOTSUPP);
  EXPECT_NE(why.find("sudo sysctl -w net.inet.ip.rfc6864=1"), std::string::npos) << why;

  g_sysctl_errno = ENOENT;  // a kernel without the sysctl: refused, not assumed
  EXPECT_EQ(check_host_rules(Platform::darwin, kFake, false, &why), ENOENT);
  EXPECT_NE(why.find("net.inet.ip.rfc6864"), std::string::npos) << why;

  g_sysctl_reads = 0;  // IPv6 sockets do not depend on it (and are refused anyway)
  EXPECT_EQ(check_host_rules(Platform::darwin, kFake, true, &why), 0);
  EXPECT_EQ(g_sysctl_reads, 0);
}

TEST(SoftPollTimeout, RoundsUpToWholeMillisecondsAndCaps) {
  using melon::soft::poll_timeout_ms;
  EXPECT_EQ(poll_timeout_ms(nullptr), -1);  // no deadline: wait for a descriptor
  struct {
    time_t s;
    long ns;
    int ms;
  } rows[] = {
      {0, 0, 0},       {0, 1, 1},
      {0, 999999, 1},  {0, 1000000, 1},
      {0, 1000001, 2}, {2, 500000, 2001},
      {3, 0, 3000},    {time_t(3000000), 0, INT_MAX},  // 34 days: capped, not wrapped negative
  };
  for (const auto& r : rows) {
    timespec ts{r.s, r.ns};
    EXPECT_EQ(poll_timeout_ms(&ts), r.ms) << r.s << " s " << r.ns << " ns";
  }
}

}  // namespace
