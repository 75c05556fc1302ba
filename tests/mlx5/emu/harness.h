// A raw driver for tests: the emulated device on a TestHost with a manual clock, and commands built
// with src/mlx5/prm and posted through the real command queue (entry, mailboxes, doorbell, ownership).
#pragma once

#include <gtest/gtest.h>
#include <string.h>
#include <unistd.h>

#include <functional>
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
  // steady_clock: the device runs on CLOCK_MONOTONIC (tests against a real peer), not `clock`.
  explicit Harness(DeviceConfig cfg = {}, FramePort* wire = nullptr, bool steady_clock = false)
      : dev(HostPorts{&host, &host, steady_clock ? nullptr : &clock, wire}, cfg), steady_(steady_clock) {}

  TestHost host;
  ManualClock clock;
  Device dev;
  bool steady_ = false;
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
    for (int i = 0; steady_ && i < 1000 && (reg(prm::init_seg_offset::initializing) >> 31); ++i) usleep(1000);
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
  // ---- objects ----
  struct CqRing {
    uint32_t cqn = 0;
    uint8_t log_size = 0;
    TestHost::Buffer buf, dbr;
    uint32_t ci = 0;
  };
  Result create_cq_raw(CqRing& cq, uint8_t log_size, uint32_t eq, std::function<void(uint8_t*)> tweak = {}) {
    cq.log_size = log_size;
    cq.buf = host.alloc(64u << log_size);
    cq.dbr = host.alloc(64);
    for (uint32_t i = 0; i < (1u << log_size); ++i)  // rdma-core cq.c: every CQE starts INVALID, owner 1
      static_cast<uint8_t*>(cq.buf.va)[64 * i + 63] = 0xf1;
    uint32_t npages = ((64u << log_size) + 4095) / 4096;
    auto in = cmd_in(prm::opcode::CREATE_CQ, prm::create_cq_in::size_bytes + 8 * npages);
    auto ctx = prm::create_cq_in::view(in.data()).at(prm::create_cq_in::cq_context);
    ctx.set(prm::cqc::log_cq_size, log_size).set(prm::cqc::uar_page, uar).set(prm::cqc::c_eqn, eq);
    ctx.set(prm::cqc::dbr_addr, cq.dbr.iova);
    for (uint32_t i = 0; i < npages; ++i)
      prm::pas_set(prm::create_cq_in::view(in.data()).elem(prm::create_cq_in::pas, i), cq.buf.iova + 4096ull * i);
    if (tweak) tweak(in.data());
    Result r = exec(in, out_size(prm::opcode::CREATE_CQ));
    cq.cqn = uint32_t(prm::get(r.out.data(), prm::create_cq_out::cqn));
    return r;
  }
  CqRing create_cq(uint8_t log_size = 6) {
    CqRing cq;
    Result r = create_cq_raw(cq, log_size, eqn);
    EXPECT_TRUE(r.ok()) << "CREATE_CQ status " << int(r.status) << " synd " << std::hex << r.syndrome;
    return cq;
  }
  // The next CQE software owns, or nullptr; advances the consumer index and its doorbell record.
  const uint8_t* poll_cq(CqRing& cq) {
    const uint8_t* e = static_cast<const uint8_t*>(cq.buf.va) + 64 * (cq.ci & ((1u << cq.log_size) - 1));
    if (!prm::cqe_sw_owned(e, cq.ci, cq.log_size)) return nullptr;
    ++cq.ci;
    prm::set(cq.dbr.va, prm::cq_dbrec::set_ci, cq.ci & 0xffffff);
    return e;
  }
  void arm_cq(CqRing& cq, bool solicited) {
    uint8_t db[8] = {};
    prm::set(db, prm::cq_uar_db::cmd, solicited ? prm::kCqArmSolicited : prm::kCqArmNext);
    prm::set(db, prm::cq_uar_db::ci, cq.ci & 0xffffff);
    prm::set(db, prm::cq_uar_db::cqn, cq.cqn);
    uar_write64(uar, prm::kUarCqDoorbell, db);
    dev.service();
  }

  // An MTT mkey over `len` bytes at host buffer `b` (VA = b.va), all rights.
  Result create_mkey_raw(const TestHost::Buffer& b, uint64_t len, uint32_t access_bits, uint32_t* key,
                         std::function<void(uint8_t*)> tweak = {}) {
    uint64_t va = reinterpret_cast<uint64_t>(b.va);
    uint32_t pages = uint32_t((va % 4096 + len + 4095) / 4096);
    uint32_t oct = (pages + 1) / 2;
    auto in = cmd_in(prm::opcode::CREATE_MKEY, prm::create_mkey_in::size_bytes + 16 * oct);
    prm::create_mkey_in::view v(in.data());
    auto m = v.at(prm::create_mkey_in::memory_key_mkey_entry);
    prm::mkc_set_access_mode(m, prm::mkc_access_mode::MTT);
    m.set(prm::mkc::qpn, 0xffffff).set(prm::mkc::pd, pd).set(prm::mkc::start_addr, va).set(prm::mkc::len, len);
    m.set(prm::mkc::lr, 1).set(prm::mkc::lw, !!(access_bits & 1)).set(prm::mkc::rw, !!(access_bits & 2));
    m.set(prm::mkc::rr, !!(access_bits & 4)).set(prm::mkc::a, !!(access_bits & 8));
    m.set(prm::mkc::mkey_7_0, 0x42).set(prm::mkc::log_page_size, 12);
    m.set(prm::mkc::translations_octword_size, oct);
    v.set(prm::create_mkey_in::translations_octword_actual_size, oct);
    for (uint32_t i = 0; i < pages; ++i)
      prm::mtt_set(v.elem(prm::create_mkey_in::klm_pas_mtt, 2 * i), b.iova + 4096ull * i, 1, 1);
    if (tweak) tweak(in.data());
    Result r = exec(in, out_size(prm::opcode::CREATE_MKEY));
    *key = uint32_t(prm::get(r.out.data(), prm::create_mkey_out::mkey_index)) << 8 | 0x42;
    return r;
  }
  uint32_t create_mkey(const TestHost::Buffer& b, uint64_t len, uint32_t access_bits = 0xf) {
    uint32_t key = 0;
    Result r = create_mkey_raw(b, len, access_bits, &key);
    EXPECT_TRUE(r.ok()) << "CREATE_MKEY status " << int(r.status) << " synd " << std::hex << r.syndrome;
    return key;
  }

  struct QpRing {
    uint32_t qpn = 0;
    uint8_t st = 0, log_sq = 0, log_rq = 0, log_rq_stride = 0;  // stride: 16 << n bytes
    TestHost::Buffer buf, dbr;
    uint32_t sq_pi = 0, rq_pi = 0;
    uint8_t* rq(uint32_t i) const {
      return static_cast<uint8_t*>(buf.va) + (16u << log_rq_stride) * (i & ((1u << log_rq) - 1));
    }
    uint8_t* sq(uint32_t i) const {
      return static_cast<uint8_t*>(buf.va) + ((16u << log_rq_stride) << log_rq) + 64 * (i & ((1u << log_sq) - 1));
    }
  };
  Result create_qp_raw(QpRing& q, uint8_t st, const CqRing& scq, const CqRing& rcq,
                       std::function<void(uint8_t*)> tweak = {}) {
    q.st = st;
    if (!q.log_sq) q.log_sq = 6;
    if (!q.log_rq) q.log_rq = 6;
    if (!q.log_rq_stride) q.log_rq_stride = 2;  // 64-byte receive WQEs: 4 scatter entries
    uint64_t bytes = ((16ull << q.log_rq_stride) << q.log_rq) + (64ull << q.log_sq);
    uint32_t npages = uint32_t((bytes + 4095) / 4096);
    q.buf = host.alloc(bytes);
    q.dbr = host.alloc(64);
    auto in = cmd_in(prm::opcode::CREATE_QP, prm::create_qp_in::size_bytes + 8 * npages);
    auto ctx = prm::create_qp_in::view(in.data()).at(prm::create_qp_in::qpc);
    ctx.set(prm::qpc::st, st).set(prm::qpc::pd, pd).set(prm::qpc::uar_page, uar);
    ctx.set(prm::qpc::log_sq_size, q.log_sq)
        .set(prm::qpc::log_rq_size, q.log_rq)
        .set(prm::qpc::log_rq_stride, q.log_rq_stride);
    ctx.set(prm::qpc::cqn_snd, scq.cqn).set(prm::qpc::cqn_rcv, rcq.cqn).set(prm::qpc::dbr_addr, q.dbr.iova);
    ctx.set(prm::qpc::pm_state, prm::qpc_pm_state::MIGRATED);
    for (uint32_t i = 0; i < npages; ++i)
      prm::pas_set(prm::create_qp_in::view(in.data()).elem(prm::create_qp_in::pas, i), q.buf.iova + 4096ull * i);
    if (tweak) tweak(in.data());
    Result r = exec(in, out_size(prm::opcode::CREATE_QP));
    q.qpn = uint32_t(prm::get(r.out.data(), prm::create_qp_out::qpn));
    return r;
  }
  // A QP transition command with the qpc fields `fill` sets.
  Result transition(uint16_t opcode, uint32_t qpn, std::function<void(prm::qpc::view)> fill = {}, uint32_t opt = 0) {
    uint32_t bytes = in_size(opcode);
    auto in = cmd_in(opcode, bytes);
    prm::set(in.data(), prm::qp_2err_in::qpn, qpn);
    if (bytes > 16) {
      prm::set(in.data(), prm::rst2init_qp_in::opt_param_mask, opt);
      if (fill) fill(prm::rst2init_qp_in::view(in.data()).at(prm::rst2init_qp_in::qpc));
    }
    return exec(in, out_size(opcode));
  }
  // GID `index` = the IPv4 address `ip` (RoCE v2), stored as Linux mlx5_core_roce_gid_set does: the
  // address in the last 4 bytes of source_l3_address.
  Result set_gid(uint32_t index, const uint8_t ip[4]) {
    auto in = cmd_in(prm::opcode::SET_ROCE_ADDRESS, in_size(prm::opcode::SET_ROCE_ADDRESS));
    prm::set_roce_address_in::view v(in.data());
    v.set(prm::set_roce_address_in::roce_address_index, index).set(prm::set_roce_address_in::vhca_port_num, 1);
    auto a = v.at(prm::set_roce_address_in::roce_address);
    uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, ip[0], ip[1], ip[2], ip[3]};
    a.set_bytes(prm::roce_addr_layout::source_l3_address, gid);
    a.set(prm::roce_addr_layout::roce_l3_type, prm::roce_l3_type::IPV4)
        .set(prm::roce_addr_layout::roce_version, prm::roce_version::VERSION_2);
    prm::set_mac(a.data(), prm::roce_addr_layout::source_mac_47_32, prm::roce_addr_layout::source_mac_31_0,
                 dev.config().mac);
    return exec(in, out_size(prm::opcode::SET_ROCE_ADDRESS));
  }

  // ---- data path (rdma-core qp.c's WQE layout) ----
  struct Seg {
    uint64_t addr;
    uint32_t len;
    uint32_t lkey;
  };
  struct SendOpts {
    uint64_t raddr = 0;
    uint32_t rkey = 0;
    uint32_t imm = 0;  // immediate, or the rkey to invalidate
    bool signaled = true, fence = false, solicited = false;
    uint64_t swap_add = 0, compare = 0;
    std::vector<uint8_t> inline_data;
    bool has_inline = false;
    // UD
    uint32_t dqpn = 0, qkey = 0;
    uint8_t dgid[16] = {};
  };
  // Writes a send WQE at the producer index, updates the doorbell record and rings the doorbell.
  uint16_t post_send(QpRing& q, uint8_t opcode, const std::vector<Seg>& sges) {
    return post_send(q, opcode, sges, SendOpts());
  }
  uint16_t post_send(QpRing& q, uint8_t opcode, const std::vector<Seg>& sges, const SendOpts& o) {
    std::vector<uint8_t> w(16, 0);
    auto put = [&](const uint8_t* p, size_t n) { w.insert(w.end(), p, p + n); };
    if (prm::qpc_st_datagram(q.st)) {
      uint8_t d[prm::wqe_datagram_seg::size_bytes] = {};
      prm::wqe_datagram_seg::view v(d);
      v.set(prm::wqe_datagram_seg::qkey, o.qkey)
          .set(prm::wqe_datagram_seg::dqpn, o.dqpn)
          .set(prm::wqe_datagram_seg::ext, 1);
      v.set_bytes(prm::wqe_datagram_seg::rgid, o.dgid).set(prm::wqe_datagram_seg::hop_limit, 64);
      put(d, sizeof d);
    }
    namespace wo = prm::wqe_opcode;
    bool atomic = opcode == wo::ATOMIC_CS || opcode == wo::ATOMIC_FA;
    if (opcode == wo::RDMA_WRITE || opcode == wo::RDMA_WRITE_IMM || opcode == wo::RDMA_READ || atomic) {
      uint8_t r[16] = {};
      prm::wqe_raddr_seg::view(r).set(prm::wqe_raddr_seg::raddr, o.raddr).set(prm::wqe_raddr_seg::rkey, o.rkey);
      put(r, 16);
    }
    if (atomic) {
      uint8_t a[16] = {};
      prm::wqe_atomic_seg::view(a)
          .set(prm::wqe_atomic_seg::swap_add, o.swap_add)
          .set(prm::wqe_atomic_seg::compare, o.compare);
      put(a, 16);
    }
    if (o.has_inline) {
      uint8_t hdr[4];
      prm::set_bits(hdr, 0, 32, prm::kInlineSegFlag | uint32_t(o.inline_data.size()));
      put(hdr, 4);
      put(o.inline_data.data(), o.inline_data.size());
      while (w.size() % 16) w.push_back(0);
    } else {
      for (const Seg& g : sges) {
        uint8_t d[16] = {};
        prm::wqe_data_seg::view(d)
            .set(prm::wqe_data_seg::byte_count, g.len)
            .set(prm::wqe_data_seg::lkey, g.lkey)
            .set(prm::wqe_data_seg::addr, g.addr);
        put(d, 16);
      }
    }
    prm::wqe_ctrl_seg::view c(w.data());
    c.set(prm::wqe_ctrl_seg::opcode, opcode).set(prm::wqe_ctrl_seg::wqe_index, q.sq_pi & 0xffff);
    c.set(prm::wqe_ctrl_seg::qpn, q.qpn).set(prm::wqe_ctrl_seg::ds, w.size() / 16);
    c.set(prm::wqe_ctrl_seg::ce, o.signaled ? 2 : 0)
        .set(prm::wqe_ctrl_seg::se, o.solicited)
        .set(prm::wqe_ctrl_seg::fm, o.fence ? 4 : 0);
    c.set(prm::wqe_ctrl_seg::imm, o.imm);
    uint32_t nbb = uint32_t((w.size() + 63) / 64);
    w.resize(nbb * 64, 0);
    uint16_t index = uint16_t(q.sq_pi);
    for (uint32_t i = 0; i < nbb; ++i) memcpy(q.sq(q.sq_pi + i), w.data() + 64 * i, 64);
    q.sq_pi += nbb;
    prm::set(q.dbr.va, prm::qp_dbrec::snd_counter, q.sq_pi & 0xffff);
    uar_write64(uar, prm::kUarBlueFlame, w.data());
    return index;
  }
  void post_recv(QpRing& q, const std::vector<Seg>& sges) {
    uint8_t* r = q.rq(q.rq_pi);
    uint32_t max = (16u << q.log_rq_stride) / 16;
    memset(r, 0, 16u << q.log_rq_stride);
    for (uint32_t i = 0; i < max; ++i) {
      prm::wqe_data_seg::view d(r + 16 * i);
      if (i < sges.size())
        d.set(prm::wqe_data_seg::byte_count, sges[i].len)
            .set(prm::wqe_data_seg::lkey, sges[i].lkey)
            .set(prm::wqe_data_seg::addr, sges[i].addr);
      else {
        d.set(prm::wqe_data_seg::lkey, 0x100);  // MLX5_INVALID_LKEY ends the list
        break;
      }
    }
    ++q.rq_pi;
    prm::set(q.dbr.va, prm::qp_dbrec::rcv_counter, q.rq_pi & 0xffff);
  }
  Result enable_roce() {
    auto mv = cmd_in(prm::opcode::MODIFY_NIC_VPORT_CONTEXT, in_size(prm::opcode::MODIFY_NIC_VPORT_CONTEXT));
    prm::modify_nic_vport_context_in::view m(mv.data());
    m.at(prm::modify_nic_vport_context_in::field_select).set(prm::modify_nic_vport_field_select::roce_en, 1);
    m.at(prm::modify_nic_vport_context_in::nic_vport_context).set(prm::nic_vport_context::roce_en, 1);
    return exec(mv, 16);
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
