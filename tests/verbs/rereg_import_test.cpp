// ibv_rereg_mr (each flag) and ibv_import_pd / ibv_import_mr with real traffic, on both providers:
// two soft devices (127.0.24.2, .3) and mlx5_0 from a melon-emud this test starts (wire
// 127.0.24.4). Each case runs for every pairing (the MR that changes is on the second device of
// the pair): after each change the peer moves data with the keys the MR has now and it lands where
// the MR now points; the keys from before are refused (remote access error, nothing written); a
// request outside the new range or beyond the new access is refused too.
#include <gtest/gtest.h>

#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/verbs_kit.h"

namespace {

constexpr size_t kBuf = 1 << 14;
constexpr unsigned kRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// melon-emud for mlx5_0, and the soft devices, for the whole program.
class Devices : public melon::testkit::EmudChild {
 public:
  Devices() : EmudChild(MELON_EMUD_BIN, "127.0.24.4", "rereg") {}
  void SetUp() override {
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    setenv("MELON_SOFT_DEVICES", "rr0=127.0.24.2,rr1=127.0.24.3", 1);
    EmudChild::SetUp();
  }
};
const auto* const kDevices = ::testing::AddGlobalTestEnvironment(new Devices);

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  ibv_gid gid{};
  std::vector<uint8_t> buf = std::vector<uint8_t>(kBuf);
};

ibv_wc wait_wc(ibv_cq* cq) { return melon::testkit::wait_wc(cq, 10000, 100); }
using melon::testkit::addr_of;

