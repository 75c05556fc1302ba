// Firmware pages: the demands at each stage, the give/take protocol, PAGE_REQUEST, teardown.
#include "harness.h"

namespace melon::mlx5::emu::testing {
namespace {

namespace op = prm::opcode;
namespace cs = prm::cmd_status;
namespace qp = prm::query_pages_op_mod;

TEST(EmuPages, QueryHcaCapNeedsBootPagesAndInitHcaNeedsInitPages) {
  Harness h;
  h.power_up();
  ASSERT_TRUE(h.simple(op::ENABLE_HCA).ok());
  EXPECT_EQ(h.query_pages(qp::BOOT_PAGES), int32_t(h.dev.config().boot_pages));
  Result r = h.simple(op::QUERY_HCA_CAP, 1);
  EXPECT_EQ(r.status, cs::BAD_SYS_STATE_ERR);
  EXPECT_EQ(r.syndrome, synd::BOOT_PAGES_MISSING);
  ASSERT_TRUE(h.give_pages(h.dev.config().boot_pages).ok());
  EXPECT_EQ(h.query_pages(qp::BOOT_PAGES), 0);
  EXPECT_TRUE(h.simple(op::QUERY_HCA_CAP, 1).ok());
  EXPECT_EQ(h.query_pages(qp::INIT_PAGES), int32_t(h.dev.config().init_pages));
  ASSERT_TRUE(h.give_pages(h.dev.config().init_pages - 1).ok());
  r = h.simple(op::INIT_HCA);
  EXPECT_EQ(r.status, cs::BAD_SYS_STATE_ERR);
  EXPECT_EQ(r.syndrome, synd::INIT_PAGES_MISSING);
  ASSERT_TRUE(h.give_pages(1).ok());
  EXPECT_TRUE(h.simple(op::INIT_HCA).ok());
}

TEST(EmuPages, BadPagesAreRefusedWholeCommand) {
  Harness h;
  h.power_up();
  ASSERT_TRUE(h.simple(op::ENABLE_HCA).ok());
  auto in =
      cmd_in(op::MANAGE_PAGES, prm::manage_pages_in::size_bytes + 16, prm::manage_pages_op_mod::ALLOCATION_SUCCESS);
  prm::set(in.data(), prm::manage_pages_in::input_num_entries, 2);
  TestHost::Buffer a = h.host.alloc(4096);
  auto pas = [&](int i) { return prm::manage_pages_in::view(in.data()).elem(prm::manage_pages_in::pas, i); };
  prm::set_bits(pas(0), 0, 64, a.iova);
  prm::set_bits(pas(1), 0, 64, a.iova + 0x800);
  Result r = h.exec(in, 16);
  EXPECT_EQ(r.syndrome, synd::PAGE_NOT_ALIGNED);
  prm::set_bits(pas(1), 0, 64, a.iova);
  r = h.exec(in, 16);
  EXPECT_EQ(r.syndrome, synd::PAGE_ALREADY_GIVEN);
  prm::set_bits(pas(1), 0, 64, 0x7f0000000000ull);  // not mapped by the IOMMU
  r = h.exec(in, 16);
  EXPECT_EQ(r.status, cs::BAD_PARAM_ERR);
  EXPECT_EQ(r.syndrome, synd::PAGE_DMA_FAULT);
  EXPECT_EQ(h.dev.stats().fw_pages_held, 0u);  // nothing of a refused command was taken
  prm::set(in.data(), prm::manage_pages_in::input_num_entries, 9);  // more entries than the input holds
  r = h.exec(in, 16);
  EXPECT_EQ(r.status, cs::BAD_INP_LEN_ERR);
}

TEST(EmuPages, RegularPagesAreRequestedByEventOnceAnEqTakesIt) {
  Harness h;
  h.bring_up();  // creates an EQ taking PAGE_REQUEST, then gives what QUERY_PAGES says is owed
  const uint8_t* e = h.next_eqe();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(prm::get(e, prm::eqe::event_type), prm::event_type::PAGE_REQUEST);
  EXPECT_EQ(int32_t(prm::get(e + 32, prm::pages_req_event::num_pages)), int32_t(h.dev.config().regular_pages));
  EXPECT_EQ(h.query_pages(qp::REGULAR_PAGES), 0);
  auto& cfg = h.dev.config();
  EXPECT_EQ(h.dev.stats().fw_pages_held, cfg.boot_pages + cfg.init_pages + cfg.regular_pages);
}

TEST(EmuPages, ReturnPagesGivesBackOnlyUnusedPagesAndTeardownFreesAll) {
  Harness h;
  h.bring_up();
  uint32_t held = h.dev.stats().fw_pages_held;
  auto take = [&](uint32_t n) {
    auto in = cmd_in(op::MANAGE_PAGES, 16, prm::manage_pages_op_mod::HCA_RETURN_PAGES);
    prm::set(in.data(), prm::manage_pages_in::input_num_entries, n);
    return h.exec(in, prm::manage_pages_out::size_bytes + 8 * n);
  };
  Result r = take(held);
  ASSERT_TRUE(r.ok());
  uint32_t given = uint32_t(prm::get(r.out.data(), prm::manage_pages_out::output_num_entries));
  EXPECT_LT(given, held);  // the EQ context lives in one page
  EXPECT_GT(given, 0u);
  // Every returned page is one the harness gave.
  for (uint32_t i = 0; i < given; ++i) {
    uint64_t pa = prm::get_bits(prm::manage_pages_out::cview(r.out.data()).elem(prm::manage_pages_out::pas, i), 0, 64);
    bool ours = false;
    for (auto& p : h.fw_pages) ours = ours || p.iova == pa;
    EXPECT_TRUE(ours) << std::hex << pa;
  }
  uint32_t left = h.dev.stats().fw_pages_held;
  EXPECT_EQ(left, held - given);
  ASSERT_TRUE(h.simple(op::TEARDOWN_HCA).ok());
  r = take(left);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(prm::get(r.out.data(), prm::manage_pages_out::output_num_entries), left);
  EXPECT_EQ(h.dev.stats().fw_pages_held, 0u);
  EXPECT_TRUE(h.simple(op::DISABLE_HCA).ok());
}

TEST(EmuPages, OutputTooSmallForTheRequestedPagesIsRefused) {
  Harness h;
  h.bring_up();
  auto in = cmd_in(op::MANAGE_PAGES, 16, prm::manage_pages_op_mod::HCA_RETURN_PAGES);
  prm::set(in.data(), prm::manage_pages_in::input_num_entries, 8);
  Result r = h.exec(in, prm::manage_pages_out::size_bytes + 8 * 4);
  EXPECT_EQ(r.status, cs::BAD_OUTP_LEN_ERR);
}

TEST(EmuPages, AFreedPageTheDeviceStillHoldsIsAFatalIcmError) {
  Harness h;
  h.bring_up();
  // The driver frees (unmaps) every page it gave, then asks for a new object: the device's ICM
  // write hits the IOMMU.
  for (auto& p : h.fw_pages) h.host.free(p.iova);
  Result r = h.simple(op::ALLOC_PD);  // PDs live in no ICM: still fine
  EXPECT_TRUE(r.ok());
  auto in = cmd_in(op::CREATE_MKEY, Harness::in_size(op::CREATE_MKEY));
  auto m = prm::create_mkey_in::view(in.data()).at(prm::create_mkey_in::memory_key_mkey_entry);
  prm::mkc_set_access_mode(m, prm::mkc_access_mode::PA);
  m.set(prm::mkc::qpn, 0xffffff).set(prm::mkc::pd, h.pd).set(prm::mkc::length64, 1);
  r = h.exec(in, Harness::out_size(op::CREATE_MKEY));
  EXPECT_EQ(r.delivery, 0xff);  // the firmware died on it: no completion
  EXPECT_EQ(h.reg(prm::init_seg_offset::health_counter) >> 24, prm::health_syndrome::ICM_FETCH_PCI_ERR);
}

TEST(EmuPages, TheDeviceNeverTouchesAPageItGaveBack) {
  Harness h;
  h.bring_up();
  auto in = cmd_in(op::MANAGE_PAGES, 16, prm::manage_pages_op_mod::HCA_RETURN_PAGES);
  prm::set(in.data(), prm::manage_pages_in::input_num_entries, 1000);
  Result r = h.exec(in, prm::manage_pages_out::size_bytes + 8 * 1000);
  ASSERT_TRUE(r.ok());
  uint64_t pa = prm::get_bits(prm::manage_pages_out::cview(r.out.data()).elem(prm::manage_pages_out::pas, 0), 0, 64);
  // White box: a context write aimed at a returned page is caught and counted, not performed.
  uint8_t ctx[64] = {1};
  Hca& hca = h.dev.hca();
  std::lock_guard<std::mutex> g(hca.mu_);
  EXPECT_FALSE(hca.icm_write(pa, ctx, sizeof ctx));
  EXPECT_EQ(hca.stats_.page_use_after_take, 1u);
}

}  // namespace
}  // namespace melon::mlx5::emu::testing
