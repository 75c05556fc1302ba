// PCI configuration space facts the core uses (PCI Local Bus spec, command register).
#pragma once

#include <stdint.h>

namespace melon::mlx5::core {

inline constexpr uint32_t kPciCommand = 0x04;  // 16-bit command register
inline constexpr uint16_t kPciMemorySpace = 1u << 1, kPciBusMaster = 1u << 2;

}  // namespace melon::mlx5::core
