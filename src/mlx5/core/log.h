// Component-prefixed logging through the HAL's log sink.
//
// Every line starts with its component ("MlxCmd: ", "MlxQP: ", ...), so the DEXT's os_log and the
// emulator host's stderr read the same. The formatter is our own small printf subset (the core
// has no C library stdio): %s %c %d %u %x %X %p %% with l/ll/z, width and 0-padding.
// Debug lines compile out unless MELON_MLX_DEBUG_LOG is 1.
#pragma once

#include <stdarg.h>
#include <stddef.h>

#include "mlx5/core/hal.h"

#ifndef MELON_MLX_DEBUG_LOG
#define MELON_MLX_DEBUG_LOG 0
#endif

namespace melon::mlx5::core {

#define MELON_MLX_COMPONENTS(V) \
  V(pci, "MlxPCIDriver")        \
  V(cmd, "MlxCmd")              \
  V(pages, "MlxPages")          \
  V(eq, "MlxEQ")                \
  V(uar, "MlxUAR")              \
  V(pd, "MlxPD")                \
  V(mr, "MlxMR")                \
  V(cq, "MlxCQ")                \
  V(qp, "MlxQP")                \
  V(srq, "MlxSRQ")              \
  V(gid, "MlxGID")              \
  V(port, "MlxPort")            \
  V(health, "MlxHealth")

#define MELON_MLX_COMP_ENUM(n, s) n,
enum class Component : uint8_t { MELON_MLX_COMPONENTS(MELON_MLX_COMP_ENUM) };
#undef MELON_MLX_COMP_ENUM

const char* component_name(Component c);

// Formats into buf (always NUL-terminated, truncated to n-1); returns the length written.
size_t format(char* buf, size_t n, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
size_t vformat(char* buf, size_t n, const char* fmt, va_list ap);

void log_line(Hal& hal, LogLevel level, Component c, const char* fmt, ...) __attribute__((format(printf, 4, 5)));

inline constexpr bool kDebugLog = MELON_MLX_DEBUG_LOG != 0;

}  // namespace melon::mlx5::core

#define MLX_ERR(hal, comp, ...)                                                                                  \
  ::melon::mlx5::core::log_line(hal, ::melon::mlx5::core::LogLevel::error, ::melon::mlx5::core::Component::comp, \
                                __VA_ARGS__)
#define MLX_WARN(hal, comp, ...)                                                                                \
  ::melon::mlx5::core::log_line(hal, ::melon::mlx5::core::LogLevel::warn, ::melon::mlx5::core::Component::comp, \
                                __VA_ARGS__)
#define MLX_INFO(hal, comp, ...)                                                                                \
  ::melon::mlx5::core::log_line(hal, ::melon::mlx5::core::LogLevel::info, ::melon::mlx5::core::Component::comp, \
                                __VA_ARGS__)
// Compiled out (arguments still type-checked) unless MELON_MLX_DEBUG_LOG.
#define MLX_DBG(hal, comp, ...)                                                                                      \
  do {                                                                                                               \
    if constexpr (::melon::mlx5::core::kDebugLog)                                                                    \
      ::melon::mlx5::core::log_line(hal, ::melon::mlx5::core::LogLevel::debug, ::melon::mlx5::core::Component::comp, \
                                    __VA_ARGS__);                                                                    \
  } while (0)
