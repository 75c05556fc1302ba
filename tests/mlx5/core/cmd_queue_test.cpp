// The command interface on a fake device: mailbox chains, status and syndrome, delivery status,
// timeouts that quarantine their slot, slot reservation, fencing.
#include <gtest/gtest.h>

#include "mlx5/core/cmd_queue.h"
#include "mlx5/core/pages.h"
#include "mlx5/core/log.h"
#include "mlx5/core/page_list.h"
#include "mlx5/prm/prm.h"
#include "mlx5/core/fake_hal.h"

namespace core = melon::mlx5::core;
namespace p = melon::mlx5::prm;
using core::Err;
using core::test::FakeHal;

namespace {

struct CmdFixture : ::testing::Test {
  FakeHal hal;
  core::DmaLedger ledger;
  core::CmdQueue q;
  core::test::NoHooks hooks;
  void SetUp() override {
    ledger.init(&hal);
    ASSERT_EQ(q.init(&hal, &ledger, &hooks), Err::ok);
  }
  void TearDown() override {
    q.shutdown();
    ledger.release_quarantine();
    EXPECT_EQ(ledger.live_buffers(), 0u);
    EXPECT_EQ(hal.dma_live, 0);
  }
};

TEST_F(CmdFixture, ReadsGeometryAndWritesQueueAddress) {
  EXPECT_EQ(q.slots(), 32u);
  EXPECT_EQ(q.log_stride(), 6u);
  EXPECT_TRUE(hal.logged("MlxCmd: command queue at iova"));
}

TEST_F(CmdFixture, InlineCommandRoundTrips) {
  hal.respond = [](const std::vector<uint8_t>& in, std::vector<uint8_t>& out) {
    EXPECT_EQ(p::cmd_opcode(in.data()), p::opcode::ALLOC_PD);
    p::set(out.data(), p::alloc_pd_out::pd, 0x1234);
  };
  uint8_t in[p::alloc_pd_in::size_bytes] = {}, out[p::alloc_pd_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ALLOC_PD, 0);
  ASSERT_EQ(q.exec(in, sizeof in, out, sizeof out), Err::ok);
  EXPECT_EQ(p::get(out, p::alloc_pd_out::pd), 0x1234u);
  EXPECT_EQ(q.mailboxes_in_use(), 0u);
  for (auto& l : hal.lines) EXPECT_EQ(l.find("ALLOC_PD"), std::string::npos) << "debug lines compile out: " << l;
}

TEST_F(CmdFixture, LongInputAndOutputTravelInMailboxChains) {
  // QUERY_HCA_CAP's 4 KiB output and a 3000-byte input: 6 and 9 mailboxes.
  std::vector<uint8_t> in(3000), out(p::query_hca_cap_out::size_bytes);
  for (size_t i = 8; i < in.size(); ++i) in[i] = uint8_t(i * 7);
  p::cmd_set_header(in.data(), p::opcode::QUERY_HCA_CAP, 1);
  hal.respond = [&](const std::vector<uint8_t>& got, std::vector<uint8_t>& o) {
    EXPECT_EQ(got, in);
    for (size_t i = 16; i < o.size(); ++i) o[i] = uint8_t(i ^ 0x5a);
  };
  ASSERT_EQ(q.exec(in.data(), uint32_t(in.size()), out.data(), uint32_t(out.size())), Err::ok);
  for (size_t i = 16; i < out.size(); ++i) ASSERT_EQ(out[i], uint8_t(i ^ 0x5a)) << i;
  EXPECT_EQ(q.mailboxes_in_use(), 0u);
}

TEST_F(CmdFixture, BadStatusIsReportedWithSyndromeAndName) {
  hal.respond = [](const std::vector<uint8_t>&, std::vector<uint8_t>& out) {
    p::cmd_set_result(out.data(), p::cmd_status::BAD_PARAM_ERR, 0xdeadbe);
  };
  uint8_t in[16] = {}, out[16] = {};
  p::cmd_set_header(in, p::opcode::CREATE_QP, 0);
  core::CmdFailure f;
  EXPECT_EQ(q.exec(in, sizeof in, out, sizeof out, &f), Err::cmd_status);
  EXPECT_EQ(f.opcode, p::opcode::CREATE_QP);
  EXPECT_EQ(f.status, p::cmd_status::BAD_PARAM_ERR);
  EXPECT_EQ(f.syndrome, 0xdeadbeu);
  EXPECT_TRUE(hal.logged("MlxCmd: CREATE_QP(0x500) op_mod 0x0 failed: status BAD_PARAM_ERR(0x3) syndrome 0xdeadbe"));
}

TEST_F(CmdFixture, DeliveryStatusIsNotACommandStatus) {
  hal.delivery_status = p::delivery_status::BAD_INPUT_POINTER;
  uint8_t in[16] = {}, out[16] = {};
  p::cmd_set_header(in, p::opcode::NOP, 0);
  core::CmdFailure f;
  EXPECT_EQ(q.exec(in, sizeof in, out, sizeof out, &f), Err::delivery);
  EXPECT_EQ(f.delivery, p::delivery_status::BAD_INPUT_POINTER);
  EXPECT_TRUE(hal.logged("not delivered: BAD_INPUT_POINTER(0x5)"));
}

TEST_F(CmdFixture, TimeoutQuarantinesTheSlotAndItsMailboxes) {
  hal.never_complete = true;
  std::vector<uint8_t> in(2000), out(2000);
  p::cmd_set_header(in.data(), p::opcode::CREATE_MKEY, 0);
  EXPECT_EQ(q.exec(in.data(), 2000, out.data(), 2000, nullptr, 50), Err::timeout);
  EXPECT_EQ(q.quarantined_slots(), 1u);
  EXPECT_EQ(q.mailboxes_quarantined(), 8u);  // 4 in + 4 out
  EXPECT_EQ(q.mailboxes_in_use(), 0u);
  EXPECT_TRUE(hal.logged("CREATE_MKEY(0x200) op_mod 0x0 timed out after 5"));
  // The device may still write the quarantined buffers: shutting down keeps them.
  uint64_t before = hal.dma_live;
  hal.never_complete = false;
  // The queue keeps working on the other slots, and never picks the quarantined one.
  hal.completed_slots.clear();
  for (int i = 0; i < 40; ++i) ASSERT_EQ(q.exec(in.data(), 16, out.data(), 16), Err::ok);
  for (uint32_t s : hal.completed_slots) EXPECT_NE(s, 0u);
  q.shutdown();
  EXPECT_GT(ledger.quarantined_buffers(), 0u);
  EXPECT_EQ(uint64_t(hal.dma_live), before);  // nothing freed under the device
  ledger.release_quarantine();  // only after a reset
  EXPECT_EQ(hal.dma_live, 0);
  ASSERT_EQ(q.init(&hal, &ledger, &hooks), Err::ok);  // for TearDown
}

TEST_F(CmdFixture, PageSlotIsReservedForPageCommands) {
  hal.completed_slots.clear();
  uint8_t in[16] = {}, out[16] = {};
  p::cmd_set_header(in, p::opcode::MANAGE_PAGES, 1);
  ASSERT_EQ(q.exec(in, 16, out, 16, nullptr, 0, true), Err::ok);
  p::cmd_set_header(in, p::opcode::NOP, 0);
  ASSERT_EQ(q.exec(in, 16, out, 16), Err::ok);
  ASSERT_EQ(hal.completed_slots.size(), 2u);
  EXPECT_EQ(hal.completed_slots[0], 31u);
  EXPECT_NE(hal.completed_slots[1], 31u);
}

TEST_F(CmdFixture, FencedQueueRefusesWorkAtOnce) {
  q.fence();
  uint8_t in[16] = {}, out[16] = {};
  p::cmd_set_header(in, p::opcode::NOP, 0);
  EXPECT_EQ(q.exec(in, 16, out, 16), Err::dead);
  EXPECT_EQ(hal.cmds, 0u);
}

TEST_F(CmdFixture, DeadDeviceAbandonsTheWaitAndQuarantines) {
  hal.never_complete = true;
  hooks.dead = true;
  uint8_t in[16] = {}, out[16] = {};
  p::cmd_set_header(in, p::opcode::NOP, 0);
  uint64_t t0 = hal.now;
  EXPECT_EQ(q.exec(in, 16, out, 16, nullptr, 60000), Err::dead);
  EXPECT_LT(hal.now - t0, 1000000000ull);  // did not wait out the minute
  EXPECT_EQ(q.quarantined_slots(), 1u);
}

TEST_F(CmdFixture, MailboxAllocationFailureFreesTheSlot) {
  std::vector<uint8_t> in(4000), out(16);
  p::cmd_set_header(in.data(), p::opcode::CREATE_MKEY, 0);
  hal.fail_allocs = 1000;
  EXPECT_EQ(q.exec(in.data(), 4000, out.data(), 16), Err::no_memory);
  hal.fail_allocs = 0;
  EXPECT_EQ(q.quarantined_slots(), 0u);
  EXPECT_EQ(q.exec(in.data(), 4000, out.data(), 16), Err::ok);
}

// A CQ of 2^22 CQEs in 4 KiB pages: 65536 page addresses, 1025 input mailboxes. The chain is
// sized to the command, and the pool gives the long chain's chunks back afterwards.
TEST_F(CmdFixture, PageListOfTheLargestCqTravelsInOneChain) {
  std::vector<uint8_t> in(p::create_cq_in::size_bytes + 65536 * 8), out(p::create_cq_out::size_bytes);
  p::cmd_set_header(in.data(), p::opcode::CREATE_CQ, 0);
  for (size_t i = 16; i < in.size(); ++i) in[i] = uint8_t(i * 13 + (i >> 9));
  uint64_t dma_before = ledger.live_bytes();
  size_t seen = 0;
  hal.respond = [&](const std::vector<uint8_t>& got, std::vector<uint8_t>&) {
    seen = got.size();
    EXPECT_TRUE(got == in);
  };
  ASSERT_EQ(q.exec(in.data(), uint32_t(in.size()), out.data(), uint32_t(out.size())), Err::ok);
  EXPECT_EQ(seen, in.size());
  EXPECT_EQ(q.mailboxes_in_use(), 0u);
  EXPECT_LE(ledger.live_bytes(), dma_before + 64 * 1024) << "the long chain's mailboxes stayed allocated";
  // And a short command after it still runs on what is left.
  hal.respond = nullptr;
  uint8_t small_in[p::alloc_pd_in::size_bytes] = {}, small_out[p::alloc_pd_out::size_bytes] = {};
  p::cmd_set_header(small_in, p::opcode::ALLOC_PD, 0);
  EXPECT_EQ(q.exec(small_in, sizeof small_in, small_out, sizeof small_out), Err::ok);
}

// The long chain's block list is allocated per command: when that fails, the command fails cleanly.
TEST_F(CmdFixture, LongChainWithoutMemoryFailsCleanly) {
  std::vector<uint8_t> in(16 + 512 * 40), out(16);
  p::cmd_set_header(in.data(), p::opcode::CREATE_MKEY, 0);
  int64_t mem_before = hal.mem_bytes;
  hal.fail_mem = 1;
  EXPECT_EQ(q.exec(in.data(), uint32_t(in.size()), out.data(), 16), Err::no_memory);
  EXPECT_EQ(hal.fail_mem, 0) << "the chain's block list was not what failed";
  EXPECT_EQ(q.mailboxes_in_use(), 0u);
  EXPECT_EQ(q.quarantined_slots(), 0u);
  EXPECT_EQ(hal.mem_bytes, mem_before);
  EXPECT_EQ(q.exec(in.data(), uint32_t(in.size()), out.data(), 16), Err::ok);
}

TEST_F(CmdFixture, OversizedCommandIsRejected) {
  std::vector<uint8_t> in(16 + 512 * (core::CmdQueue::kMaxMailboxes + 1)), out(16);
  p::cmd_set_header(in.data(), p::opcode::CREATE_MKEY, 0);
  EXPECT_EQ(q.exec(in.data(), uint32_t(in.size()), out.data(), 16), Err::invalid);
  EXPECT_EQ(hal.cmds, 0u);
}

// ---- firmware pages on the fake -----------------------------------------------------------------

struct FakeFirmware {
  std::set<uint64_t> held;
  int32_t boot = 5, init = 40;
  uint32_t bad = 0;
  void respond(const std::vector<uint8_t>& in, std::vector<uint8_t>& out) {
    uint16_t op = p::cmd_opcode(in.data()), mod = p::cmd_op_mod(in.data());
    if (op == p::opcode::QUERY_PAGES) {
      p::set(out.data(), p::query_pages_out::num_pages, uint32_t(mod == 1 ? boot : init));
    } else if (op == p::opcode::MANAGE_PAGES && mod == p::manage_pages_op_mod::ALLOCATION_SUCCESS) {
      uint32_t n = uint32_t(p::get(in.data(), p::manage_pages_in::input_num_entries));
      for (uint32_t i = 0; i < n; ++i) {
        uint64_t pa = p::pas_pa(in.data() + 16 + 8 * i);
        if (pa % 4096 || !held.insert(pa).second) ++bad;
      }
    } else if (op == p::opcode::MANAGE_PAGES && mod == p::manage_pages_op_mod::HCA_RETURN_PAGES) {
      uint32_t n = uint32_t(p::get(in.data(), p::manage_pages_in::input_num_entries)), k = 0;
      while (k < n && !held.empty()) {
        p::pas_set(out.data() + 16 + 8 * k++, *held.begin());
        held.erase(held.begin());
      }
      p::set(out.data(), p::manage_pages_out::output_num_entries, k);
    }
  }
};

struct PagesFixture : CmdFixture {
  FakeFirmware fw;
  core::PageManager pages;
  void SetUp() override {
    CmdFixture::SetUp();
    hal.respond = [this](const std::vector<uint8_t>& in, std::vector<uint8_t>& out) { fw.respond(in, out); };
    pages.init(&hal, &ledger, &q);
  }
  void TearDown() override {
    pages.destroy();
    CmdFixture::TearDown();
  }
};

TEST_F(PagesFixture, StartupPagesAreGivenAndCountedExactly) {
  ASSERT_EQ(pages.satisfy_startup(p::query_pages_op_mod::BOOT_PAGES, nullptr), Err::ok);
  ASSERT_EQ(pages.satisfy_startup(p::query_pages_op_mod::INIT_PAGES, nullptr), Err::ok);
  EXPECT_EQ(pages.given(), 45u);
  EXPECT_EQ(fw.held.size(), 45u);
  EXPECT_EQ(fw.bad, 0u);
  EXPECT_EQ(pages.count(core::PageState::allocated) + pages.given(), pages.chunks() * 16u);
  ASSERT_EQ(pages.reclaim_all(nullptr), Err::ok);
  EXPECT_EQ(pages.given(), 0u);
  EXPECT_EQ(pages.returned_total(), 45u);
  EXPECT_EQ(pages.chunks(), 0u);  // every chunk went back
  EXPECT_TRUE(fw.held.empty());
}

TEST_F(PagesFixture, PageRequestsAreDeferredThenServed) {
  pages.note_request(0, 20);
  pages.note_request(0, 12);
  EXPECT_TRUE(pages.has_pending());
  EXPECT_TRUE(fw.held.empty());  // nothing happened in the "event"
  ASSERT_EQ(pages.run_pending(), Err::ok);
  EXPECT_EQ(fw.held.size(), 32u);
  pages.note_request(0, -10);
  ASSERT_EQ(pages.run_pending(), Err::ok);
  EXPECT_EQ(pages.given(), 22u);
  EXPECT_EQ(fw.held.size(), 22u);
  EXPECT_FALSE(pages.has_pending());
  ASSERT_EQ(pages.reclaim_all(nullptr), Err::ok);
}

TEST_F(PagesFixture, FirmwareReturningAPageItNeverHadIsCaughtNotFreed) {
  ASSERT_EQ(pages.give(0, 3, nullptr), Err::ok);
  fw.held.insert(0x4242000);  // a page we never gave
  uint32_t got = 0;
  ASSERT_EQ(pages.reclaim(0, 4, &got, nullptr), Err::ok);
  EXPECT_EQ(got, 4u);
  EXPECT_EQ(pages.unknown_returns(), 1u);
  EXPECT_EQ(pages.given(), 0u);
  EXPECT_TRUE(hal.logged("MlxPages: firmware returned page 0x4242000 that it did not hold"));
}

TEST_F(PagesFixture, RefusedGiveKeepsPagesUnansweredGiveQuarantinesThem) {
  hal.respond = [](const std::vector<uint8_t>&, std::vector<uint8_t>& out) {
    p::cmd_set_result(out.data(), p::cmd_status::BAD_RES_STATE_ERR, 1);
  };
  EXPECT_EQ(pages.give(0, 4, nullptr), Err::cmd_status);
  EXPECT_EQ(pages.given(), 0u);
  EXPECT_EQ(pages.count(core::PageState::quarantined), 0u);
  hal.never_complete = true;
  EXPECT_EQ(pages.give(0, 4, nullptr), Err::timeout);
  EXPECT_EQ(pages.count(core::PageState::quarantined), 4u);
  // Quarantined pages stay out of reach until a reset says the device forgot them.
  EXPECT_EQ(pages.destroy(), 4u);
  EXPECT_GT(ledger.quarantined_buffers(), 0u);
}

TEST_F(PagesFixture, OutOfMemoryTellsTheFirmware) {
  bool told = false;
  hal.respond = [&](const std::vector<uint8_t>& in, std::vector<uint8_t>&) {
    if (p::cmd_opcode(in.data()) == p::opcode::MANAGE_PAGES &&
        p::cmd_op_mod(in.data()) == p::manage_pages_op_mod::ALLOCATION_FAIL)
      told = true;
  };
  hal.fail_allocs = 100;
  EXPECT_EQ(pages.give(0, 4, nullptr), Err::no_memory);
  hal.fail_allocs = 0;
  EXPECT_TRUE(told);
  EXPECT_EQ(pages.given(), 0u);
}

TEST_F(PagesFixture, FatalThenResetReturnsEveryPage) {
  ASSERT_EQ(pages.give(0, 10, nullptr), Err::ok);
  pages.quarantine_given();
  EXPECT_EQ(pages.count(core::PageState::quarantined), 10u);
  EXPECT_EQ(pages.given(), 0u);
  pages.reset_done();
  EXPECT_EQ(pages.count(core::PageState::quarantined), 0u);
  EXPECT_EQ(pages.chunks(), 0u);
}

// ---- the small pieces ---------------------------------------------------------------------------

TEST(CoreLog, FormatterHandlesTheSubsetTheCoreUses) {
  char b[128];
  core::format(b, sizeof b, "%s %u %d %x %08x %llx %c %%", "a", 7u, -5, 0xabu, 0x1fu, 0x123456789ull, 'z');
  EXPECT_STREQ(b, "a 7 -5 ab 0000001f 123456789 z %");
  core::format(b, 8, "%s", "truncated line");
  EXPECT_STREQ(b, "truncat");
}

TEST(CorePageList, SixteenKiBHostPagesSplitIntoFourKiBWhenForced) {
  core::DmaSegment segs[] = {{0x100000, 16384}, {0x300000, 16384}};
  EXPECT_EQ(core::best_page_shift(segs, 2, 0x7000000000ull, 30), 14u);
  EXPECT_EQ(core::best_page_shift(segs, 2, 0x7000000000ull, 12), 12u);
  std::vector<uint64_t> pages;
  core::for_each_page(segs, 2, 12, [&](uint64_t pa) { pages.push_back(pa); });
  ASSERT_EQ(pages.size(), 8u);
  EXPECT_EQ(pages[3], 0x103000u);
  EXPECT_EQ(pages[4], 0x300000u);
}

TEST(CorePageList, ContiguousSegmentsCoalesce) {
  core::DmaSegment segs[] = {{0x200000, 16384}, {0x204000, 16384}, {0x208000, 0x1f8000}};
  // One 2 MiB run, 2 MiB aligned, at a 2 MiB aligned VA: one 2 MiB page.
  EXPECT_EQ(core::best_page_shift(segs, 3, 0x40000000, 30), 21u);
  uint64_t n = core::for_each_page(segs, 3, 21, [](uint64_t) {});
  EXPECT_EQ(n, 1u);
}

TEST(CorePageList, MisalignedSegmentsAreRefused) {
  core::DmaSegment segs[] = {{0x100000, 100}, {0x300010, 100}};
  EXPECT_EQ(core::best_page_shift(segs, 2, 0x100000, 30), 0u);
}

TEST(CorePageList, FirstPageOffsetMustMatchTheVirtualAddress) {
  core::DmaSegment segs[] = {{0x101800, 0x3000}};
  EXPECT_EQ(core::best_page_shift(segs, 1, 0x5800, 12), 12u);  // same offset in a 4 KiB page
  EXPECT_EQ(core::best_page_shift(segs, 1, 0x5800, 30), 14u);  // and in a 16 KiB one
  EXPECT_EQ(core::best_page_shift(segs, 1, 0x5000, 30), 0u);  // different offset
}

}  // namespace
