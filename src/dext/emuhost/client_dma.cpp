#include "dext/emuhost/client_dma.h"

#include <sys/uio.h>

namespace melon::dext {

uint64_t ClientDma::open_window(pid_t pid, uint64_t addr, uint64_t len, bool writable) {
  // Probe the range's first and last byte: an address the client does not own fails here, at
  // registration, as ibv_reg_mr fails with EFAULT on Linux.
  uint8_t b;
  for (uint64_t at : {addr, addr + len - 1}) {
    iovec l{&b, 1}, r{reinterpret_cast<void*>(at), 1};
    if (process_vm_readv(pid, &l, 1, &r, 1, 0) != 1) return 0;
  }
  std::lock_guard<std::mutex> g(mu_);
  uint64_t iova = next_;
  next_ += (len + 0xfff) / 0x1000 * 0x1000 + 0x1000;  // a guard page between windows
  wins_[iova] = Window{pid, addr, len, writable};
  return iova;
}

void ClientDma::close_window(uint64_t iova) {
  std::lock_guard<std::mutex> g(mu_);
  wins_.erase(iova);
}

size_t ClientDma::windows() const {
  std::lock_guard<std::mutex> g(mu_);
  return wins_.size();
}

const ClientDma::Window* ClientDma::find(uint64_t iova, size_t len, uint64_t* off) const {
  auto it = wins_.upper_bound(iova);
  if (it == wins_.begin()) return nullptr;
  --it;
  if (iova - it->first + len > it->second.len) return nullptr;
  *off = iova - it->first;
  return &it->second;
}

bool ClientDma::read(uint64_t iova, void* dst, size_t len) {
  if (iova < kWindowBase || iova >= mlx5::emu::TestHost::kIovaBase) return host_.read(iova, dst, len);
  std::lock_guard<std::mutex> g(mu_);
  uint64_t off;
  const Window* w = find(iova, len, &off);
  iovec l{dst, len}, r{reinterpret_cast<void*>(w ? w->addr + off : 0), len};
  if (!w || process_vm_readv(w->pid, &l, 1, &r, 1, 0) != ssize_t(len)) {
    faults_++;
    return false;
  }
  return true;
}

bool ClientDma::write(uint64_t iova, const void* src, size_t len) {
  if (iova < kWindowBase || iova >= mlx5::emu::TestHost::kIovaBase) return host_.write(iova, src, len);
  std::lock_guard<std::mutex> g(mu_);
  uint64_t off;
  const Window* w = find(iova, len, &off);
  iovec l{const_cast<void*>(src), len}, r{reinterpret_cast<void*>(w ? w->addr + off : 0), len};
  if (!w || !w->writable || process_vm_writev(w->pid, &l, 1, &r, 1, 0) != ssize_t(len)) {
    faults_++;
    return false;
  }
  return true;
}

}  // namespace melon::dext