// The pair: first name the requester, second the device whose MR changes.
class Rereg : public ::testing::TestWithParam<std::pair<const char*, const char*>> {
 protected:
  void SetUp() override {
    int n = 0;
    list_ = ibv_get_device_list(&n);
    ASSERT_NE(list_, nullptr);
    open(a, GetParam().first);
    open(b, GetParam().second);
  }
  void TearDown() override {
    for (Side* s : {&a, &b}) {
      if (s->qp) EXPECT_EQ(ibv_destroy_qp(s->qp), 0);
      if (s->mr) EXPECT_EQ(ibv_dereg_mr(s->mr), 0);
      if (s->cq) EXPECT_EQ(ibv_destroy_cq(s->cq), 0);
      if (s->pd) EXPECT_EQ(ibv_dealloc_pd(s->pd), 0);
      if (s->ctx) EXPECT_EQ(ibv_close_device(s->ctx), 0);
    }
    if (list_) ibv_free_device_list(list_);
  }
  void open(Side& s, const char* name) {
    for (int i = 0; list_[i]; i++)
      if (!strcmp(ibv_get_device_name(list_[i]), name)) s.ctx = ibv_open_device(list_[i]);
    ASSERT_NE(s.ctx, nullptr) << name << " not there";
    ASSERT_EQ(ibv_query_gid(s.ctx, 1, 0, &s.gid), 0);
    s.pd = ibv_alloc_pd(s.ctx);
    s.cq = ibv_create_cq(s.ctx, 32, nullptr, nullptr, 0);
    ASSERT_NE(s.pd, nullptr);
    ASSERT_NE(s.cq, nullptr);
  }
  static ibv_qp* make_qp(Side& s, ibv_pd* pd) {
    ibv_qp_init_attr at{};
    at.send_cq = at.recv_cq = s.cq;
    at.qp_type = IBV_QPT_RC;
    at.cap.max_send_wr = at.cap.max_recv_wr = 8;
    at.cap.max_send_sge = at.cap.max_recv_sge = 1;
    return ibv_create_qp(pd, &at);
  }
  // RESET -> INIT -> RTR -> RTS towards `peer`.
  static void connect(Side& s, const Side& peer) {
    melon::testkit::RcPath p;
    p.dest_qpn = peer.qp->qp_num;
    p.dgid = peer.gid;
    p.sq_psn = p.rq_psn = 7;
    p.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
    p.timeout = 12;
    p.reset_first = true;
    melon::testkit::rc_to_rts(s.qp, p);
  }
  // QPs on the sides' PDs (or `b_pd`), an MR on a's buffer with every access, connected.
  void pair(ibv_pd* b_pd = nullptr) {
    a.mr = ibv_reg_mr(a.pd, a.buf.data(), kBuf, kRemote);
    ASSERT_NE(a.mr, nullptr);
    a.qp = make_qp(a, a.pd);
    b.qp = make_qp(b, b_pd ? b_pd : b.pd);
    ASSERT_NE(a.qp, nullptr);
    ASSERT_NE(b.qp, nullptr);
    restart();
  }
  // Both QPs back to RTS after an error (nothing left in the CQs).
  void restart() {
    connect(a, b);
    connect(b, a);
    ibv_wc wc;
    while (ibv_poll_cq(a.cq, 1, &wc) == 1 || ibv_poll_cq(b.cq, 1, &wc) == 1) {}
  }
  static int post(Side& s, ibv_wr_opcode op, const void* local, uint32_t len, uint32_t lkey, uint64_t raddr = 0,
                  uint32_t rkey = 0, uint64_t wr_id = 1) {
    return melon::testkit::post_one(s.qp, {op, addr_of(local), len, lkey, raddr, rkey, IBV_SEND_SIGNALED, wr_id});
  }
  static int post_recv(Side& s, void* at, uint32_t len, uint32_t lkey, uint64_t wr_id = 2) {
    return melon::testkit::post_recv_one(s.qp, addr_of(at), len, lkey, wr_id);
  }
  // a WRITEs `text` to b at `raddr` with `rkey`: the requester's completion status.
  ibv_wc_status write(const char* text, uint64_t raddr, uint32_t rkey) {
    size_t n = strlen(text);
    memcpy(a.buf.data(), text, n);
    EXPECT_EQ(post(a, IBV_WR_RDMA_WRITE, a.buf.data(), uint32_t(n), a.mr->lkey, raddr, rkey), 0);
    return wait_wc(a.cq).status;
  }
  // Expects a WRITE refused with a remote access error that changed nothing in `watched`.
  void expect_refused(uint64_t raddr, uint32_t rkey, const std::vector<uint8_t>& watched, const char* what) {
    SCOPED_TRACE(what);
    std::vector<uint8_t> before = watched;
    EXPECT_EQ(write("must not land", raddr, rkey), IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(watched, before);
    restart();
  }

  ibv_device** list_ = nullptr;
  Side a, b;
};

// Access: none remote -> remote write and read -> local only. Each step draws new keys; the
// previous rkey is refused even where the new access would allow the request.
TEST_P(Rereg, ChangeAccessTakesEffectWithTheNewKeys) {
  b.mr = ibv_reg_mr(b.pd, b.buf.data(), kBuf, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(b.mr, nullptr);
  pair();
  uint64_t dst = addr_of(b.buf.data() + 64);
  expect_refused(dst, b.mr->rkey, b.buf, "no remote access yet");

  uint32_t old_lkey = b.mr->lkey, old_rkey = b.mr->rkey;
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, kRemote), 0);
  EXPECT_NE(b.mr->lkey, old_lkey);
  EXPECT_NE(b.mr->rkey, old_rkey);
  EXPECT_EQ(b.mr->addr, b.buf.data());
  EXPECT_EQ(b.mr->pd, b.pd);
  ASSERT_EQ(write("granted", dst, b.mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(b.buf.data() + 64, "granted", 7), 0);
  if (old_rkey) expect_refused(dst, old_rkey, b.buf, "rkey from before the rereg");

  // READ back through the new rkey.
  memset(a.buf.data() + 1024, 0, 16);
  ASSERT_EQ(post(a, IBV_WR_RDMA_READ, a.buf.data() + 1024, 7, a.mr->lkey, dst, b.mr->rkey), 0);
  ASSERT_EQ(wait_wc(a.cq).status, IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(a.buf.data() + 1024, "granted", 7), 0);

  // b's own receives use the new lkey; one with the old lkey is a local protection error.
  ASSERT_EQ(post_recv(b, b.buf.data() + 256, 64, b.mr->lkey, 5), 0);
  memcpy(a.buf.data(), "sent", 4);
  ASSERT_EQ(post(a, IBV_WR_SEND, a.buf.data(), 4, a.mr->lkey), 0);
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_SUCCESS);
  ibv_wc wc = wait_wc(b.cq);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(b.buf.data() + 256, "sent", 4), 0);
  ASSERT_EQ(post_recv(b, b.buf.data() + 512, 64, old_lkey, 6), 0);
  std::vector<uint8_t> before = b.buf;
  ASSERT_EQ(post(a, IBV_WR_SEND, a.buf.data(), 4, a.mr->lkey), 0);
  EXPECT_NE(wait_wc(a.cq).status, IBV_WC_SUCCESS);
  EXPECT_EQ(wait_wc(b.cq).status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(b.buf, before);
  restart();

  uint32_t granted = b.mr->rkey;
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE), 0);
  expect_refused(dst, granted, b.buf, "remote write taken away (old rkey)");
  expect_refused(dst, b.mr->rkey, b.buf, "remote write taken away (new rkey)");
}

