// A raw driver for tests: the emulated device on a TestHost with a manual clock, and commands built
// with src/mlx5/prm and posted through the real command queue (entry, mailboxes, doorbell, ownership).
#pragma once

#include <gtest/gtest.h>
#include <string.h>

#include <vector>

#include "mlx5/emu/device.h"
#include "mlx5/emu/hca.h"
#include "mlx5/emu/test_host.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::emu::testing {

namespace prm = ::melon::mlx5::prm;

inline uint32_t bswap(uint32_t v) { return __builtin_bswap32(v); }

struct Result {
  uint8_t delivery = 0xff;  // delivery status (entry), 0xff: the device never handed the entry back
  uint8_t status = 0xff;
  uint32_t syndrome = 0;
  std::vector<uint8_t> out;
  bool ok() const { return delivery == 0 && status == 0; }
};

// A command input of `bytes` (the layout's size plus any flexible array).
inline std::vector<uint8_t> cmd_in(uint16_t opcode, uint32_t bytes, uint16_t op_mod = 0) {
  std::vector<uint8_t> v(bytes, 0);
  prm::cmd_set_header(v.data(), opcode, op_mod);
  return v;
}

class Harness {
 public:
  explicit Harness(DeviceConfig cfg = {}, FramePort* wire = nullptr)
      : dev(HostPorts{&host, &host, &clock, wire}, cfg) {}

  TestHost host;
  ManualClock clock;
  Device dev;
  TestHost::Buffer cmdq;
  uint8_t token = 0x5a;
  uint32_t uar = 0, eqn = 0, pd = 0;
  TestHost::Buffer eq_buf;
  uint32_t eq_ci = 0;

  uint32_t reg(uint32_t off) { return bswap(dev.read32(off)); }  // ioread32be
  void set_reg(uint32_t off, uint32_t v) { dev.write32(off, bswap(v)); }  // iowrite32be

  // PCI bus master on, firmware out of `initializing`, command queue programmed.
  void power_up() {
    dev.config_write(kPciCommand, 2, kPciCommandMemory | kPciCommandBusMaster);
    clock.advance(dev.config().init_delay_ns + 1);
    ASSERT_EQ(reg(prm::init_seg_offset::initializing) >> 31, 0u);
    cmdq = host.alloc(4096);
    set_reg(prm::init_seg_offset::cmdq_addr_h, uint32_t(cmdq.iova >> 32));
    set_reg(prm::init_seg_offset::cmdq_addr_l_sz, uint32_t(cmdq.iova));
  }

