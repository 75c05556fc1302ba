// The soft provider's socket layer through the verbs API: every socket option RoCEv2 needs is set,
// a host where one cannot be set fails device open (and transport start) with the reason, receive
// drops are counted where a person can read them (the counter file, `melonctl stat`), and a GID
// pair that mixes IPv4 and IPv6 is refused.
//
// This executable defines setsockopt(): the provider (linked in as objects) calls this one, which
// records each call and can make one option fail, then forwards to the C library's.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "verbs/soft_inject.h"

namespace {

std::mutex g_mu;
std::set<std::pair<int, int>> g_seen;  // (level, name) of every setsockopt call
std::pair<int, int> g_fail{-1, -1};  // this one fails with ENOPROTOOPT

}  // namespace

extern "C" int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  using Fn = int (*)(int, int, int, const void*, socklen_t);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "setsockopt"));
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_seen.insert({level, name});
    if (g_fail == std::make_pair(level, name)) {
      errno = ENOPROTOOPT;
      return -1;
    }
  }
  return real(fd, level, name, val, len);
}

namespace {

void fail_option(int level, int name) {
  std::lock_guard<std::mutex> g(g_mu);
  g_fail = {level, name};
}
bool seen(int level, int name) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_seen.count({level, name}) > 0;
}

class SoftTransport : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/melon-stats-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    stats_dir = tmpl;
    setenv("MELON_STATS_DIR", stats_dir.c_str(), 1);
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    // Addresses of their own (other tests use 127.0.0.2 and 127.0.2.x); ::1 is only opened, never bound.
    setenv("MELON_SOFT_DEVICES", "tr4=127.0.4.2,tr6=::1", 1);
    fail_option(-1, -1);
    {
      std::lock_guard<std::mutex> g(g_mu);
      g_seen.clear();
    }
    list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
  }
  void TearDown() override {
    fail_option(-1, -1);
    ibv_free_device_list(list);
    std::string cmd = "rm -rf '" + stats_dir + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
  ibv_device* dev(const char* name) {
    for (int i = 0; i < n; ++i)
      if (!strcmp(ibv_get_device_name(list[i]), name)) return list[i];
    ADD_FAILURE() << "no device " << name;
    return nullptr;
  }

  std::string stats_dir;
  ibv_device** list = nullptr;
  int n = 0;
};

TEST_F(SoftTransport, OpenSetsTheOptionThatGivesIpv4IdentificationZero) {
  ibv_context* ctx = ibv_open_device(dev("tr4"));
  ASSERT_NE(ctx, nullptr);
  EXPECT_TRUE(seen(IPPROTO_IP, IP_MTU_DISCOVER));
  EXPECT_FALSE(seen(IPPROTO_UDP, UDP_NO_CHECK6_RX));  // an IPv4-only device needs no IPv6 socket
  ibv_close_device(ctx);
}

TEST_F(SoftTransport, OpenSetsZeroChecksumReceiveForIpv6) {
  ibv_context* ctx = ibv_open_device(dev("tr6"));
  ASSERT_NE(ctx, nullptr);
  EXPECT_TRUE(seen(IPPROTO_UDP, UDP_NO_CHECK6_RX));
  ibv_close_device(ctx);
}

TEST_F(SoftTransport, OpenFailsWithTheReasonWhenDfCannotBeSet) {
  fail_option(IPPROTO_IP, IP_MTU_DISCOVER);
  testing::internal::CaptureStderr();
  errno = 0;
  ibv_context* ctx = ibv_open_device(dev("tr4"));
  int err = errno;
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(ctx, nullptr);
  EXPECT_EQ(err, ENOPROTOOPT);
  EXPECT_NE(out.find("tr4: cannot open: setsockopt(IP_MTU_DISCOVER = IP_PMTUDISC_DO) failed"), std::string::npos)
      << out;
  EXPECT_NE(out.find("IPv4 identification"), std::string::npos) << out;
  if (ctx) ibv_close_device(ctx);
}

TEST_F(SoftTransport, OpenFailsWithTheReasonWhenZeroChecksumCannotBeAccepted) {
  fail_option(IPPROTO_UDP, UDP_NO_CHECK6_RX);
  testing::internal::CaptureStderr();
  errno = 0;
  ibv_context* ctx = ibv_open_device(dev("tr6"));
  int err = errno;
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(ctx, nullptr);
  EXPECT_EQ(err, ENOPROTOOPT);
  EXPECT_NE(out.find("tr6: cannot open: setsockopt(UDP_NO_CHECK6_RX = 1) failed"), std::string::npos) << out;
  EXPECT_NE(out.find("checksum 0"), std::string::npos) << out;
  if (ctx) ibv_close_device(ctx);
}

