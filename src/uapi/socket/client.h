// The client half of melon-emud's socket (protocol.h): what the mlx5 provider and the tests use to
// reach the user-client ABI on Linux. (On macOS the provider makes the same calls through
// IOConnect*.) Hosted code: not part of the freestanding melon_uapi.
#pragma once

#include <stdint.h>

#include "uapi/abi.h"

namespace melon::uapi {

class SocketClient {
 public:
  SocketClient() = default;
  ~SocketClient() { close(); }
  SocketClient(const SocketClient&) = delete;
  SocketClient& operator=(const SocketClient&) = delete;

  // Connects to the daemon's socket; false with errno set when it cannot. Grants nothing: the
  // daemon gets no ptrace right over this process (open() hands it this process's memory file).
  bool connect(const char* path);
  void close();
  int fd() const { return fd_; }

  // One call. `fd_in` is passed with the request (Open only), `fd_out` receives a passed descriptor
  // (Map, Open) or -1. A broken connection returns Status::device_dead.
  Status call(uint32_t selector, const void* in, uint32_t in_len, void* out, uint32_t out_cap,
              uint32_t* out_len = nullptr, int* fd_out = nullptr, int fd_in = -1);
  template <class Req, class Resp>
  Status call(Selector s, const Req& rq, Resp* rp, int* fd_out = nullptr) {
    return call(uint32_t(s), &rq, wire_size<Req>, rp, wire_size<Resp>, nullptr, fd_out);
  }
  // Open with this ABI version, handing the daemon this process's /proc/self/mem (the device's way
  // to its memory regions, bound to this process: a pid the daemon held could later be another
  // process's); keeps the event fd the daemon passes.
  Status open(OpenResp* rp = nullptr);
  int event_fd() const { return event_fd_; }
  // Maps (kind, handle) into this process; nullptr on failure (status in *st).
  void* map(MapKind kind, uint32_t handle, uint64_t* len, Status* st);

 private:
  int fd_ = -1;
  int event_fd_ = -1;
};

}  // namespace melon::uapi