  // Posts `in` on queue slot `slot` and runs the device once. `corrupt` may damage the entry or the
  // mailboxes before the doorbell (tests of the transport checks).
  template <class Corrupt>
  Result exec_with(const std::vector<uint8_t>& in, uint32_t out_len, unsigned slot, Corrupt corrupt) {
    auto blocks = [](uint32_t len) {
      return len <= 16 ? 0u : (len - 16 + prm::kMailboxDataBytes - 1) / prm::kMailboxDataBytes;
    };
    uint32_t nin = blocks(uint32_t(in.size())), nout = blocks(out_len);
    TestHost::Buffer inb, outb;
    if (nin) inb = host.alloc(size_t(nin) * prm::kMailboxBytes);
    if (nout) outb = host.alloc(size_t(nout) * prm::kMailboxBytes);
    auto chain = [&](TestHost::Buffer& b, uint32_t n, const uint8_t* data, uint32_t data_len) {
      for (uint32_t i = 0; i < n; ++i) {
        uint8_t* box = static_cast<uint8_t*>(b.va) + size_t(i) * prm::kMailboxBytes;
        if (data) {
          uint32_t off = 16 + i * prm::kMailboxDataBytes;
          uint32_t len = data_len - off < prm::kMailboxDataBytes ? data_len - off : prm::kMailboxDataBytes;
          memcpy(box, data + off, len);
        }
        prm::set(box, prm::cmd_if_box::block_number, i);
        prm::set(box, prm::cmd_if_box::token, token);
        if (i + 1 < n) prm::mailbox_set_next(box, b.iova + size_t(i + 1) * prm::kMailboxBytes);
        prm::set(box, prm::cmd_if_box::signature, 0);
        prm::set(box, prm::cmd_if_box::signature, uint8_t(~prm::xor8(box, prm::cmd_if_box::size_bytes)));
      }
    };
    chain(inb, nin, in.data(), uint32_t(in.size()));
    chain(outb, nout, nullptr, 0);
    uint8_t* ent = static_cast<uint8_t*>(cmdq.va) + slot * 64;
    memset(ent, 0, 64);
    prm::set(ent, prm::cmd_queue_entry::type, prm::kCmdQueueEntryTypePcie);
    prm::set(ent, prm::cmd_queue_entry::input_length, in.size());
    prm::set(ent, prm::cmd_queue_entry::output_length, out_len);
    memcpy(prm::addr(ent, prm::cmd_queue_entry::command_input_inline_data), in.data(), in.size() < 16 ? in.size() : 16);
    if (nin) prm::cmd_entry_set_in_mailbox(ent, inb.iova);
    if (nout) prm::cmd_entry_set_out_mailbox(ent, outb.iova);
    prm::set(ent, prm::cmd_queue_entry::token, token);
    prm::set(ent, prm::cmd_queue_entry::ownership, 1);
    prm::set(ent, prm::cmd_queue_entry::signature, uint8_t(~prm::xor8(ent, 64)));
    corrupt(ent, inb, outb);
    set_reg(prm::init_seg_offset::cmd_dbell, 1u << slot);
    dev.service();
    Result r;
    if (!prm::get(ent, prm::cmd_queue_entry::ownership)) {
      r.delivery = uint8_t(prm::get(ent, prm::cmd_queue_entry::status));
      r.out.assign(out_len, 0);
      memcpy(r.out.data(), prm::addr(ent, prm::cmd_queue_entry::command_output_inline_data),
             out_len < 16 ? out_len : 16);
      for (uint32_t i = 0; i < nout; ++i) {
        uint32_t off = 16 + i * prm::kMailboxDataBytes;
        uint32_t len = out_len - off < prm::kMailboxDataBytes ? out_len - off : prm::kMailboxDataBytes;
        memcpy(r.out.data() + off, static_cast<uint8_t*>(outb.va) + size_t(i) * prm::kMailboxBytes, len);
      }
      r.status = prm::cmd_status_of(r.out.data());
      r.syndrome = prm::cmd_syndrome_of(r.out.data());
    }
    if (inb) host.free(inb.iova);
    if (outb) host.free(outb.iova);
    return r;
  }
  Result exec(const std::vector<uint8_t>& in, uint32_t out_len, unsigned slot = 0) {
    return exec_with(in, out_len, slot, [](uint8_t*, TestHost::Buffer&, TestHost::Buffer&) {});
  }
  // The command's PRM output size from the registry.
  static uint32_t out_size(uint16_t opcode) { return prm::find_command(opcode)->out->size_bytes(); }
  static uint32_t in_size(uint16_t opcode) { return prm::find_command(opcode)->in->size_bytes(); }
  Result simple(uint16_t opcode, uint16_t op_mod = 0) {
    return exec(cmd_in(opcode, in_size(opcode), op_mod), out_size(opcode));
  }