// The options are set again on the sockets the transport binds (when the first QP is made): a
// failure there fails the QP with the reason, and no half-bound transport stays behind.
TEST_F(SoftTransport, TransportStartFailsWithTheReasonWhenDfCannotBeSet) {
  ibv_context* ctx = ibv_open_device(dev("tr4"));
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  fail_option(IPPROTO_IP, IP_MTU_DISCOVER);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  testing::internal::CaptureStderr();
  errno = 0;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  int err = errno;
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(qp, nullptr);
  EXPECT_EQ(err, ENOPROTOOPT);
  EXPECT_NE(out.find("tr4: cannot start the RoCEv2 transport: 127.0.4.2: setsockopt(IP_MTU_DISCOVER"),
            std::string::npos)
      << out;
  fail_option(-1, -1);
  qp = ibv_create_qp(pd, &ia);  // the next try binds 127.0.4.2:4791 again: nothing was left bound
  EXPECT_NE(qp, nullptr) << strerror(errno);
  if (qp) ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

TEST_F(SoftTransport, AnAddressHandleMixingIpv4AndIpv6IsRefused) {
  ibv_context* ctx = ibv_open_device(dev("tr4"));
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_ah_attr a{};
  a.is_global = 1;
  a.port_num = 1;
  a.grh.sgid_index = 0;  // ::ffff:127.0.4.2
  inet_pton(AF_INET6, "fd00::1", a.grh.dgid.raw);
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  inet_pton(AF_INET6, "::ffff:127.0.4.3", a.grh.dgid.raw);
  ibv_ah* ah = ibv_create_ah(pd, &a);
  EXPECT_NE(ah, nullptr);
  if (ah) ibv_destroy_ah(ah);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

// A UD QP on tr4 and datagrams from an ordinary UDP socket: a bad ICRC is dropped and counted as
// rx_bad_icrc (in the file, and in `melonctl stat`); the same datagram with the right ICRC arrives.
TEST_F(SoftTransport, BadIcrcIsDroppedAndCountedWhereAPersonCanSeeIt) {
  ibv_context* ctx = ibv_open_device(dev("tr4"));
  ASSERT_NE(ctx, nullptr);
  {
    melon::test::UdReceiver rx;
    ASSERT_EQ(rx.open(ctx), "");
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    ASSERT_GE(s, 0);
    sockaddr_in from{}, to{};
    from.sin_family = to.sin_family = AF_INET;
    from.sin_port = htons(49152);
    inet_pton(AF_INET, "127.0.4.3", &from.sin_addr);
    inet_pton(AF_INET, "127.0.4.2", &to.sin_addr);
    to.sin_port = htons(4791);
    ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&from), sizeof from), 0) << strerror(errno);
    uint8_t src[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 4, 3};
    uint8_t dst[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 4, 2};
    const std::string payload = "counted, not silent";
    for (bool broken : {true, false}) {
      auto d = melon::test::ud_send_datagram(false, src, dst, 49152, rx.qp->qp_num, rx.kQkey, 0x77, payload, broken);
      // The socket writes the UDP header itself: send what follows it.
      ASSERT_EQ(sendto(s, d.data() + 8, d.size() - 8, 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
                ssize_t(d.size() - 8));
      if (!broken) break;
      EXPECT_EQ(melon::test::wait_counter(stats_dir, "tr4", "rx_bad_icrc", 1), 1u);
      EXPECT_EQ(melon::test::read_counters(stats_dir, "tr4")["rx_packets"], 0u);
      ibv_wc none{};
      EXPECT_EQ(ibv_poll_cq(rx.cq, 1, &none), 0);  // nothing delivered

      std::string cmd = "MELON_STATS_DIR='" + stats_dir + "' '" MELON_TEST_DATA "/../../tools/melonctl' stat";
      FILE* p = popen(cmd.c_str(), "r");
      ASSERT_NE(p, nullptr);
      char line[1024];
      std::string out;
      while (fgets(line, sizeof line, p)) out += line;
      EXPECT_EQ(pclose(p), 0) << out;
      EXPECT_NE(out.find("tr4 pid " + std::to_string(getpid()) + ":"), std::string::npos) << out;
      EXPECT_NE(out.find(" rx_bad_icrc 1 "), std::string::npos) << out;
      EXPECT_NE(out.find(" rx_packets 0 "), std::string::npos) << out;
    }
    ibv_wc wc = rx.wait(5000);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 7u);
    EXPECT_EQ(wc.byte_len, 40 + payload.size());
    EXPECT_EQ(wc.src_qp, 0x77u);
    EXPECT_EQ(rx.payload(payload.size()), payload);
    auto c = melon::test::read_counters(stats_dir, "tr4");
    EXPECT_EQ(c["rx_packets"], 1u);
    EXPECT_EQ(c["rx_bad_icrc"], 1u);
    close(s);
  }
  ibv_close_device(ctx);
  // Closing the last context of the device removes its counter file.
  EXPECT_TRUE(melon::test::read_counters(stats_dir, "tr4").empty());
}

}  // namespace
