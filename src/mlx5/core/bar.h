// Reading and writing PRM fields of BAR0 (the initialization segment) through the HAL: the dword
// holding a field is read as the PRM's big-endian value and decoded with the one accessor.
#pragma once

#include "mlx5/core/hal.h"
#include "mlx5/prm/field.h"

namespace melon::mlx5::core {

inline uint32_t bar_field(Hal& hal, const prm::Field& f) {
  uint32_t dw = f.bit_off / 32;
  uint32_t v = hal.read32(dw * 4);
  uint8_t be[4] = {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
  return uint32_t(prm::get_bits(be, f.bit_off % 32, f.bit_width));
}

inline uint32_t bar_offset(const prm::Field& f) { return f.bit_off / 32 * 4; }

}  // namespace melon::mlx5::core
