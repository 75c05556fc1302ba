// The core's error codes. Kept apart from errno (Darwin and Linux number them differently); the
// user-client layer maps them at its boundary.
#pragma once

#include <stdint.h>

namespace melon::mlx5::core {

#define MELON_MLX_ERRORS(V)                                       \
  V(ok, "ok")                                                     \
  V(timeout, "command timed out")                                 \
  V(cmd_status, "firmware returned a bad status")                 \
  V(delivery, "command not delivered (delivery status)")          \
  V(no_memory, "out of memory")                                   \
  V(invalid, "invalid argument")                                  \
  V(busy, "resource busy")                                        \
  V(dead, "device is in a fatal state or gone")                   \
  V(unsupported, "not supported by this device")                  \
  V(bad_state, "object is in the wrong state for this operation") \
  V(not_found, "no such object")                                  \
  V(in_use, "object still has dependents")                        \
  V(taken, "the port's one QP1 (GSI) exists already")             \
  V(leak, "resources left over")

#define MELON_MLX_ERR_ENUM(n, s) n,
enum class Err : uint8_t { MELON_MLX_ERRORS(MELON_MLX_ERR_ENUM) };
#undef MELON_MLX_ERR_ENUM

const char* err_name(Err e);

// What the firmware said about the last failed command.
struct CmdFailure {
  uint16_t opcode = 0;
  uint8_t delivery = 0;  // cmd_queue_entry.status
  uint8_t status = 0;  // cmd_out.status
  uint32_t syndrome = 0;
};

}  // namespace melon::mlx5::core
