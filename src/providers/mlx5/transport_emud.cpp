// The Linux Transport: melon-emud's Unix socket (uapi::SocketClient), memfd mappings, the client's
// eventfd. The daemon serves one device, so `where` is its socket path.
#include <errno.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>

#include "providers/mlx5/tables.h"
#include "providers/mlx5/transport.h"
#include "uapi/doorbell.h"
#include "uapi/socket/client.h"

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

  // One request and its reply at a time: the event thread and the application share the socket.
  uapi::Status call(uapi::Selector sel, const void* in, uint32_t in_len, void* out, uint32_t out_cap) override {
    std::lock_guard<std::mutex> lock(call_mu_);
    return client_.call(uint32_t(sel), in, in_len, out, out_cap);
  }
  void* map(uapi::MapKind kind, uint32_t handle, uint64_t* len, uapi::Status* st) override {
    uapi::MapResp rp{};
    int fd = -1;
    {
      std::lock_guard<std::mutex> lock(call_mu_);
      *st = client_.call(uapi::Selector::map, uapi::MapReq{uint32_t(kind), handle}, &rp, &fd);
    }
    if (*st != uapi::Status::ok) return nullptr;
    if (fd < 0) {
      *st = uapi::Status::unsupported;
      return nullptr;
    }
    void* p = mmap(nullptr, rp.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(rp.offset));
    ::close(fd);
    if (p == MAP_FAILED) {
      *st = uapi::Status::no_memory;
      return nullptr;
    }
    *len = rp.length;
    if (kind == uapi::MapKind::uar && (rp.flags & uapi::kMapWatched)) {
      std::lock_guard<std::mutex> lock(mu_);
      watched_[handle] = uapi::uar_watch(p);
    }
    return p;
  }
  void unmap(void* addr, uint64_t len) override {
    if (!addr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = watched_.begin(); it != watched_.end(); ++it)
        if (static_cast<void*>(it->second) == static_cast<uint8_t*>(addr) + uapi::kUarWatchOffset) {
          watched_.erase(it);
          break;
        }
    }
    munmap(addr, len);
  }
  bool device_needs_host_cpu() const override { return true; }
  // melon-emud writes the client's eventfd for each armed wake-up.
  Wake wait_event(int stop_fd) override {
    Wake w = wait_readable(stop_fd, client_.event_fd(), -1);
    uint64_t n;
    if (w == Wake::event) (void)!read(client_.event_fd(), &n, sizeof n);
    return w;
  }
  // The daemon watches the UAR page (uapi/doorbell.h): wake its watcher if it sleeps.
  int kick(uint32_t uar, uint32_t, uint64_t) override {
    uapi::UarWatch* w = watch_of(uar);
    if (w && uapi::uar_watch_sleeping(w)) {
      uapi::uar_watch_kick(w);
      syscall(SYS_futex, &w->kick, FUTEX_WAKE, 1, nullptr, nullptr, 0);  // shared: the page is the daemon's too
    }
    return 0;
  }

 private:
  uapi::UarWatch* watch_of(uint32_t uar) {
    // One UAR per context: remember the last one looked up, so the hot path skips the lock.
    if (uar == last_uar_) return last_watch_;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = watched_.find(uar);
    last_uar_ = uar;
    last_watch_ = it == watched_.end() ? nullptr : it->second;
    return last_watch_;
  }

  uapi::SocketClient client_;
  std::mutex call_mu_;
  std::mutex mu_;  // watched_
  std::unordered_map<uint32_t, uapi::UarWatch*> watched_;
  uint32_t last_uar_ = 0;
  uapi::UarWatch* last_watch_ = nullptr;
};

}  // namespace

std::string device_location() {
  const char* e = getenv("MELON_EMUD_SOCKET");
  return e ? e : "/run/melondma/mlx5_0.sock";  // melon-emud's default (docs/uapi.md)
}

// A daemon serves `where`: its socket and the node GUID it publishes beside it (melon-emud
// writes <socket>.guid once the device is up and removes both when it stops). Discovery connects
// to nothing: a connection is a client of the daemon, and it counts against the user's limit.
bool device_present(const std::string& where) {
  struct stat st;
  if (stat(where.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  return stat((where + ".guid").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::unique_ptr<Transport> open_transport(const char* where, int* err) {
  auto t = std::make_unique<EmudTransport>();
  if (!t->open(where, err)) return nullptr;
  return t;
}

}  // namespace melon::mlx5prov