// Translation: the MR moves to a new buffer of another length. The new rkey writes there and
// only there; the old buffer is not touched again, whichever key or address.
TEST_P(Rereg, ChangeTranslationMovesTheDataToTheNewBuffer) {
  b.mr = ibv_reg_mr(b.pd, b.buf.data(), kBuf, kRemote);
  ASSERT_NE(b.mr, nullptr);
  pair();
  uint32_t old_rkey = b.mr->rkey, old_lkey = b.mr->lkey;
  ASSERT_EQ(write("first home", addr_of(b.buf.data()), old_rkey), IBV_WC_SUCCESS);
  ASSERT_EQ(memcmp(b.buf.data(), "first home", 10), 0);

  std::vector<uint8_t> fresh(kBuf / 2, 0);
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, fresh.data(), fresh.size(), 0), 0);
  EXPECT_EQ(b.mr->addr, fresh.data());
  EXPECT_EQ(b.mr->length, fresh.size());
  EXPECT_NE(b.mr->rkey, old_rkey);
  EXPECT_NE(b.mr->lkey, old_lkey);
  ASSERT_EQ(write("second home", addr_of(fresh.data() + 100), b.mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(fresh.data() + 100, "second home", 11), 0);

  expect_refused(addr_of(b.buf.data()), b.mr->rkey, b.buf, "new rkey, old address");
  expect_refused(addr_of(fresh.data() + fresh.size() - 4), b.mr->rkey, fresh, "past the new length");
  expect_refused(addr_of(fresh.data()), old_rkey, fresh, "old rkey, new address");
  expect_refused(addr_of(b.buf.data()), old_rkey, b.buf, "old rkey, old address");

  // A SEND into a receive on the new buffer with the new lkey lands there.
  ASSERT_EQ(post_recv(b, fresh.data() + 300, 64, b.mr->lkey, 9), 0);
  memcpy(a.buf.data(), "received", 8);
  ASSERT_EQ(post(a, IBV_WR_SEND, a.buf.data(), 8, a.mr->lkey), 0);
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_SUCCESS);
  ibv_wc wc = wait_wc(b.cq);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 8u);
  EXPECT_EQ(memcmp(fresh.data() + 300, "received", 8), 0);
  EXPECT_EQ(ibv_dereg_mr(b.mr), 0);  // before `fresh` goes
  b.mr = nullptr;
}

