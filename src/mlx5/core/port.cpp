// The port: the NIC vport's roce_en (set and read back), vport state and context, PAOS.
#include <string.h>

#include "mlx5/core/bar.h"
#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/core/pci.h"
#include "mlx5/core/scratch.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

Err Hca::set_roce_en(bool on) {
  Scratch in(*hal_, p::modify_nic_vport_context_in::size_bytes);
  if (!in) return Err::no_memory;
  uint8_t out[p::modify_nic_vport_context_out::size_bytes] = {};
  p::cmd_set_header(in.get(), p::opcode::MODIFY_NIC_VPORT_CONTEXT, 0);
  p::modify_nic_vport_context_in::view v(in.get());
  v.at(p::modify_nic_vport_context_in::field_select).set(p::modify_nic_vport_field_select::roce_en, 1);
  v.at(p::modify_nic_vport_context_in::nic_vport_context).set(p::nic_vport_context::roce_en, on);
  if (Err e = cmd(in.get(), p::modify_nic_vport_context_in::size_bytes, out, sizeof out); e != Err::ok) return e;
  roce_enabled_ = on;
  uint8_t qin[p::query_nic_vport_context_in::size_bytes] = {};
  Scratch qout(*hal_, p::query_nic_vport_context_out::size_bytes);
  if (!qout) return Err::no_memory;
  p::cmd_set_header(qin, p::opcode::QUERY_NIC_VPORT_CONTEXT, 0);
  if (Err e = cmd(qin, sizeof qin, qout.get(), p::query_nic_vport_context_out::size_bytes); e != Err::ok) return e;
  bool now = p::query_nic_vport_context_out::cview(qout.get())
                 .at(p::query_nic_vport_context_out::nic_vport_context)
                 .get(p::nic_vport_context::roce_en);
  port_.roce_en = now;
  if (now != on) {
    last_cmd_ = {p::opcode::MODIFY_NIC_VPORT_CONTEXT, 0, 0, 0};
    MLX_ERR(*hal_, port, "roce_en reads back %u after setting it to %u", now, on);
    return Err::bad_state;
  }
  return Err::ok;
}

Err Hca::query_port() {
  uint8_t in[p::query_vport_state_in::size_bytes] = {}, out[p::query_vport_state_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::QUERY_VPORT_STATE, 0);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  p::query_vport_state_out::cview o(out);
  port_.vport_state = uint8_t(o.get(p::query_vport_state_out::state));
  port_.admin_state = uint8_t(o.get(p::query_vport_state_out::admin_state));
  uint8_t qin[p::query_nic_vport_context_in::size_bytes] = {};
  Scratch qout(*hal_, p::query_nic_vport_context_out::size_bytes);
  if (!qout) return Err::no_memory;
  p::cmd_set_header(qin, p::opcode::QUERY_NIC_VPORT_CONTEXT, 0);
  if (Err e = cmd(qin, sizeof qin, qout.get(), p::query_nic_vport_context_out::size_bytes); e != Err::ok) return e;
  auto ctx = p::query_nic_vport_context_out::cview(qout.get()).at(p::query_nic_vport_context_out::nic_vport_context);
  port_.mtu = uint16_t(ctx.get(p::nic_vport_context::mtu));
  port_.roce_en = ctx.get(p::nic_vport_context::roce_en);
  // permanent_address is a 64-bit field holding the MAC in its low 48 bits.
  uint64_t mac = ctx.get(p::nic_vport_context::permanent_address);
  for (int i = 0; i < 6; ++i) port_.mac[i] = uint8_t(mac >> (40 - 8 * i));
  MLX_INFO(*hal_, port, "vport %s (admin %u), mtu %u, roce_en %u, mac %02x:%02x:%02x:%02x:%02x:%02x",
           port_.vport_state == p::vport_state::UP ? "up" : "down", port_.admin_state, port_.mtu, port_.roce_en,
           port_.mac[0], port_.mac[1], port_.mac[2], port_.mac[3], port_.mac[4], port_.mac[5]);
  return Err::ok;
}

// PAOS through ACCESS_REG: local port 1, admin status with its enable bit (ase).
Err Hca::set_port_admin(bool up) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  uint8_t in[p::access_register_in::size_bytes + p::paos_reg::size_bytes] = {};
  uint8_t out[p::access_register_out::size_bytes + p::paos_reg::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ACCESS_REG, p::access_reg_op_mod::WRITE);
  p::access_register_in::view(in).set(p::access_register_in::register_id, p::reg_id::PAOS);
  p::paos_reg::view(p::access_register_in::view(in).elem(p::access_register_in::register_data, 0))
      .set(p::paos_reg::local_port, 1)
      .set(p::paos_reg::admin_status, up ? p::kPortUp : p::kPortDown)
      .set(p::paos_reg::ase, 1);
  return cmd(in, sizeof in, out, sizeof out);
}

Err Hca::query_port_oper(bool* up) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  uint8_t in[p::access_register_in::size_bytes + p::paos_reg::size_bytes] = {};
  uint8_t out[p::access_register_out::size_bytes + p::paos_reg::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ACCESS_REG, p::access_reg_op_mod::READ);
  p::access_register_in::view(in).set(p::access_register_in::register_id, p::reg_id::PAOS);
  p::paos_reg::view(p::access_register_in::view(in).elem(p::access_register_in::register_data, 0))
      .set(p::paos_reg::local_port, 1);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  *up = p::paos_reg::cview(p::access_register_out::cview(out).elem(p::access_register_out::register_data, 0))
            .get(p::paos_reg::oper_status) == p::kPortUp;
  return Err::ok;
}

}  // namespace melon::mlx5::core
