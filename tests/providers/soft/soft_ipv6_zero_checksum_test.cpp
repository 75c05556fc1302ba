// RoCEv2 over IPv6 as Linux rxe and ConnectX send it: UDP checksum 0. A raw socket writes such a
// datagram (a UD SEND) to a soft device on ::1, inside a network namespace this process makes for
// itself (unshare; the kernel removes it when the process exits), and the provider must complete
// the receive. A control socket without UDP_NO_CHECK6_RX shows that the datagram really carries
// checksum 0: the kernel drops it there and counts Udp6InCsumErrors.
// In the same namespace, a packet socket on lo checks what the IPv4 ICRC relies on: the soft
// provider's IPv4 packets leave with DF set and identification 0.
// Needs root (CAP_SYS_ADMIN for the namespace, CAP_NET_RAW for the raw sockets); else Skipped.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "providers/soft/soft_fixture.h"
#include "providers/soft/soft_inject.h"

namespace {

// The namespace, made once for the process: "" or why it could not be.
const std::string& private_network() {
  static const std::string why = []() -> std::string {
    if (geteuid() != 0) return "needs root (a network namespace and a raw socket)";
    if (unshare(CLONE_NEWNET) != 0) return std::string("unshare(CLONE_NEWNET): ") + strerror(errno);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    ifreq r{};
    std::strcpy(r.ifr_name, "lo");
    r.ifr_flags = IFF_UP;
    bool up = s >= 0 && ioctl(s, SIOCSIFFLAGS, &r) == 0;  // brings up 127.0.0.1 and ::1
    if (s >= 0) close(s);
    return up ? "" : std::string("cannot bring lo up: ") + strerror(errno);
  }();
  return why;
}

uint64_t udp6_csum_errors() {  // this namespace's Udp6InCsumErrors
  std::ifstream f("/proc/net/snmp6");
  std::string k;
  uint64_t v;
  while (f >> k >> v)
    if (k == "Udp6InCsumErrors") return v;
  return ~0ull;
}

// Sends `dgram` (UDP header onwards) from [::1] through a raw IPv6 socket: the kernel writes the
// IPv6 header and leaves the UDP checksum as given.
void inject(const std::vector<uint8_t>& dgram) {
  int r = socket(AF_INET6, SOCK_RAW, IPPROTO_UDP);
  ASSERT_GE(r, 0) << strerror(errno);
  sockaddr_in6 to{};
  to.sin6_family = AF_INET6;
  to.sin6_addr = in6addr_loopback;
  ASSERT_EQ(sendto(r, dgram.data(), dgram.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
            ssize_t(dgram.size()))
      << strerror(errno);
  close(r);
}

const uint8_t kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};

class ZeroChecksumIpv6 : public melon::test::SoftDeviceTest {
 protected:
  void SetUp() override {
    if (!private_network().empty()) GTEST_SKIP() << private_network();
    use_devices("z6=::1,z4=127.0.0.1", false);
  }
};

// The control: a plain UDP socket on [::1]:4792 never sees the datagram, and the kernel says why.
TEST_F(ZeroChecksumIpv6, TheKernelDropsItOnAnOrdinarySocket) {
  int s = socket(AF_INET6, SOCK_DGRAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  a.sin6_port = htons(4792);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  auto d = melon::test::ud_send_datagram(true, kLoopback6, kLoopback6, 49153, 0x123456, 0x11111111, 0x77, "x");
  d[2] = uint8_t(4792 >> 8), d[3] = uint8_t(4792 & 0xff);
  uint64_t before = udp6_csum_errors();
  inject(d);
  uint64_t after = before;
  for (int i = 0; i < 5000 && after == before; ++i, usleep(1000)) after = udp6_csum_errors();
  EXPECT_EQ(after, before + 1);
  char buf[64];
  EXPECT_EQ(recv(s, buf, sizeof buf, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  close(s);
}

ibv_context* open_named(ibv_device** list, int n, const char* name) {
  for (int i = 0; i < n; ++i)
    if (!strcmp(ibv_get_device_name(list[i]), name)) return ibv_open_device(list[i]);
  return nullptr;
}

TEST_F(ZeroChecksumIpv6, TheSoftProviderReceivesIt) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ibv_context* ctx = open_named(list, n, "z6");
  ASSERT_NE(ctx, nullptr);
  {
    melon::test::UdReceiver rx;
    ASSERT_EQ(rx.open(ctx), "");
    const std::string payload = "zero UDP checksum, IPv6";
    auto d = melon::test::ud_send_datagram(true, kLoopback6, kLoopback6, 49153, rx.qp->qp_num, rx.kQkey, 0x77, payload);
    ASSERT_EQ(d[6] | d[7], 0);  // checksum field 0
    uint64_t before = udp6_csum_errors();
    inject(d);
    ibv_wc wc = rx.wait(5000);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, 40 + payload.size());
    EXPECT_EQ(wc.src_qp, 0x77u);
    EXPECT_EQ(rx.payload(payload.size()), payload);
    // The GRH holds the IPv6 header: version 6, next header UDP, source ::1.
    EXPECT_EQ(rx.buf[0] >> 4, 6);
    EXPECT_EQ(rx.buf[6], IPPROTO_UDP);
    EXPECT_EQ(std::memcmp(rx.buf.data() + 8, kLoopback6, 16), 0);
    EXPECT_EQ(udp6_csum_errors(), before);
    auto c = melon::test::read_counters(stats_dir, "z6");
    EXPECT_EQ(c["rx_packets"], 1u);
    EXPECT_EQ(c["rx_bad_icrc"], 0u);

    // The same datagram with a wrong ICRC: passed up by the kernel, dropped and counted by us.
    auto bad = melon::test::ud_send_datagram(true, kLoopback6, kLoopback6, 49153, rx.qp->qp_num, rx.kQkey, 0x77,
                                             payload, true);
    inject(bad);
    EXPECT_EQ(melon::test::wait_counter(stats_dir, "z6", "rx_bad_icrc", 1), 1u);
  }
  ibv_close_device(ctx);
  ibv_free_device_list(list);
}

// A UD SEND from z4 (127.0.0.1) to 127.0.0.2, seen on lo by a packet socket.
TEST_F(ZeroChecksumIpv6, Ipv4PacketsLeaveWithDfAndIdentificationZero) {
  int ps = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
  ASSERT_GE(ps, 0) << strerror(errno);
  sockaddr_ll ll{};
  ll.sll_family = AF_PACKET;
  ll.sll_protocol = htons(ETH_P_IP);
  ll.sll_ifindex = int(if_nametoindex("lo"));
  ASSERT_EQ(bind(ps, reinterpret_cast<sockaddr*>(&ll), sizeof ll), 0) << strerror(errno);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ibv_context* ctx = open_named(list, n, "z4");
  ASSERT_NE(ctx, nullptr);
  {
    melon::test::UdReceiver q;  // its QP sends as well
    ASSERT_EQ(q.open(ctx), "");
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(ibv_modify_qp(q.qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
    ibv_ah_attr aa{};
    aa.is_global = 1;
    aa.port_num = 1;
    aa.grh.sgid_index = 0;
    inet_pton(AF_INET6, "::ffff:127.0.0.2", aa.grh.dgid.raw);
    ibv_ah* ah = ibv_create_ah(q.pd, &aa);
    ASSERT_NE(ah, nullptr);
    ibv_sge sge{reinterpret_cast<uintptr_t>(q.buf.data() + 40), 16, q.mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = 9;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = 0x123;
    wr.wr.ud.remote_qkey = q.kQkey;
    ASSERT_EQ(ibv_post_send(q.qp, &wr, &bad), 0);
    EXPECT_EQ(q.wait(5000).status, IBV_WC_SUCCESS);
    bool seen = false;
    uint8_t pkt[2048];
    pollfd pf{ps, POLLIN, 0};
    while (!seen && poll(&pf, 1, 5000) == 1) {
      ssize_t len = recv(ps, pkt, sizeof pkt, 0);
      if (len < 28 || (pkt[0] >> 4) != 4 || pkt[9] != IPPROTO_UDP) continue;
      size_t ihl = size_t(pkt[0] & 0xf) * 4;
      if (((pkt[ihl + 2] << 8) | pkt[ihl + 3]) != 4791) continue;
      seen = true;
      EXPECT_EQ((pkt[6] << 8 | pkt[7]) & 0x4000, 0x4000) << "DF";
      EXPECT_EQ(pkt[4] << 8 | pkt[5], 0) << "identification (the ICRC covers it)";
    }
    EXPECT_TRUE(seen) << "no RoCEv2 packet on lo";
    ibv_destroy_ah(ah);
  }
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  close(ps);
}

}  // namespace