// The requester's own MR moves: a WRITE gathers from the new buffer through the new lkey; the
// old lkey is a local protection error and sends nothing.
TEST_P(Rereg, ChangeTranslationOfTheSourceGathersFromTheNewBuffer) {
  b.mr = ibv_reg_mr(b.pd, b.buf.data(), kBuf, kRemote);
  ASSERT_NE(b.mr, nullptr);
  pair();
  std::vector<uint8_t> src(4096, 0);
  memcpy(src.data(), "from the new source", 19);
  uint32_t old_lkey = a.mr->lkey;
  ASSERT_EQ(ibv_rereg_mr(a.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, src.data(), src.size(), 0), 0);
  ASSERT_EQ(post(a, IBV_WR_RDMA_WRITE, src.data(), 19, a.mr->lkey, addr_of(b.buf.data()), b.mr->rkey), 0);
  ASSERT_EQ(wait_wc(a.cq).status, IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(b.buf.data(), "from the new source", 19), 0);
  std::vector<uint8_t> before = b.buf;
  ASSERT_EQ(post(a, IBV_WR_RDMA_WRITE, src.data(), 19, old_lkey, addr_of(b.buf.data() + 64), b.mr->rkey), 0);
  EXPECT_EQ(wait_wc(a.cq).status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(b.buf, before);
  EXPECT_EQ(ibv_dereg_mr(a.mr), 0);  // before `src` goes
  a.mr = nullptr;
}

// PD: an MR in a PD other than the QP's serves it not; moved into the QP's PD it does (new keys);
// moved out again it is refused. The PD it left can then be deallocated.
TEST_P(Rereg, ChangePdDecidesWhichQpsTheMrServes) {
  ibv_pd* other = ibv_alloc_pd(b.ctx);
  ASSERT_NE(other, nullptr);
  b.mr = ibv_reg_mr(other, b.buf.data(), kBuf, kRemote);
  ASSERT_NE(b.mr, nullptr);
  pair();
  uint64_t dst = addr_of(b.buf.data() + 8);
  expect_refused(dst, b.mr->rkey, b.buf, "MR in another PD");
  EXPECT_EQ(ibv_dealloc_pd(other), EBUSY);

  uint32_t old_rkey = b.mr->rkey;
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, b.pd, nullptr, 0, 0), 0);
  EXPECT_EQ(b.mr->pd, b.pd);
  EXPECT_NE(b.mr->rkey, old_rkey);
  ASSERT_EQ(write("same pd now", dst, b.mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(b.buf.data() + 8, "same pd now", 11), 0);
  expect_refused(dst, old_rkey, b.buf, "rkey from before the move");
  EXPECT_EQ(ibv_dealloc_pd(other), 0);  // nothing in it any more

  other = ibv_alloc_pd(b.ctx);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS, other, nullptr, 0, kRemote), 0);
  expect_refused(dst, b.mr->rkey, b.buf, "moved out of the QP's PD");
  ASSERT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, b.pd, nullptr, 0, 0), 0);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
  ASSERT_EQ(write("back again", dst, b.mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(b.buf.data() + 8, "back again", 10), 0);
}

// Input rdma-core's libibverbs refuses before the provider sees it; the MR stays as it was.
TEST_P(Rereg, BadInputChangesNothing) {
  b.mr = ibv_reg_mr(b.pd, b.buf.data(), kBuf, kRemote);
  ASSERT_NE(b.mr, nullptr);
  uint32_t lkey = b.mr->lkey, rkey = b.mr->rkey;
  EXPECT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, b.pd, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
            IBV_REREG_MR_ERR_INPUT);  // access without IBV_REREG_MR_CHANGE_ACCESS
  EXPECT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, b.buf.data(), 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE),
            IBV_REREG_MR_ERR_INPUT);  // remote write without local write
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, a.pd, nullptr, 0, 0),
            IBV_REREG_MR_ERR_INPUT);  // another device's
  EXPECT_EQ(b.mr->lkey, lkey);
  EXPECT_EQ(b.mr->rkey, rkey);
  EXPECT_EQ(b.mr->pd, b.pd);
  pair();
  ASSERT_EQ(write("unchanged", addr_of(b.buf.data()), rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(b.buf.data(), "unchanged", 9), 0);
}

