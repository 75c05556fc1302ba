// melon-emud's Unix socket protocol (SOCK_SEQPACKET: one datagram per request and per reply), both
// halves' format: the daemon (src/dext/emuhost) serves it, SocketClient (client.h) speaks it.
//
//   request:  SocketRequest, then the request struct (in_len bytes); an Open request may carry one
//             descriptor as SCM_RIGHTS: the client's own /proc/self/mem, through which the device
//             reaches its memory regions (no other request carries one; any other is closed)
//   reply:    SocketReply, then the response struct (out_len bytes); a reply to Map (and to Open:
//             the client's event fd) carries one descriptor as SCM_RIGHTS when has_fd is 1.
//
// The daemon adds nothing to the uapi's rules: the bytes after the header go to
// uapi::Server::handle() unchanged, so the socket and the DEXT's IOUserClient see the same ABI.
#pragma once

#include <stdint.h>

namespace melon::uapi {

struct SocketRequest {
  uint32_t selector;
  uint32_t out_cap;  // the response buffer the client offers
};
static_assert(sizeof(SocketRequest) == 8);

struct SocketReply {
  uint32_t status;  // uapi::Status
  uint32_t out_len;
  uint32_t has_fd;
  uint32_t reserved;
};
static_assert(sizeof(SocketReply) == 16);

inline constexpr uint32_t kMaxSocketMessage = 4096;
inline constexpr const char* kDefaultSocket = "/run/melondma/mlx5_0.sock";

}  // namespace melon::uapi
