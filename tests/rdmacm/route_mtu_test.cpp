// librdmacm's route MTU (src/rdmacm/route_mtu.cpp): the port's active MTU, capped so that a packet
// and 96 bytes of RoCEv2 headers fit the local interface's MTU.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <fstream>

#include "rdmacm/internal.h"

namespace melon::rdmacm {
namespace {

TEST(RouteMtu, CapsThePortMtuToWhatTheInterfaceCarries) {
  EXPECT_EQ(cap_mtu(IBV_MTU_4096, 1500), IBV_MTU_1024);  // Ethernet: 2048 + 96 > 1500
  EXPECT_EQ(cap_mtu(IBV_MTU_4096, 9000), IBV_MTU_4096);  // jumbo frames
  EXPECT_EQ(cap_mtu(IBV_MTU_4096, 2048 + 96), IBV_MTU_2048);  // exactly fits
  EXPECT_EQ(cap_mtu(IBV_MTU_4096, 2048 + 95), IBV_MTU_1024);  // one byte short
  EXPECT_EQ(cap_mtu(IBV_MTU_1024, 65536), IBV_MTU_1024);  // never above the port's
  EXPECT_EQ(cap_mtu(IBV_MTU_4096, 300), IBV_MTU_256);  // the least IBA has
  EXPECT_EQ(cap_mtu(IBV_MTU_4096, 0), IBV_MTU_4096);  // no interface known: the port's
}

TEST(RouteMtu, FindsTheInterfaceHoldingTheLocalAddress) {
  Device d;
  d.port.active_mtu = IBV_MTU_4096;
  sockaddr_in lo{};
  lo.sin_family = AF_INET;
  lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  unsigned lo_mtu = 0;
  std::ifstream("/sys/class/net/lo/mtu") >> lo_mtu;
  if (!lo_mtu) GTEST_SKIP() << "no /sys/class/net/lo/mtu";
  EXPECT_EQ(route_mtu(&d, reinterpret_cast<sockaddr*>(&lo)), cap_mtu(IBV_MTU_4096, lo_mtu));
  // The same address as an IPv4-mapped IPv6 one (how a RoCEv2 GID carries it).
  sockaddr_in6 mapped{};
  mapped.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "::ffff:127.0.0.1", &mapped.sin6_addr);
  EXPECT_EQ(route_mtu(&d, reinterpret_cast<sockaddr*>(&mapped)), cap_mtu(IBV_MTU_4096, lo_mtu));
  // An address no interface holds (TEST-NET-1): the port's MTU as it is.
  sockaddr_in none{};
  none.sin_family = AF_INET;
  inet_pton(AF_INET, "192.0.2.77", &none.sin_addr);
  EXPECT_EQ(route_mtu(&d, reinterpret_cast<sockaddr*>(&none)), IBV_MTU_4096);
}

}  // namespace
}  // namespace melon::rdmacm
