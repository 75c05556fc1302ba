// The Linux Transport: melon-emud's Unix socket (dext::UapiClient), memfd mappings, the client's
// eventfd. The daemon serves one device, so `where` is its socket path.
#include <errno.h>
#include <sys/mman.h>

#include "dext/emuhost/uapi_client.h"
#include "providers/mlx5/tables.h"
#include "providers/mlx5/transport.h"

namespace melon::mlx5prov {

namespace {

class EmudTransport : public Transport {
 public:
  bool open(const char* path, int* err) {
    if (!client_.connect(path)) {
      *err = errno ? errno : ECONNREFUSED;
      return false;
    }
    uapi::Status s = client_.open();
    if (s != uapi::Status::ok) {
      *err = errno_of(s);
      return false;
    }
    return true;
  }

  uapi::Status call(uapi::Selector sel, const void* in, uint32_t in_len, void* out, uint32_t out_cap) override {
    return client_.call(uint32_t(sel), in, in_len, out, out_cap);
  }
  void* map(uapi::MapKind kind, uint32_t handle, uint64_t* len, uapi::Status* st) override {
    return client_.map(kind, handle, len, st);
  }
  void unmap(void* addr, uint64_t len) override {
    if (addr) munmap(addr, len);
  }
  int event_fd() const override { return client_.event_fd(); }
  int kick(uint32_t, uint32_t, uint64_t) override {
    // The daemon watches the UAR page itself (docs/mlx5-provider.md); nothing to send.
    return 0;
  }

 private:
  dext::UapiClient client_;
};

}  // namespace

std::unique_ptr<Transport> open_transport(const char* where, int* err) {
  auto t = std::make_unique<EmudTransport>();
  if (!t->open(where, err)) return nullptr;
  return t;
}

}  // namespace melon::mlx5prov