// Import: b's context imported from its command descriptor; b's PD and MR imported into it by
// handle. A QP made through the import on the imported PD carries traffic addressed with the
// imported MR's keys; unimporting frees only the imported objects; deregistering through an
// import ends the registration for the original too.
TEST_P(Rereg, ImportedPdAndMrCarryTraffic) {
  b.mr = ibv_reg_mr(b.pd, b.buf.data(), kBuf, kRemote);
  ASSERT_NE(b.mr, nullptr);
  int fd = dup(b.ctx->cmd_fd);
  ASSERT_GE(fd, 0);
  ibv_context* imp = ibv_import_device(fd);
  ASSERT_NE(imp, nullptr) << strerror(errno);

  ibv_pd* ipd = ibv_import_pd(imp, b.pd->handle);
  ASSERT_NE(ipd, nullptr) << strerror(errno);
  EXPECT_NE(ipd, b.pd);
  EXPECT_EQ(ipd->handle, b.pd->handle);
  ibv_mr* imr = ibv_import_mr(ipd, b.mr->handle);
  ASSERT_NE(imr, nullptr) << strerror(errno);
  EXPECT_NE(imr, b.mr);
  EXPECT_EQ(imr->handle, b.mr->handle);
  EXPECT_EQ(imr->lkey, b.mr->lkey);
  EXPECT_EQ(imr->rkey, b.mr->rkey);
  EXPECT_EQ(imr->addr, b.mr->addr);
  EXPECT_EQ(imr->length, b.mr->length);
  EXPECT_EQ(imr->pd, ipd);

  // Handles that name nothing, and an MR imported into a PD that is not its own.
  errno = 0;
  EXPECT_EQ(ibv_import_pd(imp, b.pd->handle + 0x10000), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_import_mr(ipd, b.mr->handle ^ 0x5a5a00), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_pd* other = ibv_alloc_pd(imp);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(ibv_import_mr(other, b.mr->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);

  // b's QP through the import, on the imported PD; a's side as usual.
  ibv_cq* icq = ibv_create_cq(imp, 16, nullptr, nullptr, 0);
  ASSERT_NE(icq, nullptr);
  ibv_cq* own_cq = b.cq;
  b.cq = icq;
  ASSERT_NO_FATAL_FAILURE(pair(ipd));
  ASSERT_EQ(write("via import", addr_of(b.buf.data() + 32), imr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(b.buf.data() + 32, "via import", 10), 0);
  memcpy(b.buf.data() + 4096, "imported lkey", 13);
  ASSERT_EQ(post(b, IBV_WR_RDMA_WRITE, b.buf.data() + 4096, 13, imr->lkey, addr_of(a.buf.data() + 8192), a.mr->rkey),
            0);
  ASSERT_EQ(wait_wc(b.cq).status, IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(a.buf.data() + 8192, "imported lkey", 13), 0);

  // Unimported, the registration is still there for the original.
  ibv_unimport_mr(imr);
  ASSERT_EQ(write("still there", addr_of(b.buf.data() + 32), b.mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(memcmp(b.buf.data() + 32, "still there", 11), 0);
  EXPECT_EQ(ibv_dealloc_pd(b.pd), EBUSY);  // the MR and the QP (through the import) use it

  // Deregistered through a fresh import: the original's rkey is refused from then on.
  imr = ibv_import_mr(ipd, b.mr->handle);
  ASSERT_NE(imr, nullptr);
  EXPECT_EQ(ibv_dereg_mr(imr), 0);
  expect_refused(addr_of(b.buf.data() + 32), b.mr->rkey, b.buf, "MR deregistered through its import");
  EXPECT_EQ(ibv_import_mr(ipd, b.mr->handle), nullptr);
  ibv_unimport_mr(b.mr);  // its registration is gone; only the object is left to free
  b.mr = nullptr;

  EXPECT_EQ(ibv_destroy_qp(b.qp), 0);
  b.qp = nullptr;
  b.cq = own_cq;
  EXPECT_EQ(ibv_destroy_cq(icq), 0);
  ibv_unimport_pd(ipd);
  EXPECT_EQ(ibv_close_device(imp), 0);
  ibv_unimport_pd(nullptr);  // no crash
  ibv_unimport_mr(nullptr);
}

std::string pair_name(const ::testing::TestParamInfo<std::pair<const char*, const char*>>& p) {
  auto clean = [](std::string s) {
    for (char& c : s)
      if (c == '_') c = 'x';
    return s;
  };
  return clean(p.param.first) + "_to_" + clean(p.param.second);
}

INSTANTIATE_TEST_SUITE_P(Providers, Rereg,
                         ::testing::Values(std::make_pair("rr1", "rr0"), std::make_pair("rr0", "mlx5_0"),
                                           std::make_pair("mlx5_0", "rr0")),
                         pair_name);

}  // namespace
