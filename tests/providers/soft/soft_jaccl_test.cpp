// What MLX's JACCL expects of a device (ml-explore/mlx#3467): it publishes the first IPv4-mapped
// GID it finds but connects with sgid_index 1; it reads lid 0 from query_port; it registers about
// 64 MRs per peer device. The soft provider meets the GID rule with the gid1=ipv4 device option.
#include <arpa/inet.h>

#include <vector>

#include "providers/soft/soft_config.h"
#include "providers/soft/soft_fixture.h"

namespace {

class SoftJaccl : public melon::test::SoftDeviceTest {
 protected:
  void SetUp() override { use_devices("j4=127.0.7.2/gid1=ipv4,j6=::1/addr=127.0.7.3/gid1=ipv4,jplain=127.0.7.4"); }
  bool v4_mapped(const ibv_gid& g, const char* addr) {
    uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    inet_pton(AF_INET, addr, want + 12);
    return std::memcmp(g.raw, want, 16) == 0;
  }
  int first_v4_mapped(ibv_context* ctx) {
    ibv_gid g;
    for (int i = 0; i < 16; i++)
      if (ibv_query_gid(ctx, 1, i, &g) == 0 && g.raw[10] == 0xff && g.raw[11] == 0xff &&
          !std::memcmp(g.raw, "\0\0\0\0\0\0\0\0\0\0", 10))
        return i;
    return -1;
  }
};

TEST_F(SoftJaccl, Gid1IsTheFirstIpv4MappedGid) {
  struct {
    const char *dev, *v4;
    int first;
  } rows[] = {{"j4", "127.0.7.2", 0}, {"j6", "127.0.7.3", 1}};
  for (auto& r : rows) {
    ibv_context* ctx = ibv_open_device(dev(r.dev));
    ASSERT_NE(ctx, nullptr) << r.dev;
    ibv_gid g1, first;
    ASSERT_EQ(ibv_query_gid(ctx, 1, 1, &g1), 0) << r.dev;
    EXPECT_TRUE(v4_mapped(g1, r.v4)) << r.dev;
    int f = first_v4_mapped(ctx);
    EXPECT_EQ(f, r.first) << r.dev;
    ASSERT_EQ(ibv_query_gid(ctx, 1, f, &first), 0) << r.dev;
    EXPECT_EQ(std::memcmp(first.raw, g1.raw, 16), 0) << r.dev << ": JACCL would publish another GID than it uses";
    ibv_gid_entry e;
    ASSERT_EQ(ibv_query_gid_ex(ctx, 1, 1, &e, 0), 0);
    EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
    // An address handle from GID 1 (what JACCL builds) is accepted.
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ibv_ah_attr ah{};
    ah.is_global = 1;
    ah.port_num = 1;
    ah.grh.sgid_index = 1;
    ah.grh.hop_limit = 64;
    ah.grh.dgid = g1;
    ibv_ah* a = ibv_create_ah(pd, &ah);
    EXPECT_NE(a, nullptr) << r.dev << ": " << strerror(errno);
    if (a) ibv_destroy_ah(a);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
}

TEST_F(SoftJaccl, Gid1WithoutAnIpv4AddressIsRefused) {
  std::vector<std::string> errors;
  auto specs = melon::soft::parse_device_list("bad6=::1/gid1=ipv4", &errors);
  EXPECT_TRUE(specs.empty());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("gid1=ipv4"), std::string::npos) << errors[0];
}

TEST_F(SoftJaccl, PortLidIsZeroAnd64MrsFitInOnePd) {
  ibv_context* ctx = ibv_open_device(dev("jplain"));
  ASSERT_NE(ctx, nullptr);
  ibv_port_attr pa;
  ASSERT_EQ(ibv_query_port(ctx, 1, &pa), 0);
  EXPECT_EQ(pa.lid, 0);
  ibv_device_attr da;
  ASSERT_EQ(ibv_query_device(ctx, &da), 0);
  EXPECT_GE(da.max_mr, 64);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  std::vector<std::vector<char>> bufs(96, std::vector<char>(4096));
  std::vector<ibv_mr*> mrs;
  for (auto& b : bufs) {
    ibv_mr* mr = ibv_reg_mr(pd, b.data(), b.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(mr, nullptr) << "MR " << mrs.size() << ": " << strerror(errno);
    mrs.push_back(mr);
  }
  for (ibv_mr* mr : mrs) EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  ibv_close_device(ctx);
}

}  // namespace
