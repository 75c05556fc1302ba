// The client side of melon-emud's socket: what the mlx5 provider and the tests use to reach the
// user-client ABI on Linux. (On macOS the provider makes the same calls through IOConnect*.)
#pragma once

#include <stdint.h>

#include <string>

#include "uapi/abi.h"

namespace melon::dext {

class UapiClient {
 public:
  UapiClient() = default;
  ~UapiClient() { close(); }
  UapiClient(const UapiClient&) = delete;
  UapiClient& operator=(const UapiClient&) = delete;

  // Connects to the daemon's socket; false with errno set when it cannot.
  bool connect(const std::string& path);
  void close();
  int fd() const { return fd_; }

  // One call. `fd_out` receives a passed descriptor (Map, Open) or -1. A broken connection returns
  // Status::device_dead.
  uapi::Status call(uint32_t selector, const void* in, uint32_t in_len, void* out, uint32_t out_cap,
                    uint32_t* out_len = nullptr, int* fd_out = nullptr);
  template <class Req, class Resp>
  uapi::Status call(uapi::Selector s, const Req& rq, Resp* rp, int* fd_out = nullptr) {
    return call(uint32_t(s), &rq, uapi::wire_size<Req>, rp, uapi::wire_size<Resp>, nullptr, fd_out);
  }
  // Open with this ABI version; keeps the event fd the daemon passes.
  uapi::Status open(uapi::OpenResp* rp = nullptr);
  int event_fd() const { return event_fd_; }
  // Maps (kind, handle) into this process; nullptr on failure (status in *st).
  void* map(uapi::MapKind kind, uint32_t handle, uint64_t* len, uapi::Status* st);

 private:
  int fd_ = -1;
  int event_fd_ = -1;
};

}  // namespace melon::dext
