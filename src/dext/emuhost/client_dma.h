// The emulated device's DMA port in melon-emud: the daemon's own memory through the emulator's
// TestHost (IOMMU with guard pages), plus windows onto client processes' memory for their memory
// regions. A window is what pinning means here: the device reads and writes the client's pages
// through the process's memory file, so an application's malloc'd buffer is reached where it
// lives, and a window closes when its MR goes (or its client dies) - afterwards the IOVA faults.
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>

#include "mlx5/emu/device.h"
#include "mlx5/emu/test_host.h"

namespace melon::dext {

// One client process as the device reaches it. A pid is only a number, which the kernel gives to
// another process once this one is gone; so the device goes through the process's memory file,
// which stays bound to that process's address space: after it exits every access fails, whoever
// has the pid by then. The client passes it (SocketClient::open); otherwise the daemon opens
// /proc/<pid>/mem at the first MR, through a pidfd taken at connect that proves the process it
// opened is still the one that connected.
class ClientProcess {
 public:
  // nullptr when the process is already gone.
  static std::shared_ptr<ClientProcess> open(pid_t pid);
  ~ClientProcess();
  ClientProcess(const ClientProcess&) = delete;
  ClientProcess& operator=(const ClientProcess&) = delete;

  bool alive() const;  // the pidfd's process has not exited
  // Whether every byte of [addr, addr+len) is mapped in the process, readable, and writable if
  // asked (its /proc/<pid>/maps), as ibv_reg_mr's pinning requires (else EFAULT).
  bool covers(uint64_t addr, uint64_t len, bool writable) const;
  // The process's memory file: the one the client passed with Open (its own /proc/self/mem,
  // which asks it for no ptrace grant), else /proc/<pid>/mem opened on first use (that needs the
  // daemon to may ptrace the client); -1 if the process is gone or cannot be reached.
  int mem_fd();
  void set_memory(int fd);  // takes `fd`
  pid_t pid() const { return pid_; }

 private:
  ClientProcess(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  pid_t pid_;
  int pidfd_;
  int mem_ = -1;
};

class ClientDma final : public mlx5::emu::DmaPort {
 public:
  static constexpr uint64_t kWindowBase = 0x00000cc000000000ull;
  explicit ClientDma(mlx5::emu::TestHost& host) : host_(host) {}

  // A window onto [addr, addr+len) of the process (page aligned). Returns its IOVA, 0 if the range
  // is not all mapped with the access asked (readable; writable too if `writable`).
  uint64_t open_window(const std::shared_ptr<ClientProcess>& proc, uint64_t addr, uint64_t len, bool writable);
  void close_window(uint64_t iova);
  size_t windows() const;
  uint64_t faults() const { return faults_; }

  bool read(uint64_t iova, void* dst, size_t len) override;
  bool write(uint64_t iova, const void* src, size_t len) override;
  // The window's bounds and rights, with no system call: whether the pages are still mapped shows
  // at write(), as on hardware, where a registered page stays pinned.
  bool writable(uint64_t iova, size_t len) override;

 private:
  struct Window {
    std::shared_ptr<ClientProcess> proc;  // kept while the window is (an MR may outlive its client)
    int mem;
    uint64_t addr, len;
    bool writable;
  };
  const Window* find(uint64_t iova, size_t len, uint64_t* off) const;

  mlx5::emu::TestHost& host_;
  mutable std::mutex mu_;
  std::map<uint64_t, Window> wins_;
  uint64_t next_ = kWindowBase;
  uint64_t faults_ = 0;
};

}  // namespace melon::dext
