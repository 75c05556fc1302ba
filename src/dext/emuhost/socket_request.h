// One request datagram of a melon-emud connection (uapi/socket/protocol.h) turned into its reply:
// the header checked, the body handed to uapi::Server::handle() unchanged, and the descriptor the
// reply passes chosen (Map: the region's memfd; Open: the client's event fd). Apart from the socket
// loop (emud.cpp) so that a fuzz target (tests/fuzz/fuzz_emud_socket.cpp) runs exactly this code.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "uapi/server.h"
#include "uapi/socket/protocol.h"

namespace melon::dext {

struct SocketAnswer {
  uapi::SocketReply reply{};  // has_fd set when pass_fd is
  int pass_fd = -1;  // the descriptor to send with the reply, -1 for none
  bool took_memory = false;  // an Open that succeeded: a descriptor it carried is the client's memory
};

// The reply body goes to `body`, kMaxSocketBody bytes. `client` is null for a connection refused
// at attach: every request then gets `refused`.
inline constexpr uint32_t kMaxSocketBody = uapi::kMaxSocketMessage - sizeof(uapi::SocketReply);
SocketAnswer answer_request(uapi::Server& srv, uapi::Client* client, uapi::Status refused, const uint8_t* req,
                            size_t len, int event_fd, uint8_t* body);

}  // namespace melon::dext
