// The command queue transport (PRM "Command Interface"; Linux cmd.c is the driver side): a doorbell
// bit names a 64-byte queue entry in host memory; input beyond 16 inline bytes comes from a chain
// of mailbox blocks, output beyond 16 bytes goes to another. The entry is handed back by clearing
// its ownership bit, with a delivery status in the same byte, and announced by a command completion
// EQE when an EQ takes that event.
#include <stdio.h>
#include <string.h>

#include <vector>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
namespace qe = prm::cmd_queue_entry;
namespace mb = prm::cmd_if_box;
constexpr uint32_t kEntryStride = 64;  // 2^log_cmdq_stride
constexpr uint32_t kBlockBytes = mb::size_bytes;  // 576: data, next pointer, number, token, signatures
constexpr uint32_t kMaxCmdBytes = 1u << 20;  // the longest input or output this model accepts

struct Chain {
  std::vector<uint64_t> blocks;  // IOVA of each block
  uint8_t status = prm::delivery_status::DELIVERED;
};
}  // namespace

void Hca::run_commands() {
  uint32_t bits = pending_cmd_bits_;
  pending_cmd_bits_ = 0;
  for (unsigned i = 0; i < 32; ++i)
    if (bits & (1u << i)) run_command(i);
}

void Hca::run_command(unsigned idx) {
  uint64_t entry_iova = (uint64_t(cmdq_addr_h_) << 32 | (cmdq_addr_l_ & 0xfffff000u)) + idx * kEntryStride;
  uint8_t ent[qe::size_bytes];
  if (!dma_read(entry_iova, ent, sizeof ent)) return;  // nowhere to report: the driver times out
  if (!prm::get(ent, qe::ownership)) {
    ++stats_.doorbells_ignored;  // rung for an entry software still owns
    return;
  }
  busy_cmd_bits_ |= 1u << idx;
  if (faults_.cmd_timeout || !alive()) return;  // taken and never completed

  uint8_t token = uint8_t(prm::get(ent, qe::token));
  uint32_t in_len = uint32_t(prm::get(ent, qe::input_length));
  uint32_t out_len = uint32_t(prm::get(ent, qe::output_length));
  uint8_t delivery = prm::delivery_status::DELIVERED;

  // Walks a mailbox chain of `n` blocks, checking numbers, tokens (and signatures); reads the data
  // of each into `data` when it is given.
  auto walk = [&](uint64_t first, uint32_t n, uint8_t bad_ptr, uint8_t* data, Chain& chain) {
    uint64_t at = first;
    uint8_t block[kBlockBytes];
    for (uint32_t i = 0; i < n; ++i) {
      if (at == 0 || at % prm::kMailboxBytes != 0 || !dma_read(at, block, sizeof block)) return bad_ptr;
      if (prm::get(block, mb::block_number) != i) return uint8_t(prm::delivery_status::BAD_BLOCK_NUMBER);
      if (prm::get(block, mb::token) != token) return uint8_t(prm::delivery_status::TOKEN_ERR);
      if (cfg_.cmd_signatures && prm::xor8(block, sizeof block) != 0xff)
        return uint8_t(prm::delivery_status::SIGNATURE_ERR);
      if (data) memcpy(data + size_t(i) * prm::kMailboxDataBytes, block, prm::kMailboxDataBytes);
      chain.blocks.push_back(at);
      at = prm::mailbox_next(block);
    }
    return uint8_t(prm::delivery_status::DELIVERED);
  };
  auto blocks_for = [](uint32_t len) {
    return len <= prm::kInlineInputBytes
               ? 0u
               : (len - prm::kInlineInputBytes + prm::kMailboxDataBytes - 1) / prm::kMailboxDataBytes;
  };

  // Completion goes to the EQ that took command events when the command started: CREATE_EQ of that
  // EQ is itself completed by polling only (Linux eq.c switches to events after it).
  Eq* cmd_eq = eq_for_event(prm::event_type::CMD);
  uint32_t cmd_eqn = cmd_eq ? cmd_eq->eqn : 0;
  std::vector<uint8_t> in, out;
  Chain in_chain, out_chain;
  if (prm::get(ent, qe::type) != prm::kCmdQueueEntryTypePcie) {
    delivery = prm::delivery_status::BAD_COMMAND_TYPE;
  } else if (cfg_.cmd_signatures && prm::xor8(ent, sizeof ent) != 0xff) {
    delivery = prm::delivery_status::SIGNATURE_ERR;
  } else if (in_len < 8 || in_len > kMaxCmdBytes) {
    delivery = prm::delivery_status::INPUT_LEN_ERR;
  } else if (out_len < 8 || out_len > kMaxCmdBytes) {
    delivery = prm::delivery_status::OUTPUT_LEN_ERR;
  } else {
    uint32_t nin = blocks_for(in_len), nout = blocks_for(out_len);
    std::vector<uint8_t> in_boxes(size_t(nin) * prm::kMailboxDataBytes);
    delivery =
        walk(prm::cmd_entry_in_mailbox(ent), nin, prm::delivery_status::BAD_INPUT_POINTER, in_boxes.data(), in_chain);
    if (delivery == prm::delivery_status::DELIVERED)
      delivery =
          walk(prm::cmd_entry_out_mailbox(ent), nout, prm::delivery_status::BAD_OUTPUT_POINTER, nullptr, out_chain);
    if (delivery == prm::delivery_status::DELIVERED) {
      in.resize(in_len);
      uint32_t inl = in_len < prm::kInlineInputBytes ? in_len : prm::kInlineInputBytes;
      memcpy(in.data(), prm::addr(ent, qe::command_input_inline_data), inl);
      if (in_len > inl) memcpy(in.data() + inl, in_boxes.data(), in_len - inl);
      out.assign(out_len, 0);
      Cmd c{in.data(), in_len, out.data(), out_len, prm::cmd_opcode(in.data()), prm::cmd_op_mod(in.data())};
      CmdStatus st = dispatch(c);
      ++stats_.commands;
      if (cfg_.trace_commands)
        fprintf(stderr, "emu: cmd %u opcode 0x%x op_mod 0x%x in %u out %u -> status 0x%x syndrome 0x%x\n", idx,
                c.opcode, c.op_mod, in_len, out_len, st.status, st.syndrome);
      if (!st.ok()) memset(out.data(), 0, out.size());
      prm::cmd_set_result(out.data(), st.status, st.syndrome);
      if (!alive()) return;  // the command killed the firmware (fatal injected meanwhile)
      // Output beyond the inline part goes to the output mailboxes, block by block.
      uint32_t outl = out_len < prm::kInlineOutputBytes ? out_len : prm::kInlineOutputBytes;
      for (size_t i = 0; i < out_chain.blocks.size(); ++i) {
        size_t off = outl + i * prm::kMailboxDataBytes;
        size_t n = out_len - off < prm::kMailboxDataBytes ? out_len - off : prm::kMailboxDataBytes;
        if (!dma_write(out_chain.blocks[i], out.data() + off, n)) break;
      }
      memcpy(prm::addr(ent, qe::command_output_inline_data), out.data(), outl);
    }
  }
  // Output inline data first, then the status/ownership byte: software polls that byte.
  if (!dma_write(entry_iova + qe::command_output_inline_data.byte_off(), prm::addr(ent, qe::command_output_inline_data),
                 prm::kInlineOutputBytes))
    return;
  uint8_t last = uint8_t(delivery << 1);  // status 7 bits, ownership 0: software owns the entry again
  if (!dma_write(entry_iova + qe::size_bytes - 1, &last, 1)) return;
  busy_cmd_bits_ &= ~(1u << idx);
  auto eq = eqs_.find(cmd_eqn);
  if (cmd_eqn && eq != eqs_.end() && (eq->second.mask & prm::event_bit(prm::event_type::CMD))) {
    uint8_t data[28] = {};
    prm::set(data, prm::cmd_inter_comp_event::command_completion_vector, 1u << idx);
    post_eqe(eq->second, prm::event_type::CMD, 0, data);
  }
}

}  // namespace melon::mlx5::emu