  // ---- bring-up steps (Linux main.c order) ----
  int32_t query_pages(uint16_t op_mod) {
    Result r = simple(prm::opcode::QUERY_PAGES, op_mod);
    EXPECT_TRUE(r.ok()) << int(r.status);
    return int32_t(prm::get(r.out.data(), prm::query_pages_out::num_pages));
  }
  std::vector<TestHost::Buffer> fw_pages;
  Result give_pages(uint32_t n) {
    auto in = cmd_in(prm::opcode::MANAGE_PAGES, prm::manage_pages_in::size_bytes + 8 * n,
                     prm::manage_pages_op_mod::ALLOCATION_SUCCESS);
    prm::set(in.data(), prm::manage_pages_in::input_num_entries, n);
    for (uint32_t i = 0; i < n; ++i) {
      TestHost::Buffer p = host.alloc(4096);
      fw_pages.push_back(p);
      prm::set_bits(prm::manage_pages_in::view(in.data()).elem(prm::manage_pages_in::pas, i), 0, 64, p.iova);
    }
    return exec(in, out_size(prm::opcode::MANAGE_PAGES));
  }
  void enable_to_init() {
    ASSERT_TRUE(simple(prm::opcode::ENABLE_HCA).ok());
    auto issi = cmd_in(prm::opcode::SET_ISSI, in_size(prm::opcode::SET_ISSI));
    prm::set(issi.data(), prm::set_issi_in::current_issi, 1);
    ASSERT_TRUE(exec(issi, out_size(prm::opcode::SET_ISSI)).ok());
    ASSERT_TRUE(give_pages(uint32_t(query_pages(prm::query_pages_op_mod::BOOT_PAGES))).ok());
    ASSERT_TRUE(
        simple(prm::opcode::QUERY_HCA_CAP, prm::cap_op_mod(prm::cap_type::GENERAL_DEVICE, prm::cap_mode::GET_CUR))
            .ok());
    ASSERT_TRUE(give_pages(uint32_t(query_pages(prm::query_pages_op_mod::INIT_PAGES))).ok());
    ASSERT_TRUE(simple(prm::opcode::INIT_HCA).ok());
  }
  uint32_t alloc(uint16_t opcode, const prm::Field& f) {
    Result r = simple(opcode);
    EXPECT_TRUE(r.ok()) << prm::opcode_name(opcode) << " status " << int(r.status);
    return uint32_t(prm::get(r.out.data(), f));
  }
  // INIT_HCA, a UAR, a PD, an EQ taking every async event, the regular pages it asked for.
  void bring_up() {
    power_up();
    enable_to_init();
    uar = alloc(prm::opcode::ALLOC_UAR, prm::alloc_uar_out::uar);
    pd = alloc(prm::opcode::ALLOC_PD, prm::alloc_pd_out::pd);
    eqn = create_eq(~prm::event_bit(prm::event_type::CMD), 6, &eq_buf);  // commands are polled
    int32_t owed = query_pages(prm::query_pages_op_mod::REGULAR_PAGES);
    if (owed > 0) ASSERT_TRUE(give_pages(uint32_t(owed)).ok());
  }
  uint32_t create_eq(uint64_t mask, uint8_t log_size, TestHost::Buffer* buf, uint16_t intr = 0) {
    *buf = host.alloc(64u << log_size);
    for (uint32_t i = 0; i < (1u << log_size); ++i)
      prm::set(static_cast<uint8_t*>(buf->va) + 64 * i, prm::eqe::owner, 1);  // Linux eq.c init_eq_buf
    uint32_t npages = ((64u << log_size) + 4095) / 4096;
    auto in = cmd_in(prm::opcode::CREATE_EQ, prm::create_eq_in::size_bytes + 8 * npages);
    auto ctx = prm::create_eq_in::view(in.data()).at(prm::create_eq_in::eq_context_entry);
    ctx.set(prm::eqc::log_eq_size, log_size).set(prm::eqc::uar_page, uar).set(prm::eqc::intr, intr);
    prm::eq_set_event_mask(in.data(), mask);
    for (uint32_t i = 0; i < npages; ++i)
      prm::pas_set(prm::create_eq_in::view(in.data()).elem(prm::create_eq_in::pas, i), buf->iova + 4096ull * i);
    Result r = exec(in, out_size(prm::opcode::CREATE_EQ));
    EXPECT_TRUE(r.ok()) << "CREATE_EQ status " << int(r.status) << " synd " << std::hex << r.syndrome;
    return uint32_t(prm::get(r.out.data(), prm::create_eq_out::eq_number));
  }
  // The next EQE software owns on the harness EQ, or nullptr.
  const uint8_t* next_eqe(uint32_t log_size = 6) {
    const uint8_t* e = static_cast<const uint8_t*>(eq_buf.va) + 64 * (eq_ci & ((1u << log_size) - 1));
    if (prm::get(e, prm::eqe::owner) != ((eq_ci >> log_size) & 1)) return nullptr;
    ++eq_ci;
    return e;
  }
  // A UAR doorbell write in memory order (Linux mlx5_write64 / __raw_writel).
  void uar_write32(uint32_t uar_idx, uint32_t off, uint32_t be_value) {
    dev.write32(uint64_t(uar_idx) * 4096 + off, bswap(be_value));
  }
  void uar_write64(uint32_t uar_idx, uint32_t off, const uint8_t bytes[8]) {
    uint64_t v;
    memcpy(&v, bytes, 8);
    dev.write64(uint64_t(uar_idx) * 4096 + off, v);
  }
};

}  // namespace melon::mlx5::emu::testing
