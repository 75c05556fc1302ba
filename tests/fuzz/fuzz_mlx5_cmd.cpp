// Fuzzes the emulated ConnectX-4 Lx's command engine: random command inputs in well-formed queue
// entries (every one must come back delivered, with a known command status), and raw queue entries
// with raw mailbox chains (every one that comes back carries a known delivery status). The device is
// optionally brought up to INIT_HCA first so object commands reach their handlers.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cstdlib>
#include <vector>

#include "mlx5/emu/device.h"
#include "mlx5/emu/test_host.h"
#include "mlx5/prm/prm.h"

using namespace melon::mlx5;
using emu::TestHost;

namespace {

struct Rig {
  TestHost host;
  emu::ManualClock clock;
  emu::Device dev;
  TestHost::Buffer cmdq;
  static emu::DeviceConfig config() {
    emu::DeviceConfig c;
    c.boot_pages = 1, c.init_pages = 2, c.regular_pages = 2;
    return c;
  }
  Rig() : dev(emu::HostPorts{&host, &host, &clock, nullptr}, config()) {
    dev.config_write(emu::kPciCommand, 2, emu::kPciCommandMemory | emu::kPciCommandBusMaster);
    clock.advance(config().init_delay_ns + 1);
    cmdq = host.alloc(4096);
    dev.write32(prm::init_seg_offset::cmdq_addr_h, __builtin_bswap32(uint32_t(cmdq.iova >> 32)));
    dev.write32(prm::init_seg_offset::cmdq_addr_l_sz, __builtin_bswap32(uint32_t(cmdq.iova)));
  }
  // Posts `in` in a well-formed entry with mailbox chains; returns the entry's last byte.
  uint8_t post(const uint8_t* in, uint32_t in_len, uint32_t out_len, std::vector<uint8_t>* out = nullptr) {
    auto blocks = [](uint32_t len) { return len <= 16 ? 0u : (len - 16 + 511) / 512; };
    uint32_t nin = blocks(in_len), nout = blocks(out_len);
    TestHost::Buffer ib = host.alloc((nin + 1) * 1024), ob = host.alloc((nout + 1) * 1024);
    auto chain = [](TestHost::Buffer& b, uint32_t n, const uint8_t* data, uint32_t len) {
      for (uint32_t i = 0; i < n; ++i) {
        uint8_t* box = static_cast<uint8_t*>(b.va) + i * 1024;
        if (data) memcpy(box, data + 16 + i * 512, len - 16 - i * 512 < 512 ? len - 16 - i * 512 : 512);
        prm::set(box, prm::cmd_if_box::block_number, i);
        prm::set(box, prm::cmd_if_box::token, 1);
        if (i + 1 < n) prm::mailbox_set_next(box, b.iova + (i + 1) * 1024);
      }
    };
    chain(ib, nin, in, in_len);
    chain(ob, nout, nullptr, 0);
    uint8_t* e = static_cast<uint8_t*>(cmdq.va);
    memset(e, 0, 64);
    prm::set(e, prm::cmd_queue_entry::type, prm::kCmdQueueEntryTypePcie);
    prm::set(e, prm::cmd_queue_entry::input_length, in_len);
    prm::set(e, prm::cmd_queue_entry::output_length, out_len);
    memcpy(e + 16, in, in_len < 16 ? in_len : 16);
    prm::cmd_entry_set_in_mailbox(e, ib.iova);
    prm::cmd_entry_set_out_mailbox(e, ob.iova);
    prm::set(e, prm::cmd_queue_entry::token, 1);
    prm::set(e, prm::cmd_queue_entry::ownership, 1);
    dev.write32(prm::init_seg_offset::cmd_dbell, __builtin_bswap32(1));
    dev.service();
    if (out) {
      out->assign(out_len, 0);
      memcpy(out->data(), e + 32, out_len < 16 ? out_len : 16);
      for (uint32_t i = 0; i < nout; ++i) {
        uint32_t o = 16 + i * 512;
        memcpy(out->data() + o, static_cast<uint8_t*>(ob.va) + i * 1024, out_len - o < 512 ? out_len - o : 512);
      }
    }
    host.free(ib.iova);
    host.free(ob.iova);
    return e[63];
  }
  uint32_t simple(uint16_t opcode, uint16_t op_mod, const prm::Field* f = nullptr) {
    const prm::Command* c = prm::find_command(opcode);
    std::vector<uint8_t> in(c->in->size_bytes()), out;
    prm::cmd_set_header(in.data(), opcode, op_mod);
    post(in.data(), uint32_t(in.size()), c->out->size_bytes(), &out);
    return f ? uint32_t(prm::get(out.data(), *f)) : prm::cmd_status_of(out.data());
  }
  void give(uint32_t n) {
    std::vector<uint8_t> in(16 + 8 * n);
    prm::cmd_set_header(in.data(), prm::opcode::MANAGE_PAGES, prm::manage_pages_op_mod::ALLOCATION_SUCCESS);
    prm::set(in.data(), prm::manage_pages_in::input_num_entries, n);
    for (uint32_t i = 0; i < n; ++i) prm::set_bits(in.data() + 16 + 8 * i, 0, 64, host.alloc(4096).iova);
    post(in.data(), uint32_t(in.size()), 16);
  }
  void bring_up() {
    simple(prm::opcode::ENABLE_HCA, 0);
    give(1);
    give(2);
    if (simple(prm::opcode::INIT_HCA, 0) != 0) abort();
    give(2);
    simple(prm::opcode::ALLOC_UAR, 0);
    simple(prm::opcode::ALLOC_PD, 0);
  }
};

bool known(const prm::ConstantSet& set, uint32_t v) { return prm::constant_name(set, v) != nullptr; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  Rig rig;
  uint8_t mode = data[0];
  if (mode & 2) rig.bring_up();
  data += 1, size -= 1;
  if (!(mode & 1)) {
    // A random command in a well-formed entry: it must be delivered and get a known status.
    uint32_t out_len = 8 + ((uint32_t(data[0]) << 8 | data[1]) % 8192);
    data += 2, size -= 2;
    std::vector<uint8_t> in(data, data + size);
    if (in.size() < 8) in.resize(8);
    std::vector<uint8_t> out;
    uint8_t last = rig.post(in.data(), uint32_t(in.size()), out_len, &out);
    if (last & 1) abort();  // the device kept a well-formed entry
    if ((last >> 1) != prm::delivery_status::DELIVERED) abort();
    if (!known(prm::cmd_status::set, prm::cmd_status_of(out.data()))) abort();
    return 0;
  }
  // A raw entry and raw mailbox blocks (chained by the fuzzer's own next pointers, or by ours).
  TestHost::Buffer boxes = rig.host.alloc(8 * 1024);
  uint8_t* e = static_cast<uint8_t*>(rig.cmdq.va);
  memset(e, 0, 64);
  memcpy(e, data, size < 64 ? size : 64);
  size_t used = size < 64 ? size : 64;
  for (int i = 0; i < 8 && used < size; ++i) {
    size_t n = size - used < 576 ? size - used : 576;
    memcpy(static_cast<uint8_t*>(boxes.va) + i * 1024, data + used, n);
    used += n;
  }
  if (mode & 4) {
    prm::cmd_entry_set_in_mailbox(e, boxes.iova);
    prm::cmd_entry_set_out_mailbox(e, boxes.iova + 4 * 1024);
  }
  prm::set(e, prm::cmd_queue_entry::ownership, 1);
  rig.dev.write32(prm::init_seg_offset::cmd_dbell, __builtin_bswap32(1));
  rig.dev.service();
  if (!(e[63] & 1) && !known(prm::delivery_status::set, e[63] >> 1)) abort();
  return 0;
}
