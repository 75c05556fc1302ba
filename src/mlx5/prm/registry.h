// Every PRM structure, value set and command this folder defines, listed once so that tests
// (the mlx5_ifc.h oracle), logs and the emulator can iterate over all of them.
#pragma once

#include "mlx5/prm/field.h"

namespace melon::mlx5::prm {

struct Command {
  uint16_t opcode;
  const char* name;
  const Layout* in;
  const Layout* out;
};

struct LayoutList {
  const Layout* const* items;
  uint32_t count;
};
struct ConstantSetList {
  const ConstantSet* const* items;
  uint32_t count;
};
struct CommandList {
  const Command* items;
  uint32_t count;
};

LayoutList all_layouts();
ConstantSetList all_constant_sets();
CommandList all_commands();

const Layout* find_layout(const char* name);
const Field* find_field(const Layout& layout, const char* name);
const Command* find_command(uint16_t opcode);
const char* opcode_name(uint16_t opcode);  // "UNKNOWN" when not listed

}  // namespace melon::mlx5::prm
