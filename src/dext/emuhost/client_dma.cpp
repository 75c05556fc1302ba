#include "dext/emuhost/client_dma.h"

#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>

namespace melon::dext {

std::shared_ptr<ClientProcess> ClientProcess::open(pid_t pid) {
  int fd = int(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return nullptr;
  return std::shared_ptr<ClientProcess>(new ClientProcess(pid, fd));
}

ClientProcess::~ClientProcess() {
  if (mem_ >= 0) close(mem_);
  close(pidfd_);
}

bool ClientProcess::alive() const {
  pollfd p{pidfd_, POLLIN, 0};
  return poll(&p, 1, 0) == 0;  // a pidfd reads readable once its process has exited
}

void ClientProcess::set_memory(int fd) {
  // Only a memory file of procfs (the client's own, or another it may reach anyway): anything
  // else would have the device write into whatever file the client chose.
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0 || fs.f_type != PROC_SUPER_MAGIC) {
    close(fd);
    return;
  }
  if (mem_ >= 0) close(mem_);
  mem_ = fd;
}

int ClientProcess::mem_fd() {
  if (mem_ >= 0) return mem_;
  int fd = ::open(("/proc/" + std::to_string(pid_) + "/mem").c_str(), O_RDWR | O_CLOEXEC);
  // Opened while the pidfd's process lives: the pid was not yet anyone else's, so this is its file.
  if (fd >= 0 && !alive()) {
    close(fd);
    fd = -1;
  }
  return mem_ = fd;
}

bool ClientProcess::covers(uint64_t addr, uint64_t len, bool writable) const {
  FILE* f = fopen(("/proc/" + std::to_string(pid_) + "/maps").c_str(), "re");
  if (!f) return false;
  uint64_t at = addr, end = addr + len;
  char line[512];
  unsigned long long lo, hi;
  char perms[8];
  while (at < end && fgets(line, sizeof line, f)) {
    if (sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) != 3 || hi <= at) continue;
    if (lo > at) break;  // a hole
    if (perms[0] != 'r' || (writable && perms[1] != 'w')) break;
    at = hi;
  }
  fclose(f);
  return at >= end && alive();  // and the maps read were this process's
}

uint64_t ClientDma::open_window(const std::shared_ptr<ClientProcess>& proc, uint64_t addr, uint64_t len,
                                bool writable) {
  // The whole range, for the access asked: a hole or a read-only page under a writable MR fails
  // here, at registration, as ibv_reg_mr fails with EFAULT on Linux.
  if (!proc || !len || !proc->covers(addr, len, writable)) return 0;
  int mem = proc->mem_fd();
  if (mem < 0) return 0;
  std::lock_guard<std::mutex> g(mu_);
  // The IOVA keeps the address's offset within 2 MiB, so the driver core can map the MR with pages
  // up to 2 MiB (best_page_shift): at 4 KiB pages an MR beyond ~20 MB needs more translation
  // entries than one CREATE_MKEY carries (UCX registers 40 MB pools).
  constexpr uint64_t kAlign = 2ull << 20;
  uint64_t iova = (next_ + kAlign - 1) / kAlign * kAlign + (addr & (kAlign - 1));
  next_ = iova + (len + 0xfff) / 0x1000 * 0x1000 + 0x1000;  // a guard page between windows
  wins_[iova] = Window{proc, mem, addr, len, writable};
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

// Through the process's memory file: it reaches that address space only, so a process that has
// exited (and whatever process has its pid now) is never read or written.
bool ClientDma::read(uint64_t iova, void* dst, size_t len) {
  if (iova < kWindowBase || iova >= mlx5::emu::TestHost::kIovaBase) return host_.read(iova, dst, len);
  std::lock_guard<std::mutex> g(mu_);
  uint64_t off;
  const Window* w = find(iova, len, &off);
  if (!w || pread(w->mem, dst, len, off_t(w->addr + off)) != ssize_t(len)) {
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
  if (!w || !w->writable || pwrite(w->mem, src, len, off_t(w->addr + off)) != ssize_t(len)) {
    faults_++;
    return false;
  }
  return true;
}

bool ClientDma::writable(uint64_t iova, size_t len) {
  if (iova < kWindowBase || iova >= mlx5::emu::TestHost::kIovaBase) return host_.writable(iova, len);
  std::lock_guard<std::mutex> g(mu_);
  uint64_t off;
  const Window* w = find(iova, len, &off);
  if (!w || !w->writable) {
    faults_++;
    return false;
  }
  return true;
}

}  // namespace melon::dext
